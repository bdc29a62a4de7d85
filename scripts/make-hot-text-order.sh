#!/bin/bash
# Writes build/hot-text.order: the functions of azp-sandbox that an `exec` cycle runs,
# in the order they first run. Release builds link them next to each other (build.rs,
# `--symbol-ordering-file`): every process of a job (the CLI, the forked helper,
# libcontainer's two clones) faults the binary's text in anew, 64 KB at a time, and
# the functions of one cycle were spread over ~100 of the text's ~170 such windows.
#
# Usage (root, perf installed): sudo scripts/make-hot-text-order.sh [BINARY]
# BINARY: a release build of this checkout (default target/release/azp-sandbox);
# CYCLES=N changes the number of cycles per network mode (default 100). Rebuild the
# release binary after, and commit the file: names of functions that changed since are
# skipped by the linker, so an old list only groups less.
#
# Nothing is sent anywhere: the jobs run in a network namespace of their own made for
# this, whose only link is a veth pair with both ends in it (its default route leads
# nowhere else).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/azp-sandbox}")
cycles=${CYCLES:-100}
[ "$(id -u)" = 0 ] || { echo "make-hot-text-order: run as root (sudo)" >&2; exit 2; }
command -v perf >/dev/null || { echo "make-hot-text-order: perf not found: apt-get install linux-perf" >&2; exit 2; }
[ -x "$bin" ] || { echo "make-hot-text-order: $bin not found: cargo build --release first" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The jobs' own ids must reach their init in the home's cache.
chmod 711 "$work"
scripts/make-busybox-rootfs.sh "$work/bb.tar" >/dev/null
"$bin" --home "$work/home" -q rootfs import "$work/bb.tar" --name bb
cat >"$work/cycles.sh" <<EOF
set -e
ip link set lo up
ip link add d0 type veth peer name d1
ip addr add 198.18.0.2/24 dev d0
ip link set d1 up
ip link set d0 up
ip route add default via 198.18.0.1
for i in \$(seq $cycles); do
  for net in isolated none host; do
    "$bin" --home "$work/home" -q exec --rootfs bb --network \$net -- /bin/true 2>/dev/null
  done
done
EOF
# User-mode samples every 10 us of CPU, all processes: the helper and libcontainer's
# processes are forks of the binary and sample as its DSO too.
perf record -q -a -e cpu-clock:u -c 10000 -o "$work/perf.data" -- unshare --net bash "$work/cycles.sh"
"$bin" --home "$work/home" -q gc >/dev/null 2>&1 || true
mkdir -p build
perf script -i "$work/perf.data" --no-demangle -F ip,sym,dso 2>/dev/null |
  awk -v dso="($bin)" 'index($0, dso) { if (!seen[$2]++) print $2 }' >build/hot-text.order
echo "make-hot-text-order: $(wc -l <build/hot-text.order) functions in build/hot-text.order"

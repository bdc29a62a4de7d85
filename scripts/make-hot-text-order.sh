#!/bin/bash
# Writes build/hot-text.order: the functions of azp-sandbox that an `exec` cycle runs,
# grouped by the processes that run them (see below), each group in the order its
# functions first run, for release builds to link next to each other (why:
# docs/architecture.md, "The release build").
#
# Usage (root; perf and python3 installed): sudo scripts/make-hot-text-order.sh [BINARY]
# BINARY: a release build of this checkout (default target/release/azp-sandbox);
# CYCLES=N changes the number of cycles per network mode (default 100), PERIOD_NS the
# samples' period. Rebuild the release binary after, and commit the file: names of
# functions that changed since are skipped by the linker, so an old list only groups
# less. A second run on the rebuilt binary finds most of what the first one missed.
#
# Nothing is sent anywhere: the jobs run in a network namespace of their own made for
# this, whose only link is a veth pair with both ends in it (its default route leads
# nowhere else).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/azp-sandbox}")
cycles=${CYCLES:-100}
period=${PERIOD_NS:-10000}
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
# User-mode samples every PERIOD_NS of CPU (10 us), and every user page fault, whose
# address is an instruction that ran: a function too short for the samples shows up
# there when it lies outside the grouped text (run this on a build with a list, and
# each run finds what the last one missed). All processes: the helper and
# libcontainer's processes are forks of the binary and sample as its DSO too.
perf record -q -a -g -e cpu-clock:u -c "$period" -e exceptions:page_fault_user -o "$work/perf.data" -- \
  unshare --net bash "$work/cycles.sh"
"$bin" --home "$work/home" -q gc >/dev/null 2>&1 || true
mkdir -p build
list=build/hot-text.order
# Each sample with its call chain; the first frame in the binary is where it ran (for a
# page fault, the frames before it are the kernel's). The functions are then grouped by
# the processes that ran them, so that each process finds its own in as few 64 KB
# windows as it can: libcontainer's init's first, those it shares with the
# intermediate, the intermediate's, the helper's, the CLI's (each group in the order
# its functions first ran). Grouped so, the init's and the intermediate's text faults
# fell from 14 and 17 per cycle to 3 and 5.
perf script -i "$work/perf.data" --no-demangle -F comm,ip,sym,dso 2>/dev/null |
  python3 -c '
import collections, sys
tag = "(" + sys.argv[1] + ")"
roles = {"azp-sandbox": "cli", "azp-sbx-helper": "helper", "youki:[1:INTER]": "inter", "youki:[2:INIT]": "init"}
first, ran_in = {}, collections.defaultdict(set)
for sample in sys.stdin.read().split("\n\n"):
    lines = [l for l in sample.split("\n") if l.strip()]
    frame = next((l for l in lines[1:] if tag in l), None)
    if frame:
        fn = frame.split()[1]
        first.setdefault(fn, len(first))
        ran_in[fn].add(roles.get(lines[0].strip(), "cli"))
def group(fn):
    r = ran_in[fn]
    return 0 if "init" in r and "inter" not in r else 1 if "init" in r else 2 if "inter" in r else 3 if "helper" in r else 4
for fn in sorted(first, key=lambda f: (group(f), first[f])):
    print(fn)
' "$bin" >"$work/order"
# What an earlier run found and this one did not sample stays, after this run's: the
# samples miss some short functions each time, and each run on a build with the list
# finds others (FRESH=1 starts over).
if [ -f "$list" ] && [ -z "${FRESH:-}" ]; then
  awk '!seen[$0]++' "$work/order" "$list" >"$work/merged"
  mv "$work/merged" "$work/order"
fi
mv "$work/order" "$list"
echo "make-hot-text-order: $(wc -l <"$list") functions in $list"

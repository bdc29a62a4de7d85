#!/usr/bin/env bash
# TCP throughput from a job with the default network (`--network isolated`: its own
# namespace, a veth, the host's nftables table) against the same transfer from the host
# itself, to an iperf3 server in another network namespace: issue 23's target is
# job >= 0.8x host. Interleaved rounds, medians, the ratio. Root; needs iperf3.
#
# The traffic stays in namespaces made here: a "fake host" (where azp-sandbox runs, as
# in tests/common/netlab.rs) joined by a veth to a "fake internet" (198.18.0.0/15, the
# benchmarking range) where iperf3 listens on 198.19.0.1. Nothing reaches the machine's
# real interfaces. The job runs the host's iperf3 through the host's loader, from
# read-only binds of /usr/bin and the host's libraries, so any rootfs will do.
#
#   bench/net_throughput.sh [BINARY] [ROUNDS] [SECONDS]   (defaults: target/release, 5, 5)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/azp-sandbox}
rounds=${2:-5}
secs=${3:-5}
command -v iperf3 >/dev/null || { echo "net_throughput: needs iperf3 (scripts/setup.sh installs it)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "net_throughput: run as root (network namespaces)" >&2; exit 2; }
[ -x "$bin" ] || { echo "net_throughput: no $bin: cargo build --release first" >&2; exit 2; }
tar=target/fixtures/busybox-rootfs.tar
[ -s "$tar" ] || { mkdir -p "$(dirname "$tar")" && scripts/make-busybox-rootfs.sh "$tar"; }

# Not "azp*": the jobs' nftables rules take every azp* link for a job's.
n=nb$$
h=$n-h; i=$n-i
work=$(mktemp -d /var/tmp/azp-net-bench.XXXXXX)
chmod 0711 "$work"   # the jobs' own ids pass through to the home (SECURITY.md, identity)
cleanup() {
  ip netns pids "$i" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$h" 2>/dev/null || true
  ip netns del "$i" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$h"
ip netns add "$i"
ip link add "${n}h" type veth peer name "${n}i"
ip link set "${n}h" netns "$h"
ip link set "${n}i" netns "$i"
ip -n "$h" addr add 198.18.0.1/30 dev "${n}h"
ip -n "$i" addr add 198.18.0.2/30 dev "${n}i"
ip -n "$i" addr add 198.19.0.1/32 dev lo
for ns in "$h" "$i"; do ip -n "$ns" link set lo up; done
ip -n "$h" link set "${n}h" up
ip -n "$i" link set "${n}i" up
ip -n "$h" route add default via 198.18.0.2
ip -n "$i" route add 10.0.0.0/8 via 198.18.0.1
# One server per side (a server runs one test at a time and may still be closing the last).
ip netns exec "$i" iperf3 -s -D -B 198.19.0.1 -p 5201 --logfile "$work/iperf3-host.log"
ip netns exec "$i" iperf3 -s -D -B 198.19.0.1 -p 5202 --logfile "$work/iperf3-job.log"
sleep 0.3

in_host() { nsenter --net="/run/netns/$h" "$@"; }
home=$work/home
in_host "$bin" -q --home "$home" rootfs import "$tar" --name bb
lib=/usr/lib/x86_64-linux-gnu
job_iperf=( "$bin" -q --home "$home" exec --rootfs bb --volume /usr/bin:/host/bin --volume "$lib:/host/lib"
            -- /host/lib/ld-linux-x86-64.so.2 --library-path /host/lib /host/bin/iperf3 )
mbps() { python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))'; }

host=(); job=()
for r in $(seq "$rounds"); do
  for side in host job; do
    [ $((r % 2)) = 0 ] && side=$([ "$side" = host ] && echo job || echo host)
    if [ "$side" = host ]; then
      host+=( "$(in_host iperf3 -c 198.19.0.1 -p 5201 -t "$secs" -J </dev/null | mbps)" )
    else
      job+=( "$(in_host "${job_iperf[@]}" -c 198.19.0.1 -p 5202 -t "$secs" -J </dev/null | mbps)" )
    fi
    sleep 0.5
  done
  echo "round $r: host ${host[-1]} Mbit/s, job ${job[-1]} Mbit/s" >&2
done
python3 - "${host[*]}" "${job[*]}" <<'EOF'
import statistics, sys
host = [float(x) for x in sys.argv[1].split()]
job = [float(x) for x in sys.argv[2].split()]
ratios = [j / h for h, j in zip(host, job)]
print("| TCP to a server in another netns (iperf3) | median Mbit/s |")
print("|---|---|")
print(f"| from the host (fake host namespace) | {statistics.median(host):.0f} |")
print(f"| from a job, `--network isolated` (veth + nftables) | {statistics.median(job):.0f} |")
print(f"\njob / host: **{statistics.median(ratios):.2f}x** (median of {len(ratios)} interleaved rounds; target >= 0.8x)")
EOF

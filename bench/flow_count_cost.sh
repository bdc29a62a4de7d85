#!/bin/bash
# What the per-job limit of tracked connections costs the host while a job at its limit
# keeps opening new flows (bench/NOTES.md, "flow count"). The kernel's connlimit walks
# the job's whole list of connections (a conntrack lookup each) at a new flow, once per
# tick, in softirq: no cgroup pays for it.
#
# Two scratch network namespaces joined by a veth named like a job link: `fc-job` sends,
# `fc-host` has the two rules of the jobs' table that matter here (firewall.rs's
# flows_script: the rate, then the count) in its input chain, dropping instead of the
# table's jump to a logged, counted reject. The job fills its limit with one datagram to each of LIMIT ports, then sends
# RATE new flows a second (a new socket each) for 5 s while `perf record -a` samples both
# CPUs. Printed: the share of all samples in the walk (`__nf_conntrack_find_get`,
# `__nf_conncount_add` and their helpers) and in idle. No traffic leaves the namespaces.
#
#   sudo bench/flow_count_cost.sh [LIMIT] [NEW_PER_SECOND|none] [RATE]
#   e.g. 16384 none 1000 (the table before the rate), 4096 100 1000 (the table now)
set -euo pipefail
LIMIT=${1:-4096}
PER_SECOND=${2:-100}
RATE=${3:-1000}
[ "$(id -u)" = 0 ] || { echo "flow_count_cost.sh: run as root (it makes network namespaces)" >&2; exit 1; }
for tool in nft perf python3; do
    command -v "$tool" >/dev/null || { echo "flow_count_cost.sh: needs $tool" >&2; exit 1; }
done
drop_namespaces() { ip netns del fc-job 2>/dev/null || true; ip netns del fc-host 2>/dev/null || true; }
drop_namespaces
work=$(mktemp -d)
trap 'drop_namespaces; rm -rf "$work"' EXIT
ip netns add fc-job
ip netns add fc-host
ip -n fc-job link set lo up
ip -n fc-host link set lo up
ip link add azpfcjob netns fc-job type veth peer name azpfchost netns fc-host
ip -n fc-job addr add 10.99.0.2/24 dev azpfcjob
ip -n fc-host addr add 10.99.0.1/24 dev azpfchost
ip -n fc-job link set azpfcjob up
ip -n fc-host link set azpfchost up
rate_rule=""
if [ "$PER_SECOND" != none ]; then
    rate_rule="iifname \"azp*\" ct state new ct status & confirmed == 0 update @job_new_flows { iifname limit rate over $PER_SECOND/second burst $LIMIT packets } drop"
fi
ip netns exec fc-host nft -f - <<NFT
table inet fc {
  set job_flows { type ifname; flags dynamic; size 65535; }
  set job_new_flows { type ifname; flags dynamic,timeout; timeout 1h; size 65535; }
  chain input { type filter hook input priority filter; policy accept;
    $rate_rule
    iifname "azp*" ct state new ct status & confirmed == 0 add @job_flows { iifname ct count over $LIMIT } drop
  }
}
NFT
cat >"$work/send.py" <<'PY'
import socket, sys, time
mode, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "fill":
    for p in range(n):
        if p % 64000 == 0:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"x", ("10.99.0.1", 1024 + p % 64000))
else:
    t0, k = time.time(), 0
    while time.time() - t0 < 5:
        f = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        f.sendto(b"y", ("10.99.0.1", 65000))
        f.close()
        k += 1
        wait = t0 + k / n - time.time()
        if wait > 0:
            time.sleep(wait)
PY
ip netns exec fc-job python3 "$work/send.py" fill "$LIMIT"
sleep 1
echo "tracked in fc-host after the fill: $(ip netns exec fc-host cat /proc/sys/net/netfilter/nf_conntrack_count)"
perf record -q -a -F 999 -o "$work/perf.data" -- ip netns exec fc-job python3 "$work/send.py" new "$RATE"
perf report -i "$work/perf.data" --no-children --sort sym 2>/dev/null | awk -v limit="$LIMIT" -v per="$PER_SECOND" -v rate="$RATE" '
    /\[k\] (__)?(nf_conntrack_find_get|nf_conncount|siphash|hash_conntrack_raw)/ { walk += $1 }
    /\[k\] (pv_native_safe_halt|native_safe_halt|acpi_safe_halt|default_idle|mwait_idle|intel_idle|acpi_idle|poll_idle)/ { idle += $1 }
    END { printf "limit %s, new flows a second past it: %s, sent %s a second: walk %.1f%% of all CPUs, idle %.1f%%\n", limit, per, rate, walk, idle }'

#!/usr/bin/env bash
# Caches (issue 24): what a cache costs a job, measured with the real binary as root.
#  1. mount cost vs cache size: `exec -- true` with no cache, with an empty cache, and
#     with a cache whose snapshot holds SIZE_MB of data in FILES files, interleaved;
#  2. commit time of a job that wrote COMMIT_MB into the cache (the commit's own log line).
# Usage: bench/cache_cycle.sh [ROUNDS] (env: SIZE_MB=2048 FILES=20000 COMMIT_MB=1024)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-10}"
size_mb="${SIZE_MB:-2048}"; files="${FILES:-20000}"; commit_mb="${COMMIT_MB:-1024}"
bin="$(pwd)/target/${PROFILE:-debug}/azp-sandbox"
[ -x "$bin" ] || { echo "build it first: cargo build ${PROFILE:+--profile $PROFILE}" >&2; exit 1; }
home="$(mktemp -d /var/tmp/azp-cache-bench.XXXXXX)"
trap 'rm -rf "$home"' EXIT
az() { "$bin" -q --home "$home" "$@" 2> >(grep -v "no disk quota" >&2); }
az rootfs import target/fixtures/busybox-rootfs.tar --name bb >/dev/null
job() { az exec --rootfs bb --network none "$@"; }
# The big cache: one commit of SIZE_MB in FILES files (plus one 1 MB file per 100).
job --cache big:/c:commit -- sh -c "cd /c && i=0; while [ \$i -lt $files ]; do echo \$i > f\$i; i=\$((i+1)); done; \
  dd if=/dev/zero of=blob bs=1M count=$size_mb 2>/dev/null"
job --cache empty:/c -- true
now() { date +%s%N; }
declare -A total=([none]=0 [empty]=0 [big]=0)
for r in $(seq "$rounds"); do
  for kind in none empty big; do
    args=(); [ "$kind" = none ] || args=(--cache "$kind:/c")
    t0=$(now); job "${args[@]}" -- true; t1=$(now)
    total[$kind]=$(( ${total[$kind]} + (t1 - t0) ))
  done
done
du_big=$(du -sh "$home/caches/big/snapshots" | cut -f1)
echo "exec -- true, mean of $rounds interleaved rounds (cache 'big': $du_big, $files files):"
for kind in none empty big; do
  printf '  %-6s %7.1f ms\n' "$kind" "$(echo "${total[$kind]} / $rounds / 1000000" | bc -l)"
done
printf '  ratio big/empty: %.2f\n' "$(echo "${total[big]} / ${total[empty]}" | bc -l)"
# Commit of a COMMIT_MB change, over the big snapshot (its links are made too).
log=$("$bin" --home "$home" exec --rootfs bb --network none --cache big:/c:commit -- \
  sh -c "dd if=/dev/zero of=/c/new bs=1M count=$commit_mb 2>/dev/null" 2>&1 | grep 'committed snapshot' || true)
echo "commit of a ${commit_mb} MB change: ${log##*INFO }"

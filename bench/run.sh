#!/usr/bin/env bash
# Regenerates BENCHMARKS.md: every benchmark in one run, on this machine, against its
# real peer (runc, podman if installed, GNU tar, skopeo + umoci). Run as root on an
# otherwise idle machine.
#   AZP_BENCH_RUNS (sandbox cycles, default 30), AZP_BENCH_JOBS (agent churn, default 200;
#   the issue's 1000 with AZP_BENCH_JOBS=1000), AZP_BENCH_BIG_JOBS (big jobs per phase,
#   default 5), AZP_BENCH_ROOTFS (archive to unpack and to pull as a 1-layer image),
#   AZP_BENCH_UNPACK_RUNS (imports of each kind, default 5), AZP_BENCH_PULL_RUNS (pulls,
#   default 5), AZP_BENCH_PIP=1 (also the pip cache bench, ~15 min).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf target/bench-results
# The unpack and pull benchmarks' archive: a real CUDA rootfs from rootfs-recipes/
# (runtime-only, ~1 GB), built once and cached, unless AZP_BENCH_ROOTFS names another.
if [ -z "${AZP_BENCH_ROOTFS:-}" ]; then
  cached=target/fixtures/cuda11.8-runtime-rootfs.tar.zst
  if [ ! -s "$cached" ]; then
    cargo build --release
    h=$(mktemp -d /var/tmp/azp-bench-home.XXXXXX)
    target/release/azp-sandbox --home "$h" rootfs build debian-bookworm-cuda11.8-runtime --name cuda-runtime \
      --cache-dir target/fixtures/apt-cache
    tar --numeric-owner -C "$h/rootfs/cuda-runtime/tree" -cf - . | zstd -q -T0 -3 -o "$cached.partial"
    mv "$cached.partial" "$cached"
    rm -rf "$h"
  fi
  export AZP_BENCH_ROOTFS=$cached
fi
cargo bench --bench sandbox_cycle
cargo bench --bench unpack
cargo bench --bench pull
cargo bench --bench agent_churn
# TCP from a job's own network against the host's, to iperf3 in another namespace.
{ echo "### Network throughput (\`bench/net_throughput.sh\`, iperf3, 5 interleaved rounds of 5 s)"; echo
  bench/net_throughput.sh target/release/azp-sandbox 5 5; echo; } > target/bench-results/net_throughput.md
cargo bench --bench git_mirror
# The pip half of the caches bench: long (~15 min on 2 cores), so only on request; its
# fixtures are made once (PyPI, debootstrap).
if [ -n "${AZP_BENCH_PIP:-}" ]; then
  [ -d target/fixtures/pip-index ] || scripts/fixtures/pip-index.sh
  [ -s target/fixtures/debian-bookworm-agent-python.tar.zst ] || { cargo build; scripts/fixtures/python-rootfs.sh; }
  cargo bench --bench pip_cache
fi
cgroup=$(stat -fc %T /sys/fs/cgroup/ 2>/dev/null || echo unknown)
[ "$cgroup" = tmpfs ] && cgroup="v1 (hybrid)" || cgroup="v2"
{
  echo "# Benchmarks"
  echo
  echo "Regenerate with \`sudo bench/run.sh\`. Medians and ratios from one run on one machine;"
  echo "the machine is shared and noisy, so compare ratios, not absolute times."
  echo
  echo "| machine | value |"
  echo "|---|---|"
  echo "| date | $(date -u +%Y-%m-%dT%H:%MZ) |"
  echo "| CPU | $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') |"
  echo "| memory | $(free -g | awk '/Mem:/ {print $2}') GiB |"
  echo "| kernel | $(uname -r), cgroup $cgroup |"
  echo "| azp-sandbox | $(git rev-parse --short HEAD 2>/dev/null || echo unknown), release build |"
  echo
  cat target/bench-results/sandbox_cycle.md target/bench-results/unpack.md target/bench-results/pull.md \
    target/bench-results/agent_churn.md target/bench-results/net_throughput.md
  # Skipped (absent) when its fixtures are missing: see benches/git_mirror.rs.
  cat target/bench-results/git_mirror.md 2>/dev/null || true
  # Only with AZP_BENCH_PIP=1: see benches/pip_cache.rs.
  cat target/bench-results/pip_cache.md 2>/dev/null || true
  # The real-GPU section: scripts/gpu-proof.sh --out bench/GPU.md on a GPU machine.
  if [ -f bench/GPU.md ]; then cat bench/GPU.md; echo; fi
  if [ -f bench/NOTES.md ]; then cat bench/NOTES.md; fi
} > BENCHMARKS.md
echo "wrote BENCHMARKS.md"

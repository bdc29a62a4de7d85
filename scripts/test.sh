#!/usr/bin/env bash
# The test suite. Real sandboxes: run as root (tests that need root skip otherwise, and
# say so). Heavy cases are opt-in: AZP_SANDBOX_HEAVY_TESTS=1 (see CONTRIBUTING.md).
#
# Two passes: everything as root, then the rootless pass: the escape suite, the rootless
# tests, the caches and git mirror tests, the agent runner (both packages) and the GPU sandbox tests as the ordinary user azp-rootless (made by scripts/setup.sh),
# with a cgroup subtree delegated to it (scripts/delegate-cgroups.sh).
#
# Tests that cannot run here are never counted silently: those needing root are ignored
# (with their reason) in a build by another user, the others print SKIPPED and add a
# line to $AZP_SANDBOX_SKIP_LOG (tests/common/skip.rs). The summary at the end lists
# both, for both passes, even when a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${AZP_SANDBOX_TEST_THREADS:-4}"
# Jobs run by tests in this machine's own network namespace get no IPv6: its IPv6
# default route is the real network's (an `auto` job would turn on the real uplink's
# force_forwarding while the jobs' table exists). The network lab's commands unset it.
export AZP_SANDBOX_IPV6=off

AZP_SANDBOX_SKIP_LOG="$(mktemp /tmp/azp-sandbox-skips.XXXXXX)"
export AZP_SANDBOX_SKIP_LOG
output="$(mktemp /tmp/azp-sandbox-test-output.XXXXXX)"
summary() {
  local skipped ignored
  skipped="$(grep -c . "$AZP_SANDBOX_SKIP_LOG" || true)"
  ignored="$(grep -cE '^test .* \.\.\. ignored' "$output" || true)"
  echo
  echo "test.sh: $skipped skipped, whole or (in part) (cargo test counts them as passed):"
  sed 's/^/  /' "$AZP_SANDBOX_SKIP_LOG"
  echo "test.sh: $ignored ignored:"
  grep -E '^test .* \.\.\. ignored' "$output" | sed -E 's/^test (.*) \.\.\. ignored,? ?/  \1: /' || true
  rm -f "$AZP_SANDBOX_SKIP_LOG" "$output"
  # Jobs run in this machine's own network namespace made the jobs' nftables table
  # there (and turned IPv4 forwarding on): gc removes it once no job is left, as it
  # would after a service's stop, and says so.
  if [ "$(id -u)" = 0 ] && [ -x "$root_binary" ]; then
    "$root_binary" gc 2>&1 | grep -i "nftables" || true
  fi
}
root_binary="${CARGO_TARGET_DIR:-$(pwd)/target}/debug/azp-sandbox"
trap summary EXIT

cargo build --locked --all-targets
cargo test --locked -- --test-threads="$threads" 2>&1 | tee -a "$output"

rootless_user="${AZP_SANDBOX_ROOTLESS_USER:-azp-rootless}"
if ! id "$rootless_user" >/dev/null 2>&1; then
  echo "test.sh: user $rootless_user missing: run scripts/setup.sh first" >&2
  exit 1
fi
# The user must reach the test binaries and fixtures; a checkout under a private dir
# (e.g. /root) gets a target dir of its own under /var/tmp for this pass.
if ! runuser -u "$rootless_user" -- test -x target/debug/azp-sandbox; then
  export CARGO_TARGET_DIR=/var/tmp/azp-sandbox-rootless-target
  echo "test.sh: $rootless_user cannot reach $(pwd)/target: building the rootless pass in $CARGO_TARGET_DIR"
  mkdir -p "$CARGO_TARGET_DIR" && chmod 755 "$CARGO_TARGET_DIR"
fi
scripts/delegate-cgroups.sh "$rootless_user" >/dev/null
AZP_SANDBOX_TEST_USER="$rootless_user" cargo test --locked \
  --test escape_suite --test rootless --test caches --test git_mirror --test agent_runner --test real_agent --test gpu_sandbox -- --test-threads="$threads" \
  2>&1 | tee -a "$output"

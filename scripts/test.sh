#!/usr/bin/env bash
# The test suite. Real sandboxes: run as root (tests that need root skip otherwise, and
# say so). Heavy cases are opt-in: AZP_SANDBOX_HEAVY_TESTS=1 (see README).
#
# Two passes: everything as root, then the rootless pass: the escape suite, the rootless
# tests, the agent runner and the GPU sandbox tests as the ordinary user azp-rootless (made by scripts/setup.sh),
# with a cgroup subtree delegated to it (scripts/delegate-cgroups.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${AZP_SANDBOX_TEST_THREADS:-4}"
cargo build --locked --all-targets
cargo test --locked -- --test-threads="$threads"

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
  --test escape_suite --test rootless --test agent_runner --test gpu_sandbox -- --test-threads="$threads"

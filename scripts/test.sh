#!/usr/bin/env bash
# The test suite. Real sandboxes: run as root (tests that need root skip otherwise, and
# say so). Heavy cases are opt-in: AZP_SANDBOX_HEAVY_TESTS=1 (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --all-targets
cargo test --locked -- --test-threads="${AZP_SANDBOX_TEST_THREADS:-4}"

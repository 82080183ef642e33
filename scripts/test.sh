#!/usr/bin/env bash
# The README's test command: installs what is missing, then runs every test in
# the workspace. eBPF tests need root; without it they skip with a loud reason
# (and fail under CI=true, where skipping would hide a broken probe path).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
bash scripts/setup.sh
if [ "$(id -u)" -ne 0 ]; then
  echo "[test] WARNING: not root: eBPF tests will SKIP (run as root to exercise the probes)" >&2
fi
# One test at a time inside each binary: the scenario tests run simulated
# jobs in real time, and on a 2-core machine two of them at once distort
# each other's timing.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-1}
echo "[test] cargo test --workspace (first build takes a few minutes)"
cargo test --workspace "$@" 2>&1 | grep -v '^warning: slowrank-agent@'
exit "${PIPESTATUS[0]}"

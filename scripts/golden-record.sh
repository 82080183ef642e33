#!/usr/bin/env bash
# Re-records the golden replay inputs (coordinator/tests/golden/<name>/) from
# the short specs in coordinator/tests/golden/specs/: each spec is run as a
# real scenario (agents with eBPF probes, coordinator, simulated job), and its
# agents' records (gzipped, no timestamp in the gzip header) and the live
# coordinator's report (whose per-host clock fits drive the replay) are kept.
# Then the expected reports are re-blessed. Needs root, like the demo.
#
#   sudo bash scripts/golden-record.sh [NAME...]     # default: all five
#
# Recording changes the inputs; re-blessing alone (after an intended change
# of results) is: SLOWRANK_BLESS=1 cargo test -p slowrank-coordinator --test golden
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
gold=coordinator/tests/golden
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(compute host link hang healthy)
cargo build --quiet -p slowrank-agent -p slowrank-coordinator -p slowrank-scenarios
bin="${CARGO_TARGET_DIR:-target}/debug"
for n in "${names[@]}"; do
  spec="$gold/specs/golden-$n.toml"
  [ -f "$spec" ] || { echo "no spec $spec" >&2; exit 2; }
  tmp=$(mktemp -d)
  echo "recording $n from $spec"
  "$bin/slowrank-scenario" run "$spec" --out "$tmp" > "$tmp/run.log" 2>&1 \
    || { echo "scenario $n failed; see $tmp/run.log" >&2; exit 1; }
  rm -rf "${gold:?}/$n"
  mkdir -p "$gold/$n"
  for f in "$tmp"/agent-host-*.jsonl; do
    gzip -9 -n -c "$f" > "$gold/$n/$(basename "$f").gz"
  done
  cp "$tmp/report.json" "$gold/$n/live-report.json"
  cp "$tmp/truth.json" "$gold/$n/truth.json" 2>/dev/null || true
  rm -rf "$tmp"
  du -sh "$gold/$n"
done
SLOWRANK_BLESS=1 cargo test -q -p slowrank-coordinator --test golden
echo "re-recorded and blessed: ${names[*]}; review with git diff --stat $gold"

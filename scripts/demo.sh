#!/usr/bin/env bash
# The README's demo: installs what is missing, builds, then runs a simulated
# 8-rank training job (2 simulated hosts) with one injected slow rank. A
# coordinator and one eBPF agent per simulated host watch it; at the end the
# coordinator's cluster report is printed, then scored against the injected
# truth. Needs root (eBPF uprobes).
#
#   SLOWRANK_DEMO_SPEC=scenarios/specs/X.toml   pick another scenario
#   SLOWRANK_DEMO_OUT=DIR                       keep the run's files there
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback

if [ "$(id -u)" -ne 0 ]; then
  echo "[demo] ERROR: the demo attaches eBPF uprobes and must run as root (sudo bash $0 where you have sudo)" >&2
  exit 1
fi
bash scripts/setup.sh
echo "[demo] building (the first build takes several minutes)"
cargo build --quiet -p slowrank-agent -p slowrank-coordinator -p slowrank-scenarios 2>&1 \
  | grep -v '^warning: slowrank-agent@' || true
# The trainer with frame pointers, so the flame graphs reach its functions.
bash scenarios/build-fp-trainer.sh

spec=${SLOWRANK_DEMO_SPEC:-scenarios/specs/dp8-host-slow-dataloader.toml}
out=${SLOWRANK_DEMO_OUT:-$(mktemp -d /tmp/slowrank-demo.XXXXXX)}
rm -rf "$out"
echo "[demo] running $spec (coordinator + 2 agents + 8 ranks); files in $out"
grep '^description' "$spec" | sed 's/^description = /[demo] scenario: /'
./target/debug/slowrank-scenario run "$spec" --out "$out" \
  --trainer target/fp/debug/slowrank-trainer
echo
echo "[demo] ---- the cluster report (slowrank report $out) ----"
./target/debug/slowrank report "$out"
if ls "$out"/flame/*diff.svg >/dev/null 2>&1; then
  echo "[demo] differential flame graphs: $(ls "$out"/flame/*diff.svg | tr '\n' ' ')"
fi
echo "[demo] Perfetto/Chrome trace of the aligned timeline: $out/trace.json"
echo "[demo] the report as a page (open it in a browser; no network needed): $out/report.html"
echo
echo "[demo] ---- scored against the injected truth ----"
./target/debug/slowrank-scenario score "$out"

#!/usr/bin/env bash
# The README's demo: installs what is missing, builds, starts a coordinator on
# loopback and an agent wrapping a tiny process, and shows the probed calls
# arriving at the coordinator over QUIC. Needs root (eBPF uprobes).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback

if [ "$(id -u)" -ne 0 ]; then
  echo "[demo] ERROR: the demo attaches eBPF uprobes and must run as root (try: sudo $0)" >&2
  exit 1
fi
bash scripts/setup.sh
echo "[demo] building (first build takes a few minutes)"
cargo build --quiet -p slowrank-agent -p slowrank-coordinator -p slowrank-scenarios 2>&1 \
  | grep -v '^warning: slowrank-agent@' || true

work=$(mktemp -d /tmp/slowrank-demo.XXXXXX)
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=${SLOWRANK_DEMO_PORT:-47700}
tiny="$PWD/target/debug/slowrank-tiny"

echo "[demo] coordinator on 127.0.0.1:$port (output in $work/coordinator.log)"
SLOWRANK_TOKEN=$token ./target/debug/slowrank serve --listen "127.0.0.1:$port" \
  --tls-dir "$work/tls" --print-calls --exit-when-idle >"$work/coordinator.log" 2>&1 &
coord=$!
trap 'kill $coord 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -f "$work/tls/coordinator.crt" ] && break; sleep 0.1; done
[ -f "$work/tls/coordinator.crt" ] || { cat "$work/coordinator.log"; echo "[demo] coordinator did not start" >&2; exit 1; }

echo "[demo] agent wrapping: $tiny 10  (probe: slowrank_demo_step, entry + return)"
SLOWRANK_TOKEN=$token ./target/debug/slowrank-agent --coordinator "127.0.0.1:$port" \
  --ca "$work/tls/coordinator.crt" --probe "$tiny:slowrank_demo_step" -- "$tiny" 10

wait $coord || true
trap - EXIT
echo "[demo] ---- what the coordinator printed ----"
cat "$work/coordinator.log"

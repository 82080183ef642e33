#!/usr/bin/env bash
# Soak benchmark (not in CI): a long healthy 16-rank job (4 simulated hosts x
# 4 ranks) watched by the coordinator and one eBPF agent per host. Samples the
# coordinator's and every agent's RSS every 10 s into DIR/rss.csv and prints,
# at the end: batches the agents produced vs batches the coordinator ingested
# (records lost), the loss the agents reported (spool / ring-buffer drops), and
# the verdicts and hangs on this fault-free job (all false findings). Root.
#
#   scripts/soak.sh                 30 minutes
#   SOAK_SECONDS=120 scripts/soak.sh    a 2-minute smoke run
#   SOAK_STEP_MS=60                 expected step time, to size the run
#   SOAK_OUT=DIR                    keep the files there (default: mktemp)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
[ "$(id -u)" -eq 0 ] || { echo "[soak] ERROR: needs root (eBPF uprobes)" >&2; exit 1; }

secs=${SOAK_SECONDS:-1800}
step_ms=${SOAK_STEP_MS:-60}
iters=$(( secs * 1000 / step_ms ))
out=${SOAK_OUT:-$(mktemp -d /tmp/slowrank-soak.XXXXXX)}
rm -rf "$out"; mkdir -p "$out"
cargo build --quiet -p slowrank-agent -p slowrank-coordinator -p slowrank-scenarios 2>&1 \
  | grep -v '^warning: slowrank-agent@' || true

echo "[soak] dp16-healthy, $iters iterations (~$secs s), files in $out"
# One log line per ingested batch: the coordinator's own account of what arrived.
RUST_LOG=info,slowrank_coordinator::serve=debug NO_COLOR=1 \
  ./target/debug/slowrank-scenario run scenarios/specs/dp16-healthy.toml \
  --out "$out/run" --iterations "$iters" --timeout $(( secs * 2 + 120 )) \
  >"$out/scenario.log" 2>&1 &
job=$!

services="$out/run/sim/services.json"
for _ in $(seq 600); do [ -s "$services" ] && break; sleep 0.2; done
[ -s "$services" ] || { echo "[soak] ERROR: services never started; see $out/scenario.log" >&2; kill "$job"; exit 1; }
mapfile -t pids < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(s["coordinator"]["pid"])
for a in s["agents"]: print(a["pid"])' "$services")
{
  printf 't_s,coordinator_kb'
  for i in $(seq 0 $(( ${#pids[@]} - 2 ))); do printf ',agent%d_kb' "$i"; done
  echo
} >"$out/rss.csv"
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
t0=$(date +%s)
while kill -0 "$job" 2>/dev/null; do
  line="$(( $(date +%s) - t0 ))"
  for p in "${pids[@]}"; do line="$line,$(rss "$p")"; done
  echo "$line" >>"$out/rss.csv"
  sleep 10
done
wait "$job" || echo "[soak] launcher exited with $? (see $out/scenario.log)"

python3 - "$out/run" "$out/rss.csv" <<'PY'
import csv, glob, json, os, re, sys
run, rss = sys.argv[1], sys.argv[2]
produced = {}
for f in sorted(glob.glob(os.path.join(run, "agent-host-*.jsonl"))):
    for line in open(f):
        if '"type":"batch"' in line:
            b = json.loads(line)
            produced[(b["host"], b["seq"])] = b["collectives"]
ingested = {}
for line in open(os.path.join(run, "logs", "coordinator.log")):
    if "batch ingested" in line:
        f = dict(re.findall(r'(\w+)=("?[^ "]+"?)', line))
        ingested[(f["host"].strip('"'), int(f["seq"]))] = int(f["collectives"])
lost = [k for k in produced if k not in ingested]
lost_colls = sum(produced[k] for k in lost)
r = json.load(open(os.path.join(run, "report.json")))
ing = r["ingest"]
rows = list(csv.reader(open(rss)))
cols = rows[0][1:]
peak = {c: max(int(x[i + 1] or 0) for x in rows[1:]) for i, c in enumerate(cols)} if len(rows) > 1 else {}
print(f"[soak] iterations observed {r['job']['iterations_observed']}, step {r['job']['step_time_ms']} ms")
print(f"[soak] batches produced {len(produced)}, ingested {len(ingested)}, lost {len(lost)} ({lost_colls} collective records)")
print(f"[soak] reported loss: spool drops {ing['spool_drops']}, ring-buffer drops {ing['ringbuf_drops']}, records rejected {sum(ing['records_rejected'].values())}")
print(f"[soak] false findings: {len(r['verdicts'])} verdicts, {len(r['hangs'])} hangs")
print("[soak] peak RSS (KiB): " + ", ".join(f"{c} {v}" for c, v in peak.items()))
print(f"[soak] RSS samples: {rss}")
PY

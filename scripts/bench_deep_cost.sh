#!/usr/bin/env bash
# Step-time cost of the deep probe set (verbs post_send/poll_cq + GPU-side
# attribution) against the default set: a short scenario with agents, runs
# interleaved default/deep, median step time per run (iterations after
# WARMUP, when the deep probes are attached), then the median over runs.
# Root; binaries built first (cargo build -p slowrank-scenarios -p
# slowrank-agent -p slowrank-coordinator). Usage:
#   sudo -E scripts/bench_deep_cost.sh [SPEC] [RUNS] [ITERATIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-scenarios/specs/dp8-healthy.toml}
runs=${2:-5}
iters=${3:-60}
warmup=10
profile=${PROFILE:-debug}
bin=target/$profile
export SLOWRANK_AGENT_BIN=$PWD/$bin/slowrank-agent
export SLOWRANK_COORDINATOR_BIN=$PWD/$bin/slowrank
tmp=$(mktemp -d /tmp/slowrank-deepcost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  for set in default deep; do
    args=""
    [ "$set" = deep ] && args="--deep"
    SLOWRANK_AGENT_ARGS="$args" "$bin/slowrank-scenario" run "$spec" \
      --out "$tmp/$set-$i" --iterations "$iters" >/dev/null 2>&1
  done
done
python3 - "$tmp" "$runs" "$warmup" "$spec" "$iters" <<'PY'
import csv, statistics, sys, json
tmp, runs, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = {}
for s in ("default", "deep"):
    meds = []
    for i in range(1, runs + 1):
        rows = list(csv.DictReader(open(f"{tmp}/{s}-{i}/steps.csv")))
        d = [float(r["duration_us"]) for r in rows if int(r["iteration"]) >= warmup]
        meds.append(statistics.median(d))
    out[s] = {"median_step_us": round(statistics.median(meds), 1),
              "per_run_median_us": [round(m, 1) for m in meds]}
out["deep_over_default_percent"] = round(
    100 * (out["deep"]["median_step_us"] / out["default"]["median_step_us"] - 1), 2)
out["spec"], out["iterations"], out["warmup"], out["runs"] = sys.argv[4], int(sys.argv[5]), warmup, runs
print(json.dumps(out, indent=2))
PY

#!/usr/bin/env bash
# The agents' threads over 20 s of a healthy dp8 run: CPU time and wakeups
# (voluntary context switches) per second, per thread name, summed over the
# run's agents. What it is for: the cost of the agent's own loops (ring
# drains, scans, the stack thread) on the cores the ranks use, beside the
# probes' traps that the overhead benchmark measures.
#
#   scripts/agent-threads.sh [OUT_DIR]
#
# Root (the agents attach uprobes). Needs the release build:
#   cargo build --release --workspace
# Environment: SECONDS_SAMPLED (20), SLOWRANK_SCENARIO (the scenario binary,
# default ./target/release/slowrank-scenario).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d /tmp/slowrank-threads.XXXXXX)}
S=${SLOWRANK_SCENARIO:-./target/release/slowrank-scenario}
WINDOW=${SECONDS_SAMPLED:-20}
[ -x "$S" ] || { echo "agent-threads: no $S (cargo build --release --workspace)" >&2; exit 2; }
rm -rf "$OUT/run"; mkdir -p "$OUT"
"$S" run scenarios/specs/dp8-healthy.toml --iterations 3000 --out "$OUT/run" >"$OUT/scenario.log" 2>&1 &
job=$!
trap 'kill $job 2>/dev/null; wait $job 2>/dev/null' EXIT

# The agents of this run: slowrank-agent processes whose output is under OUT.
agents=()
for _ in $(seq 600); do
  mapfile -t agents < <(pgrep -f "slowrank-agent.*$OUT/run" || true)
  [ ${#agents[@]} -ge 2 ] && break
  sleep 0.1
done
[ ${#agents[@]} -ge 1 ] || { echo "agent-threads: no agent started; see $OUT/scenario.log" >&2; exit 1; }
# Past start-up (attach, calibration, the first symbolization).
sleep 10

# name utime+stime (ticks) voluntary switches, one line per thread.
snapshot() {
  for p in "${agents[@]}"; do
    for t in /proc/"$p"/task/*; do
      [ -r "$t/stat" ] || continue
      name=$(tr ' ' '_' < "$t/comm")
      read -r -a f < <(sed 's/^.*) //' "$t/stat")
      vol=$(awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status")
      echo "$p/${t##*/} $name $(( f[11] + f[12] )) $vol"
    done
  done
}
# Per thread name: CPU ms/s and wakeups/s between the two snapshots
# (join: key, name, ticks, switches at t0, then the same at t1).
summarize() {
  printf "%-20s %7s %12s %10s\n" thread threads "CPU ms/s" "wakeups/s"
  join <(sort "$1/t0.txt") <(sort "$1/t1.txt") | awk -v hz="$hz" -v w="$WINDOW" '
    { name = $2; cpu[name] += ($6 - $3) * 1000 / hz / w; wake[name] += ($7 - $4) / w; n[name]++ }
    END {
      for (k in cpu) { printf "%-20s %7d %12.1f %10.0f\n", k, n[k], cpu[k], wake[k]; tc += cpu[k]; tw += wake[k] }
      printf "%-20s %7s %12.1f %10.0f\n", "~all", "", tc, tw
    }' | sort -k1,1
}
hz=$(getconf CLK_TCK)
snapshot > "$OUT/t0.txt"
sleep "$WINDOW"
snapshot > "$OUT/t1.txt"
echo "agents: ${#agents[@]} (pids ${agents[*]}), $WINDOW s of dp8-healthy; per second, summed over the agents"
summarize "$OUT" | tee "$OUT/threads.txt"

#!/usr/bin/env bash
# Reproduces the eval, sweep, overhead, wire and flood numbers of
# BENCHMARKS.md. Root (agent mode), after
#   cargo build -p slowrank-scenarios -p slowrank-agent -p slowrank-coordinator
# Usage: scripts/benchmarks.sh [eval|random|sweep|overhead|wire|flood|summary|all]...
# Output under $BENCH_OUT (default /tmp/slowrank-bench); small files only.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
B=${BENCH_OUT:-/tmp/slowrank-bench}
S=${SLOWRANK_SCENARIO:-./target/debug/slowrank-scenario}
mkdir -p "$B"
[ $# -eq 0 ] && set -- all

run_eval() {   # full matrix: every spec × $SEEDS seeds
  rm -rf "$B/eval"
  $S eval --seeds "${SEEDS:-1}" --out "$B/eval" > "$B/eval.txt" 2> "$B/eval.log"
}
run_random() {  # issue 20: random specs with counterfactual costs and a noise floor (release)
  # RANDOM_SEED: report on a seed no threshold was chosen on (say which in BENCHMARKS.md).
  # It takes hours (≈ 50 s a run, ≈ 220 runs): RANDOM_RESUME=1 keeps the
  # specs a cut-off run finished (same seed, options and build) and goes on.
  cargo build --release -q -p slowrank-scenarios -p slowrank-agent -p slowrank-coordinator || return 1
  [ -n "${RANDOM_RESUME:-}" ] || rm -rf "$B/random"
  SLOWRANK_AGENT_BIN="$PWD/target/release/slowrank-agent" SLOWRANK_COORDINATOR_BIN="$PWD/target/release/slowrank" \
    ./target/release/slowrank-scenario eval --random "${RANDOM_N:-100}" --seed "${RANDOM_SEED:?set RANDOM_SEED}" \
    ${RANDOM_STEP_MS:+--step-ms "$RANDOM_STEP_MS"} --resume --out "$B/random" > "$B/random.txt" 2>> "$B/random.log"
}
run_sweep() {  # detection latency vs slowdown factor (dp8-compute-slow)
  rm -rf "$B/sweep"
  $S eval --sweep-factors 1.05,1.1,1.3,2 --seeds "${SWEEP_SEEDS:-1}" --out "$B/sweep" > "$B/sweep.txt" 2> "$B/sweep.log"
  # The same with a 300 ms step: costs fixed in seconds, fewer iterations.
  rm -rf "$B/sweep-300ms"
  $S eval --sweep-factors 1.05,1.1,1.3,2 --sweep-step-ms 300 --iterations 150 --seeds "${SWEEP_SEEDS:-1}" \
    --out "$B/sweep-300ms" > "$B/sweep-300ms.txt" 2> "$B/sweep-300ms.log"
}
run_overhead() {  # step time: no agent / default probes / deep probes, interleaved
  # OH_MODES may add `always` (the always-on set alone: no launch samples),
  # and the modes that split a cost into its parts on this machine, where
  # the coordinator and the agents share the ranks' two cores:
  #   nostacks   default set, no stack sampler (the agent's biggest CPU user)
  #   coord-idle default set, the coordinator in SCHED_IDLE (on a real job it
  #              runs on another machine): what is left is the agents' CPU
  #              and the traps
  #   idle       default set, coordinator and agents in SCHED_IDLE: they take
  #              no CPU a rank wants, so what is left is the probes' traps
  #   idle-deep  the same for the deep set
  rm -rf "$B/overhead"; mkdir -p "$B/overhead"
  for i in $(seq 1 "${REPS:-3}"); do
    for m in ${OH_MODES:-none default deep}; do
      d="$B/overhead/$m-$i"
      case $m in
        none) $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" --no-agent ;;
        default) $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        always) SLOWRANK_AGENT_ARGS="--launch-sample-every 0" \
          $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        deep) SLOWRANK_AGENT_ARGS=--deep $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        nostacks) SLOWRANK_AGENT_ARGS=--no-stacks \
          $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        coord-idle) SLOWRANK_SERVICES_SCHED=coordinator-idle \
          $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        idle) SLOWRANK_SERVICES_SCHED=idle \
          $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        idle-deep) SLOWRANK_SERVICES_SCHED=idle SLOWRANK_AGENT_ARGS=--deep \
          $S run scenarios/specs/dp8-healthy.toml --iterations "${OH_ITERS:-200}" --out "$d" ;;
        *) echo "overhead: unknown mode $m" >&2; return 2 ;;
      esac > /dev/null 2>&1
      # The services' CPU over the run (scenarios/src/orchestrate.rs).
      cp "$d/sim/services-cpu.json" "$d/" 2>/dev/null
      # Calls per probe over the run (the agents log them at exit) and the
      # report's self-reported probe cost, for bench_summary.py.
      cat "$d"/logs/agent-host-*.log 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' \
        | grep -E 'probe calls over the run|probe trap cost|stack records over the run' > "$d/agent-cost.txt"
      find "$d" -mindepth 1 -maxdepth 1 ! -name steps.csv ! -name truth.json ! -name report.json \
        ! -name agent-cost.txt ! -name services-cpu.json -exec rm -rf {} +
    done
  done
}
run_wire() {  # bytes the coordinator received per rank per second (default set)
  rm -rf "$B/wire"; mkdir -p "$B/wire"
  port=$((20000 + RANDOM % 20000))
  SLOWRANK_COORDINATOR_ARGS="--metrics-listen 127.0.0.1:$port" \
    $S run scenarios/specs/dp8-healthy.toml --out "$B/wire/run" > /dev/null 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    curl -s "http://127.0.0.1:$port/metrics" > "$B/wire/metrics.tmp" 2>/dev/null \
      && grep -q slowrank_batch_bytes_received_total "$B/wire/metrics.tmp" \
      && mv "$B/wire/metrics.tmp" "$B/wire/metrics.txt"
    sleep 0.5
  done
  cp "$B/wire/run/report.json" "$B/wire/report.json"
  rm -rf "$B/wire/run"
}
run_flood() {  # scale: 1,024 / 4,096 / 16,384 ranks at FLOOD_RATE (100) collectives/s each
  # Release builds: a debug coordinator measures the compiler, not the design.
  cargo build --release -q -p slowrank-coordinator -p slowrank-scenarios || return 1
  for n in ${FLOOD_RANKS:-1024 4096 16384}; do
    SLOWRANK_COORDINATOR_BIN="$PWD/target/release/slowrank" \
    ./target/release/slowrank-scenario flood --ranks "$n" --collectives-per-s "${FLOOD_RATE:-100}" --flush-ms 200 \
      --seconds "${FLOOD_S:-20}" --onset 3 \
      --slow-rank 13 --out "$B/flood-work" > "$B/flood-$n.json" 2> "$B/flood-$n.log"
    rm -rf "$B/flood-work"
  done
}
for what in "$@"; do
  case $what in
    eval) run_eval ;; random) run_random ;; sweep) run_sweep ;; overhead) run_overhead ;; wire) run_wire ;;
    flood) run_flood ;;
    summary) python3 scripts/bench_summary.py "$B" ;;
    all) run_eval; run_sweep; run_overhead; run_wire; run_flood; python3 scripts/bench_summary.py "$B" ;;
    *) echo "unknown: $what" >&2; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# Flake hunt: runs each test that starts processes, kills them or depends on
# timing N times in a row, with load beside it, and prints a table
# (test, runs, failures, slowest run). A test of processes that passed once
# proves little.
#
#   scripts/repeat-tests.sh N [TEST...]
#
# TEST is a test target of the slowrank-tests crate (tests/tests/NAME.rs),
# optionally with a name filter: `faults_link_down` or
# `serve_ingest:bad_batches`. Without TESTs: every fault test, and the
# end-to-end tests over real QUIC and processes (see DEFAULT below).
#
# Environment:
#   REPEAT_LOAD=hog    (default) one busy loop per CPU core beside the tests
#   REPEAT_LOAD=build  a parallel `cargo build` of the coordinator into a
#                      scratch target directory, restarted whenever it ends
#   REPEAT_LOAD=none   no extra load (CI, which is loaded enough)
#   REPEAT_PROFILE=release  build and run the tests in release mode
#   REPEAT_LOGS=DIR    where each run's output goes (default: a temp dir;
#                      the logs of failed runs are kept and listed)
# A test's `[fact] ...` lines (what a pass rests on, e.g. the chaos run's
# lost-batch counts) are kept from every run in DIR/facts.txt and printed
# after the table.
# Exit status: 0 when every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage 0 ;; esac
N=$1; shift
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "repeat-tests: N must be a positive number, got '$N'" >&2; exit 2; }

DEFAULT=(faults_agent_restart faults_coordinator_restart faults_coordinator_back_late faults_link_down faults_rank_crash
         faults_chaos faults_agent_restart_pipeline scenario_interrupt serve_restart quic serve_e2e serve_ingest mtls
         agent_deep_links agent_dlopen_late agent_gpu_arrival agent_scenario_records stacks
         hostile_hang hostile_identity hostile_metrics hostile_mtls hostile_preauth hostile_state ui)
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=("${DEFAULT[@]}")

PROFILE_FLAG=()
[ "${REPEAT_PROFILE:-}" = release ] && PROFILE_FLAG=(--release)
LOGS=${REPEAT_LOGS:-$(mktemp -d /tmp/slowrank-repeat.XXXXXX)}
mkdir -p "$LOGS"

for t in "${TESTS[@]}"; do
  bin=${t%%:*}
  [ -f "tests/tests/$bin.rs" ] || { echo "repeat-tests: no test target tests/tests/$bin.rs" >&2; exit 2; }
done

echo "[repeat] building the test binaries once"
bins=()
for t in "${TESTS[@]}"; do bins+=(--test "${t%%:*}"); done
cargo test -p slowrank-tests "${PROFILE_FLAG[@]}" "${bins[@]}" --no-run 2>&1 | grep -v '^warning: slowrank-agent@' | tail -3
# The services the tests start (found next to the test binaries): a test
# build alone leaves them as old as the last full build.
cargo build "${PROFILE_FLAG[@]}" -p slowrank-coordinator -p slowrank-agent -p slowrank-scenarios --bins 2>&1 | grep -v '^warning: slowrank-agent@' | tail -1

LOAD=${REPEAT_LOAD:-hog}
load_pids=()
stop_load() {
  for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null; done
  load_pids=()
}
trap stop_load EXIT
case "$LOAD" in
  hog)
    for _ in $(seq "$(nproc)"); do ( while :; do :; done ) & load_pids+=($!); done
    echo "[repeat] load: $(nproc) busy loops" ;;
  build)
    scratch=$(mktemp -d /tmp/slowrank-repeat-build.XXXXXX)
    ( while :; do rm -rf "$scratch/t"; cargo build -q -p slowrank-coordinator --target-dir "$scratch/t" >/dev/null 2>&1; done ) &
    load_pids+=($!)
    echo "[repeat] load: a parallel cargo build in $scratch" ;;
  none) echo "[repeat] load: none added" ;;
  *) echo "repeat-tests: REPEAT_LOAD must be hog, build or none" >&2; exit 2 ;;
esac

# One test at a time inside each binary, as scripts/test.sh runs them.
export RUST_TEST_THREADS=1
declare -A runs fails slowest
failed_logs=()
for t in "${TESTS[@]}"; do
  bin=${t%%:*}; filter=""
  [ "$bin" != "$t" ] && filter=${t#*:}
  runs[$t]=0; fails[$t]=0; slowest[$t]=0
  for i in $(seq "$N"); do
    log="$LOGS/${t//:/_}.$i.log"
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    cargo test -q -p slowrank-tests "${PROFILE_FLAG[@]}" --test "$bin" -- --nocapture $filter >"$log" 2>&1
    rc=$?
    grep -h '^\[fact\]' "$log" | sed "s/^/$t run $i: /" >>"$LOGS/facts.txt"
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    runs[$t]=$((runs[$t] + 1))
    if [ $rc -ne 0 ]; then
      fails[$t]=$((fails[$t] + 1)); failed_logs+=("$log")
      echo "[repeat] $t run $i/$N FAILED after ${dt%.*} s ($log)"
    else
      echo "[repeat] $t run $i/$N ok (${dt%.*} s)"
      rm -f "$log"
    fi
    slowest[$t]=$(awk -v a="$dt" -v b="${slowest[$t]}" 'BEGIN { print (a > b ? a : b) }')
  done
done
stop_load

echo
printf '| %-32s | %4s | %8s | %11s |\n' test runs failures "slowest (s)"
printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..34})" "------" "----------" "-------------"
total_fail=0
for t in "${TESTS[@]}"; do
  printf '| %-32s | %4d | %8d | %11.1f |\n' "$t" "${runs[$t]}" "${fails[$t]}" "${slowest[$t]}"
  total_fail=$((total_fail + fails[$t]))
done
echo "load: $LOAD; profile: ${REPEAT_PROFILE:-debug}; $(date -u +%FT%TZ); commit $(git rev-parse --short HEAD 2>/dev/null)"
if [ -s "$LOGS/facts.txt" ]; then
  echo "facts ($LOGS/facts.txt):"; sed 's/^/  /' "$LOGS/facts.txt"
fi
if [ ${#failed_logs[@]} -gt 0 ]; then
  echo "logs of failed runs:"; printf '  %s\n' "${failed_logs[@]}"
fi
[ $total_fail -eq 0 ]

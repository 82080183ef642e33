#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 90), seeded from real
# encodings and the shipped scenario specs. Not part of CI.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`). Crashes land in
# fuzz/artifacts/TARGET/; replay one with
#   cd fuzz && cargo +nightly fuzz run -a TARGET artifacts/TARGET/crash-...
set -euo pipefail
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
cd "$(dirname "$0")/.."

secs=${1:-90}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(batch_decode batch_mutate analyzer_ingest spec_parse)

# Seeds: real batch encodings, and the scenario specs.
cargo run -q -p slowrank-coordinator --example fuzz_seeds -- fuzz/corpus/batch_decode
mkdir -p fuzz/corpus/spec_parse
cp scenarios/specs/*.toml fuzz/corpus/spec_parse/

cd fuzz
for t in "${targets[@]}"; do
    extra=()
    [ "$t" = spec_parse ] && extra=(-dict=spec.dict)
    echo "=== $t for ${secs}s"
    # -a: debug assertions, so arithmetic overflow is a crash too.
    cargo +nightly fuzz run -a "$t" -- -max_total_time="$secs" -print_final_stats=1 "${extra[@]}" 2>&1 |
        grep -E '^(#[0-9]+ +DONE|Done|stat::|==[0-9]+== ?ERROR|SUMMARY|thread .* panicked|artifact_prefix|Test unit written)' || true
done
crashes=$(find artifacts -type f 2>/dev/null)
if [ -n "$crashes" ]; then
    echo "crashes:"; echo "$crashes"; exit 1
fi
echo "no crashes"

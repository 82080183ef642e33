#!/bin/sh
# Builds the scenario trainer with frame pointers into target/fp, apart from
# the workspace build (rustflags change every crate's hash, so sharing the
# target dir would rebuild the whole workspace each time). Stack sampling
# (docs/stacks.md) walks frame pointers; the workspace's default build omits them.
set -e
cd "$(dirname "$0")/.."
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
target="${CARGO_TARGET_DIR:-target}/fp"
CARGO_ENCODED_RUSTFLAGS=-Cforce-frame-pointers=yes exec "${CARGO:-cargo}" build -q \
    -p slowrank-scenarios --bin slowrank-trainer --target-dir "$target" "$@"

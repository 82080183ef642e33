#!/usr/bin/env bash
# Installs, only when missing, what building slowrank needs on a fresh machine:
# the nightly toolchain's rust-src (the eBPF crate builds core for bpfel),
# bpf-linker (links the eBPF object; built against the nightly's own LLVM
# because no prebuilt binary is reachable here) and the Debian packages the
# scenarios and tests use. Safe to run again: each step checks first.
set -euo pipefail

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback
command -v rustup >/dev/null || die "rustup not found: install Rust with rustup first (https://rustup.rs)"
command -v cargo >/dev/null || die "cargo not found on PATH"

# 1. nightly + rust-src
if ! rustup toolchain list | grep -q '^nightly'; then
  say "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal || die "cannot install the nightly toolchain"
fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  say "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly || die "cannot add rust-src to nightly"
else
  say "rust-src (nightly): present"
fi

# 2. bpf-linker, linked against the nightly's LLVM
if ! command -v bpf-linker >/dev/null 2>&1; then
  NL="$(rustc +nightly --print sysroot)/lib"
  LLVM_SO=$(ls "$NL" | sed -n 's/^lib\(LLVM-[0-9]*-rust-.*\)\.so$/\1/p' | head -n1)
  [ -n "$LLVM_SO" ] || die "no libLLVM-*-rust-*.so under $NL: cannot link bpf-linker"
  LLVM_MAJOR=$(printf '%s' "$LLVM_SO" | sed -n 's/^LLVM-\([0-9]*\)-.*/\1/p')
  say "building bpf-linker 0.13.0 against $LLVM_SO (about a minute)"
  RUSTFLAGS="-L $NL -l dylib=$LLVM_SO -C link-arg=-Wl,-rpath,$NL" \
    cargo install --locked bpf-linker@0.13.0 --no-default-features \
      --features "llvm-$LLVM_MAJOR,no-llvm-linking" \
    || RUSTFLAGS="-L $NL -l dylib=$LLVM_SO -C link-arg=-Wl,-rpath,$NL" \
    cargo install bpf-linker@0.13.0 --no-default-features \
      --features "llvm-$LLVM_MAJOR,no-llvm-linking" \
    || die "cannot build bpf-linker"
else
  say "bpf-linker: present ($(command -v bpf-linker))"
fi

# 3. Debian packages (iproute2 and util-linux's nsenter for the scenario's
#    hosts as network namespaces, libibverbs-dev for the
#    verbs header the scenario's ABI test checks against, bpftrace for the
#    benchmark baseline). Only installed when missing; root only.
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
command -v bpftrace >/dev/null 2>&1 || need+=(bpftrace)
# prometheus (promtool and the server) and chromium check what users see:
# the /metrics page, the alert rules and the HTML report (tests/tests/ui.rs).
# Installed without their recommends (node exporter, fonts, ...).
lean=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || lean+=(prometheus)
command -v chromium >/dev/null 2>&1 || lean+=(chromium)
if [ $((${#need[@]} + ${#lean[@]})) -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    say "installing Debian packages: ${need[*]} ${lean[*]}"
    apt-get update -qq || die "apt-get update failed"
    if [ ${#need[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
        || die "apt-get install ${need[*]} failed"
    fi
    if [ ${#lean[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null \
        || die "apt-get install ${lean[*]} failed"
    fi
  else
    say "WARNING: not root; cannot install ${need[*]} ${lean[*]} (tests that need them will say so)"
  fi
else
  say "Debian packages: present"
fi
say "done"

//! Empty on purpose: the programs are the `node-agent` binary target, which
//! `node-agent/build.rs` compiles for `bpfel-unknown-none` through aya-build.
#![no_std]

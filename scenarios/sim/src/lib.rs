//! Simulation core shared by the stand-in libraries (`libnccl.so.2`,
//! `libcudart.so.12`, `libibverbs.so.1`, `libmlx5.so.1`) and the scenario
//! harness.
//!
//! Every stand-in links its own copy of this crate, so nothing here relies on
//! process-global statics being shared across libraries: state shared inside
//! one rank process lives in the mmap'd [`control::Control`] block, and state
//! shared across rank processes goes through the [`hub`].

pub mod abi;
pub mod clock;
pub mod control;
pub mod cost;
pub mod env;
pub mod hub;
pub mod model;
pub mod report;
pub mod rng;
pub mod wire;

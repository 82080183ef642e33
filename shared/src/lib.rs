//! Types shared by the slowrank eBPF programs, the node agent and the
//! coordinator. No I/O lives here.
//!
//! Layout follows kunai's split: [`probe`] holds the `#[repr(C)]` records the
//! kernel writes and user space reads (compiled by both, `no_std`); [`wire`]
//! holds the versioned rkyv batch schema agents send to the coordinator
//! (feature `user`).
#![cfg_attr(not(feature = "user"), no_std)]

#[cfg(feature = "user")]
pub mod links;
pub mod probe;
pub mod stack;
#[cfg(feature = "user")]
pub mod wire;

//! Types shared by the slowrank eBPF programs, the node agent and the
//! coordinator. Apart from the clock socket below, no I/O lives here.
//!
//! Layout follows kunai's split: [`probe`] holds the `#[repr(C)]` records the
//! kernel writes and user space reads (compiled by both, `no_std`); [`wire`]
//! holds the versioned rkyv batch schema agents send to the coordinator
//! (feature `user`), and [`clock_udp`] the kernel-stamped clock probe socket
//! both ends use (its only I/O).
#![cfg_attr(not(feature = "user"), no_std)]

#[cfg(feature = "user")]
pub mod clock;
#[cfg(feature = "user")]
pub mod clock_udp;
#[cfg(feature = "user")]
pub mod links;
pub mod maps;
pub mod probe;
pub mod stack;
#[cfg(feature = "user")]
pub mod wire;

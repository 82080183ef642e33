//! The hub: one server per simulated cluster (in the launcher) that every
//! rank process talks to over a Unix-domain socket. It plays the parts a real
//! cluster spreads over the network:
//!
//! - **exchange**: an all-gather barrier keyed by a string. `n` members each
//!   send their payload under `idx`; when the last arrives, every member gets
//!   all payloads in `idx` order. NCCL bootstrap, communicator splits, QP
//!   number exchange and every collective's "all members' GPUs arrived"
//!   rendezvous are exchanges. The replies go out starting at a different
//!   member each time: in a fixed order the last member of every collective
//!   would be woken last, a straggler the harness made on a loaded machine.
//! - **store**: a key-value store with blocking get, like torch's TCPStore,
//!   used by the trainer to hand out `ncclUniqueId`s.
//! - **report**: one-way events (steps, fault onsets) for the launcher.
//!
//! Path sockets work across network namespaces, so hosts in namespaces can
//! reach the same hub.

pub mod client;
pub mod protocol;
pub mod server;

pub use client::{ExchangeReq, HubClient};
pub use server::{Hub, PendingExchange};

/// Why a hub operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("hub socket {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("hub I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("hub closed the connection")]
    Closed,
    #[error("bad hub message: {0}")]
    Protocol(String),
    #[error("hub refused the request: {0}")]
    Refused(String),
    #[error("{0} is not set: not running under the scenario launcher")]
    NoEnv(&'static str),
}

//! The network side: bytes in, identity, admission. Agents connect over
//! QUIC ([`ingest`]) with a token or a certificate ([`tls`]); [`admission`]
//! bounds what an unauthenticated peer may hold, [`ownership`] who may speak
//! for a rank, [`validate`] checks records semantically. The control stream
//! ([`control`]) and the UDP clock port ([`clockport`]) carry clock probes and
//! deep-probe windows; [`metrics_http`] serves `/metrics` and the live page.
//!
//! In: QUIC streams and datagrams. Out: [`events::IngestEvent`]s (an agent
//! came or went, a batch with its pending answer, a clock sample) for the
//! runtime ([`crate::serve`]) to hand to the analyzer.

pub mod admission;
pub mod clockport;
pub mod control;
pub mod events;
pub mod ingest;
pub mod metrics_http;
pub mod ownership;
pub mod tls;

//! The slowrank coordinator as a library: ingest → clock → join → graph →
//! verdict → report. The `slowrank` binary wires these together.
pub mod ingest;
pub mod tls;

//! Hub wire format: one JSON object per line, both directions.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::report::Report;

/// Client → hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Join the all-gather `key` of `n` members as member `idx`.
    Exchange {
        id: u64,
        key: String,
        n: u32,
        idx: u32,
        payload: Value,
    },
    /// Store `value` under `key` (no reply).
    Set { key: String, value: String },
    /// Get `key`, waiting until it is set.
    Get { id: u64, key: String },
    /// One-way event for the launcher (no reply).
    Report { report: Report },
}

/// Hub → client, answering the request with the same `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub id: u64,
    /// Exchange: every member's payload in `idx` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub payloads: Vec<Value>,
    /// Get: the stored value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Set when the request was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

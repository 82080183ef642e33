//! What the join hands on: one collective instance and its members as
//! joined, and what a hang says of the members that never came.

use std::sync::Arc;

use slowrank_shared::wire::{CollOp, CollectiveRecord};

use crate::clock::CoordNs;

/// Names one instance inside a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum InstanceKey {
    /// A collective: the sequence number shared by every member.
    Coll(u64),
    /// The `ordinal`-th point-to-point operation between positions `lo < hi`.
    P2p { lo: u32, hi: u32, ordinal: u64 },
}

impl InstanceKey {
    /// The sequence number shown to people (the p2p ordinal for p2p).
    pub fn display_seq(&self) -> u64 {
        match self {
            Self::Coll(s) => *s,
            Self::P2p { ordinal, .. } => *ordinal,
        }
    }
}

/// Lower-case NCCL-style name of an operation.
pub fn op_name(op: CollOp) -> &'static str {
    match op {
        CollOp::AllReduce => "all_reduce",
        CollOp::AllGather => "all_gather",
        CollOp::ReduceScatter => "reduce_scatter",
        CollOp::Broadcast => "broadcast",
        CollOp::Reduce => "reduce",
        CollOp::AllToAll => "all_to_all",
        CollOp::Send => "send",
        CollOp::Recv => "recv",
    }
}

fn ser_op<S: serde::Serializer>(op: &CollOp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(op_name(*op))
}

/// One member's record of an instance.
#[derive(Debug, Clone)]
pub struct Member {
    pub rank: u32,
    pub rank_in_comm: u32,
    pub host: Arc<str>,
    pub rec: CollectiveRecord,
}

/// All members' records of one instance.
#[derive(Debug, Clone)]
pub struct JoinedInstance {
    pub comm_id: u64,
    pub key: InstanceKey,
    /// Size of the communicator (2 members for p2p instances regardless).
    pub comm_nranks: u32,
    pub op: CollOp,
    pub bytes: u64,
    pub members: Vec<Member>,
}

impl JoinedInstance {
    pub fn is_p2p(&self) -> bool {
        matches!(self.key, InstanceKey::P2p { .. })
    }
}

/// The rank of a [`MissingMember`] no agent ever announced (only its
/// position in the communicator is known).
pub const UNKNOWN_RANK: u32 = u32::MAX;

/// A member that never arrived at a hung instance.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MissingMember {
    pub rank: u32,
    pub rank_in_comm: u32,
    pub host: String,
    /// Last sequence number this member issued on the communicator.
    pub last_seq_seen: Option<u64>,
    /// Last collective instance on this communicator it completed with everyone.
    pub last_completed_seq: Option<u64>,
}

/// An instance some members entered and others never did, past the timeout.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HangCandidate {
    pub comm_id: u64,
    pub key: InstanceKey,
    #[serde(serialize_with = "ser_op")]
    pub op: CollOp,
    pub comm_nranks: u32,
    /// Coordinator time the first member entered.
    pub entered_at: CoordNs,
    pub first_host: String,
    pub first_agent_ns: u64,
    pub present_ranks: Vec<u32>,
    pub missing: Vec<MissingMember>,
    /// Set when more than [`HANG_LIST_MAX`] members are absent: all of them
    /// as a count with rank ranges (`missing` names at most
    /// [`super::MAX_NAMED_MISSING`]; reports and alerts list [`HANG_LIST_MAX`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<MissingSummary>,
}

/// Absent members listed one by one in reports and alerts at most; past
/// this a hang is said as a count with rank ranges. Real hangs miss a few
/// ranks (a dead host: 8); a thousand-line list helps nobody, and a
/// 2^20-rank one made a 206 MB report.
pub const HANG_LIST_MAX: usize = 64;

/// Rank ranges in one [`MissingSummary`] at most: a hang missing every
/// other rank must not become a range per rank; the rest is counted.
pub const MAX_MISSING_RANGES: usize = 256;

/// A hang's absent members in short.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MissingSummary {
    /// Absent members in all.
    pub count: u64,
    /// Their global ranks as inclusive `[first, last]` ranges, lowest
    /// first, at most [`MAX_MISSING_RANGES`].
    pub ranges: Vec<[u32; 2]>,
    /// Absent members in none of the ranges: no agent ever announced them
    /// (their rank is unknown), or they are past the range cap.
    pub unlisted: u64,
}

impl MissingSummary {
    /// `ranks` are the absent members' global ranks where known; `count`
    /// the absent members in all.
    pub fn new(count: u64, mut ranks: Vec<u32>) -> Self {
        ranks.sort_unstable();
        ranks.dedup();
        let mut ranges: Vec<[u32; 2]> = Vec::new();
        let mut listed = 0u64;
        for r in ranks {
            let full = ranges.len() == MAX_MISSING_RANGES;
            match ranges.last_mut() {
                Some(last) if last[1].checked_add(1) == Some(r) => last[1] = r,
                _ if full => break,
                _ => ranges.push([r, r]),
            }
            listed += 1;
        }
        Self {
            count,
            ranges,
            unlisted: count.saturating_sub(listed),
        }
    }

    /// "1048575 members, ranks 1-1048575" (and what is not listed).
    pub fn describe(&self) -> String {
        let ranges: Vec<String> = self
            .ranges
            .iter()
            .map(|[a, b]| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        let mut s = format!("{} members", self.count);
        if !ranges.is_empty() {
            s += &format!(", ranks {}", ranges.join(", "));
        }
        if self.unlisted > 0 {
            s += &format!(
                " ({} not in the ranges: never announced by an agent, or past {MAX_MISSING_RANGES} ranges)",
                self.unlisted
            );
        }
        s
    }
}

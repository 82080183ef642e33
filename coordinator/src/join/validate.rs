//! Semantic checks on records that passed the wire's structural validation.
//! A record that is impossible (time runs backwards, a peer outside the
//! communicator, a timestamp after the batch was cut) is rejected with a
//! reason and counted; it never reaches the reasoning.

use slowrank_shared::wire::{CollOp, CollectiveRecord, CommRecord, LinkRecord, RankInterval};

/// Why one record (or, for the batch-level variants, a whole batch) was
/// refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("collective on communicator {comm_id:#x}, which no member announced")]
    UnknownCommunicator { comm_id: u64 },
    #[error("rank {rank} is not a member of communicator {comm_id:#x}")]
    NotAMember { rank: u32, comm_id: u64 },
    #[error("communicator {comm_id:#x} announced with {got} ranks, earlier with {had}")]
    CommSizeConflict { comm_id: u64, had: u32, got: u32 },
    #[error("rank_in_comm {rank_in_comm} outside a communicator of {nranks}")]
    RankInCommOutOfRange { rank_in_comm: u32, nranks: u32 },
    #[error(transparent)]
    Split(#[from] crate::join::splits::SplitError),
    #[error("communicator {comm_id:#x} position {rank_in_comm} claimed by ranks {had} and {got}")]
    PositionConflict {
        comm_id: u64,
        rank_in_comm: u32,
        had: u32,
        got: u32,
    },
    #[error("rank {rank} at or above world size {world_size}")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error("communicator of {0} ranks exceeds the supported size")]
    CommTooLarge(u32),
    #[error("point-to-point peer {peer} is invalid in a communicator of {nranks}")]
    BadPeer { peer: i32, nranks: u32 },
    #[error("sequence {seq} on communicator {comm_id:#x} went backwards (rank {rank} already sent {last})")]
    SequenceBackwards {
        comm_id: u64,
        rank: u32,
        seq: u64,
        last: u64,
    },
    #[error("record for an instance already closed (communicator {comm_id:#x}, sequence {seq})")]
    Late { comm_id: u64, seq: u64 },
    #[error("a second, different record for one member of an instance")]
    Conflict,
    #[error("{field} = {value} ns is after the batch was cut ({batch_ns} ns)")]
    TimeInFuture {
        field: &'static str,
        value: u64,
        batch_ns: u64,
    },
    #[error("{later} precedes {earlier}: time runs backwards in one record")]
    TimeOrder {
        earlier: &'static str,
        later: &'static str,
    },
    #[error("{0} is zero")]
    MissingTimestamp(&'static str),
    #[error("too many communicators (cap {0})")]
    TooManyCommunicators(usize),
    #[error("rank {rank} is already a member of {cap} communicators, the most one rank may be")]
    TooManyCommunicatorsForRank { rank: u32, cap: u32 },
    #[error("world of {0} ranks exceeds the supported size")]
    WorldTooLarge(u32),
    #[error("world size {got} conflicts with the {had} ranks already announced")]
    WorldSizeConflict { had: u32, got: u32 },
    #[error("communicator {comm_id:#x} of {nranks} ranks is larger than the world ({world_size})")]
    CommLargerThanWorld {
        comm_id: u64,
        nranks: u32,
        world_size: u32,
    },
    #[error("record for rank {rank} sent by host {host:?}, but the rank runs on {owner:?}")]
    WrongHost {
        rank: u32,
        host: String,
        owner: String,
    },
    #[error("exit of pid {pid} for rank {rank}, whose process is pid {current}")]
    ExitOfOtherProcess { rank: u32, pid: u32, current: u32 },
    #[error("batch from agent {agent_id:?} claims host {got:?}, but the agent runs on {had:?}")]
    HostChanged {
        agent_id: String,
        had: String,
        got: String,
    },
    #[error("batch cut at {batch_ns} ns (agent clock) lies {ahead_ns} ns after it arrived (host clock bound ±{bound_ns} ns)")]
    BatchInFuture {
        batch_ns: u64,
        ahead_ns: u64,
        bound_ns: u64,
    },
    #[error("batch number {got} jumps more than {MAX_SEQ_GAP} past the agent's last ({last})")]
    SeqJump { last: u64, got: u64 },
}

/// Largest forward jump of an agent's batch numbers taken as batches lost
/// (its spool dropping them): at an agent's ≈ 10 batches a second, 2^24 is
/// 19 days of them. A larger jump is a corrupt or hostile number, and
/// believing it would mark every later batch a duplicate.
pub const MAX_SEQ_GAP: u64 = 1 << 24;

/// Largest growth of an agent's drop counters (ring buffer, spool) between
/// two of its batches: 2^40 is 30 hours of drops at 10 million a second,
/// more than any ring buffer sees; a larger step is a corrupt or hostile
/// number and is not added to the job's sums.
pub const MAX_COUNTER_STEP: u64 = 1 << 40;

impl RecordError {
    /// Stable label for counters and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::UnknownCommunicator { .. } => "unknown_communicator",
            Self::NotAMember { .. } => "not_a_member",
            Self::CommSizeConflict { .. } => "comm_size_conflict",
            Self::RankInCommOutOfRange { .. } => "rank_in_comm_out_of_range",
            Self::Split(crate::join::splits::SplitError::UnknownParent { .. }) => {
                "split_unknown_parent"
            }
            Self::Split(crate::join::splits::SplitError::NotInParent { .. }) => {
                "split_not_in_parent"
            }
            Self::Split(crate::join::splits::SplitError::Conflict { .. }) => "split_conflict",
            Self::PositionConflict { .. } => "position_conflict",
            Self::RankOutOfRange { .. } => "rank_out_of_range",
            Self::CommTooLarge(_) => "comm_too_large",
            Self::BadPeer { .. } => "bad_peer",
            Self::SequenceBackwards { .. } => "sequence_backwards",
            Self::Late { .. } => "late",
            Self::Conflict => "conflicting_duplicate",
            Self::TimeInFuture { .. } => "time_in_future",
            Self::TimeOrder { .. } => "time_order",
            Self::MissingTimestamp(_) => "missing_timestamp",
            Self::TooManyCommunicators(_) => "too_many_communicators",
            Self::TooManyCommunicatorsForRank { .. } => "too_many_communicators_for_rank",
            Self::WorldTooLarge(_) => "world_too_large",
            Self::WorldSizeConflict { .. } => "world_size_conflict",
            Self::CommLargerThanWorld { .. } => "comm_larger_than_world",
            Self::WrongHost { .. } => "wrong_host",
            Self::SeqJump { .. } => "seq_jump",
            Self::ExitOfOtherProcess { .. } => "exit_of_other_process",
            Self::HostChanged { .. } => "host_changed",
            Self::BatchInFuture { .. } => "batch_in_future",
        }
    }
}

/// Largest communicator accepted (bounds per-instance memory).
pub const MAX_COMM_RANKS: u32 = 1 << 20;

/// A time more than `slack` after the batch was cut is impossible.
pub fn not_future(
    field: &'static str,
    value: u64,
    batch_ns: u64,
    slack: u64,
) -> Result<(), RecordError> {
    if value > batch_ns.saturating_add(slack) {
        return Err(RecordError::TimeInFuture {
            field,
            value,
            batch_ns,
        });
    }
    Ok(())
}

/// Checks one collective record against the clock of the batch carrying it.
/// `slack_ns` tolerates records folded a little after the batch timestamp.
pub fn check_collective(
    r: &CollectiveRecord,
    batch_ns: u64,
    slack_ns: u64,
) -> Result<(), RecordError> {
    if r.host_entry_ns == 0 {
        return Err(RecordError::MissingTimestamp("host_entry_ns"));
    }
    if r.host_exit_ns != 0 && r.host_exit_ns < r.host_entry_ns {
        return Err(RecordError::TimeOrder {
            earlier: "host_entry_ns",
            later: "host_exit_ns",
        });
    }
    // The GPU cannot reach a collective the host has not enqueued yet.
    if r.gpu_arrive_ns != 0 && r.gpu_arrive_ns < r.host_entry_ns {
        return Err(RecordError::TimeOrder {
            earlier: "host_entry_ns",
            later: "gpu_arrive_ns",
        });
    }
    if r.gpu_done_ns != 0 {
        let floor = r.gpu_arrive_ns.max(r.host_entry_ns);
        if r.gpu_done_ns < floor {
            return Err(RecordError::TimeOrder {
                earlier: if r.gpu_arrive_ns != 0 {
                    "gpu_arrive_ns"
                } else {
                    "host_entry_ns"
                },
                later: "gpu_done_ns",
            });
        }
    }
    for (field, v) in [
        ("host_entry_ns", r.host_entry_ns),
        ("host_exit_ns", r.host_exit_ns),
        ("gpu_arrive_ns", r.gpu_arrive_ns),
        ("gpu_done_ns", r.gpu_done_ns),
    ] {
        not_future(field, v, batch_ns, slack_ns)?;
    }
    if matches!(r.op, CollOp::Send | CollOp::Recv) && r.peer < 0 {
        return Err(RecordError::BadPeer {
            peer: r.peer,
            nranks: 0,
        });
    }
    Ok(())
}

pub fn check_comm(c: &CommRecord) -> Result<(), RecordError> {
    if c.nranks == 0 || c.nranks > MAX_COMM_RANKS {
        return Err(RecordError::CommTooLarge(c.nranks));
    }
    if c.rank_in_comm >= c.nranks {
        return Err(RecordError::RankInCommOutOfRange {
            rank_in_comm: c.rank_in_comm,
            nranks: c.nranks,
        });
    }
    Ok(())
}

pub fn check_interval(i: &RankInterval, batch_ns: u64, slack_ns: u64) -> Result<(), RecordError> {
    if i.start_ns == 0 {
        return Err(RecordError::MissingTimestamp("start_ns"));
    }
    if i.end_ns < i.start_ns {
        return Err(RecordError::TimeOrder {
            earlier: "start_ns",
            later: "end_ns",
        });
    }
    not_future("end_ns", i.end_ns, batch_ns, slack_ns)
}

pub fn check_link(l: &LinkRecord, batch_ns: u64, slack_ns: u64) -> Result<(), RecordError> {
    if l.start_ns == 0 {
        return Err(RecordError::MissingTimestamp("start_ns"));
    }
    if l.end_ns < l.start_ns {
        return Err(RecordError::TimeOrder {
            earlier: "start_ns",
            later: "end_ns",
        });
    }
    not_future("end_ns", l.end_ns, batch_ns, slack_ns)
}

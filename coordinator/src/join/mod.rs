//! **Stage: join.** In: validated records on the coordinator clock. Out:
//! joined instances (every member's arrival and exit), expired and hung
//! instances. [`validate`] checks records semantically; [`park`] holds records whose membership has not arrived yet;
//! [`splits`] works out split communicators no agent could read. State is
//! partitioned by communicator: an instance never spans two.
//!
//! Collective join: gathers the records of one instance from all its members.
//!
//! A collective instance is `(comm_id, seq)` with `nranks` members. A
//! point-to-point operation is matched differently: a member's `seq` counts
//! every operation it issued on the communicator, so the sender's and the
//! receiver's numbers differ; instead the k-th operation between two members
//! (in either direction, in issue order on each side) is one instance
//! `(comm_id, lo, hi, k)` with two members.
//!
//! Records arrive late, out of order or never. Open instances are capped per
//! communicator (the oldest is evicted and counted); an instance some members
//! entered while others have not been heard from on that communicator since,
//! past a timeout, becomes a hang candidate naming the missing ranks and the
//! last instance each completed.

pub mod park;
pub mod splits;
pub mod validate;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use slowrank_shared::wire::{CollOp, CollectiveRecord, CommRecord};

use crate::clock::CoordNs;
use crate::join::validate::RecordError;

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
    /// [`MAX_NAMED_MISSING`]; reports and alerts list [`HANG_LIST_MAX`]).
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

/// Open instances per communicator at most, however small it is.
pub const MAX_OPEN_INSTANCES: usize = 16_384;

/// Open instances across all communicators at most. A host cut off for
/// seconds leaves open the instances of the few dozen communicators it is
/// in (≈ 1,000 each for a fast 8-rank group, 256 for a 4,096-rank one):
/// 65,536 is several times that, and at a few hundred bytes plus the
/// members present each, a bounded share of the coordinator's memory. Past
/// it the communicator holding the most open instances sheds its oldest
/// (counted as evicted): one agent opening instances on thousands of
/// communicators that never complete cannot grow the join without bound.
pub const MAX_OPEN_TOTAL: usize = 65_536;

/// Communicators one rank may be a member of at most. A real rank is in a
/// few dozen (one per process group and split, again after each elastic
/// restart); a token holder announcing fresh 4,096-rank communicators by
/// the thousand for one rank held a few KiB each up to `max_comms`
/// (65,536: ≈ 900 MiB, BENCHMARKS.md 2026-11-27). Past it the rank's new
/// memberships are refused (`too_many_communicators_for_rank`).
pub const MAX_COMMS_PER_RANK: u32 = 1_024;

/// Hangs kept across all communicators (to resolve them when the absent
/// members turn up late) at most. Each keeps up to [`MAX_NAMED_MISSING`]
/// absent members (≈ 256 KiB at the cap), and only the earliest 4 of a
/// communicator are kept: a token holder opening instances on thousands
/// of 4,096-rank communicators made every one a kept hang (≈ 4 GiB once
/// they went stale). 256 is what the analyzer keeps too; a hang past it is
/// still reported and counted, it just cannot resolve.
pub const MAX_KEPT_HANGS: usize = 256;

/// Absent members named in one hang at most (the rest are counted in
/// [`JoinCounters::missing_unlisted`]): a hang of a 2^20-rank communicator
/// must not become a million-entry list rewritten into every report.
pub const MAX_NAMED_MISSING: usize = 4_096;

/// Closed instance keys remembered across all communicators at most (≈ 64
/// MiB): each communicator keeps `closed_memory` keys, or its share of
/// this when there are many, but never fewer than [`MIN_CLOSED_PER_COMM`].
/// Otherwise 65,536 communicators × 16,384 keys could be made to hold
/// tens of GB by instances opened only to be evicted.
pub const MAX_CLOSED_TOTAL: usize = 1 << 20;
/// Closed keys a communicator keeps however many there are: enough to tell
/// a late record from a new instance over a few seconds of collectives.
pub const MIN_CLOSED_PER_COMM: usize = 256;

#[derive(Debug, Clone, serde::Serialize)]
pub struct JoinConfig {
    /// Open instances kept per communicator before the oldest is evicted,
    /// at least (smaller communicators get more, see `open_records_per_comm`).
    pub max_open_per_comm: usize,
    /// Member slots (~130 B each) of open instances one communicator may
    /// hold: a host cut off for seconds leaves every instance it belongs to
    /// open, and an 8-rank data-parallel group issuing 100 collectives/s
    /// needs ~1,000 open instances to ride out 10 s, while a 4,096-rank
    /// group gets 256 (~140 MB; its members' batches arrive over a few
    /// hundred ms when the coordinator is busy). At most
    /// [`MAX_OPEN_INSTANCES`] per communicator either way.
    pub open_records_per_comm: usize,
    /// Communicators tracked at most.
    pub max_comms: usize,
    /// Closed instance keys remembered per communicator (to tell late from new).
    pub closed_memory: usize,
    /// An incomplete instance older than this becomes a hang candidate (ns).
    pub hang_timeout_ns: i64,
    /// A member whose agent's data is not yet known to be current past the
    /// timeout is given this long (since the instance began) before it is
    /// named missing anyway: its agent stopped reporting (ns).
    pub hang_stale_ns: i64,
}

impl Default for JoinConfig {
    fn default() -> Self {
        Self {
            max_open_per_comm: 64,
            open_records_per_comm: 1_048_576,
            max_comms: 1 << 16,
            closed_memory: 16_384,
            hang_timeout_ns: 3_000_000_000,
            hang_stale_ns: 30_000_000_000,
        }
    }
}

/// What became of one offered record.
#[derive(Debug)]
pub enum Offer {
    /// Stored; the instance still waits for members.
    Pending,
    /// The record completed its instance.
    Completed(JoinedInstance),
    /// Same record again (a resend): dropped.
    Duplicate,
    /// A later copy filled GPU-side fields the first copy lacked.
    Merged,
    /// A hang candidate's missing member finally arrived; if `resolved`, no
    /// member is missing any more, and `completed` is the instance joined
    /// after all: a wait longer than the hang timeout (a 46 s pipeline
    /// step whose first stage waits 23 s for the last) is data, not loss.
    HangProgress {
        comm_id: u64,
        key: InstanceKey,
        resolved: bool,
        completed: Option<JoinedInstance>,
    },
}

/// What the periodic expiry found.
#[derive(Debug)]
pub enum Expired {
    Hang(HangCandidate),
    /// Incomplete, but every missing member was heard from later: records
    /// were lost, nothing hung.
    Incomplete {
        comm_id: u64,
        key: InstanceKey,
    },
}

#[derive(Debug, Clone)]
struct Slot {
    rank: u32,
    host: Arc<str>,
}

#[derive(Debug)]
struct Open {
    born: u64,
    op: CollOp,
    bytes: u64,
    /// Positions of the members (comm positions; two entries for p2p).
    positions: Vec<u32>,
    /// Members present, by index (comm position; 0 or 1 for p2p): only
    /// what arrived is stored, never a table of the claimed size.
    records: HashMap<u32, Member>,
    /// Members the instance needs (the communicator's size; 2 for p2p).
    expected: usize,
    first_host: Arc<str>,
    first_agent_ns: u64,
    /// Coordinator time of the first entry at the last expiry pass.
    entered_hint: Option<CoordNs>,
}

/// Member positions one expiry pass examines at most; instances due past
/// that wait for the next pass (oldest first each time). Without it, the
/// tick at which 50,000 open instances of 4,096-rank communicators all
/// turned stale walked 200 million positions and stalled ingest for
/// seconds.
const MAX_EXPIRE_WORK: usize = 1 << 20;

/// How much a host's clock mapping may move between two expiry passes and
/// still let the last pass's entry time rule an instance out: corrections
/// are µs to a few ms; 50 ms is far beyond them and far below the timeout.
const HINT_MARGIN_NS: CoordNs = 50_000_000;

#[derive(Debug)]
struct CommState {
    nranks: u32,
    slots: HashMap<u32, Slot>,
    by_rank: HashMap<u32, u32>,
    last_seq: HashMap<u32, u64>,
    last_completed: HashMap<u32, u64>,
    p2p_ordinal: HashMap<(u32, u32), u64>,
    open: HashMap<InstanceKey, Open>,
    born: u64,
    closed: HashSet<InstanceKey>,
    closed_order: VecDeque<InstanceKey>,
    hangs: HashMap<InstanceKey, HangCandidate>,
    /// The members present when each kept hang candidate timed out, so the
    /// instance still joins if the missing ones arrive (one per entry of
    /// `hangs`, so as bounded).
    stalled: HashMap<InstanceKey, Open>,
}

impl CommState {
    fn new(nranks: u32) -> Self {
        Self {
            nranks,
            slots: HashMap::new(),
            by_rank: HashMap::new(),
            last_seq: HashMap::new(),
            last_completed: HashMap::new(),
            p2p_ordinal: HashMap::new(),
            open: HashMap::new(),
            born: 0,
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            hangs: HashMap::new(),
            stalled: HashMap::new(),
        }
    }

    fn close(&mut self, key: InstanceKey, cap: usize) {
        if self.closed.insert(key) {
            self.closed_order.push_back(key);
            while self.closed_order.len() > cap {
                if let Some(old) = self.closed_order.pop_front() {
                    self.closed.remove(&old);
                }
            }
        }
    }
}

/// Membership of one communicator, for the stages after the join.
#[derive(Debug, Clone, PartialEq)]
pub struct CommInfo {
    pub comm_id: u64,
    pub nranks: u32,
    /// Global ranks of the members known so far, by position.
    pub ranks: Vec<Option<u32>>,
}

/// Counters of the join.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct JoinCounters {
    pub completed: u64,
    pub evicted: u64,
    pub incomplete: u64,
    pub hangs: u64,
    pub duplicates: u64,
    pub merged: u64,
    /// Absent members of hangs beyond [`MAX_NAMED_MISSING`], not listed.
    pub missing_unlisted: u64,
}

/// The join of every communicator; safe to call from many ingest tasks.
#[derive(Debug)]
pub struct Joiner {
    cfg: JoinConfig,
    comms: DashMap<u64, CommState>,
    counters: std::sync::Mutex<JoinCounters>,
    /// Open instances across communicators (kept in step with `open`).
    open_total: AtomicUsize,
    /// Communicators tracked (kept in step with `comms`; read while a
    /// shard of it is locked, where `comms.len()` would deadlock).
    comm_count: AtomicUsize,
    /// Rank → communicators it is a member of ([`MAX_COMMS_PER_RANK`]).
    memberships: DashMap<u32, u32>,
}

impl Joiner {
    pub fn new(cfg: JoinConfig) -> Self {
        Self {
            cfg,
            comms: DashMap::new(),
            counters: std::sync::Mutex::new(JoinCounters::default()),
            open_total: AtomicUsize::new(0),
            comm_count: AtomicUsize::new(0),
            memberships: DashMap::new(),
        }
    }

    fn bump(&self, f: impl FnOnce(&mut JoinCounters)) {
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c);
    }

    /// Open instances a communicator of `nranks` members may hold.
    fn open_cap(&self, nranks: u32) -> usize {
        (self.cfg.open_records_per_comm / nranks.max(1) as usize)
            .min(MAX_OPEN_INSTANCES)
            .max(self.cfg.max_open_per_comm)
    }

    pub fn counters(&self) -> JoinCounters {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one member's creation of a communicator.
    pub fn register_comm(&self, host: &Arc<str>, c: &CommRecord) -> Result<(), RecordError> {
        crate::join::validate::check_comm(c)?;
        let member = self
            .comms
            .get(&c.comm_id)
            .is_some_and(|st| st.by_rank.contains_key(&c.rank));
        if !member
            && self
                .memberships
                .get(&c.rank)
                .is_some_and(|n| *n >= MAX_COMMS_PER_RANK)
        {
            return Err(RecordError::TooManyCommunicatorsForRank {
                rank: c.rank,
                cap: MAX_COMMS_PER_RANK,
            });
        }
        if !self.comms.contains_key(&c.comm_id) && self.comms.len() >= self.cfg.max_comms {
            return Err(RecordError::TooManyCommunicators(self.cfg.max_comms));
        }
        let mut st = self.comms.entry(c.comm_id).or_insert_with(|| {
            self.comm_count.fetch_add(1, Ordering::Relaxed);
            CommState::new(c.nranks)
        });
        if st.nranks != c.nranks {
            return Err(RecordError::CommSizeConflict {
                comm_id: c.comm_id,
                had: st.nranks,
                got: c.nranks,
            });
        }
        if let Some(old) = st.slots.get(&c.rank_in_comm) {
            // A restarted process of the same rank re-creates its communicators.
            if old.rank != c.rank {
                return Err(RecordError::PositionConflict {
                    comm_id: c.comm_id,
                    rank_in_comm: c.rank_in_comm,
                    had: old.rank,
                    got: c.rank,
                });
            }
        }
        st.slots.insert(
            c.rank_in_comm,
            Slot {
                rank: c.rank,
                host: host.clone(),
            },
        );
        if st.by_rank.insert(c.rank, c.rank_in_comm).is_none() {
            *self.memberships.entry(c.rank).or_insert(0) += 1;
        }
        Ok(())
    }

    /// A communicator's size (cheap: no member list is built).
    pub fn comm_nranks(&self, comm_id: u64) -> Option<u32> {
        self.comms.get(&comm_id).map(|st| st.nranks)
    }

    pub fn comm_info(&self, comm_id: u64) -> Option<CommInfo> {
        self.comms.get(&comm_id).map(|st| CommInfo {
            comm_id,
            nranks: st.nranks,
            ranks: (0..st.nranks)
                .map(|p| st.slots.get(&p).map(|s| s.rank))
                .collect(),
        })
    }

    /// Open instances over all communicators (for memory accounting).
    pub fn open_instances(&self) -> usize {
        self.comms.iter().map(|c| c.open.len()).sum()
    }

    /// Offers one validated record.
    fn offer_one(&self, host: &Arc<str>, rec: CollectiveRecord) -> Result<Offer, RecordError> {
        let comm_id = rec.comm_id;
        let mut st = self
            .comms
            .get_mut(&comm_id)
            .ok_or(RecordError::UnknownCommunicator { comm_id })?;
        let st = &mut *st;
        let pos = *st.by_rank.get(&rec.rank).ok_or(RecordError::NotAMember {
            rank: rec.rank,
            comm_id,
        })?;
        let p2p = matches!(rec.op, CollOp::Send | CollOp::Recv);
        if p2p && (rec.peer < 0 || rec.peer as u32 >= st.nranks || rec.peer as u32 == pos) {
            return Err(RecordError::BadPeer {
                peer: rec.peer,
                nranks: st.nranks,
            });
        }
        let last = st.last_seq.get(&pos).copied();
        let repeat = last.is_some_and(|l| rec.seq <= l);
        if repeat {
            // Only a collective can be matched again by its sequence number.
            let key = InstanceKey::Coll(rec.seq);
            if !p2p {
                if let Some(open) = st.open.get_mut(&key) {
                    let idx = pos as usize;
                    match open.records.get_mut(&(idx as u32)) {
                        Some(m) if m.rec == rec => {
                            self.bump(|c| c.duplicates += 1);
                            return Ok(Offer::Duplicate);
                        }
                        Some(m) if m.rec.host_entry_ns == rec.host_entry_ns => {
                            // A later fold may carry the GPU-side times.
                            if m.rec.gpu_arrive_ns == 0 {
                                m.rec.gpu_arrive_ns = rec.gpu_arrive_ns;
                            }
                            if m.rec.gpu_done_ns == 0 {
                                m.rec.gpu_done_ns = rec.gpu_done_ns;
                            }
                            self.bump(|c| c.merged += 1);
                            return Ok(Offer::Merged);
                        }
                        Some(_) => return Err(RecordError::Conflict),
                        None => {} // out of order within the rank: accept below
                    }
                } else {
                    return Err(RecordError::SequenceBackwards {
                        comm_id,
                        rank: rec.rank,
                        seq: rec.seq,
                        last: last.unwrap_or(0),
                    });
                }
            } else {
                return Err(RecordError::SequenceBackwards {
                    comm_id,
                    rank: rec.rank,
                    seq: rec.seq,
                    last: last.unwrap_or(0),
                });
            }
        } else {
            st.last_seq.insert(pos, rec.seq);
        }
        let (key, positions) = if p2p {
            let peer = rec.peer as u32;
            let ord = st.p2p_ordinal.entry((pos, peer)).or_insert(0);
            let ordinal = *ord;
            *ord += 1;
            let (lo, hi) = (pos.min(peer), pos.max(peer));
            (InstanceKey::P2p { lo, hi, ordinal }, vec![lo, hi])
        } else {
            (InstanceKey::Coll(rec.seq), Vec::new())
        };
        st.born += 1;
        let born = st.born;

        if st.closed.contains(&key) {
            // The instance timed out without this member.
            if let Some(h) = st.hangs.get_mut(&key) {
                let before = h.missing.len();
                h.missing.retain(|m| m.rank_in_comm != pos);
                // Past the list's bound the count is what says who is still
                // out (unlisted and never-announced members are only in it).
                if let Some(sm) = &mut h.summary {
                    if h.missing.len() < before || sm.count > h.missing.len() as u64 {
                        sm.count = sm.count.saturating_sub(1);
                    }
                }
                let resolved =
                    h.missing.is_empty() && h.summary.as_ref().is_none_or(|sm| sm.count == 0);
                let nranks = st.nranks;
                if let Some(open) = st.stalled.get_mut(&key) {
                    let idx = if p2p {
                        open.positions.iter().position(|p| *p == pos).unwrap_or(0)
                    } else {
                        pos as usize
                    };
                    open.records.entry(idx as u32).or_insert(Member {
                        rank: rec.rank,
                        rank_in_comm: pos,
                        host: host.clone(),
                        rec,
                    });
                }
                let mut completed = None;
                if resolved {
                    st.hangs.remove(&key);
                    if let Some(open) = st.stalled.remove(&key) {
                        if open.records.len() >= open.expected {
                            self.bump(|c| c.completed += 1);
                            completed = Some(Self::joined(st, comm_id, key, nranks, open));
                        }
                    }
                }
                return Ok(Offer::HangProgress {
                    comm_id,
                    key,
                    resolved,
                    completed,
                });
            }
            return Err(RecordError::Late {
                comm_id,
                seq: rec.seq,
            });
        }
        // Any record from a missing member shows it is alive again past its
        // hang point; the hang candidate stays until its own instance resolves.
        let nranks = st.nranks;
        let member = Member {
            rank: rec.rank,
            rank_in_comm: pos,
            host: host.clone(),
            rec,
        };
        let open = st.open.entry(key).or_insert_with(|| {
            self.open_total.fetch_add(1, Ordering::Relaxed);
            let n = if p2p { 2 } else { nranks as usize };
            Open {
                born,
                op: member.rec.op,
                bytes: member.rec.bytes,
                positions: if p2p { positions.clone() } else { Vec::new() },
                records: HashMap::new(),
                expected: n,
                first_host: host.clone(),
                first_agent_ns: member.rec.host_entry_ns,
                entered_hint: None,
            }
        });
        let idx = if p2p {
            open.positions.iter().position(|p| *p == pos).unwrap_or(0)
        } else {
            pos as usize
        };
        if open.records.contains_key(&(idx as u32)) {
            return Err(RecordError::Conflict);
        }
        open.records.insert(idx as u32, member);
        if open.records.len() >= open.expected {
            let open = st.open.remove(&key).expect("present");
            self.open_total.fetch_sub(1, Ordering::Relaxed);
            st.close(key, self.closed_cap());
            self.bump(|c| c.completed += 1);
            return Ok(Offer::Completed(Self::joined(
                st, comm_id, key, nranks, open,
            )));
        }
        if st.open.len() > self.open_cap(nranks) {
            if let Some((&old, _)) = st.open.iter().min_by_key(|(_, o)| o.born) {
                st.open.remove(&old);
                self.open_total.fetch_sub(1, Ordering::Relaxed);
                st.close(old, self.closed_cap());
                self.bump(|c| c.evicted += 1);
            }
        }
        Ok(Offer::Pending)
    }

    /// A complete instance, its members in communicator order.
    fn joined(
        st: &mut CommState,
        comm_id: u64,
        key: InstanceKey,
        nranks: u32,
        open: Open,
    ) -> JoinedInstance {
        let mut members: Vec<Member> = open.records.into_values().collect();
        members.sort_unstable_by_key(|m| m.rank_in_comm);
        if let InstanceKey::Coll(seq) = key {
            for m in &members {
                st.last_completed.insert(m.rank_in_comm, seq);
            }
        }
        JoinedInstance {
            comm_id,
            key,
            comm_nranks: nranks,
            op: open.op,
            bytes: open.bytes,
            members,
        }
    }

    /// Offers one member's record of an instance ([`Joiner::offer_one`]),
    /// then keeps the join within [`MAX_OPEN_TOTAL`].
    pub fn offer(&self, host: &Arc<str>, rec: CollectiveRecord) -> Result<Offer, RecordError> {
        let r = self.offer_one(host, rec);
        if self.open_total.load(Ordering::Relaxed) > self.max_open_total() {
            self.shed();
        }
        r
    }

    /// Closed keys each communicator remembers now ([`MAX_CLOSED_TOTAL`]).
    fn closed_cap(&self) -> usize {
        let share = MAX_CLOSED_TOTAL / self.comm_count.load(Ordering::Relaxed).max(1);
        self.cfg.closed_memory.min(share.max(MIN_CLOSED_PER_COMM))
    }

    fn max_open_total(&self) -> usize {
        MAX_OPEN_TOTAL.max(self.cfg.max_open_per_comm)
    }

    /// Brings the open instances down to three quarters of
    /// [`MAX_OPEN_TOTAL`], taking from the communicators that hold the most
    /// (each keeps at most a common level, its newest; communicators below
    /// that level lose nothing), oldest first; counted as evicted. A
    /// quarter of the cap at a time, so the pass over communicators is rare.
    fn shed(&self) {
        let counts: Vec<usize> = self.comms.iter().map(|c| c.open.len()).collect();
        let low = self.max_open_total() * 3 / 4;
        let level = fill_level(&counts, low);
        let mut evicted = 0usize;
        for mut c in self.comms.iter_mut() {
            let st = &mut *c;
            if st.open.len() <= level {
                continue;
            }
            let mut by_age: Vec<(u64, InstanceKey)> =
                st.open.iter().map(|(k, o)| (o.born, *k)).collect();
            by_age.sort_unstable();
            let n = by_age.len() - level;
            for (_, key) in by_age.into_iter().take(n) {
                st.open.remove(&key);
                st.close(key, self.closed_cap());
            }
            evicted += n;
        }
        self.open_total.fetch_sub(evicted, Ordering::Relaxed);
        self.bump(|c| c.evicted += evicted as u64);
    }

    /// Closes instances whose first member entered more than the timeout
    /// before `now`; `to_coord` aligns an agent time of a host.
    ///
    /// A member that has not arrived is *missing* only when what we know of
    /// it is current past the timeout: `current(rank, host, deadline)` says
    /// whether its agent's data reaches beyond `deadline` (coordinator time)
    /// — agents batch and a loaded host ships late, and a member whose
    /// records are merely in flight is not hung. While some absent member is
    /// not yet current the instance stays open (up to `hang_stale_ns`). A
    /// member that already issued a later operation on the communicator is
    /// not missing either: its record for this one was lost.
    pub fn expire(
        &self,
        now: CoordNs,
        to_coord: impl Fn(&str, u64) -> CoordNs,
        current: impl Fn(u32, &str, CoordNs) -> bool,
    ) -> Vec<Expired> {
        let mut out = Vec::new();
        let mut work = 0usize;
        let mut kept: usize = self.comms.iter().map(|e| e.hangs.len()).sum();
        'comms: for mut entry in self.comms.iter_mut() {
            let comm_id = *entry.key();
            let st = &mut *entry;
            // Instances of a communicator with members never heard of wait
            // until stale (below); the rest until the timeout.
            let unslotted = st.slots.len() < st.nranks as usize;
            let due: Vec<(InstanceKey, CoordNs)> = st
                .open
                .iter_mut()
                .filter_map(|(k, o)| {
                    let wait = if unslotted && matches!(k, InstanceKey::Coll(_)) {
                        self.cfg.hang_stale_ns.max(self.cfg.hang_timeout_ns)
                    } else {
                        self.cfg.hang_timeout_ns
                    };
                    // Far from due by the last look: not worth mapping the
                    // clock again (a tick over 65,536 open instances did
                    // that for each, every 100 ms).
                    if o.entered_hint.is_some_and(|h| {
                        now.saturating_sub(h).saturating_add(HINT_MARGIN_NS) < wait
                    }) {
                        return None;
                    }
                    let entered = to_coord(&o.first_host, o.first_agent_ns);
                    o.entered_hint = Some(entered);
                    (now.saturating_sub(entered) > self.cfg.hang_timeout_ns)
                        .then_some((*k, entered))
                })
                .collect();
            // Oldest first: the instances queued behind a stuck one follow it.
            let mut due = due;
            due.sort_unstable_by_key(|d| d.0);
            for (key, entered) in due {
                let stale = now.saturating_sub(entered) > self.cfg.hang_stale_ns;
                // A member never heard of on this communicator is not known
                // to be current: the instance waits until stale. Said
                // without walking every position of a huge communicator
                // each tick (members with records all have slots).
                if !stale
                    && matches!(key, InstanceKey::Coll(_))
                    && st.slots.len() < st.nranks as usize
                {
                    continue;
                }
                if work >= MAX_EXPIRE_WORK {
                    break 'comms;
                }
                let open = &st.open[&key];
                let p2p = matches!(key, InstanceKey::P2p { .. });
                let (positions, unannounced) = match key {
                    InstanceKey::P2p { lo, hi, .. } => (vec![lo, hi], 0),
                    InstanceKey::Coll(_) => member_positions(st),
                };
                work += positions.len().max(1);
                let deadline = entered.saturating_add(self.cfg.hang_timeout_ns);
                let mut present_ranks = Vec::new();
                let mut absent = Vec::new();
                let mut undecided = unannounced > 0;
                for (i, p) in positions.iter().enumerate() {
                    // Records are stored by comm position, p2p ones by side.
                    let idx = if p2p { i as u32 } else { *p };
                    if let Some(m) = open.records.get(&idx) {
                        present_ranks.push(m.rank);
                        continue;
                    }
                    if passed(st, key, *p) {
                        continue;
                    }
                    let slot = st.slots.get(p);
                    let known = slot.is_some_and(|s| current(s.rank, &s.host, deadline));
                    undecided |= !known;
                    absent.push(*p);
                }
                if undecided && !stale {
                    continue;
                }
                let open = st.open.remove(&key).expect("listed");
                self.open_total.fetch_sub(1, Ordering::Relaxed);
                st.close(key, self.closed_cap());
                // Said as ranges over every absent member, before the list
                // is cut: ranks past the named ones are in the ranges too,
                // and members never announced are in the count alone.
                let absent_total = absent.len() + unannounced;
                let summary = (absent_total > HANG_LIST_MAX).then(|| {
                    let known = absent
                        .iter()
                        .filter_map(|p| st.slots.get(p).map(|s| s.rank))
                        .collect();
                    MissingSummary::new(absent_total as u64, known)
                });
                let mut unlisted = unannounced as u64;
                if absent.len() > MAX_NAMED_MISSING {
                    unlisted += (absent.len() - MAX_NAMED_MISSING) as u64;
                    absent.truncate(MAX_NAMED_MISSING);
                }
                if unlisted > 0 {
                    self.bump(|c| c.missing_unlisted += unlisted);
                }
                let missing: Vec<MissingMember> = absent
                    .iter()
                    .map(|p| {
                        let slot = st.slots.get(p);
                        MissingMember {
                            rank: slot.map_or(UNKNOWN_RANK, |s| s.rank),
                            rank_in_comm: *p,
                            host: slot.map_or_else(String::new, |s| s.host.to_string()),
                            last_seq_seen: st.last_seq.get(p).copied(),
                            last_completed_seq: st.last_completed.get(p).copied(),
                        }
                    })
                    .collect();
                if missing.is_empty() && unannounced == 0 {
                    self.bump(|c| c.incomplete += 1);
                    out.push(Expired::Incomplete { comm_id, key });
                } else {
                    let h = HangCandidate {
                        comm_id,
                        key,
                        op: open.op,
                        comm_nranks: st.nranks,
                        entered_at: entered,
                        first_host: open.first_host.to_string(),
                        first_agent_ns: open.first_agent_ns,
                        present_ranks,
                        missing,
                        summary,
                    };
                    // Only the earliest hung instances per communicator matter.
                    if st.hangs.len() < 4 && kept < MAX_KEPT_HANGS {
                        st.hangs.insert(key, h.clone());
                        st.stalled.insert(key, open);
                        kept += 1;
                    }
                    self.bump(|c| c.hangs += 1);
                    out.push(Expired::Hang(h));
                }
            }
        }
        // Communicators in id order (a stable sort keeps each one's oldest
        // first): the map's order is random per process, and replays must
        // give the same report every time.
        out.sort_by_key(|e| match e {
            Expired::Hang(h) => h.comm_id,
            Expired::Incomplete { comm_id, .. } => *comm_id,
        });
        out
    }
}

/// The positions of a collective instance to look at, and how many of its
/// members are left out of them as never announced (no agent ever sent
/// their membership; only a count can be said of them). Every position
/// while few are unannounced, so they are named; else only the announced
/// ones: walking every claimed position made each instance of a 4,096-rank
/// communicator only its creator was in cost 4,096 steps, and an agent
/// opening such instances by the thousand stalled the coordinator.
fn member_positions(st: &CommState) -> (Vec<u32>, usize) {
    let unannounced = (st.nranks as usize).saturating_sub(st.slots.len());
    if unannounced <= HANG_LIST_MAX {
        return ((0..st.nranks).collect(), 0);
    }
    let mut known: Vec<u32> = st.slots.keys().copied().collect();
    known.sort_unstable();
    (known, unannounced)
}

/// The largest level `l` such that capping every count at `l` leaves at
/// most `budget` in all (water-filling from the top).
fn fill_level(counts: &[usize], budget: usize) -> usize {
    let (mut lo, mut hi) = (0usize, counts.iter().copied().max().unwrap_or(0));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let total: usize = counts.iter().map(|c| (*c).min(mid)).sum();
        if total <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Whether position `p` already issued an operation after `key` on this
/// communicator (so its record for `key` was lost, not withheld).
fn passed(st: &CommState, key: InstanceKey, p: u32) -> bool {
    match key {
        InstanceKey::Coll(seq) => st.last_seq.get(&p).is_some_and(|l| *l > seq),
        InstanceKey::P2p { lo, hi, ordinal } => {
            let peer = if p == lo { hi } else { lo };
            st.p2p_ordinal.get(&(p, peer)).is_some_and(|n| *n > ordinal)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_missing_ranks_are_a_count_with_ranges() {
        let mut ranks: Vec<u32> = (1..(1u32 << 20)).rev().collect();
        ranks.push(7); // said twice: counted once in the ranges
        let s = MissingSummary::new(1 << 20, ranks);
        assert_eq!(s.ranges, vec![[1, (1 << 20) - 1]]);
        assert_eq!(s.unlisted, 1, "one absent member has no known rank");
        assert!(s
            .describe()
            .starts_with("1048576 members, ranks 1-1048575 (1 not"));
        // Every other rank: the ranges stop at the cap, the rest is counted.
        let sparse = MissingSummary::new(1000, (0..1000).map(|r| r * 2).collect());
        assert_eq!(sparse.ranges.len(), MAX_MISSING_RANGES);
        assert_eq!(sparse.ranges[1], [2, 2]);
        assert_eq!(sparse.unlisted, 1000 - MAX_MISSING_RANGES as u64);
        // None known: only the count.
        let unknown = MissingSummary::new(5, Vec::new());
        assert!(unknown.ranges.is_empty());
        assert_eq!(
            unknown.describe(),
            "5 members (5 not in the ranges: never announced by an agent, or past 256 ranges)"
        );
    }

    fn comm(rank: u32, pos: u32, n: u32) -> CommRecord {
        CommRecord {
            pid: 100 + rank,
            rank,
            comm_id: 7,
            parent_id: 0,
            color: 0,
            nranks: n,
            rank_in_comm: pos,
            created_ns: 1,
            split_ordinal: 0,
            split_key: 0,
        }
    }

    fn rec(rank: u32, seq: u64, t: u64) -> CollectiveRecord {
        CollectiveRecord {
            pid: 100 + rank,
            rank,
            comm_id: 7,
            seq,
            op: CollOp::AllReduce,
            bytes: 1024,
            peer: -1,
            host_entry_ns: t,
            host_exit_ns: t + 10,
            gpu_arrive_ns: 0,
            gpu_done_ns: 0,
            launches_before: 3,
            sync_wait_ns_before: 0,
            gpu_busy_before_ns: None,
            ret: 0,
        }
    }

    fn joiner(n: u32) -> (Joiner, Arc<str>) {
        let j = Joiner::new(JoinConfig {
            max_open_per_comm: 8,
            open_records_per_comm: 0,
            hang_timeout_ns: 1_000,
            ..Default::default()
        });
        let h: Arc<str> = Arc::from("node-0");
        for r in 0..n {
            j.register_comm(&h, &comm(r, r, n)).unwrap();
        }
        (j, h)
    }

    /// Instances of a 4,096-rank communicator only one member was ever
    /// announced in (a token holder claiming huge communicators): their
    /// expiry costs the members seen, not the size claimed, so one pass
    /// takes them all (walking every position, a pass took 256), and the
    /// never-announced members are a count, not 4,095 nameless entries.
    #[test]
    fn unannounced_members_are_counted_not_walked() {
        let j = Joiner::new(JoinConfig {
            hang_timeout_ns: 1_000,
            hang_stale_ns: 2_000,
            ..Default::default()
        });
        let h: Arc<str> = Arc::from("evil");
        let (comms, per_comm) = (4u64, 256u64);
        for id in 0..comms {
            let c = CommRecord {
                comm_id: 100 + id,
                ..comm(0, 0, 4096)
            };
            j.register_comm(&h, &c).unwrap();
            for seq in 0..per_comm {
                let r = CollectiveRecord {
                    comm_id: 100 + id,
                    ..rec(0, seq, 10)
                };
                assert!(matches!(j.offer(&h, r).unwrap(), Offer::Pending));
            }
        }
        let out = j.expire(1_000_000, |_, t| t as CoordNs, |_, _, _| false);
        assert_eq!(
            out.len() as u64,
            comms * per_comm,
            "one pass expires them all"
        );
        for e in &out {
            let Expired::Hang(c) = e else {
                panic!("{e:?}: absent members are a hang, not lost records")
            };
            assert!(c.missing.is_empty(), "{:?}", c.missing.first());
            assert_eq!(c.present_ranks, vec![0]);
            let sm = c.summary.as_ref().expect("counted");
            assert_eq!((sm.count, sm.unlisted), (4095, 4095));
            assert!(sm.ranges.is_empty());
        }
        assert_eq!(j.counters().missing_unlisted, 4095 * comms * per_comm);
        assert_eq!(j.open_instances(), 0);
    }

    /// One rank cannot be made a member of communicators without bound
    /// (each holds state until the coordinator stops); its own
    /// communicators announced again (a restart) still are.
    #[test]
    fn a_rank_joins_a_bounded_number_of_communicators() {
        let j = Joiner::new(JoinConfig::default());
        let h: Arc<str> = Arc::from("evil");
        let of = |id: u64, rank: u32| CommRecord {
            comm_id: 1000 + id,
            ..comm(rank, 0, 4096)
        };
        for id in 0..u64::from(MAX_COMMS_PER_RANK) {
            j.register_comm(&h, &of(id, 1)).unwrap();
        }
        let past = u64::from(MAX_COMMS_PER_RANK);
        assert!(matches!(
            j.register_comm(&h, &of(past, 1)),
            Err(RecordError::TooManyCommunicatorsForRank { rank: 1, .. })
        ));
        assert!(j.comm_nranks(1000 + past).is_none(), "nothing kept of it");
        j.register_comm(&h, &of(0, 1)).expect("announced again");
        j.register_comm(&h, &of(past, 2)).expect("another rank");
    }

    /// Past the list's bound, an arrival at a kept hang is taken off its
    /// count: the hang resolves only when the count says nobody is out.
    #[test]
    fn a_hang_with_unannounced_members_does_not_resolve_on_the_named_ones() {
        let j = Joiner::new(JoinConfig {
            hang_timeout_ns: 1_000,
            hang_stale_ns: 2_000,
            ..Default::default()
        });
        let h: Arc<str> = Arc::from("node-0");
        for r in 0..2 {
            j.register_comm(&h, &comm(r, r, 100)).unwrap();
        }
        assert!(matches!(
            j.offer(&h, rec(0, 1, 10)).unwrap(),
            Offer::Pending
        ));
        let out = j.expire(1_000_000, |_, t| t as CoordNs, |_, _, _| true);
        let [Expired::Hang(c)] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(
            c.missing.iter().map(|m| m.rank).collect::<Vec<_>>(),
            vec![1]
        );
        assert_eq!(c.summary.as_ref().map(|s| s.count), Some(99));
        match j.offer(&h, rec(1, 1, 20)).unwrap() {
            Offer::HangProgress { resolved, .. } => {
                assert!(!resolved, "98 members no agent announced are still out")
            }
            o => panic!("{o:?}"),
        }
    }

    /// Hangs on many communicators are all reported, but only
    /// [`MAX_KEPT_HANGS`] are kept to resolve (each holds its absent list).
    #[test]
    fn hangs_kept_are_bounded_across_communicators() {
        let j = Joiner::new(JoinConfig {
            hang_timeout_ns: 1_000,
            ..Default::default()
        });
        let h: Arc<str> = Arc::from("node-0");
        let comms = 200u64;
        for id in 0..comms {
            for r in 0..2 {
                j.register_comm(
                    &h,
                    &CommRecord {
                        comm_id: 100 + id,
                        ..comm(r, r, 2)
                    },
                )
                .unwrap();
            }
            for seq in 0..4 {
                let r = CollectiveRecord {
                    comm_id: 100 + id,
                    ..rec(0, seq, 10 + seq)
                };
                assert!(matches!(j.offer(&h, r).unwrap(), Offer::Pending));
            }
        }
        let mut hangs = 0;
        for _ in 0..100 {
            let out = j.expire(1_000_000, |_, t| t as CoordNs, |_, _, _| true);
            hangs += out.iter().filter(|e| matches!(e, Expired::Hang(_))).count();
            if out.is_empty() {
                break;
            }
        }
        assert_eq!(hangs as u64, comms * 4, "every hang is reported");
        let kept: usize = j.comms.iter().map(|e| e.hangs.len()).sum();
        assert_eq!(kept, MAX_KEPT_HANGS);
    }

    #[test]
    fn fill_level_caps_the_largest_first() {
        assert_eq!(fill_level(&[40, 40, 40, 3], 63), 20);
        assert_eq!(fill_level(&[100, 2, 1], 50), 47);
        assert_eq!(fill_level(&[5, 5], 100), 5);
        assert_eq!(fill_level(&[], 10), 0);
    }

    #[test]
    fn out_of_order_members_complete_once() {
        let (j, h) = joiner(3);
        assert!(matches!(j.offer(&h, rec(2, 0, 5)).unwrap(), Offer::Pending));
        assert!(matches!(j.offer(&h, rec(0, 1, 9)).unwrap(), Offer::Pending));
        assert!(matches!(j.offer(&h, rec(0, 0, 4)).unwrap(), Offer::Pending));
        assert!(matches!(
            j.offer(&h, rec(2, 0, 5)).unwrap(),
            Offer::Duplicate
        ));
        match j.offer(&h, rec(1, 0, 6)).unwrap() {
            Offer::Completed(i) => {
                assert_eq!(i.key, InstanceKey::Coll(0));
                assert_eq!(
                    i.members.iter().map(|m| m.rank).collect::<Vec<_>>(),
                    vec![0, 1, 2]
                );
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            j.offer(&h, rec(1, 0, 6)),
            Err(RecordError::SequenceBackwards { .. })
        ));
    }

    #[test]
    fn unknown_comm_and_non_member_are_rejected() {
        let (j, h) = joiner(2);
        let mut r = rec(0, 0, 1);
        r.comm_id = 99;
        assert!(matches!(
            j.offer(&h, r),
            Err(RecordError::UnknownCommunicator { .. })
        ));
        assert!(matches!(
            j.offer(&h, rec(5, 0, 1)),
            Err(RecordError::NotAMember { .. })
        ));
        assert!(matches!(
            j.register_comm(&h, &comm(9, 0, 3)),
            Err(RecordError::CommSizeConflict { .. })
        ));
    }

    #[test]
    fn window_is_bounded_and_evictions_counted() {
        let (j, h) = joiner(2);
        for s in 0..100 {
            j.offer(&h, rec(0, s, 10 + s)).unwrap();
        }
        assert!(j.open_instances() <= 8);
        assert_eq!(j.counters().evicted, 92);
        // Rank 1's record for an evicted instance is late, not a new instance.
        assert!(matches!(
            j.offer(&h, rec(1, 3, 13)),
            Err(RecordError::Late { .. })
        ));
    }

    #[test]
    fn delayed_host_is_not_a_hang_until_it_reported_past_the_timeout() {
        let (j, h) = joiner(3);
        j.offer(&h, rec(0, 0, 200)).unwrap();
        j.offer(&h, rec(2, 0, 201)).unwrap();
        // The missing member's agent last reported at 500: its records may
        // still be on their way (spooled behind a link outage).
        let heard_at = |t: i64| move |_: u32, _: &str, deadline: CoordNs| t >= deadline;
        assert!(j.expire(1_300, |_, t| t as i64, heard_at(500)).is_empty());
        // Once it reported past the timeout without the record, it is a hang.
        assert_eq!(j.expire(1_300, |_, t| t as i64, heard_at(1_250)).len(), 1);
        // An agent silent past the stale limit is not waited for.
        let (j, h) = joiner(3);
        j.offer(&h, rec(0, 0, 200)).unwrap();
        let stale = JoinConfig::default().hang_stale_ns;
        assert_eq!(
            j.expire(stale + 300, |_, t| t as i64, heard_at(500)).len(),
            1
        );
    }

    #[test]
    fn hang_names_missing_rank_and_last_completed() {
        let (j, h) = joiner(3);
        for s in 0..5 {
            for r in 0..3 {
                j.offer(&h, rec(r, s, 100 + s)).unwrap();
            }
        }
        // Rank 1 stops; 0 and 2 enter instance 5.
        j.offer(&h, rec(0, 5, 200)).unwrap();
        j.offer(&h, rec(2, 5, 201)).unwrap();
        assert!(j.expire(1_000, |_, t| t as i64, |_, _, _| true).is_empty());
        let exp = j.expire(1_300, |_, t| t as i64, |_, _, _| true);
        assert_eq!(exp.len(), 1);
        let Expired::Hang(hc) = &exp[0] else {
            panic!("{exp:?}")
        };
        assert_eq!(hc.key, InstanceKey::Coll(5));
        assert_eq!(hc.present_ranks, vec![0, 2]);
        assert_eq!(hc.missing.len(), 1);
        assert_eq!(hc.missing[0].rank, 1);
        assert_eq!(hc.missing[0].last_completed_seq, Some(4));
        // It finally shows up: the hang resolves, and the instance joins
        // after all (a wait past the timeout is data, not loss).
        let Offer::HangProgress {
            resolved: true,
            completed: Some(i),
            ..
        } = j.offer(&h, rec(1, 5, 202)).unwrap()
        else {
            panic!("not resolved and joined")
        };
        assert_eq!(i.key, InstanceKey::Coll(5));
        let ranks: Vec<u32> = i.members.iter().map(|m| m.rank).collect();
        assert_eq!(ranks, vec![0, 1, 2]);
    }

    #[test]
    fn lost_record_is_incomplete_not_hang() {
        let (j, h) = joiner(2);
        j.offer(&h, rec(0, 0, 10)).unwrap(); // rank 1's record for 0 is lost
        j.offer(&h, rec(0, 1, 20)).unwrap();
        j.offer(&h, rec(1, 1, 21)).unwrap();
        let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
        assert!(
            matches!(exp.as_slice(), [Expired::Incomplete { .. }]),
            "{exp:?}"
        );
    }

    #[test]
    fn member_whose_data_is_not_current_is_not_missing_yet() {
        // Two hosts; host b's agent ships late. Its ranks' records for
        // instance 0 are still in flight when the timeout passes.
        let j = Joiner::new(JoinConfig {
            hang_timeout_ns: 1_000,
            hang_stale_ns: 100_000,
            ..Default::default()
        });
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        for r in 0..4 {
            j.register_comm(if r < 2 { &a } else { &b }, &comm(r, r, 4))
                .unwrap();
        }
        j.offer(&a, rec(0, 0, 100)).unwrap();
        j.offer(&a, rec(1, 0, 101)).unwrap();
        let wm_b = std::cell::Cell::new(500i64);
        let current = |_: u32, h: &str, deadline: i64| h == "a" || wm_b.get() >= deadline;
        assert!(j.expire(5_000, |_, t| t as i64, current).is_empty());
        assert_eq!(j.open_instances(), 1);
        // Host b's batch arrives: its ranks passed instance 0 long ago.
        j.offer(&b, rec(2, 0, 102)).unwrap();
        assert!(matches!(
            j.offer(&b, rec(3, 0, 103)).unwrap(),
            Offer::Completed(_)
        ));
        // Instance 1: rank 3 never comes; once b is current past the
        // deadline, it is missing (and only it).
        j.offer(&a, rec(0, 1, 6_000)).unwrap();
        j.offer(&a, rec(1, 1, 6_001)).unwrap();
        j.offer(&b, rec(2, 1, 6_002)).unwrap();
        wm_b.set(6_500);
        assert!(j.expire(8_000, |_, t| t as i64, current).is_empty());
        wm_b.set(7_100);
        let exp = j.expire(8_000, |_, t| t as i64, current);
        let [Expired::Hang(h)] = exp.as_slice() else {
            panic!("{exp:?}")
        };
        assert_eq!(
            h.missing.iter().map(|m| m.rank).collect::<Vec<_>>(),
            vec![3]
        );
        assert_eq!(h.present_ranks, vec![0, 1, 2]);
    }

    #[test]
    fn later_records_arriving_first_do_not_hide_a_hang() {
        // Rank 1's older records reach the coordinator after the others'
        // records of the stuck instance: it is still missing from it.
        let (j, h) = joiner(3);
        j.offer(&h, rec(0, 0, 10)).unwrap();
        j.offer(&h, rec(2, 0, 11)).unwrap();
        j.offer(&h, rec(0, 1, 20)).unwrap();
        j.offer(&h, rec(2, 1, 21)).unwrap();
        j.offer(&h, rec(1, 0, 12)).unwrap();
        let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
        let [Expired::Hang(hc)] = exp.as_slice() else {
            panic!("{exp:?}")
        };
        assert_eq!(hc.key, InstanceKey::Coll(1));
        assert_eq!(hc.missing[0].rank, 1);
        assert_eq!(hc.missing[0].last_completed_seq, Some(0));
    }

    #[test]
    fn stale_agent_still_ends_in_a_hang() {
        let (j, h) = joiner(2);
        j.offer(&h, rec(0, 0, 10)).unwrap();
        let never = |_: u32, _: &str, _: i64| false;
        let mut j2 = j;
        j2.cfg.hang_stale_ns = 50_000;
        assert!(j2.expire(20_000, |_, t| t as i64, never).is_empty());
        let exp = j2.expire(60_000, |_, t| t as i64, never);
        assert!(matches!(exp.as_slice(), [Expired::Hang(_)]), "{exp:?}");
    }

    #[test]
    fn p2p_pairs_by_ordinal_not_seq() {
        let (j, h) = joiner(2);
        let mut send = rec(0, 3, 10);
        send.op = CollOp::Send;
        send.peer = 1;
        let mut recv = rec(1, 0, 12);
        recv.op = CollOp::Recv;
        recv.peer = 0;
        assert!(matches!(j.offer(&h, send).unwrap(), Offer::Pending));
        match j.offer(&h, recv).unwrap() {
            Offer::Completed(i) => assert_eq!(
                i.key,
                InstanceKey::P2p {
                    lo: 0,
                    hi: 1,
                    ordinal: 0
                }
            ),
            o => panic!("{o:?}"),
        }
        let mut bad = rec(1, 5, 20);
        bad.op = CollOp::Recv;
        bad.peer = 1;
        assert!(matches!(j.offer(&h, bad), Err(RecordError::BadPeer { .. })));
    }
}

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

mod expire;
mod instance;
mod open;
pub mod park;
mod present;
pub mod realign;
pub mod splits;
pub mod validate;

pub use instance::{
    op_name, HangCandidate, InstanceKey, JoinedInstance, Member, MissingMember, MissingSummary,
    HANG_LIST_MAX, MAX_MISSING_RANGES, UNKNOWN_RANK,
};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use slowrank_shared::wire::{CollOp, CollectiveRecord, CommRecord};

use crate::clock::CoordNs;
use crate::join::validate::RecordError;

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

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    records: present::Present,
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
    /// The latest entry (coordinator time) of a point-to-point operation
    /// from one position to another whose record cannot be joined (a
    /// member a restarted agent took over: what it missed is unknown, so
    /// its operations cannot be numbered): it shows that member went on.
    p2p_unjoinable: HashMap<(u32, u32), CoordNs>,
    open: HashMap<InstanceKey, Open>,
    born: u64,
    closed: HashSet<InstanceKey>,
    closed_order: VecDeque<InstanceKey>,
    hangs: HashMap<InstanceKey, HangCandidate>,
    /// The members present when each kept hang candidate timed out, so the
    /// instance still joins if the missing ones arrive (one per entry of
    /// `hangs`, so as bounded).
    stalled: HashMap<InstanceKey, Open>,
    /// The position whose data last kept an expiring instance undecided:
    /// looked at first next time, so a member behind on a huge
    /// communicator costs one lookup per instance and tick, not a walk of
    /// every position (a 16,384-rank flood spent most of its time there).
    expire_blocker: Option<u32>,
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
            p2p_unjoinable: HashMap::new(),
            open: HashMap::new(),
            born: 0,
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            hangs: HashMap::new(),
            stalled: HashMap::new(),
            expire_blocker: None,
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

    /// The last sequence number `rank` reported on `comm_id`.
    pub fn last_seq_of(&self, comm_id: u64, rank: u32) -> Option<u64> {
        let st = self.comms.get(&comm_id)?;
        let pos = st.by_rank.get(&rank)?;
        st.last_seq.get(pos).copied()
    }

    /// `rank` issued a point-to-point operation to comm position `peer`
    /// at `entry` (coordinator time) whose record cannot be joined: the
    /// instances between them that entered a hang timeout before it are
    /// not its hang (its records for them are lost, counted by the
    /// caller). Without it every send/recv of a pipeline stage whose agent
    /// restarted was called a hang of that stage.
    pub fn p2p_unjoinable(&self, comm_id: u64, rank: u32, peer: i32, entry: CoordNs) {
        let Some(mut st) = self.comms.get_mut(&comm_id) else {
            return;
        };
        let Some(&pos) = st.by_rank.get(&rank) else {
            return;
        };
        let Ok(peer) = u32::try_from(peer) else {
            return;
        };
        let t = st.p2p_unjoinable.entry((pos, peer)).or_insert(entry);
        *t = (*t).max(entry);
    }

    /// Whether `rank` of `comm_id` issued a send/recv to position `peer`
    /// that could not be numbered ([`Joiner::p2p_unjoinable`]), entered
    /// after `after`: it went on, whatever instance its lost records were.
    pub fn p2p_went_on(&self, comm_id: u64, rank: u32, peer: u32, after: CoordNs) -> bool {
        let Some(st) = self.comms.get(&comm_id) else {
            return false;
        };
        let Some(&pos) = st.by_rank.get(&rank) else {
            return false;
        };
        st.p2p_unjoinable
            .get(&(pos, peer))
            .is_some_and(|t| *t > after)
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
        if let Some(offer) = self.offer_again(st, pos, p2p, &rec)? {
            return Ok(offer);
        }
        let (key, positions) = instance_of(st, pos, p2p, &rec);
        st.born += 1;
        let born = st.born;

        if st.closed.contains(&key) {
            return self.offer_late(st, key, pos, p2p, host, rec);
        }
        // Any record from a missing member shows it is alive again past its
        // hang point; the hang candidate stays until its own instance resolves.
        let member = Member {
            rank: rec.rank,
            rank_in_comm: pos,
            host: host.clone(),
            rec,
        };
        let open = self.open_instance(st, key, born, positions, &member);
        let idx = if p2p {
            open.positions.iter().position(|p| *p == pos).unwrap_or(0)
        } else {
            pos as usize
        };
        if open.records.contains_key(&(idx as u32)) {
            return Err(RecordError::Conflict);
        }
        open.records.insert_if_absent(idx as u32, member);
        let full = open.records.len() >= open.expected;
        Ok(self.complete_or_cap(st, comm_id, key, full))
    }

    /// The open instance `key`, opened with `member` as its first record
    /// when it is new.
    fn open_instance<'s>(
        &self,
        st: &'s mut CommState,
        key: InstanceKey,
        born: u64,
        positions: Vec<u32>,
        member: &Member,
    ) -> &'s mut Open {
        let nranks = st.nranks;
        let p2p = matches!(key, InstanceKey::P2p { .. });
        st.open.entry(key).or_insert_with(|| {
            self.open_total.fetch_add(1, Ordering::Relaxed);
            let n = if p2p { 2 } else { nranks as usize };
            Open {
                born,
                op: member.rec.op,
                bytes: member.rec.bytes,
                positions: if p2p { positions } else { Vec::new() },
                records: present::Present::new(),
                expected: n,
                first_host: member.host.clone(),
                first_agent_ns: member.rec.host_entry_ns,
                entered_hint: None,
            }
        })
    }

    /// After a record went in: the instance joined when `full`; else, past
    /// the communicator's cap on open instances, its oldest is evicted.
    fn complete_or_cap(
        &self,
        st: &mut CommState,
        comm_id: u64,
        key: InstanceKey,
        full: bool,
    ) -> Offer {
        let nranks = st.nranks;
        if full {
            let open = st.open.remove(&key).expect("present");
            self.open_total.fetch_sub(1, Ordering::Relaxed);
            st.close(key, self.closed_cap());
            self.bump(|c| c.completed += 1);
            return Offer::Completed(Self::joined(st, comm_id, key, nranks, open));
        }
        if st.open.len() > self.open_cap(nranks) {
            if let Some((&old, _)) = st.open.iter().min_by_key(|(_, o)| o.born) {
                st.open.remove(&old);
                self.open_total.fetch_sub(1, Ordering::Relaxed);
                st.close(old, self.closed_cap());
                self.bump(|c| c.evicted += 1);
            }
        }
        Offer::Pending
    }

    /// A record at or below its member's last sequence number: the same
    /// record again (a duplicate), a later fold of it with its GPU-side
    /// times (merged), a conflict, or one out of order within its rank
    /// (`None`: accepted as new). A new sequence number moves the member on.
    fn offer_again(
        &self,
        st: &mut CommState,
        pos: u32,
        p2p: bool,
        rec: &CollectiveRecord,
    ) -> Result<Option<Offer>, RecordError> {
        let last = st.last_seq.get(&pos).copied();
        if last.is_none_or(|l| rec.seq > l) {
            st.last_seq.insert(pos, rec.seq);
            return Ok(None);
        }
        // Only a collective can be matched again by its sequence number.
        let open = if p2p {
            None
        } else {
            st.open.get_mut(&InstanceKey::Coll(rec.seq))
        };
        let Some(open) = open else {
            return Err(RecordError::SequenceBackwards {
                comm_id: rec.comm_id,
                rank: rec.rank,
                seq: rec.seq,
                last: last.unwrap_or(0),
            });
        };
        match open.records.get_mut(&pos) {
            Some(m) if m.rec == *rec => {
                self.bump(|c| c.duplicates += 1);
                Ok(Some(Offer::Duplicate))
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
                Ok(Some(Offer::Merged))
            }
            Some(_) => Err(RecordError::Conflict),
            None => Ok(None), // out of order within the rank: accepted as new
        }
    }

    /// A record for an instance that already timed out without it: the
    /// member arrived after all, which may resolve the instance's hang.
    fn offer_late(
        &self,
        st: &mut CommState,
        key: InstanceKey,
        pos: u32,
        p2p: bool,
        host: &Arc<str>,
        rec: CollectiveRecord,
    ) -> Result<Offer, RecordError> {
        let comm_id = rec.comm_id;
        // The instance timed out without this member.
        let Some(h) = st.hangs.get_mut(&key) else {
            return Err(RecordError::Late {
                comm_id,
                seq: rec.seq,
            });
        };
        let before = h.missing.len();
        h.missing.retain(|m| m.rank_in_comm != pos);
        // Past the list's bound the count is what says who is still
        // out (unlisted and never-announced members are only in it).
        if let Some(sm) = &mut h.summary {
            if h.missing.len() < before || sm.count > h.missing.len() as u64 {
                sm.count = sm.count.saturating_sub(1);
            }
        }
        let resolved = h.missing.is_empty() && h.summary.as_ref().is_none_or(|sm| sm.count == 0);
        let nranks = st.nranks;
        if let Some(open) = st.stalled.get_mut(&key) {
            let idx = if p2p {
                open.positions.iter().position(|p| *p == pos).unwrap_or(0)
            } else {
                pos as usize
            };
            open.records.insert_if_absent(
                idx as u32,
                Member {
                    rank: rec.rank,
                    rank_in_comm: pos,
                    host: host.clone(),
                    rec,
                },
            );
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
        Ok(Offer::HangProgress {
            comm_id,
            key,
            resolved,
            completed,
        })
    }

    /// A complete instance, its members in communicator order.
    fn joined(
        st: &mut CommState,
        comm_id: u64,
        key: InstanceKey,
        nranks: u32,
        open: Open,
    ) -> JoinedInstance {
        let mut members: Vec<Member> = open.records.into_members();
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

/// The instance a record belongs to, and (point-to-point) its two ends'
/// positions: a p2p op is numbered by its order between the two ends.
fn instance_of(
    st: &mut CommState,
    pos: u32,
    p2p: bool,
    rec: &CollectiveRecord,
) -> (InstanceKey, Vec<u32>) {
    if p2p {
        let peer = rec.peer as u32;
        let ord = st.p2p_ordinal.entry((pos, peer)).or_insert(0);
        let ordinal = *ord;
        *ord += 1;
        let (lo, hi) = (pos.min(peer), pos.max(peer));
        (InstanceKey::P2p { lo, hi, ordinal }, vec![lo, hi])
    } else {
        (InstanceKey::Coll(rec.seq), Vec::new())
    }
}

#[cfg(test)]
mod tests;

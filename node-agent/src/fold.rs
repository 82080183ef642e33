//! Raw probe events → per-collective records and per-interval counters.
//!
//! Per rank process the fold keeps: the `ncclComm_t` → communicator map
//! (learned at init/split return), a sequence counter per communicator (so
//! `(comm_id, seq)` names one instance on every member: members issue the
//! same operations in the same order), the calls in flight per thread, the
//! sync wait and launch count since the previous collective, and the
//! interval counters. All state is bounded; what does not fit is dropped and
//! counted in [`FoldDrops`]. Every time leaving the fold goes through the
//! agent's [`HostClock`].

use std::collections::HashMap;

use slowrank_shared::{
    probe::{cuda_count, CallKind, STACK_WORDS},
    wire::{
        CollOp, CollectiveRecord, CommRecord, LinkRecord, RankExit, RankIdentity, RankInterval,
    },
};

use crate::{
    catalog::{dtype_size, CollArgs, Loc, Role},
    clock::HostClock,
    gpuside::{GpuSide, GpuSideStats, LocalMembers},
    probes::RawEvent,
    sched::{SchedDelta, SchedStat},
};

/// Bounds on per-process state.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Calls in flight per process (entries waiting for their return).
    pub open_calls: usize,
    /// Communicators per process.
    pub comms: usize,
    /// Records waiting to be shipped (over all processes).
    pub pending_records: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            open_calls: 4096,
            comms: 1024,
            pending_records: 1 << 18,
        }
    }
}

/// What the fold had to drop, since the agent started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FoldDrops {
    /// Entries evicted because too many calls were in flight.
    pub open_calls: u64,
    /// Returns without a matching entry (entry lost or before attach).
    pub orphan_returns: u64,
    /// Collectives on a communicator whose creation was not seen.
    pub unknown_comm: u64,
    /// Communicators not tracked because a process had too many.
    pub comms: u64,
    /// Records dropped because the outgoing queue was full.
    pub records: u64,
    /// Split communicators whose member position could not be read from
    /// the communicator object: shipped without a size, for the
    /// coordinator to work out (not a loss).
    pub split_deferred: u64,
    /// Verbs posts forgotten unmatched (table full) or QPs not tracked.
    pub verbs: u64,
    /// Events of not-yet-classified processes dropped because the holding
    /// area was full.
    pub limbo: u64,
    /// `ncclGroupEnd` returns (or whole calls) lost to a full ring buffer,
    /// recovered so the thread's later operations are not held forever:
    /// an open GroupEnd when its thread entered NCCL again, or a group held
    /// longer than [`GROUP_HOLD_NS`].
    pub lost_group_ends: u64,
}

/// Longest a thread's group is held open waiting for its `ncclGroupEnd`
/// (raw ns). Groups bundle operations issued back to back (microseconds);
/// one open this long lost its end to a full ring buffer.
pub const GROUP_HOLD_NS: u64 = 2_000_000_000;

/// Events held per not-yet-classified process, and such processes at most.
const LIMBO_EVENTS: usize = 16384;
const LIMBO_PIDS: usize = 256;
/// How long events of an unclassified process are kept (ns).
const LIMBO_NS: u64 = 5_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Open {
    ts: u64,
    args: [u64; 6],
    stack: [u64; STACK_WORDS],
    launches: u64,
    has_stack: bool,
}

#[derive(Debug, Clone)]
struct Comm {
    id: u64,
    seq: u64,
    /// `ncclCommSplit` calls made on this communicator so far (a split is
    /// collective over the parent, so the n-th split is the same on every
    /// member).
    splits: u64,
}

/// A split whose member position is not known yet; see [`Folder::resolve_split`].
#[derive(Debug, Clone)]
pub struct SplitPending {
    pub pid: u32,
    pub comm_ptr: u64,
    pub record: CommRecord,
    /// The communicator object's bytes, read right after the split returned.
    pub snapshot: Option<Vec<u8>>,
}

impl Proc {
    /// Closes `tid`'s group: the operations it held, with their host entries.
    fn end_group(&mut self, tid: u32) -> Vec<(CollectiveRecord, u64)> {
        self.group_depth.remove(&tid);
        self.grouped.remove(&tid).unwrap_or_default()
    }
}

#[derive(Debug)]
struct Proc {
    rank: u32,
    comms: HashMap<u64, Comm>,
    open: HashMap<(u32, u32), Vec<Open>>,
    open_count: usize,
    /// Per thread: collectives issued inside ncclGroupStart/End, finished
    /// when the outermost group ends (that is when NCCL really launches).
    group_depth: HashMap<u32, u32>,
    grouped: HashMap<u32, Vec<(CollectiveRecord, u64)>>,
    sync_wait_since_coll: u64,
    launches_at_last_coll: u64,
    // Interval accumulators.
    iv_start: u64,
    iv_sync_calls: u64,
    iv_sync_wait: u64,
    iv_launches_base: u64,
    last_launches: u64,
    /// The main thread's scheduler times when the interval opened (None
    /// until first read: that interval reports none).
    iv_sched: Option<SchedStat>,
    /// Per QP number (deep set): peer and traffic this interval.
    qps: HashMap<u32, Qp>,
    /// Communicator objects as the kernel read them at init/split return
    /// (address → bytes), for the layout even after the process ended.
    snapshots: HashMap<u64, Vec<u8>>,
    /// Posts waiting for their completion: (qp_num, wr_id) → post time.
    posted: HashMap<(u32, u64), u64>,
    /// Per thread: QPs brought up while the thread is inside a
    /// communicator init/split (they belong to that communicator).
    qps_in_init: HashMap<u32, Vec<u32>>,
    /// GPU-side times of collective instances (deep set).
    gpu: GpuSide,
    /// Threads that issued a collective (the training loop: main, and in
    /// PyTorch DDP the autograd thread whose hooks reduce the buckets).
    issuing: Vec<u32>,
}

#[derive(Debug, Default, Clone)]
struct Qp {
    dest_qp_num: u32,
    dlid: u16,
    posts: u64,
    completions: u64,
    bytes: u64,
    post_to_completion_ns: u64,
    /// Shipped once even without traffic, so the coordinator can join
    /// both ends of the connection (receivers do not post).
    announced: bool,
}

/// Collective-issuing threads remembered per process (a training loop has
/// one or two; more are a thread pool, and the first ones are enough).
const ISSUING_MAX: usize = 8;
/// Communicator snapshots kept per process.
const SNAPSHOTS_MAX: usize = 256;
/// Posts awaiting completion, per process, and QPs per process.
const POSTED_MAX: usize = 65536;
const QPS_MAX: usize = 4096;
/// `IBV_QP_DEST_QPN` in `ibv_modify_qp`'s mask.
const IBV_QP_DEST_QPN: u64 = 1 << 20;
/// Completions the kernel program reports individually per poll_cq return
/// (`WC_PER_POLL` in node-agent-ebpf).
const WC_PER_POLL: u64 = 16;

/// Output of the fold, taken by the batch cutter.
#[derive(Debug, Default)]
pub struct Folded {
    pub ranks: Vec<RankIdentity>,
    pub exits: Vec<RankExit>,
    pub comms: Vec<CommRecord>,
    pub collectives: Vec<CollectiveRecord>,
    pub intervals: Vec<RankInterval>,
    pub links: Vec<LinkRecord>,
}

impl Folded {
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
            && self.exits.is_empty()
            && self.comms.is_empty()
            && self.collectives.is_empty()
            && self.intervals.is_empty()
            && self.links.is_empty()
    }
}

/// The per-host fold.
#[derive(Debug)]
pub struct Folder {
    clock: HostClock,
    limits: Limits,
    /// Probe id → role.
    roles: Vec<Role>,
    procs: HashMap<u32, Proc>,
    out: Folded,
    drops: FoldDrops,
    splits: Vec<SplitPending>,
    /// (pid, comm object, rank, nranks) of communicators made by init, as
    /// evidence for [`crate::commlayout::CommLayout`].
    inits: Vec<(u32, u64, u32, u32)>,
    /// Events from processes in the watched tree that the /proc scan has not
    /// classified yet: replayed when one turns out to be a rank.
    limbo: HashMap<u32, (u64, Vec<RawEvent>)>,
    /// (pid, `ibv_context*`) returned by `ibv_open_device`, for the agent to
    /// find the provider's functions.
    contexts: Vec<(u32, u64)>,
    /// Raw time since when the deep probes are on.
    deep_since: Option<u64>,
    /// Member positions of this host's ranks per communicator.
    local_members: LocalMembers,
    /// Bumped whenever a process's communicator table changes (for the
    /// agent's state file, [`crate::takeover`]).
    comm_changes: u64,
}

impl Folder {
    pub fn new(clock: HostClock, limits: Limits) -> Self {
        Self {
            clock,
            limits,
            roles: Vec::new(),
            procs: HashMap::new(),
            out: Folded::default(),
            drops: FoldDrops::default(),
            splits: Vec::new(),
            inits: Vec::new(),
            limbo: HashMap::new(),
            contexts: Vec::new(),
            deep_since: None,
            local_members: LocalMembers::new(),
            comm_changes: 0,
        }
    }

    /// Changes a communicator table since the start (a new value means the
    /// agent's state file is out of date).
    pub fn comm_changes(&self) -> u64 {
        self.comm_changes
    }

    /// Every followed process's communicator table.
    pub fn comm_tables(&self) -> Vec<crate::takeover::LiveTable> {
        let mut t: Vec<_> = self
            .procs
            .iter()
            .map(|(pid, p)| {
                let mut comms: Vec<_> = p
                    .comms
                    .iter()
                    .map(|(ptr, c)| (*ptr, c.id, c.splits))
                    .collect();
                comms.sort_unstable();
                crate::takeover::LiveTable {
                    pid: *pid,
                    rank: p.rank,
                    comms,
                }
            })
            .collect();
        t.sort_unstable_by_key(|l| l.pid);
        t
    }

    /// Takes over the communicators an earlier agent knew for `saved.pid`
    /// (followed already, [`Folder::add_rank`]): they are named again, their
    /// sequence numbers count from 0, and each is re-announced as
    /// [`CommRecord::resumed`]. Returns how many were taken over.
    pub fn take_over(&mut self, saved: &crate::takeover::SavedProc) -> usize {
        let Some(p) = self.procs.get_mut(&saved.pid) else {
            return 0;
        };
        let mut n = 0;
        for c in &saved.comms {
            if p.comms.contains_key(&c.ptr) || p.comms.len() >= self.limits.comms {
                continue;
            }
            p.comms.insert(
                c.ptr,
                Comm {
                    id: c.comm_id,
                    seq: 0,
                    splits: c.splits,
                },
            );
            self.local_members
                .entry(c.comm_id)
                .or_default()
                .insert(c.rank_in_comm);
            self.out.comms.push(c.record(saved.pid, p.rank));
            n += 1;
        }
        self.comm_changes += 1;
        n
    }

    /// The deep probes (post_send/poll_cq) are attached from raw `now_raw`
    /// on, or were detached.
    pub fn set_deep(&mut self, on: bool, now_raw: u64) {
        match (on, self.deep_since) {
            (true, None) => self.deep_since = Some(now_raw),
            (false, _) => self.deep_since = None,
            _ => return,
        }
        for p in self.procs.values_mut() {
            p.gpu.set_deep(on, now_raw);
        }
    }

    /// Attribution counters summed over the followed ranks.
    pub fn gpuside_stats(&self) -> GpuSideStats {
        let mut s = GpuSideStats::default();
        for p in self.procs.values() {
            s.matched += p.gpu.stats.matched;
            s.unsynced_ops += p.gpu.stats.unsynced_ops;
            s.unmatched_ops += p.gpu.stats.unmatched_ops;
            s.evicted += p.gpu.stats.evicted;
        }
        s
    }

    /// Tells the fold what probe `id` is (ids are dense, in attach order).
    pub fn set_role(&mut self, id: u32, role: Role) {
        let i = id as usize;
        if self.roles.len() <= i {
            self.roles.resize(i + 1, Role::Generic);
        }
        self.roles[i] = role;
    }

    pub fn drops(&self) -> FoldDrops {
        self.drops
    }

    /// A rank process to follow; `now_raw` is raw CLOCK_MONOTONIC.
    pub fn add_rank(&mut self, mut id: RankIdentity, now_raw: u64) {
        id.seen_ns = self.clock.map(now_raw);
        self.procs.insert(
            id.pid,
            Proc {
                rank: id.rank,
                comms: HashMap::new(),
                open: HashMap::new(),
                open_count: 0,
                group_depth: HashMap::new(),
                grouped: HashMap::new(),
                sync_wait_since_coll: 0,
                launches_at_last_coll: 0,
                iv_start: now_raw,
                iv_sync_calls: 0,
                iv_sync_wait: 0,
                iv_launches_base: 0,
                last_launches: 0,
                iv_sched: None,
                qps: HashMap::new(),
                snapshots: HashMap::new(),
                posted: HashMap::new(),
                qps_in_init: HashMap::new(),
                gpu: GpuSide::new(self.clock, self.deep_since),
                issuing: Vec::new(),
            },
        );
        let pid = id.pid;
        self.out.ranks.push(id);
        if let Some((_, held)) = self.limbo.remove(&pid) {
            for ev in &held {
                self.one(ev);
            }
        }
    }

    /// Drops held events of a process that is not ours.
    pub fn forget_limbo(&mut self, pid: u32) {
        self.limbo.remove(&pid);
    }

    /// Forgets held events of processes that were not classified as ranks
    /// within the holding time.
    pub fn expire_limbo(&mut self, now_raw: u64) {
        self.limbo
            .retain(|_, (first, _)| now_raw.saturating_sub(*first) < LIMBO_NS);
    }

    /// A followed rank process ended (seen at raw time `now_raw`).
    pub fn remove_rank(&mut self, pid: u32, now_raw: u64) {
        self.limbo.remove(&pid);
        if self.procs.contains_key(&pid) {
            // The rank's last, partial interval (its scheduler times went
            // with it).
            self.close_interval(pid, now_raw, None);
        }
        if let Some(p) = self.procs.get_mut(&pid) {
            p.gpu.release_all();
            let held = p.gpu.take_released();
            for rec in held {
                push_bounded(&mut self.out.collectives, rec, self.limits, &mut self.drops);
            }
        }
        if let Some(p) = self.procs.remove(&pid) {
            self.comm_changes += 1;
            // Splits with a snapshot can still be read; the others are
            // shipped for the coordinator to work out.
            let (gone, kept): (Vec<SplitPending>, Vec<SplitPending>) =
                std::mem::take(&mut self.splits)
                    .into_iter()
                    .partition(|s| s.pid == pid && s.snapshot.is_none());
            self.splits = kept;
            if !gone.is_empty() {
                tracing::debug!(
                    pid,
                    n = gone.len(),
                    "rank exited before its split communicators could be read: the coordinator works them out"
                );
            }
            self.drops.split_deferred += gone.len() as u64;
            self.out.comms.extend(gone.into_iter().map(|s| s.record));
            self.out.exits.push(RankExit {
                pid,
                rank: p.rank,
                exit_ns: self.clock.map(now_raw),
            });
        }
    }

    /// Folds events (any order; they are sorted by time here).
    pub fn feed(&mut self, events: &mut [RawEvent]) {
        events.sort_by_key(|e| e.call().ts_ns);
        for ev in events.iter() {
            self.one(ev);
        }
    }

    fn one(&mut self, ev: &RawEvent) {
        let c = ev.call();
        let Some(role) = self.roles.get(c.probe as usize).copied() else {
            return;
        };
        if CallKind::from_raw(c.kind) == Some(CallKind::Entry)
            && matches!(role, Role::GroupStart | Role::Coll { .. })
        {
            self.close_lost_group_end(c.pid, c.tid, c.ts_ns);
        }
        let Some(p) = self.procs.get_mut(&c.pid) else {
            if !self.limbo.contains_key(&c.pid) && self.limbo.len() >= LIMBO_PIDS {
                self.drops.limbo += 1;
                return;
            }
            let (_, held) = self
                .limbo
                .entry(c.pid)
                .or_insert_with(|| (c.ts_ns, Vec::new()));
            if held.len() >= LIMBO_EVENTS {
                self.drops.limbo += 1;
            } else {
                held.push(ev.clone());
            }
            return;
        };
        let key = (c.tid, c.probe);
        match role {
            Role::ModifyQp => {
                if p.qps.len() >= QPS_MAX && !p.qps.contains_key(&(c.args[1] as u32)) {
                    self.drops.verbs += 1;
                    return;
                }
                let in_init = p.open.keys().any(|(tid, probe)| {
                    *tid == c.tid
                        && matches!(
                            self.roles.get(*probe as usize),
                            Some(Role::CommInit | Role::CommSplit)
                        )
                });
                if in_init {
                    let v = p.qps_in_init.entry(c.tid).or_default();
                    if !v.contains(&(c.args[1] as u32)) && v.len() < QPS_MAX {
                        v.push(c.args[1] as u32);
                    }
                }
                if c.args[2] & IBV_QP_DEST_QPN != 0 {
                    let q = p.qps.entry(c.args[1] as u32).or_default();
                    q.dest_qp_num = c.args[3] as u32;
                    q.dlid = c.args[4] as u16;
                }
                return;
            }
            Role::PostSend => {
                let qpn = c.args[1] as u32;
                if p.qps.len() >= QPS_MAX && !p.qps.contains_key(&qpn) {
                    self.drops.verbs += 1;
                    return;
                }
                let q = p.qps.entry(qpn).or_default();
                q.posts += 1;
                q.bytes += c.args[2];
                if p.posted.len() >= POSTED_MAX {
                    p.posted.clear();
                    self.drops.verbs += POSTED_MAX as u64;
                }
                p.posted.insert((qpn, c.args[3]), c.ts_ns);
                let cts = crate::gpuside::is_clear_to_send(c.args[4], c.args[5] >> 32);
                p.gpu
                    .post(qpn, c.args[3], c.ts_ns, cts, &self.local_members);
                return;
            }
            Role::PollCq => {
                let qpn = c.args[1] as u32;
                // The kernel reports the first WC_PER_POLL completions of a
                // poll one by one; the rest are counted on the last one's QP.
                let extra = if c.args[5] + 1 == WC_PER_POLL {
                    c.args[4].saturating_sub(WC_PER_POLL)
                } else {
                    0
                };
                p.gpu.completion(qpn, c.args[0], c.ts_ns);
                if let Some(q) = p.qps.get_mut(&qpn) {
                    q.completions += 1 + extra;
                    if let Some(t) = p.posted.remove(&(qpn, c.args[0])) {
                        q.post_to_completion_ns += c.ts_ns.saturating_sub(t);
                    }
                }
                return;
            }
            _ => {}
        }
        match CallKind::from_raw(c.kind) {
            Some(CallKind::Snapshot) => {
                if let RawEvent::Snapshot(snap) = ev {
                    if p.snapshots.len() >= SNAPSHOTS_MAX {
                        p.snapshots.clear();
                    }
                    p.snapshots.insert(c.args[0], snap.bytes.to_vec());
                }
            }
            Some(CallKind::Entry) => {
                if p.open_count >= self.limits.open_calls {
                    // Evict everything open on the busiest key: it is the
                    // one most likely to have lost its returns.
                    if let Some(k) = p.open.iter().max_by_key(|(_, v)| v.len()).map(|(k, _)| *k) {
                        let n = p.open.remove(&k).map_or(0, |v| v.len());
                        p.open_count -= n;
                        self.drops.open_calls += n as u64;
                    }
                }
                let (stack, launches, has_stack) = match ev {
                    RawEvent::Stack(s) => (s.stack, s.launches, true),
                    RawEvent::Call(_) | RawEvent::Snapshot(_) => ([0; STACK_WORDS], 0, false),
                };
                p.open.entry(key).or_default().push(Open {
                    ts: c.ts_ns,
                    args: c.args,
                    stack,
                    launches,
                    has_stack,
                });
                p.open_count += 1;
                if role == Role::GroupStart {
                    *p.group_depth.entry(c.tid).or_insert(0) += 1;
                }
            }
            Some(CallKind::Return) => {
                let Some(open) = p.open.get_mut(&key).and_then(Vec::pop) else {
                    self.drops.orphan_returns += 1;
                    if role == Role::GroupEnd {
                        // Its entry was lost (ring buffer full): the group
                        // still ended, or every later operation of the
                        // thread would wait for it forever.
                        let (pid, ts) = (c.pid, c.ts_ns);
                        let open = Open {
                            ts,
                            args: [0; 6],
                            stack: [0; STACK_WORDS],
                            launches: 0,
                            has_stack: false,
                        };
                        self.finish(pid, c.tid, role, open, ts, c.args, c.ret);
                    }
                    return;
                };
                p.open_count -= 1;
                if p.open.get(&key).is_some_and(Vec::is_empty) {
                    p.open.remove(&key);
                }
                let pid = c.pid;
                self.finish(pid, c.tid, role, open, c.ts_ns, c.args, c.ret);
            }
            None => {}
        }
    }

    /// A thread cannot enter NCCL again while its `ncclGroupEnd` still
    /// runs (GroupEnd calls no public NCCL function), so a GroupEnd still
    /// open at `now` lost its return to a full ring buffer. Without it the
    /// group would hold every later operation of the thread forever; it is
    /// taken to have returned now.
    fn close_lost_group_end(&mut self, pid: u32, tid: u32, now: u64) {
        let roles = &self.roles;
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let keys: Vec<(u32, u32)> = p
            .open
            .keys()
            .filter(|(t, probe)| *t == tid && roles.get(*probe as usize) == Some(&Role::GroupEnd))
            .copied()
            .collect();
        let mut lost = Vec::new();
        for k in keys {
            lost.extend(p.open.remove(&k).unwrap_or_default());
        }
        p.open_count -= lost.len();
        for open in lost {
            self.drops.lost_group_ends += 1;
            self.finish(pid, tid, Role::GroupEnd, open, now, [0; 6], 0);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        pid: u32,
        tid: u32,
        role: Role,
        open: Open,
        ret_ts: u64,
        ret_args: [u64; 6],
        ret: u64,
    ) {
        let clock = self.clock;
        let limits = self.limits;
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let ret32 = ret as u32 as i32;
        match role {
            Role::CommInit => {
                let comm_ptr = ret_args[0];
                // A nested init (…Config forwarding to …InitRank) reports
                // the same communicator twice; the outer return may carry 0.
                if ret32 != 0 || comm_ptr == 0 || !open.has_stack || p.comms.contains_key(&comm_ptr)
                {
                    return;
                }
                if p.comms.len() >= limits.comms {
                    self.drops.comms += 1;
                    return;
                }
                let id = hash_words(&open.stack);
                let qps = p.qps_in_init.remove(&tid).unwrap_or_default();
                if !qps.is_empty() {
                    p.gpu.bind_qps(id, &qps);
                }
                self.local_members
                    .entry(id)
                    .or_default()
                    .insert(open.args[2] as u32);
                p.comms.insert(
                    comm_ptr,
                    Comm {
                        id,
                        seq: 0,
                        splits: 0,
                    },
                );
                self.comm_changes += 1;
                if self.inits.len() < 64 {
                    self.inits
                        .push((pid, comm_ptr, open.args[2] as u32, open.args[1] as u32));
                }
                self.out.comms.push(CommRecord {
                    pid,
                    rank: p.rank,
                    comm_id: id,
                    parent_id: 0,
                    color: 0,
                    nranks: open.args[1] as u32,
                    rank_in_comm: open.args[2] as u32,
                    created_ns: clock.map(ret_ts),
                    split_ordinal: 0,
                    split_key: 0,
                    resumed: false,
                });
            }
            Role::CommSplit => {
                let Some(parent) = p.comms.get_mut(&open.args[0]) else {
                    self.drops.unknown_comm += 1;
                    return;
                };
                let ordinal = parent.splits;
                parent.splits += 1;
                self.comm_changes += 1;
                let parent_id = parent.id;
                let color = open.args[1] as u32 as i32;
                let comm_ptr = ret_args[0];
                let qps = p.qps_in_init.remove(&tid).unwrap_or_default();
                if ret32 != 0 {
                    return;
                }
                if color < 0 || comm_ptr == 0 {
                    // NCCL_SPLIT_NOCOLOR: this member takes part in the
                    // split but joins no communicator. Said anyway: the
                    // coordinator counts every member of the parent before
                    // it works out the sizes of splits agents could not read.
                    self.out.comms.push(CommRecord {
                        pid,
                        rank: p.rank,
                        comm_id: 0,
                        parent_id,
                        color: -1,
                        nranks: 0,
                        rank_in_comm: 0,
                        created_ns: clock.map(ret_ts),
                        split_ordinal: ordinal as u32,
                        split_key: open.args[2] as u32 as i32,
                        resumed: false,
                    });
                    return;
                }
                if p.comms.len() >= limits.comms {
                    self.drops.comms += 1;
                    return;
                }
                let id = hash_words(&[parent_id, ordinal, color as u32 as u64]);
                if !qps.is_empty() {
                    p.gpu.bind_qps(id, &qps);
                }
                p.comms.insert(
                    comm_ptr,
                    Comm {
                        id,
                        seq: 0,
                        splits: 0,
                    },
                );
                // nranks and the position come from the split's peers; the
                // agent resolves them from the communicator object
                // (resolve_split) before shipping.
                self.splits.push(SplitPending {
                    pid,
                    comm_ptr,
                    record: CommRecord {
                        pid,
                        rank: p.rank,
                        comm_id: id,
                        parent_id,
                        color,
                        nranks: 0,
                        rank_in_comm: 0,
                        created_ns: clock.map(ret_ts),
                        split_ordinal: ordinal as u32,
                        split_key: open.args[2] as u32 as i32,
                        resumed: false,
                    },
                    snapshot: None,
                });
            }
            Role::CommDestroy => {
                p.comms.remove(&open.args[0]);
                self.comm_changes += 1;
            }
            Role::Coll { op, args } => {
                if !p.issuing.contains(&tid) && p.issuing.len() < ISSUING_MAX {
                    p.issuing.push(tid);
                }
                let comm_ptr = loc(&open, args.comm);
                let Some(comm) = p.comms.get_mut(&comm_ptr) else {
                    self.drops.unknown_comm += 1;
                    return;
                };
                let (seq, comm_id) = (comm.seq, comm.id);
                comm.seq += 1;
                let rec = collective(
                    &clock, pid, p, comm_id, seq, op, &args, &open, ret_ts, ret32,
                );
                let stale = p
                    .grouped
                    .get(&tid)
                    .and_then(|g| g.first())
                    .is_some_and(|g| open.ts.saturating_sub(g.1) > GROUP_HOLD_NS);
                if stale {
                    // Both ends of its GroupEnd were lost: launch what the
                    // group held (at its own host exit) and start afresh.
                    self.drops.lost_group_ends += 1;
                    for (rec, entry) in p.end_group(tid) {
                        if let Some(rec) = p.gpu.issue(rec, entry, &self.local_members) {
                            push_bounded(&mut self.out.collectives, rec, limits, &mut self.drops);
                        }
                    }
                }
                if p.group_depth.get(&tid).copied().unwrap_or(0) > 0 {
                    p.grouped.entry(tid).or_default().push((rec, open.ts));
                } else if let Some(rec) = p.gpu.issue(rec, open.ts, &self.local_members) {
                    push_bounded(&mut self.out.collectives, rec, limits, &mut self.drops);
                }
            }
            Role::GroupStart => {}
            Role::GroupEnd => {
                let depth = p.group_depth.entry(tid).or_insert(0);
                *depth = depth.saturating_sub(1);
                if *depth == 0 {
                    // The group's operations are launched now.
                    for (mut rec, entry) in p.end_group(tid) {
                        rec.host_exit_ns = clock.map(ret_ts);
                        if let Some(rec) = p.gpu.issue(rec, entry, &self.local_members) {
                            push_bounded(&mut self.out.collectives, rec, limits, &mut self.drops);
                        }
                    }
                }
            }
            Role::Sync | Role::DeviceSync => {
                if role == Role::DeviceSync {
                    p.gpu.device_sync(open.ts, ret_ts);
                }
                let wait = ret_ts.saturating_sub(open.ts);
                p.sync_wait_since_coll += wait;
                p.iv_sync_calls += 1;
                p.iv_sync_wait += wait;
            }
            Role::VerbsOpen => {
                if ret != 0 && self.contexts.len() < 1024 {
                    self.contexts.push((pid, ret));
                }
            }
            Role::Count | Role::Generic | Role::ModifyQp | Role::PostSend | Role::PollCq => {}
        }
    }

    /// Verbs contexts opened since the last call.
    /// (pid, tid) of every thread seen issuing a collective: the training
    /// threads a flame diff is built around.
    pub fn issuing_threads(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .procs
            .iter()
            .flat_map(|(pid, p)| p.issuing.iter().map(move |t| (*pid, *t)))
            .collect();
        v.sort_unstable();
        v
    }

    pub fn take_contexts(&mut self) -> Vec<(u32, u64)> {
        std::mem::take(&mut self.contexts)
    }

    /// Number of QPs mapped to a peer so far for `pid` (doctor, tests).
    pub fn qp_peers(&self, pid: u32) -> Vec<(u32, u32, u16)> {
        self.procs.get(&pid).map_or_else(Vec::new, |p| {
            p.qps
                .iter()
                .filter(|(_, q)| q.dest_qp_num != 0)
                .map(|(n, q)| (*n, q.dest_qp_num, q.dlid))
                .collect()
        })
    }

    /// The kernel's snapshot of the object at `addr` in `pid`, if any.
    pub fn snapshot(&self, pid: u32, addr: u64) -> Option<&[u8]> {
        self.procs
            .get(&pid)?
            .snapshots
            .get(&addr)
            .map(Vec::as_slice)
    }

    /// Gives pending splits the kernel's snapshot of their object.
    pub fn fill_split_snapshots(&mut self) {
        for s in &mut self.splits {
            if s.snapshot.is_none() {
                s.snapshot = self
                    .procs
                    .get(&s.pid)
                    .and_then(|p| p.snapshots.get(&s.comm_ptr))
                    .cloned();
            }
        }
    }

    /// Communicators made by init since the last call (layout evidence).
    pub fn take_inits(&mut self) -> Vec<(u32, u64, u32, u32)> {
        std::mem::take(&mut self.inits)
    }

    /// Splits waiting for their member position and size.
    pub fn pending_splits(&mut self) -> &mut [SplitPending] {
        &mut self.splits
    }

    /// Completes a pending split with what was read from the communicator
    /// (`None`: give up, counted).
    pub fn resolve_split(&mut self, pid: u32, comm_ptr: u64, found: Option<(u32, u32)>) {
        let Some(i) = self
            .splits
            .iter()
            .position(|s| s.pid == pid && s.comm_ptr == comm_ptr)
        else {
            return;
        };
        let mut s = self.splits.remove(i);
        self.comm_changes += 1;
        match found {
            Some((rank_in_comm, nranks)) => {
                self.local_members
                    .entry(s.record.comm_id)
                    .or_default()
                    .insert(rank_in_comm);
                s.record.rank_in_comm = rank_in_comm;
                s.record.nranks = nranks;
                self.out.comms.push(s.record);
            }
            // Shipped with no size: the coordinator works it out from
            // every member's color and key.
            None => {
                self.drops.split_deferred += 1;
                self.out.comms.push(s.record);
            }
        }
    }

    /// Feeds the in-kernel launch counters (read from `CUDA_COUNTS`).
    pub fn launch_counts(&mut self, counts: &[(u32, [u64; cuda_count::SLOTS])]) {
        for (pid, c) in counts {
            if let Some(p) = self.procs.get_mut(pid) {
                p.last_launches =
                    c[cuda_count::LAUNCH as usize] + c[cuda_count::GRAPH_LAUNCH as usize];
            }
        }
    }

    /// Closes the current interval of every rank at raw time `now_raw`.
    /// Closes every rank's interval; `sched` reads a rank's scheduler
    /// times now (None: gone or unreadable, the interval reports none).
    pub fn close_intervals(&mut self, now_raw: u64, sched: impl Fn(u32) -> Option<SchedStat>) {
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            let s = sched(pid);
            self.close_interval(pid, now_raw, s);
        }
    }

    fn close_interval(&mut self, pid: u32, now_raw: u64, sched: Option<SchedStat>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.gpu.expire(now_raw);
            let launches = p.last_launches.saturating_sub(p.iv_launches_base);
            let split = match (p.iv_sched, sched) {
                (Some(a), Some(b)) => {
                    SchedDelta::over(now_raw.saturating_sub(p.iv_start), b.since(&a))
                }
                _ => SchedDelta::default(),
            };
            p.iv_sched = sched;
            self.out.intervals.push(RankInterval {
                pid,
                rank: p.rank,
                start_ns: self.clock.map(p.iv_start),
                end_ns: self.clock.map(now_raw),
                launches,
                launch_ns: 0,
                sync_calls: p.iv_sync_calls,
                sync_wait_ns: p.iv_sync_wait,
                oncpu_ns: split.oncpu_ns,
                runq_delay_ns: split.runq_ns,
                offcpu_ns: split.offcpu_ns,
                // Cost and counted time: filled by the agent (`selfcost`).
                ..RankInterval::default()
            });
            for (&qp_num, q) in &mut p.qps {
                let announce = !q.announced && q.dest_qp_num != 0;
                if q.posts == 0 && q.completions == 0 && !announce {
                    continue;
                }
                q.announced |= q.dest_qp_num != 0;
                self.out.links.push(LinkRecord {
                    pid,
                    rank: p.rank,
                    // The remote end runs on another host: named by joining
                    // both ends' QP numbers
                    // (`slowrank_shared::links::resolve_peer_ranks`).
                    peer_rank: -1,
                    qp_num,
                    dest_qp_num: q.dest_qp_num,
                    start_ns: self.clock.map(p.iv_start),
                    end_ns: self.clock.map(now_raw),
                    posts: q.posts,
                    completions: q.completions,
                    post_to_completion_ns: q.post_to_completion_ns,
                    bytes: q.bytes,
                    dlid: u32::from(q.dlid),
                });
                q.posts = 0;
                q.completions = 0;
                q.bytes = 0;
                q.post_to_completion_ns = 0;
            }
            p.iv_start = now_raw;
            p.iv_launches_base = p.last_launches;
            p.iv_sync_calls = 0;
            p.iv_sync_wait = 0;
        }
    }

    /// Takes everything folded so far.
    pub fn take(&mut self) -> Folded {
        let mut released = false;
        for p in self.procs.values_mut() {
            for rec in p.gpu.take_released() {
                released = true;
                push_bounded(&mut self.out.collectives, rec, self.limits, &mut self.drops);
            }
        }
        if released {
            // Held records (waiting for GPU-side times) come out after newer
            // ones that were not held (the deep window closed meanwhile);
            // the coordinator wants each rank's records in issue order, and
            // rejects a sequence number that goes backwards. Stable, so
            // records of equal entry time keep their order.
            self.out.collectives.sort_by_key(|r| r.host_entry_ns);
        }
        std::mem::take(&mut self.out)
    }
}

fn push_bounded(
    v: &mut Vec<CollectiveRecord>,
    rec: CollectiveRecord,
    limits: Limits,
    drops: &mut FoldDrops,
) {
    if v.len() >= limits.pending_records {
        drops.records += 1;
    } else {
        v.push(rec);
    }
}

#[allow(clippy::too_many_arguments)]
fn collective(
    clock: &HostClock,
    pid: u32,
    p: &mut Proc,
    comm_id: u64,
    seq: u64,
    op: CollOp,
    args: &CollArgs,
    open: &Open,
    ret_ts: u64,
    ret: i32,
) -> CollectiveRecord {
    let count = loc(open, args.count);
    let bytes = dtype_size(loc(open, args.dtype)).map_or(0, |s| s.saturating_mul(count));
    let peer = match (op, args.peer) {
        (CollOp::Send | CollOp::Recv, Some(l)) => loc(open, l) as u32 as i32,
        _ => -1,
    };
    let launches = open.launches.saturating_sub(p.launches_at_last_coll);
    p.launches_at_last_coll = open.launches;
    p.last_launches = p.last_launches.max(open.launches);
    CollectiveRecord {
        pid,
        rank: p.rank,
        comm_id,
        seq,
        op,
        bytes,
        peer,
        host_entry_ns: clock.map(open.ts),
        host_exit_ns: clock.map(ret_ts),
        gpu_arrive_ns: 0,
        gpu_done_ns: 0,
        launches_before: launches.min(u64::from(u32::MAX)) as u32,
        sync_wait_ns_before: std::mem::take(&mut p.sync_wait_since_coll),
        gpu_busy_before_ns: None,
        ret,
    }
}

fn loc(open: &Open, l: Loc) -> u64 {
    match l {
        Loc::Reg(i) => open.args.get(i as usize).copied().unwrap_or(0),
        Loc::Stack(i) => open.stack.get(i as usize).copied().unwrap_or(0),
    }
}

/// FNV-1a over 64-bit words: stable across agents and builds, which is all a
/// communicator id needs (every member hashes the same bytes). Never 0.
pub fn hash_words(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::default_set;
    use crate::discover::LibKind;
    use slowrank_shared::probe::{CallEvent, StackEvent};

    fn folder() -> (Folder, HashMap<&'static str, u32>) {
        let mut f = Folder::new(HostClock::real(), Limits::default());
        let mut ids = HashMap::new();
        for (i, s) in default_set(LibKind::Nccl)
            .iter()
            .chain(default_set(LibKind::Cudart))
            .enumerate()
        {
            f.set_role(i as u32, s.role);
            ids.insert(s.symbol, i as u32);
        }
        f.add_rank(
            RankIdentity {
                pid: 10,
                rank: 3,
                world_size: 4,
                local_rank: 3,
                local_world_size: 4,
                group_rank: 0,
                restart_count: 0,
                job_id: String::new(),
                seen_ns: 0,
            },
            0,
        );
        (f, ids)
    }

    fn call(ts: u64, probe: u32, kind: CallKind, args: [u64; 6], ret: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            pid: 10,
            tid: 11,
            probe,
            kind: kind as u32,
            args,
            ret,
        }
    }

    #[test]
    fn intervals_carry_the_scheduler_split_from_their_second_on() {
        let (mut f, _) = folder();
        let at = |on: u64, runq: u64| {
            move |pid: u32| {
                (pid == 10).then_some(SchedStat {
                    oncpu_ns: on,
                    runq_ns: runq,
                })
            }
        };
        // The first close only takes the baseline: nothing measured yet.
        f.close_intervals(1_000_000_000, at(5_000_000, 1_000_000));
        // 200 ms later: 30 ms on a CPU, 10 ms runnable, the rest asleep.
        f.close_intervals(1_200_000_000, at(35_000_000, 11_000_000));
        // Gone: its interval carries no split rather than a wrong one.
        f.close_intervals(1_400_000_000, |_| None);
        let iv = f.take().intervals;
        assert_eq!(iv.len(), 3);
        assert_eq!(
            (iv[0].oncpu_ns, iv[0].runq_delay_ns, iv[0].offcpu_ns),
            (0, 0, 0)
        );
        assert_eq!(
            (iv[1].oncpu_ns, iv[1].runq_delay_ns, iv[1].offcpu_ns),
            (30_000_000, 10_000_000, 160_000_000)
        );
        assert_eq!(
            (iv[2].oncpu_ns, iv[2].runq_delay_ns, iv[2].offcpu_ns),
            (0, 0, 0)
        );
    }

    #[test]
    fn init_then_allreduces_get_sequence_numbers_bytes_and_waits() {
        let (mut f, ids) = folder();
        let uid = [7u64; STACK_WORDS];
        let mut ev = vec![
            RawEvent::Stack(StackEvent {
                call: call(
                    100,
                    ids["ncclCommInitRank"],
                    CallKind::Entry,
                    [0x1000, 4, 3, 0, 0, 0],
                    0,
                ),
                launches: 0,
                stack: uid,
            }),
            RawEvent::Call(call(
                200,
                ids["ncclCommInitRank"],
                CallKind::Return,
                [0xc0, 0x1000, 0, 0, 0, 0],
                0,
            )),
            RawEvent::Call(call(
                300,
                ids["cudaStreamSynchronize"],
                CallKind::Entry,
                [0; 6],
                0,
            )),
            RawEvent::Call(call(
                800,
                ids["cudaStreamSynchronize"],
                CallKind::Return,
                [0; 6],
                0,
            )),
        ];
        for (i, t) in [1000u64, 2000].iter().enumerate() {
            let mut stack = [0u64; STACK_WORDS];
            stack[0] = 0x5; // stream
            ev.push(RawEvent::Stack(StackEvent {
                // count 1024 bf16 on comm 0xc0
                call: call(
                    *t,
                    ids["ncclAllReduce"],
                    CallKind::Entry,
                    [1, 2, 1024, 9, 0, 0xc0],
                    0,
                ),
                launches: 10 * (i as u64 + 1),
                stack,
            }));
            ev.push(RawEvent::Call(call(
                t + 50,
                ids["ncclAllReduce"],
                CallKind::Return,
                [0; 6],
                0,
            )));
        }
        f.feed(&mut ev);
        let out = f.take();
        assert_eq!(out.comms.len(), 1);
        assert_eq!((out.comms[0].nranks, out.comms[0].rank_in_comm), (4, 3));
        assert_eq!(out.comms[0].comm_id, hash_words(&uid));
        let c = &out.collectives;
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].seq, c[1].seq), (0, 1));
        assert_eq!(c[0].bytes, 2048);
        assert_eq!((c[0].host_entry_ns, c[0].host_exit_ns), (1000, 1050));
        assert_eq!(c[0].sync_wait_ns_before, 500);
        assert_eq!(c[1].sync_wait_ns_before, 0);
        assert_eq!((c[0].launches_before, c[1].launches_before), (10, 10));
        assert!(c
            .iter()
            .all(|r| r.comm_id == out.comms[0].comm_id && r.rank == 3 && r.peer == -1));
    }

    #[test]
    fn the_threads_that_issue_collectives_are_known() {
        let (mut f, ids) = folder();
        let uid = [7u64; STACK_WORDS];
        let init = |ts, kind, args| call(ts, ids["ncclCommInitRank"], kind, args, 0);
        let mut ev = vec![
            RawEvent::Stack(StackEvent {
                call: init(100, CallKind::Entry, [0x1000, 4, 3, 0, 0, 0]),
                launches: 0,
                stack: uid,
            }),
            RawEvent::Call(init(200, CallKind::Return, [0xc0, 0x1000, 0, 0, 0, 0])),
        ];
        // The second all-reduce comes from another thread (DDP's autograd
        // hooks); a sync on a third thread issues no collective.
        for (t, tid) in [(1000u64, 10u32), (2000, 11)] {
            let mut entry = call(
                t,
                ids["ncclAllReduce"],
                CallKind::Entry,
                [1, 2, 1024, 9, 0, 0xc0],
                0,
            );
            entry.tid = tid;
            let mut ret = call(t + 50, ids["ncclAllReduce"], CallKind::Return, [0; 6], 0);
            ret.tid = tid;
            ev.push(RawEvent::Stack(StackEvent {
                call: entry,
                launches: 0,
                stack: [0; STACK_WORDS],
            }));
            ev.push(RawEvent::Call(ret));
        }
        let mut sync = call(
            3000,
            ids["cudaStreamSynchronize"],
            CallKind::Entry,
            [0; 6],
            0,
        );
        sync.tid = 12;
        ev.push(RawEvent::Call(sync));
        f.feed(&mut ev);
        assert_eq!(f.take().collectives.len(), 2);
        assert_eq!(f.issuing_threads(), vec![(10, 10), (10, 11)]);
        f.remove_rank(10, 4000);
        assert!(f.issuing_threads().is_empty());
    }

    #[test]
    fn a_taken_over_communicator_names_its_collectives_again() {
        let (mut f, ids) = folder();
        let allreduce = |t: u64| {
            let mut stack = [0u64; STACK_WORDS];
            stack[0] = 0x5;
            vec![
                RawEvent::Stack(StackEvent {
                    call: call(
                        t,
                        ids["ncclAllReduce"],
                        CallKind::Entry,
                        [1, 2, 1024, 9, 0, 0xc0],
                        0,
                    ),
                    launches: 0,
                    stack,
                }),
                RawEvent::Call(call(
                    t + 50,
                    ids["ncclAllReduce"],
                    CallKind::Return,
                    [0; 6],
                    0,
                )),
            ]
        };
        // Before: a pointer this agent never saw created.
        f.feed(&mut allreduce(1000));
        assert_eq!(f.drops().unknown_comm, 1);
        let before = f.comm_changes();
        let saved = crate::takeover::SavedProc {
            pid: 10,
            start_ticks: 1,
            rank: 3,
            comms: vec![crate::takeover::SavedComm {
                ptr: 0xc0,
                splits: 2,
                comm_id: 0xabc,
                parent_id: 0,
                color: 0,
                nranks: 4,
                rank_in_comm: 3,
                created_ns: 5,
                split_ordinal: 0,
                split_key: 0,
            }],
        };
        assert_eq!(f.take_over(&saved), 1);
        assert!(f.comm_changes() > before, "the state file is rewritten");
        assert_eq!(f.take_over(&saved), 0, "taken over once");
        f.feed(&mut allreduce(2000));
        f.feed(&mut allreduce(3000));
        let out = f.take();
        assert_eq!(out.comms.len(), 1);
        assert!(out.comms[0].resumed);
        assert_eq!((out.comms[0].comm_id, out.comms[0].rank), (0xabc, 3));
        let seqs: Vec<(u64, u64)> = out.collectives.iter().map(|c| (c.comm_id, c.seq)).collect();
        assert_eq!(seqs, vec![(0xabc, 0), (0xabc, 1)]);
        let t = f.comm_tables();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].comms, vec![(0xc0, 0xabc, 2)]);
    }

    #[test]
    fn unknown_comm_and_orphans_are_counted_and_state_is_bounded() {
        let (mut f, ids) = folder();
        f.limits.open_calls = 8;
        let mut ev: Vec<RawEvent> = (0..100)
            .map(|i| RawEvent::Call(call(i, ids["ncclGroupStart"], CallKind::Entry, [0; 6], 0)))
            .collect();
        ev.push(RawEvent::Call(call(
            500,
            ids["ncclSend"],
            CallKind::Return,
            [0; 6],
            0,
        )));
        ev.push(RawEvent::Stack(StackEvent {
            call: call(
                600,
                ids["ncclAllReduce"],
                CallKind::Entry,
                [1, 2, 4, 7, 0, 0xdead],
                0,
            ),
            launches: 0,
            stack: [0; STACK_WORDS],
        }));
        ev.push(RawEvent::Call(call(
            700,
            ids["ncclAllReduce"],
            CallKind::Return,
            [0; 6],
            0,
        )));
        f.feed(&mut ev);
        let d = f.drops();
        assert!(d.open_calls >= 90, "{d:?}");
        assert_eq!(d.orphan_returns, 1);
        assert_eq!(d.unknown_comm, 1);
        assert!(f.procs[&10].open_count <= 8);
    }

    /// Init on comm 0xc0, then a grouped send whose GroupEnd lost its
    /// return (`end_entry`: its entry arrived) or both its ends, then an
    /// all-reduce `gap` ns later.
    fn group_with_lost_end(end_entry: bool, gap: u64) -> (Folded, FoldDrops) {
        let (mut f, ids) = folder();
        let stack = |t: u64, name: &str, args: [u64; 6], words: [u64; STACK_WORDS]| {
            RawEvent::Stack(StackEvent {
                call: call(t, ids[name], CallKind::Entry, args, 0),
                launches: 0,
                stack: words,
            })
        };
        let ret = |t: u64, name: &str, args: [u64; 6]| {
            RawEvent::Call(call(t, ids[name], CallKind::Return, args, 0))
        };
        let mut ev = vec![
            stack(
                100,
                "ncclCommInitRank",
                [0x1000, 4, 3, 0, 0, 0],
                [7; STACK_WORDS],
            ),
            ret(200, "ncclCommInitRank", [0xc0, 0x1000, 0, 0, 0, 0]),
            RawEvent::Call(call(
                1000,
                ids["ncclGroupStart"],
                CallKind::Entry,
                [0; 6],
                0,
            )),
            ret(1010, "ncclGroupStart", [0; 6]),
            // ncclSend(buf, count, type, peer, comm, stream)
            stack(1100, "ncclSend", [1, 1024, 7, 2, 0xc0, 5], [0; STACK_WORDS]),
            ret(1150, "ncclSend", [0; 6]),
        ];
        if end_entry {
            ev.push(RawEvent::Call(call(
                1200,
                ids["ncclGroupEnd"],
                CallKind::Entry,
                [0; 6],
                0,
            )));
        }
        let t = 1300 + gap;
        ev.push(stack(
            t,
            "ncclAllReduce",
            [1, 2, 1024, 9, 0, 0xc0],
            [5; STACK_WORDS],
        ));
        ev.push(ret(t + 50, "ncclAllReduce", [0; 6]));
        f.feed(&mut ev);
        let d = f.drops();
        (f.take(), d)
    }

    #[test]
    fn a_lost_group_end_return_does_not_hold_the_thread_forever() {
        let (out, d) = group_with_lost_end(true, 0);
        let ops: Vec<(CollOp, u64)> = out.collectives.iter().map(|r| (r.op, r.seq)).collect();
        assert_eq!(ops, [(CollOp::Send, 0), (CollOp::AllReduce, 1)], "{d:?}");
        assert_eq!(d.lost_group_ends, 1);
        // The send was launched when the thread entered NCCL again.
        assert_eq!(out.collectives[0].host_exit_ns, 1300);
    }

    #[test]
    fn a_group_whose_end_was_lost_entirely_is_released_after_the_hold() {
        let (out, d) = group_with_lost_end(false, 1_000_000);
        assert!(out.collectives.is_empty(), "a short group is still open");
        assert_eq!(d.lost_group_ends, 0);
        let (out, d) = group_with_lost_end(false, GROUP_HOLD_NS + 1);
        let ops: Vec<CollOp> = out.collectives.iter().map(|r| r.op).collect();
        assert_eq!(ops, [CollOp::Send, CollOp::AllReduce]);
        assert_eq!(d.lost_group_ends, 1);
    }

    #[test]
    fn split_ids_depend_on_parent_ordinal_and_color() {
        let a = hash_words(&[5, 0, 1]);
        assert_ne!(a, hash_words(&[5, 1, 1]));
        assert_ne!(a, hash_words(&[5, 0, 2]));
        assert_eq!(a, hash_words(&[5, 0, 1]));
    }
}

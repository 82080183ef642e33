//! GPU-side arrival and completion of collective instances, from the verbs
//! data path (deep set).
//!
//! A collective call only enqueues (Trap 1); the moment a rank's *GPU*
//! reached an instance is when its proxy posts the instance's first chunk.
//! This module attributes provider `post_send`/`poll_cq` events of one rank
//! process to its `(communicator, sequence)` instances:
//!
//! - **QP → communicator**: a QP brought up (`ibv_modify_qp`) on a thread
//!   while that thread is inside `ncclCommInitRank*`/`ncclCommSplit`
//!   belongs to the communicator that call returns (the fold binds them).
//! - **Op boundaries**: a post whose chunk index (`wr_id & 0xffff`) is 0
//!   starts a new network op on that QP (stand-in convention, see
//!   `docs/agent.md`).
//! - **Op → instance**: a communicator's instances run on the GPU in issue
//!   order, one after another, so its ops (over all of its QPs) start in
//!   that order too. A new op on QP `q` of communicator `C` belongs to the
//!   first instance of `C`, not before the last one already matched, that
//!   the host had issued by then and that can use `q`: a collective, or a
//!   send to a member on another host (a QP that carried a send to `p`
//!   only carries sends to `p` afterwards; one that carried collectives,
//!   only collectives — NCCL keeps p2p and ring connections apart).
//! - **Receives**: a receiver's GPU arrival is its clear-to-send, an inline
//!   RDMA write into the sender's FIFO ([`is_clear_to_send`]); it matches
//!   the first receive of `C` from the QP's peer, counted apart from the
//!   QP's data ops. A receive's end is not seen (no post): done stays 0.
//! - **Sync anchor**: counting only works from a known point. After the deep
//!   probes are attached, the first `cudaDeviceSynchronize` that returns
//!   proves every instance issued before the call is done; QPs count from
//!   the first instance issued after it. A deep window that opens mid-job
//!   thus starts attributing at the next device sync.
//! - **Done**: the last completion polled for the instance's ops, reported
//!   only when the instance is provably over (a later instance of the same
//!   communicator started on the NIC, or a device sync covering it
//!   returned); otherwise 0.
//!
//! Records of instances issued while the deep set is on are held here until
//! their times are known (bounded in count and age), then released.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use slowrank_shared::wire::{CollOp, CollectiveRecord};

use crate::clock::HostClock;

/// Per communicator: the member positions of the ranks on this host (sends
/// to them go over NVLink, not the NIC).
pub type LocalMembers = HashMap<u64, HashSet<u32>>;

/// Records held per process before the oldest are released without times.
pub const MAX_HELD: usize = 8192;
/// Longest a record is held (raw ns after its host entry).
pub const HOLD_NS: u64 = 2_000_000_000;
/// Posts remembered per process for completion matching.
const MAX_POSTED: usize = 65536;
/// Recent (entry, seq) per communicator kept for sync anchors.
const RECENT: usize = 256;

/// What a QP was seen to carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Unknown,
    Coll,
    Send(i32),
}

#[derive(Debug)]
struct Held {
    rec: CollectiveRecord,
    entry_raw: u64,
    arrive: Option<u64>,
    last_wc: Option<u64>,
}

#[derive(Debug, Default)]
struct CommTrack {
    held: BTreeMap<u64, Held>,
    /// Highest sequence number matched to an op on any QP.
    frontier: Option<u64>,
    /// Sequence numbers below are done (sync anchor).
    floor: u64,
    /// (host entry raw, seq) of the latest instances issued.
    recent: VecDeque<(u64, u64)>,
    qps: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Op {
    serial: u64,
    start: u64,
    last_wc: Option<u64>,
    seq: Option<u64>,
}

#[derive(Debug)]
struct QpTrack {
    comm: u64,
    synced: bool,
    next_seq: u64,
    class: Class,
    cur: Option<Op>,
    /// The member at the other end, once a send or a receive told it.
    peer: Option<i32>,
    /// Receives before this one already had their clear-to-send.
    next_recv: u64,
    /// A clear-to-send (raw time) whose receive the host had not issued yet.
    pending_cts: Option<u64>,
}

/// Counters for `doctor` and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GpuSideStats {
    /// Ops matched to an instance.
    pub matched: u64,
    /// Ops that started on a QP not (yet) synced or not bound to a communicator.
    pub unsynced_ops: u64,
    /// Ops that never found an instance.
    pub unmatched_ops: u64,
    /// Records released early because too many were held.
    pub evicted: u64,
}

/// Per rank process attribution state.
#[derive(Debug)]
pub struct GpuSide {
    clock: HostClock,
    /// Raw time since when the deep probes have been on, if they are.
    deep_since: Option<u64>,
    comms: HashMap<u64, CommTrack>,
    qps: HashMap<u32, QpTrack>,
    posted: HashMap<(u32, u64), u64>,
    next_serial: u64,
    held: usize,
    released: Vec<CollectiveRecord>,
    pub stats: GpuSideStats,
}

impl GpuSide {
    pub fn new(clock: HostClock, deep_since: Option<u64>) -> Self {
        Self {
            clock,
            deep_since,
            comms: HashMap::new(),
            qps: HashMap::new(),
            posted: HashMap::new(),
            next_serial: 0,
            held: 0,
            released: Vec::new(),
            stats: GpuSideStats::default(),
        }
    }

    /// The deep probes went on (at raw `now`) or off. Off forgets where the
    /// QPs were (posts are no longer seen) and releases what is held.
    pub fn set_deep(&mut self, on: bool, now: u64) {
        if on {
            self.deep_since.get_or_insert(now);
            return;
        }
        self.deep_since = None;
        for q in self.qps.values_mut() {
            q.synced = false;
            q.cur = None;
            q.pending_cts = None;
        }
        self.release_all();
    }

    /// QPs brought up while communicator `comm` was being created.
    pub fn bind_qps(&mut self, comm: u64, qpns: &[u32]) {
        let c = self.comms.entry(comm).or_default();
        for &n in qpns {
            if !c.qps.contains(&n) {
                c.qps.push(n);
            }
            self.qps.insert(
                n,
                QpTrack {
                    comm,
                    synced: false,
                    next_seq: 0,
                    class: Class::Unknown,
                    cur: None,
                    peer: None,
                    next_recv: 0,
                    pending_cts: None,
                },
            );
        }
    }

    /// A new instance (host entry at raw `entry_raw`). Returns the record
    /// when it is not held (deep set off, or no QP on its communicator).
    pub fn issue(
        &mut self,
        rec: CollectiveRecord,
        entry_raw: u64,
        local: &LocalMembers,
    ) -> Option<CollectiveRecord> {
        let Some(c) = self.comms.get_mut(&rec.comm_id) else {
            return Some(rec);
        };
        if c.recent.len() >= RECENT {
            c.recent.pop_front();
        }
        c.recent.push_back((entry_raw, rec.seq));
        if self.deep_since.is_none() || rec.seq < c.floor {
            return Some(rec);
        }
        let comm = rec.comm_id;
        c.held.insert(
            rec.seq,
            Held {
                rec,
                entry_raw,
                arrive: None,
                last_wc: None,
            },
        );
        self.held += 1;
        if self.held > MAX_HELD {
            self.evict_oldest();
        }
        // An op may have started before the host call returned.
        let qps = self
            .comms
            .get(&comm)
            .map(|c| c.qps.clone())
            .unwrap_or_default();
        for q in qps {
            let Some(t) = self.qps.get(&q) else { continue };
            let (waiting_op, waiting_cts) = (
                t.cur.is_some_and(|o| o.seq.is_none()),
                t.pending_cts.is_some(),
            );
            if waiting_op {
                self.try_match(q, local);
            }
            if waiting_cts {
                self.try_match_cts(q, local);
            }
        }
        None
    }

    /// The provider's post_send on `qpn` at raw `ts`; `cts`: it is a
    /// receiver's clear-to-send (see [`is_clear_to_send`]), not data.
    pub fn post(&mut self, qpn: u32, wr_id: u64, ts: u64, cts: bool, local: &LocalMembers) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if cts {
            if !q.synced {
                self.stats.unsynced_ops += 1;
                return;
            }
            if q.pending_cts.is_some() {
                self.stats.unmatched_ops += 1;
            }
            q.pending_cts = Some(ts);
            self.try_match_cts(qpn, local);
            return;
        }
        if wr_id & 0xffff == 0 {
            if let Some(old) = q.cur {
                if old.seq.is_none() && q.synced {
                    self.stats.unmatched_ops += 1;
                }
            }
            if !q.synced {
                q.cur = None;
                self.stats.unsynced_ops += 1;
                return;
            }
            self.next_serial += 1;
            q.cur = Some(Op {
                serial: self.next_serial,
                start: ts,
                last_wc: None,
                seq: None,
            });
            self.try_match(qpn, local);
        }
        let Some(q) = self.qps.get(&qpn) else { return };
        if let Some(op) = q.cur {
            if self.posted.len() >= MAX_POSTED {
                self.posted.clear();
            }
            self.posted.insert((qpn, wr_id), op.serial);
        }
    }

    /// A completion of `(qpn, wr_id)` polled at raw `ts`.
    pub fn completion(&mut self, qpn: u32, wr_id: u64, ts: u64) {
        let Some(serial) = self.posted.remove(&(qpn, wr_id)) else {
            return;
        };
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(op) = q.cur.as_mut().filter(|o| o.serial == serial) else {
            return;
        };
        op.last_wc = Some(op.last_wc.map_or(ts, |w| w.max(ts)));
        if let Some(seq) = op.seq {
            if let Some(h) = self
                .comms
                .get_mut(&q.comm)
                .and_then(|c| c.held.get_mut(&seq))
            {
                h.last_wc = Some(h.last_wc.map_or(ts, |w| w.max(ts)));
            }
        }
    }

    /// `cudaDeviceSynchronize` called at raw `call` returned at `ret`: every
    /// instance issued before `call` is done.
    pub fn device_sync(&mut self, call: u64, ret: u64) {
        let Some(since) = self.deep_since else { return };
        for (comm, c) in &mut self.comms {
            let floor = c
                .recent
                .iter()
                .filter(|(e, _)| *e < call)
                .map(|(_, s)| s + 1)
                .max()
                .unwrap_or(0);
            c.floor = c.floor.max(floor);
            let done: Vec<u64> = c.held.range(..c.floor).map(|(s, _)| *s).collect();
            for s in done {
                if let Some(h) = c.held.remove(&s) {
                    self.held -= 1;
                    self.released.push(finish(&self.clock, h, true));
                }
            }
            for n in &c.qps {
                if let Some(q) = self.qps.get_mut(n) {
                    debug_assert_eq!(q.comm, *comm);
                    if since <= ret {
                        q.synced = true;
                    }
                    q.next_seq = q.next_seq.max(c.floor);
                    q.next_recv = q.next_recv.max(c.floor);
                    q.cur = None;
                    q.pending_cts = None;
                }
            }
        }
    }

    /// Releases records held longer than [`HOLD_NS`] (without a done time).
    pub fn expire(&mut self, now: u64) {
        for c in self.comms.values_mut() {
            let old: Vec<u64> = c
                .held
                .iter()
                .filter(|(_, h)| h.entry_raw.saturating_add(HOLD_NS) < now)
                .map(|(s, _)| *s)
                .collect();
            for s in old {
                if let Some(h) = c.held.remove(&s) {
                    self.held -= 1;
                    self.released.push(finish(&self.clock, h, false));
                }
            }
        }
    }

    /// Releases everything held (rank gone, deep set off).
    pub fn release_all(&mut self) {
        for c in self.comms.values_mut() {
            for (_, h) in std::mem::take(&mut c.held) {
                self.released.push(finish(&self.clock, h, false));
            }
        }
        self.held = 0;
    }

    /// Records released since the last call.
    pub fn take_released(&mut self) -> Vec<CollectiveRecord> {
        std::mem::take(&mut self.released)
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .comms
            .iter()
            .filter_map(|(id, c)| c.held.iter().next().map(|(s, h)| (h.entry_raw, *id, *s)))
            .min();
        if let Some((_, id, s)) = oldest {
            if let Some(h) = self.comms.get_mut(&id).and_then(|c| c.held.remove(&s)) {
                self.held -= 1;
                self.stats.evicted += 1;
                self.released.push(finish(&self.clock, h, false));
            }
        }
    }

    /// Matches the current (unmatched) op of `qpn` to an instance.
    fn try_match(&mut self, qpn: u32, local: &LocalMembers) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(op) = q.cur.filter(|o| o.seq.is_none()) else {
            return;
        };
        let Some(c) = self.comms.get_mut(&q.comm) else {
            return;
        };
        let start = q.next_seq.max(c.frontier.unwrap_or(0)).max(c.floor);
        let local_members = local.get(&q.comm);
        let mut found = None;
        for (&seq, h) in c.held.range(start..) {
            if !eligible(q.class, h.rec.op, h.rec.peer, local_members) {
                continue;
            }
            if h.entry_raw <= op.start {
                found = Some(seq);
            }
            break;
        }
        let Some(seq) = found else { return };
        let h = c.held.get_mut(&seq).expect("found above");
        h.arrive = Some(h.arrive.map_or(op.start, |a| a.min(op.start)));
        if let Some(w) = op.last_wc {
            h.last_wc = Some(h.last_wc.map_or(w, |x| x.max(w)));
        }
        q.class = match h.rec.op {
            CollOp::Send => {
                q.peer = Some(h.rec.peer);
                Class::Send(h.rec.peer)
            }
            _ => Class::Coll,
        };
        q.next_seq = seq + 1;
        if let Some(o) = q.cur.as_mut() {
            o.seq = Some(seq);
        }
        let comm = q.comm;
        self.stats.matched += 1;
        self.matched_at(comm, seq);
    }

    /// Matches the pending clear-to-send of `qpn` to the first receive of
    /// its communicator, from the last instance matched on any QP
    /// (inclusive), from the QP's peer (once known), that the host had
    /// issued by then. A receive's GPU arrival is its clear-to-send; its
    /// end is not known here (the data lands without a post).
    fn try_match_cts(&mut self, qpn: u32, local: &LocalMembers) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(ts) = q.pending_cts else { return };
        let Some(c) = self.comms.get_mut(&q.comm) else {
            return;
        };
        let start = q.next_recv.max(c.frontier.unwrap_or(0)).max(c.floor);
        let local_members = local.get(&q.comm);
        let mut found = None;
        for (&seq, h) in c.held.range(start..) {
            let remote =
                h.rec.peer >= 0 && !local_members.is_some_and(|l| l.contains(&(h.rec.peer as u32)));
            if h.rec.op != CollOp::Recv || !remote || q.peer.is_some_and(|p| p != h.rec.peer) {
                continue;
            }
            if h.entry_raw <= ts {
                found = Some(seq);
            }
            break;
        }
        let Some(seq) = found else { return };
        let h = c.held.get_mut(&seq).expect("found above");
        h.arrive = Some(h.arrive.map_or(ts, |a| a.min(ts)));
        q.peer = Some(h.rec.peer);
        q.next_recv = seq + 1;
        q.pending_cts = None;
        self.stats.matched += 1;
        let comm = q.comm;
        self.matched_at(comm, seq);
    }

    /// Instance `seq` of `comm` reached the NIC: it is the frontier, and by
    /// stream order every earlier instance of the communicator is over.
    fn matched_at(&mut self, comm: u64, seq: u64) {
        let Some(c) = self.comms.get_mut(&comm) else {
            return;
        };
        c.frontier = Some(c.frontier.map_or(seq, |f| f.max(seq)));
        let before: Vec<u64> = c.held.range(..seq).map(|(s, _)| *s).collect();
        for s in before {
            if let Some(h) = c.held.remove(&s) {
                self.held -= 1;
                self.released.push(finish(&self.clock, h, true));
            }
        }
    }
}

/// Whether a post is a receiver's clear-to-send rather than data: NCCL's
/// FIFO post (`ncclIbPostFifo`) is an inline RDMA write without immediate;
/// data goes out non-inline (the last write of a send with immediate).
pub fn is_clear_to_send(opcode: u64, send_flags: u64) -> bool {
    const IBV_WR_RDMA_WRITE: u64 = 0;
    const IBV_SEND_INLINE: u64 = 1 << 3;
    opcode == IBV_WR_RDMA_WRITE && send_flags & IBV_SEND_INLINE != 0
}

/// Whether an instance can be the next op on a QP of class `class`.
fn eligible(class: Class, op: CollOp, peer: i32, local_members: Option<&HashSet<u32>>) -> bool {
    match op {
        CollOp::Recv => false,
        CollOp::Send => {
            if peer < 0 || local_members.is_some_and(|l| l.contains(&(peer as u32))) {
                return false; // NVLink inside the host
            }
            match class {
                Class::Unknown => true,
                Class::Send(p) => p == peer,
                Class::Coll => false,
            }
        }
        _ => matches!(class, Class::Unknown | Class::Coll),
    }
}

/// The record with its GPU times mapped; `done_known`: the instance is
/// provably over, so its last completion is its end.
fn finish(clock: &HostClock, h: Held, done_known: bool) -> CollectiveRecord {
    let mut rec = h.rec;
    if let Some(a) = h.arrive {
        rec.gpu_arrive_ns = clock.map(a);
        if done_known {
            if let Some(w) = h.last_wc {
                rec.gpu_done_ns = clock.map(w.max(a));
            }
        }
    }
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(comm: u64, seq: u64, op: CollOp, peer: i32) -> CollectiveRecord {
        CollectiveRecord {
            pid: 1,
            rank: 0,
            comm_id: comm,
            seq,
            op,
            bytes: 1 << 20,
            peer,
            host_entry_ns: 0,
            host_exit_ns: 0,
            gpu_arrive_ns: 0,
            gpu_done_ns: 0,
            launches_before: 0,
            sync_wait_ns_before: 0,
            gpu_busy_before_ns: None,
            ret: 0,
        }
    }

    fn wr(op: u64, k: u64) -> u64 {
        (op << 16) | k
    }

    /// Chunks of one op: first at `t`, the rest paced later, each
    /// completing 10 after its post.
    fn op(g: &mut GpuSide, qp: u32, id: u64, t: u64, chunks: u64) {
        for k in 0..chunks {
            let p = if k == 0 { t } else { t + 1000 + k * 100 };
            g.post(qp, wr(id, k), p, false, &LocalMembers::new());
            g.completion(qp, wr(id, k), p + 10);
        }
    }

    #[test]
    fn host_runs_ahead_and_paced_chunks_do_not_shift_instances() {
        let mut g = GpuSide::new(HostClock::real(), Some(0));
        g.bind_qps(7, &[100, 101]);
        // Deep on from 0; a device sync at 5..10 anchors the count.
        g.device_sync(5, 10);
        // The host enqueues four buckets at once (20..23); the GPU reaches
        // them at 100, 2000, 4000, 6000, each with 3 paced chunks on QP 100.
        for s in 0..4 {
            assert!(g
                .issue(
                    rec(7, s, CollOp::AllReduce, -1),
                    20 + s,
                    &LocalMembers::new()
                )
                .is_none());
        }
        for (i, t) in [100u64, 2000, 4000, 6000].iter().enumerate() {
            op(&mut g, 100, 50 + i as u64, *t, 3);
        }
        // Iteration end: sync called at 7000 returns at 8000.
        g.device_sync(7000, 8000);
        let mut out = g.take_released();
        out.sort_by_key(|r| r.seq);
        let got: Vec<(u64, u64, u64)> = out
            .iter()
            .map(|r| (r.seq, r.gpu_arrive_ns, r.gpu_done_ns))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 100, 100 + 1000 + 200 + 10),
                (1, 2000, 2000 + 1000 + 200 + 10),
                (2, 4000, 4000 + 1000 + 200 + 10),
                (3, 6000, 6000 + 1000 + 200 + 10),
            ]
        );
        assert_eq!(g.stats.matched, 4);
    }

    #[test]
    fn counting_starts_at_a_device_sync_and_post_before_host_return_waits() {
        let mut g = GpuSide::new(HostClock::real(), None);
        g.bind_qps(7, &[100]);
        // Deep off: instance 0 goes out at once, with no GPU times.
        let r = g
            .issue(rec(7, 0, CollOp::AllReduce, -1), 10, &LocalMembers::new())
            .unwrap();
        assert_eq!(r.gpu_arrive_ns, 0);
        g.set_deep(true, 50);
        // Instance 1 issued at 60 (held), its op starts at 70: the QP is not
        // synced yet (the window opened mid-iteration), so no time.
        assert!(g
            .issue(rec(7, 1, CollOp::AllReduce, -1), 60, &LocalMembers::new())
            .is_none());
        op(&mut g, 100, 1, 70, 1);
        g.device_sync(80, 90);
        let r = g.take_released();
        assert_eq!((r.len(), r[0].seq, r[0].gpu_arrive_ns), (1, 1, 0));
        // After the anchor: the GPU posts at 200 while the host is still in
        // the call (its return, hence the record, comes at 210).
        g.post(100, wr(9, 0), 200, false, &LocalMembers::new());
        g.completion(100, wr(9, 0), 260);
        assert!(g
            .issue(rec(7, 2, CollOp::AllReduce, -1), 150, &LocalMembers::new())
            .is_none());
        g.device_sync(300, 400);
        let r = g.take_released();
        assert_eq!(
            (r[0].seq, r[0].gpu_arrive_ns, r[0].gpu_done_ns),
            (2, 200, 260)
        );
        assert_eq!(g.stats.unsynced_ops, 1);
    }

    #[test]
    fn sends_to_local_peers_and_receives_are_skipped_and_qp_class_is_learned() {
        // A pipeline stage with QP 100 toward member 2 (other host); member
        // 0 is on this host.
        let local: LocalMembers = [(9, [0, 1].into_iter().collect())].into_iter().collect();
        let mut g = GpuSide::new(HostClock::real(), Some(0));
        g.bind_qps(9, &[100]);
        g.device_sync(1, 2);
        let seqs = [
            (CollOp::Recv, 0),
            (CollOp::Send, 2),
            (CollOp::Recv, 2),
            (CollOp::Send, 0),
            (CollOp::Recv, 0),
            (CollOp::Send, 2),
        ];
        for (s, (o, p)) in seqs.iter().enumerate() {
            assert!(g
                .issue(rec(9, s as u64, *o, *p), 10 + s as u64, &local)
                .is_none());
        }
        g.post(100, wr(1, 0), 100, false, &local);
        g.post(100, wr(2, 0), 500, false, &local);
        g.device_sync(600, 700);
        let mut r = g.take_released();
        r.sort_by_key(|r| r.seq);
        let arr: Vec<u64> = r.iter().map(|r| r.gpu_arrive_ns).collect();
        assert_eq!(arr, vec![0, 100, 0, 0, 0, 500]);
    }

    /// The same stage with clear-to-sends: a receive from the remote member
    /// gets its GPU arrival from its clear-to-send, one from a local member
    /// none; data and clear-to-sends on one QP keep their own counts, and a
    /// clear-to-send posted before the host call returned waits for it.
    #[test]
    fn receives_from_remote_members_arrive_with_their_clear_to_send() {
        let local: LocalMembers = [(9, [0, 1].into_iter().collect())].into_iter().collect();
        let mut g = GpuSide::new(HostClock::real(), Some(0));
        g.bind_qps(9, &[100]);
        g.device_sync(1, 2);
        let seqs = [
            (CollOp::Recv, 2),
            (CollOp::Send, 2),
            (CollOp::Recv, 0),
            (CollOp::Recv, 2),
            (CollOp::Send, 2),
        ];
        for (s, (o, p)) in seqs.iter().enumerate() {
            assert!(g
                .issue(rec(9, s as u64, *o, *p), 10 + s as u64, &local)
                .is_none());
        }
        // Receive 0's clear-to-send, send 1's data, receive 3's
        // clear-to-send (receive 2 is from a local member: no post).
        g.post(100, wr(1, 0), 100, true, &local);
        g.post(100, wr(2, 0), 200, false, &local);
        g.completion(100, wr(2, 0), 250);
        g.post(100, wr(3, 0), 300, true, &local);
        g.post(100, wr(4, 0), 400, false, &local);
        // Receive 5 is issued after its clear-to-send went out.
        g.post(100, wr(5, 0), 500, true, &local);
        assert!(g.issue(rec(9, 5, CollOp::Recv, 2), 490, &local).is_none());
        g.device_sync(600, 700);
        let mut r = g.take_released();
        r.sort_by_key(|r| r.seq);
        let arr: Vec<(u64, u64)> = r.iter().map(|r| (r.gpu_arrive_ns, r.gpu_done_ns)).collect();
        assert_eq!(
            arr,
            vec![(100, 0), (200, 250), (0, 0), (300, 0), (400, 0), (500, 0)]
        );
        assert_eq!(g.stats.matched, 5);
        assert_eq!(g.stats.unmatched_ops, 0);
    }

    #[test]
    fn clear_to_send_is_an_inline_write_without_immediate() {
        assert!(is_clear_to_send(0, 1 << 3 | 1 << 1));
        assert!(!is_clear_to_send(0, 1 << 1));
        assert!(!is_clear_to_send(1, 1 << 3));
    }

    #[test]
    fn held_records_are_bounded_and_expire() {
        let mut g = GpuSide::new(HostClock::real(), Some(0));
        g.bind_qps(7, &[100]);
        for s in 0..(MAX_HELD as u64 + 5) {
            assert!(g
                .issue(rec(7, s, CollOp::AllReduce, -1), s, &LocalMembers::new())
                .is_none());
        }
        assert_eq!(g.stats.evicted, 5);
        assert_eq!(g.take_released().len(), 5);
        g.expire(HOLD_NS + MAX_HELD as u64 + 10);
        assert_eq!(g.take_released().len(), MAX_HELD);
    }
}

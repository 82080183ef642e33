//! Synthetic training jobs: realistic [`Batch`] streams with ground truth.
//!
//! Each rank runs a step program (data loading, forward and backward layers
//! with tensor-parallel all-reduces, pipeline send/recv per microbatch in
//! GPipe order, data-parallel bucket all-reduces during the last backward
//! microbatch, optimizer, synchronize). The host only enqueues (Trap 1): its
//! timeline runs ahead of the GPU until a synchronize. A collective instance
//! starts when the last member's GPU reaches it and ends after its transfer
//! time, the same for every member. Faults scale GPU work (compute), host work
//! (host), transfer and verbs latency (communication, link), or stop a rank
//! (hang). Hosts have their own monotonic clock (offset, drift); clock probes
//! have asymmetric round-trip jitter. A discrete-event worklist resolves the
//! coupling, so cost is linear in ranks × operations: fast enough to drive a
//! load generator at thousands of ranks.

use std::collections::{HashMap, VecDeque};

use slowrank_shared::wire::{
    Batch, CollOp, CollectiveRecord, CommRecord, LinkRecord, RankIdentity, RankInterval,
};

use slowrank_shared::clock::ClockSample;

/// Small deterministic generator (SplitMix64): reproducible streams with no
/// dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f64 {
        2.0 * self.f64() - 1.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// A host's true monotonic clock: `agent = t + epoch + offset + drift * t`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClockTruth {
    pub offset_ns: i64,
    pub drift_ppm: f64,
    pub epoch_ns: u64,
}

impl ClockTruth {
    pub fn new(offset_ns: i64, drift_ppm: f64, epoch_ns: u64) -> Self {
        Self {
            offset_ns,
            drift_ppm,
            epoch_ns,
        }
    }
    /// The host's monotonic reading at true (coordinator) time `t`.
    pub fn agent_ns(&self, t: u64) -> u64 {
        let v =
            t as f64 * (1.0 + self.drift_ppm * 1e-6) + self.epoch_ns as f64 + self.offset_ns as f64;
        v.round().max(1.0) as u64
    }
    /// A probe sent at true time `t`: 25 µs each way plus asymmetric queueing
    /// (up to 450 µs out, 200 µs back), so round trips span about 50–700 µs.
    pub fn probe(&self, t: u64, rng: &mut Rng) -> ClockSample {
        let u = rng.f64();
        let fwd = 25_000 + (450_000.0 * u * u) as u64;
        let back = 25_000 + (200_000.0 * rng.f64()) as u64;
        ClockSample {
            coord_send_ns: t,
            agent_mono_ns: self.agent_ns(t + fwd),
            agent_hold_ns: 0,
            coord_recv_ns: t + fwd + back,
            udp: false,
        }
    }
}

/// Which records carry GPU-side times (the deep verbs probe set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum GpuTiming {
    /// Every member of every instance.
    All,
    /// Only instances whose members span hosts (verbs traffic: a sender's
    /// first chunk, a receiver's clear-to-send).
    InterHostOnly,
    /// Default probe set: host-side times only.
    None,
}

/// The host function a host fault slows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum HostPhase {
    LoadBatch,
    Layers,
    All,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum FaultKind {
    /// GPU work of `rank` × factor.
    Compute { rank: u32, factor: f64 },
    /// Host work of `rank` in `phase` × factor plus `delay_ns` per call;
    /// `contention` shows as run-queue delay, otherwise as off-CPU time.
    Host {
        rank: u32,
        phase: HostPhase,
        factor: f64,
        delay_ns: u64,
        contention: bool,
    },
    /// Transfers touching `rank`'s NIC and its verbs latency × factor.
    Communication { rank: u32, factor: f64 },
    /// Transfers and verbs latency between `a` and `b` × factor.
    Link { a: u32, b: u32, factor: f64 },
    /// `rank` stops issuing collectives.
    Hang { rank: u32 },
    /// Every rank's GPU work × `1 + (factor − 1)·u²`, `u` drawn anew per
    /// rank and iteration (sequence lengths): the slowest rank moves.
    WorkImbalance { factor: f64 },
}

/// Rank `r`'s share of moving work in iteration `it` (see
/// [`FaultKind::WorkImbalance`]).
pub fn work_factor(factor: f64, seed: u64, r: u32, it: u64) -> f64 {
    let mut g = Rng::new(seed ^ (u64::from(r) << 40) ^ it.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    g.next_u64();
    let u = g.f64();
    1.0 + (factor - 1.0) * u * u
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub start_iteration: u64,
    /// First iteration without the fault.
    pub end_iteration: Option<u64>,
    /// Intermittent: on for `on` of every `period` iterations from the start.
    pub period: Option<(u64, u64)>,
}

impl Fault {
    pub fn persistent(kind: FaultKind, start_iteration: u64) -> Self {
        Self {
            kind,
            start_iteration,
            end_iteration: None,
            period: None,
        }
    }
    pub fn active(&self, it: u64) -> bool {
        if it < self.start_iteration || self.end_iteration.is_some_and(|e| it >= e) {
            return false;
        }
        match self.period {
            Some((p, on)) => (it - self.start_iteration) % p.max(1) < on,
            None => true,
        }
    }
}

/// A synthetic job.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SynthSpec {
    pub seed: u64,
    pub hosts: usize,
    pub ranks_per_host: usize,
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    pub layers: usize,
    pub microbatches: usize,
    pub grad_buckets: usize,
    pub fwd_kernel_ns_per_layer: u64,
    pub kernels_per_layer: u32,
    pub host_ns_per_layer: u64,
    pub data_loader_ns: u64,
    pub optimizer_ns: u64,
    pub bucket_xfer_ns: u64,
    pub tp_xfer_ns: u64,
    pub p2p_xfer_ns: u64,
    pub nic_latency_ns: u64,
    /// Relative noise on every duration, uniform in ±jitter.
    pub jitter: f64,
    pub gpu_timing: GpuTiming,
    /// Emit per-QP verbs link records (deep probes).
    pub links: bool,
    /// Emit one [`RankInterval`] per rank per iteration.
    pub intervals: bool,
    pub clocks: Vec<ClockTruth>,
    pub faults: Vec<Fault>,
    /// True time the job starts (after clock probes began).
    pub start_ns: u64,
    /// Clock probes per host per second.
    pub probe_hz: u64,
}

impl SynthSpec {
    /// Data-parallel only, `hosts × ranks_per_host`, like the dp8 scenarios.
    pub fn dp(hosts: usize, ranks_per_host: usize) -> Self {
        let n = hosts * ranks_per_host;
        Self {
            seed: 1,
            hosts,
            ranks_per_host,
            tp: 1,
            pp: 1,
            dp: n,
            layers: 4,
            microbatches: 1,
            grad_buckets: 4,
            fwd_kernel_ns_per_layer: 2_000_000,
            kernels_per_layer: 10,
            host_ns_per_layer: 100_000,
            data_loader_ns: 500_000,
            optimizer_ns: 2_000_000,
            bucket_xfer_ns: 2_000_000,
            tp_xfer_ns: 150_000,
            p2p_xfer_ns: 300_000,
            nic_latency_ns: 8_000,
            jitter: 0.05,
            gpu_timing: GpuTiming::All,
            links: true,
            intervals: true,
            clocks: default_clocks(hosts),
            faults: Vec::new(),
            start_ns: 20_000_000_000,
            probe_hz: 10,
        }
    }

    /// Megatron-style `tp × pp × dp` on `hosts` hosts.
    pub fn three_d(tp: usize, pp: usize, dp: usize, hosts: usize) -> Self {
        let n = tp * pp * dp;
        Self {
            tp,
            pp,
            dp,
            microbatches: 4,
            layers: 2,
            // Compute-heavy like the scenario's 3-D specs: pipeline bubbles
            // would otherwise dominate the step.
            fwd_kernel_ns_per_layer: 4_000_000,
            ..Self::dp(hosts, n / hosts)
        }
    }

    pub fn world(&self) -> usize {
        self.hosts * self.ranks_per_host
    }

    pub fn host_of(&self, rank: u32) -> usize {
        rank as usize / self.ranks_per_host
    }

    pub fn host_name(&self, h: usize) -> String {
        format!("node-{h}")
    }

    /// (pp, dp, tp) coordinates: `rank = pp*(dp*tp) + dp*tp + tp`.
    pub fn coords(&self, rank: u32) -> (usize, usize, usize) {
        let r = rank as usize;
        (
            r / (self.dp * self.tp),
            (r / self.tp) % self.dp,
            r % self.tp,
        )
    }

    pub fn rank_of(&self, pp: usize, dp: usize, tp: usize) -> u32 {
        (pp * self.dp * self.tp + dp * self.tp + tp) as u32
    }
}

/// Offsets of milliseconds and drift of tens of ppm, host 0 nearly true.
pub fn default_clocks(hosts: usize) -> Vec<ClockTruth> {
    (0..hosts)
        .map(|h| {
            let sign = if h % 2 == 0 { 1 } else { -1 };
            ClockTruth::new(
                sign * (h as i64 * 2_300_000 + 150_000),
                sign as f64 * (h as f64 * 13.0 + 2.0),
                1_000_000_000_000 + h as u64 * 77_000_000_000,
            )
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum CommKind {
    World,
    Tp,
    Pp,
    Dp,
}

#[derive(Debug, Clone)]
struct Comm {
    id: u64,
    members: Vec<u32>,
    spans_hosts: bool,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Host(u64, HostPhase),
    Gpu(u64, u32),
    Coll {
        comm: usize,
        op: CollOp,
        bytes: u64,
        /// Position of the peer for p2p.
        peer: Option<u32>,
        xfer: u64,
    },
    Sync,
}

#[derive(Debug, Clone, Default)]
struct RankState {
    host_t: u64,
    gpu_t: u64,
    launches: u32,
    sync_wait: u64,
    /// Per-comm sequence counters.
    seq: HashMap<usize, u64>,
    /// Per (comm, peer position) p2p ordinals.
    p2p: HashMap<(usize, u32), u64>,
    iter_launches: u64,
    iter_sync_wait: u64,
    iter_sync_calls: u64,
    iter_runq: u64,
    iter_offcpu: u64,
    hung: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum InstKey {
    Coll(usize, u64),
    P2p(usize, u32, u32, u64),
}

#[derive(Debug, Clone)]
struct Arrival {
    rank: u32,
    rec_idx: usize,
    gpu_arrive: u64,
}

/// Ground truth of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Truth {
    pub faults: Vec<Fault>,
    pub clocks: Vec<ClockTruth>,
    /// True end time of each simulated iteration.
    pub iteration_end_ns: Vec<u64>,
    /// For a hang: (communicator, sequence, missing rank) of the stuck instance.
    pub hung_at: Option<(u64, u64, u32)>,
}

/// What one simulated iteration produced.
#[derive(Debug, Clone)]
pub struct IterationOutput {
    pub iteration: u64,
    /// One batch per host, and the true time it reaches the coordinator.
    pub batches: Vec<(u64, Batch)>,
    /// Clock probes during the iteration: (host name, sample).
    pub samples: Vec<(String, ClockSample)>,
    /// True time the iteration ended (all ranks synchronized).
    pub end_ns: u64,
}

/// Streams a synthetic job iteration by iteration.
#[derive(Debug)]
pub struct Generator {
    spec: SynthSpec,
    rng: Rng,
    comms: Vec<Comm>,
    /// Per rank: (comm index, kind, position).
    rank_comms: Vec<Vec<(usize, CommKind, u32)>>,
    link_peers: Vec<Vec<u32>>,
    ranks: Vec<RankState>,
    iteration: u64,
    batch_seq: Vec<u64>,
    next_probe_ns: Vec<u64>,
    sent_identity: bool,
    truth: Truth,
    stalled: bool,
}

const ENQUEUE_NS: u64 = 6_000;

fn comm_hash(kind: CommKind, idx: usize, seed: u64) -> u64 {
    let mut r = Rng::new(seed ^ ((kind as u64) << 40) ^ idx as u64);
    r.next_u64() | 1
}

impl Generator {
    pub fn new(spec: SynthSpec) -> Self {
        assert_eq!(
            spec.tp * spec.pp * spec.dp,
            spec.world(),
            "tp*pp*dp must equal the world size"
        );
        assert!(spec.clocks.len() >= spec.hosts, "one clock per host");
        let n = spec.world();
        let mut comms = Vec::new();
        let mut rank_comms = vec![Vec::new(); n];
        let mut add = |kind: CommKind, idx: usize, members: Vec<u32>, comms: &mut Vec<Comm>| {
            let hosts: std::collections::HashSet<usize> =
                members.iter().map(|r| spec.host_of(*r)).collect();
            let ci = comms.len();
            for (pos, r) in members.iter().enumerate() {
                rank_comms[*r as usize].push((ci, kind, pos as u32));
            }
            comms.push(Comm {
                id: comm_hash(kind, idx, spec.seed),
                members,
                spans_hosts: hosts.len() > 1,
            });
        };
        let dp_only = spec.tp == 1 && spec.pp == 1;
        // The world communicator carries the DP traffic in a dp-only job.
        add(CommKind::World, 0, (0..n as u32).collect(), &mut comms);
        if spec.tp > 1 {
            for p in 0..spec.pp {
                for d in 0..spec.dp {
                    let m = (0..spec.tp).map(|t| spec.rank_of(p, d, t)).collect();
                    add(CommKind::Tp, p * spec.dp + d, m, &mut comms);
                }
            }
        }
        if spec.pp > 1 {
            for d in 0..spec.dp {
                for t in 0..spec.tp {
                    let m = (0..spec.pp).map(|p| spec.rank_of(p, d, t)).collect();
                    add(CommKind::Pp, d * spec.tp + t, m, &mut comms);
                }
            }
        }
        if !dp_only && spec.dp > 1 {
            for p in 0..spec.pp {
                for t in 0..spec.tp {
                    let m = (0..spec.dp).map(|d| spec.rank_of(p, d, t)).collect();
                    add(CommKind::Dp, p * spec.tp + t, m, &mut comms);
                }
            }
        }
        // Verbs peers, rail-optimised like NCCL's channels: a rank at local
        // index j sends to the member at local index j+1 on the next host of
        // its communicator (so each rank has one QP out and one in per
        // multi-host communicator); pipeline neighbours on other hosts too.
        let mut link_peers: Vec<Vec<u32>> = vec![Vec::new(); n];
        let rph = spec.ranks_per_host;
        for (ci, c) in comms.iter().enumerate() {
            if !c.spans_hosts {
                continue;
            }
            let kind = rank_comms[c.members[0] as usize]
                .iter()
                .find(|x| x.0 == ci)
                .map(|x| x.1);
            if kind == Some(CommKind::World) && !dp_only {
                continue;
            }
            let mut hosts: Vec<usize> = c.members.iter().map(|r| spec.host_of(*r)).collect();
            hosts.sort_unstable();
            hosts.dedup();
            for (i, &r) in c.members.iter().enumerate() {
                let q = if kind == Some(CommKind::Pp) {
                    match c.members.get(i + 1) {
                        Some(q) => *q,
                        None => continue,
                    }
                } else {
                    let h = spec.host_of(r);
                    let hi = hosts.iter().position(|x| *x == h).unwrap_or(0);
                    let next = hosts[(hi + 1) % hosts.len()];
                    let want = (r as usize % rph + 1) % rph;
                    let on_next: Vec<u32> = c
                        .members
                        .iter()
                        .copied()
                        .filter(|m| spec.host_of(*m) == next)
                        .collect();
                    match on_next
                        .iter()
                        .find(|m| **m as usize % rph == want)
                        .or(on_next.first())
                    {
                        Some(q) => *q,
                        None => continue,
                    }
                };
                if spec.host_of(q) != spec.host_of(r) && !link_peers[r as usize].contains(&q) {
                    link_peers[r as usize].push(q);
                }
            }
        }
        let start = spec.start_ns;
        let ranks = (0..n)
            .map(|_| RankState {
                host_t: start,
                gpu_t: start,
                ..Default::default()
            })
            .collect();
        let truth = Truth {
            faults: spec.faults.clone(),
            clocks: spec.clocks.clone(),
            iteration_end_ns: Vec::new(),
            hung_at: None,
        };
        let hosts = spec.hosts;
        let probe_start = start.saturating_sub(10_000_000_000);
        Self {
            rng: Rng::new(spec.seed),
            comms,
            rank_comms,
            link_peers,
            ranks,
            iteration: 0,
            batch_seq: vec![0; hosts],
            next_probe_ns: vec![probe_start; hosts],
            sent_identity: false,
            truth,
            stalled: false,
            spec,
        }
    }

    pub fn spec(&self) -> &SynthSpec {
        &self.spec
    }

    pub fn truth(&self) -> &Truth {
        &self.truth
    }

    /// Communicator ids: (kind, members). For tests that want to name them.
    pub fn comm_ids(&self) -> Vec<(u64, Vec<u32>)> {
        self.comms
            .iter()
            .map(|c| (c.id, c.members.clone()))
            .collect()
    }

    fn jit(&mut self, ns: u64) -> u64 {
        (ns as f64 * (1.0 + self.spec.jitter * self.rng.sym())).max(0.0) as u64
    }

    fn fault_active(&self, it: u64, f: impl Fn(&FaultKind) -> Option<f64>) -> Option<f64> {
        self.spec
            .faults
            .iter()
            .filter(|x| x.active(it))
            .filter_map(|x| f(&x.kind))
            .reduce(f64::max)
    }

    fn program(&self, rank: u32) -> Vec<Op> {
        let s = &self.spec;
        let (p, _, _) = s.coords(rank);
        let rc = &self.rank_comms[rank as usize];
        let find = |k: CommKind| rc.iter().find(|c| c.1 == k).map(|c| (c.0, c.2));
        let dp_only = s.tp == 1 && s.pp == 1;
        let dp = if dp_only {
            find(CommKind::World)
        } else {
            find(CommKind::Dp)
        };
        let tp = find(CommKind::Tp);
        let pp = find(CommKind::Pp);
        let l = s.layers;
        let fwd = s.fwd_kernel_ns_per_layer / s.microbatches as u64;
        let k = s.kernels_per_layer;
        let mut ops = vec![
            Op::Host(s.data_loader_ns, HostPhase::LoadBatch),
            Op::Gpu(200_000, 1),
        ];
        let act = 4 << 20;
        for _mb in 0..s.microbatches {
            if let (Some((c, _)), true) = (pp, p > 0) {
                ops.push(Op::Coll {
                    comm: c,
                    op: CollOp::Recv,
                    bytes: act,
                    peer: Some(p as u32 - 1),
                    xfer: s.p2p_xfer_ns,
                });
            }
            for _ in 0..l {
                ops.push(Op::Host(s.host_ns_per_layer, HostPhase::Layers));
                ops.push(Op::Gpu(fwd, k));
                if let Some((c, _)) = tp {
                    ops.push(Op::Coll {
                        comm: c,
                        op: CollOp::AllReduce,
                        bytes: act,
                        peer: None,
                        xfer: s.tp_xfer_ns,
                    });
                }
            }
            if let (Some((c, _)), true) = (pp, p + 1 < s.pp) {
                ops.push(Op::Coll {
                    comm: c,
                    op: CollOp::Send,
                    bytes: act,
                    peer: Some(p as u32 + 1),
                    xfer: s.p2p_xfer_ns,
                });
            }
        }
        let b = s.grad_buckets;
        for mb in (0..s.microbatches).rev() {
            if let (Some((c, _)), true) = (pp, p + 1 < s.pp) {
                ops.push(Op::Coll {
                    comm: c,
                    op: CollOp::Recv,
                    bytes: act,
                    peer: Some(p as u32 + 1),
                    xfer: s.p2p_xfer_ns,
                });
            }
            for li in 0..l {
                ops.push(Op::Host(s.host_ns_per_layer, HostPhase::Layers));
                ops.push(Op::Gpu(2 * fwd, 2 * k));
                if let Some((c, _)) = tp {
                    ops.push(Op::Coll {
                        comm: c,
                        op: CollOp::AllReduce,
                        bytes: act,
                        peer: None,
                        xfer: s.tp_xfer_ns,
                    });
                }
                if mb == 0 {
                    if let Some((c, _)) = dp {
                        for _ in (li * b / l)..((li + 1) * b / l) {
                            ops.push(Op::Coll {
                                comm: c,
                                op: CollOp::AllReduce,
                                bytes: 25 << 20,
                                peer: None,
                                xfer: s.bucket_xfer_ns,
                            });
                        }
                    }
                }
            }
            if let (Some((c, _)), true) = (pp, p > 0) {
                ops.push(Op::Coll {
                    comm: c,
                    op: CollOp::Send,
                    bytes: act,
                    peer: Some(p as u32 - 1),
                    xfer: s.p2p_xfer_ns,
                });
            }
        }
        ops.push(Op::Host(s.host_ns_per_layer, HostPhase::Layers));
        ops.push(Op::Gpu(s.optimizer_ns, 10));
        ops.push(Op::Sync);
        ops
    }

    fn identity_records(&self, host: usize) -> (Vec<RankIdentity>, Vec<CommRecord>) {
        let s = &self.spec;
        let mut ids = Vec::new();
        let mut comms = Vec::new();
        for lr in 0..s.ranks_per_host {
            let rank = (host * s.ranks_per_host + lr) as u32;
            ids.push(RankIdentity {
                pid: 1000 + rank,
                rank,
                world_size: s.world() as u32,
                local_rank: lr as u32,
                local_world_size: s.ranks_per_host as u32,
                group_rank: host as u32,
                restart_count: 0,
                job_id: "synth-job".into(),
                seen_ns: s.clocks[host].agent_ns(s.start_ns.saturating_sub(1_000_000_000)),
            });
            for &(ci, _, pos) in &self.rank_comms[rank as usize] {
                comms.push(CommRecord {
                    pid: 1000 + rank,
                    rank,
                    comm_id: self.comms[ci].id,
                    parent_id: 0,
                    color: 0,
                    nranks: self.comms[ci].members.len() as u32,
                    rank_in_comm: pos,
                    created_ns: s.clocks[host].agent_ns(s.start_ns.saturating_sub(500_000_000)),
                    split_ordinal: 0,
                    split_key: 0,
                    resumed: false,
                });
            }
        }
        (ids, comms)
    }

    /// Clock probes for every host up to true time `until`.
    fn probes_until(&mut self, until: u64) -> Vec<(String, ClockSample)> {
        let mut out = Vec::new();
        let step = 1_000_000_000 / self.spec.probe_hz.max(1);
        for h in 0..self.spec.hosts {
            while self.next_probe_ns[h] < until {
                let t = self.next_probe_ns[h];
                let s = self.spec.clocks[h].probe(t, &mut self.rng);
                out.push((self.spec.host_name(h), s));
                self.next_probe_ns[h] += step;
            }
        }
        out
    }

    /// Probes sent before the job starts (the agents connect first).
    pub fn initial_samples(&mut self) -> Vec<(String, ClockSample)> {
        self.probes_until(self.spec.start_ns)
    }

    /// Simulates the next iteration.
    pub fn next_iteration(&mut self) -> IterationOutput {
        let it = self.iteration;
        self.iteration += 1;
        let n = self.spec.world();
        let s = self.spec.clone();
        let mut recs: Vec<Vec<CollectiveRecord>> = vec![Vec::new(); s.hosts];
        let iter_start: Vec<u64> = self.ranks.iter().map(|r| r.host_t).collect();
        for r in &mut self.ranks {
            r.iter_launches = 0;
            r.iter_sync_wait = 0;
            r.iter_sync_calls = 0;
            r.iter_runq = 0;
            r.iter_offcpu = 0;
        }
        for f in &s.faults {
            if let FaultKind::Hang { rank } = f.kind {
                if f.active(it) {
                    self.ranks[rank as usize].hung = true;
                }
            }
        }
        if !self.stalled {
            let programs: Vec<Vec<Op>> = (0..n as u32).map(|r| self.program(r)).collect();
            let mut pc = vec![0usize; n];
            let mut blocked = vec![false; n];
            let mut pending: HashMap<InstKey, Vec<Arrival>> = HashMap::new();
            let mut work: VecDeque<u32> = (0..n as u32)
                .filter(|r| !self.ranks[*r as usize].hung)
                .collect();
            while let Some(r) = work.pop_front() {
                let ri = r as usize;
                if blocked[ri] {
                    continue;
                }
                let host = s.host_of(r);
                let compute = self
                    .fault_active(it, |k| {
                        matches!(k, FaultKind::Compute { rank, .. } if *rank == r).then(
                            || match k {
                                FaultKind::Compute { factor, .. } => *factor,
                                _ => 1.0,
                            },
                        )
                    })
                    .unwrap_or(1.0)
                    * self
                        .fault_active(it, |k| match k {
                            FaultKind::WorkImbalance { factor } => {
                                Some(work_factor(*factor, s.seed, r, it))
                            }
                            _ => None,
                        })
                        .unwrap_or(1.0);
                while pc[ri] < programs[ri].len() {
                    let op = programs[ri][pc[ri]];
                    match op {
                        Op::Host(ns, phase) => {
                            let mut d = self.jit(ns);
                            for f in s.faults.iter().filter(|f| f.active(it)) {
                                if let FaultKind::Host {
                                    rank,
                                    phase: fp,
                                    factor,
                                    delay_ns,
                                    contention,
                                } = f.kind
                                {
                                    if rank == r && (fp == phase || fp == HostPhase::All) {
                                        let extra =
                                            (d as f64 * (factor - 1.0)).max(0.0) as u64 + delay_ns;
                                        d += extra;
                                        if contention {
                                            self.ranks[ri].iter_runq += extra;
                                        } else {
                                            self.ranks[ri].iter_offcpu += extra;
                                        }
                                    }
                                }
                            }
                            self.ranks[ri].host_t += d;
                        }
                        Op::Gpu(ns, k) => {
                            let d = (self.jit(ns) as f64 * compute) as u64;
                            let st = &mut self.ranks[ri];
                            st.host_t += 3_000 * k as u64 / 4;
                            st.gpu_t = st.gpu_t.max(st.host_t) + d;
                            st.launches += k;
                            st.iter_launches += k as u64;
                        }
                        Op::Sync => {
                            let st = &mut self.ranks[ri];
                            let w = st.gpu_t.saturating_sub(st.host_t);
                            st.sync_wait += w;
                            st.iter_sync_wait += w;
                            st.iter_sync_calls += 1;
                            st.host_t = st.host_t.max(st.gpu_t) + 20_000;
                        }
                        Op::Coll {
                            comm,
                            op,
                            bytes,
                            peer,
                            xfer,
                        } => {
                            let my_pos = self.rank_comms[ri]
                                .iter()
                                .find(|c| c.0 == comm)
                                .map_or(0, |c| c.2);
                            let st = &mut self.ranks[ri];
                            let seq = *st.seq.entry(comm).and_modify(|v| *v += 1).or_insert(0);
                            let key = match peer {
                                Some(pp) => {
                                    let o = st.p2p.entry((comm, pp)).or_insert(0);
                                    let ord = *o;
                                    *o += 1;
                                    InstKey::P2p(comm, my_pos.min(pp), my_pos.max(pp), ord)
                                }
                                None => InstKey::Coll(comm, seq),
                            };
                            let entry = st.host_t;
                            st.host_t += ENQUEUE_NS;
                            let gpu_arrive = st.gpu_t.max(entry + 4_000);
                            let rec = CollectiveRecord {
                                pid: 1000 + r,
                                rank: r,
                                comm_id: self.comms[comm].id,
                                seq,
                                op,
                                bytes,
                                peer: peer.map_or(-1, |p| p as i32),
                                host_entry_ns: entry,
                                host_exit_ns: st.host_t,
                                gpu_arrive_ns: gpu_arrive,
                                gpu_done_ns: 0,
                                launches_before: std::mem::take(&mut st.launches),
                                sync_wait_ns_before: std::mem::take(&mut st.sync_wait),
                                gpu_busy_before_ns: None,
                                ret: 0,
                            };
                            recs[host].push(rec);
                            let arr = pending.entry(key).or_default();
                            arr.push(Arrival {
                                rank: r,
                                rec_idx: recs[host].len() - 1,
                                gpu_arrive,
                            });
                            pc[ri] += 1;
                            let need = if peer.is_some() {
                                2
                            } else {
                                self.comms[comm].members.len()
                            };
                            if arr.len() == need {
                                let arr = pending.remove(&key).expect("present");
                                let start = arr.iter().map(|a| a.gpu_arrive).max().unwrap_or(0);
                                let members: Vec<u32> = arr.iter().map(|a| a.rank).collect();
                                let factor = self.xfer_factor(it, comm, &members);
                                let d = (self.jit(xfer) as f64 * factor) as u64;
                                for a in &arr {
                                    let done = start + d + self.rng.below(3_000);
                                    let h = s.host_of(a.rank);
                                    recs[h][a.rec_idx].gpu_done_ns = done;
                                    self.ranks[a.rank as usize].gpu_t = done;
                                    if a.rank != r {
                                        blocked[a.rank as usize] = false;
                                        work.push_back(a.rank);
                                    }
                                }
                            } else {
                                blocked[ri] = true;
                                break;
                            }
                            continue;
                        }
                    }
                    pc[ri] += 1;
                }
            }
            // Anything still pending is stuck behind a hung rank.
            if let Some((key, arr)) = pending
                .iter()
                .min_by_key(|(_, a)| a.iter().map(|x| x.gpu_arrive).min())
            {
                self.stalled = true;
                let (comm, seq) = match key {
                    InstKey::Coll(c, s) => (*c, *s),
                    InstKey::P2p(c, _, _, o) => (*c, *o),
                };
                let present: Vec<u32> = arr.iter().map(|a| a.rank).collect();
                let missing = self.comms[comm]
                    .members
                    .iter()
                    .copied()
                    .find(|m| !present.contains(m))
                    .unwrap_or(u32::MAX);
                self.truth.hung_at = Some((self.comms[comm].id, seq, missing));
            }
        }
        // Convert to each host's clock; GPU-side fields per the probe set.
        let mut end = self
            .ranks
            .iter()
            .map(|r| r.host_t.max(r.gpu_t))
            .max()
            .unwrap_or(0);
        if self.stalled {
            end = end.max(
                self.truth
                    .iteration_end_ns
                    .last()
                    .copied()
                    .unwrap_or(s.start_ns)
                    + 30_000_000,
            );
            for r in &mut self.ranks {
                r.host_t = r.host_t.max(end);
                r.gpu_t = r.gpu_t.max(end);
            }
        }
        self.truth.iteration_end_ns.push(end);
        let cut = end + 1_000_000;
        let mut samples = self.probes_until(cut);
        samples.sort_by_key(|x| x.1.coord_send_ns);
        let mut batches = Vec::with_capacity(s.hosts);
        for (h, mut host_recs) in recs.into_iter().enumerate() {
            let clk = s.clocks[h];
            for rec in &mut host_recs {
                let spans = self
                    .comms
                    .iter()
                    .find(|c| c.id == rec.comm_id)
                    .is_some_and(|c| c.spans_hosts);
                let keep_gpu = match s.gpu_timing {
                    GpuTiming::All => true,
                    GpuTiming::InterHostOnly => spans,
                    GpuTiming::None => false,
                };
                rec.host_entry_ns = clk.agent_ns(rec.host_entry_ns);
                rec.host_exit_ns = clk.agent_ns(rec.host_exit_ns);
                rec.gpu_arrive_ns = if keep_gpu {
                    clk.agent_ns(rec.gpu_arrive_ns)
                } else {
                    0
                };
                rec.gpu_done_ns = if keep_gpu && rec.gpu_done_ns != 0 {
                    clk.agent_ns(rec.gpu_done_ns)
                } else {
                    0
                };
            }
            let mut intervals = Vec::new();
            let mut links = Vec::new();
            for lr in 0..s.ranks_per_host {
                let r = (h * s.ranks_per_host + lr) as u32;
                let st = &self.ranks[r as usize];
                if st.hung && self.stalled {
                    continue;
                }
                let (a, b) = (
                    iter_start[r as usize],
                    st.host_t.max(iter_start[r as usize] + 1),
                );
                if s.intervals {
                    let dur = b - a;
                    let runq = st.iter_runq + dur / 500;
                    let off = st.iter_offcpu + st.iter_sync_wait;
                    intervals.push(RankInterval {
                        pid: 1000 + r,
                        rank: r,
                        start_ns: clk.agent_ns(a),
                        end_ns: clk.agent_ns(b),
                        launches: st.iter_launches,
                        launch_ns: st.iter_launches * 3_000,
                        sync_calls: st.iter_sync_calls,
                        sync_wait_ns: st.iter_sync_wait,
                        oncpu_ns: dur.saturating_sub(runq + off),
                        runq_delay_ns: runq,
                        offcpu_ns: off,
                        launch_counted_ns: clk.agent_ns(b) - clk.agent_ns(a),
                        ..Default::default()
                    });
                }
                if s.links && !self.stalled {
                    for q in self.link_peers[r as usize].clone() {
                        let f = self.link_factor(it, r, q);
                        let posts = 8u64;
                        let mut lat = 0u64;
                        for _ in 0..posts {
                            lat += (self.jit(s.nic_latency_ns + 40_000) as f64 * f) as u64;
                        }
                        links.push(LinkRecord {
                            pid: 1000 + r,
                            rank: r,
                            peer_rank: q as i64,
                            qp_num: 100 + q,
                            dest_qp_num: 100 + r,
                            start_ns: clk.agent_ns(a),
                            end_ns: clk.agent_ns(b),
                            posts,
                            completions: posts,
                            post_to_completion_ns: lat,
                            bytes: posts * (4 << 20),
                            dlid: 1 + q,
                        });
                    }
                }
            }
            let (ranks, comms) = if !self.sent_identity {
                self.identity_records(h)
            } else {
                (Vec::new(), Vec::new())
            };
            self.batch_seq[h] += 1;
            batches.push((
                cut + 2_000_000,
                Batch {
                    host: s.host_name(h),
                    agent_id: format!("agent-{h}"),
                    seq: self.batch_seq[h],
                    mono_ns: clk.agent_ns(cut),
                    wall_ns: 1_700_000_000_000_000_000 + cut,
                    ranks,
                    exits: Vec::new(),
                    comms,
                    collectives: host_recs,
                    intervals,
                    links,
                    ..Default::default()
                },
            ));
        }
        self.sent_identity = true;
        IterationOutput {
            iteration: it,
            batches,
            samples,
            end_ns: cut,
        }
    }

    fn xfer_factor(&self, it: u64, comm: usize, members: &[u32]) -> f64 {
        if !self.comms[comm].spans_hosts {
            return 1.0;
        }
        let s = &self.spec;
        let hosts_differ = |a: u32, b: u32| s.host_of(a) != s.host_of(b);
        self.fault_active(it, |k| match k {
            FaultKind::Communication { rank, factor } if members.contains(rank) => Some(*factor),
            FaultKind::Link { a, b, factor }
                if members.contains(a) && members.contains(b) && hosts_differ(*a, *b) =>
            {
                Some(*factor)
            }
            _ => None,
        })
        .unwrap_or(1.0)
    }

    fn link_factor(&self, it: u64, r: u32, q: u32) -> f64 {
        self.fault_active(it, |k| match k {
            FaultKind::Communication { rank, factor } if *rank == r || *rank == q => Some(*factor),
            FaultKind::Link { a, b, factor } if (*a == r && *b == q) || (*a == q && *b == r) => {
                Some(*factor)
            }
            _ => None,
        })
        .unwrap_or(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_dp_iteration_is_consistent() {
        let mut g = Generator::new(SynthSpec::dp(2, 4));
        let out = g.next_iteration();
        assert_eq!(out.batches.len(), 2);
        let all: Vec<&CollectiveRecord> = out
            .batches
            .iter()
            .flat_map(|b| b.1.collectives.iter())
            .collect();
        // 8 ranks × 4 buckets, all complete.
        assert_eq!(all.len(), 32);
        assert!(all
            .iter()
            .all(|r| r.gpu_done_ns >= r.gpu_arrive_ns && r.gpu_arrive_ns >= r.host_entry_ns));
        assert!(out.batches[0].1.comms.len() == 4 && !out.batches[0].1.links.is_empty());
    }

    #[test]
    fn compute_fault_makes_gpu_late_host_on_time() {
        let mut spec = SynthSpec::dp(1, 4);
        spec.jitter = 0.0;
        spec.faults.push(Fault::persistent(
            FaultKind::Compute {
                rank: 2,
                factor: 1.3,
            },
            0,
        ));
        let mut g = Generator::new(spec);
        let out = g.next_iteration();
        let recs = &out.batches[0].1.collectives;
        let first: Vec<&CollectiveRecord> = recs.iter().filter(|r| r.seq == 0).collect();
        let slow = first.iter().find(|r| r.rank == 2).unwrap();
        let other = first.iter().find(|r| r.rank == 0).unwrap();
        assert!(slow.gpu_arrive_ns > other.gpu_arrive_ns + 1_000_000);
        assert!(slow.host_entry_ns.abs_diff(other.host_entry_ns) < 100_000);
    }

    #[test]
    fn three_d_layout_runs_and_hang_stalls() {
        let mut spec = SynthSpec::three_d(2, 2, 4, 4);
        spec.faults
            .push(Fault::persistent(FaultKind::Hang { rank: 9 }, 3));
        let mut g = Generator::new(spec);
        for _ in 0..3 {
            let out = g.next_iteration();
            assert!(out.batches.iter().all(|b| !b.1.collectives.is_empty()));
        }
        g.next_iteration();
        let (_, _, missing) = g.truth().hung_at.expect("stuck");
        assert_eq!(missing, 9);
        let after = g.next_iteration();
        assert!(after.batches.iter().all(|b| b.1.collectives.is_empty()));
    }
}

//! Connects the stack collector to the agent's rank discovery: follows each
//! rank process as discovery finds it, stops at exit, and hands the folded
//! windows to the next batch on the agent's reported clock.
//!
//! The collector stamps windows with raw CLOCK_MONOTONIC (BPF time); they are
//! mapped through the same [`HostClock`] as every other record here, so the
//! coordinator can line a verdict's slow window up with them.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use slowrank_shared::wire::{CollectiveRecord, StackWindow};

use crate::{
    clock::HostClock,
    discover::{self, LibKind},
    stack_collector::{CollectorError, LaunchSites, StackCollector},
};

/// Windows kept for the next batch when none is cut (bounded: oldest dropped).
const MAX_PENDING: usize = 256;
/// How far behind the window's end launches are settled. A collective's
/// GPU-side arrival reaches the feed with its record: after the collective
/// completed (the fold holds a record up to `gpuside::HOLD_NS`, 2 s) and a
/// batch shipped it. Launches settled before their collective mark arrived
/// would be timed by the next sync alone, waits for peers included. The
/// launch view thus trails the CPU view by this much.
const SETTLE_LAG_NS: u64 = crate::gpuside::HOLD_NS + 1_000_000_000;

pub struct StackFeed {
    collector: StackCollector,
    /// Launch sites of every rank for good (`--deep`).
    always_deep: bool,
    /// Ranks whose launch sites are recorded, until when.
    launch_until: BTreeMap<u32, std::time::Instant>,
    clock: HostClock,
    /// pid → (rank, whether its CUDA runtime was handed to the collector).
    followed: HashMap<u32, (u32, bool)>,
    /// Exited pids, forgotten after their last window is cut.
    exited: Vec<u32>,
    pending: VecDeque<StackWindow>,
    /// Windows dropped because no batch took them in time.
    pub dropped_windows: u64,
    /// Ranks the collector refused to follow (logged once each).
    pub follow_errors: u64,
}

impl StackFeed {
    pub fn new(collector: StackCollector, clock: HostClock) -> Self {
        Self {
            always_deep: *collector.launch_sites() == LaunchSites::All,
            launch_until: BTreeMap::new(),
            collector,
            clock,
            followed: HashMap::new(),
            exited: Vec::new(),
            pending: VecDeque::new(),
            dropped_windows: 0,
            follow_errors: 0,
        }
    }

    /// Follows new rank processes and lets go of exited ones. `ranks` is the
    /// agent's current (pid, global rank) list.
    pub fn sync(&mut self, ranks: impl Iterator<Item = (u32, u32)>) {
        let live: HashMap<u32, u32> = ranks.collect();
        for (&pid, &rank) in &live {
            let had_cudart = self.followed.get(&pid).map(|f| f.1);
            if had_cudart == Some(true) {
                continue;
            }
            // The runtime is often dlopen'ed after start: follow at once
            // (CPU stacks), and again once it is mapped (launch sites).
            let cudart = discover::mapped_libs(pid)
                .into_iter()
                .find(|(k, _)| *k == LibKind::Cudart)
                .map(|(_, p)| p);
            if had_cudart.is_some() && cudart.is_none() {
                continue;
            }
            match self.follow(pid, rank, cudart.as_deref()) {
                Ok(()) => {
                    self.followed.insert(pid, (rank, cudart.is_some()));
                }
                Err(e) => {
                    self.follow_errors += 1;
                    // Keep it so the error is not retried every scan.
                    self.followed.insert(pid, (rank, true));
                    tracing::warn!(pid, rank, error = %e, "cannot sample this rank's stacks");
                }
            }
        }
        let gone: Vec<u32> = self
            .followed
            .keys()
            .filter(|p| !live.contains_key(p))
            .copied()
            .collect();
        for pid in gone {
            self.followed.remove(&pid);
            let _ = self.collector.unfollow(pid);
            self.exited.push(pid);
        }
    }

    fn follow(
        &mut self,
        pid: u32,
        rank: u32,
        cudart: Option<&std::path::Path>,
    ) -> Result<(), CollectorError> {
        self.collector.follow(pid, rank, cudart)
    }

    /// A coordinator's deep-probe window for `ranks` (global) and `dur`:
    /// launch sites of those on this host, plus one healthy rank of this host
    /// per named one as the flame-graph reference (the coordinator diffs
    /// against ranks that have launch stacks for the window), until the
    /// window ends. Windows add up: a second suspect does not end the first
    /// one's window. A window for no rank here, or for every rank (empty
    /// list: a job-wide look at the verbs), records no launch sites —
    /// trapping every launch of every rank would slow the very host sides
    /// the verdicts compare.
    pub fn open_launch_window(&mut self, ranks: &[u32], dur: std::time::Duration) {
        if self.always_deep {
            return;
        }
        let here: BTreeSet<u32> = self.followed.values().map(|f| f.0).collect();
        let until = std::time::Instant::now() + dur;
        for r in ranks.iter().filter(|r| here.contains(r)) {
            // The nearest unnamed rank of this host: same host, same wires.
            let reference = here
                .iter()
                .filter(|h| !ranks.contains(h))
                .min_by_key(|h| h.abs_diff(*r));
            for x in std::iter::once(r).chain(reference) {
                self.launch_until.insert(*x, until);
            }
        }
        self.update_sites();
    }

    /// Ends every launch-site window now (the coordinator closed them).
    pub fn close_launch_window(&mut self) {
        self.launch_until.clear();
        self.update_sites();
    }

    /// Drops ranks whose window is over and tells the collector.
    fn update_sites(&mut self) {
        if self.always_deep {
            return;
        }
        let now = std::time::Instant::now();
        self.launch_until.retain(|_, t| *t > now);
        let sites = if self.launch_until.is_empty() {
            LaunchSites::Off
        } else {
            LaunchSites::Ranks(self.launch_until.keys().copied().collect())
        };
        if *self.collector.launch_sites() != sites {
            tracing::info!(?sites, "launch-site stacks switched");
            self.collector.set_launch_sites(sites);
        }
    }

    /// Drains the kernel's ring buffer into the current window.
    pub fn poll(&mut self) {
        self.update_sites();
        self.collector.poll();
    }

    /// The threads that issue each rank's collectives, (pid, tid): their
    /// stacks are marked as the training thread from now on.
    pub fn training_threads(&mut self, threads: &[(u32, u32)]) {
        self.collector.training_threads(threads);
    }

    /// GPU-side arrivals and completions of the collectives of a batch (on
    /// the reported clock): progress marks for the launch view's GPU time.
    pub fn collectives(&mut self, records: &[CollectiveRecord]) {
        for c in records.iter().filter(|c| c.gpu_arrive_ns != 0) {
            let done = (c.gpu_done_ns != 0).then(|| self.clock.unmap(c.gpu_done_ns));
            self.collector.gpu_collective(
                c.pid,
                self.clock.unmap(c.host_entry_ns),
                self.clock.unmap(c.gpu_arrive_ns),
                done,
            );
        }
    }

    /// Ends the current window; its folded stacks wait for the next batch.
    /// The `last` window (the agent is stopping), and one after a rank
    /// exited, settle every launch a mark covers. `now` is the window's end
    /// (CLOCK_MONOTONIC), taken by the caller when it decided to cut.
    pub fn cut_window(&mut self, now: u64, last: bool) {
        // A rank that exited is forgotten after this cut: settle what its
        // last marks cover now, or its last seconds of launches are lost.
        let settle = if last || !self.exited.is_empty() {
            now
        } else {
            now.saturating_sub(SETTLE_LAG_NS)
        };
        for mut w in self.collector.cut(now, settle) {
            w.start_ns = self.clock.map(w.start_ns);
            w.end_ns = self.clock.map(w.end_ns);
            if self.pending.len() == MAX_PENDING {
                self.pending.pop_front();
                self.dropped_windows += 1;
            }
            self.pending.push_back(w);
        }
        for pid in self.exited.drain(..) {
            self.collector.forget(pid);
        }
    }

    /// The stack programs' kernel-side counters (samples, drops, captures
    /// sampled away).
    pub fn counters(&self) -> Result<crate::stacks::StackCounters, CollectorError> {
        self.collector.counters()
    }

    /// Windows for the batch being cut.
    pub fn take(&mut self) -> Vec<StackWindow> {
        self.pending.drain(..).collect()
    }

    /// Gives windows back when the batch could not be cut.
    pub fn put_back(&mut self, windows: Vec<StackWindow>) {
        for w in windows.into_iter().rev() {
            self.pending.push_front(w);
        }
        while self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
            self.dropped_windows += 1;
        }
    }
}

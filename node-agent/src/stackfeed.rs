//! Connects the stack collector to the agent's rank discovery: follows each
//! rank process as discovery finds it, stops at exit, and hands the folded
//! windows to the next batch on the agent's reported clock.
//!
//! The collector stamps windows with raw CLOCK_MONOTONIC (BPF time); they are
//! mapped through the same [`HostClock`] as every other record here, so the
//! coordinator can line a verdict's slow window up with them.

use std::collections::{HashMap, VecDeque};

use slowrank_shared::wire::StackWindow;

use crate::{
    clock::{self, HostClock},
    discover::{self, LibKind},
    stack_collector::{CollectorError, StackCollector},
};

/// Windows kept for the next batch when none is cut (bounded: oldest dropped).
const MAX_PENDING: usize = 256;

pub struct StackFeed {
    collector: StackCollector,
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

    /// Drains the kernel's ring buffer into the current window.
    pub fn poll(&mut self) {
        self.collector.poll();
    }

    /// Ends the current window; its folded stacks wait for the next batch.
    pub fn cut_window(&mut self) {
        let now = clock::mono_ns();
        for mut w in self.collector.cut(now, now) {
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

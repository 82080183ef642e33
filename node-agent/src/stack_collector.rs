//! The stack pipeline of one agent in one object: sampler (eBPF) →
//! symbolizer → folder → `StackWindow`s for the next batch.
//!
//! The agent's main loop calls [`StackCollector::follow`] when it finds a
//! rank, [`StackCollector::poll`] often, and [`StackCollector::cut`] when it
//! cuts a batch.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use slowrank_shared::{stack::StackEvent, wire::StackWindow};

use crate::{
    folded::{Folder, DEFAULT_MAX_STACKS},
    stacks::{StackConfig, StackCounters, StackError, StackSampler},
    symbolize::{SymbolizeError, Symbolizer},
};

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error(transparent)]
    Stacks(#[from] StackError),
    #[error(transparent)]
    Symbolize(#[from] SymbolizeError),
}

pub struct StackCollector {
    sampler: StackSampler,
    sym: Symbolizer,
    folder: Folder,
    launch_files: HashSet<PathBuf>,
    deep: bool,
    buf: Vec<StackEvent>,
    /// Ring-buffer records of an unexpected size (kernel/user mismatch).
    pub bad_records: u64,
}

impl StackCollector {
    /// Starts sampling; `deep` adds launch sites and sync marks for the
    /// CUDA runtimes of followed ranks.
    pub fn start(config: StackConfig, deep: bool, now_ns: u64) -> Result<Self, CollectorError> {
        Ok(Self {
            sampler: StackSampler::start(config)?,
            sym: Symbolizer::new(),
            folder: Folder::new(now_ns, DEFAULT_MAX_STACKS),
            launch_files: HashSet::new(),
            deep,
            buf: Vec::new(),
            bad_records: 0,
        })
    }

    /// Follows rank process `pid`. `cudart` is the CUDA runtime file it
    /// maps (exact path from /proc/PID/maps), if any; each file is probed
    /// once for all processes. Call after the process loaded its libraries
    /// so their symbols are cached for after it exits.
    pub fn follow(
        &mut self,
        pid: u32,
        rank: u32,
        cudart: Option<&Path>,
    ) -> Result<(), CollectorError> {
        self.sym.register(pid)?;
        self.folder.set_rank(pid, rank);
        self.sampler.follow(pid, rank)?;
        if let (true, Some(path)) = (self.deep, cudart) {
            if !self.launch_files.contains(path) {
                self.sampler.attach_launches(path)?;
                self.sampler.attach_syncs(path)?;
                self.launch_files.insert(path.to_owned());
            }
        }
        Ok(())
    }

    /// Stops sampling `pid` (it exited). Its folded stacks stay in the
    /// current window.
    pub fn unfollow(&mut self, pid: u32) -> Result<(), CollectorError> {
        Ok(self.sampler.unfollow(pid)?)
    }

    /// Drains the ring buffer into the current window; returns records read.
    pub fn poll(&mut self) -> usize {
        self.buf.clear();
        let (n, bad) = self.sampler.drain(&mut self.buf);
        self.bad_records += bad as u64;
        for e in &self.buf {
            self.folder.add(e, &mut self.sym);
        }
        n
    }

    /// A collective's GPU-side arrival and completion on `pid` (from the
    /// collective fold), for the launch view's GPU time.
    pub fn gpu_collective(
        &mut self,
        pid: u32,
        enqueued_ns: u64,
        reached_ns: u64,
        done_ns: Option<u64>,
    ) {
        self.folder
            .gpu_collective(pid, enqueued_ns, reached_ns, done_ns);
    }

    /// Ends the window at `end_ns` (launches settled up to `settled_upto_ns`).
    pub fn cut(&mut self, end_ns: u64, settled_upto_ns: u64) -> Vec<StackWindow> {
        self.poll();
        self.folder.cut(end_ns, settled_upto_ns)
    }

    /// Forgets an exited process after its last window was cut.
    pub fn forget(&mut self, pid: u32) {
        self.sym.forget(pid);
        self.folder.forget(pid);
    }

    pub fn counters(&self) -> Result<StackCounters, CollectorError> {
        Ok(self.sampler.counters()?)
    }

    /// Threads whose off-CPU state the kernel holds (see
    /// [`StackSampler::off_cpu_threads`]).
    pub fn off_cpu_threads(&self) -> Result<usize, CollectorError> {
        Ok(self.sampler.off_cpu_threads()?)
    }

    /// Records from processes without a rank (should stay 0).
    pub fn unknown_pid_records(&self) -> u64 {
        self.folder.unknown_pid_records
    }
}

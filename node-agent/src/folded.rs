//! Folds raw stack records into per-rank, per-view stacks over a window,
//! symbolized, with interned frame names and a bound on distinct stacks.
//!
//! CPU view: root is the thread name, then user frames (outermost first),
//! then kernel frames (suffixed `_[k]`); weight is thread time in µs (an
//! on-CPU sample stands for one sampling period, an off-CPU record for the
//! time the thread was away). Launch view: the launching user stack with a
//! `GPU:<kernel>` leaf; weight is the launch's estimated GPU time in µs
//! ([`crate::gputime`]), settled when a progress mark covers it.

use std::{collections::HashMap, sync::Arc};

use slowrank_shared::{
    stack::{flag, StackEvent, StackKind},
    wire::{FoldedStack, StackView, StackWindow},
};

use crate::{gputime::GpuTimer, symbolize::Symbolizer};

/// Frame inserted under the thread name when a stack was cut short.
pub const TRUNCATED: &str = "[truncated]";
/// The one stack that absorbs distinct stacks beyond the bound.
pub const OTHER: &str = "[other stacks]";
/// Suffix of the root frame of a process's main thread.
pub const MAIN_SUFFIX: &str = " [main]";
/// Suffix of the root frame of a thread other than main that issues the
/// rank's collectives (the coordinator's `flame::TRAIN_SUFFIX`).
pub const TRAIN_SUFFIX: &str = " [train]";
/// Default bound on distinct stacks per rank, view and window.
pub const DEFAULT_MAX_STACKS: usize = 4096;

#[derive(Default)]
struct Acc {
    strings: Vec<String>,
    index: HashMap<Arc<str>, u32>,
    stacks: HashMap<Vec<u32>, u64>,
    records: u64,
    truncated: u64,
    overflow_weight: u64,
}

impl Acc {
    fn intern(&mut self, s: &Arc<str>) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(s.to_string());
        self.index.insert(s.clone(), i);
        i
    }

    fn add(&mut self, frames: &[Arc<str>], weight: u64, truncated: bool, max: usize) {
        self.records += 1;
        if truncated {
            self.truncated += 1;
        }
        let ids: Vec<u32> = frames.iter().map(|f| self.intern(f)).collect();
        if let Some(w) = self.stacks.get_mut(&ids) {
            *w += weight;
        } else if self.stacks.len() < max {
            self.stacks.insert(ids, weight);
        } else {
            self.overflow_weight += weight;
        }
    }
}

/// Folds stacks for the ranks it is told about.
pub struct Folder {
    ranks: HashMap<u32, u32>,
    acc: HashMap<(u32, StackView), Acc>,
    start_ns: u64,
    /// Where the previous cut's settling stopped: the launch view's window
    /// starts there (its launches are settled behind the CPU view's).
    settled_ns: u64,
    max_stacks: usize,
    /// Records from processes with no known rank (dropped, counted).
    pub unknown_pid_records: u64,
    /// Launch records whose stack was cut short.
    pub truncated_launches: u64,
    gpu: GpuTimer,
    /// Per process: threads other than main seen issuing collectives.
    train: HashMap<u32, Vec<u32>>,
}

impl Folder {
    pub fn new(start_ns: u64, max_stacks: usize) -> Self {
        Self {
            ranks: HashMap::new(),
            acc: HashMap::new(),
            start_ns,
            settled_ns: start_ns,
            max_stacks: max_stacks.max(1),
            unknown_pid_records: 0,
            truncated_launches: 0,
            gpu: GpuTimer::default(),
            train: HashMap::new(),
        }
    }

    /// The threads that issue each rank's collectives, (pid, tid).
    pub fn set_training_threads(&mut self, threads: &[(u32, u32)]) {
        self.train.clear();
        for &(pid, tid) in threads.iter().filter(|(p, t)| p != t) {
            self.train.entry(pid).or_default().push(tid);
        }
    }

    /// Says which rank process `pid` is.
    pub fn set_rank(&mut self, pid: u32, rank: u32) {
        self.ranks.insert(pid, rank);
    }

    /// Forgets process `pid` (exited; its last window was cut).
    pub fn forget(&mut self, pid: u32) {
        self.ranks.remove(&pid);
        self.train.remove(&pid);
        self.gpu.forget(pid);
    }

    /// Folds one record; symbolizes it through `sym`.
    pub fn add(&mut self, ev: &StackEvent, sym: &mut Symbolizer) {
        let Some(&rank) = self.ranks.get(&ev.pid) else {
            self.unknown_pid_records += 1;
            return;
        };
        let Some(kind) = StackKind::from_raw(ev.kind) else {
            return;
        };
        match kind {
            StackKind::SyncCall => return self.gpu.sync_call(ev.pid, ev.tid, ev.ts_ns),
            StackKind::SyncReturn => return self.gpu.sync_return(ev.pid, ev.tid, ev.ts_ns),
            _ => {}
        }
        let truncated = ev.flags & (flag::USER_TRUNCATED | flag::KERNEL_TRUNCATED) != 0;
        let mut frames: Vec<Arc<str>> = Vec::with_capacity(ev.user_frames().len() + 8);
        let comm = String::from_utf8_lossy(ev.comm());
        // The training loop runs on the main thread and on whichever threads
        // issue the collectives (PyTorch DDP reduces from autograd hooks):
        // mark them so reports can focus on them.
        let issues = self.train.get(&ev.pid).is_some_and(|t| t.contains(&ev.tid));
        frames.push(if ev.tid == ev.pid {
            Arc::from(format!("{comm}{MAIN_SUFFIX}"))
        } else if issues {
            Arc::from(format!("{comm}{TRAIN_SUFFIX}"))
        } else {
            Arc::from(comm.as_ref())
        });
        if truncated {
            frames.push(Arc::from(TRUNCATED));
        }
        // Perf-event samples and uprobes start at the IP; an off-CPU stack
        // starts at a return address too (the thread is inside a call).
        let first_is_ip = kind != StackKind::OffCpu;
        for names in sym.user(ev.pid, ev.user_frames(), first_is_ip).iter().rev() {
            frames.extend(names.iter().rev().cloned());
        }
        match kind {
            StackKind::OnCpu | StackKind::OffCpu => {
                for names in sym.kernel(ev.kernel_frames()).iter().rev() {
                    frames.extend(names.iter().rev().map(|n| Arc::from(format!("{n}_[k]"))));
                }
                let max = self.max_stacks;
                self.acc.entry((rank, StackView::Cpu)).or_default().add(
                    &frames,
                    (ev.weight_ns / 1000).max(1),
                    truncated,
                    max,
                );
            }
            StackKind::Launch => {
                let kernel = sym
                    .user(ev.pid, &[ev.addr], true)
                    .first()
                    .and_then(|n| n.last().cloned())
                    .unwrap_or_else(|| Arc::from(format!("{:#x}", ev.addr)));
                frames.push(Arc::from(format!("GPU:{kernel}")));
                if truncated {
                    self.truncated_launches += 1;
                }
                self.gpu.launch(ev.pid, ev.ts_ns, frames);
            }
            StackKind::SyncCall | StackKind::SyncReturn => {}
        }
    }

    /// The GPU of `pid` reached a collective enqueued at `enqueued_ns` at
    /// `reached_ns` and finished it at `done_ns` (from the collective fold:
    /// the proxy's first send and last completion). Sharpens the launch
    /// view's GPU time estimate; see [`crate::gputime`].
    pub fn gpu_collective(
        &mut self,
        pid: u32,
        enqueued_ns: u64,
        reached_ns: u64,
        done_ns: Option<u64>,
    ) {
        self.gpu.collective(pid, enqueued_ns, reached_ns, done_ns);
    }

    /// Moves launches whose GPU time is known (marks up to `upto_ns`) into
    /// the launch view of the current window.
    fn settle(&mut self, upto_ns: u64) {
        let max = self.max_stacks;
        for s in self.gpu.settle(upto_ns) {
            let Some(&rank) = self.ranks.get(&s.pid) else {
                continue;
            };
            let truncated = s.frames.iter().any(|f| f.as_ref() == TRUNCATED);
            self.acc.entry((rank, StackView::Launch)).or_default().add(
                &s.frames,
                s.gpu_us.round() as u64,
                truncated,
                max,
            );
        }
    }

    /// Ends the window at `end_ns`: returns its stacks and starts the next.
    /// Launches are settled with the progress marks reached by
    /// `settled_upto_ns` (lagging `end_ns` when GPU arrivals come late); the
    /// launch view's window spans the settled time, `[previous settle,
    /// settled_upto_ns]`, which is when that GPU work ran — not the CPU
    /// view's `[previous end, end_ns]`.
    pub fn cut(&mut self, end_ns: u64, settled_upto_ns: u64) -> Vec<StackWindow> {
        self.settle(settled_upto_ns);
        let start_ns = std::mem::replace(&mut self.start_ns, end_ns);
        let settled_from = self.settled_ns;
        // Settled "up to forever" (a final cut) still ends at the cut.
        self.settled_ns = settled_upto_ns.min(end_ns).max(settled_from);
        let settled_to = self.settled_ns;
        let mut out: Vec<StackWindow> = std::mem::take(&mut self.acc)
            .into_iter()
            .map(|((rank, view), mut a)| {
                if a.overflow_weight > 0 {
                    let other = a.intern(&Arc::from(OTHER));
                    a.stacks.insert(vec![other], a.overflow_weight);
                }
                let mut stacks: Vec<FoldedStack> = a
                    .stacks
                    .into_iter()
                    .map(|(frames, weight)| FoldedStack { frames, weight })
                    .collect();
                stacks.sort_by(|x, y| x.frames.cmp(&y.frames));
                let (start_ns, end_ns) = match view {
                    StackView::Launch => (settled_from, settled_to),
                    StackView::Cpu => (start_ns, end_ns),
                };
                StackWindow {
                    rank,
                    view,
                    start_ns,
                    end_ns,
                    strings: a.strings,
                    stacks,
                    records: a.records,
                    truncated: a.truncated,
                    overflow_weight: a.overflow_weight,
                }
            })
            .collect();
        out.sort_by_key(|w| (w.rank, w.view as u8));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slowrank_shared::stack::{MAX_KERNEL_FRAMES, MAX_USER_FRAMES};

    fn ev(pid: u32, kind: StackKind, weight_ns: u64, user: &[u64]) -> StackEvent {
        ev_on(pid, pid, kind, weight_ns, user)
    }

    fn ev_on(pid: u32, tid: u32, kind: StackKind, weight_ns: u64, user: &[u64]) -> StackEvent {
        let mut e = StackEvent {
            ts_ns: 0,
            weight_ns,
            addr: 0,
            pid,
            tid,
            kind: kind as u32,
            flags: 0,
            user_len: user.len() as u32,
            kernel_len: 0,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
            user: [0; MAX_USER_FRAMES],
            kernel: [0; MAX_KERNEL_FRAMES],
        };
        e.user[..user.len()].copy_from_slice(user);
        e
    }

    #[test]
    fn folds_interns_and_bounds() {
        let mut sym = Symbolizer::new();
        let mut f = Folder::new(0, 2);
        f.set_rank(999_999, 3);
        // Addresses in a pid that does not exist: all unknown, yet counted.
        for (i, w) in [(1u64, 10_000u64), (2, 20_000), (3, 30_000), (1, 5_000)] {
            f.add(&ev(999_999, StackKind::OnCpu, w, &[i]), &mut sym);
        }
        f.add(&ev(7, StackKind::OnCpu, 1000, &[1]), &mut sym);
        assert_eq!(f.unknown_pid_records, 1);
        let w = f.cut(100, 100);
        assert_eq!(w.len(), 1);
        let w = &w[0];
        assert_eq!(
            (w.rank, w.view, w.start_ns, w.end_ns),
            (3, StackView::Cpu, 0, 100)
        );
        assert_eq!(w.records, 4);
        let total: u64 = w.stacks.iter().map(|s| s.weight).sum();
        assert_eq!(total, 65, "weights in µs, nothing lost to the bound");
        // All frames are [unknown], so the stacks fold to one distinct stack.
        assert!(w.stacks.len() <= 2);
        assert!(w.strings.iter().any(|s| s == "worker [main]"));
        for s in &w.stacks {
            assert!(s.frames.iter().all(|&i| (i as usize) < w.strings.len()));
        }
        assert!(f.cut(200, 200).is_empty(), "the next window starts empty");
    }

    #[test]
    fn a_thread_that_issues_collectives_is_marked_as_the_training_thread() {
        let mut sym = Symbolizer::new();
        let mut f = Folder::new(0, 64);
        f.set_rank(999_999, 3);
        // tid 1001 issues collectives (a DDP autograd thread), 1002 does not;
        // the main thread's own entry in the list changes nothing.
        f.set_training_threads(&[(999_999, 1001), (999_999, 999_999)]);
        for tid in [999_999, 1001, 1002] {
            f.add(&ev_on(999_999, tid, StackKind::OnCpu, 1000, &[1]), &mut sym);
        }
        let w = f.cut(100, 100);
        let names: Vec<&str> = w[0].strings.iter().map(String::as_str).collect();
        assert!(names.contains(&"worker [main]"), "{names:?}");
        assert!(names.contains(&"worker [train]"), "{names:?}");
        assert!(names.contains(&"worker"), "{names:?}");
        // Forgetting the process forgets its threads.
        f.forget(999_999);
        f.set_rank(999_999, 3);
        f.add(
            &ev_on(999_999, 1001, StackKind::OnCpu, 1000, &[1]),
            &mut sym,
        );
        let w = f.cut(200, 200);
        assert!(!w[0].strings.iter().any(|s| s.ends_with(TRAIN_SUFFIX)));
    }

    #[test]
    fn distinct_stacks_beyond_the_bound_are_counted_not_lost() {
        let mut sym = Symbolizer::new();
        let mut f = Folder::new(0, 2);
        f.set_rank(999_999, 0);
        // Main thread vs other threads give distinct root frames.
        for (tid, w) in [(999_999, 1_000u64), (1, 2_000), (2, 3_000), (2, 4_000)] {
            let mut e = ev_on(999_999, tid, StackKind::OnCpu, w, &[1]);
            e.comm = [b'a' + (tid % 26) as u8; 16];
            f.add(&e, &mut sym);
        }
        let w = f.cut(1, 1).remove(0);
        assert_eq!(
            w.overflow_weight, 7,
            "the third and fourth record overflowed"
        );
        let total: u64 = w.stacks.iter().map(|s| s.weight).sum();
        assert_eq!(total, 10);
        let other = w.strings.iter().position(|s| s == OTHER).unwrap() as u32;
        assert!(w
            .stacks
            .iter()
            .any(|s| s.frames == vec![other] && s.weight == 7));
    }
}

//! What slowrank's probes cost the ranks it watches.
//!
//! At start-up the agent measures this host's trap cost the way aya's own
//! tests probe a function: it attaches its real programs to a function in
//! its own binary, calls it in a loop, and subtracts the same loop unprobed
//! ([`measure`]). The kernel counts every trap per followed process
//! (`FOLLOWED` map); [`HitLedger`] turns those running totals into
//! per-interval deltas, and [`TrapCost::cost_ns`] turns hits into rank time.
//! [`CountWindow`] accounts for the time the windowed launch counters were
//! attached, so a launch rate is only ever computed over counted time.

use std::{collections::HashMap, path::PathBuf, time::Instant};

use slowrank_shared::probe::cuda_count;

use crate::probes::{Attach, ProbeError, Probes};

/// The function the calibration probes. `no_mangle` keeps the symbol in the
/// binary's symbol table, `inline(never)` keeps every call a real call.
#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_trap_calibration(a: u64, b: u64) -> u64 {
    std::hint::black_box(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b)
}

const CALIBRATION_SYMBOL: &str = "slowrank_trap_calibration";

/// Calls per calibration round: at ~1–20 µs per trap a round takes
/// 0.5–10 ms, short enough to often run unpreempted, long enough to dwarf
/// timer resolution.
const CALLS_PER_ROUND: u64 = 500;
/// Rounds per set-up; the fastest round is kept: preemption and other load
/// only ever add time, and the trap itself is what the job pays per hit.
const ROUNDS: usize = 15;

#[derive(Debug, thiserror::Error)]
pub enum SelfCostError {
    #[error("cannot find the agent's own executable to probe")]
    Exe(#[source] std::io::Error),
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// This host's measured cost of one probe hit, in ns of the probed thread's
/// time (trap, program, return to user space), above an unprobed call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrapCost {
    /// A uprobe alone (the in-kernel counting program: no ring-buffer record).
    pub entry_ns: f64,
    /// A uprobe + uretprobe pair (the collective/sync programs, each with a
    /// ring-buffer record).
    pub pair_ns: f64,
    /// The unprobed call, for reference.
    pub bare_ns: f64,
}

impl TrapCost {
    /// Rank time taken by `entry` uprobe hits and `ret` uretprobe hits.
    pub fn cost_ns(&self, entry: u64, ret: u64) -> f64 {
        entry as f64 * self.entry_ns + ret as f64 * self.return_ns()
    }

    /// A uretprobe hit: the pair less its entry.
    pub fn return_ns(&self) -> f64 {
        (self.pair_ns - self.entry_ns).max(0.0)
    }
}

/// Measures [`TrapCost`] on this host with the agent's own programs, on a
/// function of its own binary, limited to its own process. Leaves nothing
/// attached or followed; events it caused are drained and dropped.
pub fn measure(probes: &mut Probes) -> Result<TrapCost, SelfCostError> {
    let exe: PathBuf = std::fs::read_link("/proc/self/exe").map_err(SelfCostError::Exe)?;
    let pid = std::process::id();
    let bare = time_calls();
    probes.follow(pid, None)?;
    let result = (|| -> Result<TrapCost, SelfCostError> {
        let id = probes.attach_own(&exe, CALIBRATION_SYMBOL, Attach::Call, pid)?;
        let pair = time_calls();
        probes.detach(id);
        let id = probes.attach_own(
            &exe,
            CALIBRATION_SYMBOL,
            Attach::Count {
                class: cuda_count::LAUNCH,
            },
            pid,
        )?;
        let entry = time_calls();
        probes.detach(id);
        Ok(TrapCost {
            entry_ns: (entry - bare).max(0.0),
            pair_ns: (pair - bare).max(0.0),
            bare_ns: bare,
        })
    })();
    let _ = probes.unfollow(pid);
    let _ = probes.forget_counts(pid);
    let mut scratch = Vec::new();
    probes.drain_raw(&mut scratch);
    result
}

/// Fastest round's mean ns per call.
fn time_calls() -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let mut acc = 0u64;
            for i in 0..CALLS_PER_ROUND {
                acc = acc.wrapping_add(slowrank_trap_calibration(i, acc));
            }
            std::hint::black_box(acc);
            t.elapsed().as_nanos() as f64 / CALLS_PER_ROUND as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[0]
}

/// Running totals per process as the kernel keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub entry_hits: u64,
    pub return_hits: u64,
    /// Of those, the verbs data path's (NCCL's proxy threads).
    pub datapath_entry_hits: u64,
    pub datapath_return_hits: u64,
    /// Calls counted by the windowed counters (launch, graph, memcpy,
    /// malloc, free): each one an entry hit.
    pub counted_calls: u64,
}

/// The agent process's CPU time so far (user and system, every thread).
pub fn process_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64)
}

/// Hands out the agent's own CPU time since the last call, for the
/// intervals it ships ([`slowrank_shared::wire::RankInterval::agent_cpu_ns`]):
/// where the agent shares the ranks' cores, its drain loop, `/proc` scans
/// and stack sampler take rank time the trap count does not see (on the
/// 2-vCPU overhead benchmark, most of the default set's step-time cost).
#[derive(Debug)]
pub struct OwnCpu {
    last: Option<u64>,
}

impl OwnCpu {
    /// Counting from now.
    pub fn start() -> Self {
        Self {
            last: process_cpu_ns(),
        }
    }

    /// CPU ns used since the last call (0 where the clock is unreadable).
    pub fn take(&mut self) -> u64 {
        let Some(now) = process_cpu_ns() else {
            return 0;
        };
        let d = self.last.map_or(0, |l| now.saturating_sub(l));
        self.last = Some(now);
        d
    }
}

/// Turns the kernel's running totals into per-interval deltas. Totals are
/// remembered after a process is unfollowed, so its last interval (closed
/// after the map entry is gone) still gets its hits.
#[derive(Debug, Default)]
pub struct HitLedger {
    latest: HashMap<u32, Totals>,
    reported: HashMap<u32, Totals>,
}

impl HitLedger {
    /// Records the latest hit totals read from the kernel.
    pub fn hits(&mut self, rows: &[(u32, [u64; 4])]) {
        for &(pid, [e, r, de, dr]) in rows {
            let t = self.latest.entry(pid).or_default();
            t.entry_hits = t.entry_hits.max(e);
            t.return_hits = t.return_hits.max(r);
            t.datapath_entry_hits = t.datapath_entry_hits.max(de);
            t.datapath_return_hits = t.datapath_return_hits.max(dr);
        }
    }

    /// Records the latest counted-call totals read from the kernel.
    pub fn counts(&mut self, rows: &[(u32, [u64; cuda_count::SLOTS])]) {
        for (pid, c) in rows {
            let t = self.latest.entry(*pid).or_default();
            t.counted_calls = t.counted_calls.max(c.iter().sum());
        }
    }

    /// What `pid` took since the last call for it.
    pub fn take(&mut self, pid: u32) -> Totals {
        let now = self.latest.get(&pid).copied().unwrap_or_default();
        let was = self.reported.insert(pid, now).unwrap_or_default();
        Totals {
            entry_hits: now.entry_hits.saturating_sub(was.entry_hits),
            return_hits: now.return_hits.saturating_sub(was.return_hits),
            datapath_entry_hits: now
                .datapath_entry_hits
                .saturating_sub(was.datapath_entry_hits),
            datapath_return_hits: now
                .datapath_return_hits
                .saturating_sub(was.datapath_return_hits),
            counted_calls: now.counted_calls.saturating_sub(was.counted_calls),
        }
    }

    /// Forgets a process whose last interval was reported.
    pub fn forget(&mut self, pid: u32) {
        self.latest.remove(&pid);
        self.reported.remove(&pid);
    }
}

/// Time the windowed counters were attached, host-wide (they attach per
/// library file, for every rank at once).
#[derive(Debug, Default)]
pub struct CountWindow {
    on_since: Option<u64>,
    counted: u64,
}

impl CountWindow {
    /// The counters were attached (`on`) or detached at raw time `now`.
    pub fn set(&mut self, on: bool, now: u64) {
        match (on, self.on_since) {
            (true, None) => self.on_since = Some(now),
            (false, Some(t)) => {
                self.counted += now.saturating_sub(t);
                self.on_since = None;
            }
            _ => {}
        }
    }

    pub fn is_on(&self) -> bool {
        self.on_since.is_some()
    }

    /// Counted time since the last take, up to `now`.
    pub fn take(&mut self, now: u64) -> u64 {
        if let Some(t) = self.on_since.as_mut() {
            self.counted += now.saturating_sub(*t);
            *t = now;
        }
        std::mem::take(&mut self.counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_splits_entry_and_return() {
        let c = TrapCost {
            entry_ns: 4.0,
            pair_ns: 10.0,
            bare_ns: 1.0,
        };
        assert_eq!(c.return_ns(), 6.0);
        assert_eq!(c.cost_ns(10, 5), 70.0);
    }

    #[test]
    fn ledger_reports_deltas_and_survives_unfollow() {
        let mut l = HitLedger::default();
        l.hits(&[(7, [10, 8, 4, 2])]);
        l.counts(&[(7, [5, 0, 1, 0, 0, 0, 0, 0])]);
        assert_eq!(
            l.take(7),
            Totals {
                entry_hits: 10,
                return_hits: 8,
                datapath_entry_hits: 4,
                datapath_return_hits: 2,
                counted_calls: 6
            }
        );
        l.hits(&[(7, [15, 12, 5, 2])]);
        // The process is unfollowed: no more rows, the last delta remains.
        assert_eq!(
            l.take(7),
            Totals {
                entry_hits: 5,
                return_hits: 4,
                datapath_entry_hits: 1,
                datapath_return_hits: 0,
                counted_calls: 0
            }
        );
        assert_eq!(l.take(7), Totals::default());
        l.forget(7);
        assert_eq!(l.take(7), Totals::default());
    }

    #[test]
    fn count_window_accumulates_on_time() {
        let mut w = CountWindow::default();
        assert_eq!(w.take(100), 0);
        w.set(true, 100);
        w.set(true, 150);
        assert_eq!(w.take(300), 200);
        w.set(false, 350);
        assert_eq!(w.take(1000), 50);
        assert!(!w.is_on());
    }
}

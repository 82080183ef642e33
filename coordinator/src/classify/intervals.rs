//! Per-rank host counters ([`RankInterval`](slowrank_shared::wire::RankInterval))
//! on the coordinator clock: run-queue delay, off-CPU time outside GPU syncs,
//! launch rate — the direct evidence for a host-slow rank.

use foldhash::HashMap;
use std::collections::VecDeque;

use crate::clock::{median, CoordNs};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalObs {
    pub start: CoordNs,
    pub end: CoordNs,
    pub launches: u64,
    /// Part of the interval the launch counters were attached (agents
    /// count launches only in deep windows and samples); 0: not counted.
    pub launch_counted_ns: u64,
    pub sync_wait_ns: u64,
    /// Scheduler split of the main thread's time (all 0: not measured).
    pub oncpu_ns: u64,
    pub runq_delay_ns: u64,
    pub offcpu_ns: u64,
}

impl IntervalObs {
    fn sched_measured(&self) -> bool {
        self.oncpu_ns + self.runq_delay_ns + self.offcpu_ns > 0
    }
}

/// A rank's CPU picture over a window next to its peers' medians.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuEvidence {
    /// Whether the scheduler split below was measured (the agent reads it;
    /// synthetic or old streams may not carry it).
    pub measured: bool,
    pub oncpu_frac: f64,
    pub oncpu_frac_peers: f64,
    pub runq_frac: f64,
    pub runq_frac_peers: f64,
    /// Off-CPU time not spent blocked in a GPU sync, as a fraction of wall time.
    pub offcpu_frac: f64,
    pub offcpu_frac_peers: f64,
    pub launches_per_s: f64,
    pub launches_per_s_peers: f64,
    /// Whether both rates above were counted in this window (launch
    /// counters are windowed): without it they say nothing.
    pub launches_measured: bool,
}

impl CpuEvidence {
    /// How much more of its wall time the rank's host spent outside GPU
    /// syncs than its peers' (on a CPU, waiting for one, or asleep): the
    /// time a slow host adds. Zero when not measured.
    pub fn host_excess(&self) -> f64 {
        if !self.measured {
            return 0.0;
        }
        (self.oncpu_frac + self.runq_frac + self.offcpu_frac)
            - (self.oncpu_frac_peers + self.runq_frac_peers + self.offcpu_frac_peers)
    }
}

#[derive(Debug, Default)]
pub struct IntervalStore {
    per_rank: HashMap<u32, VecDeque<IntervalObs>>,
}

const KEEP: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Fractions {
    /// (on-CPU, run queue, off-CPU outside syncs), when measured.
    sched: Option<(f64, f64, f64)>,
    /// Over the counted part of the window only; None: never counted.
    launches_per_s: Option<f64>,
}

impl IntervalStore {
    pub fn add(&mut self, rank: u32, o: IntervalObs) {
        let q = self.per_rank.entry(rank).or_default();
        q.push_back(o);
        while q.len() > KEEP {
            q.pop_front();
        }
    }

    /// Fractions of wall time over the intervals overlapping `[from, to]`.
    fn fractions(&self, rank: u32, from: CoordNs, to: CoordNs) -> Option<Fractions> {
        let q = self.per_rank.get(&rank)?;
        let (mut dur, mut launches, mut counted) = (0f64, 0f64, 0f64);
        let (mut sdur, mut on, mut runq, mut off) = (0f64, 0f64, 0f64, 0f64);
        for o in q.iter().filter(|o| o.end >= from && o.start <= to) {
            let d = (o.end - o.start).max(1) as f64;
            dur += d;
            launches += o.launches as f64;
            counted += o.launch_counted_ns.min((o.end - o.start).max(0) as u64) as f64;
            if o.sched_measured() {
                sdur += d;
                on += o.oncpu_ns as f64;
                runq += o.runq_delay_ns as f64;
                off += o.offcpu_ns.saturating_sub(o.sync_wait_ns) as f64;
            }
        }
        (dur > 0.0).then(|| Fractions {
            sched: (sdur > 0.0).then(|| (on / sdur, runq / sdur, off / sdur)),
            launches_per_s: (counted > 0.0).then(|| launches / counted * 1e9),
        })
    }

    /// The ranks' median run-queue delay over `[from, to]`, as a share of
    /// wall time (ranks whose scheduler split was measured; `None`
    /// without one).
    pub fn runq_median(&self, from: CoordNs, to: CoordNs) -> Option<f64> {
        let mut v: Vec<f64> = self
            .per_rank
            .keys()
            .filter_map(|r| self.fractions(*r, from, to)?.sched.map(|s| s.1))
            .collect();
        median(&mut v)
    }

    pub fn evidence(
        &self,
        rank: u32,
        peers: &[u32],
        from: CoordNs,
        to: CoordNs,
    ) -> Option<CpuEvidence> {
        let me = self.fractions(rank, from, to)?;
        let others: Vec<Fractions> = peers
            .iter()
            .filter(|p| **p != rank)
            .filter_map(|p| self.fractions(*p, from, to))
            .collect();
        if others.is_empty() {
            return None;
        }
        let med = |mut v: Vec<f64>| median(&mut v).unwrap_or(0.0);
        let sched: Vec<(f64, f64, f64)> = others.iter().filter_map(|f| f.sched).collect();
        let (on, runq, off) = me.sched.unwrap_or_default();
        let measured = me.sched.is_some() && !sched.is_empty();
        Some(CpuEvidence {
            measured,
            oncpu_frac: on,
            oncpu_frac_peers: med(sched.iter().map(|x| x.0).collect()),
            runq_frac: runq,
            runq_frac_peers: med(sched.iter().map(|x| x.1).collect()),
            offcpu_frac: off,
            offcpu_frac_peers: med(sched.iter().map(|x| x.2).collect()),
            launches_per_s: me.launches_per_s.unwrap_or(0.0),
            launches_per_s_peers: med(others.iter().filter_map(|f| f.launches_per_s).collect()),
            launches_measured: me.launches_per_s.is_some()
                && others.iter().any(|f| f.launches_per_s.is_some()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(start: CoordNs, on: u64, runq: u64, off: u64, sync: u64) -> IntervalObs {
        IntervalObs {
            start,
            end: start + 200_000_000,
            launches: 100,
            launch_counted_ns: 200_000_000,
            sync_wait_ns: sync,
            oncpu_ns: on,
            runq_delay_ns: runq,
            offcpu_ns: off,
        }
    }

    #[test]
    fn launch_rate_is_over_counted_time_and_absent_when_never_counted() {
        let mut s = IntervalStore::default();
        // The suspect's counters ran a quarter of its interval: 100
        // launches in 50 ms is 2,000/s, not 500/s.
        s.add(
            1,
            IntervalObs {
                launch_counted_ns: 50_000_000,
                ..obs(0, 0, 0, 0, 0)
            },
        );
        s.add(2, obs(0, 0, 0, 0, 0));
        let e = s.evidence(1, &[1, 2], 0, 100_000_000).unwrap();
        assert!(e.launches_measured);
        assert!((e.launches_per_s - 2000.0).abs() < 1e-6, "{e:?}");
        assert!((e.launches_per_s_peers - 500.0).abs() < 1e-6, "{e:?}");
        // Never counted in the window: no launch evidence, not a zero rate.
        let mut s = IntervalStore::default();
        for r in [1, 2] {
            s.add(
                r,
                IntervalObs {
                    launches: 0,
                    launch_counted_ns: 0,
                    ..obs(0, 0, 0, 0, 0)
                },
            );
        }
        let e = s.evidence(1, &[1, 2], 0, 100_000_000).unwrap();
        assert!(!e.launches_measured);
    }

    #[test]
    fn off_cpu_outside_syncs_is_compared_with_the_peers_median() {
        let mut s = IntervalStore::default();
        // 200 ms intervals: the suspect sleeps 80 ms outside syncs, its
        // peers 40 ms; everyone 40 ms on a CPU and 40 ms runnable.
        s.add(1, obs(0, 40_000_000, 40_000_000, 120_000_000, 40_000_000));
        for p in [2, 3] {
            s.add(p, obs(0, 40_000_000, 40_000_000, 120_000_000, 80_000_000));
        }
        let e = s.evidence(1, &[1, 2, 3], 0, 100_000_000).unwrap();
        assert!(e.measured);
        assert!((e.offcpu_frac - 0.4).abs() < 1e-9, "{e:?}");
        assert!((e.offcpu_frac_peers - 0.2).abs() < 1e-9, "{e:?}");
        assert!((e.host_excess() - 0.2).abs() < 1e-9, "{e:?}");
    }

    /// The job's run-queue share is its ranks' median: one starved rank
    /// does not make the host contended, most do.
    #[test]
    fn the_ranks_median_run_queue_share() {
        let mut s = IntervalStore::default();
        assert_eq!(s.runq_median(0, 10_000), None);
        s.add(0, obs(0, 100_000_000, 80_000_000, 0, 0));
        s.add(1, obs(0, 150_000_000, 2_000_000, 0, 0));
        s.add(2, obs(0, 150_000_000, 4_000_000, 0, 0));
        let m = s.runq_median(0, 1_000).unwrap();
        assert!((m - 0.02).abs() < 1e-9, "{m}");
        assert_eq!(
            s.runq_median(5_000_000_000, 6_000_000_000),
            None,
            "no interval there"
        );
    }

    #[test]
    fn unmeasured_intervals_are_no_evidence() {
        let mut s = IntervalStore::default();
        s.add(1, obs(0, 0, 0, 0, 40_000_000));
        s.add(2, obs(0, 40_000_000, 40_000_000, 120_000_000, 80_000_000));
        let e = s.evidence(1, &[1, 2], 0, 100_000_000).unwrap();
        assert!(!e.measured);
        assert_eq!(e.host_excess(), 0.0);
        assert!(s.evidence(1, &[1], 0, 100_000_000).is_none());
    }
}

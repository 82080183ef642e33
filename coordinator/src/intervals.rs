//! Per-rank host counters ([`RankInterval`](slowrank_shared::wire::RankInterval))
//! on the coordinator clock: run-queue delay, off-CPU time outside GPU syncs,
//! launch rate — the direct evidence for a host-slow rank.

use std::collections::{HashMap, VecDeque};

use crate::clock::{median, CoordNs};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalObs {
    pub start: CoordNs,
    pub end: CoordNs,
    pub launches: u64,
    pub sync_wait_ns: u64,
    pub runq_delay_ns: u64,
    pub offcpu_ns: u64,
}

/// A rank's CPU picture over a window next to its peers' medians.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuEvidence {
    pub runq_frac: f64,
    pub runq_frac_peers: f64,
    /// Off-CPU time not spent blocked in a GPU sync, as a fraction of wall time.
    pub offcpu_frac: f64,
    pub offcpu_frac_peers: f64,
    pub launches_per_s: f64,
    pub launches_per_s_peers: f64,
}

#[derive(Debug, Default)]
pub struct IntervalStore {
    per_rank: HashMap<u32, VecDeque<IntervalObs>>,
}

const KEEP: usize = 64;

impl IntervalStore {
    pub fn add(&mut self, rank: u32, o: IntervalObs) {
        let q = self.per_rank.entry(rank).or_default();
        q.push_back(o);
        while q.len() > KEEP {
            q.pop_front();
        }
    }

    /// (runq, offcpu outside syncs, launches/s) over `[from, to]`.
    fn fractions(&self, rank: u32, from: CoordNs, to: CoordNs) -> Option<(f64, f64, f64)> {
        let q = self.per_rank.get(&rank)?;
        let (mut dur, mut runq, mut off, mut launches) = (0f64, 0f64, 0f64, 0f64);
        for o in q.iter().filter(|o| o.end >= from && o.start <= to) {
            dur += (o.end - o.start).max(1) as f64;
            runq += o.runq_delay_ns as f64;
            off += o.offcpu_ns.saturating_sub(o.sync_wait_ns) as f64;
            launches += o.launches as f64;
        }
        (dur > 0.0).then(|| (runq / dur, off / dur, launches / dur * 1e9))
    }

    pub fn evidence(
        &self,
        rank: u32,
        peers: &[u32],
        from: CoordNs,
        to: CoordNs,
    ) -> Option<CpuEvidence> {
        let (r, o, l) = self.fractions(rank, from, to)?;
        let others: Vec<(f64, f64, f64)> = peers
            .iter()
            .filter(|p| **p != rank)
            .filter_map(|p| self.fractions(*p, from, to))
            .collect();
        if others.is_empty() {
            return None;
        }
        let m = |f: fn(&(f64, f64, f64)) -> f64| {
            median(&mut others.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
        };
        Some(CpuEvidence {
            runq_frac: r,
            runq_frac_peers: m(|x| x.0),
            offcpu_frac: o,
            offcpu_frac_peers: m(|x| x.1),
            launches_per_s: l,
            launches_per_s_peers: m(|x| x.2),
        })
    }
}

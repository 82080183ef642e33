//! What each role's own work is when nobody is slow: the floor of the
//! what-if's "as fast as its peers" where the peers' work is censored.
//!
//! In: the what-if models of iterations nobody was slow in (no suspect, no
//! alarm, no active verdict). Out: per role (the chain's sequence of
//! shapes) and per position, the median of those iterations' role
//! medians. Pure: the caller says which iterations are clean.
//!
//! Why: at a stream-ordered collective (a data-parallel gradient bucket,
//! whose NCCL kernel follows the one before it on its stream) the ranks
//! that waited for a late rank reach their next bucket right after the
//! late one completes, their own compute done while they waited. Their
//! work there reads near 0, and replacing the late rank's work by it
//! removed its ordinary compute too: the demo's data-loader delay
//! (+8 ms, the job 5.9 ms slower) was costed 9.4 ms a step, 25 % of the
//! job against 16 % measured.

use std::collections::{BTreeMap, VecDeque};

use crate::graph::whatif::{Floor, WhatIf};
use crate::robust::midpoint_median as median;

/// Clean iterations kept per role: a few seconds of a fast job, so a
/// drift in the job's work (a longer sequence batch) is followed, and a
/// median over them ignores a noisy stretch. With 16, a demo run whose
/// whole job ran slow for 13 iterations just before the fault (the VM,
/// not a rank) took 35.6 ms for its clean length against a 31–32 ms pace
/// and costed the fault 7 % against 15.6 % measured.
const KEPT: usize = 64;

/// Clean iterations a role needs before its floor is used. With 3, a demo
/// run that had only 3 clean iterations before its fault, 2 of them in a
/// stretch where the whole job ran slow (the VM), took 35.6 ms for its
/// clean length against a 31–32 ms pace and costed the fault 7 % against
/// 15.6 % measured. Without a reference the plain what-if stands.
const MIN_KEPT: usize = 8;

/// An iteration teaches the reference if no rank's what-if share of it
/// (the plain one, [`WhatIf::cost`] over the step) reached this, or if its
/// costliest rank does not stand out (the rotation gate holds it:
/// `graph::structure::Rotation::holds`, the costliest rank moves and this
/// one was costliest in under half the recent iterations). Healthy runs of
/// the random evaluation's seed 555 never had a rank above 1.6 %
/// (`classify::sequential`), but the demo's 31 ms steps on a loaded VM had
/// a costliest rank at 1–16 % (median ≈ 4 %) in its healthy iterations, and
/// the share rule alone left some runs fewer than [`MIN_KEPT`] clean ones.
/// A rank slow from the start (the 64-GPU trace's rank 0, 49 % of every
/// step, costliest in each) is never learned as the job's pace, which
/// capped its cost to 1.6 %. A straggler from the start that costs less
/// than this, or that is costliest in under half the iterations of a noisy
/// job, is learned as the job's pace and its cost capped.
pub const CLEAN_MAX_SHARE: f64 = 0.02;

/// Roles remembered at most (a job has a handful: one per pipeline stage
/// and parallel layout); past it, new roles are not learned.
const MAX_ROLES: usize = 256;

/// Per role, its recent clean iterations' per-position median work.
#[derive(Debug, Default, Clone)]
pub struct WorkReference {
    /// (iteration, the role's work in it).
    roles: BTreeMap<Vec<u64>, VecDeque<(u64, Floor)>>,
    /// The clean iterations' lengths as the model replays them, with their
    /// iteration.
    lengths: VecDeque<(u64, f64)>,
    /// Some iterations were taken back ([`Self::forget_from`]): what is
    /// left is older than a straggler's onset, and fewer than
    /// [`MIN_KEPT`] of those are a better pace than none.
    trimmed: bool,
}

impl WorkReference {
    /// Learns from the model of an iteration nobody was suspected in, if
    /// no rank's what-if share of it (`max_share`) reached
    /// [`CLEAN_MAX_SHARE`] or its costliest rank does not `stand_out`.
    pub fn learn(&mut self, k: u64, m: &WhatIf, max_share: f64, stand_out: bool) {
        if max_share.is_nan() || (max_share >= CLEAN_MAX_SHARE && stand_out) {
            return;
        }
        self.lengths.push_back((k, m.length()));
        while self.lengths.len() > KEPT {
            self.lengths.pop_front();
        }
        for (shapes, floor) in m.role_work() {
            if !self.roles.contains_key(shapes) && self.roles.len() >= MAX_ROLES {
                continue;
            }
            let kept = self.roles.entry(shapes.to_vec()).or_default();
            kept.push_back((k, floor));
            while kept.len() > KEPT {
                kept.pop_front();
            }
        }
    }

    /// How long an iteration takes when nobody is slow (the median of the
    /// clean ones), once [`MIN_KEPT`] were seen: no rank made as fast as
    /// its peers makes an iteration shorter than that. The ranks that
    /// waited for a late one are censored too, not only its peers' work
    /// as its floor: their own work after the late instance reads near 0,
    /// so the replay with the late rank fixed came out shorter than any
    /// clean iteration (28 ms against the demo's 31.7 ms steps).
    pub fn length(&self) -> Option<f64> {
        if !self.enough(self.lengths.len()) {
            return None;
        }
        let mut v: Vec<f64> = self.lengths.iter().map(|l| l.1).collect();
        Some(median(&mut v))
    }

    fn enough(&self, kept: usize) -> bool {
        kept >= MIN_KEPT || (self.trimmed && kept > 0)
    }

    /// Takes back the iterations from `k` on: a straggler was just named,
    /// and the iterations before it was (its detection lag) were slow
    /// already, though nobody was suspected in them. A GPU 1.21× slower
    /// from iteration 7, named at 13 (random 4421-29): its slow steps,
    /// learned as clean, put the job's pace at 227 ms against 212 ms and
    /// costed it 9.7 % against 14.8 % measured.
    pub fn forget_from(&mut self, k: u64) {
        let before = self.lengths.len();
        self.lengths.retain(|l| l.0 < k);
        for kept in self.roles.values_mut() {
            kept.retain(|f| f.0 < k);
        }
        self.trimmed |= self.lengths.len() < before;
    }

    /// The role's per-position work when nobody is slow,
    /// once it has been seen clean [`MIN_KEPT`] times.
    pub fn floor(&self, shapes: &[u64]) -> Option<Floor> {
        let kept = self.roles.get(shapes).filter(|k| self.enough(k.len()))?;
        let per_position = |f: &dyn Fn(&Floor) -> &[f64]| -> Vec<f64> {
            (0..shapes.len())
                .map(|j| {
                    let mut v: Vec<f64> = kept
                        .iter()
                        .filter_map(|k| f(&k.1).get(j).copied())
                        .collect();
                    median(&mut v)
                })
                .collect()
        };
        Some(Floor {
            work: per_position(&|k| &k.work),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::whatif::{Arrival, Event, IterGraph};

    const MS: f64 = 1e6;

    /// Four data-parallel ranks, three stream-ordered buckets (each
    /// member's next arrival no sooner than the previous bucket's end),
    /// 4 ms of compute per bucket and 1 ms transfers; rank 3's host is
    /// `late` ms late to the first bucket only.
    fn buckets(late: f64) -> IterGraph {
        let mut at = [10.0 * MS; 4];
        at[3] += late * MS;
        let mut events = Vec::new();
        for b in 0..3 {
            let last = at.iter().copied().fold(0.0, f64::max);
            let end = last + MS;
            events.push(Event {
                arrivals: (0..4)
                    .map(|r| Arrival {
                        rank: r,
                        at: at[r as usize],
                        shape: 1,
                        busy: None,
                        issued: None,
                    })
                    .collect(),
                end,
            });
            if b < 2 {
                for a in &mut at {
                    *a = (*a + 4.0 * MS).max(end);
                }
            }
        }
        IterGraph {
            start: 0.0,
            events,
            stages: Default::default(),
        }
    }

    #[test]
    fn a_late_ranks_next_buckets_compute_is_not_its_cost() {
        let slow = WhatIf::new(&buckets(5.0)).unwrap();
        let clean = WhatIf::new(&buckets(0.0)).unwrap();
        assert!((slow.length() - 24.0 * MS).abs() < 1.0, "{}", slow.length());
        assert!((clean.length() - 19.0 * MS).abs() < 1.0);
        // The peers' censored work alone: its two later buckets' compute
        // counted as its slowness (11 ms saved of the 5 it cost).
        let censored = slow.length() - slow.length_with(&[3]).unwrap();
        assert!(censored > 10.0 * MS, "{censored}");
        let mut r = WorkReference::default();
        let floor = |r: &WorkReference, s: &[u64]| r.floor(s);
        for _ in 1..MIN_KEPT {
            r.learn(0, &clean, 0.0, false);
        }
        assert_eq!(floor(&r, &[1, 1, 1]), None, "too few clean iterations");
        assert_eq!(r.length(), None);
        r.learn(0, &clean, 0.0, false);
        let with = slow.length_with_floor(&[3], &|s| r.floor(s)).unwrap();
        let saved = slow.length() - with;
        assert!((saved - 5.0 * MS).abs() < 1.0, "{saved}");
    }

    #[test]
    fn a_floor_never_lengthens_a_rank_beyond_its_own_work() {
        let slow = WhatIf::new(&buckets(5.0)).unwrap();
        let mut r = WorkReference::default();
        let clean = WhatIf::new(&buckets(0.0)).unwrap();
        for _ in 0..MIN_KEPT {
            r.learn(0, &clean, 0.0, false);
        }
        // A floor far above everyone's work: the rank keeps its own.
        let huge = |_: &[u64]| {
            Some(Floor {
                work: vec![100.0 * MS; 3],
            })
        };
        let with = slow.length_with_floor(&[3], &huge).unwrap();
        assert!((with - slow.length()).abs() < 1.0, "{with}");
        assert_eq!(r.floor(&[2, 2, 2]), None, "an unseen role has no floor");
        // An iteration with a costly rank teaches nothing.
        let mut polluted = WorkReference::default();
        for _ in 0..MIN_KEPT {
            polluted.learn(0, &slow, 5.0 / 24.0, true);
        }
        assert_eq!(polluted.length(), None);
    }
}

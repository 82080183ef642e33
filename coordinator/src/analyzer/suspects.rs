//! Which scored ranks are suspects this iteration: their own lateness,
//! the sequential test's alarm (confirmed against the rotation of costly
//! turns), a decisive what-if, or an open verdict's standing evidence.
//! In: the iteration's rank scores; out: the suspects, and why.

use super::*;

impl Analyzer {
    /// Which scored ranks are suspects this iteration. The sequential test
    /// opens a verdict at once on a rank that is also suspicious on its own
    /// this iteration (an alarm alone, on a few noisy early steps, is not
    /// enough), and keeps an open verdict's rank named while its evidence
    /// stands; the class, the two-rank and deep-set rules still apply. A
    /// decisive what-if stands alone, on a step that was told, not guessed.
    /// Returns the suspects in alarm, those the what-if named, and those
    /// only the standing evidence named.
    pub(super) fn mark_suspects(
        core: &Core,
        k: u64,
        scores: &mut [RankScore],
        alarms: &foldhash::HashSet<u32>,
    ) -> (
        foldhash::HashSet<u32>,
        foldhash::HashSet<u32>,
        foldhash::HashSet<u32>,
    ) {
        let told = core
            .iteration
            .period()
            .is_some_and(|p| p.method != crate::graph::iteration::Method::Undetermined);
        Self::hold_turns(core, k, scores);
        let mut by_what_if: foldhash::HashSet<u32> = Default::default();
        let mut held: foldhash::HashSet<u32> = Default::default();
        for s in scores.iter_mut() {
            if told && core.sequential.decisive(s.rank) && !s.suspicious {
                tracing::debug!(rank = s.rank, iteration = k, "named by a decisive what-if");
                s.suspicious = true;
                by_what_if.insert(s.rank);
            }
        }
        let alarms: foldhash::HashSet<u32> = scores
            .iter()
            .filter(|s| {
                s.suspicious
                    && ((alarms.contains(&s.rank) && Self::alarm_confirmed(core, s.rank))
                        || (told && core.sequential.decisive(s.rank)))
            })
            .map(|s| s.rank)
            .collect();
        for s in scores.iter_mut() {
            let active = core
                .lifecycle
                .verdicts()
                .any(|v| v.active && v.rank == s.rank && v.link.is_none());
            if active && core.sequential.standing(s.rank) {
                if !s.suspicious {
                    held.insert(s.rank);
                }
                s.suspicious = true;
            }
        }
        for s in scores.iter() {
            tracing::trace!(
                iteration = k,
                rank = s.rank,
                suspicious = s.suspicious,
                late_us = s.late_ns / 1e3,
                host_late_us = s.host_late_ns / 1e3,
                gpu_late_us = s.gpu_late_ns.map(|g| g / 1e3),
                unexplained_us = s.unexplained_ns / 1e3,
                sync_excess_us = s.sync_excess_ns / 1e3,
                last_frac = s.last_frac,
                step_ms = s.step_ns / 1e6,
                err_us = s.err_ns / 1e3,
                "rank score"
            );
        }
        (alarms, by_what_if, held)
    }

    /// While work imbalance is named, a rank's turn as the slowest is no
    /// suspicion by any rule (the lateness window, three late steps in a
    /// row) unless it stands out: the costliest in at least half of the
    /// costly steps of the rotation windows, short and long
    /// ([`crate::graph::structure::Rotation`]).
    /// A synthetic dp8 job with work ×1–4 named rank 1 compute-slow from
    /// three late steps in a row beside the imbalance finding. Ranks under
    /// an open verdict keep their suspicion.
    fn hold_turns(core: &Core, k: u64, scores: &mut [RankScore]) {
        let imbalance = core
            .lifecycle
            .verdicts()
            .any(|v| v.active && v.subject == Subject::Imbalance);
        if !imbalance {
            return;
        }
        for s in scores.iter_mut().filter(|s| s.suspicious) {
            let active = core
                .lifecycle
                .verdicts()
                .any(|v| v.active && v.rank == s.rank && v.structural.is_none());
            if !active && core.rotation.holds_during_imbalance(s.rank) {
                tracing::debug!(
                    rank = s.rank,
                    iteration = k,
                    "a turn of the work imbalance, not a suspect"
                );
                s.suspicious = false;
            }
        }
    }

    /// Whether the sequential test's alarm on `rank` may open a verdict: an
    /// open one on it stands, a new one waits for the rotation gate
    /// ([`crate::graph::structure::Rotation`]: not on one costly turn, nor
    /// on a turn while the costliest rank moves).
    fn alarm_confirmed(core: &Core, rank: u32) -> bool {
        let active = core
            .lifecycle
            .verdicts()
            .any(|v| v.active && v.rank == rank && v.link.is_none());
        let ok = active || core.rotation.confirms(rank);
        if !ok {
            tracing::debug!(
                rank,
                rotating = core.rotation.rotating(),
                "alarm held: the rank's costly turns are not a straggler's (yet)"
            );
        }
        ok
    }
}

//! Finding a taken-over member's offset: its held records against the
//! other members' instances (operation and size must match; the smallest
//! mean entry difference wins), or why no offset can be told yet. Pure.

use super::*;

/// Why a taken-over member is still held: what [`Realigner::still_held`]
/// tells the log when the input ends with records that never joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Not held (lined up already).
    LinedUp,
    /// No other member's instance of its communicator is known.
    NoReferences,
    /// Fewer than [`MIN_MATCHED`] records held.
    TooFew { held: usize },
    /// Fewer held records than a line-up needs lie where the other
    /// members' reports reach (by [`COVER_NS`]).
    NotCovered { covered: usize },
    /// Windows of its records were tried and none fit any number.
    NoMatch(NoFit),
}

/// What ruled out every number for the windows of one member's records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NoFit {
    /// Windows tried.
    pub windows: usize,
    /// Of those, with no other member's instance within [`SEARCH_NS`] of
    /// them (the host's clock is off by more, or the others' reports stop
    /// earlier).
    pub none_near: usize,
    /// Numbers at or below what the join already had of the member.
    pub at_or_below_floor: usize,
    /// Numbers where an operation or size differed.
    pub mismatched: usize,
    /// Numbers matching fewer than [`MIN_MATCHED`] instances.
    pub sparse: usize,
    /// Numbers below the window's own (an offset cannot be negative).
    pub below_own: usize,
}

impl NoFit {
    pub(super) fn add(&mut self, o: NoFit) {
        self.windows += o.windows;
        self.none_near += o.none_near;
        self.at_or_below_floor += o.at_or_below_floor;
        self.mismatched += o.mismatched;
        self.sparse += o.sparse;
        self.below_own += o.below_own;
    }
}

/// The offset that lines up the takeover `state` with the other members'
/// instances `refs`, or why its records do not tell one yet.
pub(super) fn choose_offset(
    state: &State,
    refs: &BTreeMap<u64, Ref>,
    now: CoordNs,
    remap: &dyn Fn(&str, u64) -> Option<CoordNs>,
    ended: bool,
) -> Result<(u64, Fit, Basis), Waiting> {
    let State::Holding {
        host,
        floor,
        since,
        held,
    } = state
    else {
        return Err(Waiting::LinedUp);
    };
    if held.len() < MIN_MATCHED {
        return Err(Waiting::TooFew { held: held.len() });
    }
    // On the host's clock as known now (one linear map: still in order).
    let held: Vec<(&CollectiveRecord, CoordNs)> = held
        .iter()
        .map(|(r, e)| (r, remap(host, r.host_entry_ns).unwrap_or(*e)))
        .collect();
    // The newest records: the other members' instances of them
    // came after the takeover was known, so they are in `refs`.
    // (The oldest may be from before: an agent that waited to
    // connect ships what it saw meanwhile, and their instances'
    // other records came and went before it; lined up with the
    // first reference they would land on it, seconds off.)
    let (lo, hi) = refs
        .values()
        .fold((CoordNs::MAX, CoordNs::MIN), |(lo, hi), r| {
            (lo.min(r.entry), hi.max(r.entry))
        });
    // The newest held records the other members' reports already
    // reach past (by COVER_NS), or after PATIENCE_NS (or once the input
    // ended: nothing more will cover them) the newest.
    let patient = ended || now - *since >= PATIENCE_NS;
    let end = if patient {
        held.len()
    } else {
        held.partition_point(|(_, e)| *e + COVER_NS <= hi)
    };
    if end < MIN_MATCHED {
        return Err(Waiting::NotCovered { covered: end });
    }
    // The covered records from the first reference on, in windows
    // of WINDOW; the window that tells its offset most clearly
    // decides. A host that falls behind for a while (a loaded
    // machine: one run's newest records entered up to a step
    // late) blurs a window into a near tie between neighbouring
    // offsets, and the newest window alone then lined a member up
    // 3 instances off (BENCHMARKS.md, journal 2026-12-01 22:53).
    // A whole window, covered, before the patience runs out: the guard
    // once read `first + WINDOW.min(end)`, always met when `first` is 0,
    // and a member was lined up from its first 8 covered records, 38 ms
    // off on average, 3 instances off (CI of dfaec54, agent restart).
    let first = held.partition_point(|(_, e)| *e < lo);
    let starts = if end >= first + WINDOW {
        window_starts(first, end)
    } else if patient {
        vec![end.saturating_sub(WINDOW)]
    } else {
        return Err(Waiting::NotCovered { covered: end });
    };
    let h0 = held[0].0.seq;
    let mut chosen: Option<(f64, u64, Fit, usize, usize)> = None;
    let mut misses = NoFit::default();
    for start in starts {
        let stop = (start + WINDOW).min(end);
        let window = probes(held.iter().skip(start).take(stop - start).copied());
        let s0 = held[start].0.seq;
        let (k, fit) = match line_up_fit(&window, refs, floor.map(|f| f + (s0 - h0))) {
            Ok(found) => found,
            Err(miss) => {
                misses.add(miss);
                continue;
            }
        };
        let Some(offset) = k.checked_sub(s0) else {
            misses.below_own += 1;
            continue;
        };
        let clarity = fit.clarity();
        if chosen.as_ref().is_none_or(|c| clarity > c.0) {
            chosen = Some((clarity, offset, fit, start, stop - start));
        }
    }
    let (_, offset, fit, window_start, window_len) = chosen.ok_or(Waiting::NoMatch(misses))?;
    let basis = Basis {
        waited_ns: now - *since,
        held: held.len(),
        covered: end,
        patient,
        window_start,
        window_len,
    };
    Ok((offset, fit, basis))
}

/// Starts of the windows of up to [`WINDOW`] records over `first..end`,
/// half a window apart, the last one ending at `end`.
pub(super) fn window_starts(first: usize, end: usize) -> Vec<usize> {
    let last = end.saturating_sub(WINDOW).max(first);
    let mut v: Vec<usize> = (first..last).step_by(WINDOW / 2).collect();
    v.push(last);
    v
}

/// One record of a member, for [`line_up`]: its sequence number relative
/// to the window's first, operation, size, entry.
pub(super) type Probe = (u64, CollOp, u64, CoordNs);

pub(super) fn probes<'a>(
    held: impl Iterator<Item = (&'a CollectiveRecord, CoordNs)>,
) -> Vec<Probe> {
    let mut s0 = None;
    held.map(|(r, e)| {
        let first = *s0.get_or_insert(r.seq);
        (r.seq - first, r.op, r.bytes, e)
    })
    .collect()
}

/// The number of the instance `window`'s first record belongs to (a
/// member's records: relative number, operation, size, entry), or None
/// when no number matches [`MIN_MATCHED`] of `refs`' instances without a
/// mismatch. Numbers at or below `floor` are not candidates.
pub(super) fn line_up(
    window: &[Probe],
    refs: &BTreeMap<u64, Ref>,
    floor: Option<u64>,
) -> Option<u64> {
    line_up_fit(window, refs, floor).ok().map(|(k, _)| k)
}

/// [`line_up`], with how well the chosen number fit, or what ruled every
/// number out.
pub(super) fn line_up_fit(
    window: &[Probe],
    refs: &BTreeMap<u64, Ref>,
    floor: Option<u64>,
) -> Result<(u64, Fit), NoFit> {
    let mut miss = NoFit {
        windows: 1,
        ..NoFit::default()
    };
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return Err(miss);
    };
    let (first, last) = (first.3, last.3);
    let lo = floor.map_or(0, |f| f + 1);
    let near: Vec<u64> = refs
        .iter()
        .filter(|(_, r)| r.entry >= first - SEARCH_NS && r.entry <= last + SEARCH_NS)
        .map(|(&s, _)| s)
        .collect();
    if near.is_empty() {
        miss.none_near = 1;
        return Err(miss);
    }
    let mut candidates: Vec<u64> = near
        .iter()
        .flat_map(|&s| window.iter().filter_map(move |w| s.checked_sub(w.0)))
        .collect();
    let all = candidates.len();
    candidates.retain(|k| *k >= lo);
    miss.at_or_below_floor = all - candidates.len();
    candidates.sort_unstable();
    candidates.dedup();
    let mut best: Option<(CoordNs, usize, u64)> = None;
    let mut runner_up: Option<CoordNs> = None;
    for k in candidates {
        let mut diffs = Vec::with_capacity(window.len());
        let mut mismatch = false;
        for (d, op, bytes, entry) in window {
            let Some(r) = refs.get(&(k + d)) else {
                continue;
            };
            if r.op != *op || r.bytes != *bytes {
                mismatch = true;
                break;
            }
            diffs.push((entry - r.entry).abs());
        }
        if mismatch {
            miss.mismatched += 1;
            continue;
        }
        if diffs.len() < MIN_MATCHED.min(window.len()) {
            miss.sparse += 1;
            continue;
        }
        // The mean, not the median: a step's gradient buckets are enqueued
        // within a fraction of a millisecond of each other (the host runs
        // ahead of the GPU), so one instance off pairs most records with a
        // neighbour entered at nearly the same time and only the one per
        // step that crosses into the next step with a whole step's gap.
        // The median never sees those (a chaos run lined three members up
        // one instance early and one an instance late, and the late one was
        // named host-slow).
        let score =
            (diffs.iter().map(|d| *d as i128).sum::<i128>() / diffs.len() as i128) as CoordNs;
        let better = match best {
            None => true,
            Some((s, n, _)) => score < s || (score == s && diffs.len() > n),
        };
        if better {
            if let Some((s, _, _)) = best {
                runner_up = Some(runner_up.map_or(s, |r| r.min(s)));
            }
            best = Some((score, diffs.len(), k));
        } else {
            runner_up = Some(runner_up.map_or(score, |r| r.min(score)));
        }
    }
    best.map(|(mean_ns, _, k)| {
        (
            k,
            Fit {
                mean_ns,
                runner_up_ns: runner_up,
            },
        )
    })
    .ok_or(miss)
}

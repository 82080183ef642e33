//! What one iteration's transfers say of a rank, a NIC or a link: their
//! cost, and how much longer a rank's own transfers took than its peers'.
//! In: an iteration's bucket (and the what-if model); out: plain numbers.

use crate::classify::stats::IterBucket;
use crate::clock::median;

/// Whether a link or NIC finding's cost in one iteration (`lost` GPU-ns of
/// `exposure`) is worth naming. Without a known step (exposure 0) any
/// measured cost is.
pub(super) fn costs_enough(lost: f64, exposure: f64, min_fraction: f64) -> bool {
    lost > 0.0 && (exposure <= 0.0 || lost >= min_fraction * exposure)
}

/// The GPU time lost on `ranks`' transfers at `ratio` × their peers' time,
/// and the step's share: the what-if with those transfers at the peers'
/// rate (the members' sum is GPU time, not step time).
pub(super) fn transfer_costs(
    bucket: &IterBucket,
    model: Option<&crate::graph::whatif::WhatIf>,
    ranks: &[u32],
    ratio: f64,
) -> (f64, Option<f64>) {
    let excess = 1.0 - 1.0 / ratio.max(1.0);
    let lost = bucket
        .ranks
        .get(&ranks[0])
        .map_or(0.0, |a| a.xfer_member_ns * excess);
    let saved = model.and_then(|m| m.transfer_cost(ranks, 1.0 / ratio.max(1.0)));
    (lost, saved)
}

/// How much longer `rank`'s instances' transfers took this iteration than
/// those of its reference peers (the median of theirs, ns), and whether
/// every instance of the rank had its transfer measured (a pipeline send's
/// may not be: then the excess is a floor, not the whole); `None` where
/// either side has none measured.
pub(super) fn transfer_excess(
    bucket: &IterBucket,
    rank: u32,
    peers: &[u32],
) -> Option<(f64, bool)> {
    let mine = bucket.ranks.get(&rank).filter(|a| a.xfer_n > 0)?;
    let mut others: Vec<f64> = peers
        .iter()
        .filter(|q| **q != rank)
        .filter_map(|q| bucket.ranks.get(q))
        .filter(|a| a.xfer_n > 0)
        .map(|a| a.xfer_ns)
        .collect();
    Some((
        mine.xfer_ns - median(&mut others)?,
        mine.xfer_n >= mine.coll_n,
    ))
}

/// Mean transfer of instances containing `rank` vs all instances, this iteration.
pub(super) fn transfer_ratio(bucket: &IterBucket, rank: u32) -> Option<f64> {
    let mine = bucket.ranks.get(&rank).filter(|a| a.xfer_n > 0)?;
    let mut others: Vec<f64> = bucket
        .ranks
        .iter()
        .filter(|(r, a)| **r != rank && a.xfer_n > 0)
        .map(|(_, a)| a.xfer_member_ns / a.xfer_n as f64)
        .collect();
    let m = median(&mut others)?;
    (m > 0.0).then(|| (mine.xfer_member_ns / mine.xfer_n as f64) / m)
}

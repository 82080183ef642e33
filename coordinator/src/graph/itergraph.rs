//! One sealed iteration's aligned instances → the plain [`IterGraph`] the
//! what-if replays ([`crate::graph::whatif`]).
//!
//! Times become f64 ns relative to the iteration's start (coordinator ns
//! are ~1e18: relative values keep sub-ns precision in f64). A member's
//! arrival is on its instance's basis (GPU-side when every member has it),
//! the completion is the instance's `end`. A member's *shape* names its
//! role in the instance: operation, communicator size and, for a
//! send/recv, which end it is — so the two ends of a pipeline transfer
//! are never taken for peers.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::classify::stats::{AlignedInstance, Basis};
use crate::clock::CoordNs;
use crate::graph::whatif::{Arrival, Event, IterGraph};
use crate::join::InstanceKey;

/// Builds the graph of one iteration that began at `start`.
pub fn build<'a>(
    start: CoordNs,
    instances: impl Iterator<Item = &'a AlignedInstance>,
) -> IterGraph {
    let rel = |t: CoordNs| (t - start) as f64;
    let mut stages = std::collections::BTreeMap::new();
    let mut events: Vec<Event> = instances
        .filter(|a| !a.members.is_empty())
        .map(|a| {
            let low = a.members.iter().map(|m| m.rank).min().unwrap_or(0);
            let arrivals = a
                .members
                .iter()
                .zip(&a.arrival)
                .map(|(m, t)| {
                    let side = match a.key {
                        InstanceKey::P2p { lo, hi, .. } => {
                            // Positions in the pipeline communicator are
                            // the stages; the lower global rank holds the
                            // lower position (communicators split in rank
                            // order).
                            stages.insert(m.rank, if m.rank == low { lo } else { hi });
                            Some(m.rank == low)
                        }
                        InstanceKey::Coll(_) => None,
                    };
                    Arrival {
                        rank: m.rank,
                        at: rel(*t),
                        shape: shape(a, side),
                        // A source with no host side (the study's
                        // traces) ships entry = exit: its chains stay in
                        // arrival order.
                        issued: (m.host_exit > m.host_entry).then(|| rel(m.host_entry)),
                        // Busy time is GPU time: it bounds work only
                        // between GPU-side arrivals.
                        busy: (a.basis == Basis::Gpu)
                            .then_some(m.gpu_busy_ns)
                            .flatten()
                            .map(|b| b as f64),
                    }
                })
                .collect();
            Event {
                arrivals,
                end: rel(a.end),
            }
        })
        .collect();
    // Replay order does not depend on it, but a stable order keeps the
    // model (and so any tie) the same from run to run.
    events.sort_by(|x, y| {
        let fx = x
            .arrivals
            .iter()
            .map(|a| a.at)
            .fold(f64::INFINITY, f64::min);
        let fy = y
            .arrivals
            .iter()
            .map(|a| a.at)
            .fold(f64::INFINITY, f64::min);
        fx.total_cmp(&fy)
    });
    IterGraph {
        start: 0.0,
        events,
        stages,
    }
}

fn shape(a: &AlignedInstance, side: Option<bool>) -> u64 {
    let mut h = DefaultHasher::new();
    // A send/recv instance carries the op of whichever end was joined
    // first: its shape is the end, not the op.
    match side {
        Some(_) => u8::MAX.hash(&mut h),
        None => (a.op as u8).hash(&mut h),
    }
    a.comm_nranks.hash(&mut h);
    side.hash(&mut h);
    h.finish()
}

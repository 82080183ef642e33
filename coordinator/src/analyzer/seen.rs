//! What an iteration's GPU-side instances show where the rest are blind by
//! placement only: a pipeline whose stages meet across hosts while each
//! stage's replicas all-reduce over NVLink. Such a job never has a wholly
//! GPU-side step, so the replay of the whole iteration mixes host times
//! into it; this reads the GPU-side part alone, for the stage rule
//! ([`super::structural`]).

use super::evaluate::IterCtx;
use super::*;

/// The GPU-side part of a partly blind iteration.
pub(super) struct PartlyBlind {
    /// The iteration's model from its GPU-side instances alone.
    pub(super) model: crate::graph::whatif::WhatIf,
    /// Each rank's work where it is seen whole
    /// ([`crate::classify::align::seen_gpu_work`]).
    pub(super) seen: BTreeMap<u32, crate::classify::align::SeenWork>,
}

impl Analyzer {
    /// The GPU-side part of iteration `it`, where some of its instances are
    /// host-side and all of those within one host
    /// ([`crate::classify::align::gpu_side_across_hosts`]). A pp4 × dp2 job,
    /// a stage a host, its last stage 35% heavier on every replica (+15%
    /// step) was told only as a slowdown no rank explained.
    pub(super) fn partly_blind(core: &Core, it: &IterCtx) -> Option<PartlyBlind> {
        if it.from == CoordNs::MIN {
            return None;
        }
        let instances: Vec<&AlignedInstance> = core
            .recent
            .iter()
            .filter(|(i, _)| *i == it.k)
            .map(|(_, a)| a)
            .collect();
        let gpu = crate::classify::align::gpu_side_across_hosts(&instances)?;
        if gpu.len() == instances.len() {
            // Wholly GPU-side: the iteration's own model reads it.
            return None;
        }
        let seen = crate::classify::align::seen_gpu_work(&instances);
        let model = crate::graph::whatif::WhatIf::new(&crate::graph::itergraph::build(
            it.from,
            gpu.into_iter(),
        ))?;
        Some(PartlyBlind { model, seen })
    }
}

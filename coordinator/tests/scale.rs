//! The generator and the analyzer at a thousand ranks: every instance joins,
//! nothing is rejected, and a slow last-stage rank is still found among 1,024.

mod common;

use slowrank_coordinator::classify::Kind;
use slowrank_synth::{Fault, FaultKind, SynthSpec};

#[test]
fn thousand_ranks_tp_pp_dp() {
    let mut spec = SynthSpec::three_d(8, 4, 32, 128);
    spec.seed = 5;
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 813,
            factor: 1.3,
        },
        12,
    ));
    let r = common::run(spec, 32);
    let rep = r.report();
    assert_eq!(rep.job.world_size, 1024);
    assert_eq!(
        rep.ingest.instances_incomplete + rep.ingest.instances_evicted,
        0
    );
    assert!(rep.ingest.counters.records_rejected.is_empty());
    assert_eq!(
        rep.verdicts.len(),
        1,
        "{}",
        slowrank_coordinator::render_human(&rep)
    );
    assert_eq!(
        (rep.verdicts[0].rank, rep.verdicts[0].kind),
        (813, Kind::Compute)
    );
    assert!(
        (12..=22).contains(&rep.verdicts[0].first_seen_iteration),
        "{:?}",
        rep.verdicts[0]
    );
}

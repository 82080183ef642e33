//! Each fault class on synthetic jobs: the right rank, the right class, and a
//! first-seen iteration within 10 iterations of onset.

mod common;

use slowrank_coordinator::classify::Kind;
use slowrank_coordinator::synth::{Fault, FaultKind, SynthSpec};

#[test]
fn dp8_compute_slow_1_3x() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 7;
    spec.faults.push(Fault::persistent(FaultKind::Compute { rank: 5, factor: 1.3 }, 40));
    let r = common::run(spec, 80);
    let rep = r.report();
    println!("{}", slowrank_coordinator::render_human(&rep));
    assert_eq!(rep.verdicts.len(), 1, "{:#?}", rep.verdicts);
    let v = &rep.verdicts[0];
    assert_eq!((v.rank, v.kind), (5, Kind::Compute));
    assert!(v.first_seen_iteration >= 40 && v.first_seen_iteration < 50, "{}", v.first_seen_iteration);
    assert!(v.active);
}

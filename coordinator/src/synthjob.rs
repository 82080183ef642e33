//! Test support: synthetic jobs ([`slowrank_synth`]) fed through an
//! [`Analyzer`] the way `serve` feeds it (clock samples, batches, a tick
//! after each iteration). One place for the set-up the analyzer, report
//! and resume tests share.

use slowrank_synth::{Fault, FaultKind, Generator, SynthSpec};

use crate::Analyzer;

/// 8 ranks on 2 hosts, data-parallel; rank 5's GPU 1.5× slower from
/// iteration `onset` when given.
pub(crate) fn compute_fault(onset: Option<u64>) -> Generator {
    let mut spec = SynthSpec::dp(2, 4);
    if let Some(at) = onset {
        spec.faults.push(Fault::persistent(
            FaultKind::Compute {
                rank: 5,
                factor: 1.5,
            },
            at,
        ));
    }
    Generator::new(spec)
}

/// The generator's first clock samples into `a`.
pub(crate) fn start(a: &Analyzer, g: &mut Generator) {
    for (h, s) in g.initial_samples() {
        a.add_clock_sample(&h, s).unwrap();
    }
}

/// A fresh analyzer (default thresholds) and a healthy
/// [`compute_fault`]`(None)` job whose first clock samples it has.
pub(crate) fn healthy() -> (Analyzer, Generator) {
    let a = Analyzer::new(crate::AnalyzerConfig::default());
    let mut g = compute_fault(None);
    start(&a, &mut g);
    (a, g)
}

/// An iteration's clock samples into `a` (its batches are the caller's).
pub(crate) fn samples(a: &Analyzer, out: &slowrank_synth::IterationOutput) {
    for (h, s) in &out.samples {
        a.add_clock_sample(h, *s).unwrap();
    }
}

/// `iterations` more of the job into `a`, each ticked 3 ms after its end.
pub(crate) fn feed(a: &Analyzer, g: &mut Generator, iterations: u64) {
    for _ in 0..iterations {
        let out = g.next_iteration();
        samples(a, &out);
        for (recv, b) in &out.batches {
            a.ingest(b, *recv);
        }
        a.tick(out.end_ns as i64 + 3_000_000);
    }
}

/// A fresh analyzer (default thresholds) fed `iterations` of
/// [`compute_fault`]`(onset)`.
pub(crate) fn analyzed(onset: Option<u64>, iterations: u64) -> Analyzer {
    let a = Analyzer::new(crate::AnalyzerConfig::default());
    let mut g = compute_fault(onset);
    start(&a, &mut g);
    feed(&a, &mut g, iterations);
    a
}

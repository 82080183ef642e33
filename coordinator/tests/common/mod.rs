//! Drives synthetic jobs through the analyzer the way the ingest path will.
#![allow(dead_code)]

use slowrank_coordinator::{Analyzer, AnalyzerConfig, EventKind, Report, VerdictEvent};
use slowrank_synth::{Generator, SynthSpec};

pub struct Run {
    pub analyzer: Analyzer,
    pub events: Vec<VerdictEvent>,
    pub generator: Generator,
    pub now: i64,
}

impl Run {
    pub fn report(&self) -> Report {
        self.analyzer.report()
    }
    pub fn opened(&self) -> Vec<&VerdictEvent> {
        self.events
            .iter()
            .filter(|e| matches!(e.event, EventKind::Opened | EventKind::Reopened))
            .collect()
    }
}

pub fn run_with(spec: SynthSpec, iterations: u64, cfg: AnalyzerConfig) -> Run {
    let analyzer = Analyzer::new(cfg);
    let mut generator = Generator::new(spec);
    for (h, s) in generator.initial_samples() {
        analyzer.add_clock_sample(&h, s).expect("sample");
    }
    let mut events = Vec::new();
    let mut now = 0;
    for _ in 0..iterations {
        let out = generator.next_iteration();
        for (h, s) in &out.samples {
            analyzer.add_clock_sample(h, *s).expect("sample");
        }
        for (recv, b) in &out.batches {
            let sum = analyzer.ingest(b, *recv);
            assert_eq!(
                sum.rejected,
                0,
                "synthetic records rejected: {:?}",
                analyzer.report().ingest
            );
        }
        now = out.end_ns as i64 + 3_000_000;
        events.extend(analyzer.tick(now));
    }
    Run {
        analyzer,
        events,
        generator,
        now,
    }
}

pub fn run(spec: SynthSpec, iterations: u64) -> Run {
    run_with(spec, iterations, AnalyzerConfig::default())
}

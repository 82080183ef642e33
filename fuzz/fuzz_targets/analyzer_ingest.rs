//! The coordinator's reasoning fed real batches with nudged fields, resends,
//! reorders and fully arbitrary batches, interleaved with ticks: ingest must
//! reject the impossible with a counted reason and nothing may panic, down
//! to the report, trace and metrics renderers.
#![no_main]

use libfuzzer_sys::{arbitrary::Unstructured, fuzz_target};
use slowrank_coordinator::{render_human, render_json, Analyzer, AnalyzerConfig};
use slowrank_fuzz::{arbitrary_batch, job, mutate_batch};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let job = job();
    let a = Analyzer::new(AnalyzerConfig::default());
    for (h, s) in &job.samples {
        let _ = a.add_clock_sample(h, *s);
    }
    let steps = u.int_in_range(1..=24u8).unwrap_or(1);
    for step in 0..steps {
        let op = u.int_in_range(0..=9u8).unwrap_or(0);
        let (recv, mut b) = match op {
            0 => match arbitrary_batch(&mut u) {
                Ok(b) => (u.arbitrary().unwrap_or(0), b),
                Err(_) => break,
            },
            _ => {
                // Mostly in order, sometimes any batch (resend, reorder).
                let i = if op < 6 {
                    step as usize % job.batches.len()
                } else {
                    u.choose_index(job.batches.len()).unwrap_or(0)
                };
                job.batches[i].clone()
            }
        };
        if op >= 3 && mutate_batch(&mut u, &mut b).is_err() {
            break;
        }
        let sum = a.ingest(&b, recv);
        assert!(sum.accepted + sum.rejected + u64::from(sum.duplicate_batch) <= 1 << 40);
        if u.arbitrary::<bool>().unwrap_or(true) {
            a.tick(recv as i64 + 3_000_000);
        }
    }
    let rep = a.report();
    let _ = render_human(&rep);
    let _ = render_json(&rep);
    let _ = a.trace_json();
    let _ = a.metrics().to_prometheus();
});

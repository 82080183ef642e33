//! A host-slow verdict from the synthetic job gets a diff flame graph from
//! the ranks' folded stacks, and the report JSON carries it.

mod common;

use slowrank_coordinator::classify::Kind;
use slowrank_coordinator::verdict::flame::{self, Layout};
use slowrank_shared::wire::{FoldedStack, StackView, StackWindow};
use slowrank_synth::{Fault, FaultKind, HostPhase, SynthSpec};

/// Folded CPU stacks of one rank: `loader_us` in the data loader, the rest
/// of a 40 ms step waiting in synchronize.
fn window(rank: u32, loader_us: u64) -> StackWindow {
    StackWindow {
        rank,
        view: StackView::Cpu,
        start_ns: 0,
        end_ns: 1_000_000_000,
        strings: vec![
            "python [main]".into(),
            "train_step".into(),
            "load_batch".into(),
            "nanosleep".into(),
            "synchronize".into(),
            "nccl-proxy".into(),
            "poll".into(),
        ],
        stacks: vec![
            FoldedStack {
                frames: vec![0, 1, 2, 3],
                weight: loader_us,
            },
            FoldedStack {
                frames: vec![0, 1, 4],
                weight: 40_000 - loader_us,
            },
            FoldedStack {
                frames: vec![5, 6],
                weight: 40_000 + u64::from(rank) * 500,
            },
        ],
        records: 100,
        truncated: 0,
        overflow_weight: 0,
    }
}

#[test]
fn host_slow_verdict_gets_a_flamegraph_naming_the_loader() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 21;
    spec.faults.push(Fault::persistent(
        FaultKind::Host {
            rank: 2,
            phase: HostPhase::LoadBatch,
            factor: 1.0,
            delay_ns: 8_000_000,
            contention: false,
        },
        30,
    ));
    let mut rep = common::run(spec, 70).report();
    assert_eq!(rep.verdicts.len(), 1);
    assert_eq!(rep.verdicts[0].kind, Kind::Host);
    let windows: Vec<StackWindow> = (0..8)
        .map(|r| window(r, if r == 2 { 8_500 } else { 500 }))
        .collect();
    let dir = std::env::temp_dir().join(format!("slowrank-flame-{}", std::process::id()));
    let errors = flame::annotate(
        &mut rep.verdicts,
        &windows,
        Layout {
            tp: 1,
            pp: 1,
            dp: 8,
        },
        &dir,
        |_| Some((0, u64::MAX)),
    );
    assert!(errors.is_empty(), "{errors:?}");
    let f = rep.verdicts[0]
        .flamegraph
        .as_ref()
        .expect("flamegraph attached");
    assert_eq!(f.view, "cpu");
    assert_eq!(f.top_frames[0].frame, "load_batch");
    assert!(std::path::Path::new(&f.diff_svg).exists());
    let json: serde_json::Value =
        serde_json::from_str(&slowrank_coordinator::render_json(&rep).unwrap()).unwrap();
    let fg = &json["verdicts"][0]["flamegraph"];
    assert_eq!(fg["top_frames"][0]["frame"], "load_batch", "{fg}");
    assert!(fg["diff_svg"].as_str().unwrap().ends_with("-diff.svg"));
    let _ = std::fs::remove_dir_all(dir);
}

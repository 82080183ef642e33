//! `slowrank analyze` on real traces: the straggler study's trace-AR (a
//! 64-GPU job with one worker slowed on purpose, and the study's own what-if
//! answer), the real NCCL Kineto fixtures, and the gloo set recorded here.
//! The shared traces live beside the clone (`../shared/traces/`, as in CI).

use std::path::{Path, PathBuf};

use slowrank_coordinator::replay::{self, cli, ReplayError};
use slowrank_coordinator::Report;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A shared trace; under CI=true a missing one fails, elsewhere the test
/// says loudly that it did not run.
fn shared(rel: &str) -> Option<PathBuf> {
    for base in [
        repo().join("../shared/traces"),
        PathBuf::from("/work/shared/traces"),
    ] {
        let p = base.join(rel);
        if p.exists() {
            return Some(p);
        }
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "../shared/traces/{rel} is missing (CI has shared/ beside the clone)"
    );
    eprintln!("SKIPPED: ../shared/traces/{rel} not found");
    None
}

fn analyze(format: cli::Format, paths: &[PathBuf]) -> (replay::Recording, Report) {
    let (rec, out) = analyze_full(format, paths);
    (rec, out.report)
}

fn analyze_full(format: cli::Format, paths: &[PathBuf]) -> (replay::Recording, replay::Replayed) {
    let rec = cli::import(format, paths, &mut |_| {}).unwrap();
    let out = replay::replay(&rec, &cli::options(format, None), &mut |_| {}).unwrap();
    (rec, out)
}

fn named(r: &Report) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = r
        .verdicts
        .iter()
        .map(|v| (v.rank, format!("{:?}", v.kind).to_lowercase()))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// trace-AR through the whole pipeline: every record joins (a member that
/// waits past the hang timeout — rank 4 waits 23 s for its embedding
/// all-reduce — still joins), the steps are found and measured as the study
/// recorded them, and rank 0 (dp 0, stage 0, the one slowed on purpose) is
/// named compute-slow and no other rank, with a what-if cost within 10% of
/// the study's own: 46.3 s recorded against 23.5 s with rank 0 at its
/// peers' speed, 1 − 23.48/46.34 = 0.493 of the job.
#[test]
fn trace_ar_names_rank_0_compute_slow_at_the_studys_cost() {
    let Some(p) = shared("stragglers-osdi25/trace-AR.parquet") else {
        return;
    };
    let (rec, out) = analyze_full(cli::Format::Study, &[p]);
    let r = out.report;
    eprintln!("{}", slowrank_coordinator::render_human(&r));
    // The study's decomposition (`result-AR.json`): the slowdown S each
    // group alone adds to the ideal step, a share 1 − 1/S of the step:
    // dp 0 1.973 (0.493), dp 1–3 1.011 (0.011); stage 0 1.979 (0.495),
    // stages 1–3 0.996–1.002 (≈ 0); the job 1.973 (0.493). Here each group
    // is fixed at its peers' median in the recorded step ("all": every
    // worker at once, the study's ideal step).
    let share = |g: &str| {
        out.groups
            .iter()
            .find(|x| x.group == g)
            .unwrap_or_else(|| panic!("no group {g}: {:?}", out.groups))
            .share
    };
    for (g, study) in [("all", 0.493), ("dp 0", 0.493), ("stage 0", 0.495)] {
        assert!((share(g) - study).abs() <= 0.1 * study, "{g}: {}", share(g));
    }
    for g in ["dp 1", "dp 2", "dp 3", "stage 1", "stage 2", "stage 3"] {
        assert!(share(g) <= 0.03, "{g}: {}", share(g));
    }
    assert_eq!(rec.world_size, Some(64));
    assert_eq!(rec.unobserved_ranks().len(), 48);
    assert!(
        r.ingest.counters.records_rejected.is_empty(),
        "{:?}",
        r.ingest.counters
    );
    assert_eq!(r.ingest.instances_incomplete, 0);
    // 44 steps: 43 whole iterations between 44 step ends.
    assert_eq!(r.job.iterations_observed, 43);
    // The study's recorded steps average 46.6 s (step_t_base).
    let step_s = r.job.step_time_ms.unwrap() / 1e3;
    assert!((step_s - 46.6).abs() < 0.5, "step {step_s} s");
    assert_eq!(
        named(&r),
        vec![(0, "compute".to_owned())],
        "{:#?}",
        r.verdicts
    );
    for v in &r.verdicts {
        assert_eq!(v.rank, 0, "a verdict on a healthy worker: {v:#?}");
        assert_eq!(format!("{:?}", v.kind).to_lowercase(), "compute", "{v:#?}");
        // The study: 46.3 s recorded against 23.5 s with rank 0 at its
        // peers' speed, a cost of 1 − 23.48/46.34 = 0.493 of the job.
        assert!((v.cost_fraction - 0.493).abs() <= 0.0493, "{v:#?}");
    }
}

#[test]
fn recorded_gloo_set_names_the_sleeping_rank_only() {
    let dir = repo().join("coordinator/tests/data/kineto-gloo");
    let paths: Vec<PathBuf> = (0..4)
        .map(|r| dir.join(format!("rank-{r}.json.gz")))
        .collect();
    let (rec, r) = analyze(cli::Format::Kineto, &paths);
    assert!(rec.unobserved_ranks().is_empty());
    eprintln!("{}", slowrank_coordinator::render_human(&r));
    let ranks: Vec<u32> = named(&r).iter().map(|x| x.0).collect();
    assert_eq!(ranks, vec![2], "{:#?}", r.verdicts);
}

#[test]
fn a_missing_rank_is_reported_not_observed() {
    let dir = repo().join("coordinator/tests/data/kineto-gloo");
    let paths: Vec<PathBuf> = [0, 1, 3]
        .iter()
        .map(|r| dir.join(format!("rank-{r}.json.gz")))
        .collect();
    let (rec, _) = analyze(cli::Format::Kineto, &paths);
    assert_eq!(rec.unobserved_ranks(), vec![2]);
    assert!(
        rec.notes.iter().any(|n| n.contains("not observed: 2")),
        "{:?}",
        rec.notes
    );
}

#[test]
fn real_nccl_kineto_fixtures_import() {
    let Some(dir) = shared("kineto-hta") else {
        return;
    };
    // Group arguments, GPU kernels by correlation id.
    let rec = cli::import(
        cli::Format::Kineto,
        &[dir.join("nccl_parser_config_nccl_data.json.gz")],
        &mut |_| {},
    )
    .unwrap();
    let recs: Vec<_> = rec
        .hosts
        .iter()
        .flat_map(|h| &h.batches)
        .flat_map(|b| &b.collectives)
        .collect();
    assert!(!recs.is_empty());
    assert!(recs
        .iter()
        .any(|c| c.gpu_done_ns > c.gpu_arrive_ns && c.bytes > 0));
    assert_eq!(rec.unobserved_ranks(), vec![1]);
    // Two ranks of a 128-rank job: no group arguments, epoch timestamps.
    let rec = cli::import(
        cli::Format::Kineto,
        &[
            dir.join("trace_filter_sampled_rank-0.json.gz"),
            dir.join("trace_filter_sampled_rank-1.json.gz"),
        ],
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(rec.unobserved_ranks().len(), 126);
    // Mixing the two jobs is refused, naming the files.
    let e = cli::import(
        cli::Format::Kineto,
        &[
            dir.join("nccl_parser_config_nccl_data.json.gz"),
            dir.join("trace_filter_sampled_rank-1.json.gz"),
        ],
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(e, ReplayError::MixedJobs(_)), "{e}");
    assert!(e.to_string().contains("world size"), "{e}");
}

#[test]
fn bad_input_is_a_clear_error_naming_the_file() {
    let tmp = std::env::temp_dir().join(format!("slowrank-analyze-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let gloo = repo().join("coordinator/tests/data/kineto-gloo/rank-0.json.gz");
    let bytes = std::fs::read(&gloo).unwrap();
    let cut = tmp.join("truncated.json.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let foreign = tmp.join("foreign.json");
    std::fs::write(&foreign, r#"{"hello": "world"}"#).unwrap();
    let parquet = tmp.join("trace-X.parquet");
    std::fs::write(&parquet, b"PAR1 not really").unwrap();
    std::fs::write(
        tmp.join("meta-X.yaml"),
        "dp_size: 1\npp_size: 1\ntp_size: 1\nworld_size: 1\n",
    )
    .unwrap();
    for (format, p, want) in [
        (cli::Format::Kineto, &cut, "not a readable gzip file"),
        (cli::Format::Kineto, &foreign, "no traceEvents"),
        (cli::Format::Study, &parquet, "not a readable parquet file"),
        (cli::Format::Records, &tmp, "no agent-*.jsonl"),
    ] {
        let e = cli::import(format, std::slice::from_ref(p), &mut |_| {}).unwrap_err();
        let s = e.to_string();
        assert!(s.contains(&*p.to_string_lossy()), "{s}");
        assert!(s.contains(want), "{s}");
    }
    let e = cli::import(cli::Format::Kineto, &[tmp.join("nope.json")], &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("nope.json"), "{e}");
    std::fs::remove_dir_all(&tmp).ok();
}

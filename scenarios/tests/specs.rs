//! The shipped specs parse, cover every fault kind and layout, and the
//! layouts actually run (a few iterations each, faults stripped).

mod common;

use std::{collections::HashSet, path::PathBuf};

use slowrank_scenarios::{
    spec::{FaultKind, Spec},
    truth::Outcome,
};

fn specs() -> Vec<(PathBuf, Spec)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("specs");
    let mut out: Vec<(PathBuf, Spec)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let s = Spec::load(&p).unwrap_or_else(|e| panic!("{e}"));
            (p, s)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn specs_cover_fault_kinds_layouts_and_healthy_runs() {
    let all = specs();
    assert!(all.len() >= 12, "only {} specs", all.len());
    let mut kinds = HashSet::new();
    let (mut healthy, mut dp_only, mut three_d, mut intermittent, mut multi, mut contention) =
        (0, 0, 0, 0, 0, 0);
    for (path, s) in &all {
        assert_eq!(
            path.file_stem().unwrap().to_str().unwrap(),
            s.name,
            "file name = spec name"
        );
        assert!(!s.description.is_empty(), "{} has no description", s.name);
        kinds.extend(s.faults.iter().map(|f| f.kind));
        healthy += usize::from(s.faults.is_empty());
        dp_only += usize::from(s.parallel.tp == 1 && s.parallel.pp == 1);
        three_d += usize::from(s.parallel.tp > 1 && s.parallel.pp > 1 && s.parallel.dp > 1);
        intermittent += usize::from(s.faults.iter().any(|f| f.period.is_some()));
        multi += usize::from(s.faults.len() > 1);
        contention += usize::from(s.faults.iter().any(|f| f.mode.is_some()));
    }
    for k in [
        FaultKind::Compute,
        FaultKind::Host,
        FaultKind::Communication,
        FaultKind::Link,
        FaultKind::Hang,
    ] {
        assert!(kinds.contains(&k), "no spec with a {k:?} fault");
    }
    assert!(
        healthy >= 2
            && dp_only >= 2
            && three_d >= 2
            && intermittent >= 1
            && multi >= 1
            && contention >= 1
    );
}

#[test]
fn every_layout_runs() {
    let mut seen = HashSet::new();
    for (_, mut s) in specs() {
        let l = (
            s.hosts,
            s.ranks_per_host,
            s.parallel.tp,
            s.parallel.pp,
            s.parallel.dp,
            s.step.optimizer_graph,
        );
        if !seen.insert(l) {
            continue;
        }
        s.iterations = 3;
        s.faults.clear();
        let name = format!("layout-{}", s.name);
        let summary = common::run_spec(&name, &toml::to_string(&s).unwrap());
        assert_eq!(
            summary.truth.outcome,
            Outcome::Completed,
            "{}: {}",
            s.name,
            summary.truth.reason
        );
        assert_eq!(summary.truth.iterations_completed, 3, "{}", s.name);
        assert_eq!(
            summary.steps.steps.len() as u32,
            3 * s.world_size(),
            "{}",
            s.name
        );
    }
}

/// `run.end_on_release`: the job runs past its iterations until the
/// release file appears, and every rank ends on the same iteration (a
/// multiple of the look-out period), so no collective is left unmatched.
#[test]
fn a_job_run_until_released_ends_on_one_iteration_for_every_rank() {
    use std::time::{Duration, Instant};
    let toml = common::dp_spec("release", 1, 4, 5, "")
        .replace("[run]\n", "[run]\nend_on_release = true\n");
    let s = common::run_spec_beside("release", &toml, |dir| {
        let log = dir.join("logs").join("rank-0.log");
        let done = || {
            std::fs::read_to_string(&log).map_or(0, |t| {
                t.lines().filter(|l| l.contains(" iteration ")).count()
            })
        };
        let t0 = Instant::now();
        while done() < 25 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rank 0 never reached iteration 25"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::write(
            dir.join("sim").join(slowrank_scenarios::spec::RELEASE_FILE),
            b"",
        )
        .unwrap();
    });
    assert_eq!(s.truth.outcome, Outcome::Completed, "{}", s.truth.reason);
    let n = s.truth.iterations_completed;
    assert!(
        n >= 30 && n.is_multiple_of(slowrank_scenarios::spec::RELEASE_EVERY) && n <= 60,
        "ended after {n} iterations"
    );
    for r in 0..4 {
        assert_eq!(s.steps.done_by(r), n, "rank {r}");
    }
}

//! Golden replays: recorded scenario runs (`tests/golden/<run>/`: the agents'
//! records `agent-host-N.jsonl.gz` and the live coordinator's
//! `live-report.json`, whose per-host clock fits drive the replay)
//! replayed through the analyzer must give exactly `expected-report.json`,
//! byte for byte. A change that moves results on purpose re-blesses them:
//!
//! ```sh
//! SLOWRANK_BLESS=1 cargo test -p slowrank-coordinator --test golden
//! git diff coordinator/tests/golden     # review what moved, and say why in the commit
//! ```
//!
//! `scripts/golden-record.sh` re-records the runs themselves (root, eBPF).

use std::path::{Path, PathBuf};

use slowrank_coordinator::render_json;
use slowrank_coordinator::replay::{self, cli, ReplayOptions};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn runs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("live-report.json").is_file())
        .collect();
    v.sort();
    v
}

fn replay_json(run: &Path) -> String {
    let rec = replay::records::load(&[run.to_path_buf()]).unwrap();
    let out = replay::replay(&rec, &cli::options(cli::Format::Records, None), &mut |_| {}).unwrap();
    render_json(&out.report).unwrap() + "\n"
}

#[test]
fn golden_replays_are_byte_identical() {
    let runs = runs();
    assert!(
        runs.len() >= 5,
        "expected the compute, host, link, hang and healthy recordings, found {runs:?}"
    );
    let bless = std::env::var_os("SLOWRANK_BLESS").is_some();
    let mut failed = Vec::new();
    for run in &runs {
        let got = replay_json(run);
        // Twice in one process: hash maps get new random keys each time, so
        // any dependence on their order shows here too.
        assert_eq!(
            got,
            replay_json(run),
            "{}: replay is not deterministic",
            run.display()
        );
        let want_path = run.join("expected-report.json");
        if bless {
            std::fs::write(&want_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&want_path).unwrap_or_default();
        if got != want {
            let actual = std::env::temp_dir().join(format!(
                "golden-{}-actual.json",
                run.file_name().unwrap().to_string_lossy()
            ));
            std::fs::write(&actual, &got).unwrap();
            failed.push(format!(
                "{}: report differs from expected-report.json (actual written to {}; \
                 diff them; if the change is intended, re-bless with SLOWRANK_BLESS=1)",
                run.display(),
                actual.display()
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The recordings say what they are: each run's report names its injected
/// fault (the specs in `golden/specs/`) and nothing else.
#[test]
fn golden_reports_name_their_faults() {
    for run in runs() {
        let name = run.file_name().unwrap().to_string_lossy().to_string();
        let v: serde_json::Value = serde_json::from_str(&replay_json(&run)).unwrap();
        let named: Vec<(u64, String)> = v["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["rank"].as_u64().unwrap(),
                    v["kind"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let hung: Vec<u64> = v["hangs"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|h| h["missing"].as_array().unwrap())
            .map(|m| m["rank"].as_u64().unwrap())
            .collect();
        let (want_v, want_h): (Vec<(u64, &str)>, Vec<u64>) = match name.as_str() {
            "compute" => (vec![(3, "compute")], vec![]),
            "host" => (vec![(2, "host")], vec![]),
            "link" => (vec![(1, "communication")], vec![]),
            "hang" => (vec![], vec![1]),
            "healthy" => (vec![], vec![]),
            other => panic!("unknown golden run {other}"),
        };
        let want_v: Vec<(u64, String)> = want_v.into_iter().map(|(r, k)| (r, k.into())).collect();
        assert_eq!(named, want_v, "{name}: verdicts");
        assert_eq!(hung, want_h, "{name}: hung ranks");
    }
}

#[test]
fn replay_never_reads_the_wall_clock() {
    let run = &runs()[0];
    let rec = replay::records::load(std::slice::from_ref(run)).unwrap();
    let out = replay::replay(&rec, &ReplayOptions::default(), &mut |_| {}).unwrap();
    // Agent records carry no wall time: the report is dated by its data.
    assert_eq!(out.report.generated_at.timestamp(), 0);
}

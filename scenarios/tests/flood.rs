//! The flood load generator end to end: 64 simulated ranks on 8 simulated
//! hosts into a real `slowrank serve`; the coordinator must accept the
//! records and name the hidden slow rank. No timing is asserted (the
//! numbers are for BENCHMARKS.md); needs the `slowrank` binary
//! (`cargo build -p slowrank-coordinator`, done by `cargo test --workspace`).

use slowrank_scenarios::flood::{flood, FloodOptions};

#[test]
fn flood_is_ingested_and_the_hidden_slow_rank_is_named() {
    let out = std::env::temp_dir().join(format!("slowrank-flood-test-{}", std::process::id()));
    let o = FloodOptions {
        ranks: 64,
        collectives_per_s: 100.0,
        flush_ms: 200,
        seconds: 8.0,
        slow_rank: Some(13),
        onset_s: 2.0,
        delay_us: 3000.0,
        out: out.clone(),
    };
    let r = flood(&o).expect("flood runs (is the slowrank binary built?)");
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(r.hosts, 8);
    assert!(r.records_sent >= 64 * 100 * 8, "sent {}", r.records_sent);
    let accepted = r.records_accepted.expect("coordinator metrics readable");
    assert!(accepted > 0, "coordinator accepted nothing");
    assert!(
        r.alerts
            .iter()
            .any(|l| slowrank_scenarios::flood::alert_names_rank(l, 13)),
        "no verdict on rank 13; alerts: {:#?}",
        r.alerts
    );
    assert!(
        !r.alerts.iter().any(|l| (0..64)
            .filter(|k| *k != 13)
            .any(|k| slowrank_scenarios::flood::alert_names_rank(l, k))),
        "a healthy rank was named: {:#?}",
        r.alerts
    );
}

use super::*;

#[test]
fn keeps_the_function_name() {
    assert_eq!(
            super::short_frame("slowrank_scenarios::trainer::phases::<impl slowrank_scenarios::trainer::Trainer>::load_batch"),
            "load_batch"
        );
    assert_eq!(
        super::short_frame("GPU:gemm_backward_kernel"),
        "GPU:gemm_backward_kernel"
    );
    assert_eq!(super::short_frame("a::b::c"), "c");
}

fn agent(i: usize, connected: bool) -> AgentReport {
    AgentReport {
        agent_id: format!("agent-{i}"),
        host: format!("host-{i}"),
        connected,
        connected_at: Utc::now(),
        disconnected_at: None,
        reason: None,
        batches: 1,
        ranks_unobserved: vec![1, 2, 3],
    }
}

fn stall(i: u64) -> HangReport {
    HangReport {
        communicator: format!("{i:#x}"),
        sequence: i,
        op: "all_reduce".into(),
        missing_ranks: vec![1],
        missing_count: None,
        missing_ranges: None,
        missing_unlisted: None,
        missing: Vec::new(),
        present_ranks: (0..64).collect(),
        iteration: Some(i),
        first_seen: None,
        active: false,
        exited_ranks: Vec::new(),
    }
}

#[test]
fn a_report_over_its_bound_cuts_the_least_important_lists_and_says_so() {
    let mut r = crate::Analyzer::new(crate::AnalyzerConfig::default()).report();
    let small = render_json(&r).unwrap();
    let mut fits = r.clone();
    assert!(fits.bound_size(small.len()));
    assert_eq!(
        render_json(&fits).unwrap(),
        small,
        "a report within its bound is untouched"
    );

    r.resolved_stalls = (0..4_000).map(stall).collect();
    r.agents = (0..2_000).map(|i| agent(i, i % 2 == 0)).collect();
    let bound = 512 << 10;
    assert!(render_json(&r).unwrap().len() > 4 * bound);
    assert!(r.bound_size(bound));
    let json = render_json(&r).unwrap();
    assert!(json.len() <= bound, "{} bytes", json.len());
    let t = r.truncated.clone().expect("the cut is said");
    assert_eq!(t.bound_bytes, bound as u64);
    // Stalls go first, every one; then agents gone, the connected kept.
    assert_eq!(t.left_out["resolved_stalls"], 4_000);
    assert!(r.resolved_stalls.is_empty());
    let gone = t.left_out["agents_gone"];
    assert!(gone > 0 && gone <= 1_000, "{t:?}");
    assert!(!t.left_out.contains_key("agents"), "{t:?}");
    assert_eq!(r.agents.iter().filter(|a| a.connected).count(), 1_000);
    assert_eq!(r.agents.len() as u64, 2_000 - gone);
    assert!(render_human(&r).contains("CUT   report cut to 524288 bytes: left out"));
    // It reads back as a report.
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back.truncated, Some(t));
}

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

/// The report's page, with no timeline or flame graphs.
fn page_of(r: &Report) -> String {
    crate::report::html::render(&crate::report::html::Page {
        report: r,
        timeline: &crate::report::timeline::Timeline::default(),
        flames: Vec::new(),
        refresh_s: None,
    })
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

/// A slowdown beside a verdict the what-if could not cost (a GPU with no
/// GPU-side times) says so, instead of "more than the verdicts explain".
#[test]
fn a_slowdown_beside_an_uncosted_verdict_says_the_verdict_may_explain_it() {
    let mut r = crate::synthjob::analyzed(Some(30), 80).report();
    let v = r
        .verdicts
        .iter_mut()
        .find(|v| v.active)
        .expect("the fault is named");
    let rank = v.rank;
    v.cost_iterations = 0;
    v.cost_fraction = 0.0;
    r.slowdown = Some(crate::classify::pace::Slowing {
        baseline_step_ms: 400.0,
        recent_step_ms: 600.0,
        rise: 0.5,
        since_iteration: 30,
        candidates: Vec::new(),
    });
    let text = render_human(&r);
    assert!(
        text.contains(&format!(
            "which rank {rank} named below may explain: its cost is not measured"
        )),
        "{text}"
    );
    // Costed, and explaining most of it: no slowdown line at all.
    let v = r.verdicts.iter_mut().find(|v| v.active).unwrap();
    v.cost_iterations = 10;
    v.cost_fraction = 0.3;
    assert!(!render_human(&r).contains("SLOWDOWN"));
    // Costed, and far short of it: more than the verdicts explain.
    let v = r.verdicts.iter_mut().find(|v| v.active).unwrap();
    v.cost_fraction = 0.05;
    assert!(render_human(&r).contains("more than the verdicts below explain"));
}

/// A job that slowed for a while and came back is not said to have kept
/// its pace; a stretch overlapping a verdict names it; an ongoing stretch
/// is left to the slowdown line.
#[test]
fn a_past_slow_stretch_is_told_and_never_called_kept_pace() {
    let mut r = crate::synthjob::analyzed(None, 80).report();
    assert!(r.verdicts.is_empty() && r.slowdown.is_none(), "healthy");
    assert!(r.slow_stretches.is_empty(), "{:?}", r.slow_stretches);
    r.job.hosts = 1;
    r.slow_stretches = vec![crate::classify::stretches::Stretch {
        from_iteration: 5,
        from_first_step: true,
        to_iteration: 41,
        ongoing: false,
        step_ms: 447.0,
        pace_ms: 313.0,
        rise: 0.43,
    }];
    let text = render_human(&r);
    assert!(!text.contains("kept its pace"), "{text}");
    assert!(
        text.contains("SLOWER iterations 5–41 (slow already at the first step read): step 447.0 ms against the job's best pace of 313.0 ms (+43%); no rank was named: on one host"),
        "{text}"
    );
    let page = page_of(&r);
    assert!(page.contains("SLOWER: iterations 5–41"), "page");
    let mut named = crate::synthjob::analyzed(Some(30), 80).report();
    named.slow_stretches = r.slow_stretches.clone();
    let rank = named.verdicts[0].rank;
    let first = named.verdicts[0].first_seen_iteration;
    // Begun before the verdict: told, with the verdict beside it.
    named.slow_stretches[0].from_iteration = first - 3;
    named.slow_stretches[0].to_iteration = first + 5;
    assert!(render_human(&named).contains(&format!("named meanwhile: rank {rank} (")));
    // Wholly within the verdict's time: the verdict tells it.
    named.slow_stretches[0].from_iteration = first + 1;
    assert!(!render_human(&named).contains("SLOWER"));
    named.slow_stretches[0].from_iteration = first - 3;
    named.slow_stretches[0].ongoing = true;
    named.slowdown = Some(crate::classify::pace::Slowing {
        baseline_step_ms: 313.0,
        recent_step_ms: 447.0,
        rise: 0.43,
        since_iteration: 35,
        candidates: Vec::new(),
    });
    assert!(!render_human(&named).contains("SLOWER"));
}

/// A transient is told on its own line and page list, never as a verdict:
/// the job that had only transients found no slow rank.
#[test]
fn a_transient_is_told_apart_from_the_verdicts() {
    let named = crate::synthjob::analyzed(Some(30), 80).report();
    let mut t = named.verdicts[0].clone();
    t.active = false;
    t.first_seen_iteration = 40;
    t.last_seen_iteration = 52;
    t.last_slow_iteration = 45;
    t.closed_iteration = Some(53);
    let mut r = crate::synthjob::analyzed(None, 80).report();
    r.transients = vec![t.clone()];
    let text = render_human(&r);
    assert!(
        text.contains(
            "No slow rank found now: 1 slow episode(s) ended before the job did (BLIP below)"
        ),
        "{text}"
    );
    assert!(!text.contains("kept its pace (step"), "{text}");
    assert!(
        text.contains(&format!(
            "BLIP  rank {} on {} was compute-slow for 6 iteration(s) (40–45), then kept pace: a transient, not a straggler",
            t.rank, t.host
        )),
        "{text}"
    );
    assert!(!text.contains("WAS "), "{text}");
    let page = page_of(&r);
    assert!(page.contains("Transients (slow briefly"), "page");
    assert!(page.contains("compute-slow, iterations 40–45"), "page");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["transients"].as_array().map(Vec::len), Some(1));
    assert!(json["verdicts"].as_array().unwrap().is_empty());
}

//! One host's link goes down mid-job (its veth, as a pulled cable) for
//! longer than the agent's QUIC idle timeout, then comes back. The job does
//! not notice (ranks talk through the simulated fabric); the agent spools
//! while cut off and reconnects, and every batch it produced reaches the
//! coordinator, or its loss is the spool loss it reports. No record is
//! rejected and the healthy job gets no verdict for the silence.

mod faultkit;

use std::time::Duration;

use faultkit::*;

#[test]
fn host_link_down_and_back_loses_nothing() {
    if !root_or_skip("host_link_down_and_back_loses_nothing") {
        return;
    }
    let mut job = Job::start("link-down", spec("scenarios/specs/dp8-healthy.toml", 400));
    let svc = job.services();
    assert_eq!(
        svc.networks.len(),
        2,
        "as root, each host of a 2-host job runs in its own network namespace"
    );
    let cut = &svc.networks[1];
    job.wait_iterations(0, 40);
    cut.set_link(false).expect("link down");
    // Longer than the agent's idle timeout (6 s): the connection is lost,
    // not just delayed.
    std::thread::sleep(Duration::from_secs(9));
    cut.set_link(true).expect("link up");
    let before = job.iterations_done(0);
    let summary = job.wait();
    assert_eq!(
        format!("{:?}", summary.truth.outcome).to_lowercase(),
        "completed",
        "the job itself must not notice"
    );
    let after = job.iterations_done(0);
    assert!(
        after > before + 20,
        "too little of the job left after the link came back ({before}..{after})"
    );

    let clog = job.dir.join("logs").join("coordinator.log");
    let text = std::fs::read_to_string(&clog).expect("coordinator log");
    let went_away = text
        .lines()
        .filter(|l| l.contains("on host-1 went away"))
        .count();
    assert!(
        went_away >= 1,
        "the coordinator never saw host-1's agent go away: the link was not cut ({})",
        clog.display()
    );
    let ingested = coordinator_batches(&clog);
    for h in 0..2 {
        let host = format!("host-{h}");
        let produced = agent_batches(&job.dir.join(format!("agent-host-{h}.jsonl")));
        assert!(!produced.is_empty(), "{host}: the agent produced nothing");
        let spool_drops = produced.values().map(|b| b.spool_drops).max().unwrap_or(0);
        let mut missing = Vec::new();
        for (seq, b) in &produced {
            match ingested.get(&(host.clone(), *seq)) {
                Some(c) => assert_eq!(
                    *c, b.collectives,
                    "{host} batch {seq}: collective count differs"
                ),
                None => missing.push(*seq),
            }
        }
        eprintln!(
            "{host}: {} batches produced, missing {missing:?}, spool drops {spool_drops}",
            produced.len()
        );
        assert_eq!(
            missing.len() as u64,
            spool_drops,
            "{host}: batches lost without being reported: {missing:?}"
        );
    }
    let r = report(&job.dir);
    eprintln!("ingest after the cut: {}", r["ingest"]);
    assert_eq!(
        r["ingest"]["records_rejected"],
        serde_json::json!({}),
        "records rejected after the link came back: {}",
        r["ingest"]
    );
    // The backlog the host brings back is joined and analysed, not evicted
    // or dropped from the statistics for lack of room.
    assert_eq!(r["ingest"]["instances_evicted"], 0, "{}", r["ingest"]);
    assert_eq!(r["ingest"]["dropped_overflow"], 0, "{}", r["ingest"]);
    let v = verdicts_not_from_contention(&r);
    assert!(
        v.is_empty(),
        "a healthy job got verdicts for a host that was only cut off: {v:?}"
    );
    let hangs = r["hangs"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(
        hangs, 0,
        "a cut-off host was reported as hung: {}",
        r["hangs"]
    );
    job.cleanup();
}

//! The coordinator is killed (SIGKILL) mid-job and started again on the same
//! port and TLS directory. The agents spool while it is away and resend on
//! reconnect: every batch an agent produced is ingested by one of the two
//! coordinator lives (each logs every batch it ingests), or its loss is the
//! spool loss the agents report. The new coordinator learns the agents'
//! ranks and communicators again from their reconnection preamble, so it
//! accepts the resent collectives instead of rejecting them; a resent
//! record whose communicator's other members are not announced yet is
//! parked until they are, not rejected. The second life resumes from the
//! first's journal in `--out`: a batch the first ingested is never ingested
//! again (exactly once), and the report spans both lives.

mod faultkit;

use std::{fs, time::Duration};

use faultkit::*;

#[test]
fn coordinator_restart_loses_nothing() {
    if !root_or_skip("coordinator_restart_loses_nothing") {
        return;
    }
    // The job goes on until the second life has seen both hosts: 250
    // fixed iterations (~13 s) ended before the first life had kept a
    // baseline, in 1 of 10 runs beside a CPU hog (host-1's agent attached
    // 5 s after host-0's), and before either agent reconnected in one
    // fresh-clone CI run.
    let mut s = spec("scenarios/specs/dp8-healthy.toml", 100);
    s.run.end_on_release = true;
    let mut job = Job::start("coord-restart", s);
    let svc = job.services();
    job.wait_iterations(0, 40);
    // Both lives must ingest from both hosts, or "the kill was not
    // mid-run" below says nothing about the restart.
    job.wait_host_shipped("host-0");
    job.wait_host_shipped("host-1");
    wait_kept_state(&job);
    kill9(svc.coordinator.pid);
    // Away long enough for several flushes to pile up in the spools.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !alive(svc.coordinator.pid),
        "the first coordinator survived SIGKILL"
    );
    let log2 = job.dir.join("logs").join("coordinator-2.log");
    let pid2 = job.respawn(&svc.token, &svc.coordinator, &log2);
    job.release_after(
        Duration::from_secs(180),
        "the second coordinator ingested collectives from both hosts",
        40,
        || {
            let b = ingested_batches(&log2);
            ["host-0", "host-1"]
                .iter()
                .all(|h| b.iter().any(|x| x.host == *h && x.collectives > 0))
        },
    );
    let summary = job.wait();
    assert_eq!(
        format!("{:?}", summary.truth.outcome).to_lowercase(),
        "completed",
        "the job itself must not notice"
    );
    // SIGINT: the second life writes its final report and exits.
    job.stop_extra(pid2, Duration::from_secs(20));

    // The second life started from them, not from nothing.
    let log2_text = fs::read_to_string(&log2).expect("second coordinator log");
    assert!(
        log2_text
            .lines()
            .any(|l| l.contains("clock models seeded") && l.contains("hosts=2")),
        "the second life did not seed its clocks; see {}",
        log2.display()
    );
    assert!(
        log2_text
            .lines()
            .any(|l| l.contains("the job's pace goes on from the earlier coordinator's baseline")),
        "the second life learned the job's pace afresh; see {}",
        log2.display()
    );
    // The page's series spans both lives.
    let timeline: serde_json::Value =
        serde_json::from_slice(&fs::read(job.dir.join("timeline.json")).expect("timeline.json"))
            .expect("timeline.json parses");
    let first_row = timeline["rows"][0]["first"].as_u64();
    assert!(
        first_row.is_some_and(|f| f < 40),
        "the series starts at iteration {first_row:?}, after the restart"
    );
    let lines2 = ingested_batches(&log2);
    let (lives, _) =
        ingested_by_lives(&[job.dir.join("logs").join("coordinator.log"), log2.clone()]);
    let lives = without_preambles(&lives);
    let by_seq = |life: &[Ingested]| -> std::collections::BTreeMap<(String, u64), u64> {
        life.iter()
            .map(|b| ((b.host.clone(), b.seq), b.collectives))
            .collect()
    };
    let (life1, life2) = (by_seq(&lives[0]), by_seq(&lives[1]));
    for (h, out) in svc.agents.iter().enumerate() {
        let host = format!("host-{h}");
        let produced = agent_batches(&job.dir.join(format!("agent-host-{h}.jsonl")));
        assert!(
            !produced.is_empty(),
            "{host}: the agent produced nothing ({})",
            out.log.display()
        );
        // The second life was sent the agent's preamble (its ranks and
        // communicators, replayed on reconnection: sequence 0, no records);
        // batch 0 itself is in it only if the first life never answered it.
        assert!(
            lines2
                .iter()
                .any(|b| b.host == host && b.seq == 0 && b.collectives == 0),
            "{host}: no preamble replayed to the new coordinator"
        );
        let spool_drops = produced.values().map(|b| b.spool_drops).max().unwrap_or(0);
        let (mut in1, mut in2, mut missing, mut twice) = (0, 0, Vec::new(), Vec::new());
        for (seq, b) in &produced {
            let key = (host.clone(), *seq);
            match (life1.get(&key), life2.get(&key)) {
                (Some(c), None) | (None, Some(c)) => {
                    assert_eq!(
                        *c, b.collectives,
                        "{host} batch {seq}: collective count differs"
                    );
                    if life1.contains_key(&key) {
                        in1 += 1
                    } else {
                        in2 += 1
                    }
                }
                // The first life journals a batch before answering it: a
                // resend is known to the second life, never ingested twice.
                (Some(_), Some(_)) => twice.push(*seq),
                (None, None) => missing.push(*seq),
            }
        }
        eprintln!(
            "{host}: {} batches produced, {in1} ingested before the kill, {in2} after, {} in both, missing {missing:?}, spool drops {spool_drops}",
            produced.len(),
            twice.len()
        );
        assert!(in1 > 0 && in2 > 0, "{host}: the kill was not mid-run");
        assert!(
            twice.is_empty(),
            "{host}: batches ingested by both lives: {twice:?}"
        );
        assert_eq!(
            missing.len() as u64,
            spool_drops,
            "{host}: batches lost without being reported: {missing:?}"
        );
    }
    let r = report(&job.dir);
    assert_eq!(r["resumed"]["lives"], 2, "{}", r["resumed"]);
    assert_eq!(
        r["ingest"]["records_rejected"],
        serde_json::json!({}),
        "the new coordinator rejected resent records"
    );
    for what in ["expired", "overflow", "held"] {
        assert_eq!(
            r["ingest"]["parking"][what], 0,
            "records lost waiting for their membership: {}",
            r["ingest"]["parking"]
        );
    }
    let v = verdicts_not_from_contention(&r);
    assert!(
        v.is_empty(),
        "a healthy job got verdicts after the restart: {v:?}"
    );
    job.cleanup();
}

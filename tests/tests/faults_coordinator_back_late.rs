//! The coordinator is killed mid-job and comes back only after every rank
//! has exited, while the agents still hold the job's tail in their spools
//! (their exit grace). The restarted coordinator must learn the exited
//! ranks' communicators from the agents' reconnection preamble and join
//! the tail, not park it forever.

mod faultkit;

use std::{fs, time::Duration};

use faultkit::*;

/// A coordinator that comes back after every rank has exited (the agents
/// still hold the job's tail in their spools) learns the exited ranks'
/// communicators from the preamble and joins the tail. When the preamble
/// declared live ranks only, it declared nothing here: 2,576 records sat
/// parked to the end (1 of 2 CI runs where the job outran the restart).
#[test]
fn a_coordinator_back_after_the_ranks_exited_joins_the_tail() {
    if !root_or_skip("a_coordinator_back_after_the_ranks_exited_joins_the_tail") {
        return;
    }
    // The job runs until the test releases it, 100 iterations after the
    // kill: with 400 fixed iterations a slow agent attach (5 s beside a CPU
    // hog in the coordinator-restart test) could leave the first life
    // without a baseline, or too short a tail, before the job's end.
    let mut s = spec("scenarios/specs/dp8-healthy.toml", 100);
    s.run.end_on_release = true;
    let mut job = Job::start("coord-back-late", s);
    let svc = job.services();
    job.wait_iterations(0, 40);
    wait_kept_state(&job);
    kill9(svc.coordinator.pid);
    job.release_after(
        Duration::from_secs(20),
        "the first coordinator was gone",
        100,
        || !alive(svc.coordinator.pid),
    );
    job.wait_ranks_done(8);
    // The agents see their ranks exit and spool the exits.
    std::thread::sleep(Duration::from_millis(500));
    let log2 = job.dir.join("logs").join("coordinator-2.log");
    let pid2 = job.respawn(&svc.token, &svc.coordinator, &log2);
    job.wait();
    job.stop_extra(pid2, Duration::from_secs(20));
    let r = report(&job.dir);
    assert_eq!(r["resumed"]["lives"], 2, "{}", r["resumed"]);
    let parking = &r["ingest"]["parking"];
    assert_eq!(
        parking["held"], 0,
        "records still waiting for their communicators' members: {parking}"
    );
    assert!(
        r["ingest"]["instances_completed"].as_u64().unwrap_or(0) > 0,
        "the second life joined nothing: {}",
        r["ingest"]
    );
    let log2_text = fs::read_to_string(&log2).expect("second coordinator log");
    assert!(
        log2_text
            .lines()
            .any(|l| l.contains("the job's pace goes on from the earlier coordinator's baseline")),
        "the second life sealed no iteration of the tail; see {}",
        log2.display()
    );
    job.cleanup();
}

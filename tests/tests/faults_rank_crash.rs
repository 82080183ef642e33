//! One rank process is killed (SIGKILL) mid-job. The coordinator must report
//! it as a rank exit (and, if its peers were left waiting, as a hang naming
//! it), never as a slow rank.

mod faultkit;

use faultkit::*;

#[test]
fn crashed_rank_is_an_exit_not_a_slow_rank() {
    if !root_or_skip("crashed_rank_is_an_exit_not_a_slow_rank") {
        return;
    }
    const VICTIM: u64 = 5;
    let mut job = Job::start("rank-crash", spec("scenarios/specs/dp8-healthy.toml", 250));
    let _svc = job.services();
    job.wait_iterations(0, 30);
    // The victim's agent must know its ranks before one dies, or there is
    // no exit for it to report: on a loaded CI run host 1's agent (ready
    // 6 s after host 0's) had shipped nothing when rank 5 was killed.
    job.wait_host_shipped("host-1");
    let pid = job.rank_pid(VICTIM as u32);
    kill9(pid);
    let summary = job.wait();
    let outcome = format!("{:?}", summary.truth.outcome).to_lowercase();
    assert_ne!(
        outcome, "completed",
        "the launcher did not notice the crash"
    );

    let r = report(&job.dir);
    let exited: Vec<u64> = r["job"]["exited_ranks"]
        .as_array()
        .expect("job.exited_ranks")
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    eprintln!("outcome {outcome}; exited {exited:?}; hangs {}", r["hangs"]);
    assert!(
        exited.contains(&VICTIM),
        "rank {VICTIM} not reported as exited: {exited:?}"
    );
    for h in r["hangs"].as_array().into_iter().flatten() {
        let missing: Vec<u64> = h["missing_ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_u64())
            .collect();
        assert!(
            missing.contains(&VICTIM),
            "a hang that does not name the crashed rank: {h}"
        );
    }
    let v = verdicts_not_from_contention(&r);
    assert!(v.is_empty(), "a crash was reported as slowness: {v:?}");
    job.cleanup();
}

//! Chaos: during one run of a faulty job (rank 5 compute-slow), the
//! coordinator is SIGKILLed three times and host 0's agent twice, at random
//! moments, and each is started again the way the launcher started it.
//!
//! - Every batch of the agent that was never killed is ingested exactly
//!   once over all coordinator lives (a resend of a batch an earlier life
//!   journaled is a duplicate, not a second ingest), or counted lost by its
//!   spool. A killed agent's in-memory spool dies with it, so for those only
//!   "never twice" is checked.
//! - No record is rejected (records that arrive before their membership are
//!   parked, then joined), and none is lost waiting.
//! - The final report is whole (it parses; it spans all four lives) and its
//!   verdict (rank, class) is the one an undisturbed run gives: rank 5,
//!   compute.
//!
//! The moments come from a seed printed first; `CHAOS_SEED=N` replays one.
//! A restarted agent takes the communicators over from its predecessor's
//! state file, but its attach waits seconds to a minute for the killed
//! agent's probes to be torn down (docs/agent.md, known limits), and the
//! job may end before it: the agent kills therefore come after the verdict
//! was reported, and the hangs and takeovers are printed, not asserted
//! (`faults_agent_restart` asserts the takeover).

mod faultkit;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use faultkit::*;

/// The job's length: the fault runs 100..250, a verdict is due by 330, and
/// two agent kills (each seconds to die) still fit after it. (At 520 a
/// restarted agent's rank was once lined up one instance off, a step
/// late, and named host-slow: fixed in `join::realign`, BENCHMARKS.md,
/// journal 2026-11-29.)
const ITERATIONS: u64 = 520;
/// No kill in the job's last iterations: the job may end before it lands.
const LAST_KILL_MARGIN: u64 = 10;

/// xorshift64*: enough randomness for kill moments, and replayable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

fn wait_dead(pid: u32, what: &str) {
    let t0 = Instant::now();
    while alive(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{what} survived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn chaos_three_coordinator_kills_two_agent_kills() {
    if !root_or_skip("chaos_three_coordinator_kills_two_agent_kills") {
        return;
    }
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("chaos seed {seed} (CHAOS_SEED={seed} replays these moments)");
    let mut rng = Rng(seed);
    // Rank 5 (host 1) is compute-slow for iterations 100..250.
    let mut job = Job::start(
        "chaos",
        spec("scenarios/specs/dp8-compute-slow.toml", ITERATIONS),
    );
    let svc = job.services();
    let logs = job.dir.join("logs");

    // Three coordinator kills at random iterations before the fault is
    // half over, each away for a random 0.2–2.5 s.
    let mut at: Vec<u64> = (0..3).map(|_| rng.range(30, 170)).collect();
    at.sort_unstable();
    let mut coord_pid = svc.coordinator.pid;
    let mut coord_logs = vec![svc.coordinator.log.clone()];
    for (k, it) in at.iter().enumerate() {
        job.wait_iterations(0, *it as usize);
        kill9(coord_pid);
        wait_dead(coord_pid, "the coordinator");
        std::thread::sleep(Duration::from_millis(rng.range(200, 2500)));
        let log = logs.join(format!("coordinator-{}.log", k + 2));
        coord_pid = job.respawn(&svc.token, &svc.coordinator, &log);
        coord_logs.push(log);
        eprintln!(
            "coordinator killed at iteration {it}, life {} started",
            k + 2
        );
    }

    // The verdict must be in a report before host 0's agent goes (its
    // collectives stop until a new agent has attached: see above).
    let t0 = Instant::now();
    loop {
        let found = try_report(&job.dir)
            .map(|r| verdict_ranks(&r))
            .is_some_and(|v| v.iter().any(|(r, _)| *r == 5));
        if found {
            break;
        }
        assert!(
            job.iterations_done(0) < 330 && t0.elapsed() < Duration::from_secs(200),
            "no verdict on rank 5 in the report by iteration {} (seed {seed}); see {}",
            job.iterations_done(0),
            job.dir.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let now = job.iterations_done(0) as u64;
    eprintln!("verdict on rank 5 reported by iteration {now}");

    // Two agent kills of host 0, at random moments after that.
    let mut agent = svc.agents[0].clone();
    let mut agent_pid = agent.pid;
    for k in 0..2 {
        // A killed agent takes seconds to die (its probes are torn down;
        // beside two busy loops once 180 iterations), so the second
        // moment can fall past the job's end: it is then made short of
        // the last iterations, or, the job being there already, skipped.
        let done = job.iterations_done(0) as u64;
        if done >= ITERATIONS - LAST_KILL_MARGIN {
            eprintln!(
                "host 0's agent kill {} skipped: the job is at iteration {done} of {ITERATIONS}",
                k + 1
            );
            break;
        }
        let it = (done + rng.range(2, 20)).min(ITERATIONS - LAST_KILL_MARGIN);
        job.wait_iterations(0, it as usize);
        kill9(agent_pid);
        wait_dead(agent_pid, "the agent");
        let out = job.dir.join(format!("agent-host-0-life{}.jsonl", k + 2));
        let i = agent
            .args
            .iter()
            .position(|a| a == "--output")
            .expect("--output")
            + 1;
        agent.args[i] = out.display().to_string();
        let log = logs.join(format!("agent-host-0-life{}.log", k + 2));
        agent_pid = job.respawn(&svc.token, &agent, &log);
        eprintln!("host 0's agent killed at iteration {it}, restarted");
        std::thread::sleep(Duration::from_millis(rng.range(500, 3000)));
    }

    let summary = job.wait();
    assert_eq!(
        format!("{:?}", summary.truth.outcome).to_lowercase(),
        "completed",
        "the job itself must not notice"
    );
    // The last agent flushes, then the last coordinator writes its report.
    job.stop_extra(agent_pid, Duration::from_secs(20));
    job.stop_extra(coord_pid, Duration::from_secs(30));

    // Exactly once over all lives.
    let (lives, unlogged) = ingested_by_lives(&coord_logs);
    if !unlogged.is_empty() {
        eprintln!("journaled by a life killed before it logged them: {unlogged:?}");
    }
    // A batch 0 not yet answered when a life died is ingested by a later
    // one, after that agent's preamble: the preamble is not a second copy.
    let lives = without_preambles(&lives);
    let mut count: BTreeMap<(String, u64), (usize, u64)> = BTreeMap::new();
    for batches in &lives {
        for b in batches {
            let e = count
                .entry((b.agent.clone(), b.seq))
                .or_insert((0, b.collectives));
            e.0 += 1;
        }
    }
    let twice: Vec<_> = count.iter().filter(|(_, (n, _))| *n > 1).collect();
    assert!(
        twice.is_empty(),
        "batches ingested more than once: {twice:?}"
    );
    let host1: std::collections::BTreeSet<&str> = lives
        .iter()
        .flatten()
        .filter(|b| b.host == "host-1")
        .map(|b| b.agent.as_str())
        .collect();
    assert_eq!(host1.len(), 1, "host 1 had one agent all along: {host1:?}");
    let id = host1.into_iter().next().expect("one");
    let produced = agent_batches(&job.dir.join("agent-host-1.jsonl"));
    let spool_drops = produced.values().map(|b| b.spool_drops).max().unwrap_or(0);
    let mut missing = Vec::new();
    for (seq, b) in &produced {
        match count.get(&(id.to_owned(), *seq)) {
            Some((_, c)) => assert_eq!(*c, b.collectives, "host-1 batch {seq}"),
            None => missing.push(*seq),
        }
    }
    eprintln!(
        "host-1: {} batches produced, missing {missing:?}, spool drops {spool_drops}",
        produced.len()
    );
    assert_eq!(
        missing.len() as u64,
        spool_drops,
        "host-1: batches lost without being reported: {missing:?}"
    );

    // The report is whole and spans the four lives.
    let r = report(&job.dir);
    assert_eq!(r["schema"], "slowrank.report/v1");
    // A coordinator killed while still starting (before it listened) never
    // lived: count the lives that did.
    let lived = coord_logs
        .iter()
        .filter(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .contains("coordinator listening on")
        })
        .count();
    assert!(lived >= 2, "only {lived} coordinator lives started");
    assert_eq!(r["resumed"]["lives"], lived, "{}", r["resumed"]);
    for ingest in [&r["ingest"], &r["resumed"]["earlier_ingest"]] {
        assert_eq!(
            ingest["records_rejected"],
            serde_json::json!({}),
            "{ingest}"
        );
        assert_eq!(ingest["parking"]["expired"], 0, "{ingest}");
        assert_eq!(ingest["parking"]["overflow"], 0, "{ingest}");
    }
    let mut v = verdict_ranks(&r);
    v.sort();
    v.dedup();
    assert_eq!(
        v,
        vec![(5, "\"compute\"".to_owned())],
        "the verdict differs from the undisturbed run's (seed {seed})"
    );
    assert_eq!(
        r["verdicts"].as_array().map_or(0, Vec::len),
        1,
        "one verdict, once: {}",
        r["verdicts"]
    );
    eprintln!(
        "after the agent restarts: {} hangs, takeover {}",
        r["hangs"].as_array().map_or(0, Vec::len),
        r["ingest"]["takeover"]
    );
    // One line per passing run for scripts/repeat-tests.sh's facts table:
    // what "0 lost" rests on (the spool's own count, the parking's expiry,
    // the takeover's unplaced records).
    eprintln!(
        "[fact] chaos seed={seed} coordinator_lives={lived} host1_batches={} missing={} spool_drops={spool_drops} parked_expired=0 rejected=0 takeover_lost={} journaled_unlogged={}",
        produced.len(),
        missing.len(),
        r["ingest"]["takeover"]["lost"].as_u64().unwrap_or(0),
        unlogged.len()
    );
    job.cleanup();
}

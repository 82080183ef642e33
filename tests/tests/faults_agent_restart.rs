//! The agent of one host is killed (SIGKILL) mid-job and a new one is
//! started for the same host. It must find the ranks that are already
//! running (discovery from /proc, libraries already mapped), and its records
//! must resume; the coordinator shows the old agent gone and the new one up,
//! and no verdict blames a rank for the gap. The new agent takes over the
//! communicator tables the old one kept in its state directory, so the
//! running ranks' collectives resume and the coordinator lines their new
//! sequence numbers up with host 0's (`coordinator/src/join/realign.rs`).

mod faultkit;

use std::time::Duration;

use faultkit::*;

#[test]
fn restarted_agent_reattaches_to_running_ranks() {
    if !root_or_skip("restarted_agent_reattaches_to_running_ranks") {
        return;
    }
    // The job goes on until the new agent has been shipping for a while,
    // however long its attach waits for the killed agent's uprobe teardown
    // (below): 600 fixed iterations ended before it twice in 40 runs
    // beside the hog.
    let mut s = spec("scenarios/specs/dp8-healthy.toml", 100);
    s.run.end_on_release = true;
    let mut job = Job::start("agent-restart", s);
    let svc = job.services();
    job.wait_iterations(0, 30);
    // The old agent must have shipped records before it dies, or "both
    // lives shipped batches" below asserts nothing: beside a CPU hog its
    // first batch can leave after rank 0's 30th iteration (seen in 1 of 4
    // repeated runs, the old agent killed with 0 batches).
    job.wait_host_shipped("host-1");
    let old = &svc.agents[1];
    kill9(old.pid);
    // Restarted at once, as after a crash: the new agent does not wait for
    // the old pid to go. Why: the kernel releases a SIGKILLed agent's ~48
    // perf-event uprobe links one at a time in its exit, each after about
    // five RCU grace periods, most of them under the kernel's global
    // `event_mutex` (sampled: 14-18 s idle, over 60 s beside two CPU hogs).
    // The old test waited for that with a 60 s deadline and failed under
    // load. The new agent's attaches queue behind the same mutex
    // (docs/agent.md, known limits); how long the old pid lingered is
    // printed below, not asserted.
    let old_pid = old.pid;
    let t_kill = std::time::Instant::now();
    let teardown = std::thread::spawn(move || {
        while alive(old_pid) {
            std::thread::sleep(Duration::from_millis(100));
        }
        t_kill.elapsed()
    });
    // Same flags, its own output file.
    let mut entry = old.clone();
    let second = job.dir.join("agent-host-1-second.jsonl");
    let at = entry
        .args
        .iter()
        .position(|a| a == "--output")
        .expect("--output")
        + 1;
    entry.args[at] = second.display().to_string();
    let log = job.dir.join("logs").join("agent-host-1-second.log");
    job.respawn(&svc.token, &entry, &log);
    let before = job.iterations_done(4);
    job.release_after(
        Duration::from_secs(180),
        "the new agent shipped collectives",
        40,
        || !agent_records(&second, "collective").is_empty(),
    );
    let summary = job.wait();
    let after = job.iterations_done(4);
    if teardown.is_finished() {
        eprintln!(
            "the killed agent's exit (uprobe teardown) took {:?}",
            teardown.join().expect("teardown watcher")
        );
    }
    assert_eq!(
        format!("{:?}", summary.truth.outcome).to_lowercase(),
        "completed"
    );
    assert!(
        after > before + 20,
        "too little of the job left after the restart ({before}..{after})"
    );

    // Discovery: every rank of host 1 was found again, with its identity.
    let mut found: Vec<u64> = agent_records(&second, "rank")
        .iter()
        .filter_map(|r| r["rank"].as_u64())
        .collect();
    found.sort_unstable();
    found.dedup();
    assert_eq!(
        found,
        vec![4, 5, 6, 7],
        "ranks the new agent found; log {}",
        log.display()
    );
    // Records resume: per-rank intervals, and the collectives of the
    // communicators the new agent took over from the old one's state file.
    let intervals = agent_records(&second, "interval").len();
    let collectives = agent_records(&second, "collective").len();
    let resumed = agent_records(&second, "comm")
        .iter()
        .filter(|c| c["resumed"] == true)
        .count();
    eprintln!(
        "new agent: {intervals} interval records, {collectives} collective records, {resumed} communicators taken over"
    );
    assert!(intervals > 0, "no interval records after the restart");
    assert!(
        resumed >= 4,
        "each of host 1's 4 ranks takes its communicators over: {resumed}"
    );
    assert!(collectives > 0, "no collective records after the restart");
    let r = report(&job.dir);
    let agents: Vec<&serde_json::Value> = r["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter(|a| a["host"] == "host-1")
        .collect();
    assert_eq!(agents.len(), 2, "old and new agent of host-1: {agents:?}");
    assert!(
        agents
            .iter()
            .all(|a| a["batches"].as_u64().unwrap_or(0) > 0),
        "{agents:?}"
    );
    assert!(
        agents.iter().any(|a| a["reason"] == "timed out"),
        "the killed agent is not shown gone: {agents:?}"
    );
    let v = verdicts_not_from_contention(&r);
    assert!(v.is_empty(), "the restart gap was blamed on a rank: {v:?}");
    // Every taken-over member was lined up with host 0's members, and the
    // job's iterations after the restart were observed (joined), not
    // reported as hangs of host 1's ranks.
    let t = &r["ingest"]["takeover"];
    eprintln!("takeover: {t}; job: {}", r["job"]);
    assert_eq!(t["taken_over"], u64::try_from(resumed).unwrap(), "{t}");
    // What the coordinator says of a member it could not line up (one CI
    // run ended with 856 held records, none lined up, and only the counts).
    let log =
        std::fs::read_to_string(job.dir.join("logs").join("coordinator.log")).unwrap_or_default();
    let plain = strip_ansi(&log);
    let unplaced: Vec<&str> = plain
        .lines()
        .filter(|l| l.contains("could not be lined up"))
        .collect();
    // When each member was lined up (during the run, or only once the
    // input ended) and whether the coordinator's final pass ran: the
    // report a stopped coordinator writes last is what this test reads.
    let when: Vec<String> = plain
        .lines()
        .filter(|l| l.contains("lined up with the other members"))
        .map(|l| {
            l.split_whitespace()
                .filter(|f| {
                    [
                        "rank=",
                        "waited_ms=",
                        "patient=",
                        "input_ended=",
                        "covered=",
                    ]
                    .iter()
                    .any(|k| f.starts_with(k))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let final_write = plain
        .lines()
        .find(|l| l.contains("final outputs written"))
        .and_then(|l| l.split("seconds=").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .map(|t| t.trim_matches('"').to_owned());
    eprintln!(
        "[fact] takeover {t} shutdown_logged={} final_write_s={final_write:?} lined_up={when:?} unplaced={}",
        plain.contains("shutting down"),
        unplaced.len()
    );
    assert_eq!(t["lined_up"], t["taken_over"], "{t}; {unplaced:#?}");
    assert_eq!(t["held"], 0, "{t}; {unplaced:#?}");
    // No hang at all: not of host 1's ranks for the gap, and not of host
    // 0's either. (CI once saw 2 hangs of host 0's ranks and 238 of its
    // records `late`: host 1's members had been lined up 351 instances too
    // far, on the first instance reported after the takeover was known,
    // because the new agent had waited to connect; its early records were
    // older than every reference. The line-up now uses the newest records
    // the references cover, and the offsets are checked below.)
    let hangs = r["hangs"].as_array().cloned().unwrap_or_default();
    assert!(hangs.is_empty(), "hangs after the restart: {hangs:?}");
    // Each member was lined up at its true offset: its records' entries
    // match host 0's at that offset (one machine's clock; host 1's
    // simulated offset and drift are a few ms, a step is ~30 ms), not
    // seconds off.
    let host0 = entries(&job.dir.join("agent-host-0.jsonl"), 0);
    for rank in 4..8u64 {
        let line = plain
            .lines()
            .find(|l| {
                l.contains("lined up with the other members")
                    && l.contains(&format!("rank={rank} "))
            })
            .unwrap_or_else(|| panic!("rank {rank} not lined up; log {}", job.dir.display()));
        let offset: u64 = line
            .split("offset=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|t| t.parse().ok())
            .expect("offset=N");
        let mine = entries(&second, rank);
        let truth = (0..host0.keys().max().copied().unwrap_or(0))
            .filter_map(|off| {
                let d: Vec<i64> = mine
                    .iter()
                    .take(200)
                    .filter_map(|(s, e)| {
                        host0.get(&(s + off)).map(|h| (*e as i64 - *h as i64).abs())
                    })
                    .collect();
                // The mean, as the coordinator's line-up: the median cannot
                // tell one instance off when a step's buckets are enqueued
                // together.
                (d.len() >= 50).then(|| (d.iter().sum::<i64>() / d.len() as i64, off))
            })
            .min()
            .map(|(_, off)| off)
            .expect("host 0's records overlap the new agent's");
        // How close the choice was (the coordinator's own account of it).
        let fit: Vec<&str> = line
            .split_whitespace()
            .filter(|f| {
                f.starts_with("mean_diff_ms=")
                    || f.starts_with("runner_up_ms=")
                    || f.starts_with("clock_bound_us=")
            })
            .collect();
        eprintln!("rank {rank}: lined up at offset {offset}, by raw times {truth}; {fit:?}");
        assert!(
            offset.abs_diff(truth) <= 2,
            "rank {rank} lined up at offset {offset}, its records match host 0's at {truth}"
        );
    }
    let observed = r["job"]["iterations_observed"].as_u64().unwrap_or(0);
    assert!(
        observed as usize + 20 >= after - (after - before) / 2,
        "only {observed} iterations observed of the {after} rank 4 ran ({before} before the restart)"
    );
    job.cleanup();
}

/// Host entry of each collective of `rank` in an agent's records, by sequence number.
fn entries(path: &std::path::Path, rank: u64) -> std::collections::BTreeMap<u64, u64> {
    agent_records(path, "collective")
        .iter()
        .filter(|c| c["rank"].as_u64() == Some(rank))
        .filter_map(|c| Some((c["seq"].as_u64()?, c["host_entry_ns"].as_u64()?)))
        .collect()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for ch in s.chars() {
        match (esc, ch) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

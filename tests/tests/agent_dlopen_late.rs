//! A library the job dlopens after the agent started is found in
//! /proc/PID/maps (or the rank's LD_LIBRARY_PATH) and probed: the simulated
//! trainer dlopens libcudart.so.12 and libnccl.so.2 after start, from a
//! directory that does not even exist when the agent starts. Drives the
//! agent library directly (no --lib pre-attach), like `doctor` does.
//!
//! Needs root and the trainer built (`cargo build -p slowrank-scenarios`).

use std::time::Duration;

use slowrank_agent::{
    agent::Agent, clock::HostClock, discover::LibKind, discover::Scanner, fold::Limits,
    probes::Probes,
};
use slowrank_scenarios::{
    run::{run, RunOptions},
    spec::Spec,
};

mod faultkit;
use faultkit::root_or_skip;

/// Agents of earlier tests detach their uprobes when they exit, which can
/// take many seconds and stalls every attach on the machine meanwhile; this
/// test measures discovery, not that, so it waits for them (bounded).
fn wait_for_other_agents() {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        let busy = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "slowrank-agent")
        });
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn library_dlopened_after_agent_start_is_found_and_probed() {
    if !root_or_skip("library_dlopened_after_agent_start_is_found_and_probed") {
        return;
    }
    wait_for_other_agents();
    let out =
        std::env::temp_dir().join(format!("slowrank-agent-test-dlopen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let hub = out.join("sim").join("hub.sock");
    assert!(
        hub.as_os_str().len() < 100,
        "hub socket path too long for this test"
    );
    // Only this run's ranks (other scenarios may run on the machine).
    let scanner = Scanner::new(&[format!("SLOWRANK_SIM_HUB={}", hub.display())], None).unwrap();
    let mut agent = Agent::new(
        Probes::load().expect("eBPF load"),
        scanner,
        HostClock::real(),
        Limits::default(),
    );
    // The ranks are forked by this process (the launcher runs in-process).
    agent.probes_mut().watch_tree(std::process::id()).unwrap();
    assert_eq!(agent.libs().count(), 0);

    let mut spec = Spec::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/specs/dp8-healthy.toml"),
    )
    .unwrap();
    // The job goes on until the agent has seen a rank map libnccl.so.2
    // and an ncclAllReduce call through the late probe: a fixed length
    // (40 iterations, ~2 s) ended before that in 1 of 20 runs beside a
    // CPU hog, while other agents' probe teardown stalled the attach.
    spec.iterations = 40;
    spec.run.end_on_release = true;
    let job = {
        let out = out.clone();
        std::thread::spawn(move || run(&spec, &RunOptions::job_only(&out)).expect("scenario"))
    };
    let release = out.join("sim").join(slowrank_scenarios::spec::RELEASE_FILE);
    let t0 = std::time::Instant::now();
    let mut mapped_nccl = Vec::new();
    while !job.is_finished() {
        agent.scan().unwrap();
        agent.poll();
        let mut called = false;
        for l in agent.libs() {
            if l.kind == LibKind::Nccl && !l.mapped_by.is_empty() {
                mapped_nccl = l.mapped_by.clone();
                called = l
                    .symbols
                    .iter()
                    .filter(|s| s.symbol == "ncclAllReduce")
                    .filter_map(|s| s.result.clone().ok())
                    .any(|h| agent.hits(h) > 0);
            }
        }
        // Bounded: past it the asserts below say what was never seen.
        if (called || t0.elapsed() > Duration::from_secs(180)) && !release.exists() {
            std::fs::create_dir_all(out.join("sim")).unwrap();
            std::fs::write(&release, b"").unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let summary = job.join().unwrap();
    agent.scan().unwrap();
    agent.finish();
    let batch = agent
        .cut("h", "a", true, 0)
        .unwrap()
        .expect("something was folded");

    let nccl = agent
        .libs()
        .find(|l| l.kind == LibKind::Nccl)
        .expect("libnccl.so.2 found")
        .clone();
    assert_eq!(
        nccl.path,
        std::fs::canonicalize(out.join("lib/libnccl.so.2")).unwrap()
    );
    assert!(
        !mapped_nccl.is_empty(),
        "libnccl.so.2 never seen in a rank's maps"
    );
    for pid in &mapped_nccl {
        assert!(summary.truth.ranks.iter().any(|r| r.pid == *pid));
    }
    let allreduce = nccl
        .symbols
        .iter()
        .find(|s| s.symbol == "ncclAllReduce")
        .and_then(|s| s.result.clone().ok())
        .expect("ncclAllReduce attached");
    assert!(
        agent.hits(allreduce) > 0,
        "no ncclAllReduce call seen after the late attach"
    );
    assert!(agent.libs().any(|l| l.kind == LibKind::Cudart));
    // Ranks and their exits are reported; collectives whose communicator
    // was created before the probes were in place are counted, not lost.
    assert_eq!(batch.exits.len(), 8);
    let d = agent.drops();
    eprintln!(
        "collectives {} unknown-comm drops {}",
        batch.collectives.len(),
        d.unknown_comm
    );
    assert!(!batch.collectives.is_empty() || d.unknown_comm > 0);
    let _ = std::fs::remove_dir_all(&out);
}

//! The agent's records against what the simulated trainer really did.
//!
//! Runs a small scenario (tp=2 × pp=2 × dp=2, 8 ranks on 2 simulated hosts)
//! with the coordinator and one real agent per host attached (eBPF uprobes on
//! the stand-in libnccl.so.2 / libcudart.so.12), with the stand-ins tracing
//! every NCCL operation they executed (`--trace`: `sim/coll-rank-N.log`, one
//! line per operation in issue order, keyed by the stand-in's own
//! communicator id and sequence number). Then compares, rank by rank.
//!
//! Needs root, and the agent, trainer and coordinator binaries built first
//! (`cargo build -p slowrank-agent -p slowrank-scenarios -p
//! slowrank-coordinator`; a workspace build does it). It lives in the tests
//! crate, not the agent's, so that no crate depends on itself through a
//! dev-dependency (scenarios → agent → scenarios). Without root it skips loudly; under CI=true it fails.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use serde_json::Value;
use slowrank_scenarios::{
    orchestrate::Mode,
    run::{run, RunOptions},
    spec::Spec,
};

mod faultkit;
use faultkit::root_or_skip;

fn spec_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("specs")
        .join(name)
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("slowrank-agent-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("no integer {k} in {v}"))
}

/// One operation as the stand-in executed it: (kind, its comm id, seq or
/// p2p pair+ordinal, host ns).
#[derive(Debug)]
struct Traced {
    p2p: bool,
    comm: String,
    seq: String,
    host_ns: u64,
}

fn traced(path: &Path) -> Vec<Traced> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let k: Vec<&str> = f[0].split('/').collect();
            Traced {
                p2p: k[0] == "p",
                comm: k[1].to_owned(),
                seq: k[2..].join("/"),
                host_ns: f[1].parse().unwrap(),
            }
        })
        .collect()
}

#[test]
fn records_match_what_the_trainer_did() {
    if !root_or_skip("records_match_what_the_trainer_did") {
        return;
    }
    // Launches are counted only in deep windows and launch samples; this
    // test checks the counting itself, so the samples run back to back
    // (from a second after the first rank is found) whatever they cost.
    std::env::set_var(
        "SLOWRANK_AGENT_ARGS",
        "--launch-sample-every 1 --launch-sample-for 1 --max-overhead 100%",
    );
    let mut spec = Spec::load(&spec_path("tp2-pp2-dp2-small.toml")).expect("spec");
    // The job outlives the agents' first launch sample (a second after a
    // CUDA runtime is probed or a rank found) and its attach. At 10 steps
    // (0.4 s) it did not always: beside two busy loops, host 1's agent
    // attached its launch counters for 452 ms from the moment the job
    // began, and the job ended before that agent's next discovery pass.
    spec.iterations = 60;
    let out = out_dir("records");
    let mut opts = RunOptions::job_only(&out);
    opts.mode = Mode::WithAgents;
    opts.trace = true;
    let summary = run(&spec, &opts).expect("scenario with agents");
    let truth = &summary.truth;
    assert_eq!(truth.ranks.len(), 8);

    let mut recs: Vec<Value> = Vec::new();
    for h in 0..spec.hosts {
        let mut l = lines(&out.join(format!("agent-host-{h}.jsonl")));
        for v in &mut l {
            v["agent_host"] = Value::from(h);
        }
        recs.extend(l);
    }
    fn of<'a>(recs: &'a [Value], t: &'static str) -> impl Iterator<Item = &'a Value> {
        recs.iter().filter(move |v| v["type"] == t)
    }
    let of = |t: &'static str| of(&recs, t);

    // Ranks identified from the environment, each by its own host's agent.
    for rt in &truth.ranks {
        let found: Vec<&Value> = of("rank")
            .filter(|v| u(v, "pid") == u64::from(rt.pid))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "rank {} (pid {}) reported {} times",
            rt.rank,
            rt.pid,
            found.len()
        );
        let v = found[0];
        assert_eq!(u(v, "rank"), u64::from(rt.rank));
        assert_eq!(u(v, "local_rank"), u64::from(rt.local_rank));
        assert_eq!(u(v, "group_rank"), u64::from(rt.host));
        assert_eq!(u(v, "world_size"), 8);
        assert_eq!(
            u(v, "agent_host"),
            u64::from(rt.host),
            "rank {} seen by the wrong agent",
            rt.rank
        );
        // Every rank exited at the end of the job, and that was noticed.
        assert_eq!(
            of("exit")
                .filter(|e| u(e, "pid") == u64::from(rt.pid))
                .count(),
            1,
            "exit of rank {} not reported",
            rt.rank
        );
    }

    // The stand-in's communicator id ↔ the agent's must be one-to-one.
    let mut theirs_to_mine: HashMap<String, String> = HashMap::new();
    let mut mine_to_theirs: HashMap<String, String> = HashMap::new();
    // (my comm, seq) → bytes seen by members, for collectives.
    let mut inst_bytes: BTreeMap<(String, u64), BTreeSet<u64>> = BTreeMap::new();
    let mut members: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut skews: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    let clock = |host: u32| {
        truth
            .hosts_clock
            .iter()
            .find(|c| c.host == host)
            .expect("clock")
    };
    for rt in &truth.ranks {
        let mut mine: Vec<&Value> = of("collective")
            .filter(|v| u(v, "pid") == u64::from(rt.pid))
            .collect();
        mine.sort_by_key(|v| u(v, "host_entry_ns"));
        // The trace is written in execution order (one stream per
        // communicator); the host's issue order is by host time.
        let mut tr = traced(&out.join(format!("sim/coll-rank-{}.log", rt.rank)));
        tr.sort_by_key(|t| t.host_ns);
        assert!(!tr.is_empty());
        assert_eq!(
            mine.len(),
            tr.len(),
            "rank {}: agent saw {} operations, the trainer issued {}",
            rt.rank,
            mine.len(),
            tr.len()
        );
        let c = clock(rt.host);
        let mut last_seq: HashMap<String, u64> = HashMap::new();
        for (m, t) in mine.iter().zip(&tr) {
            let comm = m["comm_id"].as_str().unwrap().to_owned();
            let op = m["op"].as_str().unwrap();
            assert_eq!(
                t.p2p,
                op == "Send" || op == "Recv",
                "rank {}: {op} vs traced {t:?}",
                rt.rank
            );
            let a = theirs_to_mine
                .entry(t.comm.clone())
                .or_insert_with(|| comm.clone());
            assert_eq!(
                *a, comm,
                "rank {}: stand-in comm {} maps to two agent comm ids",
                rt.rank, t.comm
            );
            let b = mine_to_theirs
                .entry(comm.clone())
                .or_insert_with(|| t.comm.clone());
            assert_eq!(
                *b, t.comm,
                "agent comm {comm} stands for two stand-in comms"
            );
            let seq = u(m, "seq");
            if !t.p2p {
                assert_eq!(seq.to_string(), t.seq, "rank {}: sequence number", rt.rank);
                inst_bytes
                    .entry((comm.clone(), seq))
                    .or_default()
                    .insert(u(m, "bytes"));
            }
            if let Some(prev) = last_seq.insert(comm.clone(), seq) {
                assert_eq!(seq, prev + 1, "rank {}: gap or reorder on {comm}", rt.rank);
            }
            members
                .entry(comm.clone())
                .or_default()
                .insert(u64::from(rt.rank));
            assert!(u(m, "host_exit_ns") >= u(m, "host_entry_ns"));
            assert_eq!(m["ret"], 0);
            // The agent's time is the host's simulated clock: the raw
            // monotonic time the stand-in logged, plus that host's offset
            // (and a drift of tens of µs over the run). Grouped p2p is
            // logged by the stand-in at group end, so only collectives.
            if !t.p2p {
                let skew = u(m, "host_entry_ns") as i64 - t.host_ns as i64 - c.offset_us * 1000;
                skews.entry(rt.host).or_default().push(skew);
            }
        }
    }
    // A loaded 2-core machine may preempt a rank between the probe and the
    // stand-in's own timestamp, so the median per host is compared.
    for (host, mut v) in skews {
        v.sort_unstable();
        let median = v[v.len() / 2];
        assert!(
            median.abs() < 300_000,
            "host {host}: median skew {median} ns off its simulated offset"
        );
    }
    // Bytes: every member agrees; the values are the spec's sizes.
    let sizes = [spec.step.bucket_bytes, spec.step.activation_bytes];
    for ((comm, seq), b) in &inst_bytes {
        assert_eq!(b.len(), 1, "{comm}/{seq}: members disagree on bytes {b:?}");
        let v = *b.iter().next().unwrap();
        assert!(
            sizes.contains(&v),
            "{comm}/{seq}: {v} bytes is not a size the trainer used ({sizes:?})"
        );
    }
    // Communicators: world (8), TP (2 members), PP (2), DP (2), as the layout says.
    let comm_recs: Vec<&Value> = of("comm").collect();
    for (comm, m) in &members {
        let recs: Vec<&&Value> = comm_recs
            .iter()
            .filter(|c| c["comm_id"] == comm.as_str())
            .collect();
        assert_eq!(
            recs.len(),
            m.len(),
            "{comm}: {} comm records for {} members",
            recs.len(),
            m.len()
        );
        let positions: BTreeSet<u64> = recs.iter().map(|c| u(c, "rank_in_comm")).collect();
        assert_eq!(
            positions,
            (0..m.len() as u64).collect(),
            "{comm}: member positions"
        );
        assert!(
            recs.iter().all(|c| u(c, "nranks") == m.len() as u64),
            "{comm}: nranks"
        );
    }
    let sizes: BTreeMap<usize, usize> = members.values().fold(BTreeMap::new(), |mut acc, m| {
        *acc.entry(m.len()).or_default() += 1;
        acc
    });
    // TP: 4 comms of 2, PP: 4 of 2, DP: 4 of 2 (only those used by collectives).
    assert_eq!(
        sizes.get(&2).copied().unwrap_or(0),
        12,
        "communicator sizes {sizes:?}"
    );
    // Per-interval counters: launches were counted in-kernel.
    let launches: u64 = of("interval").map(|v| u(v, "launches")).sum();
    assert!(launches > 0, "no launches counted");
    // And the intervals say when they were counted and what the probes cost.
    assert!(of("interval").any(|v| u(v, "launch_counted_ns") > 0));
    assert!(of("interval").all(|v| u(v, "launch_counted_ns") <= u(v, "end_ns") - u(v, "start_ns")));
    let hits: u64 = of("interval").map(|v| u(v, "probe_hits")).sum();
    let cost: u64 = of("interval").map(|v| u(v, "probe_cost_ns")).sum();
    assert!(hits >= launches, "probe hits {hits} < launches {launches}");
    assert!(cost > 0 && of("interval").all(|v| u(v, "trap_pair_ns") > 0));
    // The agent's own CPU, shared among its ranks' intervals.
    let own: u64 = of("interval").map(|v| u(v, "agent_cpu_ns")).sum();
    assert!(own > 0, "the agent reported no CPU time of its own");
    let before: u64 = of("collective").map(|v| u(v, "launches_before")).sum();
    assert!(
        before > 0 && before <= launches,
        "launches before collectives {before}, counted {launches}"
    );
    let drops: u64 = of("batch")
        .map(|v| u(v, "ringbuf_drops"))
        .max()
        .unwrap_or(0);
    assert_eq!(drops, 0);
    let _ = std::fs::remove_dir_all(&out);
}

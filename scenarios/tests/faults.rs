//! The simulated job behaves like a real one under each fault kind, judged
//! by the stand-ins' own traces (host issue time, GPU arrival, release,
//! completion of every collective). Assertions compare ranks with each other
//! with wide margins, never against absolute durations.

mod common;

use common::*;
use slowrank_scenarios::truth::Outcome;

#[test]
fn a_compute_slow_rank_arrives_last_and_waits_least() {
    let faults = "[[fault]]\nkind = \"compute\"\nrank = 2\nfactor = 4.0\nstart_iteration = 4\n";
    let s = run_spec("compute", &dp_spec("compute", 1, 4, 10, faults));
    assert_eq!(s.truth.outcome, Outcome::Completed, "{}", s.truth.reason);
    let w = &s.truth.faults[0].windows;
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].onset_iteration, 4);

    let all: Vec<_> = (0..4).map(|r| colls(&s.out, r)).collect();
    // Collectives of iterations 5.. (4 buckets per iteration on the world comm).
    let keys: Vec<String> = all[2]
        .values()
        .filter(|c| c.seq() >= 20)
        .map(|c| c.key.clone())
        .collect();
    assert!(keys.len() >= 16, "{} collectives", keys.len());
    let last = keys
        .iter()
        .filter(|k| all[2][*k].arrive == all[2][*k].release)
        .count();
    assert!(
        last * 10 >= keys.len() * 9,
        "slow rank last in {last}/{}",
        keys.len()
    );
    let slow_wait = median(keys.iter().map(|k| all[2][k].wait()).collect());
    for r in [0, 1, 3] {
        let wait = median(keys.iter().map(|k| all[r][k].wait()).collect());
        assert!(
            wait > 3 * slow_wait + 1_000_000,
            "rank {r} waits {wait} ns, slow rank {slow_wait} ns"
        );
    }
    // Its host is not what is late: it issues the calls with the others.
    let host_lag: Vec<i64> = keys
        .iter()
        .map(|k| all[2][k].host as i64 - all[0][k].host as i64)
        .collect();
    let gpu_lag: Vec<i64> = keys
        .iter()
        .map(|k| all[2][k].arrive as i64 - all[0][k].arrive as i64)
        .collect();
    let (h, g) = (median_i(host_lag), median_i(gpu_lag));
    assert!(
        g > 2_000_000 && h < g / 2,
        "host lag {h} ns, GPU lag {g} ns"
    );
    // Step times: everyone pays for the slow GPU.
    let before = median(
        s.steps
            .of_rank(0)
            .iter()
            .filter(|x| x.iteration < 4)
            .map(|x| x.duration_ns())
            .collect(),
    );
    let after = median(
        s.steps
            .of_rank(0)
            .iter()
            .filter(|x| x.iteration > 4)
            .map(|x| x.duration_ns())
            .collect(),
    );
    assert!(
        after as f64 > 1.5 * before as f64,
        "step {before} -> {after} ns"
    );
}

fn median_i(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
fn a_host_slow_rank_issues_late_while_its_gpu_idles() {
    let faults =
        "[[fault]]\nkind = \"host\"\nrank = 1\nfunction = \"load_batch\"\ndelay_us = 60000\nstart_iteration = 4\n";
    let s = run_spec("host", &dp_spec("host", 1, 4, 10, faults));
    assert_eq!(s.truth.outcome, Outcome::Completed, "{}", s.truth.reason);
    let all: Vec<_> = (0..4).map(|r| colls(&s.out, r)).collect();
    // The first bucket of iterations 5..: issued right after load_batch.
    let keys: Vec<String> = all[1]
        .values()
        .filter(|c| c.seq() >= 20 && c.seq() % 4 == 0)
        .map(|c| c.key.clone())
        .collect();
    assert!(keys.len() >= 4);
    for k in &keys {
        let slow = &all[1][k];
        let others: Vec<&Coll> = [0, 2, 3].iter().map(|r| &all[*r][k]).collect();
        let host_lag = slow.host as i64 - median(others.iter().map(|c| c.host).collect()) as i64;
        assert!(host_lag > 30_000_000, "{k}: host only {host_lag} ns late");
        // Its GPU added nothing: from issue to arrival it took no longer
        // than the healthy ranks' GPUs did.
        let own = slow.arrive - slow.host;
        let healthy = median(others.iter().map(|c| c.arrive - c.host).collect());
        assert!(
            own < healthy + healthy / 2 + 2_000_000,
            "{k}: GPU took {own} ns vs {healthy} ns"
        );
        // The others wait for it.
        assert!(
            others.iter().all(|c| c.wait() > 10_000_000),
            "{k}: others did not wait"
        );
        assert!(
            slow.wait() < 5_000_000,
            "{k}: slow rank waited {} ns",
            slow.wait()
        );
    }
}

#[test]
fn a_communication_fault_slows_only_the_links_of_its_nic() {
    // 2 hosts x 2: TP pairs {0,1} {2,3} inside hosts (NVLink), DP pairs
    // {0,2} {1,3} across hosts (NIC). Rank 3's NIC gets slow. As root, hosts
    // are namespaces and the fault's bandwidth is real `tc` shaping of rank
    // 3's port replica, which its NIC measures (two bursts after onset);
    // otherwise it is a model knob.
    let toml = r#"
name = "comm"
seed = 5
iterations = 20
hosts = 2
ranks_per_host = 2
[parallel]
tp = 2
pp = 1
dp = 2
[step]
forward_kernels = 16
backward_kernels = 32
kernel_us = 250
grad_buckets = 2
bucket_bytes = 16777216
activation_bytes = 1048576
layers = 2
jitter = 0.02
[run]
timeout_s = 120
[[fault]]
kind = "communication"
rank = 3
bandwidth_factor = 0.1
extra_latency_us = 200
start_iteration = 3
"#;
    let s = run_spec("comm", toml);
    assert_eq!(s.truth.outcome, Outcome::Completed, "{}", s.truth.reason);
    let all: Vec<_> = (0..4).map(|r| colls(&s.out, r)).collect();
    let shared = |a: usize, b: usize| -> Vec<String> {
        all[a]
            .keys()
            .filter(|k| all[b].contains_key(*k) && k.starts_with("c/"))
            .cloned()
            .collect()
    };
    let dp13 = shared(1, 3);
    let dp02 = shared(0, 2);
    let tp01 = shared(0, 1);
    assert!(!dp13.is_empty() && !dp02.is_empty() && !tp01.is_empty());
    let faulty = |keys: &[String], r: usize| -> u64 {
        median(
            keys.iter()
                .map(|k| &all[r][k])
                // Two buckets per iteration: iterations 10.., well after
                // the measured port caught up with the onset at 3.
                .filter(|c| c.seq() >= 20)
                .map(Coll::transfer)
                .collect(),
        )
    };
    let (slow, healthy, nvlink) = (faulty(&dp13, 1), faulty(&dp02, 0), faulty(&tp01, 0));
    assert!(
        slow > 3 * healthy,
        "DP {{1,3}} transfer {slow} ns vs DP {{0,2}} {healthy} ns"
    );
    assert!(
        nvlink < healthy,
        "TP (NVLink) transfer {nvlink} ns vs DP {healthy} ns"
    );
    // The verbs path shows it too: rank 3's sends take longer to complete,
    // from when the fault took effect (shaped: when rank 3's NIC measured
    // its slow port, a few bursts after the onset).
    let onset = s.truth.faults[0].windows[0].onset_mono_ns;
    let shaped = s.out.join("sim/port-rank-3.log").exists();
    let effect = if shaped {
        port_log(&s.out, 3)
    } else {
        Vec::new()
    }
    .iter()
    .find(|l| l.1 < 1.0)
    .map_or(onset, |l| l.0);
    let lat = |r: u32| {
        let v: Vec<u64> = nic(&s.out, r)
            .iter()
            .filter(|(p, _)| *p >= effect)
            .map(|(p, c)| c - p)
            .collect();
        assert!(!v.is_empty(), "rank {r} posted nothing through verbs");
        median(v)
    };
    assert!(
        lat(3) > 3 * lat(2),
        "post->completion rank 3 {} ns, rank 2 {} ns",
        lat(3),
        lat(2)
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_shaped_port(&s);
    }
}

/// `mono_ns factor` lines of `sim/port-rank-N.log`.
fn port_log(out: &std::path::Path, rank: u32) -> Vec<(u64, f64)> {
    let path = out.join("sim").join(format!("port-rank-{rank}.log"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (no port monitor?)", path.display()));
    text.lines()
        .map(|l| {
            let (t, f) = l.split_once(' ').expect("two fields");
            (t.parse().expect("ns"), f.parse().expect("factor"))
        })
        .collect()
}

/// Bytes `tc -s class show` says class `class` sent, and its rate line.
fn tc_class(text: &str, class: &str) -> (u64, String) {
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.starts_with(&format!("class htb {class} ")) {
            let sent = lines
                .next()
                .and_then(|s| s.trim().strip_prefix("Sent "))
                .and_then(|s| s.split(' ').next())
                .and_then(|b| b.parse().ok())
                .unwrap_or_else(|| panic!("no Sent line for {class} in\n{text}"));
            return (sent, l.to_string());
        }
    }
    panic!("no class {class} in\n{text}");
}

/// Rank 3's port replica was shaped to 0.1 of nominal after the onset and
/// its NIC measured that; the other ports stayed healthy; the bursts really
/// crossed the shaped classes.
fn assert_shaped_port(s: &slowrank_scenarios::run::RunSummary) {
    let onset = s.truth.faults[0].windows[0].onset_mono_ns;
    for r in 0..4 {
        let log = port_log(&s.out, r);
        eprintln!("port-rank-{r}.log: {log:?}");
        assert_eq!(log.first().map(|l| l.1), Some(1.0), "rank {r}: {log:?}");
        if r != 3 {
            assert!(
                log.iter().all(|l| l.1 == 1.0),
                "rank {r}'s healthy port measured slow: {log:?}"
            );
        }
    }
    let log = port_log(&s.out, 3);
    assert!(
        log.iter().all(|(t, f)| *f == 1.0 || *t > onset),
        "rank 3's port slowed before the onset at {onset}: {log:?}"
    );
    let last = log.last().expect("a line").1;
    assert!(
        (0.05..=0.2).contains(&last),
        "rank 3's port measured {last}, expected about 0.1: {log:?}"
    );
    // Host 1 holds ranks 2 (class 1:10) and 3 (class 1:11).
    let path = s.out.join("logs").join("tc-host-1.txt");
    let text = std::fs::read_to_string(&path).expect("tc-host-1.txt");
    eprintln!("{text}");
    let (slow_bytes, slow_rate) = tc_class(&text, "1:11");
    let (healthy_bytes, healthy_rate) = tc_class(&text, "1:10");
    assert!(slow_rate.contains("rate 5Mbit"), "{slow_rate}");
    assert!(healthy_rate.contains("rate 50Mbit"), "{healthy_rate}");
    // At least five bursts of 16 x 1442 bytes on the wire each (one per
    // 50 ms over a run of well under a second).
    let burst = 16 * 1442;
    assert!(
        slow_bytes >= 5 * burst && healthy_bytes >= 5 * burst,
        "shaped classes sent {slow_bytes} and {healthy_bytes} bytes"
    );
}

#[test]
fn a_hang_blocks_the_members_and_the_launcher_cleans_up() {
    let faults = "[[fault]]\nkind = \"hang\"\nrank = 2\nstart_iteration = 3\n";
    let s = run_spec("hang", &dp_spec("hang", 1, 4, 50, faults));
    let t = &s.truth;
    assert_eq!(t.outcome, Outcome::Hang, "{}", t.reason);
    assert_eq!(t.iterations_completed, 3);
    assert_eq!(t.faults[0].windows.len(), 1);
    assert_eq!(t.faults[0].windows[0].onset_iteration, 3);
    assert_eq!(t.faults[0].windows[0].end_iteration, None);
    // The first collective of iteration 3 is stuck: every member but 2.
    let stuck = t
        .blocked
        .iter()
        .find(|b| b.key.starts_with("c/"))
        .unwrap_or_else(|| panic!("no blocked collective in {:?}", t.blocked));
    assert_eq!(stuck.members, 4);
    assert_eq!(stuck.arrived, vec![0, 1, 3]);
    // Nothing is left running.
    for r in &t.ranks {
        // SAFETY: probing a pid with signal 0.
        let alive = unsafe { libc::kill(r.pid as i32, 0) } == 0;
        assert!(!alive, "rank {} (pid {}) still runs", r.rank, r.pid);
    }
    let ours = s.out.display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(env) = std::fs::read(entry.path().join("environ")) {
            let env = String::from_utf8_lossy(&env);
            assert!(
                !env.contains(&format!("SLOWRANK_RUN_DIR={ours}\0")),
                "leftover process {:?}",
                entry.file_name()
            );
        }
    }
}

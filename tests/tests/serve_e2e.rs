//! `slowrank serve` end to end over real loopback QUIC: agents' uplinks with
//! skewed host clocks ship a synthetic job; the coordinator must undo the
//! skew from its own clock probes, name the slow rank and class in
//! `report.json`, and stay quiet on a healthy job.

mod support;

use std::time::Duration;

use slowrank_agent::clock::{self, HostClock};
use slowrank_coordinator::{
    net::tls::Identity, report::outputs, serve::ServeSummary, Analyzer, EventKind, Report,
};
use slowrank_shared::wire;
use slowrank_synth::{ClockTruth, Fault, FaultKind, Generator, SynthSpec};
use support::*;

/// About 6 s of a 42 ms step: a drift of tens of ppm needs seconds of
/// probes to be measured to a few µs.
const ITERATIONS: u64 = 150;

struct Outcome {
    /// The `--out` directory (removed when the outcome is dropped).
    out: std::path::PathBuf,
    summary: ServeSummary,
    report: Report,
    analyzer: std::sync::Arc<Analyzer>,
    clocks: Vec<HostClock>,
    /// Raw monotonic span the job covered.
    span: (u64, u64),
    /// Deep-probe window requests each agent received.
    deep_requests: Vec<Vec<wire::Control>>,
}

/// One job at a time: on a 2-core machine two concurrent jobs would only
/// measure each other's scheduling noise in the clock probes.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run_job(name: &str, faults: Vec<Fault>, iterations: u64) -> Outcome {
    let _serial = ONE_AT_A_TIME.lock().await;
    let out = scratch(name);
    let identity = Identity::generate().expect("identity");
    let server = server(&identity, Some(out.clone()));
    let addr = server.local_addr().expect("addr");
    let analyzer = server.analyzer();
    // The coordinator runs on its own runtime, as its own process would.
    let serve = spawn_on_own_runtime(server, std::future::pending());

    // Host 0 keeps true time; host 1 is 2.5 ms ahead and runs 30 ppm fast.
    let clocks = vec![
        HostClock::simulated(0, 0.0),
        HostClock::simulated(2_500_000, 30.0),
    ];
    let mut spec = SynthSpec::dp(2, 4);
    spec.seed = 7;
    // The generator speaks true time; the agents' clocks add the skew.
    spec.clocks = vec![ClockTruth::new(0, 0.0, 0); 2];
    spec.faults = faults;
    let start_ns = spec.start_ns;
    let mut gen = Generator::new(spec);

    let mut uplinks: Vec<_> = (0..2)
        .map(|h| {
            let (host, id) = (format!("node-{h}"), format!("agent-{h}"));
            uplink(
                &identity,
                addr,
                hello(&host, &id, TOKEN, &clocks[h]),
                clocks[h],
            )
        })
        .collect();
    let mut control: Vec<_> = uplinks
        .iter_mut()
        .map(|u| u.take_control_requests().expect("control requests"))
        .collect();
    // The job starts after the connect-time probe burst, like a real one
    // started next to `slowrank-agent`.
    let base = clock::mono_ns() + 1_000_000_000;
    let to_raw = |t: u64| (base as i128 + t as i128 - start_ns as i128).max(1) as u64;
    let mut last = base;
    for _ in 0..iterations {
        let it = gen.next_iteration();
        // Ship each iteration when its time has come, as the agents would.
        let due = to_raw(it.end_ns);
        let now = clock::mono_ns();
        if due > now {
            tokio::time::sleep(Duration::from_nanos(due - now)).await;
        }
        for (_, mut b) in it.batches {
            let h: usize = b.host.trim_start_matches("node-").parse().expect("host");
            map_times(&mut b, |t| clocks[h].map(to_raw(t)));
            b.wall_ns = clock::wall_ns();
            uplinks[h].send(wire::encode(&b).expect("encode"));
        }
        last = due;
    }
    for u in uplinks {
        let r = u.finish(Duration::from_secs(10)).await;
        assert_eq!((r.unsent, r.dropped), (0, 0), "{r:?}");
    }
    let summary = tokio::time::timeout(Duration::from_secs(30), serve)
        .await
        .expect("serve exits once the agents are gone")
        .expect("serve thread")
        .expect("serve");
    let report = outputs::read_report(&out).expect("report.json readable");
    let deep_requests = control
        .iter_mut()
        .map(|rx| {
            let mut v = Vec::new();
            while let Ok(c) = rx.try_recv() {
                v.push(c);
            }
            v
        })
        .collect();
    for f in [
        outputs::REPORT_JSON,
        outputs::REPORT_TXT,
        outputs::TRACE_JSON,
    ] {
        assert!(out.join(f).is_file(), "{f} not written");
    }
    Outcome {
        out,
        summary,
        report,
        analyzer,
        clocks,
        span: (base, last),
        deep_requests,
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.out);
    }
}

/// Writes a `truth.json` for the synthetic job next to the report and runs
/// the scenario scorer on the directory, as `slowrank-scenario score` would.
fn score(o: &Outcome, faults: serde_json::Value) -> slowrank_scenarios::score::Score {
    let truth = serde_json::json!({
        "version": 1, "scenario": "synth-dp8", "seed": 7, "run_id": "e2e",
        "hosts": 2, "ranks_per_host": 4, "world_size": 8,
        "parallel": {"tp": 1, "pp": 1, "dp": 8},
        "iterations": ITERATIONS, "iterations_completed": ITERATIONS,
        "outcome": "completed", "reason": "", "started_wall_ns": 0, "ended_wall_ns": 0,
        "started_mono_ns": 0, "ranks": [], "hosts_clock": [], "faults": faults, "blocked": [],
    });
    std::fs::write(o.out.join("truth.json"), truth.to_string()).expect("truth.json");
    let s = slowrank_scenarios::score::score_dir(&o.out).expect("score");
    print!("{}", slowrank_scenarios::score::render(&s));
    s
}

/// One host's clock errors, in ns.
struct ClockErr {
    host: String,
    /// Report's `offset_us` minus the truth at its `reference_agent_ns`.
    offset: f64,
    /// The report's line (offset and drift) minus the truth, mid-job.
    offset_mid: f64,
    /// Analyzer mapping (probes + completion refinement) minus truth, at
    /// eleven points across the job.
    mapping: Vec<f64>,
    bound: f64,
}

fn clock_errors(o: &Outcome) -> Vec<ClockErr> {
    let mut errs = Vec::new();
    for (h, c) in o.clocks.iter().enumerate() {
        let host = format!("node-{h}");
        let rep = o
            .report
            .clock
            .hosts
            .iter()
            .find(|x| x.host == host)
            .expect("host in report");
        let (Some(off_us), Some(at)) = (rep.offset_us, rep.reference_agent_ns) else {
            panic!("{host} has no probe fit: {rep:?}");
        };
        assert!(
            rep.udp_samples > 0,
            "{host}: no probe answered on the clock port: {rep:?}"
        );
        let prom = o.analyzer.metrics().to_prometheus();
        let udp_line = format!("slowrank_clock_probes_total{{host=\"{host}\",path=\"udp\"}} ");
        let udp: f64 = prom
            .lines()
            .find_map(|l| l.strip_prefix(&udp_line))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{host}: no udp probe gauge in\n{prom}"));
        assert!(udp > 0.0, "{host}: udp probe gauge {udp}");
        // Invert the simulated clock: agent = raw + offset + drift·(raw − epoch).
        let d = c.drift_ppm * 1e-6;
        let raw = (at as f64 - c.offset_ns as f64 + d * c.epoch_ns as f64) / (1.0 + d);
        let offset = off_us * 1e3 - (raw - at as f64);
        // The report's drift is the agent clock's rate error p; the line's
        // slope in coord − agent per agent ns is −p/(1+p).
        let p = rep.drift_ppm.unwrap_or(0.0) * 1e-6;
        let mid_raw = (o.span.0 + o.span.1) / 2;
        let mid_agent = c.map(mid_raw);
        let line = off_us * 1e3 + (-p / (1.0 + p)) * (mid_agent as f64 - at as f64);
        let offset_mid = line - (mid_raw as f64 - mid_agent as f64);
        let mapping: Vec<f64> = (0..=10u64)
            .map(|k| {
                let raw = o.span.0 + (o.span.1 - o.span.0) * k / 10;
                let (coord, _) = o.analyzer.to_coord(&host, c.map(raw));
                coord as f64 - raw as f64
            })
            .collect();
        let bound = rep.error_bound_us.unwrap_or(f64::INFINITY) * 1e3;
        println!(
            "clock {host}: offset error {:+.1} µs at the fit reference (bound {:.1} µs), {:+.1} µs mid-job; mapping error over the job {:+.1}..{:+.1} µs; drift {:.1} ppm est. vs {:.1} true",
            offset / 1e3,
            bound / 1e3,
            offset_mid / 1e3,
            mapping.iter().cloned().fold(f64::INFINITY, f64::min) / 1e3,
            mapping.iter().cloned().fold(f64::NEG_INFINITY, f64::max) / 1e3,
            rep.drift_ppm.unwrap_or(f64::NAN),
            c.drift_ppm
        );
        errs.push(ClockErr {
            host,
            offset,
            offset_mid,
            mapping,
            bound,
        });
    }
    errs
}

/// Host 0's clock is true, host 1's is 2.5 ms ahead and 30 ppm fast. Each
/// estimated offset must be within 50 µs of the truth, the hosts relative to
/// each other too, and the analyzer's mapping of every agent time in the job
/// must stay within the error bound it states.
fn assert_clocks(o: &Outcome) {
    let e = clock_errors(o);
    for h in &e {
        assert!(
            h.offset.abs() < 50_000.0 && h.offset_mid.abs() < 50_000.0,
            "{}: offset error {} ns at the reference, {} ns mid-job",
            h.host,
            h.offset,
            h.offset_mid
        );
        for (k, m) in h.mapping.iter().enumerate() {
            assert!(
                m.abs() <= h.bound,
                "{}: mapping error {m} ns at {k}/10 of the job beyond the bound {} ns",
                h.host,
                h.bound
            );
        }
    }
    let rel = e[1].offset_mid - e[0].offset_mid;
    println!(
        "relative offset error node-1 vs node-0, mid-job: {:+.1} µs",
        rel / 1e3
    );
    assert!(
        rel.abs() < 50_000.0,
        "relative offset error {rel} ns ≥ 50 µs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_names_compute_slow_rank_with_skewed_clocks() {
    let fault = Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        40,
    );
    let o = run_job("e2e-compute", vec![fault], ITERATIONS).await;
    let r = &o.report;
    println!("{}", slowrank_coordinator::render_human(r));
    for h in &r.clock.hosts {
        println!(
            "{}: drift {:?} ppm, bound {:?} µs, {} samples, completion shift {:.1} µs",
            h.host, h.drift_ppm, h.error_bound_us, h.probe_samples_seen, h.completion_shift_us
        );
    }
    assert_clocks(&o);
    assert_eq!(r.verdicts.len(), 1, "{:#?}", r.verdicts);
    let v = &r.verdicts[0];
    assert_eq!(
        (v.rank, v.host.as_str(), v.kind.as_str()),
        (5, "node-1", "compute")
    );
    assert!(v.active, "{v:?}");
    assert!(r.hangs.is_empty(), "{:?}", r.hangs);
    // Probes, not batch arrival, set both clocks.
    assert_eq!(r.clock.hosts.len(), 2);
    for h in &r.clock.hosts {
        assert_eq!(h.source, "probes", "{h:?}");
        assert!(h.probe_samples_seen >= 10, "{h:?}");
    }
    assert!(r.clock.max_error_us.is_some());
    // Both agents are listed, gone at the end, nothing refused or rejected.
    assert_eq!(r.agents.len(), 2, "{:?}", r.agents);
    assert!(r
        .agents
        .iter()
        .all(|a| !a.connected && a.batches == ITERATIONS));
    // The synthetic ranks never report an exit: when their agents leave,
    // the report says they are no longer observed rather than dropping them.
    for a in &r.agents {
        assert_eq!(a.ranks_unobserved.len(), 4, "{a:?}");
    }
    assert!(slowrank_coordinator::render_human(r).contains("no longer observed"));
    assert_eq!(o.summary.batches, 2 * ITERATIONS);
    assert_eq!(o.summary.batches_rejected, 0);
    assert!(
        r.ingest.counters.records_rejected.is_empty(),
        "{:?}",
        r.ingest
    );
    // The alert fired once, for the right rank.
    let opened: Vec<_> = o
        .summary
        .events
        .iter()
        .filter(|e| e.event == EventKind::Opened)
        .collect();
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].verdict.as_ref().map(|v| v.rank), Some(5));
    // The suspect's agent (and only it) was asked for a deep-probe window
    // for the suspect. (The job-wide window of a `SLOWER` line, `ranks: []`,
    // may come first on both, when the step grew before the rank was named.)
    let suspect: Vec<Vec<_>> = o
        .deep_requests
        .iter()
        .map(|r| r.iter().filter(|c| !c.ranks.is_empty()).collect())
        .collect();
    assert!(suspect[0].is_empty(), "{:?}", o.deep_requests);
    assert_eq!(suspect[1].len(), 1, "{:?}", o.deep_requests);
    let c = suspect[1][0];
    assert!(c.deep_enable && c.seconds > 0 && c.ranks == [5], "{c:?}");
    assert!(
        o.deep_requests
            .iter()
            .flatten()
            .all(|c| c.deep_enable && (c.ranks.is_empty() || c.ranks == [5])),
        "{:?}",
        o.deep_requests
    );
    // The scenario scorer reads the real report: the fault is matched.
    let s = score(
        &o,
        serde_json::json!([{
            "index": 0, "kind": "compute", "ranks": [5],
            "spec": {"kind": "compute", "rank": 5, "factor": 1.3, "start_iteration": 40},
            "windows": [{"onset_iteration": 40, "onset_wall_ns": 0, "onset_mono_ns": 0,
                         "end_iteration": null, "end_wall_ns": null, "end_mono_ns": null}],
        }]),
    );
    assert!(s.passed && s.faults[0].matched, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stays_quiet_on_a_healthy_job() {
    let o = run_job("e2e-healthy", Vec::new(), ITERATIONS).await;
    let r = &o.report;
    println!("{}", slowrank_coordinator::render_human(r));
    for h in &r.clock.hosts {
        println!(
            "{}: drift {:?} ppm, bound {:?} µs, {} samples, completion shift {:.1} µs",
            h.host, h.drift_ppm, h.error_bound_us, h.probe_samples_seen, h.completion_shift_us
        );
    }
    assert_clocks(&o);
    assert!(r.verdicts.is_empty(), "{:#?}", r.verdicts);
    assert!(r.hangs.is_empty(), "{:?}", r.hangs);
    assert!(o.summary.events.is_empty(), "{:?}", o.summary.events);
    assert!(r.job.iterations_observed >= ITERATIONS - 5, "{:?}", r.job);
    assert_eq!(r.job.ranks_seen, 8);
    // Quiet: at most the one first look when the warm-up ended (job-wide),
    // no suspicion, no slowdown window.
    assert!(
        o.deep_requests
            .iter()
            .all(|r| r.len() <= 1 && r.iter().all(|c| c.ranks.is_empty() && c.deep_enable)),
        "{:?}",
        o.deep_requests
    );
    assert!(score(&o, serde_json::json!([])).passed);
}

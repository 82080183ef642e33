//! `slowrank serve` end to end over real loopback QUIC: agents' uplinks with
//! skewed host clocks ship a synthetic job; the coordinator must undo the
//! skew from its own clock probes, name the slow rank and class in
//! `report.json`, and stay quiet on a healthy job.

mod support;

use std::time::Duration;

use slowrank_agent::clock::{self, HostClock};
use slowrank_coordinator::{
    outputs,
    serve::ServeSummary,
    synth::{ClockTruth, Fault, FaultKind, Generator, SynthSpec},
    tls::Identity,
    Analyzer, EventKind, Report,
};
use slowrank_shared::wire;
use support::*;

/// About 6 s of a 42 ms step: a drift of tens of ppm needs seconds of
/// probes to be measured to a few µs.
const ITERATIONS: u64 = 150;

struct Outcome {
    summary: ServeSummary,
    report: Report,
    analyzer: std::sync::Arc<Analyzer>,
    clocks: Vec<HostClock>,
    /// Raw monotonic span the job covered.
    span: (u64, u64),
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
    let serve = spawn_on_own_runtime(server);

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

    let uplinks: Vec<_> = (0..2)
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
    for f in [
        outputs::REPORT_JSON,
        outputs::REPORT_TXT,
        outputs::TRACE_JSON,
    ] {
        assert!(out.join(f).is_file(), "{f} not written");
    }
    let _ = std::fs::remove_dir_all(&out);
    Outcome {
        summary,
        report,
        analyzer,
        clocks,
        span: (base, last),
    }
}

/// Per host: the report's probe offset vs the truth at its reference time,
/// and the worst error of the analyzer's (refined) mapping across the job vs
/// the bound it states, all in ns.
fn clock_errors(o: &Outcome) -> Vec<(String, f64, f64, f64)> {
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
        // Invert the simulated clock: agent = raw + offset + drift·(raw − epoch).
        let d = c.drift_ppm * 1e-6;
        let raw = (at as f64 - c.offset_ns as f64 + d * c.epoch_ns as f64) / (1.0 + d);
        let truth_ns = raw - at as f64;
        let signed = off_us * 1e3 - truth_ns;
        let offset_err = signed.abs();
        let mut worst: f64 = 0.0;
        let mut bound = 0.0;
        for k in 0..=10u64 {
            let raw = o.span.0 + (o.span.1 - o.span.0) * k / 10;
            let (coord, b) = o.analyzer.to_coord(&host, c.map(raw));
            worst = worst.max((coord as f64 - raw as f64).abs());
            bound = b;
        }
        println!(
            "clock {host}: offset error {:+.1} µs at the fit reference; mapping error over the job ≤ {:.1} µs (bound {:.1} µs); drift {:.1} ppm est. vs {:.1} true",
            signed / 1e3,
            worst / 1e3,
            bound / 1e3,
            rep.drift_ppm.unwrap_or(f64::NAN),
            c.drift_ppm
        );
        errs.push((host, offset_err, worst, bound));
    }
    errs
}

fn assert_clocks(o: &Outcome) {
    for (host, offset_err, worst, bound) in clock_errors(o) {
        assert!(
            offset_err < 50_000.0,
            "{host}: offset error {offset_err} ns ≥ 50 µs"
        );
        // Away from the fit's reference the drift's uncertainty adds to the
        // stated bound; what matters is that it stays far below the
        // millisecond lateness the verdicts rest on.
        assert!(
            worst < 100_000.0 && worst <= bound + 50_000.0,
            "{host}: mapping error {worst} ns (bound {bound} ns)"
        );
    }
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
}

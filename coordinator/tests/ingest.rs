//! Malformed and semantically impossible records are rejected and counted;
//! resends are deduplicated; the report and trace have their stable shape.

mod common;

use slowrank_coordinator::{Analyzer, AnalyzerConfig};
use slowrank_shared::wire::{Batch, CollOp};
use slowrank_synth::{Fault, FaultKind, Generator, SynthSpec};

fn first_batches() -> (Analyzer, Vec<(u64, Batch)>, Generator) {
    let a = Analyzer::new(AnalyzerConfig::default());
    let mut g = Generator::new(SynthSpec::dp(2, 4));
    for (h, s) in g.initial_samples() {
        a.add_clock_sample(&h, s).unwrap();
    }
    let out = g.next_iteration();
    (a, out.batches, g)
}

#[test]
fn impossible_records_are_rejected_with_reasons() {
    let (a, batches, _) = first_batches();
    let (recv, good) = &batches[0];
    let mut b = good.clone();
    let base = b.collectives[0].clone();
    let mut bad = Vec::new();
    let mut r = base.clone();
    r.comm_id = 0xdead; // never announced: parked (it may be early), not refused
    bad.push(r);
    let mut r = base.clone();
    r.host_entry_ns = b.mono_ns + 10_000_000_000; // after the batch was cut
    r.host_exit_ns = r.host_entry_ns;
    r.gpu_arrive_ns = 0;
    r.gpu_done_ns = 0;
    bad.push(r);
    let mut r = base.clone();
    r.gpu_arrive_ns = r.host_entry_ns - 1; // GPU before the host enqueued
    bad.push(r);
    let mut r = base.clone();
    r.host_exit_ns = r.host_entry_ns - 5;
    bad.push(r);
    let mut r = base.clone();
    r.rank = 4000; // beyond the world
    bad.push(r);
    let mut r = base.clone();
    r.op = CollOp::Send;
    r.peer = 99;
    r.seq = 1000;
    bad.push(r);
    let mut r = base.clone();
    r.host_entry_ns = 0;
    bad.push(r);
    b.collectives.extend(bad);
    let mut comm = b.comms[0].clone();
    comm.nranks = 3; // conflicts with the 8 announced
    b.comms.push(comm);
    let mut l = b.links[0].clone();
    l.end_ns = l.start_ns - 1;
    b.links.push(l);
    let sum = a.ingest(&b, *recv);
    assert_eq!(sum.rejected, 8, "{:?}", a.report().ingest);
    let rep = a.report();
    let rej = &rep.ingest.counters.records_rejected;
    assert_eq!(
        rep.ingest.counters.parking.held, 1,
        "{:?}",
        rep.ingest.counters.parking
    );
    for reason in [
        "time_in_future",
        "time_order",
        "rank_out_of_range",
        "bad_peer",
        "missing_timestamp",
        "comm_size_conflict",
    ] {
        assert!(rej.contains_key(reason), "{reason} missing from {rej:?}");
    }
    assert_eq!(rej["time_order"], 3);
    assert_eq!(rej["time_in_future"], 1);
    // While their instances are still open, the same records again are
    // harmless duplicates.
    let mut again = good.clone();
    again.seq += 1;
    again.comms.clear();
    again.ranks.clear();
    let sum = a.ingest(&again, *recv);
    assert_eq!(
        (sum.rejected, sum.duplicates as usize),
        (0, good.collectives.len())
    );
    // Once the other host completes them, a third copy is going backwards.
    let sum = a.ingest(&batches[1].1, batches[1].0);
    assert_eq!(sum.rejected, 0);
    again.seq += 1;
    let sum = a.ingest(&again, *recv);
    assert_eq!(
        sum.rejected as usize,
        good.collectives.len(),
        "{:?}",
        a.report().ingest
    );
    assert!(a.report().ingest.counters.records_rejected["sequence_backwards"] > 0);
    // And nothing here panicked; the analyzer still reasons.
    a.tick(*recv as i64);
}

#[test]
fn resent_batch_is_a_duplicate_and_gaps_are_counted() {
    let (a, batches, mut g) = first_batches();
    for (recv, b) in &batches {
        a.ingest(b, *recv);
    }
    let (recv, b) = &batches[0];
    let s = a.ingest(b, *recv);
    assert!(s.duplicate_batch);
    // Skip one batch of host 0.
    g.next_iteration();
    let out = g.next_iteration();
    for (recv, b) in &out.batches {
        a.ingest(b, *recv);
    }
    let rep = a.report();
    assert_eq!(rep.ingest.counters.duplicate_batches, 1);
    assert_eq!(rep.ingest.counters.missing_batches, 2);
}

/// Batch 0 is deduplicated like any other; a batch number that leaps
/// past any plausible gap is refused (believing it would mark every later
/// batch a duplicate); a drop counter of u64::MAX does not pin the job's sums.
#[test]
fn batch_zero_huge_numbers_and_huge_counters_cannot_poison_the_books() {
    let (a, batches, _) = first_batches();
    let (recv, first) = &batches[0];
    let mut b = first.clone();
    b.seq = 0;
    assert!(!a.ingest(&b, *recv).duplicate_batch);
    assert!(a.ingest(&b, *recv).duplicate_batch, "batch 0 sent twice");
    let mut leap = b.clone();
    leap.seq = u64::MAX - 1;
    assert_eq!(a.ingest(&leap, *recv).batch_rejected, Some("seq_jump"));
    let mut next = b.clone();
    next.seq = 1;
    next.ringbuf_drops = u64::MAX;
    next.spool_drops = u64::MAX;
    let s = a.ingest(&next, *recv);
    assert!(!s.duplicate_batch && s.batch_rejected.is_none(), "{s:?}");
    let mut after = b.clone();
    after.seq = 2;
    after.ringbuf_drops = 5;
    a.ingest(&after, *recv);
    let rep = a.report();
    assert_eq!(rep.ingest.counters.duplicate_batches, 1);
    assert_eq!(rep.ingest.counters.missing_batches, 0);
    assert_eq!(rep.ingest.counters.ringbuf_drops, 5);
    assert_eq!(rep.ingest.counters.spool_drops, 0);
}

#[test]
fn garbage_never_panics() {
    let a = Analyzer::new(AnalyzerConfig::default());
    let mut rng = slowrank_synth::Rng::new(9);
    let (_, batches, _) = first_batches();
    for i in 0..200u64 {
        let mut b = batches[(i % 2) as usize].1.clone();
        b.seq = i + 1;
        for r in &mut b.collectives {
            match rng.below(6) {
                0 => r.seq = rng.next_u64(),
                1 => r.host_entry_ns = rng.next_u64(),
                2 => r.gpu_done_ns = rng.next_u64(),
                3 => r.peer = rng.next_u64() as i32,
                4 => r.rank = rng.next_u64() as u32,
                _ => r.op = CollOp::Recv,
            }
        }
        for l in &mut b.links {
            l.peer_rank = rng.next_u64() as i64;
            l.completions = rng.below(3);
        }
        for c in &mut b.comms {
            c.rank_in_comm = rng.below(16) as u32;
        }
        a.ingest(&b, rng.next_u64());
        a.tick(rng.next_u64() as i64 / 2);
    }
    let rep = a.report();
    assert!(rep.ingest.counters.records_rejected.values().sum::<u64>() > 0);
    let _ = slowrank_coordinator::render_human(&rep);
    let _ = a.trace_json();
}

#[test]
fn report_json_and_trace_have_the_stable_shape() {
    let mut spec = SynthSpec::dp(2, 4);
    spec.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        30,
    ));
    let r = common::run(spec, 60);
    let rep = r.report();
    let v: serde_json::Value =
        serde_json::from_str(&slowrank_coordinator::render_json(&rep).unwrap()).unwrap();
    assert_eq!(v["schema"], "slowrank.report/v1");
    assert!(v["job"]["world_size"] == 8);
    assert!(v["clock"]["max_error_us"].as_f64().unwrap() > 0.0);
    assert!(v["clock"]["hosts"].as_array().unwrap().len() == 2);
    let verdict = &v["verdicts"][0];
    for key in [
        "rank",
        "host",
        "kind",
        "confidence",
        "first_seen_iteration",
        "active",
        "lost_gpu_seconds",
        "link",
        "evidence",
    ] {
        assert!(verdict.get(key).is_some(), "verdict lacks {key}: {verdict}");
    }
    assert_eq!(verdict["kind"], "compute");
    assert_eq!(verdict["rank"], 5);
    assert!(verdict["link"].is_null());
    assert!(verdict["first_seen"].as_str().unwrap().starts_with("20"));
    assert!(v["hangs"].as_array().unwrap().is_empty());
    let human = slowrank_coordinator::render_human(&rep);
    let first_finding = human.lines().find(|l| l.starts_with("NOW")).unwrap();
    assert!(
        first_finding.contains("rank 5 on node-1 is compute-slow, costing"),
        "{human}"
    );
    // The opened event is the one-line alert.
    let open = r.opened();
    assert!(
        open[0]
            .line
            .starts_with("OPEN rank 5 on node-1 is compute-slow"),
        "{}",
        open[0].line
    );
    // Trace: one track per rank, waits drawn for rank 5.
    let t = r.analyzer.trace_json();
    let ev = t["traceEvents"].as_array().unwrap();
    let tracks: std::collections::BTreeSet<u64> = ev
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert_eq!(tracks.len(), 8);
    assert!(ev
        .iter()
        .any(|e| e["cat"] == "wait" && e["name"] == "wait for rank 5"));
}

/// An agent whose probes stop answering while its batches keep coming: the
/// report says so and quotes a bound widened by the silence, not the stale one.
#[test]
fn silent_probes_widen_the_reported_clock_bound() {
    let (a, batches, _) = first_batches();
    let (recv, b0) = &batches[0];
    a.ingest(b0, *recv);
    let host_clock = |a: &Analyzer| {
        a.report()
            .clock
            .hosts
            .into_iter()
            .find(|h| h.host == b0.host)
            .expect("host has a clock")
    };
    let before = host_clock(&a);
    let mut late = b0.clone();
    late.seq += 1;
    late.mono_ns += 30_000_000_000;
    late.wall_ns += 30_000_000_000;
    late.collectives.clear();
    late.intervals.clear();
    late.links.clear();
    late.stacks.clear();
    let sum = a.ingest(&late, recv + 30_000_000_000);
    assert_eq!(sum.rejected, 0, "{:?}", a.report().ingest);
    let after = host_clock(&a);
    assert!(after.probe_age_ms.unwrap() >= 29_000.0, "{after:?}");
    let (b, f) = (
        before.error_bound_us.unwrap(),
        after.error_bound_us.unwrap(),
    );
    assert!(
        f >= b + 29.0,
        "bound {b} µs -> {f} µs after 30 s of silence"
    );
    let human = slowrank_coordinator::report::render_human(&a.report());
    assert!(
        human.contains(&format!("{}: no clock probe answered for 30 s", b0.host)),
        "{human}"
    );
}

//! A call storm fills the ring buffer while nobody drains it (an agent
//! stalled behind a busy CPU): every event is then either delivered or
//! counted as a drop, never silently lost, the kernel-side buffer stays at
//! its fixed size, and delivery resumes once the agent drains again.
//!
//! Needs root (real eBPF); under CI=true a missing root is a failure.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use slowrank_agent::probes::{Probes, EVENTS_BYTES};
use slowrank_shared::probe::{CallEvent, CallKind};

#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_storm_target(a: u64) -> u64 {
    std::hint::black_box(a.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

mod support;
use support::root_or_skip;

/// Drains until nothing more arrives for a while; returns this thread's
/// events of probe `id`.
fn drain_all(probes: &mut Probes, id: u32, tid: u32) -> Vec<CallEvent> {
    let mut all = Vec::new();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_millis(200) {
        let (n, bad) = probes.drain(&mut all);
        assert_eq!(bad, 0, "ring buffer records of the wrong size");
        if n > 0 {
            quiet_since = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    all.retain(|e| e.probe == id && e.tid == tid);
    all
}

#[test]
fn storm_without_draining_counts_every_lost_event() {
    if !root_or_skip("storm_without_draining_counts_every_lost_event") {
        return;
    }
    // Records are 8-byte aligned with an 8-byte header: 8 MiB of 88-byte
    // records hold about 95,000 events; as many calls make twice that.
    let capacity = u64::from(EVENTS_BYTES) / (slowrank_shared::probe::CALL_EVENT_SIZE as u64 + 8);
    let storm: u64 = capacity;
    const AFTER: u64 = 1_000;
    let exe: PathBuf = std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe");
    let mut probes = Probes::load().expect("load eBPF object");
    let id = probes
        .attach(&exe, "slowrank_storm_target")
        .expect("attach to own function");
    probes
        .follow(std::process::id(), Some(0))
        .expect("follow self");
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let drops0 = probes.counters().expect("counters").ringbuf_drops;

    for i in 0..storm {
        slowrank_storm_target(i);
    }
    let got = drain_all(&mut probes, id, tid);
    let drops = probes.counters().expect("counters").ringbuf_drops - drops0;
    eprintln!(
        "storm: {} calls, {} events delivered, {drops} counted as dropped",
        storm,
        got.len()
    );
    assert!(drops > 0, "the storm did not overflow the ring buffer");
    assert!(
        got.len() as u64 <= capacity,
        "the ring buffer held more than its {capacity} records: {} events",
        got.len()
    );
    assert_eq!(
        got.len() as u64 + drops,
        2 * storm,
        "events neither delivered nor counted as dropped"
    );
    // What was delivered is intact and in order: the drops cut whole
    // events, never part of one.
    let mut last = 0;
    for e in &got {
        assert!(e.ts_ns >= last, "delivered events out of order");
        last = e.ts_ns;
        if e.kind == CallKind::Entry as u32 {
            assert!(e.args[0] < storm, "argument garbled: {}", e.args[0]);
        }
    }

    // Drained: the next calls are all delivered again.
    for i in 0..AFTER {
        slowrank_storm_target(i);
    }
    let again = drain_all(&mut probes, id, tid);
    let drops_after = probes.counters().expect("counters").ringbuf_drops - drops0;
    assert_eq!(drops_after, drops, "drops after the agent caught up");
    assert_eq!(again.len() as u64, 2 * AFTER, "delivery did not resume");
    let entries = again
        .iter()
        .filter(|e| e.kind == CallKind::Entry as u32)
        .count() as u64;
    assert_eq!(entries, AFTER);
}

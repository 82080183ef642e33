//! Off-CPU time from the real `sched_switch` program: its stack capture is
//! sampled (a thread of short sleeps is captured about once in 16 switches),
//! and the weights must still add up to each thread's real off-CPU time —
//! for a thread of 200-µs sleeps, of 25-ms sleeps, and of both mixed.
//!
//! Needs root; under CI a missing root is a failure (see support).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slowrank_agent::stacks::{StackConfig, StackSampler};
use slowrank_shared::stack::{StackEvent, StackKind};

mod support;
use support::root_or_skip;

/// This thread's CPU time (ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What one worker thread did: its tid, real off-CPU ns (wall − CPU), sleeps.
struct Worked {
    tid: u32,
    off_ns: u64,
    sleeps: u64,
}

/// Sleeps `pattern` over and over until `stop`; returns what it did.
fn worker(pattern: Vec<Duration>, go: Arc<AtomicBool>, stop: Arc<AtomicBool>) -> Worked {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    while !go.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (t0, c0) = (Instant::now(), thread_cpu_ns());
    let mut sleeps = 0;
    'outer: loop {
        for d in &pattern {
            if stop.load(Ordering::Acquire) {
                break 'outer;
            }
            std::thread::sleep(*d);
            sleeps += 1;
        }
    }
    let wall = t0.elapsed().as_nanos() as u64;
    Worked {
        tid,
        off_ns: wall.saturating_sub(thread_cpu_ns() - c0),
        sleeps,
    }
}

#[test]
fn sampled_off_cpu_captures_still_add_up_to_each_threads_off_cpu_time() {
    if !root_or_skip("sampled_off_cpu_captures_still_add_up_to_each_threads_off_cpu_time") {
        return;
    }
    let mut sampler = StackSampler::start(StackConfig::DEFAULT).expect("start the stack sampler");
    let me = std::process::id();
    let (go, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let short = Duration::from_micros(200);
    let long = Duration::from_millis(25);
    let patterns: [(&str, Vec<Duration>); 3] = [
        ("200-µs sleeps", vec![short]),
        ("25-ms sleeps", vec![long]),
        (
            "5 short, 1 long",
            vec![short, short, short, short, short, long],
        ),
    ];
    let handles: Vec<_> = patterns
        .iter()
        .map(|(_, p)| {
            let (p, go, stop) = (p.clone(), go.clone(), stop.clone());
            std::thread::spawn(move || worker(p, go, stop))
        })
        .collect();
    // Followed before the workers start, so every block they have is seen.
    sampler.follow(me, 0).expect("follow this process");
    std::thread::sleep(Duration::from_millis(50));
    go.store(true, Ordering::Release);
    let mut events: Vec<StackEvent> = Vec::new();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        sampler.drain(&mut events);
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Release);
    let worked: Vec<Worked> = handles
        .into_iter()
        .map(|h| h.join().expect("worker"))
        .collect();
    // The last blocks end at the threads' exit switches, already in the ring.
    std::thread::sleep(Duration::from_millis(20));
    sampler.drain(&mut events);
    let counters = sampler.counters().expect("counters");
    sampler.unfollow(me).expect("unfollow");

    let mut weight: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for ev in &events {
        if StackKind::from_raw(ev.kind) == Some(StackKind::OffCpu) {
            let w = weight.entry(ev.tid).or_default();
            w.0 += ev.weight_ns;
            w.1 += 1;
        }
    }
    eprintln!("counters {counters:?}");
    for ((name, _), w) in patterns.iter().zip(&worked) {
        let (got, records) = weight.get(&w.tid).copied().unwrap_or_default();
        let ratio = got as f64 / w.off_ns as f64;
        eprintln!(
            "{name}: off-CPU {:.0} ms real, {:.0} ms from {records} records ({ratio:.2}), {} sleeps",
            w.off_ns as f64 / 1e6,
            got as f64 / 1e6,
            w.sleeps
        );
        // Expected ≈ 140 records of the period's weight for the short
        // sleeper (σ ≈ 9 %): ±35 % is about 4σ.
        assert!(
            (0.65..=1.35).contains(&ratio),
            "{name}: off-CPU weight {got} ns against {} ns real",
            w.off_ns
        );
    }
    // Each record's kernel stack is the sleeper's own, where it blocked
    // (taken at its switch-in, from the task still off the CPU): a
    // nanosleep frame, not the stack of whichever thread was leaving.
    let kallsyms = Kallsyms::read();
    let ours: Vec<&StackEvent> = events
        .iter()
        .filter(|e| {
            StackKind::from_raw(e.kind) == Some(StackKind::OffCpu)
                && worked.iter().any(|w| w.tid == e.tid)
        })
        .collect();
    let asleep = ours
        .iter()
        .filter(|e| {
            e.kernel_frames()
                .iter()
                .any(|&a| kallsyms.name(a).is_some_and(|n| n.contains("nanosleep")))
        })
        .count();
    eprintln!(
        "{asleep} of {} worker records in a nanosleep frame",
        ours.len()
    );
    assert!(
        !ours.is_empty() && asleep * 10 >= ours.len() * 9,
        "{asleep} of {} off-CPU records have the sleeper's kernel stack",
        ours.len()
    );
    // The short sleeper's captures were mostly sampled away (15 in 16).
    assert!(
        counters.off_cpu_skipped * 10 >= worked[0].sleeps * 7,
        "captures skipped {} of the short sleeper's {} sleeps",
        counters.off_cpu_skipped,
        worked[0].sleeps
    );
}

/// The kernel's function symbols, to name a kernel frame (root reads
/// their addresses).
struct Kallsyms(Vec<(u64, String)>);

impl Kallsyms {
    fn read() -> Self {
        let text = std::fs::read_to_string("/proc/kallsyms").expect("read /proc/kallsyms");
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                matches!(kind, "t" | "T").then(|| (addr, name.to_string()))
            })
            .collect();
        syms.sort();
        assert!(syms.iter().any(|s| s.0 != 0), "kallsyms addresses hidden");
        Kallsyms(syms)
    }

    fn name(&self, addr: u64) -> Option<&str> {
        let i = self.0.partition_point(|s| s.0 <= addr);
        i.checked_sub(1).map(|i| self.0[i].1.as_str())
    }
}

/// Records the kernel's 8 MiB stack ring holds, about (≈ 840 bytes each
/// with the ring's header).
const RING_RECORDS: u64 = (8 << 20) / 840;

// Stand-ins for the CUDA runtime's launch and sync calls, so this test
// binary is its own launch site (`StackSampler::attach_launch_site`).
// Each marks a static of its own (a plain store: a uprobe cannot sit on a
// `lock`-prefixed first instruction): with identical bodies the
// release linker folded launch and both sync calls into one address, so
// every launch also fired two sync probes (45,000 records for 15,000
// launches, and the drain queue overflowed).
static CALLED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

#[no_mangle]
#[inline(never)]
pub extern "C" fn cudaLaunchKernel(func: *const u8) -> i32 {
    std::hint::black_box(func);
    CALLED[0].store(1, Ordering::Relaxed);
    0
}
#[no_mangle]
#[inline(never)]
pub extern "C" fn cudaDeviceSynchronize() -> i32 {
    CALLED[1].store(1, Ordering::Relaxed);
    0
}
#[no_mangle]
#[inline(never)]
pub extern "C" fn cudaStreamSynchronize(s: *const u8) -> i32 {
    std::hint::black_box(s);
    CALLED[2].store(1, Ordering::Relaxed);
    0
}
#[no_mangle]
#[inline(never)]
pub extern "C" fn cudaEventSynchronize(e: *const u8) -> i32 {
    std::hint::black_box(e);
    CALLED[3].store(1, Ordering::Relaxed);
    0
}

/// A fold that stalls (a first symbolization takes seconds on a loaded
/// host) loses nothing: the drain thread empties the kernel's ring while
/// nobody folds. Drained where it was folded, the ring overflowed (the
/// stacks test beside two busy loops dropped thousands of records).
#[test]
fn a_stalled_fold_loses_no_record_once_the_ring_drains_on_its_own_thread() {
    if !root_or_skip("a_stalled_fold_loses_no_record_once_the_ring_drains_on_its_own_thread") {
        return;
    }
    let sites = [
        cudaLaunchKernel as *const () as usize,
        cudaDeviceSynchronize as *const () as usize,
        cudaStreamSynchronize as *const () as usize,
        cudaEventSynchronize as *const () as usize,
    ];
    let distinct: std::collections::BTreeSet<usize> = sites.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        4,
        "stand-ins folded into one address: {sites:x?}"
    );
    // Called, so the linker keeps them for the probes to find.
    cudaDeviceSynchronize();
    cudaStreamSynchronize(std::ptr::null());
    cudaEventSynchronize(std::ptr::null());
    cudaLaunchKernel(std::ptr::null());
    let called: Vec<u64> = CALLED.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert_eq!(called, [1; 4], "each stand-in ran its own body");
    let exe = std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe");
    let mut sampler = StackSampler::start(StackConfig::DEFAULT).expect("start the stack sampler");
    sampler.drain_on_thread();
    let me = std::process::id();
    sampler.follow(me, 0).expect("follow this process");
    let links = sampler
        .attach_launch_site(&exe, Some(me))
        .expect("attach the launch site to this binary");
    // Half again what the kernel's ring holds, with nobody draining: had
    // the fold drained it, that much could not all arrive.
    let launches = RING_RECORDS * 3 / 2;
    for i in 0..launches {
        cudaLaunchKernel(i as *const u8);
    }
    // What the drain thread has yet to take.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut events: Vec<StackEvent> = Vec::new();
    let ours = |events: &[StackEvent]| {
        events
            .iter()
            .filter(|e| e.pid == me && StackKind::from_raw(e.kind) == Some(StackKind::Launch))
            .count() as u64
    };
    while ours(&events) < launches && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        sampler.drain(&mut events);
    }
    let c = sampler.counters().expect("counters");
    sampler.detach_launch_site(links);
    sampler.unfollow(me).expect("unfollow");
    assert_eq!(c.ringbuf_drops, 0, "kernel ring overflowed: {c:?}");
    assert_eq!(c.queue_drops, 0, "drain queue overflowed: {c:?}");
    assert_eq!(ours(&events), launches, "launch records: {c:?}");
}

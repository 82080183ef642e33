//! Loads the real eBPF object, attaches a uprobe and a uretprobe to a function
//! in this very test binary (found through /proc/self/exe), calls it N times
//! and checks that exactly N entries and N returns arrive, in order, with the
//! right arguments and return values.
//!
//! Needs root. Without root it skips loudly; under CI (CI=true) a missing root
//! is a failure, because CI must exercise the real probes.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use slowrank_agent::probes::Probes;
use slowrank_shared::probe::{CallEvent, CallKind};

/// The probed function. `no_mangle` keeps the symbol findable in .symtab,
/// `inline(never)` keeps the call sites real.
#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_selftest_target(a: u64, b: u64, c: u64) -> u64 {
    std::hint::black_box(a.wrapping_mul(1_000_003) ^ b.rotate_left(7) ^ c)
}

mod support;
use support::root_or_skip;

#[test]
fn uprobe_and_uretprobe_on_own_function_deliver_every_call() {
    if !root_or_skip("uprobe_and_uretprobe_on_own_function_deliver_every_call") {
        return;
    }
    const N: u64 = 2000;
    let exe: PathBuf = std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe");
    let mut probes = Probes::load().expect("load eBPF object");
    let id = probes
        .attach(&exe, "slowrank_selftest_target")
        .expect("attach to own function");
    probes
        .follow(std::process::id(), Some(0))
        .expect("follow self");

    let mut expected_ret = Vec::with_capacity(N as usize);
    for i in 0..N {
        expected_ret.push(slowrank_selftest_target(i, i * 2, 0xdead_beef));
    }

    let mut events: Vec<CallEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (events.len() as u64) < 2 * N && Instant::now() < deadline {
        let (n, bad) = probes.drain(&mut events);
        assert_eq!(bad, 0, "ring buffer records of the wrong size");
        if n == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Anything beyond 2N would be a bug too: give stragglers a moment.
    std::thread::sleep(Duration::from_millis(50));
    probes.drain(&mut events);

    let counters = probes.counters().expect("counters");
    assert_eq!(counters.ringbuf_drops, 0, "ring buffer dropped events");
    // Other tests in this process call the same function from other threads.
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let mine: Vec<&CallEvent> = events
        .iter()
        .filter(|e| e.probe == id && e.tid == tid)
        .collect();
    let entries: Vec<&&CallEvent> = mine
        .iter()
        .filter(|e| e.kind == CallKind::Entry as u32)
        .collect();
    let returns: Vec<&&CallEvent> = mine
        .iter()
        .filter(|e| e.kind == CallKind::Return as u32)
        .collect();
    assert_eq!(entries.len() as u64, N, "entry events");
    assert_eq!(returns.len() as u64, N, "return events");

    let me = std::process::id();
    let mut last_ts = 0;
    for (i, pair) in mine.chunks(2).enumerate() {
        let (entry, ret) = (pair[0], pair[1]);
        assert_eq!(entry.kind, CallKind::Entry as u32, "call {i}: entry first");
        assert_eq!(ret.kind, CallKind::Return as u32, "call {i}: then return");
        assert_eq!(entry.pid, me);
        let i = i as u64;
        assert_eq!(
            &entry.args[..3],
            &[i, i * 2, 0xdead_beef],
            "call {i}: arguments"
        );
        assert_eq!(ret.ret, expected_ret[i as usize], "call {i}: return value");
        assert!(entry.ts_ns > last_ts, "call {i}: timestamps increase");
        assert!(ret.ts_ns > entry.ts_ns, "call {i}: return after entry");
        last_ts = ret.ts_ns;
    }
}

#[test]
fn unfollowed_process_is_filtered_in_kernel() {
    if !root_or_skip("unfollowed_process_is_filtered_in_kernel") {
        return;
    }
    let exe: PathBuf = std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe");
    let mut probes = Probes::load().expect("load eBPF object");
    probes
        .attach(&exe, "slowrank_selftest_target")
        .expect("attach to own function");
    // Not followed: hits are counted, never shipped.
    for i in 0..100 {
        slowrank_selftest_target(i, 0, 0);
    }
    let mut events = Vec::new();
    std::thread::sleep(Duration::from_millis(20));
    probes.drain(&mut events);
    assert!(
        events.is_empty(),
        "unfollowed calls leaked: {}",
        events.len()
    );
    let c = probes.counters().expect("counters");
    // Both tests probe the same function in one process; each object only
    // counts its own programs' hits: 100 entries + 100 returns at least.
    assert!(
        c.unfollowed_hits >= 200,
        "unfollowed hits {}",
        c.unfollowed_hits
    );
}

/// A stand-in for `ncclCommInitRank`: writes the "communicator" it makes
/// through its first argument.
#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_selftest_create(out: &mut u64, tag: u64) -> i32 {
    *out = std::hint::black_box(tag ^ 0x5eed);
    0
}

/// A communicator created before the agent follows its process (the agent
/// found two of a host's four ranks 0.85 s late beside a CPU hog, after
/// their init, and they went unnamed for the whole run): the creation's
/// entry and return still reach the agent, which holds them until it
/// follows the process. Other calls of an unfollowed process stay filtered
/// (`unfollowed_process_is_filtered_in_kernel`).
#[test]
fn a_communicator_created_before_its_process_is_followed_still_arrives() {
    if !root_or_skip("a_communicator_created_before_its_process_is_followed_still_arrives") {
        return;
    }
    use slowrank_agent::probes::Attach;
    let exe: PathBuf = std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe");
    let mut probes = Probes::load().expect("load eBPF object");
    let id = probes
        .attach_as(
            &exe,
            "slowrank_selftest_create",
            Attach::CallOut {
                out_arg: 0,
                stack: false,
            },
        )
        .expect("attach to own function");
    let mut comm = 0u64;
    assert_eq!(slowrank_selftest_create(&mut comm, 41), 0);
    let mut events: Vec<CallEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while events.iter().filter(|e| e.probe == id).count() < 2 && Instant::now() < deadline {
        if probes.drain(&mut events).0 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let ours: Vec<&CallEvent> = events
        .iter()
        .filter(|e| e.probe == id && e.pid == std::process::id())
        .filter(|e| CallKind::from_raw(e.kind) != Some(CallKind::Snapshot))
        .collect();
    let kinds: Vec<Option<CallKind>> = ours.iter().map(|e| CallKind::from_raw(e.kind)).collect();
    assert_eq!(
        kinds,
        vec![Some(CallKind::Entry), Some(CallKind::Return)],
        "the creation's entry and return, unfollowed"
    );
    assert_eq!(
        ours[1].args[0], comm,
        "the communicator behind the out-pointer"
    );
}

/// A stand-in for `ibv_modify_qp(qp, attr, mask)`: `struct ibv_qp` has its
/// `qp_num` at byte 52, `struct ibv_qp_attr` its `dest_qp_num` at 28.
#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_selftest_modify_qp(qp: *const u8, attr: *const u8, mask: u64) -> i32 {
    std::hint::black_box((qp, attr, mask));
    0
}

/// The QP bring-up of a rank found late arrives too (the fold's limbo
/// replays it once the rank is followed): without it, a rank the agent's
/// scan found after its communicator init had links with no destination.
#[test]
fn a_qp_brought_up_before_its_process_is_followed_still_arrives() {
    if !root_or_skip("a_qp_brought_up_before_its_process_is_followed_still_arrives") {
        return;
    }
    use slowrank_agent::probes::Attach;
    let exe: PathBuf = std::fs::read_link("/proc/self/exe").expect("read /proc/self/exe");
    let mut probes = Probes::load().expect("load eBPF object");
    let id = probes
        .attach_as(&exe, "slowrank_selftest_modify_qp", Attach::VerbsModifyQp)
        .expect("attach to own function");
    let mut qp = [0u8; 64];
    qp[52..56].copy_from_slice(&4242u32.to_ne_bytes());
    let mut attr = [0u8; 64];
    attr[28..32].copy_from_slice(&777u32.to_ne_bytes());
    assert_eq!(
        slowrank_selftest_modify_qp(qp.as_ptr(), attr.as_ptr(), 0x1ff),
        0
    );
    let mut events: Vec<CallEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !events.iter().any(|e| e.probe == id) && Instant::now() < deadline {
        if probes.drain(&mut events).0 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let ours: Vec<&CallEvent> = events
        .iter()
        .filter(|e| e.probe == id && e.pid == std::process::id())
        .collect();
    assert_eq!(ours.len(), 1, "one entry, unfollowed");
    assert_eq!(CallKind::from_raw(ours[0].kind), Some(CallKind::Entry));
    assert_eq!(ours[0].args[1], 4242, "qp_num read from the QP");
    assert_eq!(ours[0].args[2], 0x1ff, "the attribute mask");
    assert_eq!(ours[0].args[3], 777, "the destination QP");
}

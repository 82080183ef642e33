//! Clocks. All rank processes share one kernel, so `CLOCK_MONOTONIC` is one
//! timeline for the whole simulated cluster; simulated hosts' clock offsets
//! are applied only to what agents see (a test-only agent setting).

use std::time::Duration;

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_MONOTONIC` in ns, the same clock BPF's `bpf_ktime_get_ns` reads.
pub fn mono_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Wall clock (`CLOCK_REALTIME`) in ns since the Unix epoch.
pub fn wall_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// Sleeps until `deadline` (monotonic ns); returns at once if it passed.
pub fn sleep_until(deadline: u64) {
    let now = mono_ns();
    if deadline > now {
        std::thread::sleep(Duration::from_nanos(deadline - now));
    }
}

/// Makes this thread's sleeps precise to ~1 µs instead of the default 50 µs
/// timer slack, for threads that model GPU or NIC timing.
pub fn precise_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64) };
}

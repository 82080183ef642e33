//! The agent host's clocks. BPF timestamps are CLOCK_MONOTONIC; batches also
//! carry the wall clock so the coordinator can map each host to one clock.

/// CLOCK_MONOTONIC in ns, the clock `bpf_ktime_get_ns` uses.
pub fn mono_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in ns since the Unix epoch.
pub fn wall_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This host's name (`/proc/sys/kernel/hostname`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned())
}

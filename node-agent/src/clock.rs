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
    slowrank_shared::clock_udp::clock_ns(clock)
}

/// This host's name (`/proc/sys/kernel/hostname`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned())
}

/// The clock this agent reports in: the host's CLOCK_MONOTONIC, optionally
/// skewed. Real agents use [`HostClock::real`]; scenarios run every simulated
/// host on one machine, so each agent gets the injected offset and drift of
/// the host it stands for, applied to *every* time it reports (event
/// timestamps and clock-probe answers alike) — exactly what a different
/// physical clock would look like to the coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostClock {
    /// Added to every reported time (ns).
    pub offset_ns: i64,
    /// Rate error in parts per million, relative to the agent's start.
    pub drift_ppm: f64,
    /// Raw monotonic ns the drift is measured from.
    pub epoch_ns: u64,
}

impl HostClock {
    /// The host's own clock, unmodified.
    pub fn real() -> Self {
        Self::default()
    }

    /// A skewed clock for simulated hosts.
    pub fn simulated(offset_ns: i64, drift_ppm: f64) -> Self {
        Self {
            offset_ns,
            drift_ppm,
            epoch_ns: mono_ns(),
        }
    }

    /// Maps a raw CLOCK_MONOTONIC reading (e.g. a BPF timestamp) to reported ns.
    pub fn map(&self, raw_mono_ns: u64) -> u64 {
        if self.offset_ns == 0 && self.drift_ppm == 0.0 {
            return raw_mono_ns;
        }
        let since = raw_mono_ns as i128 - self.epoch_ns as i128;
        let drift = (since as f64 * self.drift_ppm * 1e-6) as i128;
        (raw_mono_ns as i128 + self.offset_ns as i128 + drift).max(0) as u64
    }

    /// The raw CLOCK_MONOTONIC reading [`map`](Self::map) took to
    /// `reported_ns` (within a few ns: two fixed-point steps on the drift).
    pub fn unmap(&self, reported_ns: u64) -> u64 {
        if self.offset_ns == 0 && self.drift_ppm == 0.0 {
            return reported_ns;
        }
        let shifted = reported_ns as i128 - self.offset_ns as i128;
        let drift =
            |raw: i128| ((raw - self.epoch_ns as i128) as f64 * self.drift_ppm * 1e-6) as i128;
        let raw = shifted - drift(shifted);
        (shifted - drift(raw)).max(0) as u64
    }

    /// Now, on this clock.
    pub fn now(&self) -> u64 {
        self.map(mono_ns())
    }
}

#[cfg(test)]
mod tests {
    use super::HostClock;

    #[test]
    fn unmap_inverts_map() {
        let c = HostClock {
            offset_ns: -2_500_000,
            drift_ppm: 30.0,
            epoch_ns: 1_000_000_000,
        };
        for raw in [1_000_000_000u64, 5_000_000_000, 3_600_000_000_000] {
            let back = c.unmap(c.map(raw));
            assert!(back.abs_diff(raw) <= 2, "{raw} -> {back}");
        }
        assert_eq!(HostClock::real().unmap(42), 42);
    }

    #[test]
    fn real_clock_is_identity_and_simulated_applies_offset_and_drift() {
        assert_eq!(HostClock::real().map(12_345), 12_345);
        let c = HostClock {
            offset_ns: 2_500_000,
            drift_ppm: 30.0,
            epoch_ns: 1_000_000_000,
        };
        // 1 s after the epoch: +2.5 ms offset, +30 µs drift.
        assert_eq!(c.map(2_000_000_000), 2_000_000_000 + 2_500_000 + 30_000);
        assert_eq!(c.map(1_000_000_000), 1_000_000_000 + 2_500_000);
    }
}

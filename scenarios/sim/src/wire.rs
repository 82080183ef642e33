//! The physical replica of each simulated NIC's port, shared by the launcher
//! (which shapes it with `tc`) and the `libmlx5.so.1` stand-in (which
//! measures it).
//!
//! When hosts are network namespaces and a scenario has `communication`
//! faults, every rank's NIC port gets a small real twin on its host's veth:
//! an htb class of [`PORT_RATE_BPS`] that carries only the datagrams sent
//! from that rank's [`source_port`]. A communication fault changes the
//! class's rate (`tc class change`), never a model knob. The NIC's port
//! monitor sends a burst of [`BURST_PACKETS`] datagrams every [`PERIOD`] to
//! the launcher's echo sink, which answers the last one with the burst's
//! *pace*: the median gap between the kernel's receive timestamps of its
//! datagrams, i.e. how far apart htb let them go ([`pace`]). The monitor
//! turns it into the fraction of nominal bandwidth the port really has
//! ([`factor`]), which the NIC and the cost model then apply to the
//! simulated traffic. The replica is scaled down (50 Mbit/s instead of the
//! model's 25 GB/s) so that a burst costs almost nothing (3.2 ms), yet has
//! 14 gaps of 231 µs to time.
//!
//! Kernel timestamps, not the time to the echo, because on a busy machine
//! (2 cores, a dozen rank threads) the two thread wake-ups of an echo add
//! 0.1–1.5 ms at random. The median gap, not the burst's whole spread,
//! because the kernel is late too: htb's dequeues run from the `NET_TX`
//! softirq, which a busy machine defers to `ksoftirqd`, a plain thread
//! that waits for a CPU like the ranks do. htb's bucket holds one datagram,
//! so the shaping time a late dequeue loses is not made up, and the spread
//! of a healthy burst grew by the whole stall: with four busy loops on the
//! two cores, 10 of 150 healthy bursts read below 0.9 by their spread,
//! 0.07 the worst, and two in a row failed a CI run's healthy-port check.
//! A stall stretches one gap (the next datagram leaves at once), so the
//! median of 14 gaps keeps the pace: 1 of the same 150 bursts read below
//! 0.9 by it. A sender preempted mid-burst stretches one gap the same way.
//!
//! Datagram layout: byte 0 is [`LAST`] on the burst's last datagram (the
//! only one answered) and 0 otherwise, bytes 1..9 the burst's sequence
//! number (little endian). The echo is the sequence number and the pace
//! in ns (8 bytes each, little endian; 0: too few datagrams arrived to
//! tell), so that the echo of a burst that timed out is recognised and
//! dropped.

use std::time::Duration;

/// Rate of one port's replica (bit/s) at full health.
pub const PORT_RATE_BPS: u64 = 50_000_000;
/// Port monitor of local rank `L` sends from UDP port `SOURCE_PORT_BASE + L`
/// (the `tc` filter of its class matches it).
pub const SOURCE_PORT_BASE: u16 = 47_000;
/// UDP payload of one datagram of a burst.
pub const PACKET_BYTES: usize = 1400;
/// Bytes htb counts per datagram on the veth: payload, UDP (8), IPv4 (20)
/// and Ethernet (14) headers.
pub const WIRE_BYTES: usize = PACKET_BYTES + 8 + 20 + 14;
/// Datagrams per burst.
pub const BURST_PACKETS: usize = 16;
/// Pause between two bursts (also lets the class's bucket refill). 50 ms:
/// with 16 ranks on 2 cores, 20 ms (13,000 datagrams/s into one sink)
/// overflowed the sink's socket and lost echoes.
pub const PERIOD: Duration = Duration::from_millis(50);
/// A burst whose echo takes longer is no measurement (a lost datagram or a
/// starved sink is not a slow port).
pub const ECHO_TIMEOUT: Duration = Duration::from_millis(500);
/// Measured fractions at or above this are taken as 1.0: the measurement
/// noise floor. A healthy burst's pace varies by about 2 % (227–235 µs for
/// 231 µs), more when the machine is busy, so smaller differences are
/// noise, not a slow port.
pub const DEADBAND: f64 = 0.9;
/// The htb bucket (and ceil bucket) of a port class, bytes: about one
/// datagram, so the first datagram of a burst leaves at once and the rest
/// at the class's rate.
pub const BUCKET_BYTES: u32 = 1600;
/// First byte of a burst's last datagram.
pub const LAST: u8 = 1;

/// UDP source port of the port monitor of local rank `local`.
pub fn source_port(local: u32) -> u16 {
    SOURCE_PORT_BASE + local as u16
}

/// Minor number of local rank `local`'s htb class (`1:minor`; `tc` reads
/// class minors as hex, so local 0 is `1:10`, local 1 `1:11`, ...). Minor 1
/// is the unshaped default class.
pub fn class_minor(local: u32) -> u32 {
    0x10 + local
}

/// The `tc` class id of local rank `local`'s port, e.g. `1:11`.
pub fn class_id(local: u32) -> String {
    format!("1:{:x}", class_minor(local))
}

/// Rate (bit/s) of a port class with `bw` of nominal bandwidth left;
/// at least 8 kbit/s (htb needs a positive rate; below that a burst times
/// out anyway).
pub fn class_rate_bps(bw: f64) -> u64 {
    ((PORT_RATE_BPS as f64 * bw.clamp(0.0, 1.0)).round() as u64).max(8_000)
}

/// The pace of a healthy port: the time htb takes to let one datagram go at
/// [`PORT_RATE_BPS`] (230.7 µs), and 1/`bw` times that at `bw` of the rate.
pub fn ideal_pace() -> Duration {
    Duration::from_secs_f64((WIRE_BYTES * 8) as f64 / PORT_RATE_BPS as f64)
}

/// Fewest datagrams of a burst the sink times: fewer (the rest lost) is
/// no measurement.
pub const MIN_TIMED: usize = BURST_PACKETS / 2;

/// The pace of a burst whose datagrams arrived at `stamps_ns` (kernel
/// receive times, in order): the median gap between them, leaving out the
/// first gap, which htb's full bucket shortens. `None` with fewer than
/// [`MIN_TIMED`] datagrams.
pub fn pace(stamps_ns: &[u64]) -> Option<Duration> {
    if stamps_ns.len() < MIN_TIMED {
        return None;
    }
    let mut gaps: Vec<u64> = stamps_ns[1..]
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    gaps.sort_unstable();
    Some(Duration::from_nanos(gaps[gaps.len() / 2]))
}

/// Fraction of nominal bandwidth a burst with `pace` shows, at most 1.
pub fn factor(pace: Duration) -> f64 {
    let s = pace.as_secs_f64();
    if s <= 0.0 {
        return 1.0;
    }
    (ideal_pace().as_secs_f64() / s).min(1.0)
}

/// Fills `buf` (at least 9 bytes) as datagram of burst `seq`.
pub fn encode(buf: &mut [u8], seq: u64, last: bool) {
    buf[0] = if last { LAST } else { 0 };
    buf[1..9].copy_from_slice(&seq.to_le_bytes());
}

/// (burst sequence number, whether it is the burst's last datagram).
pub fn decode(datagram: &[u8]) -> Option<(u64, bool)> {
    let seq = u64::from_le_bytes(datagram.get(1..9)?.try_into().ok()?);
    Some((seq, datagram[0] == LAST))
}

/// The answer to burst `seq` with `pace` ([`pace`]; `None`: too few of its
/// datagrams arrived).
pub fn encode_echo(seq: u64, pace: Option<Duration>) -> [u8; 16] {
    let ns = pace.map_or(0, |p| (p.as_nanos() as u64).max(1));
    let mut e = [0u8; 16];
    e[..8].copy_from_slice(&seq.to_le_bytes());
    e[8..].copy_from_slice(&ns.to_le_bytes());
    e
}

/// (sequence number, pace) of an echo; the pace is `None` when the sink
/// could not time the burst.
pub fn decode_echo(echo: &[u8]) -> Option<(u64, Option<Duration>)> {
    let seq = u64::from_le_bytes(echo.get(..8)?.try_into().ok()?);
    let ns = u64::from_le_bytes(echo.get(8..16)?.try_into().ok()?);
    Some((seq, (ns > 0).then(|| Duration::from_nanos(ns))))
}

/// Turns raw measurements into the factor the NIC applies: the larger of
/// the last two (a single noisy burst cannot slow the NIC; a real change
/// shows after two bursts), snapped to 1.0 at or above [`DEADBAND`].
#[derive(Debug, Clone)]
pub struct Smoother {
    last: [f64; 2],
}

impl Default for Smoother {
    /// A port starts healthy.
    fn default() -> Self {
        Self { last: [1.0, 1.0] }
    }
}

impl Smoother {
    /// Adds one measurement; returns the factor to apply now.
    pub fn push(&mut self, measured: f64) -> f64 {
        self.last = [self.last[1], measured.clamp(0.0, 1.0)];
        let f = self.last[0].max(self.last[1]);
        if f >= DEADBAND {
            1.0
        } else {
            f
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_match_htb() {
        // Gaps measured through htb at 50 Mbit/s: 227–235 µs.
        let us = ideal_pace().as_secs_f64() * 1e6;
        assert!((us - 230.72).abs() < 0.01, "{us}");
        assert_eq!(factor(ideal_pace()), 1.0);
        assert_eq!(factor(Duration::ZERO), 1.0);
        assert!(factor(Duration::from_micros(235)) > 0.98);
        let tenth = factor(Duration::from_nanos(2_307_200));
        assert!((tenth - 0.1).abs() < 0.001, "{tenth}");
    }

    #[test]
    fn a_stalled_dequeue_does_not_change_the_pace() {
        // A healthy burst seen through htb on a busy VM (first gap 190 µs,
        // then in µs): a 1.9 ms stall, then the next datagrams at once.
        let burst = |gaps: &[u64]| {
            let mut t = vec![0, 190_000];
            for g in gaps {
                t.push(t.last().unwrap() + g * 1000);
            }
            t
        };
        let stalled = burst(&[
            198, 1935, 13, 0, 225, 230, 222, 228, 236, 228, 223, 234, 229, 225,
        ]);
        assert_eq!(stalled.len(), BURST_PACKETS);
        let p = pace(&stalled).unwrap();
        assert!(factor(p) > 0.98, "{p:?}");
        // Its whole spread would have read 0.72 of nominal.
        let spread = Duration::from_nanos(stalled[15] - stalled[0]);
        assert!(spread > Duration::from_millis(4), "{spread:?}");
        // A slow port's gaps are all long.
        let slow = burst(&[2310; 14]);
        assert!((factor(pace(&slow).unwrap()) - 0.1).abs() < 0.001);
        // Too few datagrams: no measurement.
        assert_eq!(pace(&slow[..MIN_TIMED - 1]), None);
        assert!(pace(&slow[..MIN_TIMED]).is_some());
    }

    #[test]
    fn classes_and_rates() {
        assert_eq!(class_id(0), "1:10");
        assert_eq!(class_id(1), "1:11");
        assert_eq!(class_id(31), "1:2f");
        assert_eq!(source_port(3), 47_003);
        assert_eq!(class_rate_bps(1.0), 50_000_000);
        assert_eq!(class_rate_bps(0.1), 5_000_000);
        assert_eq!(class_rate_bps(1e-9), 8_000);
    }

    #[test]
    fn datagrams_round_trip() {
        let mut buf = [0u8; PACKET_BYTES];
        encode(&mut buf, 42, false);
        assert_eq!(decode(&buf), Some((42, false)));
        encode(&mut buf, 43, true);
        assert_eq!(decode(&buf), Some((43, true)));
        assert_eq!(decode(&[LAST, 1, 2]), None);
        let p = Some(Duration::from_nanos(230_720));
        assert_eq!(decode_echo(&encode_echo(43, p)), Some((43, p)));
        assert_eq!(decode_echo(&encode_echo(44, None)), Some((44, None)));
        assert_eq!(decode_echo(&[1, 2]), None);
    }

    #[test]
    fn one_noisy_burst_does_not_slow_the_port() {
        let mut s = Smoother::default();
        assert_eq!(s.push(0.95), 1.0);
        assert_eq!(s.push(0.3), 1.0);
        assert_eq!(s.push(0.95), 1.0);
        // A real change shows on the second burst.
        assert_eq!(s.push(0.1), 1.0);
        assert_eq!(s.push(0.11), 0.11);
        assert_eq!(s.push(0.09), 0.11);
        // Recovery shows at once.
        assert_eq!(s.push(0.97), 1.0);
        assert_eq!(s.push(0.5), 1.0);
        assert_eq!(s.push(0.5), 0.5);
        assert_eq!(s.push(0.89), 0.89);
    }
}

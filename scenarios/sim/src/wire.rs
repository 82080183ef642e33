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
//! the launcher's echo sink, which answers the last one with the *spread*
//! of the burst: the time between the kernel's receive timestamps of its
//! first and last datagram, i.e. how long htb took to let the burst
//! through. The monitor turns it into the fraction of nominal bandwidth the
//! port really has ([`factor`]), which the NIC and the cost model then apply
//! to the simulated traffic. The replica is scaled down (50 Mbit/s instead
//! of the model's 25 GB/s) so that a burst costs almost nothing, yet is long
//! enough (3.2 ms) to be timed precisely.
//!
//! Kernel timestamps, not the time to the echo, because on a busy machine
//! (2 cores, a dozen rank threads) the two thread wake-ups of an echo add
//! 0.1–1.5 ms at random, enough to read a healthy port as 0.7; the spread
//! of the receive timestamps stays within 1 % of the shaping time. What
//! remains is the sender: a monitor preempted while it hands its burst to
//! the kernel stretches the spread by at most the time it took, which it
//! subtracts.
//!
//! Datagram layout: byte 0 is [`LAST`] on the burst's last datagram (the
//! only one answered) and 0 otherwise, bytes 1..9 the burst's sequence
//! number (little endian). The echo is the sequence number and the spread
//! in ns (8 bytes each, little endian), so that the echo of a burst that
//! timed out is recognised and dropped.

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
/// starved sink is not a slow port); fractions below [`timeout_factor`]
/// cannot be measured.
pub const ECHO_TIMEOUT: Duration = Duration::from_millis(500);
/// Measured fractions at or above this are taken as 1.0: the measurement
/// noise floor. A healthy burst's spread varies by about 1 % (3.21–3.23 ms
/// for 3.205 ms), more when the machine is busy or the sender was
/// preempted, so smaller differences are noise, not a slow port.
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

/// The spread of a burst on a healthy port: how long after its first
/// datagram htb lets its last one go. A class sends while its tokens are
/// not negative, so the full bucket lets the first datagram go at once and
/// what is left of it the second: the last one leaves after
/// `(BURST_PACKETS - 1) * WIRE_BYTES - BUCKET_BYTES` bytes' worth of rate,
/// 3.205 ms at 50 Mbit/s (measured: 3.21–3.23 ms), and 1/`bw` times that at
/// `bw` of the rate.
pub fn ideal_spread() -> Duration {
    let bits = (((BURST_PACKETS - 1) * WIRE_BYTES) as f64 - f64::from(BUCKET_BYTES)) * 8.0;
    Duration::from_secs_f64(bits / PORT_RATE_BPS as f64)
}

/// Fraction of nominal bandwidth a burst with `spread` shows, at most 1.
pub fn factor(spread: Duration) -> f64 {
    let s = spread.as_secs_f64();
    if s <= 0.0 {
        return 1.0;
    }
    (ideal_spread().as_secs_f64() / s).min(1.0)
}

/// The smallest fraction the monitor can tell: a burst spread over
/// [`ECHO_TIMEOUT`].
pub fn timeout_factor() -> f64 {
    factor(ECHO_TIMEOUT)
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

/// The answer to burst `seq` whose datagrams arrived `spread_ns` apart.
pub fn encode_echo(seq: u64, spread_ns: u64) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[..8].copy_from_slice(&seq.to_le_bytes());
    e[8..].copy_from_slice(&spread_ns.to_le_bytes());
    e
}

/// (sequence number, spread ns) of an echo.
pub fn decode_echo(echo: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(echo.get(..8)?.try_into().ok()?);
    let spread = u64::from_le_bytes(echo.get(8..16)?.try_into().ok()?);
    Some((seq, spread))
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
        // Spreads measured through htb at 50 and 5 Mbit/s.
        let us = ideal_spread().as_secs_f64() * 1e6;
        assert!((us - 3204.8).abs() < 1.0, "{us}");
        assert_eq!(factor(ideal_spread()), 1.0);
        assert_eq!(factor(Duration::ZERO), 1.0);
        assert!(factor(Duration::from_micros(3233)) > 0.99);
        let tenth = factor(Duration::from_micros(32_060));
        assert!((tenth - 0.1).abs() < 0.001, "{tenth}");
        assert!(timeout_factor() < 0.01);
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
        assert_eq!(
            decode_echo(&encode_echo(43, 3_205_000)),
            Some((43, 3_205_000))
        );
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

//! How long the agent waits between two drains of a ring buffer.
//!
//! The probes submit their records without waking anyone (a wakeup per
//! record would cost the probed thread more than the record), so the agent
//! polls its rings. A fixed short period (5 ms for the event ring, 2 ms for
//! the stack ring) woke the agent about 3,000 times a second on a healthy
//! host that writes a few hundred records a second, each wakeup a context
//! switch on the cores the ranks run on. The wait follows the traffic
//! instead: a drain that found a good part of its ring (≥ 1/16 of it) goes
//! back to the shortest wait at once, so a burst never fills the ring; a
//! drain that found little (< 1/64 of it) doubles the wait, up to the
//! longest, which is short enough for the ring to absorb what a busy rank
//! writes meanwhile (the longest wait × the rate the shortest one keeps up
//! with stays under 1/16 of the ring).
//!
//! Pure: the caller says how many bytes a drain read and sleeps what it is
//! told.

use std::time::Duration;

/// A drain that read at least this share of its ring returns to the
/// shortest wait.
const BUSY_SHARE: usize = 16;
/// A drain that read less than this share of its ring doubles the wait.
const IDLE_SHARE: usize = 64;

/// The wait rule of one ring.
#[derive(Debug, Clone)]
pub struct Cadence {
    shortest: Duration,
    longest: Duration,
    ring_bytes: usize,
    wait: Duration,
}

impl Cadence {
    /// A ring of `ring_bytes`, drained between `shortest` and `longest`
    /// apart; it starts at the shortest (a job is starting).
    pub fn new(shortest: Duration, longest: Duration, ring_bytes: usize) -> Self {
        let longest = longest.max(shortest);
        Self {
            shortest,
            longest,
            ring_bytes: ring_bytes.max(1),
            wait: shortest,
        }
    }

    /// The wait before the next drain, after one that read `bytes`.
    pub fn after_drain(&mut self, bytes: usize) -> Duration {
        if bytes.saturating_mul(BUSY_SHARE) >= self.ring_bytes {
            self.wait = self.shortest;
        } else if bytes.saturating_mul(IDLE_SHARE) < self.ring_bytes {
            self.wait = (self.wait * 2).min(self.longest);
        }
        self.wait
    }

    /// The current wait (for the log).
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_idle_ring_is_drained_ever_less_often_up_to_the_longest_wait() {
        let mut c = Cadence::new(5 * MS, 40 * MS, 1 << 20);
        let waits: Vec<Duration> = (0..6).map(|_| c.after_drain(0)).collect();
        assert_eq!(
            waits,
            [10 * MS, 20 * MS, 40 * MS, 40 * MS, 40 * MS, 40 * MS]
        );
    }

    #[test]
    fn a_busy_drain_goes_back_to_the_shortest_wait_at_once() {
        let mut c = Cadence::new(5 * MS, 40 * MS, 1 << 20);
        for _ in 0..5 {
            c.after_drain(0);
        }
        assert_eq!(c.wait(), 40 * MS);
        assert_eq!(c.after_drain((1 << 20) / 16), 5 * MS);
    }

    #[test]
    fn a_middling_drain_keeps_the_wait() {
        let mut c = Cadence::new(5 * MS, 40 * MS, 1 << 20);
        c.after_drain(0);
        assert_eq!(c.wait(), 10 * MS);
        // Between 1/64 and 1/16 of the ring: neither idle nor busy.
        assert_eq!(c.after_drain((1 << 20) / 32), 10 * MS);
    }

    #[test]
    fn the_longest_wait_is_never_below_the_shortest() {
        let mut c = Cadence::new(10 * MS, 2 * MS, 4096);
        assert_eq!(c.after_drain(0), 10 * MS);
        assert_eq!(c.after_drain(4096), 10 * MS);
    }
}

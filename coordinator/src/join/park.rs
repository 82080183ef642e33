//! Records that arrive before their communicator's membership is known.
//!
//! Members of one communicator live on several hosts, and each host's agent
//! announces only its own members. After a coordinator restart (or any
//! reconnection race) host A's resent collectives can reach the join before
//! host B's preamble has declared B's members: the record is valid, only
//! early. Such a record is parked here, keyed by its communicator, and
//! offered again when a membership record for that communicator arrives.
//! Only a record still unclaimed after [`PARK_TIMEOUT_NS`] counts as lost
//! (`expired`), and a record that does not fit under the byte bound is
//! refused at once (`overflow`); both are counted by the caller.
//!
//! Pure: no clock, no IO; `now` is passed in (coordinator ns).

use std::collections::{BTreeMap, VecDeque};

/// How long a record may wait for its membership. An agent reconnects at
/// most 5 s after the coordinator is back (its backoff cap) and replays its
/// preamble first; 60 s covers that plus a loaded coordinator catching up
/// on a backlog of several agents, and is still short enough that a record
/// of a communicator nobody will ever announce does not sit for long.
pub const PARK_TIMEOUT_NS: u64 = 60_000_000_000;

/// Bytes of parked records held at most (all communicators together). A
/// 4,096-rank job resends ≈ 40 MB/s after a restart; 64 MiB holds more than
/// a second of it, which is the window between two hosts' preambles.
pub const PARK_MAX_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkConfig {
    pub timeout_ns: u64,
    pub max_bytes: usize,
}

impl Default for ParkConfig {
    fn default() -> Self {
        Self {
            timeout_ns: PARK_TIMEOUT_NS,
            max_bytes: PARK_MAX_BYTES,
        }
    }
}

/// Why a record could not be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParkError {
    #[error("parking full ({max_bytes} bytes held)")]
    Full { max_bytes: usize },
}

/// Counters, for `/metrics` and `report.json`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParkCounters {
    /// Records parked (a record parked again after a release counts once).
    pub parked: u64,
    /// Parked records handed back because their membership arrived.
    pub released: u64,
    /// Lost: unclaimed after the timeout.
    pub expired: u64,
    /// Lost: refused because the parking was full.
    pub overflow: u64,
    /// Held now (records, bytes).
    pub held: u64,
    pub held_bytes: u64,
}

#[derive(Debug)]
struct Parked<T> {
    /// First parked at (kept across re-parking, so a record cannot wait
    /// longer than the timeout by bouncing).
    since: u64,
    bytes: usize,
    item: T,
}

/// The parking lot, by communicator id. Order within a communicator is
/// arrival order, so a rank's records are offered again in the order it
/// issued them.
#[derive(Debug)]
pub struct Parking<T> {
    cfg: ParkConfig,
    by_comm: BTreeMap<u64, VecDeque<Parked<T>>>,
    bytes: usize,
    counters: ParkCounters,
}

impl<T> Parking<T> {
    pub fn new(cfg: ParkConfig) -> Self {
        Self {
            cfg,
            by_comm: BTreeMap::new(),
            bytes: 0,
            counters: ParkCounters::default(),
        }
    }

    /// Parks `item` (of about `bytes` bytes) for communicator `comm_id`.
    /// `since`: when it was first parked (`now` for a new record, the
    /// value [`Parking::release`] returned for one parked again).
    pub fn park(
        &mut self,
        comm_id: u64,
        item: T,
        bytes: usize,
        since: u64,
    ) -> Result<(), ParkError> {
        if self.bytes + bytes > self.cfg.max_bytes {
            self.counters.overflow += 1;
            return Err(ParkError::Full {
                max_bytes: self.cfg.max_bytes,
            });
        }
        self.bytes += bytes;
        self.counters.parked += 1;
        self.by_comm
            .entry(comm_id)
            .or_default()
            .push_back(Parked { since, bytes, item });
        Ok(())
    }

    /// Whether anything waits for `comm_id`.
    pub fn waits_for(&self, comm_id: u64) -> bool {
        self.by_comm.contains_key(&comm_id)
    }

    /// Hands back every record parked for `comm_id` (membership for it
    /// arrived), oldest first, each with the time it was first parked: one
    /// that still does not fit goes back with [`Parking::repark`].
    pub fn release(&mut self, comm_id: u64) -> Vec<(T, u64)> {
        let Some(q) = self.by_comm.remove(&comm_id) else {
            return Vec::new();
        };
        self.counters.released += q.len() as u64;
        q.into_iter()
            .map(|p| {
                self.bytes -= p.bytes;
                (p.item, p.since)
            })
            .collect()
    }

    /// Parks again a record [`Parking::release`] handed back that is still
    /// unclaimed (its communicator is known, its member is not yet): it
    /// keeps its first time and counts as parked once, not released.
    pub fn repark(
        &mut self,
        comm_id: u64,
        item: T,
        bytes: usize,
        since: u64,
    ) -> Result<(), ParkError> {
        self.counters.released = self.counters.released.saturating_sub(1);
        self.counters.parked = self.counters.parked.saturating_sub(1);
        self.park(comm_id, item, bytes, since)
    }

    /// Removes and returns the records parked longer than the timeout.
    pub fn expire(&mut self, now: u64) -> Vec<T> {
        let timeout = self.cfg.timeout_ns;
        let mut out = Vec::new();
        self.by_comm.retain(|_, q| {
            // Not necessarily sorted (re-parked records keep their age), so
            // look at every one; the queues are short-lived.
            let mut keep = VecDeque::with_capacity(q.len());
            for p in q.drain(..) {
                if now.saturating_sub(p.since) > timeout {
                    out.push(p);
                } else {
                    keep.push_back(p);
                }
            }
            *q = keep;
            !q.is_empty()
        });
        for p in &out {
            self.bytes -= p.bytes;
        }
        self.counters.expired += out.len() as u64;
        out.into_iter().map(|p| p.item).collect()
    }

    pub fn counters(&self) -> ParkCounters {
        ParkCounters {
            held: self.by_comm.values().map(|q| q.len() as u64).sum(),
            held_bytes: self.bytes as u64,
            ..self.counters
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lot(max_bytes: usize) -> Parking<&'static str> {
        Parking::new(ParkConfig {
            timeout_ns: 100,
            max_bytes,
        })
    }

    #[test]
    fn released_in_arrival_order_when_membership_arrives() {
        let mut p = lot(1000);
        p.park(7, "a", 10, 0).unwrap();
        p.park(8, "x", 10, 0).unwrap();
        p.park(7, "b", 10, 5).unwrap();
        assert!(p.waits_for(7));
        assert_eq!(p.release(7), vec![("a", 0), ("b", 5)]);
        assert!(!p.waits_for(7));
        assert!(p.release(7).is_empty());
        let c = p.counters();
        assert_eq!((c.parked, c.released, c.held, c.held_bytes), (3, 2, 1, 10));
    }

    #[test]
    fn reparked_record_keeps_its_age_and_counts_once() {
        let mut p = lot(1000);
        p.park(7, "a", 10, 0).unwrap();
        let (item, since) = p.release(7).pop().unwrap();
        // Still no member for it: parked again with its first time.
        p.repark(7, item, 10, since).unwrap();
        let c = p.counters();
        assert_eq!((c.parked, c.released), (1, 0));
        assert!(p.expire(90).is_empty());
        assert_eq!(p.expire(101), vec!["a"]);
        let c = p.counters();
        assert_eq!((c.expired, c.held, c.held_bytes), (1, 0, 0));
    }

    #[test]
    fn only_records_past_the_timeout_expire() {
        let mut p = lot(1000);
        p.park(1, "old", 10, 0).unwrap();
        p.park(1, "new", 10, 50).unwrap();
        assert_eq!(p.expire(120), vec!["old"]);
        assert_eq!(p.release(1), vec![("new", 50)]);
    }

    #[test]
    fn bounded_in_bytes() {
        let mut p = lot(25);
        p.park(1, "a", 10, 0).unwrap();
        p.park(2, "b", 10, 0).unwrap();
        assert_eq!(
            p.park(1, "c", 10, 0),
            Err(ParkError::Full { max_bytes: 25 })
        );
        assert_eq!(p.counters().overflow, 1);
        // Room again once released.
        p.release(1);
        p.park(1, "c", 10, 0).unwrap();
        assert_eq!(p.counters().held_bytes, 20);
    }
}

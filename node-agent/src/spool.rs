//! A bounded in-memory spool of encoded batches.
//!
//! While the coordinator is away, batches wait here and are resent in order on
//! reconnect. When the byte bound is hit the *oldest* batches are dropped and
//! counted: the loss is reported (in the next batch's `spool_drops`), never
//! silent.

use std::collections::VecDeque;

/// Names one spooled batch (increasing in push order).
pub type SpoolId = u64;

pub struct Spool {
    queue: VecDeque<(SpoolId, Vec<u8>)>,
    next_id: SpoolId,
    bytes: usize,
    max_bytes: usize,
    dropped: u64,
}

impl Spool {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            next_id: 0,
            bytes: 0,
            max_bytes,
            dropped: 0,
        }
    }

    /// Queues a batch, evicting the oldest ones if over the bound.
    pub fn push(&mut self, batch: Vec<u8>) -> SpoolId {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += batch.len();
        self.queue.push_back((id, batch));
        while self.bytes > self.max_bytes && self.queue.len() > 1 {
            if let Some((_, old)) = self.queue.pop_front() {
                self.bytes -= old.len();
                self.dropped += 1;
            }
        }
        id
    }

    pub fn front(&self) -> Option<&[u8]> {
        self.queue.front().map(|(_, b)| b.as_slice())
    }

    /// The oldest batch newer than `sent` (all of them from the front when
    /// `None`): the next one to send when `sent` is already on its way.
    pub fn next_after(&self, sent: Option<SpoolId>) -> Option<(SpoolId, &[u8])> {
        let i = match sent {
            None => 0,
            Some(s) => self.queue.partition_point(|(id, _)| *id <= s),
        };
        self.queue.get(i).map(|(id, b)| (*id, b.as_slice()))
    }

    /// Batch `id` was delivered: it and anything older still here go
    /// (deliveries are acknowledged in order).
    pub fn delivered(&mut self, id: SpoolId) {
        while self.queue.front().is_some_and(|(f, _)| *f <= id) {
            if let Some((_, b)) = self.queue.pop_front() {
                self.bytes -= b.len();
            }
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Batches discarded because the bound was hit.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::Spool;

    #[test]
    fn keeps_order_and_counts_evictions() {
        let mut s = Spool::new(25);
        let ids: Vec<_> = (0..5u8).map(|i| s.push(vec![i; 10])).collect();
        // 50 bytes pushed, bound 25: the three oldest went.
        assert_eq!(s.dropped(), 3);
        assert_eq!(s.len(), 2);
        assert_eq!(s.front().unwrap()[0], 3);
        s.delivered(ids[3]);
        assert_eq!(s.front().unwrap()[0], 4);
        s.delivered(ids[4]);
        assert!(s.is_empty());
    }

    #[test]
    fn sends_ahead_and_drops_only_what_was_delivered() {
        let mut s = Spool::new(1 << 20);
        let ids: Vec<_> = (0..4u8).map(|i| s.push(vec![i; 10])).collect();
        // Two in flight: the next to send is the third.
        assert_eq!(s.next_after(Some(ids[1])).unwrap().1[0], 2);
        assert_eq!(s.next_after(None).unwrap().0, ids[0]);
        s.delivered(ids[0]);
        assert_eq!(s.len(), 3);
        // The connection drops before the second is acknowledged: resending
        // starts from the front again.
        assert_eq!(s.next_after(None).unwrap().1[0], 1);
        s.delivered(ids[2]);
        assert_eq!(s.front().unwrap()[0], 3);
        assert!(s.next_after(Some(ids[3])).is_none());
    }

    #[test]
    fn eviction_of_a_batch_in_flight_keeps_the_rest_in_order() {
        let mut s = Spool::new(25);
        let a = s.push(vec![0; 10]);
        s.push(vec![1; 10]);
        // `a` is in flight when the bound evicts it.
        s.push(vec![2; 10]);
        assert_eq!(s.dropped(), 1);
        assert_eq!(s.next_after(Some(a)).unwrap().1[0], 1);
        // Its late acknowledgement removes nothing newer.
        s.delivered(a);
        assert_eq!(s.len(), 2);
    }
}

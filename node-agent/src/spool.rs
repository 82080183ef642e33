//! A bounded in-memory spool of encoded batches.
//!
//! While the coordinator is away, batches wait here and are resent in order on
//! reconnect. When the byte bound is hit the *oldest* batches are dropped and
//! counted: the loss is reported (in the next batch's `spool_drops`), never
//! silent.

use std::collections::VecDeque;

pub struct Spool {
    queue: VecDeque<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
    dropped: u64,
}

impl Spool {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            max_bytes,
            dropped: 0,
        }
    }

    /// Queues a batch, evicting the oldest ones if over the bound.
    pub fn push(&mut self, batch: Vec<u8>) {
        self.bytes += batch.len();
        self.queue.push_back(batch);
        while self.bytes > self.max_bytes && self.queue.len() > 1 {
            if let Some(old) = self.queue.pop_front() {
                self.bytes -= old.len();
                self.dropped += 1;
            }
        }
    }

    pub fn front(&self) -> Option<&[u8]> {
        self.queue.front().map(Vec::as_slice)
    }

    /// Removes the front batch once it was delivered.
    pub fn pop(&mut self) {
        if let Some(b) = self.queue.pop_front() {
            self.bytes -= b.len();
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
        for i in 0..5u8 {
            s.push(vec![i; 10]);
        }
        // 50 bytes pushed, bound 25: the three oldest went.
        assert_eq!(s.dropped(), 3);
        assert_eq!(s.len(), 2);
        assert_eq!(s.front().unwrap()[0], 3);
        s.pop();
        assert_eq!(s.front().unwrap()[0], 4);
        s.pop();
        assert!(s.is_empty());
    }
}

//! Where a library keeps a communicator's rank and size, learned from the
//! processes themselves.
//!
//! `ncclCommSplit` gives the agent the parent, color and key, but a member's
//! position and the new communicator's size depend on every member's key.
//! NCCL keeps both in the communicator object (`int rank; int nRanks;` in a
//! real `ncclComm`), at offsets fixed per build but not published. Every
//! `ncclCommInitRank` the agent sees tells it a (comm object, rank, nranks)
//! triple; the offsets holding those values in *every* such object are the
//! candidates. A split communicator is then read at those offsets through
//! `/proc/PID/mem`, and accepted only when all candidates agree.

use std::{collections::BTreeSet, fs::File, os::unix::fs::FileExt};

/// Bytes of a communicator object examined.
const SPAN: usize = 8192;

#[derive(Debug, Default)]
pub struct CommLayout {
    rank_at: Option<BTreeSet<usize>>,
    nranks_at: Option<BTreeSet<usize>>,
    /// Evidence triples folded in.
    pub samples: u32,
}

impl CommLayout {
    /// Adds one initialised communicator as evidence.
    pub fn learn(&mut self, pid: u32, comm_ptr: u64, rank: u32, nranks: u32) {
        if let Some(mem) = read_object(pid, comm_ptr) {
            self.learn_bytes(&mem, rank, nranks);
        }
    }

    /// Adds evidence from the object's bytes (e.g. the kernel's snapshot).
    pub fn learn_bytes(&mut self, mem: &[u8], rank: u32, nranks: u32) {
        let hits = |v: u32| -> BTreeSet<usize> {
            (0..mem.len() / 4)
                .filter(|i| u32::from_le_bytes(mem[i * 4..i * 4 + 4].try_into().expect("4")) == v)
                .map(|i| i * 4)
                .collect()
        };
        let (r, n) = (hits(rank), hits(nranks));
        self.rank_at = Some(match self.rank_at.take() {
            Some(s) => s.intersection(&r).copied().collect(),
            None => r,
        });
        self.nranks_at = Some(match self.nranks_at.take() {
            Some(s) => s.intersection(&n).copied().collect(),
            None => n,
        });
        self.samples += 1;
    }

    /// (rank, nranks) of a communicator object, when the evidence is
    /// unambiguous: every candidate offset gives the same value and
    /// rank < nranks.
    pub fn read(&self, pid: u32, comm_ptr: u64) -> Option<(u32, u32)> {
        self.decode(&read_object(pid, comm_ptr)?)
    }

    /// Like [`CommLayout::read`], from a snapshot of the object taken
    /// earlier (the process may have exited since).
    pub fn decode(&self, mem: &[u8]) -> Option<(u32, u32)> {
        let (ra, na) = (self.rank_at.as_ref()?, self.nranks_at.as_ref()?);
        if ra.is_empty() || na.is_empty() {
            return None;
        }
        let at = |o: usize| u32::from_le_bytes(mem.get(o..o + 4)?.try_into().ok()?).into();
        let one = |set: &BTreeSet<usize>| -> Option<u32> {
            // Candidates past the end of a short read (a snapshot) are
            // skipped; at least one must be inside.
            let vals: BTreeSet<u32> = set.iter().filter_map(|&o| at(o)).collect();
            (vals.len() == 1).then(|| *vals.iter().next().expect("one"))
        };
        let (r, n) = (one(ra)?, one(na)?);
        (n > 0 && r < n).then_some((r, n))
    }

    /// Candidate counts, for `doctor` and logs.
    pub fn candidates(&self) -> (usize, usize) {
        (
            self.rank_at.as_ref().map_or(0, BTreeSet::len),
            self.nranks_at.as_ref().map_or(0, BTreeSet::len),
        )
    }
}

/// Reads up to [`SPAN`] bytes of another process's memory at `addr`,
/// shrinking the read when it runs into an unmapped page.
pub fn read_object(pid: u32, addr: u64) -> Option<Vec<u8>> {
    let f = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut span = SPAN;
    while span >= 64 {
        let mut buf = vec![0u8; span];
        if let Ok(n) = f.read_at(&mut buf, addr) {
            if n >= 64 {
                buf.truncate(n - n % 4);
                return Some(buf);
            }
        }
        span /= 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As large as the span the agent reads: a smaller object let the read
    /// run on into live heap, where other tests' allocations change
    /// between the samples and the check (1 failed CI run in many).
    #[repr(C)]
    struct FakeComm {
        pad: [u32; 5],
        rank: u32,
        junk: [u32; 3],
        nranks: u32,
        tail: [u32; SPAN / 4],
    }

    #[test]
    fn learns_offsets_from_own_memory() {
        let pid = std::process::id();
        let mk = |rank, nranks| {
            Box::new(FakeComm {
                pad: [0, 1, 2, 3, 4],
                rank,
                junk: [7, 8, 9],
                nranks,
                tail: [0; SPAN / 4],
            })
        };
        let (a, b, c) = (mk(1, 8), mk(3, 4), mk(1, 2));
        let p = |x: &FakeComm| x as *const FakeComm as u64;
        let mut l = CommLayout::default();
        assert_eq!(l.read(pid, p(&c)), None);
        l.learn(pid, p(&a), 1, 8);
        l.learn(pid, p(&b), 3, 4);
        // Offsets 4 and 12 hold 1 and 3 in the padding: only the true
        // fields hold both samples' values.
        assert_eq!(l.read(pid, p(&c)), Some((1, 2)));
        let (r, n) = l.candidates();
        assert!(r >= 1 && n >= 1);
    }
}

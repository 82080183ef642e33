//! Split communicators whose size no agent could read: worked out from
//! every member of the parent.
//!
//! An agent reads a split communicator's size and its member's position
//! from the NCCL object, at offsets it learns from `ncclCommInitRank`
//! calls. A job that inits only the world and splits every other group (a
//! tp×pp job without data-parallel groups; PyTorch creating subgroups with
//! `split_from`) gives it one sample, which leaves the offsets ambiguous.
//! Such a member ships its split with `nranks` 0, its `color`, `split_key`
//! and `split_ordinal` (which split of the parent it is), and a member
//! passing `NCCL_SPLIT_NOCOLOR` ships one too (color −1, no communicator).
//!
//! NCCL's rule (`ncclCommSplit`): the members of the parent that pass the
//! same color form one communicator, ranked by key, ties by their rank in
//! the parent. So once every member of the parent has said what it passed
//! to split number `n`, each new communicator's size and positions follow.
//!
//! In: one member's split record and the parent's membership. Out: the
//! complete membership records, ready for the join. Pure: no clock, no IO.
//! Bounded: [`MAX_OPEN_SPLITS`] splits wait at once, the oldest is dropped
//! and counted.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use slowrank_shared::wire::CommRecord;

/// Splits waiting for members at once; past it the oldest is dropped.
pub const MAX_OPEN_SPLITS: usize = 4096;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SplitError {
    #[error("split of communicator {parent:#x}, which no member announced")]
    UnknownParent { parent: u64 },
    #[error("rank {rank} is not a member of communicator {parent:#x}, which it split")]
    NotInParent { rank: u32, parent: u64 },
    #[error("rank {rank} said two different things about split {ordinal} of {parent:#x}")]
    Conflict {
        rank: u32,
        parent: u64,
        ordinal: u32,
    },
}

/// The parent's membership as the join knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Parent {
    pub nranks: u32,
    /// Global rank of each position, where known.
    pub ranks: Vec<Option<u32>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Part {
    host: Arc<str>,
    rec: CommRecord,
}

/// What one split needs: the members of the parent heard so far.
#[derive(Debug, Default)]
pub struct Splits {
    open: BTreeMap<(u64, u32), BTreeMap<u32, Part>>,
    order: VecDeque<(u64, u32)>,
    /// Splits dropped unresolved because too many were waiting.
    pub dropped: u64,
    /// Communicators worked out here.
    pub resolved: u64,
}

impl Splits {
    /// Whether a membership record is one this module must complete.
    pub fn needs_resolving(c: &CommRecord) -> bool {
        c.parent_id != 0 && c.nranks == 0
    }

    /// Takes one member's split record (`needs_resolving`, or a complete
    /// one: it counts as a member heard). Returns the membership records of
    /// every communicator this split made that needed working out, once
    /// every member of the parent has been heard.
    pub fn offer(
        &mut self,
        host: &Arc<str>,
        c: &CommRecord,
        parent: Option<&Parent>,
    ) -> Result<Vec<(Arc<str>, CommRecord)>, SplitError> {
        let key = (c.parent_id, c.split_ordinal);
        let parent = parent.ok_or(SplitError::UnknownParent {
            parent: c.parent_id,
        })?;
        if !parent.ranks.contains(&Some(c.rank)) {
            return Err(SplitError::NotInParent {
                rank: c.rank,
                parent: c.parent_id,
            });
        }
        if !self.open.contains_key(&key) {
            self.order.push_back(key);
            while self.order.len() > MAX_OPEN_SPLITS {
                if let Some(old) = self.order.pop_front() {
                    self.open.remove(&old);
                    self.dropped += 1;
                }
            }
        }
        let parts = self.open.entry(key).or_default();
        let part = Part {
            host: host.clone(),
            rec: c.clone(),
        };
        match parts.get(&c.rank) {
            // A resend (reconnect, restart) of what was said.
            Some(p) if same_split(&p.rec, c) => {}
            Some(_) => {
                return Err(SplitError::Conflict {
                    rank: c.rank,
                    parent: c.parent_id,
                    ordinal: c.split_ordinal,
                })
            }
            None => {
                parts.insert(c.rank, part);
            }
        }
        if parts.len() < parent.nranks as usize {
            return Ok(Vec::new());
        }
        let parts = self.open.remove(&key).expect("present");
        self.order.retain(|k| *k != key);
        Ok(self.resolve(parts, parent))
    }

    fn resolve(
        &mut self,
        parts: BTreeMap<u32, Part>,
        parent: &Parent,
    ) -> Vec<(Arc<str>, CommRecord)> {
        let pos_in_parent = |rank: u32| {
            parent
                .ranks
                .iter()
                .position(|r| *r == Some(rank))
                .unwrap_or(usize::MAX)
        };
        let mut by_color: BTreeMap<i32, Vec<&Part>> = BTreeMap::new();
        for p in parts.values().filter(|p| p.rec.color >= 0) {
            by_color.entry(p.rec.color).or_default().push(p);
        }
        let mut out = Vec::new();
        for members in by_color.values_mut() {
            members.sort_by_key(|p| (p.rec.split_key, pos_in_parent(p.rec.rank)));
            let n = members.len() as u32;
            if members.iter().all(|p| p.rec.nranks != 0) {
                continue;
            }
            self.resolved += 1;
            for (i, p) in members.iter().enumerate() {
                if p.rec.nranks == 0 {
                    let mut rec = p.rec.clone();
                    rec.nranks = n;
                    rec.rank_in_comm = i as u32;
                    out.push((p.host.clone(), rec));
                }
            }
        }
        out
    }
}

/// The same member's same split call (a resend).
fn same_split(a: &CommRecord, b: &CommRecord) -> bool {
    (a.comm_id, a.color, a.split_key, a.pid) == (b.comm_id, b.color, b.split_key, b.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(n: u32) -> Parent {
        Parent {
            nranks: n,
            ranks: (0..n).map(Some).collect(),
        }
    }

    fn part(rank: u32, color: i32, key: i32) -> CommRecord {
        CommRecord {
            pid: 100 + rank,
            rank,
            comm_id: if color < 0 { 0 } else { 0xc0 + color as u64 },
            parent_id: 0xa,
            color,
            nranks: 0,
            rank_in_comm: 0,
            created_ns: 1,
            split_ordinal: 0,
            split_key: key,
            resumed: false,
        }
    }

    /// tp4 × pp2 over a world of 8: colors by tp group, keys the global
    /// rank (what the trainer and PyTorch pass).
    #[test]
    fn each_color_is_ranked_by_key_once_every_member_is_heard() {
        let h: Arc<str> = "h".into();
        let w = world(8);
        let mut s = Splits::default();
        let mut got = Vec::new();
        for r in (0..8).rev() {
            let out = s
                .offer(&h, &part(r, (r / 4) as i32, r as i32), Some(&w))
                .unwrap();
            if r > 0 {
                assert!(out.is_empty(), "resolved before every member spoke");
            }
            got.extend(out);
        }
        let mut v: Vec<(u32, u64, u32, u32)> = got
            .iter()
            .map(|(_, c)| (c.rank, c.comm_id, c.nranks, c.rank_in_comm))
            .collect();
        v.sort();
        let want: Vec<(u32, u64, u32, u32)> = (0..8)
            .map(|r| (r, 0xc0 + (r / 4) as u64, 4, r % 4))
            .collect();
        assert_eq!(v, want);
        assert_eq!(s.resolved, 2);
    }

    /// Keys order the new communicator, not parent ranks; equal keys fall
    /// back to the parent rank; NOCOLOR members count but join nothing.
    #[test]
    fn keys_rank_members_and_nocolor_members_count_without_joining() {
        let h: Arc<str> = "h".into();
        let w = world(4);
        let mut s = Splits::default();
        let mut got = Vec::new();
        for (r, c, k) in [(0, 1, 5), (1, 1, 0), (2, -1, 0), (3, 1, 0)] {
            got.extend(s.offer(&h, &part(r, c, k), Some(&w)).unwrap());
        }
        let mut v: Vec<(u32, u32, u32)> = got
            .iter()
            .map(|(_, c)| (c.rank, c.rank_in_comm, c.nranks))
            .collect();
        v.sort();
        assert_eq!(v, vec![(0, 2, 3), (1, 0, 3), (3, 1, 3)]);
    }

    #[test]
    fn resends_are_harmless_and_contradictions_are_refused() {
        let h: Arc<str> = "h".into();
        let w = world(2);
        let mut s = Splits::default();
        assert!(s.offer(&h, &part(0, 0, 0), Some(&w)).unwrap().is_empty());
        assert!(s.offer(&h, &part(0, 0, 0), Some(&w)).unwrap().is_empty());
        assert!(matches!(
            s.offer(&h, &part(0, 0, 9), Some(&w)),
            Err(SplitError::Conflict { .. })
        ));
        assert_eq!(s.offer(&h, &part(1, 0, 1), Some(&w)).unwrap().len(), 2);
        assert!(matches!(
            s.offer(&h, &part(7, 0, 1), Some(&w)),
            Err(SplitError::NotInParent { rank: 7, .. })
        ));
        assert!(matches!(
            s.offer(&h, &part(0, 0, 1), None),
            Err(SplitError::UnknownParent { .. })
        ));
    }

    #[test]
    fn waiting_splits_are_bounded() {
        let h: Arc<str> = "h".into();
        let w = world(2);
        let mut s = Splits::default();
        for o in 0..(MAX_OPEN_SPLITS as u32 + 10) {
            let mut c = part(0, 0, 0);
            c.split_ordinal = o;
            s.offer(&h, &c, Some(&w)).unwrap();
        }
        assert_eq!(s.open.len(), MAX_OPEN_SPLITS);
        assert_eq!(s.dropped, 10);
    }
}

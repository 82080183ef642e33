//! The members present in one open instance: what arrived, never a table
//! of the size the communicator claims (a hostile agent may claim a
//! million ranks).
//!
//! The members sit in arrival order in one vector and are found through a
//! small index (position → slot). A map of whole members moved every
//! ~140-byte member at each of its 14 doublings on the way to a
//! 16,384-rank instance, and its inserts were a fifth of ingest; the index
//! moves 8-byte entries, and a growing vector of large members is
//! reallocated in place.

use foldhash::{HashMap, HashMapExt};

use super::instance::Member;

#[derive(Debug, Default)]
pub(super) struct Present {
    members: Vec<Member>,
    /// Index (comm position, or side 0/1 for p2p) → slot in `members`.
    at: HashMap<u32, u32>,
}

impl Present {
    pub fn new() -> Self {
        Self {
            members: Vec::new(),
            at: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn contains_key(&self, idx: &u32) -> bool {
        self.at.contains_key(idx)
    }

    pub fn get(&self, idx: &u32) -> Option<&Member> {
        self.at.get(idx).map(|&s| &self.members[s as usize])
    }

    pub fn get_mut(&mut self, idx: &u32) -> Option<&mut Member> {
        self.at.get(idx).map(|&s| &mut self.members[s as usize])
    }

    /// Adds `m` at `idx` unless a member is there already (kept).
    pub fn insert_if_absent(&mut self, idx: u32, m: Member) {
        let slot = self.members.len() as u32;
        if let std::collections::hash_map::Entry::Vacant(e) = self.at.entry(idx) {
            e.insert(slot);
            self.members.push(m);
        }
    }

    /// The members, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = &Member> {
        self.members.iter()
    }

    /// The members, in arrival order.
    pub fn into_members(self) -> Vec<Member> {
        self.members
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slowrank_shared::wire::{CollOp, CollectiveRecord};
    use std::sync::Arc;

    fn member(pos: u32, seq: u64) -> Member {
        Member {
            rank: 100 + pos,
            rank_in_comm: pos,
            host: Arc::from("h"),
            rec: CollectiveRecord {
                pid: 1,
                rank: 100 + pos,
                comm_id: 7,
                seq,
                op: CollOp::AllReduce,
                bytes: 0,
                peer: -1,
                host_entry_ns: 0,
                host_exit_ns: 0,
                gpu_arrive_ns: 0,
                gpu_done_ns: 0,
                launches_before: 0,
                sync_wait_ns_before: 0,
                gpu_busy_before_ns: None,
                ret: 0,
            },
        }
    }

    #[test]
    fn the_first_member_at_a_position_stays_and_is_found_by_it() {
        let mut p = Present::new();
        for pos in [5, 1, 9] {
            p.insert_if_absent(pos, member(pos, 1));
        }
        p.insert_if_absent(1, member(1, 2));
        assert_eq!(p.len(), 3);
        assert!(p.contains_key(&9) && !p.contains_key(&2));
        assert_eq!(p.get(&1).map(|m| m.rec.seq), Some(1));
        p.get_mut(&5).expect("present").rec.seq = 7;
        let order: Vec<(u32, u64)> = p
            .into_members()
            .iter()
            .map(|m| (m.rank_in_comm, m.rec.seq))
            .collect();
        assert_eq!(order, vec![(5, 7), (1, 1), (9, 1)]);
    }
}

//! Naming the remote rank of a queue pair by joining both ends.
//!
//! An agent sees its QP's number and, from `ibv_modify_qp`, the remote QP's
//! number and port LID — but not which rank owns the remote QP (it runs on
//! another host). The two ends of an RC connection name each other:
//! `(qp_num, dest_qp_num)` of one end is `(dest_qp_num, qp_num)` of the
//! other. QP numbers are only unique per NIC, so that pair can match
//! several ranks; the LIDs decide. A rank's own LID is what its partners
//! put in `dlid`: for each rank, the LID most often named by the candidate
//! partners of its QPs (one NIC per rank, as NCCL's rail layout uses).

use std::collections::HashMap;

use crate::wire::LinkRecord;

/// Every QP endpoint seen so far, for naming peers as records arrive (the
/// coordinator keeps one; bounded by the cluster's connected QPs).
#[derive(Debug, Default, Clone)]
pub struct LinkPeers {
    /// (qp_num, dest_qp_num) → (rank, dlid) of every QP claiming it.
    by_pair: HashMap<(u32, u32), Vec<(u32, u32)>>,
    /// rank → its QPs (qp_num, dest_qp_num).
    by_rank: HashMap<u32, Vec<(u32, u32)>>,
}

impl LinkPeers {
    /// Remembers the QP of `l` (any interval; repeats are ignored).
    pub fn observe(&mut self, l: &LinkRecord) {
        if l.dest_qp_num == 0 {
            return;
        }
        let v = self.by_pair.entry((l.qp_num, l.dest_qp_num)).or_default();
        if !v.contains(&(l.rank, l.dlid)) {
            v.push((l.rank, l.dlid));
            let q = self.by_rank.entry(l.rank).or_default();
            if !q.contains(&(l.qp_num, l.dest_qp_num)) {
                q.push((l.qp_num, l.dest_qp_num));
            }
        }
    }

    /// Candidate partners (rank, their dlid) of `rank`'s QP `(qp, dest)`.
    fn partners(&self, rank: u32, qp: u32, dest: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.by_pair
            .get(&(dest, qp))
            .into_iter()
            .flatten()
            .copied()
            .filter(move |(r, _)| *r != rank)
    }

    /// `rank`'s own LID: the one its candidate partners name most (None on
    /// a tie or without candidates).
    fn own_lid(&self, rank: u32) -> Option<u32> {
        let mut votes: HashMap<u32, u32> = HashMap::new();
        for &(qp, dest) in self.by_rank.get(&rank)? {
            for (_, dlid) in self.partners(rank, qp, dest) {
                *votes.entry(dlid).or_insert(0) += 1;
            }
        }
        let mut v: Vec<(u32, u32)> = votes.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        match v.as_slice() {
            [(_, n), (_, m), ..] if n == m => None,
            [(lid, _), ..] => Some(*lid),
            [] => None,
        }
    }

    /// The rank at the other end of `l`'s QP, when it is known and unique.
    pub fn peer_of(&self, l: &LinkRecord) -> Option<u32> {
        if l.dest_qp_num == 0 {
            return None;
        }
        let me = self.own_lid(l.rank);
        let cands: Vec<u32> = self
            .partners(l.rank, l.qp_num, l.dest_qp_num)
            .filter(|(r, dlid)| {
                // Their dlid is my LID, my dlid is theirs (where known).
                me.is_none_or(|m| m == *dlid)
                    && (l.dlid == 0 || self.own_lid(*r).is_none_or(|t| t == l.dlid))
            })
            .map(|(r, _)| r)
            .collect();
        match cands.as_slice() {
            [r] => Some(*r),
            _ => None,
        }
    }
}

/// Sets `peer_rank` of every record whose other end is among `links`
/// (records of all agents and any intervals, in any order). Where the
/// partner cannot be told apart, `peer_rank` stays as it was.
pub fn resolve_peer_ranks(links: &mut [LinkRecord]) {
    let mut peers = LinkPeers::default();
    for l in links.iter() {
        peers.observe(l);
    }
    for l in links.iter_mut() {
        if let Some(r) = peers.peer_of(l) {
            l.peer_rank = i64::from(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(rank: u32, qp: u32, dest: u32, dlid: u32) -> LinkRecord {
        LinkRecord {
            pid: rank,
            rank,
            peer_rank: -1,
            qp_num: qp,
            dest_qp_num: dest,
            start_ns: 0,
            end_ns: 0,
            posts: 1,
            completions: 1,
            post_to_completion_ns: 1,
            bytes: 1,
            dlid,
        }
    }

    #[test]
    fn per_nic_qp_numbers_are_told_apart_by_lids() {
        // Two hosts of two ranks; every NIC numbers its QPs 128, 129 in
        // member order of the remote host; LID of rank r is 10 + r.
        let mut l = Vec::new();
        for r in 0..4u32 {
            let remote: Vec<u32> = if r < 2 { vec![2, 3] } else { vec![0, 1] };
            for (i, &s) in remote.iter().enumerate() {
                let my_index_at_s = if r < 2 { r } else { r - 2 };
                l.push(link(r, 128 + i as u32, 128 + my_index_at_s, 10 + s));
            }
        }
        l.push(link(0, 128, 128, 12)); // a later interval of a QP
        l.push(link(1, 200, 77, 99)); // other end never reported
        resolve_peer_ranks(&mut l);
        let peers: Vec<i64> = l.iter().map(|x| x.peer_rank).collect();
        assert_eq!(peers, vec![2, 3, 2, 3, 0, 1, 0, 1, 2, -1]);
    }
}

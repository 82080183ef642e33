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

/// Sets `peer_rank` of every record whose other end is among `links`
/// (records of all agents and any intervals, in any order). Where the
/// partner cannot be told apart, `peer_rank` stays -1.
pub fn resolve_peer_ranks(links: &mut [LinkRecord]) {
    // (qp_num, dest_qp_num) → (rank, dlid) of every QP claiming it.
    let mut by_pair: HashMap<(u32, u32), Vec<(u32, u32)>> = HashMap::new();
    for l in links.iter().filter(|l| l.dest_qp_num != 0) {
        let v = by_pair.entry((l.qp_num, l.dest_qp_num)).or_default();
        if !v.contains(&(l.rank, l.dlid)) {
            v.push((l.rank, l.dlid));
        }
    }
    let partners = |l: &LinkRecord| -> Vec<(u32, u32)> {
        by_pair
            .get(&(l.dest_qp_num, l.qp_num))
            .map(|v| v.iter().copied().filter(|(r, _)| *r != l.rank).collect())
            .unwrap_or_default()
    };
    // Votes for each rank's own LID: the dlids its candidate partners use.
    let mut votes: HashMap<u32, HashMap<u32, u32>> = HashMap::new();
    let mut seen: HashMap<(u32, u32), ()> = HashMap::new();
    for l in links.iter().filter(|l| l.dest_qp_num != 0) {
        if seen.insert((l.rank, l.qp_num), ()).is_some() {
            continue;
        }
        for (_, dlid) in partners(l) {
            *votes.entry(l.rank).or_default().entry(dlid).or_insert(0) += 1;
        }
    }
    let own: HashMap<u32, u32> = votes
        .into_iter()
        .filter_map(|(r, v)| {
            let mut v: Vec<(u32, u32)> = v.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            // A tie names no LID.
            match v.as_slice() {
                [(_, n), (_, m), ..] if n == m => None,
                [(lid, _), ..] => Some((r, *lid)),
                [] => None,
            }
        })
        .collect();
    for l in links.iter_mut().filter(|l| l.dest_qp_num != 0) {
        let cands: Vec<u32> = partners(l)
            .into_iter()
            .filter(|(r, dlid)| {
                // Their dlid is my LID, my dlid is theirs (where known).
                own.get(&l.rank).is_none_or(|me| me == dlid)
                    && (l.dlid == 0 || own.get(r).is_none_or(|them| *them == l.dlid))
            })
            .map(|(r, _)| r)
            .collect();
        if let [r] = cands.as_slice() {
            l.peer_rank = i64::from(*r);
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

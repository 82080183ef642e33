//! What this agent has announced to the coordinator once and later batches
//! rely on: its ranks and their communicators. A coordinator that
//! restarts mid-job has lost them, so the uplink replays them (as a
//! preamble batch) first on every reconnection.
//!
//! Ranks that exited stay in the preamble (the most recent
//! [`MAX_EXITED`]), with their communicators and their exit: batches still
//! in the spool may hold their last records. A coordinator restarted near
//! the end of a job met agents whose ranks had all exited meanwhile; a
//! preamble of live ranks only declared nothing, and the spooled tail of
//! the job waited for communicators no one would announce again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use slowrank_shared::wire::{Batch, CommRecord, RankExit, RankIdentity};

/// Bound on remembered communicators (a rank has a handful).
const MAX_COMMS: usize = 65_536;

/// Exited ranks kept in the preamble: eight elastic restarts of a full
/// host; older ones have long left the spool.
pub const MAX_EXITED: usize = 64;

#[derive(Debug)]
struct Exited {
    identity: RankIdentity,
    comms: Vec<CommRecord>,
    exit: RankExit,
}

#[derive(Debug, Default)]
pub struct Announced {
    /// Live ranks by pid.
    ranks: BTreeMap<u32, RankIdentity>,
    comms: Vec<CommRecord>,
    /// Ranks that exited, oldest first.
    exited: VecDeque<Exited>,
}

impl Announced {
    /// Takes in what `batch` announces or ends; true when that changed
    /// anything (the preamble must then be rebuilt).
    pub fn learn(&mut self, batch: &Batch) -> bool {
        let mut changed = false;
        for r in &batch.ranks {
            self.ranks.insert(r.pid, r.clone());
            changed = true;
        }
        for c in &batch.comms {
            if self.comms.len() < MAX_COMMS {
                self.comms.push(c.clone());
                changed = true;
            }
        }
        for e in &batch.exits {
            let (gone, kept): (Vec<CommRecord>, Vec<CommRecord>) = std::mem::take(&mut self.comms)
                .into_iter()
                .partition(|c| c.pid == e.pid);
            self.comms = kept;
            changed |= !gone.is_empty();
            if let Some(identity) = self.ranks.remove(&e.pid) {
                self.exited.push_back(Exited {
                    identity,
                    comms: gone,
                    exit: e.clone(),
                });
                while self.exited.len() > MAX_EXITED {
                    self.exited.pop_front();
                }
                changed = true;
            }
        }
        changed
    }

    /// The preamble batch, stamped like `now` but with `seq` 0: the exited
    /// ranks first (an exited rank whose rank number runs again in a new
    /// process lends only its communicators, so its exit cannot end the
    /// new one), then the live ones.
    pub fn preamble(&self, now: &Batch) -> Batch {
        let live: BTreeSet<u32> = self.ranks.values().map(|r| r.rank).collect();
        let ended = self
            .exited
            .iter()
            .filter(|x| !live.contains(&x.identity.rank));
        Batch {
            host: now.host.clone(),
            agent_id: now.agent_id.clone(),
            seq: 0,
            mono_ns: now.mono_ns,
            wall_ns: now.wall_ns,
            ranks: ended
                .clone()
                .map(|x| x.identity.clone())
                .chain(self.ranks.values().cloned())
                .collect(),
            exits: ended.map(|x| x.exit.clone()).collect(),
            comms: self
                .exited
                .iter()
                .flat_map(|x| x.comms.iter().cloned())
                .chain(self.comms.iter().cloned())
                .collect(),
            collectives: Vec::new(),
            intervals: Vec::new(),
            links: Vec::new(),
            probes: Vec::new(),
            calls: Vec::new(),
            ringbuf_drops: now.ringbuf_drops,
            spool_drops: now.spool_drops,
            stacks: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(pid: u32, rank: u32) -> RankIdentity {
        RankIdentity {
            pid,
            rank,
            world_size: 8,
            local_rank: rank,
            local_world_size: 8,
            group_rank: 0,
            restart_count: 0,
            job_id: "j".into(),
            seen_ns: 1,
        }
    }

    fn comm(pid: u32, rank: u32, comm_id: u64) -> CommRecord {
        CommRecord {
            pid,
            rank,
            comm_id,
            parent_id: 0,
            color: 0,
            nranks: 8,
            rank_in_comm: rank,
            created_ns: 1,
            split_ordinal: 0,
            split_key: 0,
            resumed: false,
        }
    }

    fn batch(ranks: Vec<RankIdentity>, comms: Vec<CommRecord>, exits: Vec<RankExit>) -> Batch {
        Batch {
            host: "h".into(),
            agent_id: "a".into(),
            seq: 5,
            ranks,
            comms,
            exits,
            ..Default::default()
        }
    }

    #[test]
    fn a_rank_that_exited_is_still_declared_with_its_communicators_and_its_exit() {
        let mut a = Announced::default();
        a.learn(&batch(
            vec![identity(10, 0), identity(11, 1)],
            vec![comm(10, 0, 7), comm(11, 1, 7)],
            vec![],
        ));
        let exit = RankExit {
            pid: 10,
            rank: 0,
            exit_ns: 99,
        };
        assert!(a.learn(&batch(vec![], vec![], vec![exit.clone()])));
        let p = a.preamble(&batch(vec![], vec![], vec![]));
        assert_eq!(p.seq, 0);
        let ranks: Vec<u32> = p.ranks.iter().map(|r| r.pid).collect();
        assert_eq!(
            ranks,
            vec![10, 11],
            "the exited rank first, then the live one"
        );
        assert_eq!(p.comms.len(), 2, "both members of communicator 7");
        assert_eq!(p.exits, vec![exit]);
    }

    #[test]
    fn a_rank_running_again_is_not_ended_by_its_old_exit() {
        let mut a = Announced::default();
        a.learn(&batch(vec![identity(10, 3)], vec![comm(10, 3, 7)], vec![]));
        a.learn(&batch(
            vec![],
            vec![],
            vec![RankExit {
                pid: 10,
                rank: 3,
                exit_ns: 50,
            }],
        ));
        // An elastic restart: rank 3 again, in a new process, a new communicator.
        a.learn(&batch(vec![identity(20, 3)], vec![comm(20, 3, 8)], vec![]));
        let p = a.preamble(&batch(vec![], vec![], vec![]));
        assert_eq!(p.ranks.iter().map(|r| r.pid).collect::<Vec<_>>(), vec![20]);
        assert!(p.exits.is_empty());
        let comms: Vec<(u32, u64)> = p.comms.iter().map(|c| (c.pid, c.comm_id)).collect();
        assert_eq!(
            comms,
            vec![(10, 7), (20, 8)],
            "the old process's communicator stays declared"
        );
    }

    #[test]
    fn exited_ranks_are_bounded() {
        let mut a = Announced::default();
        for pid in 0..(MAX_EXITED as u32 + 10) {
            a.learn(&batch(
                vec![identity(pid, pid)],
                vec![comm(pid, pid, 1)],
                vec![],
            ));
            a.learn(&batch(
                vec![],
                vec![],
                vec![RankExit {
                    pid,
                    rank: pid,
                    exit_ns: 1,
                }],
            ));
        }
        let p = a.preamble(&batch(vec![], vec![], vec![]));
        assert_eq!(p.ranks.len(), MAX_EXITED);
        assert_eq!(p.comms.len(), MAX_EXITED);
        assert_eq!(p.ranks[0].pid, 10, "the oldest are forgotten first");
    }
}

//! What this agent has announced to the coordinator once and later batches
//! rely on: its live ranks and their communicators. A coordinator that
//! restarts mid-job has lost them, so the uplink replays them (as a
//! preamble batch) first on every reconnection.

use std::collections::BTreeMap;

use slowrank_shared::wire::{Batch, CommRecord, RankIdentity};

/// Bound on remembered communicators (a rank has a handful).
const MAX_COMMS: usize = 65_536;

#[derive(Debug, Default)]
pub struct Announced {
    /// Live ranks by pid.
    ranks: BTreeMap<u32, RankIdentity>,
    comms: Vec<CommRecord>,
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
            changed |= self.ranks.remove(&e.pid).is_some();
            let before = self.comms.len();
            self.comms.retain(|c| c.pid != e.pid);
            changed |= self.comms.len() != before;
        }
        changed
    }

    /// The preamble batch, stamped like `now` but with `seq` 0.
    pub fn preamble(&self, now: &Batch) -> Batch {
        Batch {
            host: now.host.clone(),
            agent_id: now.agent_id.clone(),
            seq: 0,
            mono_ns: now.mono_ns,
            wall_ns: now.wall_ns,
            ranks: self.ranks.values().cloned().collect(),
            exits: Vec::new(),
            comms: self.comms.clone(),
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

//! Per-rank operation timelines → the records an agent would have shipped.
//! The importers (Kineto, the study's parquet) each build a [`Timeline`];
//! this module names communicators, numbers instances, stamps missing host
//! times by one documented rule, and cuts per-host batches.

use std::collections::BTreeMap;

use slowrank_shared::wire::{Batch, CollOp, CollectiveRecord, CommRecord, RankIdentity};

use super::{HostFit, HostRecording, Recording, ReplayError};

/// Batches are cut this often on each host's clock, as a live agent's
/// default flush does; the watermark of each agent then advances the way
/// the join's hang timeout expects.
pub const BATCH_EVERY_NS: u64 = 500_000_000;

/// Where a timeline's clock starts: record times must be non-zero (0 means
/// "not measured" on the wire), so a trace whose times start at 0 is moved
/// one second later. Only differences between times matter.
pub const TIME_BASE_NS: u64 = 1_000_000_000;

/// One communication op of one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct OpEvent {
    /// Communicator name (hashed into its id); the same on every member.
    pub comm: String,
    /// Instance number within the communicator when the source has one;
    /// else the op's position among this rank's ops on `comm`.
    pub seq: Option<u64>,
    pub op: CollOp,
    pub bytes: u64,
    /// The global rank at the other end (p2p), else -1.
    pub peer: i32,
    /// Host enqueue (entry, exit); `None` when the source has no host side.
    pub host: Option<(u64, u64)>,
    /// GPU-side start and end; 0 when unknown.
    pub gpu_start_ns: u64,
    pub gpu_end_ns: u64,
    /// The rank's GPU time in kernels since its previous op in this
    /// timeline, when the source records kernels.
    pub gpu_busy_before_ns: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct RankTimeline {
    pub host: String,
    pub ops: Vec<OpEvent>,
}

#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub job_id: String,
    pub world_size: u32,
    /// Global rank → its ops.
    pub ranks: BTreeMap<u32, RankTimeline>,
    /// Communicator name → its members' global ranks, in communicator order.
    pub comms: BTreeMap<String, Vec<u32>>,
    /// Per host clock; hosts not listed are taken as aligned at source.
    pub fits: BTreeMap<String, HostFit>,
    pub notes: Vec<String>,
    /// Training steps the source marks.
    pub steps: Option<u64>,
    /// Rank groups the source's layout names ([`super::Recording::groups`]).
    pub groups: Vec<(String, Vec<u32>)>,
}

/// A stable 64-bit id for a communicator name (FNV-1a): the same name gives
/// the same id on every rank and in every run.
pub fn comm_id(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// A synthetic pid per rank (the wire needs one; nothing reads its value).
fn pid(rank: u32) -> u32 {
    100_000 + rank
}

/// Each instance's host time where the source has none: keyed by
/// (communicator, instance number).
type Earliest = BTreeMap<(String, u64), u64>;

impl Timeline {
    /// Numbers instances, fills host times, and cuts each host's batches.
    pub fn into_recording(mut self) -> Result<Recording, ReplayError> {
        if self.ranks.is_empty() {
            return Err(ReplayError::Empty(
                "no communication ops in the input".into(),
            ));
        }
        self.number_instances();
        let earliest = self.earliest_gpu_arrivals();
        let mut hosts = Vec::new();
        for (host, ops) in self.ops_by_host() {
            if let Some(h) = self.host_recording(host, ops, &earliest) {
                hosts.push(h);
            }
        }
        Ok(Recording {
            hosts,
            world_size: Some(self.world_size),
            notes: std::mem::take(&mut self.notes),
            steps: self.steps,
            groups: std::mem::take(&mut self.groups),
        })
    }

    /// Sequence numbers by order where the source has none.
    fn number_instances(&mut self) {
        for tl in self.ranks.values_mut() {
            tl.ops
                .sort_by_key(|o| (o.host.map_or(o.gpu_start_ns, |h| h.0), o.gpu_start_ns));
            let mut next: BTreeMap<&str, u64> = BTreeMap::new();
            for o in &mut tl.ops {
                let n = next.entry(o.comm.as_str()).or_insert(0);
                *n += 1;
                if o.seq.is_none() {
                    o.seq = Some(*n);
                }
            }
        }
    }

    /// Ops without a host side: the host is stamped at the instance's
    /// earliest GPU arrival over its members, so host-side lateness is
    /// zero and no rank can be called host-slow on evidence the trace
    /// does not hold; the GPU side carries the verdict.
    fn earliest_gpu_arrivals(&self) -> Earliest {
        let mut earliest: Earliest = BTreeMap::new();
        for tl in self.ranks.values() {
            for o in tl.ops.iter().filter(|o| o.host.is_none()) {
                let e = earliest
                    .entry((o.comm.clone(), o.seq.unwrap_or(0)))
                    .or_insert(u64::MAX);
                *e = (*e).min(o.gpu_start_ns);
            }
        }
        earliest
    }

    /// Every host (with or without ops) and its ranks' ops, by rank.
    fn ops_by_host(&self) -> BTreeMap<String, Vec<(u32, &OpEvent)>> {
        let mut by_host: BTreeMap<String, Vec<(u32, &OpEvent)>> = BTreeMap::new();
        for (&rank, tl) in &self.ranks {
            let ops = by_host.entry(tl.host.clone()).or_default();
            ops.extend(tl.ops.iter().map(|o| (rank, o)));
        }
        by_host
    }

    /// One host's batches, as its agent would have cut them; `None` for a
    /// host without ops.
    fn host_recording(
        &self,
        host: String,
        ops: Vec<(u32, &OpEvent)>,
        earliest: &Earliest,
    ) -> Option<HostRecording> {
        let ranks: Vec<u32> = self
            .ranks
            .iter()
            .filter(|(_, t)| t.host == host)
            .map(|(r, _)| *r)
            .collect();
        let recs = shipped_records(&ops, earliest);
        let t0 = recs.first().map(|r| r.1.host_entry_ns.min(r.0))?;
        let t_end = recs.last().map_or(t0, |r| r.0);
        let created = t0.saturating_sub(1);
        let first = self.identities(&host, &ranks, created);
        let batches = cut_batches(first, recs, created, t_end);
        let fit = self.fits.get(&host).copied().unwrap_or(HostFit::IDENTITY);
        Some(HostRecording { host, fit, batches })
    }

    /// A host's first batch: its ranks' identities and communicators, as
    /// created just before its first record.
    fn identities(&self, host: &str, ranks: &[u32], created: u64) -> Batch {
        let mut first = Batch {
            host: host.to_owned(),
            agent_id: format!("{host}-import"),
            ..Default::default()
        };
        for &rank in ranks {
            first.ranks.push(RankIdentity {
                pid: pid(rank),
                rank,
                world_size: self.world_size,
                local_rank: 0,
                local_world_size: ranks.len() as u32,
                group_rank: 0,
                restart_count: 0,
                job_id: self.job_id.clone(),
                seen_ns: created,
            });
            for (name, members) in &self.comms {
                if let Some(pos) = members.iter().position(|m| *m == rank) {
                    first.comms.push(CommRecord {
                        pid: pid(rank),
                        rank,
                        comm_id: comm_id(name),
                        parent_id: 0,
                        color: -1,
                        nranks: members.len() as u32,
                        rank_in_comm: pos as u32,
                        created_ns: created,
                        split_ordinal: 0,
                        split_key: 0,
                        resumed: false,
                    });
                }
            }
        }
        first
    }
}

/// A host's records, each with when its agent would ship it, in shipping
/// order.
fn shipped_records(ops: &[(u32, &OpEvent)], earliest: &Earliest) -> Vec<(u64, CollectiveRecord)> {
    let mut recs: Vec<(u64, CollectiveRecord)> = ops
        .iter()
        .map(|(rank, o)| shipped_record(*rank, o, earliest))
        .collect();
    recs.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.rank.cmp(&b.1.rank))
            .then(a.1.comm_id.cmp(&b.1.comm_id))
            .then(a.1.seq.cmp(&b.1.seq))
    });
    recs
}

/// The record an agent would have made of `o`, and when it would ship it
/// (once the collective is done).
fn shipped_record(rank: u32, o: &OpEvent, earliest: &Earliest) -> (u64, CollectiveRecord) {
    let seq = o.seq.unwrap_or(0);
    let (entry, exit) = match o.host {
        Some(h) => h,
        None => {
            let e = earliest[&(o.comm.clone(), seq)];
            (e, e)
        }
    };
    let r = CollectiveRecord {
        pid: pid(rank),
        rank,
        comm_id: comm_id(&o.comm),
        seq,
        op: o.op,
        bytes: o.bytes,
        peer: o.peer,
        host_entry_ns: entry,
        host_exit_ns: exit.max(entry),
        gpu_arrive_ns: if o.gpu_start_ns != 0 {
            o.gpu_start_ns.max(entry)
        } else {
            0
        },
        gpu_done_ns: if o.gpu_end_ns != 0 {
            o.gpu_end_ns.max(o.gpu_start_ns).max(entry)
        } else {
            0
        },
        launches_before: 0,
        sync_wait_ns_before: 0,
        gpu_busy_before_ns: o.gpu_busy_before_ns,
        ret: 0,
    };
    let done = r.host_exit_ns.max(r.gpu_done_ns).max(r.host_entry_ns);
    (done, r)
}

/// Cuts `recs` (in shipping order) into batches every [`BATCH_EVERY_NS`]
/// from `created` until `t_end`, `first` carrying the identities.
fn cut_batches(
    first: Batch,
    recs: Vec<(u64, CollectiveRecord)>,
    created: u64,
    t_end: u64,
) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut cur = first;
    let mut cut = created;
    let mut it = recs.into_iter().peekable();
    loop {
        while let Some((_, r)) = it.next_if(|(d, _)| *d <= cut) {
            cur.collectives.push(r);
        }
        cur.seq = batches.len() as u64 + 1;
        cur.mono_ns = cut;
        let next = Batch {
            host: cur.host.clone(),
            agent_id: cur.agent_id.clone(),
            ..Default::default()
        };
        batches.push(std::mem::replace(&mut cur, next));
        if it.peek().is_none() && cut >= t_end {
            break;
        }
        cut += BATCH_EVERY_NS;
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(comm: &str, start: u64, host: Option<(u64, u64)>) -> OpEvent {
        OpEvent {
            comm: comm.into(),
            seq: None,
            op: CollOp::AllReduce,
            bytes: 0,
            peer: -1,
            host,
            gpu_start_ns: start,
            gpu_end_ns: start + 10,
            gpu_busy_before_ns: None,
        }
    }

    #[test]
    fn numbers_by_order_and_stamps_missing_host_at_the_earliest_arrival() {
        let mut t = Timeline {
            world_size: 2,
            ..Default::default()
        };
        t.comms.insert("dp".into(), vec![0, 1]);
        t.ranks.insert(
            0,
            RankTimeline {
                host: "a".into(),
                ops: vec![op("dp", 2_000_000_000, None), op("dp", 1_000_000_000, None)],
            },
        );
        t.ranks.insert(
            1,
            RankTimeline {
                host: "b".into(),
                ops: vec![op("dp", 1_500_000_000, None), op("dp", 2_500_000_000, None)],
            },
        );
        let rec = t.into_recording().unwrap();
        assert_eq!(rec.hosts.len(), 2);
        let all: Vec<&CollectiveRecord> = rec
            .hosts
            .iter()
            .flat_map(|h| &h.batches)
            .flat_map(|b| &b.collectives)
            .collect();
        let r1_seq1 = all.iter().find(|r| r.rank == 1 && r.seq == 1).unwrap();
        assert_eq!(r1_seq1.gpu_arrive_ns, 1_500_000_000);
        assert_eq!(r1_seq1.host_entry_ns, 1_000_000_000);
        let r0_seq2 = all.iter().find(|r| r.rank == 0 && r.seq == 2).unwrap();
        assert_eq!(r0_seq2.host_entry_ns, 2_000_000_000);
        // Every record rides in a batch cut at or after its completion.
        for h in &rec.hosts {
            for b in &h.batches {
                for c in &b.collectives {
                    assert!(c.gpu_done_ns <= b.mono_ns);
                }
            }
            assert_eq!(h.batches[0].ranks.len(), 1);
        }
    }
}

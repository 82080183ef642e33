//! Shared pieces of the fuzz targets: arbitrary batches built field by field
//! (the wire types stay free of an `arbitrary` dependency), real batches from
//! the coordinator's synthetic job, and byte-level edits of an encoding.

use std::sync::OnceLock;

use arbitrary::{Result, Unstructured};
use slowrank_synth::{Generator, SynthSpec};
use slowrank_coordinator::ClockSample;
use slowrank_shared::probe::MAX_ARGS;
use slowrank_shared::wire::{
    Batch, CallRecord, CollOp, CollectiveRecord, CommRecord, FoldedStack, LinkRecord, ProbeDesc,
    RankExit, RankIdentity, RankInterval, StackView, StackWindow,
};

/// Keeps vectors small so one input explores structure, not bulk.
const MAX_LEN: usize = 8;

fn vec_of<T>(
    u: &mut Unstructured,
    mut f: impl FnMut(&mut Unstructured) -> Result<T>,
) -> Result<Vec<T>> {
    let n = u.int_in_range(0..=MAX_LEN)?;
    (0..n).map(|_| f(u)).collect()
}

pub fn coll_op(u: &mut Unstructured) -> Result<CollOp> {
    Ok(*u.choose(&[
        CollOp::AllReduce,
        CollOp::AllGather,
        CollOp::ReduceScatter,
        CollOp::Broadcast,
        CollOp::Reduce,
        CollOp::AllToAll,
        CollOp::Send,
        CollOp::Recv,
    ])?)
}

pub fn collective(u: &mut Unstructured) -> Result<CollectiveRecord> {
    Ok(CollectiveRecord {
        pid: u.arbitrary()?,
        rank: u.arbitrary()?,
        comm_id: u.arbitrary()?,
        seq: u.arbitrary()?,
        op: coll_op(u)?,
        bytes: u.arbitrary()?,
        peer: u.arbitrary()?,
        host_entry_ns: u.arbitrary()?,
        host_exit_ns: u.arbitrary()?,
        gpu_arrive_ns: u.arbitrary()?,
        gpu_done_ns: u.arbitrary()?,
        launches_before: u.arbitrary()?,
        sync_wait_ns_before: u.arbitrary()?,
        gpu_busy_before_ns: u.arbitrary()?,
        ret: u.arbitrary()?,
    })
}

/// Any value of every field: what a hostile or broken agent could encode.
pub fn arbitrary_batch(u: &mut Unstructured) -> Result<Batch> {
    Ok(Batch {
        host: u.arbitrary()?,
        agent_id: u.arbitrary()?,
        seq: u.arbitrary()?,
        mono_ns: u.arbitrary()?,
        wall_ns: u.arbitrary()?,
        ranks: vec_of(u, |u| {
            Ok(RankIdentity {
                pid: u.arbitrary()?,
                rank: u.arbitrary()?,
                world_size: u.arbitrary()?,
                local_rank: u.arbitrary()?,
                local_world_size: u.arbitrary()?,
                group_rank: u.arbitrary()?,
                restart_count: u.arbitrary()?,
                job_id: u.arbitrary()?,
                seen_ns: u.arbitrary()?,
            })
        })?,
        exits: vec_of(u, |u| {
            Ok(RankExit {
                pid: u.arbitrary()?,
                rank: u.arbitrary()?,
                exit_ns: u.arbitrary()?,
            })
        })?,
        comms: vec_of(u, |u| {
            Ok(CommRecord {
                pid: u.arbitrary()?,
                rank: u.arbitrary()?,
                comm_id: u.arbitrary()?,
                parent_id: u.arbitrary()?,
                color: u.arbitrary()?,
                nranks: u.arbitrary()?,
                rank_in_comm: u.arbitrary()?,
                created_ns: u.arbitrary()?,
                split_ordinal: u.arbitrary()?,
                split_key: u.arbitrary()?,
                resumed: u.arbitrary()?,
            })
        })?,
        collectives: vec_of(u, collective)?,
        intervals: vec_of(u, |u| {
            Ok(RankInterval {
                pid: u.arbitrary()?,
                rank: u.arbitrary()?,
                start_ns: u.arbitrary()?,
                end_ns: u.arbitrary()?,
                launches: u.arbitrary()?,
                launch_ns: u.arbitrary()?,
                sync_calls: u.arbitrary()?,
                sync_wait_ns: u.arbitrary()?,
                oncpu_ns: u.arbitrary()?,
                runq_delay_ns: u.arbitrary()?,
                offcpu_ns: u.arbitrary()?,
                launch_counted_ns: u.arbitrary()?,
                probe_hits: u.arbitrary()?,
                probe_cost_ns: u.arbitrary()?,
                trap_pair_ns: u.arbitrary()?,
                launch_duty_ppm: u.arbitrary()?,
                budget_narrowed: u.arbitrary()?,
                agent_cpu_ns: u.arbitrary()?,
            })
        })?,
        links: vec_of(u, |u| {
            Ok(LinkRecord {
                pid: u.arbitrary()?,
                rank: u.arbitrary()?,
                peer_rank: u.arbitrary()?,
                qp_num: u.arbitrary()?,
                dest_qp_num: u.arbitrary()?,
                start_ns: u.arbitrary()?,
                end_ns: u.arbitrary()?,
                posts: u.arbitrary()?,
                completions: u.arbitrary()?,
                post_to_completion_ns: u.arbitrary()?,
                bytes: u.arbitrary()?,
                dlid: u.arbitrary()?,
            })
        })?,
        probes: vec_of(u, |u| {
            Ok(ProbeDesc {
                id: u.arbitrary()?,
                path: u.arbitrary()?,
                symbol: u.arbitrary()?,
            })
        })?,
        calls: vec_of(u, |u| {
            Ok(CallRecord {
                ts_ns: u.arbitrary()?,
                pid: u.arbitrary()?,
                tid: u.arbitrary()?,
                probe: u.arbitrary()?,
                is_return: u.arbitrary()?,
                args: u.arbitrary::<[u64; MAX_ARGS]>()?,
                ret: u.arbitrary()?,
            })
        })?,
        ringbuf_drops: u.arbitrary()?,
        spool_drops: u.arbitrary()?,
        stacks: vec_of(u, |u| {
            Ok(StackWindow {
                rank: u.arbitrary()?,
                view: if u.arbitrary()? {
                    StackView::Cpu
                } else {
                    StackView::Launch
                },
                start_ns: u.arbitrary()?,
                end_ns: u.arbitrary()?,
                strings: u.arbitrary()?,
                stacks: vec_of(u, |u| {
                    Ok(FoldedStack {
                        frames: u.arbitrary()?,
                        weight: u.arbitrary()?,
                    })
                })?,
                records: u.arbitrary()?,
                truncated: u.arbitrary()?,
                overflow_weight: u.arbitrary()?,
            })
        })?,
    })
}

/// A real job: clock samples and a few iterations of batches from two hosts.
pub struct Job {
    pub samples: Vec<(String, ClockSample)>,
    pub batches: Vec<(u64, Batch)>,
}

/// Generated once per fuzzing process.
pub fn job() -> &'static Job {
    static JOB: OnceLock<Job> = OnceLock::new();
    JOB.get_or_init(|| {
        let mut g = Generator::new(SynthSpec::dp(2, 2));
        let mut samples = g.initial_samples();
        let mut batches = Vec::new();
        for _ in 0..4 {
            let out = g.next_iteration();
            samples.extend(out.samples);
            batches.extend(out.batches);
        }
        Job { samples, batches }
    })
}

/// Edits a valid encoding the way a broken network or agent might: flipped
/// bytes, overwritten words, truncation, trailing junk.
pub fn corrupt(u: &mut Unstructured, bytes: &mut Vec<u8>) -> Result<()> {
    let edits = u.int_in_range(0..=8u8)?;
    for _ in 0..edits {
        if bytes.is_empty() {
            break;
        }
        let at = u.choose_index(bytes.len())?;
        match u.int_in_range(0..=4u8)? {
            0 => bytes[at] ^= u.arbitrary::<u8>()?,
            1 => {
                let w: [u8; 4] = u.arbitrary()?;
                for (i, b) in w.into_iter().enumerate() {
                    if let Some(x) = bytes.get_mut(at + i) {
                        *x = b;
                    }
                }
            }
            2 => bytes.truncate(at),
            3 => {
                let junk: Vec<u8> = u.arbitrary()?;
                bytes.extend(junk);
            }
            _ => {
                let w: [u8; 8] = u.arbitrary()?;
                for (i, b) in w.into_iter().enumerate() {
                    if let Some(x) = bytes.get_mut(at + i) {
                        *x = b;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Nudges one field of a real batch to a boundary or random value, so the
/// analyzer sees records that are *almost* right (the hard case).
pub fn mutate_batch(u: &mut Unstructured, b: &mut Batch) -> Result<()> {
    let edge = |u: &mut Unstructured, v: u64| -> Result<u64> {
        Ok(match u.int_in_range(0..=6u8)? {
            0 => 0,
            1 => u64::MAX,
            2 => v.wrapping_add(1),
            3 => v.wrapping_sub(1),
            4 => v.wrapping_add(u.int_in_range(0..=10_000_000_000u64)?),
            5 => v.wrapping_sub(u.int_in_range(0..=10_000_000_000u64)?),
            _ => u.arbitrary()?,
        })
    };
    let n = u.int_in_range(0..=6u8)?;
    for _ in 0..n {
        match u.int_in_range(0..=11u8)? {
            0 => b.seq = edge(u, b.seq)?,
            1 => b.mono_ns = edge(u, b.mono_ns)?,
            2 => b.host = u.arbitrary()?,
            3 if !b.collectives.is_empty() => {
                let i = u.choose_index(b.collectives.len())?;
                let r = &mut b.collectives[i];
                match u.int_in_range(0..=9u8)? {
                    0 => r.seq = edge(u, r.seq)?,
                    1 => r.comm_id = edge(u, r.comm_id)?,
                    2 => r.rank = edge(u, r.rank as u64)? as u32,
                    3 => r.host_entry_ns = edge(u, r.host_entry_ns)?,
                    4 => r.host_exit_ns = edge(u, r.host_exit_ns)?,
                    5 => r.gpu_arrive_ns = edge(u, r.gpu_arrive_ns)?,
                    6 => r.gpu_done_ns = edge(u, r.gpu_done_ns)?,
                    7 => r.peer = edge(u, r.peer as u64)? as i32,
                    8 => r.op = coll_op(u)?,
                    _ => r.ret = u.arbitrary()?,
                }
            }
            4 if !b.collectives.is_empty() => {
                let i = u.choose_index(b.collectives.len())?;
                let r = b.collectives[i].clone();
                b.collectives.push(r);
            }
            5 if !b.comms.is_empty() => {
                let i = u.choose_index(b.comms.len())?;
                let c = &mut b.comms[i];
                match u.int_in_range(0..=3u8)? {
                    0 => c.nranks = edge(u, c.nranks as u64)? as u32,
                    1 => c.rank_in_comm = edge(u, c.rank_in_comm as u64)? as u32,
                    2 => c.comm_id = edge(u, c.comm_id)?,
                    _ => c.rank = edge(u, c.rank as u64)? as u32,
                }
            }
            6 if !b.ranks.is_empty() => {
                let i = u.choose_index(b.ranks.len())?;
                let r = &mut b.ranks[i];
                r.rank = edge(u, r.rank as u64)? as u32;
                r.world_size = edge(u, r.world_size as u64)? as u32;
            }
            7 if !b.links.is_empty() => {
                let i = u.choose_index(b.links.len())?;
                let l = &mut b.links[i];
                l.peer_rank = edge(u, l.peer_rank as u64)? as i64;
                l.start_ns = edge(u, l.start_ns)?;
                l.end_ns = edge(u, l.end_ns)?;
                l.completions = edge(u, l.completions)?;
                l.post_to_completion_ns = edge(u, l.post_to_completion_ns)?;
            }
            8 if !b.intervals.is_empty() => {
                let i = u.choose_index(b.intervals.len())?;
                let x = &mut b.intervals[i];
                x.start_ns = edge(u, x.start_ns)?;
                x.end_ns = edge(u, x.end_ns)?;
                x.launches = edge(u, x.launches)?;
                x.sync_wait_ns = edge(u, x.sync_wait_ns)?;
            }
            9 => b.exits.push(RankExit {
                pid: u.arbitrary()?,
                rank: u.int_in_range(0..=5)?,
                exit_ns: edge(u, b.mono_ns)?,
            }),
            10 => b.collectives.push(collective(u)?),
            _ => {
                b.ringbuf_drops = edge(u, b.ringbuf_drops)?;
                b.spool_drops = edge(u, b.spool_drops)?;
            }
        }
    }
    Ok(())
}

//! `--output FILE`: the records as JSON lines, for debugging and tests.

use std::io::Write;

use serde::Serialize;
use slowrank_shared::wire::Batch;

#[derive(Serialize)]
struct CallLine<'a> {
    host: &'a str,
    seq: u64,
    ts_ns: u64,
    pid: u32,
    tid: u32,
    probe: u32,
    symbol: &'a str,
    kind: &'static str,
    args: [u64; slowrank_shared::probe::MAX_ARGS],
    ret: u64,
}

/// Writes one JSON object per call record in `batch`.
pub fn write_batch(out: &mut impl Write, batch: &Batch) -> std::io::Result<()> {
    for c in &batch.calls {
        let symbol = batch
            .probes
            .iter()
            .find(|p| p.id == c.probe)
            .map_or("?", |p| p.symbol.as_str());
        let line = CallLine {
            host: &batch.host,
            seq: batch.seq,
            ts_ns: c.ts_ns,
            pid: c.pid,
            tid: c.tid,
            probe: c.probe,
            symbol,
            kind: if c.is_return { "return" } else { "entry" },
            args: c.args,
            ret: c.ret,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Writes the folded records of `batch` as JSON lines, one object per
/// record with a `"type"` field (`rank`, `exit`, `comm`, `collective`,
/// `interval`, `batch`), after the raw calls.
pub fn write_records(out: &mut impl Write, batch: &Batch) -> std::io::Result<()> {
    use serde_json::json;
    let host = batch.host.as_str();
    let mut line = |v: serde_json::Value| -> std::io::Result<()> {
        serde_json::to_writer(&mut *out, &v)?;
        out.write_all(b"\n")
    };
    for r in &batch.ranks {
        line(
            json!({"type": "rank", "host": host, "pid": r.pid, "rank": r.rank, "world_size": r.world_size,
            "local_rank": r.local_rank, "local_world_size": r.local_world_size, "group_rank": r.group_rank,
            "restart_count": r.restart_count, "job_id": r.job_id, "seen_ns": r.seen_ns}),
        )?;
    }
    for c in &batch.comms {
        line(
            json!({"type": "comm", "host": host, "pid": c.pid, "rank": c.rank, "comm_id": format!("{:016x}", c.comm_id),
            "parent_id": format!("{:016x}", c.parent_id), "color": c.color, "nranks": c.nranks,
            "rank_in_comm": c.rank_in_comm, "created_ns": c.created_ns,
            "split_ordinal": c.split_ordinal, "split_key": c.split_key, "resumed": c.resumed}),
        )?;
    }
    for c in &batch.collectives {
        line(
            json!({"type": "collective", "host": host, "pid": c.pid, "rank": c.rank,
            "comm_id": format!("{:016x}", c.comm_id), "seq": c.seq, "op": format!("{:?}", c.op), "bytes": c.bytes,
            "peer": c.peer, "host_entry_ns": c.host_entry_ns, "host_exit_ns": c.host_exit_ns,
            "gpu_arrive_ns": c.gpu_arrive_ns, "gpu_done_ns": c.gpu_done_ns, "launches_before": c.launches_before,
            "sync_wait_ns_before": c.sync_wait_ns_before, "ret": c.ret}),
        )?;
    }
    for i in &batch.intervals {
        line(
            json!({"type": "interval", "host": host, "pid": i.pid, "rank": i.rank, "start_ns": i.start_ns,
            "end_ns": i.end_ns, "launches": i.launches, "sync_calls": i.sync_calls, "sync_wait_ns": i.sync_wait_ns,
            "oncpu_ns": i.oncpu_ns, "runq_delay_ns": i.runq_delay_ns, "offcpu_ns": i.offcpu_ns,
            "launch_counted_ns": i.launch_counted_ns, "probe_hits": i.probe_hits,
            "probe_cost_ns": i.probe_cost_ns, "datapath_cost_ns": i.datapath_cost_ns, "trap_pair_ns": i.trap_pair_ns,
            "launch_duty_ppm": i.launch_duty_ppm, "budget_narrowed": i.budget_narrowed,
            "agent_cpu_ns": i.agent_cpu_ns}),
        )?;
    }
    for l in &batch.links {
        line(
            json!({"type": "link", "host": host, "pid": l.pid, "rank": l.rank, "peer_rank": l.peer_rank,
            "qp_num": l.qp_num, "dest_qp_num": l.dest_qp_num, "start_ns": l.start_ns, "end_ns": l.end_ns,
            "posts": l.posts, "completions": l.completions, "post_to_completion_ns": l.post_to_completion_ns,
            "bytes": l.bytes, "dlid": l.dlid}),
        )?;
    }
    for e in &batch.exits {
        line(
            json!({"type": "exit", "host": host, "pid": e.pid, "rank": e.rank, "exit_ns": e.exit_ns}),
        )?;
    }
    line(
        json!({"type": "batch", "host": host, "seq": batch.seq, "mono_ns": batch.mono_ns,
        "ringbuf_drops": batch.ringbuf_drops, "spool_drops": batch.spool_drops,
        "collectives": batch.collectives.len()}),
    )?;
    write_batch(out, batch)
}

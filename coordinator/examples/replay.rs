//! Replays a scenario run's agent records (`DIR/agent-host-*.jsonl`, written
//! by the agents in agent mode) through a fresh [`Analyzer`], offline, and
//! prints the report — to work on the reasoning against real records without
//! re-running the job.
//!
//! ```sh
//! cargo run -p slowrank-coordinator --example replay -- DIR [--json] [--dump-scores]
//! ```
//!
//! Clocks: the run's `report.json` fit (offset, drift, reference) per host
//! becomes a stream of exact clock samples, so alignment is what the live
//! coordinator ended with. Batches are ingested at their cut time plus a
//! fixed delay and ticks run every 500 ms of coordinator time, like `serve`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use slowrank_coordinator::{render_human, render_json, Analyzer, AnalyzerConfig, ClockSample};
use slowrank_shared::wire::{
    Batch, CollOp, CollectiveRecord, CommRecord, LinkRecord, RankExit, RankIdentity, RankInterval,
};

struct HostFit {
    offset_ns: f64,
    ref_agent_ns: f64,
    slope: f64,
}

impl HostFit {
    fn coord(&self, agent_ns: u64) -> u64 {
        (agent_ns as f64 + self.offset_ns + self.slope * (agent_ns as f64 - self.ref_agent_ns))
            as u64
    }
}

fn u(v: &Value, k: &str) -> Result<u64> {
    v.get(k)
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("missing {k} in {v}"))
}

fn i(v: &Value, k: &str) -> Result<i64> {
    v.get(k)
        .and_then(Value::as_i64)
        .ok_or_else(|| anyhow!("missing {k} in {v}"))
}

fn hex(v: &Value, k: &str) -> Result<u64> {
    let s = v
        .get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("missing {k}"))?;
    Ok(u64::from_str_radix(s, 16)?)
}

fn op(s: &str) -> Result<CollOp> {
    Ok(match s {
        "AllReduce" => CollOp::AllReduce,
        "AllGather" => CollOp::AllGather,
        "ReduceScatter" => CollOp::ReduceScatter,
        "Broadcast" => CollOp::Broadcast,
        "Reduce" => CollOp::Reduce,
        "AllToAll" => CollOp::AllToAll,
        "Send" => CollOp::Send,
        "Recv" => CollOp::Recv,
        o => bail!("unknown op {o}"),
    })
}

/// Batches of one host's file, in order.
fn batches(path: &Path, host: &str) -> Result<Vec<Batch>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut cur = Batch {
        host: host.to_owned(),
        agent_id: format!("{host}-replay"),
        ..Default::default()
    };
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)?;
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "rank" => cur.ranks.push(RankIdentity {
                pid: u(&v, "pid")? as u32,
                rank: u(&v, "rank")? as u32,
                world_size: u(&v, "world_size")? as u32,
                local_rank: u(&v, "local_rank")? as u32,
                local_world_size: u(&v, "local_world_size")? as u32,
                group_rank: u(&v, "group_rank")? as u32,
                restart_count: u(&v, "restart_count")? as u32,
                job_id: v["job_id"].as_str().unwrap_or("").to_owned(),
                seen_ns: u(&v, "seen_ns")?,
            }),
            "comm" => cur.comms.push(CommRecord {
                pid: u(&v, "pid")? as u32,
                rank: u(&v, "rank")? as u32,
                comm_id: hex(&v, "comm_id")?,
                parent_id: hex(&v, "parent_id")?,
                color: i(&v, "color")? as i32,
                nranks: u(&v, "nranks")? as u32,
                rank_in_comm: u(&v, "rank_in_comm")? as u32,
                created_ns: u(&v, "created_ns")?,
                split_ordinal: 0,
                split_key: 0,
                resumed: false,
            }),
            "collective" => cur.collectives.push(CollectiveRecord {
                pid: u(&v, "pid")? as u32,
                rank: u(&v, "rank")? as u32,
                comm_id: hex(&v, "comm_id")?,
                seq: u(&v, "seq")?,
                op: op(v["op"].as_str().unwrap_or(""))?,
                bytes: u(&v, "bytes")?,
                peer: i(&v, "peer")? as i32,
                host_entry_ns: u(&v, "host_entry_ns")?,
                host_exit_ns: u(&v, "host_exit_ns")?,
                gpu_arrive_ns: u(&v, "gpu_arrive_ns")?,
                gpu_done_ns: u(&v, "gpu_done_ns")?,
                launches_before: u(&v, "launches_before")? as u32,
                sync_wait_ns_before: u(&v, "sync_wait_ns_before")?,
                gpu_busy_before_ns: v.get("gpu_busy_before_ns").and_then(|x| x.as_u64()),
                ret: i(&v, "ret")? as i32,
            }),
            "interval" => cur.intervals.push(RankInterval {
                pid: u(&v, "pid")? as u32,
                rank: u(&v, "rank")? as u32,
                start_ns: u(&v, "start_ns")?,
                end_ns: u(&v, "end_ns")?,
                launches: u(&v, "launches")?,
                sync_calls: u(&v, "sync_calls")?,
                sync_wait_ns: u(&v, "sync_wait_ns")?,
                // Recordings from before schema 5 counted launches throughout.
                launch_counted_ns: match u(&v, "launch_counted_ns") {
                    Ok(n) => n,
                    Err(_) => u(&v, "end_ns")?.saturating_sub(u(&v, "start_ns")?),
                },
                ..Default::default()
            }),
            "link" => cur.links.push(LinkRecord {
                pid: u(&v, "pid")? as u32,
                rank: u(&v, "rank")? as u32,
                peer_rank: i(&v, "peer_rank")?,
                qp_num: u(&v, "qp_num")? as u32,
                dest_qp_num: u(&v, "dest_qp_num")? as u32,
                start_ns: u(&v, "start_ns")?,
                end_ns: u(&v, "end_ns")?,
                posts: u(&v, "posts")?,
                completions: u(&v, "completions")?,
                post_to_completion_ns: u(&v, "post_to_completion_ns")?,
                bytes: u(&v, "bytes")?,
                dlid: v.get("dlid").and_then(Value::as_u64).unwrap_or(0) as u32,
            }),
            "exit" => cur.exits.push(RankExit {
                pid: u(&v, "pid")? as u32,
                rank: u(&v, "rank")? as u32,
                exit_ns: u(&v, "exit_ns")?,
            }),
            "batch" => {
                cur.seq = u(&v, "seq")? + 1;
                cur.mono_ns = u(&v, "mono_ns")?;
                let next = Batch {
                    host: host.to_owned(),
                    agent_id: cur.agent_id.clone(),
                    ..Default::default()
                };
                out.push(std::mem::replace(&mut cur, next));
            }
            _ => {}
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().ok_or_else(|| anyhow!("usage: replay DIR"))?);
    let json = args.iter().any(|a| a == "--json");
    let report: Value = serde_json::from_str(&fs::read_to_string(dir.join("report.json"))?)?;
    let mut fits = BTreeMap::new();
    for h in report["clock"]["hosts"].as_array().into_iter().flatten() {
        let host = h["host"].as_str().unwrap_or("").to_owned();
        let (Some(off), Some(r), Some(d)) = (
            h["offset_us"].as_f64(),
            h["reference_agent_ns"].as_f64(),
            h["drift_ppm"].as_f64(),
        ) else {
            continue;
        };
        // drift_ppm = -slope / (1 + slope) · 1e6
        let x = d * 1e-6;
        fits.insert(
            host,
            HostFit {
                offset_ns: off * 1e3,
                ref_agent_ns: r,
                slope: -x / (1.0 + x),
            },
        );
    }
    let a = Analyzer::new(AnalyzerConfig::default());
    // (coordinator receive time, batch) over every host.
    let mut all: Vec<(u64, Batch)> = Vec::new();
    for e in fs::read_dir(&dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(h) = name
            .strip_prefix("agent-host-")
            .and_then(|s| s.strip_suffix(".jsonl"))
        else {
            continue;
        };
        let host = format!("host-{h}");
        let fit = fits
            .get(&host)
            .ok_or_else(|| anyhow!("no clock for {host} in report.json"))?;
        for b in batches(&p, &host)? {
            all.push((fit.coord(b.mono_ns) + 2_000_000, b));
        }
    }
    all.sort_by_key(|x| x.0);
    let Some(first) = all.first().map(|x| x.0) else {
        bail!("no batches");
    };
    let last = all.last().map_or(first, |x| x.0);
    // Exact probes every 100 ms per host (20 µs round trips).
    let mut t = first.saturating_sub(2_000_000_000);
    let mut next_tick = first;
    let mut bi = 0;
    while t <= last + 5_000_000_000 {
        for (host, fit) in &fits {
            // Agent time whose coordinator time is t (one Newton step is plenty).
            let mut ag = t as f64 - fit.offset_ns;
            ag -= fit.slope * (ag - fit.ref_agent_ns);
            let s = ClockSample {
                coord_send_ns: t - 10_000,
                agent_mono_ns: ag as u64,
                agent_hold_ns: 0,
                coord_recv_ns: t + 10_000,
                udp: false,
            };
            let _ = a.add_clock_sample(host, s);
        }
        while bi < all.len() && all[bi].0 <= t {
            a.ingest(&all[bi].1, all[bi].0);
            bi += 1;
        }
        if t >= next_tick {
            for e in a.tick(t as i64) {
                eprintln!("{}", e.line);
            }
            next_tick += 500_000_000;
        }
        t += 100_000_000;
    }
    let r = a.report();
    if json {
        println!("{}", render_json(&r)?);
    } else {
        print!("{}", render_human(&r));
    }
    Ok(())
}

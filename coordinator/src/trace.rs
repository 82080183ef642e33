//! Chrome / Perfetto trace (`{"traceEvents": [...]}`) of the aligned timeline.
//!
//! One process per section (a verdict, or "recent collectives"), one track
//! (thread) per rank. Each member's part of an instance is drawn as a `wait`
//! slice from its arrival to the last arrival (named after who it waited
//! for) and a `transfer` slice from the last arrival to completion, so a
//! person sees the others waiting for the slow rank. Times are µs on the
//! coordinator clock, relative to the section's first instance.

use std::collections::{BTreeSet, HashMap};

use serde_json::{json, Value};

use crate::join::op_name;
use crate::stats::AlignedInstance;

pub struct Section<'a> {
    pub title: String,
    /// Ranks the section is about (sorted first, marked).
    pub focus: Vec<u32>,
    pub instances: Vec<&'a AlignedInstance>,
}

pub fn render(sections: &[Section<'_>], hosts: &HashMap<u32, String>) -> Value {
    let mut ev: Vec<Value> = Vec::new();
    for (pid, s) in sections.iter().enumerate() {
        let pid = pid + 1;
        ev.push(json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": s.title}}));
        let t0 = s
            .instances
            .iter()
            .map(|i| i.arrival.iter().min().copied().unwrap_or(i.start))
            .min()
            .unwrap_or(0);
        let us = |t: i64| (t - t0) as f64 / 1e3;
        let ranks: BTreeSet<u32> = s
            .instances
            .iter()
            .flat_map(|i| i.members.iter().map(|m| m.rank))
            .collect();
        for r in &ranks {
            let host = hosts.get(r).map_or("?", |h| h.as_str());
            let mark = if s.focus.contains(r) { " ◀" } else { "" };
            ev.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": r, "args": {"name": format!("rank {r} ({host}){mark}")}}));
            let order = if s.focus.contains(r) { -1 } else { *r as i64 };
            ev.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": r, "args": {"sort_index": order}}));
        }
        for i in &s.instances {
            let last_rank = i.members[i.last].rank;
            let last = i.arrival[i.last];
            let label = format!("{} {:#x}#{}", op_name(i.op), i.comm_id, i.key.display_seq());
            for (k, m) in i.members.iter().enumerate() {
                let a = i.arrival[k];
                ev.push(json!({"ph": "i", "s": "t", "name": "host enqueue", "pid": pid, "tid": m.rank, "ts": us(m.host_entry)}));
                if last > a {
                    ev.push(json!({
                        "ph": "X", "pid": pid, "tid": m.rank, "ts": us(a), "dur": (last - a) as f64 / 1e3,
                        "name": format!("wait for rank {last_rank}"), "cat": "wait",
                        "args": {"instance": label, "wait_us": (last - a) as f64 / 1e3, "basis": format!("{:?}", i.basis)}
                    }));
                }
                let end = m.gpu_done.unwrap_or(i.end).max(last);
                ev.push(json!({
                    "ph": "X", "pid": pid, "tid": m.rank, "ts": us(last), "dur": ((end - last).max(1)) as f64 / 1e3,
                    "name": label, "cat": "transfer",
                    "args": {"lateness_us": i.lateness[k] / 1e3, "clock_error_us": i.err_ns / 1e3}
                }));
            }
        }
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ms"})
}

//! Chrome / Perfetto trace (`{"traceEvents": [...]}`) of the aligned timeline.
//!
//! One process per section (a verdict, or "recent collectives"), one track
//! (thread) per rank. Each member's part of an instance is drawn as a `wait`
//! slice from its arrival to the last arrival (named after who it waited
//! for) and a `transfer` slice from the last arrival to completion, so a
//! person sees the others waiting for the slow rank. Times are µs on the
//! coordinator clock, relative to the section's first instance.
//!
//! A section shows at most [`MAX_TRACKS`] ranks: the focus, the ranks the
//! others waited for, then the lowest-numbered others. A 1,000-rank job's
//! full timeline is unreadable and costs seconds to render; the process
//! name says how many ranks were left out.

use std::collections::{BTreeSet, HashMap};

use serde_json::{json, Value};

use crate::classify::stats::AlignedInstance;
use crate::join::op_name;

/// Rank tracks per section at most.
pub const MAX_TRACKS: usize = 32;

/// The ranks a section shows (see the module docs).
fn shown_ranks(s: &Section<'_>) -> (BTreeSet<u32>, usize) {
    let all: BTreeSet<u32> = s
        .instances
        .iter()
        .flat_map(|i| i.members.iter().map(|m| m.rank))
        .collect();
    if all.len() <= MAX_TRACKS {
        let n = all.len();
        return (all, n);
    }
    let mut shown: BTreeSet<u32> = s
        .focus
        .iter()
        .copied()
        .filter(|r| all.contains(r))
        .collect();
    // The ranks everyone waited for, most often first.
    let mut last: HashMap<u32, usize> = HashMap::new();
    for i in &s.instances {
        *last.entry(i.members[i.last].rank).or_default() += 1;
    }
    let mut by_count: Vec<(u32, usize)> = last.into_iter().collect();
    by_count.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (r, _) in by_count {
        if shown.len() >= MAX_TRACKS / 2 {
            break;
        }
        shown.insert(r);
    }
    for r in &all {
        if shown.len() >= MAX_TRACKS {
            break;
        }
        shown.insert(*r);
    }
    (shown, all.len())
}

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
        let (ranks, total) = shown_ranks(s);
        let title = if ranks.len() < total {
            format!("{} ({} of {total} ranks shown)", s.title, ranks.len())
        } else {
            s.title.clone()
        };
        ev.push(json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": title}}));
        let t0 = s
            .instances
            .iter()
            .map(|i| i.arrival.iter().min().copied().unwrap_or(i.start))
            .min()
            .unwrap_or(0);
        let us = |t: i64| (t - t0) as f64 / 1e3;
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
                if !ranks.contains(&m.rank) {
                    continue;
                }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use slowrank_shared::wire::{CollOp, CollectiveRecord};

    use super::*;
    use crate::classify::stats::align;
    use crate::join::{InstanceKey, JoinedInstance, Member};

    /// A 200-rank all-reduce where `slow` arrives last.
    fn big(seq: u64, slow: u32) -> AlignedInstance {
        let n = 200u32;
        let members = (0..n)
            .map(|r| Member {
                rank: r,
                rank_in_comm: r,
                host: Arc::from(format!("h{}", r / 8).as_str()),
                rec: CollectiveRecord {
                    pid: 0,
                    rank: r,
                    comm_id: 1,
                    seq,
                    op: CollOp::AllReduce,
                    bytes: 0,
                    peer: -1,
                    host_entry_ns: 1_000 + u64::from(r) + if r == slow { 50_000 } else { 0 },
                    host_exit_ns: 2_000,
                    gpu_arrive_ns: 0,
                    gpu_done_ns: 0,
                    launches_before: 0,
                    sync_wait_ns_before: 0,
                    gpu_busy_before_ns: None,
                    ret: 0,
                },
            })
            .collect();
        let j = JoinedInstance {
            comm_id: 1,
            key: InstanceKey::Coll(seq),
            comm_nranks: n,
            op: CollOp::AllReduce,
            bytes: 0,
            members,
        };
        align(&j, &|_, t| (t as i64, 0.0))
    }

    #[test]
    fn large_jobs_show_the_focus_and_who_was_waited_for_not_every_rank() {
        let insts: Vec<AlignedInstance> = (0..4).map(|s| big(s, 150)).collect();
        let section = Section {
            title: "rank 7 compute-slow".into(),
            focus: vec![7],
            instances: insts.iter().collect(),
        };
        let trace = render(&[section], &HashMap::new());
        let ev = trace["traceEvents"].as_array().expect("events");
        let tracks: BTreeSet<u64> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["tid"].as_u64().expect("tid"))
            .collect();
        assert_eq!(tracks.len(), MAX_TRACKS);
        assert!(tracks.contains(&7), "the focus rank has a track");
        assert!(
            tracks.contains(&150),
            "the rank everyone waited for has one"
        );
        let title = ev
            .iter()
            .find(|e| e["name"] == "process_name")
            .and_then(|e| e["args"]["name"].as_str())
            .expect("title");
        assert!(title.contains("32 of 200 ranks shown"), "{title}");
        // Only shown ranks get slices.
        assert!(ev
            .iter()
            .filter_map(|e| e["tid"].as_u64())
            .all(|t| tracks.contains(&t)));
    }
}

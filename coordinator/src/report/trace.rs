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
//! name says how many ranks were left out. The whole trace is bounded by
//! [`MAX_TRACE_BYTES`].

use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::classify::stats::AlignedInstance;
use crate::join::op_name;

/// Rank tracks per section at most.
pub const MAX_TRACKS: usize = 32;

/// `trace.json` (compact JSON) is at most this long. A verdict's section
/// is a few hundred instances of 32 tracks (a few MiB); 32 MiB leaves room
/// for many verdicts and is still what Perfetto opens in a browser tab,
/// whatever agents send. Past it the oldest sections' slices are cut and
/// the trace says how many ([`bound_size`]).
pub const MAX_TRACE_BYTES: usize = 32 << 20;

/// Cuts `ev` to fit `max_bytes` of compact JSON (with the wrapper): track
/// names and the other metadata are kept, then the newest slices (the
/// last sections are the latest verdicts) while they fit; a pid-0 process
/// named for the cut, and a `truncated` note (as `report.json`'s), say
/// how many slices were left out. Unchanged when it fits.
fn bound_size(ev: Vec<Value>, max_bytes: usize) -> Value {
    let len = |v: &Value| serde_json::to_string(v).map_or(usize::MAX, |j| j.len());
    let whole = json!({"traceEvents": ev, "displayTimeUnit": "ms"});
    if len(&whole) <= max_bytes {
        return whole;
    }
    let Value::Object(mut whole) = whole else {
        unreachable!("built as an object above")
    };
    let Some(Value::Array(ev)) = whole.remove("traceEvents") else {
        unreachable!("built with traceEvents above")
    };
    // The wrapper and the note take a few hundred bytes.
    let room = max_bytes.saturating_sub(1024);
    let (meta, slices): (Vec<Value>, Vec<Value>) = ev.into_iter().partition(|e| e["ph"] == "M");
    // One comma each.
    let mut used: usize = meta.iter().map(|e| len(e) + 1).sum();
    let mut kept = Vec::new();
    let mut left_out = 0u64;
    for e in slices.into_iter().rev() {
        let n = len(&e) + 1;
        if left_out == 0 && used + n <= room {
            used += n;
            kept.push(e);
        } else {
            left_out += 1;
        }
    }
    let mut meta = meta;
    if used > room {
        // Metadata alone overflows (thousands of sections): keep what fits.
        let mut u = 0;
        let before = meta.len();
        meta.retain(|e| {
            u += len(e) + 1;
            u <= room
        });
        left_out += (before - meta.len()) as u64;
    }
    kept.reverse();
    let note = format!("trace cut to fit {max_bytes} bytes: {left_out} oldest events left out");
    let mut out =
        vec![json!({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": note}})];
    out.extend(meta);
    out.extend(kept);
    json!({
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "truncated": {"bound_bytes": max_bytes, "left_out": {"events": left_out}},
    })
}

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
    bound_size(ev, MAX_TRACE_BYTES)
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
    fn a_trace_past_its_bound_keeps_the_newest_slices_and_says_what_it_cut() {
        let insts: Vec<AlignedInstance> = (0..40).map(|s| big(s, 150)).collect();
        let section = |t: &str| Section {
            title: t.into(),
            focus: vec![7],
            instances: insts.iter().collect(),
        };
        let sections = [section("old verdict"), section("new verdict")];
        let full = render(&sections, &HashMap::new());
        assert!(full.get("truncated").is_none(), "a normal trace is not cut");
        let full_len = serde_json::to_string(&full).unwrap().len();
        let ev = full["traceEvents"].as_array().unwrap().clone();
        let n = ev.len() as u64;
        let bound = full_len / 3;
        let cut = bound_size(ev, bound);
        assert!(serde_json::to_string(&cut).unwrap().len() <= bound);
        let left = cut["truncated"]["left_out"]["events"].as_u64().unwrap();
        let kept = cut["traceEvents"].as_array().unwrap();
        assert!(left > 0);
        // Everything but the pid-0 note is either kept or counted.
        assert_eq!(kept.len() as u64 - 1 + left, n);
        assert!(kept[0]["args"]["name"]
            .as_str()
            .unwrap()
            .contains("left out"));
        // Both sections keep their names; the slices kept are the newest.
        assert_eq!(
            kept.iter().filter(|e| e["name"] == "process_name").count(),
            3
        );
        let pids: BTreeSet<u64> = kept
            .iter()
            .filter(|e| e["ph"] != "M")
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids, BTreeSet::from([2]));
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

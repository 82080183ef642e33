//! slowrank's own recorded agent records: `agent-host-N.jsonl` (what
//! `slowrank-agent --output` and a scenario run write; `.jsonl.gz` too) and
//! each host's clock fit from `clock.json`, `live-report.json` or the run's
//! `report.json` (the first found beside the records).
//!
//! Version-tolerant on purpose: lines are read as JSON objects, unknown
//! `type`s and fields are skipped, and fields the agent added later default
//! to 0, so a wire-schema bump does not invalidate a recording. A field the
//! analysis cannot do without is an error naming the file and line.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;
use slowrank_shared::wire::{
    Batch, CollOp, CollectiveRecord, CommRecord, LinkRecord, RankExit, RankIdentity, RankInterval,
};

use super::{HostFit, HostRecording, Recording, ReplayError};

/// Reads a file, gunzipping it when its name ends in `.gz`.
pub fn read_text(path: &Path) -> Result<String, ReplayError> {
    let bytes = std::fs::read(path).map_err(|e| ReplayError::io(path, e))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut s)
            .map_err(|e| ReplayError::format(path, format!("not a readable gzip file: {e}")))?;
        Ok(s)
    } else {
        String::from_utf8(bytes).map_err(|_| ReplayError::format(path, "not UTF-8 text"))
    }
}

pub fn op_from_name(s: &str) -> Option<CollOp> {
    Some(match s {
        "AllReduce" => CollOp::AllReduce,
        "AllGather" => CollOp::AllGather,
        "ReduceScatter" => CollOp::ReduceScatter,
        "Broadcast" => CollOp::Broadcast,
        "Reduce" => CollOp::Reduce,
        "AllToAll" => CollOp::AllToAll,
        "Send" => CollOp::Send,
        "Recv" => CollOp::Recv,
        _ => return None,
    })
}

/// One line's object, with errors that say where.
struct Line<'a> {
    v: &'a Value,
    path: &'a Path,
    no: usize,
}

impl Line<'_> {
    fn err(&self, what: String) -> ReplayError {
        ReplayError::format(self.path, format!("line {}: {what}", self.no))
    }
    fn u(&self, k: &str) -> Result<u64, ReplayError> {
        self.v
            .get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| self.err(format!("missing or non-integer field {k:?}")))
    }
    fn u32(&self, k: &str) -> Result<u32, ReplayError> {
        let x = self.u(k)?;
        u32::try_from(x).map_err(|_| self.err(format!("field {k:?} = {x} is out of range")))
    }
    fn i(&self, k: &str) -> Result<i64, ReplayError> {
        self.v
            .get(k)
            .and_then(Value::as_i64)
            .ok_or_else(|| self.err(format!("missing or non-integer field {k:?}")))
    }
    /// A counter the agent added later: absent means 0.
    fn opt(&self, k: &str) -> u64 {
        self.v.get(k).and_then(Value::as_u64).unwrap_or(0)
    }
    fn opt_some(&self, k: &str) -> Option<u64> {
        self.v.get(k).and_then(Value::as_u64)
    }
    fn hex(&self, k: &str) -> Result<u64, ReplayError> {
        let s = self
            .v
            .get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| self.err(format!("missing field {k:?}")))?;
        u64::from_str_radix(s, 16).map_err(|_| self.err(format!("field {k:?} = {s:?} is not hex")))
    }
    fn s(&self, k: &str) -> String {
        self.v
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    }
}

impl Line<'_> {
    fn rank_record(&self) -> Result<RankIdentity, ReplayError> {
        Ok(RankIdentity {
            pid: self.u32("pid")?,
            rank: self.u32("rank")?,
            world_size: self.u32("world_size")?,
            local_rank: self.opt("local_rank") as u32,
            local_world_size: self.opt("local_world_size") as u32,
            group_rank: self.opt("group_rank") as u32,
            restart_count: self.opt("restart_count") as u32,
            job_id: self.s("job_id"),
            seen_ns: self.u("seen_ns")?,
        })
    }

    fn comm_record(&self) -> Result<CommRecord, ReplayError> {
        Ok(CommRecord {
            pid: self.u32("pid")?,
            rank: self.u32("rank")?,
            comm_id: self.hex("comm_id")?,
            parent_id: self.hex("parent_id").unwrap_or(0),
            color: self.i("color").unwrap_or(-1) as i32,
            nranks: self.u32("nranks")?,
            rank_in_comm: self.u32("rank_in_comm")?,
            created_ns: self.opt("created_ns"),
            split_ordinal: self.opt("split_ordinal") as u32,
            split_key: self.i("split_key").unwrap_or(0) as i32,
            resumed: self
                .v
                .get("resumed")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }

    fn collective_record(&self) -> Result<CollectiveRecord, ReplayError> {
        let name = self.s("op");
        Ok(CollectiveRecord {
            pid: self.u32("pid")?,
            rank: self.u32("rank")?,
            comm_id: self.hex("comm_id")?,
            seq: self.u("seq")?,
            op: op_from_name(&name)
                .ok_or_else(|| self.err(format!("unknown collective op {name:?}")))?,
            bytes: self.opt("bytes"),
            peer: self.i("peer").unwrap_or(-1) as i32,
            host_entry_ns: self.u("host_entry_ns")?,
            host_exit_ns: self.opt("host_exit_ns"),
            gpu_arrive_ns: self.opt("gpu_arrive_ns"),
            gpu_done_ns: self.opt("gpu_done_ns"),
            launches_before: self.opt("launches_before") as u32,
            sync_wait_ns_before: self.opt("sync_wait_ns_before"),
            gpu_busy_before_ns: self.opt_some("gpu_busy_before_ns"),
            ret: self.i("ret").unwrap_or(0) as i32,
        })
    }

    fn interval_record(&self) -> Result<RankInterval, ReplayError> {
        let (start_ns, end_ns) = (self.u("start_ns")?, self.u("end_ns")?);
        Ok(RankInterval {
            pid: self.u32("pid")?,
            rank: self.u32("rank")?,
            start_ns,
            end_ns,
            launches: self.opt("launches"),
            launch_ns: self.opt("launch_ns"),
            sync_calls: self.opt("sync_calls"),
            sync_wait_ns: self.opt("sync_wait_ns"),
            oncpu_ns: self.opt("oncpu_ns"),
            runq_delay_ns: self.opt("runq_delay_ns"),
            offcpu_ns: self.opt("offcpu_ns"),
            // Agents before wire schema 5 counted launches all the
            // time: the whole interval.
            launch_counted_ns: self
                .v
                .get("launch_counted_ns")
                .and_then(Value::as_u64)
                .unwrap_or(end_ns.saturating_sub(start_ns)),
            probe_hits: self.opt("probe_hits"),
            probe_cost_ns: self.opt("probe_cost_ns"),
            datapath_cost_ns: self.opt("datapath_cost_ns"),
            trap_pair_ns: self.opt("trap_pair_ns") as u32,
            launch_duty_ppm: self.opt("launch_duty_ppm") as u32,
            budget_narrowed: self
                .v
                .get("budget_narrowed")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            // Not recorded before wire schema 7.
            agent_cpu_ns: self.opt("agent_cpu_ns"),
        })
    }

    fn link_record(&self) -> Result<LinkRecord, ReplayError> {
        Ok(LinkRecord {
            pid: self.u32("pid")?,
            rank: self.u32("rank")?,
            peer_rank: self.i("peer_rank").unwrap_or(-1),
            qp_num: self.u32("qp_num")?,
            dest_qp_num: self.opt("dest_qp_num") as u32,
            start_ns: self.u("start_ns")?,
            end_ns: self.u("end_ns")?,
            posts: self.opt("posts"),
            completions: self.opt("completions"),
            post_to_completion_ns: self.opt("post_to_completion_ns"),
            bytes: self.opt("bytes"),
            dlid: self.opt("dlid") as u32,
        })
    }

    fn exit_record(&self) -> Result<RankExit, ReplayError> {
        Ok(RankExit {
            pid: self.u32("pid")?,
            rank: self.u32("rank")?,
            exit_ns: self.u("exit_ns")?,
        })
    }
}

/// The batches of one agent's JSON-lines output, in order. `default_host`
/// names the host when the lines do not.
pub fn parse_agent_lines(
    text: &str,
    path: &Path,
    default_host: &str,
) -> Result<(String, Vec<Batch>), ReplayError> {
    let mut host: Option<String> = None;
    let mut out = Vec::new();
    let mut cur = Batch::default();
    let mut lines = 0usize;
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(raw).map_err(|e| {
            ReplayError::format(path, format!("line {}: not a JSON object: {e}", i + 1))
        })?;
        let l = Line {
            v: &v,
            path,
            no: i + 1,
        };
        let Some(ty) = v.get("type").and_then(Value::as_str) else {
            // Raw call lines (generic probes) carry no `type`.
            continue;
        };
        lines += 1;
        if let Some(h) = v.get("host").and_then(Value::as_str) {
            match &host {
                None => host = Some(h.to_owned()),
                Some(had) if had != h => {
                    return Err(l.err(format!(
                        "host {h:?} in a file of host {had:?}: one file per agent"
                    )))
                }
                Some(_) => {}
            }
        }
        match ty {
            "rank" => cur.ranks.push(l.rank_record()?),
            "comm" => cur.comms.push(l.comm_record()?),
            "collective" => cur.collectives.push(l.collective_record()?),
            "interval" => cur.intervals.push(l.interval_record()?),
            "link" => cur.links.push(l.link_record()?),
            "exit" => cur.exits.push(l.exit_record()?),
            "batch" => {
                cur.seq = l.u("seq")? + 1;
                cur.mono_ns = l.u("mono_ns")?;
                cur.wall_ns = l.opt("wall_ns");
                cur.ringbuf_drops = l.opt("ringbuf_drops");
                cur.spool_drops = l.opt("spool_drops");
                out.push(std::mem::take(&mut cur));
            }
            // Newer record kinds are skipped, not refused.
            _ => {}
        }
    }
    if lines == 0 {
        return Err(ReplayError::format(
            path,
            "no slowrank agent records (lines with a \"type\" field)",
        ));
    }
    keep_unclosed_tail(cur, &mut out);
    let host = host.unwrap_or_else(|| default_host.to_owned());
    for b in &mut out {
        b.host = host.clone();
        b.agent_id = format!("{host}-replay");
    }
    Ok((host, out))
}

/// The agent stopped before closing its last batch (a truncated file):
/// its records are kept, cut where the last one ends.
fn keep_unclosed_tail(mut cur: Batch, out: &mut Vec<Batch>) {
    let has_tail = !(cur.ranks.is_empty()
        && cur.comms.is_empty()
        && cur.collectives.is_empty()
        && cur.intervals.is_empty()
        && cur.links.is_empty()
        && cur.exits.is_empty());
    if !has_tail {
        return;
    }
    cur.seq = out.last().map_or(1, |b: &Batch| b.seq + 1);
    cur.mono_ns = cur
        .collectives
        .iter()
        .map(|c| c.host_exit_ns.max(c.gpu_done_ns).max(c.host_entry_ns))
        .chain(cur.intervals.iter().map(|i| i.end_ns))
        .chain(cur.links.iter().map(|i| i.end_ns))
        .chain(out.last().map(|b| b.mono_ns))
        .max()
        .unwrap_or(0);
    out.push(cur);
}

/// Each host's clock fit from `clock.json` or `report.json` (the object's
/// `clock.hosts`, or a top-level `hosts`, each with `host`, `offset_us`,
/// `reference_agent_ns`, `drift_ppm`).
pub fn parse_clock_fits(text: &str, path: &Path) -> Result<BTreeMap<String, HostFit>, ReplayError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ReplayError::format(path, format!("not JSON: {e}")))?;
    let hosts = v
        .pointer("/clock/hosts")
        .or_else(|| v.get("hosts"))
        .and_then(Value::as_array)
        .ok_or_else(|| ReplayError::format(path, "no clock.hosts (or hosts) array"))?;
    let mut fits = BTreeMap::new();
    for h in hosts {
        let Some(name) = h.get("host").and_then(Value::as_str) else {
            return Err(ReplayError::format(path, "a clock host without \"host\""));
        };
        let (Some(off), Some(r), Some(d)) = (
            h.get("offset_us").and_then(Value::as_f64),
            h.get("reference_agent_ns").and_then(Value::as_f64),
            h.get("drift_ppm").and_then(Value::as_f64),
        ) else {
            // A host the live coordinator never fitted: no usable clock.
            continue;
        };
        fits.insert(name.to_owned(), HostFit::from_report(off, r, d));
    }
    Ok(fits)
}

/// The agent files of a recorded run directory, sorted by name.
pub fn agent_files(dir: &Path) -> Result<Vec<PathBuf>, ReplayError> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| ReplayError::io(dir, e))? {
        let p = e.map_err(|e| ReplayError::io(dir, e))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("agent-") && (name.ends_with(".jsonl") || name.ends_with(".jsonl.gz")) {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// Reads recorded agent records: each path is a run directory (its
/// `agent-*.jsonl[.gz]` and `clock.json` or `report.json`) or one agent
/// file (its clock then from `clock.json`/`report.json` beside it).
pub fn load(paths: &[PathBuf]) -> Result<Recording, ReplayError> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let f = agent_files(p)?;
            if f.is_empty() {
                return Err(ReplayError::format(
                    p,
                    "no agent-*.jsonl or agent-*.jsonl.gz files in this directory",
                ));
            }
            files.extend(f);
        } else {
            files.push(p.clone());
        }
    }
    let mut fits = BTreeMap::new();
    let mut clock_files = Vec::new();
    for f in &files {
        let dir = f.parent().unwrap_or(Path::new("."));
        for name in ["clock.json", "live-report.json", "report.json"] {
            let c = dir.join(name);
            if c.is_file() && !clock_files.contains(&c) {
                clock_files.push(c.clone());
                for (h, fit) in parse_clock_fits(&read_text(&c)?, &c)? {
                    fits.entry(h).or_insert(fit);
                }
                break;
            }
        }
    }
    let mut hosts: BTreeMap<String, HostRecording> = BTreeMap::new();
    for f in &files {
        let stem = f
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .trim_end_matches(".gz")
            .trim_end_matches(".jsonl")
            .trim_start_matches("agent-")
            .to_owned();
        let (host, batches) = parse_agent_lines(&read_text(f)?, f, &stem)?;
        let fit = *fits.get(&host).ok_or_else(|| {
            ReplayError::format(
                f,
                format!(
                    "no clock fit for host {host:?}: put the run's report.json or a clock.json \
                     (clock.hosts with offset_us, reference_agent_ns, drift_ppm) beside it"
                ),
            )
        })?;
        if hosts.contains_key(&host) {
            return Err(ReplayError::format(
                f,
                format!("host {host:?} is recorded twice"),
            ));
        }
        hosts.insert(host.clone(), HostRecording { host, fit, batches });
    }
    let mut rec = Recording {
        hosts: hosts.into_values().collect(),
        ..Default::default()
    };
    let jobs: std::collections::BTreeSet<(String, u32)> = rec
        .hosts
        .iter()
        .flat_map(|h| &h.batches)
        .flat_map(|b| &b.ranks)
        .map(|r| (r.job_id.clone(), r.world_size))
        .collect();
    if jobs.len() > 1 {
        return Err(ReplayError::MixedJobs(format!(
            "rank identities name {} different (job id, world size) pairs: {:?}",
            jobs.len(),
            jobs
        )));
    }
    rec.world_size = jobs.iter().next().map(|j| j.1);
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &str = r#"{"type":"rank","host":"host-0","pid":7,"rank":0,"world_size":2,"job_id":"j","seen_ns":5}
{"type":"comm","host":"host-0","pid":7,"rank":0,"comm_id":"00000000000000ab","nranks":2,"rank_in_comm":0,"future_field":1}
{"type":"collective","host":"host-0","pid":7,"rank":0,"comm_id":"00000000000000ab","seq":1,"op":"AllReduce","host_entry_ns":10}
{"type":"brand_new_kind","host":"host-0"}
{"type":"batch","host":"host-0","seq":0,"mono_ns":20}
{"type":"collective","host":"host-0","pid":7,"rank":0,"comm_id":"00000000000000ab","seq":2,"op":"AllReduce","host_entry_ns":30,"host_exit_ns":31}
"#;

    #[test]
    fn tolerant_of_new_and_missing_fields_and_keeps_an_unclosed_tail() {
        let (host, b) = parse_agent_lines(LINES, Path::new("x.jsonl"), "h").unwrap();
        assert_eq!(host, "host-0");
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].collectives[0].comm_id, 0xab);
        assert_eq!(b[0].comms[0].color, -1);
        assert_eq!(b[1].mono_ns, 31);
        assert_eq!(b[1].seq, 2);
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let bad = "{\"type\":\"collective\",\"host\":\"h\",\"pid\":1,\"rank\":0,\"comm_id\":\"zz\",\"seq\":1,\"op\":\"AllReduce\",\"host_entry_ns\":1}\n";
        let e = parse_agent_lines(bad, Path::new("a.jsonl"), "h").unwrap_err();
        assert!(e.to_string().contains("a.jsonl: line 1"), "{e}");
        assert!(e.to_string().contains("comm_id"), "{e}");
        let e = parse_agent_lines("{\"type\": \"ra", Path::new("a.jsonl"), "h").unwrap_err();
        assert!(e.to_string().contains("not a JSON object"), "{e}");
    }

    #[test]
    fn clock_fit_round_trips_agent_and_coord() {
        let f = HostFit::from_report(2500.0, 1e9, 30.0);
        for a in [1_000_000_000u64, 5_000_000_000, 90_000_000_000] {
            let c = f.coord(a);
            assert!((f.agent(c) as i64 - a as i64).abs() <= 2);
        }
        let fits = parse_clock_fits(
            r#"{"clock":{"hosts":[{"host":"h","offset_us":1.0,"reference_agent_ns":0,"drift_ppm":0}]}}"#,
            Path::new("r.json"),
        )
        .unwrap();
        assert_eq!(fits["h"].coord(1000), 2000);
    }
}

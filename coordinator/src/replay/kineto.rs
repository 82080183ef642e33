//! PyTorch profiler (Kineto) traces, one JSON or `.json.gz` per rank.
//!
//! * rank, world size and process groups from `distributedInfo`;
//! * each collective from its `c10d::*` CPU op (host entry and exit); with
//!   NCCL, the `record_param_comms` op inside it gives the process group
//!   (`Process Group Name` + `Process Group Ranks`), the sizes and, on
//!   recent profilers, `Seq`; the GPU start and end come from the NCCL
//!   kernel the op launched (the `cuda_runtime` launch inside the op and the
//!   kernel share a `correlation` id);
//! * with gloo (CPU), the work runs on gloo's thread as `gloo:<collective>`
//!   events: the k-th of a kind on a rank is the k-th `c10d::` op of that
//!   kind, and stands for the device side;
//! * ops without process-group arguments (gloo, older or filtered traces)
//!   belong to the default group (`distributedInfo.pg_config`, else all
//!   ranks); without `Seq` an instance is numbered by its order per (rank,
//!   group);
//! * steps from `ProfilerStep#N` (checked across ranks: two jobs mixed do
//!   not share step numbers);
//! * clocks: each file is one host; hosts are aligned the way the
//!   coordinator refines live clocks: collectives that complete together end
//!   at the same true time, so each host's offset is the median difference of
//!   its collective ends against an aligned peer's, with their spread as the
//!   error bound.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use slowrank_shared::wire::CollOp;

use super::records::read_text;
use super::timeline::{OpEvent, RankTimeline, Timeline};
use super::{HostFit, Recording, ReplayError, MIN_HALF_RTT_NS};

#[derive(Debug, Deserialize)]
struct Trace {
    #[serde(rename = "distributedInfo")]
    distributed: Option<DistInfo>,
    #[serde(rename = "traceEvents")]
    events: Option<Vec<Event>>,
    /// Recent profilers name the machine: ranks on one machine share a clock.
    host_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DistInfo {
    rank: Option<u32>,
    world_size: Option<u32>,
    #[serde(default)]
    pg_config: Vec<PgConfig>,
    backend: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PgConfig {
    pg_name: Option<String>,
    pg_desc: Option<String>,
    #[serde(default)]
    ranks: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    tid: Value,
    ts: Option<f64>,
    dur: Option<f64>,
    #[serde(default)]
    args: serde_json::Map<String, Value>,
}

impl Event {
    fn span_ns(&self) -> Option<(u64, u64)> {
        let ts = self.ts?;
        let dur = self.dur.unwrap_or(0.0).max(0.0);
        if !ts.is_finite() || ts <= 0.0 {
            return None;
        }
        let a = (ts * 1e3).round() as u64;
        Some((a, a + (dur * 1e3).round() as u64))
    }
    fn arg_u64(&self, k: &str) -> Option<u64> {
        self.args.get(k).and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_f64().map(|f| f as u64))
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
    }
}

/// The collective's kind, normalized across `c10d::allreduce_`,
/// `record_param_comms`' `allreduce`, `gloo:all_reduce`,
/// `c10d::_allgather_base_`: lowercase letters only, without `base`.
fn kind(name: &str) -> String {
    let n = name
        .trim_start_matches("c10d::")
        .trim_start_matches("gloo:")
        .trim_start_matches("nccl:")
        .replace("_base", "")
        .replace("_coalesced", "")
        .replace("_into_tensor", "");
    n.chars()
        .filter(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_lowercase()
}

fn op_of(kind: &str) -> Option<CollOp> {
    Some(match kind {
        "allreduce" | "barrier" => CollOp::AllReduce,
        "allgather" => CollOp::AllGather,
        "reducescatter" => CollOp::ReduceScatter,
        "broadcast" => CollOp::Broadcast,
        "reduce" => CollOp::Reduce,
        "alltoall" | "alltoallv" => CollOp::AllToAll,
        "send" => CollOp::Send,
        "recv" | "recvanysource" => CollOp::Recv,
        _ => return None,
    })
}

fn dtype_bytes(s: &str) -> u64 {
    match s.to_ascii_lowercase().as_str() {
        "double" | "long" | "int64" | "float64" | "complexfloat" => 8,
        "float" | "int" | "int32" | "float32" => 4,
        "half" | "bfloat16" | "short" | "float16" => 2,
        _ => 1,
    }
}

/// One rank's file, read.
#[derive(Debug, Clone)]
pub struct RankTrace {
    pub path: PathBuf,
    pub rank: u32,
    pub world_size: u32,
    pub backend: String,
    /// The machine (one clock): `host_name` when the trace has it, else one
    /// per rank (`rank-N`).
    pub host: String,
    /// Process groups the file declares: name → ranks.
    pub groups: BTreeMap<String, Vec<u32>>,
    pub default_group: Option<String>,
    pub ops: Vec<OpEvent>,
    /// `ProfilerStep#N` numbers seen.
    pub steps: BTreeSet<u64>,
    /// Ops that fell back to the default group for lack of arguments.
    pub defaulted: u64,
    /// Point-to-point ops skipped (no peer in the trace).
    pub p2p: u64,
}

fn group_name(name: &str, ranks: &[u32]) -> String {
    format!(
        "pg {name} [{}]",
        ranks
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// The trace's rank and world size, checked.
fn rank_and_world(d: &DistInfo, path: &Path) -> Result<(u32, u32), ReplayError> {
    let rank = d
        .rank
        .ok_or_else(|| ReplayError::format(path, "distributedInfo has no rank"))?;
    let world = d
        .world_size
        .ok_or_else(|| ReplayError::format(path, "distributedInfo has no world_size"))?;
    if rank >= world {
        return Err(ReplayError::format(
            path,
            format!("distributedInfo rank {rank} is not below world_size {world}"),
        ));
    }
    Ok((rank, world))
}

/// The trace's process groups by full name, and the default one's name
/// (the `default_pg`, else the first spanning the world, else the world).
fn process_groups(pgs: &[PgConfig], world: u32) -> (BTreeMap<String, Vec<u32>>, String) {
    let mut groups = BTreeMap::new();
    let mut default_group = None;
    for g in pgs {
        let name = g.pg_name.clone().unwrap_or_default();
        let ranks = if g.ranks.is_empty() {
            (0..world).collect()
        } else {
            g.ranks.clone()
        };
        let full = group_name(&name, &ranks);
        if g.pg_desc.as_deref() == Some("default_pg")
            || (default_group.is_none() && ranks.len() as u32 == world)
        {
            default_group = Some(full.clone());
        }
        groups.insert(full, ranks);
    }
    let default_group = default_group.unwrap_or_else(|| {
        let full = group_name("world", &(0..world).collect::<Vec<_>>());
        groups.insert(full.clone(), (0..world).collect());
        full
    });

    (groups, default_group)
}

/// A trace's events by what they are to the replay.
struct Sorted<'a> {
    c10d: Vec<&'a Event>,
    rpc: Vec<&'a Event>,
    /// Thread → (launch ts, correlation), in time order.
    runtime: BTreeMap<String, Vec<(u64, u64)>>,
    /// Correlation → NCCL kernel span.
    kernels: BTreeMap<u64, (u64, u64)>,
    /// Gloo op kind → its runs, in time order.
    gloo: BTreeMap<String, VecDeque<(u64, u64)>>,
    steps: BTreeSet<u64>,
}

fn sort_events(events: &[Event]) -> Sorted<'_> {
    let mut c10d: Vec<&Event> = Vec::new();
    let mut rpc: Vec<&Event> = Vec::new();
    let mut runtime: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new(); // tid → (ts, correlation)
    let mut kernels: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // correlation → span
    let mut gloo: BTreeMap<String, VecDeque<(u64, u64)>> = BTreeMap::new();
    let mut steps = BTreeSet::new();
    for e in events {
        if e.ph != "X" {
            continue;
        }
        if e.name.starts_with("c10d::") && e.cat == "cpu_op" {
            c10d.push(e);
        } else if e.name == "record_param_comms" {
            rpc.push(e);
        } else if e.cat == "cuda_runtime" {
            if let (Some((a, _)), Some(c)) = (e.span_ns(), e.arg_u64("correlation")) {
                runtime.entry(tid(e)).or_default().push((a, c));
            }
        } else if e.cat == "kernel"
            && (e.name.starts_with("ncclKernel") || e.name.starts_with("ncclDevKernel"))
        {
            if let (Some(s), Some(c)) = (e.span_ns(), e.arg_u64("correlation")) {
                kernels.insert(c, s);
            }
        } else if let Some(k) = e.name.strip_prefix("gloo:") {
            if let Some(s) = e.span_ns() {
                gloo.entry(kind(k)).or_default().push_back(s);
            }
        } else if let Some(n) = e.name.strip_prefix("ProfilerStep#") {
            if let Ok(n) = n.parse() {
                steps.insert(n);
            }
        }
    }
    for v in runtime.values_mut() {
        v.sort_unstable();
    }
    for v in gloo.values_mut() {
        v.make_contiguous().sort_unstable();
    }
    Sorted {
        c10d,
        rpc,
        runtime,
        kernels,
        gloo,
        steps,
    }
}

/// The thread an event ran on, as a map key.
fn tid(e: &Event) -> String {
    e.tid.to_string()
}

/// Parses one rank's trace.
pub fn parse_rank(text: &str, path: &Path) -> Result<RankTrace, ReplayError> {
    let t: Trace = serde_json::from_str(text).map_err(|e| {
        ReplayError::format(
            path,
            format!("not a PyTorch profiler trace (JSON with traceEvents): {e}"),
        )
    })?;
    let events = t
        .events
        .ok_or_else(|| ReplayError::format(path, "no traceEvents array"))?;
    let d = t.distributed.ok_or_else(|| {
        ReplayError::format(
            path,
            "no distributedInfo: not a trace of a distributed job (profile with \
             torch.distributed initialized)",
        )
    })?;
    let (rank, world) = rank_and_world(&d, path)?;
    let (mut groups, default_group) = process_groups(&d.pg_config, world);
    let mut sorted = sort_events(&events);
    let Collected {
        ops,
        defaulted,
        p2p,
    } = collect_ops(&mut sorted, &mut groups, &default_group);
    if ops.is_empty() {
        return Err(ReplayError::format(
            path,
            "no collectives: neither c10d:: CPU ops nor record_param_comms events",
        ));
    }
    Ok(RankTrace {
        path: path.to_path_buf(),
        rank,
        world_size: world,
        backend: d.backend.unwrap_or_default(),
        host: t
            .host_name
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| format!("rank-{rank}")),
        groups,
        default_group: Some(default_group),
        ops,
        steps: sorted.steps,
        defaulted,
        p2p,
    })
}

/// A rank's collectives, and what was left out or defaulted on the way.
struct Collected {
    ops: Vec<OpEvent>,
    /// Ops that fell back to the default group for lack of arguments.
    defaulted: u64,
    /// Point-to-point ops skipped (no peer in the trace).
    p2p: u64,
}

/// Turns each host-side op into an [`OpEvent`]; groups the ops name that
/// the trace's `pg_config` lacks are added to `groups`.
fn collect_ops(
    sorted: &mut Sorted<'_>,
    groups: &mut BTreeMap<String, Vec<u32>>,
    default_group: &str,
) -> Collected {
    let mut out = Collected {
        ops: Vec::new(),
        defaulted: 0,
        p2p: 0,
    };
    // Nested c10d ops (a coalesced wrapper around its parts) count once:
    // the outermost.
    let mut outer_end: BTreeMap<String, u64> = BTreeMap::new();
    for e in host_side_ops(sorted) {
        let Some((a, b)) = e.span_ns() else { continue };
        let th = tid(e);
        if outer_end.get(&th).is_some_and(|end| a < *end) {
            continue;
        }
        outer_end.insert(th.clone(), b);
        let params = params_of(e, &sorted.rpc, &th, (a, b));
        let coll_name = params
            .and_then(|p| p.args.get("Collective name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| e.name.clone());
        let k = kind(&coll_name);
        let Some(op) = op_of(&k) else { continue };
        if matches!(op, CollOp::Send | CollOp::Recv) {
            // The peer of a p2p op is not in the trace's arguments, and a
            // send without its peer cannot be joined.
            out.p2p += 1;
            continue;
        }
        let comm = match params.and_then(named_group) {
            Some((name, ranks)) => {
                let full = group_name(&name, &ranks);
                groups.entry(full.clone()).or_insert(ranks);
                full
            }
            None => {
                out.defaulted += 1;
                default_group.to_owned()
            }
        };
        let (gs, ge) = device_span(sorted, &th, (a, b), &k).unwrap_or((0, 0));
        out.ops.push(OpEvent {
            comm,
            seq: params.and_then(|p| p.arg_u64("Seq").or_else(|| p.arg_u64("seq"))),
            op,
            bytes: params.and_then(message_bytes).unwrap_or(0),
            peer: -1,
            host: Some((a, b.max(a))),
            gpu_start_ns: gs.max(a),
            gpu_end_ns: if ge != 0 { ge.max(gs).max(a) } else { 0 },
            gpu_busy_before_ns: None,
        });
    }
    out
}

/// The ops that stand for each collective's host side, in time order (the
/// outer of two at one time first): the `c10d::` CPU ops, or, in a trace
/// with record_param_comms but no c10d ops (older profilers), the
/// record_param_comms ops themselves. Leaves `sorted.rpc` in time order.
fn host_side_ops<'a>(sorted: &mut Sorted<'a>) -> Vec<&'a Event> {
    let by_ts = |a: &&Event, b: &&Event| {
        a.ts.unwrap_or(0.0)
            .total_cmp(&b.ts.unwrap_or(0.0))
            .then(b.dur.unwrap_or(0.0).total_cmp(&a.dur.unwrap_or(0.0)))
    };
    sorted.c10d.sort_by(by_ts);
    sorted.rpc.sort_by(by_ts);
    if sorted.c10d.is_empty() {
        sorted.rpc.clone()
    } else {
        std::mem::take(&mut sorted.c10d)
    }
}

/// The host op's record_param_comms: itself, else the first on the same
/// thread starting inside its span `(a, b)`.
fn params_of<'a>(
    e: &'a Event,
    rpc: &[&'a Event],
    th: &str,
    (a, b): (u64, u64),
) -> Option<&'a Event> {
    if e.name == "record_param_comms" {
        Some(e)
    } else {
        rpc.iter()
            .find(|r| tid(r) == th && r.span_ns().is_some_and(|(ra, _)| ra >= a && ra <= b))
            .copied()
    }
}

/// The process group record_param_comms names: its name and ranks.
fn named_group(p: &Event) -> Option<(String, Vec<u32>)> {
    Some((
        p.args.get("Process Group Name")?.as_str()?.to_owned(),
        serde_json::from_str::<Vec<u32>>(p.args.get("Process Group Ranks")?.as_str()?).ok()?,
    ))
}

/// The message size record_param_comms gives: elements × dtype size.
fn message_bytes(p: &Event) -> Option<u64> {
    let n = p.arg_u64("In msg nelems")?;
    let dt = p.args.get("dtype").and_then(Value::as_str).unwrap_or("");
    Some(n * dtype_bytes(dt))
}

/// The device side of a host op spanning `(a, b)` on thread `th`: the NCCL
/// kernel launched inside the op, else the gloo thread's next run of kind
/// `k` (taken, so the k-th gloo run goes with the k-th op of its kind).
fn device_span(
    sorted: &mut Sorted<'_>,
    th: &str,
    (a, b): (u64, u64),
    k: &str,
) -> Option<(u64, u64)> {
    let launched = sorted.runtime.get(th).and_then(|v| {
        let i = v.partition_point(|x| x.0 < a);
        v[i..]
            .iter()
            .take_while(|x| x.0 <= b)
            .find_map(|x| sorted.kernels.get(&x.1).copied())
    });
    launched.or_else(|| sorted.gloo.get_mut(k).and_then(VecDeque::pop_front))
}

/// Per-host clock offsets from collective ends (see the module doc): the
/// lowest rank's host is the reference; each other host is aligned against
/// the hosts already aligned, through the instances they share, the host
/// sharing the most first. Ranks of one host share its clock.
fn align(
    host_of: &BTreeMap<u32, String>,
    seqd: &BTreeMap<u32, Vec<(String, u64, u64)>>,
) -> BTreeMap<String, HostFit> {
    // (comm, seq) → (host, end) per member.
    let mut ends: BTreeMap<(&str, u64), Vec<(&str, u64)>> = BTreeMap::new();
    for (r, v) in seqd {
        for (c, s, e) in v {
            ends.entry((c.as_str(), *s))
                .or_default()
                .push((host_of[r].as_str(), *e));
        }
    }
    let mut fits: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let Some(first) = host_of.values().next() else {
        return BTreeMap::new();
    };
    fits.insert(first.as_str(), (0.0, 0.0));
    let hosts: BTreeSet<&str> = host_of.values().map(String::as_str).collect();
    loop {
        let mut best: Option<(&str, usize, f64, f64)> = None;
        for &h in hosts.iter().filter(|h| !fits.contains_key(*h)) {
            let mut diffs = Vec::new();
            for members in ends.values() {
                for &(_, mine) in members.iter().filter(|m| m.0 == h) {
                    for &(p, theirs) in members {
                        if let Some(&(off, _)) = fits.get(p) {
                            diffs.push(theirs as f64 + off - mine as f64);
                        }
                    }
                }
            }
            if diffs.is_empty() {
                continue;
            }
            diffs.sort_by(f64::total_cmp);
            let med = diffs[diffs.len() / 2];
            let mut dev: Vec<f64> = diffs.iter().map(|d| (d - med).abs()).collect();
            dev.sort_by(f64::total_cmp);
            let mad = dev[dev.len() / 2];
            if best.as_ref().is_none_or(|b| diffs.len() > b.1) {
                best = Some((h, diffs.len(), med, mad));
            }
        }
        let Some((h, _, off, mad)) = best else { break };
        fits.insert(h, (off, mad));
    }
    fits.into_iter()
        .map(|(h, (off, mad))| {
            (
                h.to_owned(),
                HostFit {
                    offset_ns: off,
                    half_rtt_ns: (mad as u64).max(MIN_HALF_RTT_NS),
                    ..HostFit::IDENTITY
                },
            )
        })
        .collect()
}

/// Imports one file per rank.
pub fn load(paths: &[PathBuf], progress: &mut dyn FnMut(f64)) -> Result<Recording, ReplayError> {
    let ranks = read_ranks(paths, progress)?;
    let Some(any) = ranks.values().next() else {
        return Err(ReplayError::Empty("no trace files given".into()));
    };
    let world = any.world_size;
    let mut t = Timeline {
        job_id: format!("kineto-{world}"),
        world_size: world,
        ..Default::default()
    };
    for r in ranks.values() {
        for (g, members) in &r.groups {
            t.comms.entry(g.clone()).or_insert_with(|| members.clone());
        }
        t.notes.extend(rank_notes(r));
        t.ranks.insert(
            r.rank,
            RankTimeline {
                host: r.host.clone(),
                ops: r.ops.clone(),
            },
        );
    }
    check_group_ranks(&t.comms, world)?;
    let host_of: BTreeMap<u32, String> = ranks.iter().map(|(r, t)| (*r, t.host.clone())).collect();
    let fits = align(&host_of, &instance_ends(&t.ranks));
    t.notes.extend(clock_notes(&host_of, &fits));
    t.fits = fits;
    t.steps = ranks
        .values()
        .map(|r| r.steps.len() as u64)
        .filter(|n| *n > 0)
        .min();
    let missing: Vec<u32> = (0..world).filter(|r| !ranks.contains_key(r)).collect();
    if !missing.is_empty() {
        t.notes.push(format!(
            "{} of {world} ranks have no trace and were not observed: {}",
            missing.len(),
            compact(&missing)
        ));
    }
    progress(1.0);
    t.into_recording()
}

/// Reads every file, by rank; files that cannot be of one job (a rank
/// twice, two world sizes, no step in common) are refused.
fn read_ranks(
    paths: &[PathBuf],
    progress: &mut dyn FnMut(f64),
) -> Result<BTreeMap<u32, RankTrace>, ReplayError> {
    let mut ranks: BTreeMap<u32, RankTrace> = BTreeMap::new();
    for (i, p) in paths.iter().enumerate() {
        let r = parse_rank(&read_text(p)?, p)?;
        if let Some(prev) = ranks.get(&r.rank) {
            return Err(ReplayError::MixedJobs(format!(
                "{} and {} are both rank {}",
                prev.path.display(),
                p.display(),
                r.rank
            )));
        }
        if let Some(other) = ranks.values().next() {
            check_same_job(other, &r, p)?;
        }
        ranks.insert(r.rank, r);
        progress((i + 1) as f64 / paths.len() as f64 * 0.5);
    }
    Ok(ranks)
}

/// `r` (read from `p`) and `other` must agree on the world size and share
/// a profiler step when both have steps.
fn check_same_job(other: &RankTrace, r: &RankTrace, p: &Path) -> Result<(), ReplayError> {
    if other.world_size != r.world_size {
        return Err(ReplayError::MixedJobs(format!(
            "{} says world size {}, {} says {}",
            other.path.display(),
            other.world_size,
            p.display(),
            r.world_size
        )));
    }
    if !other.steps.is_empty() && !r.steps.is_empty() && other.steps.is_disjoint(&r.steps) {
        return Err(ReplayError::MixedJobs(format!(
            "{} has ProfilerSteps {:?}..{:?}, {} has {:?}..{:?}: no step in common",
            other.path.display(),
            other.steps.first(),
            other.steps.last(),
            p.display(),
            r.steps.first(),
            r.steps.last()
        )));
    }
    Ok(())
}

/// What the timeline's notes say of one rank's file: ops defaulted to a
/// group, p2p ops skipped.
fn rank_notes(r: &RankTrace) -> Vec<String> {
    let mut notes = Vec::new();
    if r.defaulted > 0 {
        notes.push(format!(
            "{}: {} collectives carry no process-group arguments; taken as {}",
            r.path.display(),
            r.defaulted,
            r.default_group.as_deref().unwrap_or("the default group")
        ));
    }
    if r.p2p > 0 {
        notes.push(format!(
            "{}: {} send/recv ops skipped (the trace does not name their peer)",
            r.path.display(),
            r.p2p
        ));
    }
    notes
}

/// Groups must only name ranks of the world; a group's members that are
/// not in the input were not observed.
fn check_group_ranks(comms: &BTreeMap<String, Vec<u32>>, world: u32) -> Result<(), ReplayError> {
    for (g, members) in comms {
        if let Some(bad) = members.iter().find(|m| **m >= world) {
            return Err(ReplayError::MixedJobs(format!(
                "process group {g} names rank {bad} in a world of {world}"
            )));
        }
    }
    Ok(())
}

/// Per rank, its all-reduce / all-gather / reduce-scatter instances as
/// (communicator, instance number, end), numbered now (the timeline would)
/// to align clocks on them.
fn instance_ends(ranks: &BTreeMap<u32, RankTimeline>) -> BTreeMap<u32, Vec<(String, u64, u64)>> {
    let mut seqd: BTreeMap<u32, Vec<(String, u64, u64)>> = BTreeMap::new();
    for (r, tl) in ranks {
        let mut ops = tl.ops.clone();
        ops.sort_by_key(|o| o.host.map_or(o.gpu_start_ns, |h| h.0));
        let mut next: BTreeMap<String, u64> = BTreeMap::new();
        for o in ops {
            let n = next.entry(o.comm.clone()).or_insert(0);
            *n += 1;
            let s = o.seq.unwrap_or(*n);
            let end = if o.gpu_end_ns != 0 {
                o.gpu_end_ns
            } else {
                o.host.map_or(0, |h| h.1)
            };
            if matches!(
                o.op,
                CollOp::AllReduce | CollOp::AllGather | CollOp::ReduceScatter
            ) {
                seqd.entry(*r).or_default().push((o.comm.clone(), s, end));
            }
        }
    }
    seqd
}

/// Each aligned host's offset against the reference (the lowest rank's
/// host), and the hosts that could not be aligned.
fn clock_notes(host_of: &BTreeMap<u32, String>, fits: &BTreeMap<String, HostFit>) -> Vec<String> {
    let mut notes = Vec::new();
    let reference = host_of.values().next().cloned().unwrap_or_default();
    for (h, fit) in fits {
        if h != &reference {
            notes.push(format!(
                "{h}: clock offset {:+.1} µs against {reference} from collective ends (±{:.1} µs)",
                fit.offset_ns / 1e3,
                fit.half_rtt_ns as f64 / 1e3
            ));
        }
    }
    for h in host_of.values().collect::<BTreeSet<_>>() {
        if !fits.contains_key(h) {
            notes.push(format!(
                "{h} shares no collective with the other hosts: its clock is taken as is"
            ));
        }
    }
    notes
}

/// "0-3, 7, 9-12".
pub fn compact(v: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_normalize_across_spellings() {
        assert_eq!(kind("c10d::allreduce_"), "allreduce");
        assert_eq!(kind("gloo:all_reduce"), "allreduce");
        assert_eq!(kind("c10d::_allgather_base_"), "allgather");
        assert_eq!(kind("allgather_into_tensor_coalesced"), "allgather");
        assert_eq!(op_of(&kind("c10d::alltoall_base_")), Some(CollOp::AllToAll));
        assert_eq!(compact(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
    }

    #[test]
    fn gloo_shape_pairs_cpu_ops_with_the_gloo_thread_in_order() {
        let t = r#"{"distributedInfo":{"backend":"gloo","rank":1,"world_size":2,
          "pg_config":[{"pg_name":"0","pg_desc":"default_pg","ranks":[0,1]}]},
          "traceEvents":[
          {"ph":"X","cat":"cpu_op","name":"c10d::allreduce_","tid":1,"ts":100.0,"dur":5.0},
          {"ph":"X","cat":"cpu_op","name":"c10d::allreduce_","tid":1,"ts":200.0,"dur":5.0},
          {"ph":"X","cat":"cpu_op","name":"gloo:all_reduce","tid":9,"ts":103.0,"dur":50.0},
          {"ph":"X","cat":"cpu_op","name":"gloo:all_reduce","tid":9,"ts":204.0,"dur":40.0},
          {"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","tid":1,"ts":90.0,"dur":200.0}]}"#;
        let r = parse_rank(t, Path::new("r1.json")).unwrap();
        assert_eq!(r.rank, 1);
        assert_eq!(r.ops.len(), 2);
        assert_eq!(r.ops[1].gpu_start_ns, 204_000);
        assert_eq!(r.ops[1].gpu_end_ns, 244_000);
        assert_eq!(r.ops[0].comm, "pg 0 [0,1]");
        assert_eq!(r.defaulted, 2);
        assert!(r.steps.contains(&3));
    }

    #[test]
    fn foreign_json_is_a_clear_error() {
        let e = parse_rank(r#"{"traceEvents":[]}"#, Path::new("x.json")).unwrap_err();
        assert!(e.to_string().contains("x.json: no distributedInfo"), "{e}");
        let e = parse_rank("[1,2", Path::new("y.json")).unwrap_err();
        assert!(
            e.to_string()
                .contains("y.json: not a PyTorch profiler trace"),
            "{e}"
        );
    }
}

//! The what-if study's parquet traces (OSDI'25 "Understanding Stragglers in
//! Large Model Training Using What-if Analysis"): one row per GPU operation
//! with `dp_rank`, `stage`, `rank`, `step`, `optype`, `start_ts`, `duration`
//! (seconds from one shared origin per step) and `seq_id`, and the job
//! layout in `meta-<trial>.yaml` beside the file.
//!
//! Communicators follow from the op type and the layout: data-parallel ops
//! (`params-all-gather`, `grads-reduce-scatter`) run in the dp group of one
//! stage; pipeline p2p between neighbouring stages of one dp rank (one
//! communicator per direction and stage pair); `embedding-grads-all-reduce`
//! between the first and last stage of one dp rank;
//! `optimizer-clip-main-grad` over every worker. Compute, optimizer and gc
//! rows are not communication; `layernorm-grads-all-reduce` runs in the
//! tensor-parallel group, of which the trace keeps one worker, so it cannot
//! be joined and is skipped (both counted in the notes). The trace has no
//! host side: see [`super::timeline`] for how host times are stamped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use slowrank_shared::wire::CollOp;

use super::records::read_text;
use super::timeline::{OpEvent, RankTimeline, Timeline, TIME_BASE_NS};
use super::{Recording, ReplayError};

/// Idle time put between two recorded steps when they are laid end to end
/// (the trace keeps sampled steps, each with its own origin): long enough
/// that no op of one step overlaps the next, short against a step.
pub const STEP_GAP_NS: u64 = 10_000_000;

/// GPUs per host, to place workers on hosts: the study's clusters are
/// 8-GPU machines. Only grouping in the report depends on it; the trace's
/// clocks are aligned at source.
pub const GPUS_PER_HOST: u32 = 8;

/// The job layout from `meta-*.yaml` (flat `key: value` lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub dp: u32,
    pub pp: u32,
    pub tp: u32,
    pub world: u32,
}

pub fn parse_meta(text: &str, path: &Path) -> Result<Layout, ReplayError> {
    let mut kv = BTreeMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            kv.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    let get = |k: &str| -> Result<u32, ReplayError> {
        kv.get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ReplayError::format(path, format!("missing or non-integer {k}")))
    };
    let l = Layout {
        dp: get("dp_size")?,
        pp: get("pp_size")?,
        tp: get("tp_size")?,
        world: get("world_size")?,
    };
    if l.dp == 0 || l.pp == 0 || l.tp == 0 || !l.world.is_multiple_of(l.dp * l.pp * l.tp) {
        return Err(ReplayError::format(
            path,
            format!("impossible layout {l:?}"),
        ));
    }
    Ok(l)
}

/// One row of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub dp: u32,
    pub stage: u32,
    pub rank: u32,
    pub step: i64,
    pub optype: String,
    pub start_s: f64,
    pub duration_s: f64,
    pub seq_id: i64,
}

fn int(f: &Field) -> Option<i64> {
    Some(match f {
        Field::Byte(x) => i64::from(*x),
        Field::Short(x) => i64::from(*x),
        Field::Int(x) => i64::from(*x),
        Field::Long(x) => *x,
        Field::UByte(x) => i64::from(*x),
        Field::UShort(x) => i64::from(*x),
        Field::UInt(x) => i64::from(*x),
        Field::ULong(x) => i64::try_from(*x).ok()?,
        _ => return None,
    })
}

fn float(f: &Field) -> Option<f64> {
    Some(match f {
        Field::Float(x) => f64::from(*x),
        Field::Double(x) => *x,
        _ => int(f)? as f64,
    })
}

/// Reads every row; `progress` gets the fraction read.
pub fn read_rows(path: &Path, progress: &mut dyn FnMut(f64)) -> Result<Vec<Row>, ReplayError> {
    let file = std::fs::File::open(path).map_err(|e| ReplayError::io(path, e))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| ReplayError::format(path, format!("not a readable parquet file: {e}")))?;
    let total = reader.metadata().file_metadata().num_rows().max(1) as usize;
    let iter = reader
        .get_row_iter(None)
        .map_err(|e| ReplayError::format(path, format!("cannot read rows: {e}")))?;
    let mut rows = Vec::with_capacity(total);
    for (n, row) in iter.enumerate() {
        let row = row.map_err(|e| ReplayError::format(path, format!("row {n}: {e}")))?;
        let mut r = Row {
            dp: u32::MAX,
            stage: u32::MAX,
            rank: u32::MAX,
            step: i64::MIN,
            optype: String::new(),
            start_s: f64::NAN,
            duration_s: f64::NAN,
            seq_id: i64::MIN,
        };
        for (name, f) in row.get_column_iter() {
            let as_u32 = |f: &Field| int(f).and_then(|x| u32::try_from(x).ok());
            match name.as_str() {
                "dp_rank" => r.dp = as_u32(f).unwrap_or(u32::MAX),
                "stage" => r.stage = as_u32(f).unwrap_or(u32::MAX),
                "rank" => r.rank = as_u32(f).unwrap_or(u32::MAX),
                "step" => r.step = int(f).unwrap_or(i64::MIN),
                "optype" => {
                    if let Field::Str(s) = f {
                        r.optype = s.clone();
                    }
                }
                "start_ts" => r.start_s = float(f).unwrap_or(f64::NAN),
                "duration" => r.duration_s = float(f).unwrap_or(f64::NAN),
                "seq_id" => r.seq_id = int(f).unwrap_or(i64::MIN),
                _ => {}
            }
        }
        let missing = [
            ("dp_rank", r.dp == u32::MAX),
            ("stage", r.stage == u32::MAX),
            ("rank", r.rank == u32::MAX),
            ("step", r.step == i64::MIN),
            ("optype", r.optype.is_empty()),
            ("start_ts", !r.start_s.is_finite()),
            ("duration", !r.duration_s.is_finite() || r.duration_s < 0.0),
            ("seq_id", r.seq_id < 0),
        ];
        if let Some((col, _)) = missing.iter().find(|m| m.1) {
            return Err(ReplayError::format(
                path,
                format!("row {n}: column {col} is missing or invalid"),
            ));
        }
        rows.push(r);
        if n % 16384 == 0 {
            progress(n as f64 / total as f64);
        }
    }
    progress(1.0);
    Ok(rows)
}

/// `meta-<trial>.yaml` beside `trace-<trial>.parquet`.
pub fn meta_path(parquet: &Path) -> PathBuf {
    let name = parquet.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let trial = name
        .trim_end_matches(".parquet")
        .trim_start_matches("trace-");
    parquet.with_file_name(format!("meta-{trial}.yaml"))
}

fn rank_of(l: &Layout, dp: u32, stage: u32) -> u32 {
    // The trace's own convention (README): rank = 16·stage + 4·dp for
    // tp 4 × dp 4, i.e. tp fastest, then dp, then stage.
    stage * l.dp * l.tp + dp * l.tp
}

/// Sets each op's `gpu_busy_before_ns`: how much of the time since the
/// rank's previous op start its GPU spent in `spans` (kernels that are not
/// joined ops). The trace records every GPU op, so an interval it does not
/// cover is an idle GPU — waiting on something the trace does not show,
/// such as a host-side barrier — not the rank's own work.
fn stamp_busy(ops: &mut [OpEvent], mut spans: Vec<(u64, u64)>) {
    spans.sort_unstable();
    // Merge overlaps (compute on one stream, an all-reduce on another).
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    ops.sort_by_key(|o| o.gpu_start_ns);
    // Ops that start together (a batched send and receive) each get the
    // busy time since the previous distinct start: whichever the what-if
    // takes first bounds the gap, the other has none left.
    let (mut to, mut sum) = (0u64, 0u64);
    let mut i = 0usize;
    for o in ops.iter_mut() {
        if o.gpu_start_ns != to {
            let from = to;
            to = o.gpu_start_ns;
            while i < merged.len() && merged[i].1 <= from {
                i += 1;
            }
            sum = 0;
            let mut j = i;
            while j < merged.len() && merged[j].0 < to {
                let (a, b) = merged[j];
                sum += b.min(to).saturating_sub(a.max(from));
                j += 1;
            }
        }
        o.gpu_busy_before_ns = Some(sum);
    }
}

/// The workers present in the trace, as (dp rank, stage).
type Workers = std::collections::BTreeSet<(u32, u32)>;

/// A pipeline communicator's name: `kind` (`pp-fwd`, `pp-bwd`) between
/// stages `a` and `b` of dp rank `dp`.
fn pp_comm(kind: &str, dp: u32, a: u32, b: u32) -> String {
    format!("{kind}/dp{dp}/stage{a}-{b}")
}

/// Builds the timeline of `rows` under `layout`.
pub fn timeline(rows: &[Row], layout: &Layout, path: &Path) -> Result<Timeline, ReplayError> {
    check_layout(rows, layout, path)?;
    let origin = step_origins(rows);
    let workers: Workers = rows.iter().map(|r| (r.dp, r.stage)).collect();
    let mut t = Timeline {
        job_id: path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("study")
            .to_owned(),
        world_size: layout.world,
        comms: layout_comms(layout, &workers),
        groups: layout_groups(layout, &workers),
        ..Default::default()
    };
    let skipped = place_ops(&mut t, rows, layout, &origin);
    for (what, n) in skipped {
        t.notes.push(format!("{n} rows skipped: {what}"));
    }
    let observed = workers.len() as u32;
    if observed < layout.world {
        t.notes.push(format!(
            "{observed} of {} workers are in the trace (one per tensor-parallel group); \
             the others were not observed",
            layout.world
        ));
    }
    t.steps = Some(origin.len() as u64);
    t.notes.push(format!(
        "{} sampled steps laid end to end ({} ms apart)",
        origin.len(),
        STEP_GAP_NS / 1_000_000
    ));
    Ok(t)
}

/// Every row's worker must be one the meta file's layout has (a mismatch
/// means the trace and the meta file are of two different jobs).
fn check_layout(rows: &[Row], layout: &Layout, path: &Path) -> Result<(), ReplayError> {
    for r in rows {
        if r.dp >= layout.dp || r.stage >= layout.pp || r.rank != rank_of(layout, r.dp, r.stage) {
            return Err(ReplayError::format(
                path,
                format!(
                    "worker (dp {}, stage {}, rank {}) does not fit the layout dp {} × pp {} × tp {} \
                     in the meta file: traces of two different jobs?",
                    r.dp, r.stage, r.rank, layout.dp, layout.pp, layout.tp
                ),
            ));
        }
    }
    Ok(())
}

/// Each sampled step's origin on one time line: the steps laid end to
/// end, [`STEP_GAP_NS`] apart.
fn step_origins(rows: &[Row]) -> BTreeMap<i64, u64> {
    let mut span: BTreeMap<i64, f64> = BTreeMap::new();
    for r in rows {
        let e = span.entry(r.step).or_insert(0.0);
        *e = e.max(r.start_s + r.duration_s);
    }
    let mut origin: BTreeMap<i64, u64> = BTreeMap::new();
    let mut at = TIME_BASE_NS;
    for (step, s) in &span {
        origin.insert(*step, at);
        at += (s * 1e9).ceil() as u64 + STEP_GAP_NS;
    }
    origin
}

/// Communicators over the workers present: dp group per stage, pipeline
/// pairs per direction, embedding ends, and the world.
fn layout_comms(layout: &Layout, workers: &Workers) -> BTreeMap<String, Vec<u32>> {
    let mut comms = BTreeMap::new();
    for s in 0..layout.pp {
        let m: Vec<u32> = (0..layout.dp)
            .filter(|d| workers.contains(&(*d, s)))
            .map(|d| rank_of(layout, d, s))
            .collect();
        comms.insert(format!("dp/stage{s}"), m);
    }
    for d in 0..layout.dp {
        for s in 0..layout.pp.saturating_sub(1) {
            let pair = vec![rank_of(layout, d, s), rank_of(layout, d, s + 1)];
            comms.insert(pp_comm("pp-fwd", d, s, s + 1), pair.clone());
            comms.insert(pp_comm("pp-bwd", d, s, s + 1), pair);
        }
        if layout.pp > 1 {
            comms.insert(
                format!("embedding/dp{d}"),
                vec![rank_of(layout, d, 0), rank_of(layout, d, layout.pp - 1)],
            );
        }
    }
    comms.insert(
        "world".into(),
        workers
            .iter()
            .map(|(d, s)| rank_of(layout, *d, *s))
            .collect(),
    );
    comms
}

/// The study decomposes its what-if by dp rank and by stage: the same
/// groups are costed here for the comparison. "all" (every worker at its
/// peers' median at once) is its ideal step: the job's own slowdown.
fn layout_groups(layout: &Layout, workers: &Workers) -> Vec<(String, Vec<u32>)> {
    let mut groups = Vec::new();
    let mut all: Vec<u32> = workers
        .iter()
        .map(|(d, s)| rank_of(layout, *d, *s))
        .collect();
    all.sort_unstable();
    groups.push(("all".into(), all));
    for d in 0..layout.dp {
        let m: Vec<u32> = (0..layout.pp)
            .filter(|s| workers.contains(&(d, *s)))
            .map(|s| rank_of(layout, d, s))
            .collect();
        if !m.is_empty() {
            groups.push((format!("dp {d}"), m));
        }
    }
    for s in 0..layout.pp {
        let m: Vec<u32> = (0..layout.dp)
            .filter(|d| workers.contains(&(*d, s)))
            .map(|d| rank_of(layout, d, s))
            .collect();
        if !m.is_empty() {
            groups.push((format!("stage {s}"), m));
        }
    }
    groups
}

/// The joined op a row of worker (dp `d`, stage `s`) is — its communicator,
/// op and peer within it — or why it is not one (the skip note's words).
fn joined_op(
    optype: &str,
    d: u32,
    s: u32,
    layout: &Layout,
) -> Result<(String, CollOp, i32), &'static str> {
    // A p2p communicator is (lower stage, higher stage): the peer, as a
    // rank within it, is 1 for the lower end and 0 for the higher.
    let (lower, upper) = (0, 1);
    Ok(match optype {
        "params-all-gather" => (format!("dp/stage{s}"), CollOp::AllGather, -1),
        "grads-reduce-scatter" => (format!("dp/stage{s}"), CollOp::ReduceScatter, -1),
        "optimizer-clip-main-grad" => ("world".to_owned(), CollOp::AllReduce, -1),
        "embedding-grads-all-reduce" => (format!("embedding/dp{d}"), CollOp::AllReduce, -1),
        "forward-send" if s + 1 < layout.pp => {
            (pp_comm("pp-fwd", d, s, s + 1), CollOp::Send, upper)
        }
        "forward-recv" if s > 0 => (pp_comm("pp-fwd", d, s - 1, s), CollOp::Recv, lower),
        "backward-send" if s > 0 => (pp_comm("pp-bwd", d, s - 1, s), CollOp::Send, lower),
        "backward-recv" if s + 1 < layout.pp => {
            (pp_comm("pp-bwd", d, s, s + 1), CollOp::Recv, upper)
        }
        other => {
            return Err(match other {
                "forward-compute" | "backward-compute" => "compute",
                "layernorm-grads-all-reduce" => {
                    "layernorm-grads-all-reduce (tensor-parallel group, one worker kept)"
                }
                "optimizer" | "gc" => "optimizer and gc",
                _ => "of an unknown op type or a p2p op past the pipeline's ends",
            })
        }
    })
}

/// Puts each row's joined op on its rank and stamps each rank's GPU busy
/// time; returns the rows skipped, counted by why.
fn place_ops(
    t: &mut Timeline,
    rows: &[Row],
    layout: &Layout,
    origin: &BTreeMap<i64, u64>,
) -> BTreeMap<&'static str, u64> {
    let mut skipped: BTreeMap<&str, u64> = BTreeMap::new();
    // Per rank, when its GPU ran something that is not a joined op
    // (compute, optimizer, a tensor-parallel all-reduce): its own work.
    let mut busy: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for r in rows {
        let base = origin[&r.step];
        let start = base + (r.start_s * 1e9).round().max(0.0) as u64;
        let end = start + (r.duration_s * 1e9).round() as u64;
        let (comm, op, p) = match joined_op(&r.optype, r.dp, r.stage, layout) {
            Ok(joined) => joined,
            Err(why) => {
                *skipped.entry(why).or_default() += 1;
                busy.entry(r.rank).or_default().push((start, end));
                continue;
            }
        };
        t.ranks
            .entry(r.rank)
            .or_insert_with(|| RankTimeline {
                host: format!("node-{}", r.rank / GPUS_PER_HOST),
                ops: Vec::new(),
            })
            .ops
            .push(OpEvent {
                comm,
                // Numbered by start order per (rank, communicator): the dp
                // group carries two op types whose `seq_id`s overlap, and
                // for the others start order is what `seq_id` is.
                seq: None,
                op,
                bytes: 0,
                peer: p,
                host: None,
                gpu_start_ns: start,
                gpu_end_ns: end,
                gpu_busy_before_ns: None,
            });
    }
    for (rank, rt) in t.ranks.iter_mut() {
        let spans = busy.remove(rank).unwrap_or_default();
        stamp_busy(&mut rt.ops, spans);
    }
    skipped
}

/// Imports `paths`: parquet files (their `meta-*.yaml` beside them, or given
/// among `paths`).
pub fn load(paths: &[PathBuf], progress: &mut dyn FnMut(f64)) -> Result<Recording, ReplayError> {
    let metas: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    let files: Vec<&PathBuf> = paths.iter().filter(|p| !metas.contains(p)).collect();
    let [file] = files[..] else {
        return Err(ReplayError::Empty(format!(
            "the study format takes one parquet file (and its meta-*.yaml), got {}",
            files.len()
        )));
    };
    let meta = match metas.first() {
        Some(m) => (*m).clone(),
        None => meta_path(file),
    };
    let layout = parse_meta(&read_text(&meta)?, &meta)?;
    let rows = read_rows(file, progress)?;
    if rows.is_empty() {
        return Err(ReplayError::format(file, "no rows"));
    }
    timeline(&rows, &layout, file)?.into_recording()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(dp: u32, stage: u32, step: i64, op: &str, start: f64, dur: f64, seq: i64) -> Row {
        Row {
            dp,
            stage,
            rank: 8 * stage + 4 * dp,
            step,
            optype: op.into(),
            start_s: start,
            duration_s: dur,
            seq_id: seq,
        }
    }

    const L: Layout = Layout {
        dp: 2,
        pp: 2,
        tp: 4,
        world: 16,
    };

    #[test]
    fn communicators_follow_op_type_and_layout() {
        let rows = vec![
            row(0, 0, 3, "forward-send", 0.1, 0.01, 0),
            row(0, 1, 3, "forward-recv", 0.05, 0.06, 0),
            row(1, 0, 3, "params-all-gather", 0.0, 0.02, 0),
            row(0, 0, 3, "forward-compute", 0.0, 0.1, 0),
            row(0, 0, 5, "forward-send", 0.1, 0.01, 0),
        ];
        let t = timeline(&rows, &L, Path::new("t.parquet")).unwrap();
        let send = &t.ranks[&0].ops[0];
        let recv = &t.ranks[&8].ops[0];
        assert_eq!(send.comm, recv.comm);
        assert_eq!(send.seq, recv.seq);
        assert_eq!((send.op, send.peer, recv.peer), (CollOp::Send, 1, 0));
        assert_eq!(t.ranks[&4].ops[0].comm, "dp/stage0");
        // The second step starts after the first one ended, not at its origin.
        let later = &t.ranks[&0].ops[1];
        assert!(later.gpu_start_ns > send.gpu_end_ns);
        assert!(t
            .notes
            .iter()
            .any(|n| n.contains("1 rows skipped: compute")));
    }

    #[test]
    fn a_worker_outside_the_layout_is_a_clear_error() {
        let rows = vec![row(3, 0, 1, "params-all-gather", 0.0, 0.1, 0)];
        let e = timeline(&rows, &L, Path::new("t.parquet")).unwrap_err();
        assert!(e.to_string().contains("does not fit the layout"), "{e}");
    }

    #[test]
    fn meta_is_read_and_checked() {
        let l = parse_meta(
            "trial_name: AR\ndp_size: 4\npp_size: 4\ntp_size: 4\nworld_size: 64\n",
            Path::new("m.yaml"),
        )
        .unwrap();
        assert_eq!((l.dp, l.pp, l.tp, l.world), (4, 4, 4, 64));
        assert!(parse_meta("dp_size: 4\n", Path::new("m.yaml"))
            .unwrap_err()
            .to_string()
            .contains("pp_size"));
        assert_eq!(
            meta_path(Path::new("/x/trace-AR.parquet")),
            PathBuf::from("/x/meta-AR.yaml")
        );
    }
}

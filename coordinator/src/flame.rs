//! Where the slow rank differs: folded stacks of a flagged rank against the
//! median healthy rank of the same role, as flame graphs (inferno) and a
//! list of the frames that differ most.
//!
//! Shares, not raw weights, are compared: a slow rank runs fewer iterations
//! per second, so only the *distribution* of its time is comparable. The
//! top frames rank call-tree nodes by how much more of the flagged rank's
//! time they hold than the reference's, *beyond what their caller already
//! explains* — so the report names `load_batch`, not every frame under it
//! (`sleep`, `nanosleep`, …) nor every frame above it (`main`).

use std::{
    collections::{BTreeMap, HashMap},
    io::BufReader,
    path::{Path, PathBuf},
};

use slowrank_shared::wire::{StackView, StackWindow};

use crate::verdict::Verdict;

#[derive(Debug, thiserror::Error)]
pub enum FlameError {
    #[error("stack window of rank {rank}: frame index {index} outside its {len} strings")]
    BadIndex { rank: u32, index: u32, len: usize },
    #[error("no stacks for rank {0} in the window")]
    Empty(u32),
    #[error("no healthy reference rank with stacks in the window")]
    NoReference,
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Folded stacks of one rank: `frame;frame;frame` → weight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folded {
    pub stacks: BTreeMap<String, u64>,
}

impl Folded {
    pub fn total(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// Lines in the folded format inferno and flamegraph.pl read.
    pub fn lines(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.stacks {
            s.push_str(k);
            s.push(' ');
            s.push_str(&v.to_string());
            s.push('\n');
        }
        s
    }

    /// Weight per root frame (the thread name in the CPU view).
    fn root_totals(&self) -> HashMap<&str, f64> {
        let mut out: HashMap<&str, f64> = HashMap::new();
        for (stack, &w) in &self.stacks {
            *out.entry(root_of(stack)).or_default() += w as f64;
        }
        out
    }

    /// Inclusive share of every call-tree node (path prefix) in its root's
    /// (thread's) weight: threads come and go and idle differently between
    /// ranks, so comparing within a thread keeps one thread's idling from
    /// outweighing the difference inside another.
    fn tree_shares(&self) -> HashMap<String, f64> {
        let roots = self.root_totals();
        let mut out: HashMap<String, f64> = HashMap::new();
        for (stack, &w) in &self.stacks {
            let total = roots.get(root_of(stack)).copied().unwrap_or(1.0).max(1.0);
            let mut end = 0;
            for (i, frame) in stack.split(';').enumerate() {
                end += frame.len() + usize::from(i > 0);
                *out.entry(stack[..end].to_owned()).or_default() += w as f64 / total;
            }
        }
        out
    }

    /// Share of the weight of `root` (a thread) whose stack contains
    /// `frame` below the root.
    fn frame_share(&self, root: &str, frame: &str) -> f64 {
        let total = self.root_totals().get(root).copied().unwrap_or(0.0);
        if total <= 0.0 {
            return 0.0;
        }
        self.stacks
            .iter()
            .filter(|(k, _)| root_of(k) == root && k.split(';').skip(1).any(|f| f == frame))
            .map(|(_, &w)| w as f64)
            .sum::<f64>()
            / total
    }
}

fn root_of(stack: &str) -> &str {
    stack.split(';').next().unwrap_or("")
}

/// Frames that name nothing: never reported as where a rank differs.
fn uninformative(frame: &str) -> bool {
    frame.starts_with('[') && frame.ends_with(']')
}

/// Folds the windows of `rank` and `view` that overlap `[start_ns, end_ns)`.
/// Frame indices are checked: a bad window is an error, never a panic.
pub fn fold(
    windows: &[StackWindow],
    rank: u32,
    view: StackView,
    start_ns: u64,
    end_ns: u64,
) -> Result<Folded, FlameError> {
    let mut out = Folded::default();
    for w in windows
        .iter()
        .filter(|w| w.rank == rank && w.view == view && w.end_ns > start_ns && w.start_ns < end_ns)
    {
        for s in &w.stacks {
            let mut key = String::new();
            for (i, &ix) in s.frames.iter().enumerate() {
                let name = w.strings.get(ix as usize).ok_or(FlameError::BadIndex {
                    rank,
                    index: ix,
                    len: w.strings.len(),
                })?;
                if i > 0 {
                    key.push(';');
                }
                // ';' separates frames and a trailing number is the count.
                key.push_str(&name.replace(';', ":"));
            }
            if key.is_empty() {
                continue;
            }
            *out.stacks.entry(key).or_default() += s.weight;
        }
    }
    Ok(out)
}

/// Ranks with the same role as `rank` in a Megatron layout
/// (`rank = pp*(dp*tp) + dp_index*tp + tp_index`): same pipeline stage and
/// tensor position, i.e. its data-parallel peers. Excludes `rank`.
pub fn same_role(rank: u32, tp: u32, pp: u32, dp: u32) -> Vec<u32> {
    let (tp, dp) = (tp.max(1), dp.max(1));
    let stage = rank / (dp * tp);
    let tpi = rank % tp;
    (0..dp)
        .map(|d| stage * dp * tp + d * tp + tpi)
        .filter(|&r| r != rank && r < tp * pp.max(1) * dp)
        .collect()
}

/// The medoid of the candidates: the rank whose frame-share profile is
/// closest (L1) to all others — the "median healthy rank", robust to one
/// odd reference.
pub fn median_rank(candidates: &[(u32, Folded)]) -> Option<u32> {
    let shares: Vec<(u32, HashMap<String, f64>)> = candidates
        .iter()
        .filter(|(_, f)| f.total() > 0)
        .map(|(r, f)| (*r, f.tree_shares()))
        .collect();
    let dist = |a: &HashMap<String, f64>, b: &HashMap<String, f64>| -> f64 {
        let mut d = 0.0;
        for (k, v) in a {
            d += (v - b.get(k).copied().unwrap_or(0.0)).abs();
        }
        for (k, v) in b {
            if !a.contains_key(k) {
                d += v.abs();
            }
        }
        d
    };
    shares
        .iter()
        .map(|(r, a)| (*r, shares.iter().map(|(_, b)| dist(a, b)).sum::<f64>()))
        .min_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)))
        .map(|(r, _)| r)
}

/// A frame where the flagged rank spends more of its time.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FrameDiff {
    pub frame: String,
    /// The root of its stacks: the thread name (CPU view).
    pub thread: String,
    /// Share of that thread's weight on the flagged rank with this frame on
    /// the stack.
    pub flagged_share: f64,
    /// Same for the reference rank.
    pub reference_share: f64,
    /// How much more of the flagged rank's time this frame's call-tree node
    /// holds than the reference's, beyond its caller's difference.
    pub gain: f64,
    /// Where in the call tree (outermost first, shortened).
    pub path: String,
}

/// Which threads the top frames come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    All,
    /// Only the main thread (root frame ending in [`MAIN_SUFFIX`]): the one
    /// that runs the training loop and reaches the collectives. Helper
    /// threads (NCCL proxy, driver threads) idle differently *because* the
    /// main thread is late; for a host-slow rank they are effects.
    Main,
}

/// Root-frame suffix the agent gives a process's main thread.
pub const MAIN_SUFFIX: &str = " [main]";

/// The `n` frames with the largest gain (see the module docs).
pub fn top_frames(
    flagged: &Folded,
    reference: &Folded,
    threads: Threads,
    n: usize,
) -> Vec<FrameDiff> {
    let f = flagged.tree_shares();
    let r = reference.tree_shares();
    let mut best: HashMap<&str, (f64, &str)> = HashMap::new();
    for path in f.keys().chain(r.keys()) {
        if !path.contains(';') {
            continue; // a thread name: compared within, not across threads
        }
        if threads == Threads::Main && !root_of(path).ends_with(MAIN_SUFFIX) {
            continue;
        }
        let d = f.get(path).copied().unwrap_or(0.0) - r.get(path).copied().unwrap_or(0.0);
        let (parent, frame) = match path.rfind(';') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path.as_str()),
        };
        let dp = if parent.is_empty() {
            0.0
        } else {
            f.get(parent).copied().unwrap_or(0.0) - r.get(parent).copied().unwrap_or(0.0)
        };
        let gain = d - dp.max(0.0);
        let e = best.entry(frame).or_insert((f64::NEG_INFINITY, path));
        if gain > e.0 {
            *e = (gain, path);
        }
    }
    let mut out: Vec<FrameDiff> = best
        .into_iter()
        .filter(|(frame, (g, _))| *g > 0.0 && !uninformative(frame))
        .map(|(frame, (gain, path))| FrameDiff {
            frame: frame.to_owned(),
            thread: root_of(path).to_owned(),
            flagged_share: flagged.frame_share(root_of(path), frame) + 0.0,
            reference_share: reference.frame_share(root_of(path), frame) + 0.0,
            gain,
            path: shorten_path(path),
        })
        .collect();
    out.sort_by(|a, b| b.gain.total_cmp(&a.gain).then(a.frame.cmp(&b.frame)));
    out.truncate(n);
    out
}

/// Launch view: the `GPU:<kernel>` leaves whose estimated GPU time grew
/// most, as a fraction of the window (GPU busy share). Absolute, not
/// normalised: a uniformly slower GPU keeps its kernel mix but spends more
/// of the same window on it.
pub fn top_gpu_frames(
    flagged: &Folded,
    reference: &Folded,
    window_us: f64,
    n: usize,
) -> Vec<FrameDiff> {
    let leaves = |f: &Folded| -> HashMap<String, (f64, String, String)> {
        let mut out: HashMap<String, (f64, String, String)> = HashMap::new();
        for (stack, &w) in &f.stacks {
            let leaf = stack.rsplit(';').next().unwrap_or("");
            if !leaf.starts_with("GPU:") {
                continue;
            }
            let e = out
                .entry(leaf.to_owned())
                .or_insert_with(|| (0.0, root_of(stack).to_owned(), shorten_path(stack)));
            e.0 += w as f64 / window_us.max(1.0);
        }
        out
    };
    let (fl, rf) = (leaves(flagged), leaves(reference));
    let mut out: Vec<FrameDiff> = fl
        .iter()
        .map(|(frame, (share, thread, path))| {
            let r = rf.get(frame).map_or(0.0, |x| x.0);
            FrameDiff {
                frame: frame.clone(),
                thread: thread.clone(),
                flagged_share: *share,
                reference_share: r,
                gain: share - r,
                path: path.clone(),
            }
        })
        .filter(|d| d.gain > 0.0)
        .collect();
    out.sort_by(|a, b| b.gain.total_cmp(&a.gain).then(a.frame.cmp(&b.frame)));
    out.truncate(n);
    out
}

fn shorten_path(path: &str) -> String {
    let frames: Vec<&str> = path.split(';').collect();
    if frames.len() <= 6 {
        return frames.join(" → ");
    }
    format!(
        "{} → … → {}",
        frames[0],
        frames[frames.len() - 4..].join(" → ")
    )
}

/// What goes on a verdict as `"flamegraph"` in the report JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FlameRef {
    /// Differential flame graph: the reference's profile normalised to the
    /// flagged rank's and coloured by the difference (red: more on the
    /// flagged rank, blue: less).
    pub diff_svg: String,
    pub flagged_svg: String,
    pub reference_svg: String,
    pub reference_rank: u32,
    /// `cpu` (on- and off-CPU thread time) or `launch` (GPU launch sites).
    pub view: String,
    pub window_start_ns: u64,
    pub window_end_ns: u64,
    pub top_frames: Vec<FrameDiff>,
}

pub fn view_name(view: StackView) -> &'static str {
    match view {
        StackView::Cpu => "cpu",
        StackView::Launch => "launch",
    }
}

/// Inputs of one diff.
pub struct DiffRequest<'a> {
    pub windows: &'a [StackWindow],
    pub flagged: u32,
    /// Healthy ranks of the same role ([`same_role`] minus flagged ones).
    pub candidates: &'a [u32],
    pub view: StackView,
    pub start_ns: u64,
    pub end_ns: u64,
    pub out_dir: &'a Path,
    pub top: usize,
    pub threads: Threads,
}

/// Folds both sides, picks the median reference, writes the three SVGs and
/// returns what the report shows.
pub fn diff(req: &DiffRequest<'_>) -> Result<FlameRef, FlameError> {
    let flagged = fold(req.windows, req.flagged, req.view, req.start_ns, req.end_ns)?;
    if flagged.total() == 0 {
        return Err(FlameError::Empty(req.flagged));
    }
    let mut cands = Vec::new();
    for &r in req.candidates.iter().filter(|&&r| r != req.flagged) {
        cands.push((r, fold(req.windows, r, req.view, req.start_ns, req.end_ns)?));
    }
    let reference_rank = median_rank(&cands).ok_or(FlameError::NoReference)?;
    let reference = cands
        .into_iter()
        .find(|(r, _)| *r == reference_rank)
        .map(|(_, f)| f)
        .ok_or(FlameError::NoReference)?;
    let view = view_name(req.view);
    let base = format!("rank{}-{}", req.flagged, view);
    let unit = match req.view {
        StackView::Cpu => "µs",
        // No parentheses: the SVG's script cuts labels at the last "(".
        StackView::Launch => "estimated GPU µs",
    };
    let flagged_svg = req.out_dir.join(format!("{base}.svg"));
    let reference_svg = req
        .out_dir
        .join(format!("rank{reference_rank}-{view}-reference.svg"));
    let diff_svg = req
        .out_dir
        .join(format!("{base}-vs-rank{reference_rank}-diff.svg"));
    std::fs::create_dir_all(req.out_dir).map_err(|source| FlameError::Write {
        path: req.out_dir.to_owned(),
        source,
    })?;
    render(
        &flagged.lines(),
        &flagged_svg,
        &format!("rank {} ({view})", req.flagged),
        unit,
        false,
    )?;
    render(
        &reference.lines(),
        &reference_svg,
        &format!("rank {reference_rank} ({view}, reference)"),
        unit,
        false,
    )?;
    let mut diff_lines = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            // Thread time over the same window is the same on both sides
            // (normalising only evens out jitter); GPU time is absolute: a
            // uniformly slower GPU must show red, not be normalised away.
            normalize: req.view == StackView::Cpu,
            strip_hex: false,
        },
        BufReader::new(reference.lines().as_bytes()),
        BufReader::new(flagged.lines().as_bytes()),
        &mut diff_lines,
    )
    .map_err(|source| FlameError::Write {
        path: diff_svg.clone(),
        source,
    })?;
    render(
        &String::from_utf8_lossy(&diff_lines),
        &diff_svg,
        &format!(
            "rank {} vs rank {reference_rank} ({view}): red = more on rank {}",
            req.flagged, req.flagged
        ),
        unit,
        true,
    )?;
    Ok(FlameRef {
        diff_svg: diff_svg.display().to_string(),
        flagged_svg: flagged_svg.display().to_string(),
        reference_svg: reference_svg.display().to_string(),
        reference_rank,
        view: view.to_owned(),
        window_start_ns: req.start_ns,
        window_end_ns: req.end_ns,
        top_frames: match req.view {
            StackView::Cpu => top_frames(&flagged, &reference, req.threads, req.top),
            StackView::Launch => {
                let span = span_ns(req.windows, req.flagged, req.view, req.start_ns, req.end_ns);
                top_gpu_frames(&flagged, &reference, span as f64 / 1e3, req.top)
            }
        },
    })
}

/// How much of `[start_ns, end_ns)` the rank's windows cover.
fn span_ns(windows: &[StackWindow], rank: u32, view: StackView, start_ns: u64, end_ns: u64) -> u64 {
    let ws = windows
        .iter()
        .filter(|w| w.rank == rank && w.view == view && w.end_ns > start_ns && w.start_ns < end_ns);
    let (lo, hi) = ws.fold((u64::MAX, 0), |(lo, hi), w| {
        (lo.min(w.start_ns), hi.max(w.end_ns))
    });
    hi.min(end_ns).saturating_sub(lo.max(start_ns))
}

fn render(
    lines: &str,
    path: &Path,
    title: &str,
    unit: &str,
    _diff: bool,
) -> Result<(), FlameError> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = unit.to_owned();
    let file = std::fs::File::create(path).map_err(|source| FlameError::Write {
        path: path.to_owned(),
        source,
    })?;
    inferno::flamegraph::from_lines(&mut opts, lines.lines(), std::io::BufWriter::new(file))
        .map_err(|source| FlameError::Write {
            path: path.to_owned(),
            source,
        })
}

/// Puts the flame graph on the verdict (`"flamegraph"` in the JSON).
pub fn attach(verdict: &mut Verdict, flame: FlameRef) {
    verdict.flamegraph = Some(flame);
}

/// The parallel layout, for finding same-role references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
}

/// Which view and threads answer a verdict of this kind: a compute-slow
/// rank's CPU does what its peers do, its GPU work takes longer (launch
/// view); a host-slow rank's main thread is where it is late.
pub fn view_for(kind: crate::classify::Kind) -> (StackView, Threads) {
    match kind {
        crate::classify::Kind::Compute => (StackView::Launch, Threads::All),
        crate::classify::Kind::Host => (StackView::Cpu, Threads::Main),
        _ => (StackView::Cpu, Threads::All),
    }
}

/// Diffs and attaches a flame graph to every verdict of `verdicts` on a
/// rank (not a link) for which `window` gives the slow window in the stack
/// windows' clock. Healthy references exclude every flagged rank. Verdicts
/// without stacks are left as they are; the errors are returned per verdict
/// id so the report can say why.
pub fn annotate(
    verdicts: &mut [Verdict],
    windows: &[StackWindow],
    layout: Layout,
    out_dir: &Path,
    window: impl Fn(&Verdict) -> Option<(u64, u64)>,
) -> Vec<(u64, FlameError)> {
    let flagged: Vec<u32> = verdicts.iter().map(|v| v.rank).collect();
    let mut errors = Vec::new();
    for v in verdicts.iter_mut().filter(|v| v.link.is_none()) {
        let Some((start_ns, end_ns)) = window(v) else {
            continue;
        };
        let (view, threads) = view_for(v.kind);
        let candidates: Vec<u32> = same_role(v.rank, layout.tp, layout.pp, layout.dp)
            .into_iter()
            .filter(|r| !flagged.contains(r))
            .collect();
        let request = |view, threads| DiffRequest {
            windows,
            flagged: v.rank,
            candidates: &candidates,
            view,
            start_ns,
            end_ns,
            out_dir,
            top: 10,
            threads,
        };
        let result = match diff(&request(view, threads)) {
            // No launch sites were recorded (`serve --launch-sites` is off):
            // the CPU view still shows whether the rank's CPU side differs.
            Err(FlameError::Empty(_) | FlameError::NoReference) if view == StackView::Launch => {
                diff(&request(StackView::Cpu, Threads::All))
            }
            r => r,
        };
        match result {
            Ok(f) => attach(v, f),
            Err(e) => errors.push((v.id, e)),
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(lines: &[(&str, u64)]) -> Folded {
        Folded {
            stacks: lines.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        }
    }

    #[test]
    fn top_frame_is_where_the_difference_starts() {
        let healthy = folded(&[
            ("main;step;load_batch;sleep;nanosleep", 5),
            ("main;step;forward;launch", 20),
            ("main;step;synchronize;wait", 75),
        ]);
        let slow = folded(&[
            ("main;step;load_batch;sleep;nanosleep", 30),
            ("main;step;forward;launch", 20),
            ("main;step;synchronize;wait", 50),
        ]);
        let top = top_frames(&slow, &healthy, Threads::All, 3);
        assert_eq!(top[0].frame, "load_batch", "{top:#?}");
        assert!((top[0].flagged_share - 0.30).abs() < 1e-9);
        assert!((top[0].reference_share - 0.05).abs() < 1e-9);
        assert!(top.iter().all(|t| t.frame != "sleep" && t.frame != "main"));
    }

    #[test]
    fn same_role_is_the_dp_peers() {
        // tp2 pp2 dp2: rank = pp*4 + dp*2 + tp
        assert_eq!(same_role(5, 2, 2, 2), vec![7]);
        assert_eq!(same_role(0, 1, 1, 4), vec![1, 2, 3]);
    }

    #[test]
    fn median_rank_skips_the_odd_one() {
        let a = folded(&[("m;x", 50), ("m;y", 50)]);
        let b = folded(&[("m;x", 48), ("m;y", 52)]);
        let c = folded(&[("m;x", 90), ("m;y", 10)]);
        assert_eq!(median_rank(&[(1, c), (2, a), (3, b)]), Some(2));
    }

    #[test]
    fn windows_survive_the_wire_and_fold() {
        use slowrank_shared::wire::{decode, encode, Batch, FoldedStack};
        let w = StackWindow {
            rank: 2,
            view: StackView::Cpu,
            start_ns: 10,
            end_ns: 20,
            strings: vec!["py [main]".into(), "train".into(), "load_batch".into()],
            stacks: vec![
                FoldedStack {
                    frames: vec![0, 1, 2],
                    weight: 7,
                },
                FoldedStack {
                    frames: vec![0, 1],
                    weight: 3,
                },
            ],
            records: 10,
            truncated: 1,
            overflow_weight: 0,
        };
        let batch = Batch {
            stacks: vec![w],
            ..Default::default()
        };
        let back: Batch = decode(&encode(&batch).unwrap()).unwrap();
        assert_eq!(back, batch);
        let f = fold(&back.stacks, 2, StackView::Cpu, 0, 100).unwrap();
        assert_eq!(
            f.lines(),
            "py [main];train 3\npy [main];train;load_batch 7\n"
        );
        assert!(fold(&back.stacks, 2, StackView::Cpu, 20, 30)
            .unwrap()
            .stacks
            .is_empty());
    }

    #[test]
    fn bad_index_is_an_error() {
        let w = StackWindow {
            rank: 1,
            view: StackView::Cpu,
            start_ns: 0,
            end_ns: 10,
            strings: vec!["a".into()],
            stacks: vec![slowrank_shared::wire::FoldedStack {
                frames: vec![0, 5],
                weight: 1,
            }],
            records: 1,
            truncated: 0,
            overflow_weight: 0,
        };
        assert!(matches!(
            fold(&[w], 1, StackView::Cpu, 0, 10),
            Err(FlameError::BadIndex { index: 5, .. })
        ));
    }
}

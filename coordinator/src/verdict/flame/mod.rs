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
pub use crate::verdict::{FlameRef, FlameView, FrameDiff};

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
        if threads == Threads::Main && !is_training_thread(root_of(path)) {
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
    let (reference_rank, reference) = median_reference(req)?;
    let view = view_name(req.view);
    let base = format!("rank{}-{}", req.flagged, view);
    let unit = view_unit(req.view);
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
    // Thread time over the same window is the same on both sides
    // (normalising only evens out jitter); GPU time is absolute: a
    // uniformly slower GPU must show red, not be normalised away.
    let normalize = req.view == StackView::Cpu;
    let diff_lines = differential(&reference, &flagged, normalize, &diff_svg)?;
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
    let views = if req.view == StackView::Cpu {
        Part::ALL
            .iter()
            .filter_map(|&part| {
                part_diff(&flagged, &reference, part, req, reference_rank, unit).transpose()
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    Ok(FlameRef {
        views,
        diff_svg: diff_svg.display().to_string(),
        flagged_svg: flagged_svg.display().to_string(),
        reference_svg: reference_svg.display().to_string(),
        reference_rank,
        view: view.to_owned(),
        window_start_ns: req.start_ns,
        window_end_ns: req.end_ns,
        top_frames: diff_top_frames(req, &flagged, &reference),
    })
}

/// The candidates' folds, and the median one among them: the reference.
fn median_reference(req: &DiffRequest<'_>) -> Result<(u32, Folded), FlameError> {
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
    Ok((reference_rank, reference))
}

/// What a view's samples count.
fn view_unit(view: StackView) -> &'static str {
    match view {
        StackView::Cpu => "µs",
        // No parentheses: the SVG's script cuts labels at the last "(".
        StackView::Launch => "estimated GPU µs",
    }
}

/// inferno's differential folded lines of `reference` → `flagged` (an
/// error is reported against `svg`, the file they were for).
fn differential(
    reference: &Folded,
    flagged: &Folded,
    normalize: bool,
    svg: &Path,
) -> Result<Vec<u8>, FlameError> {
    let mut lines = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            normalize,
            strip_hex: false,
        },
        BufReader::new(reference.lines().as_bytes()),
        BufReader::new(flagged.lines().as_bytes()),
        &mut lines,
    )
    .map_err(|source| FlameError::Write {
        path: svg.to_owned(),
        source,
    })?;
    Ok(lines)
}

/// The frames the flagged rank spends more in: by share of thread time
/// (CPU), or by estimated GPU time over the window's span (launch).
fn diff_top_frames(req: &DiffRequest<'_>, flagged: &Folded, reference: &Folded) -> Vec<FrameDiff> {
    match req.view {
        StackView::Cpu => top_frames(flagged, reference, req.threads, req.top),
        StackView::Launch => {
            let span = span_ns(req.windows, req.flagged, req.view, req.start_ns, req.end_ns);
            top_gpu_frames(flagged, reference, span as f64 / 1e3, req.top)
        }
    }
}

/// A part of a rank's CPU profile (see [`FlameView`]). The training
/// thread is the one that runs the loop and issues the collectives and
/// launches; its on-CPU time is what its code does, its off-CPU time what
/// it waits for. The other threads (NCCL proxy, CUDA stream and driver
/// threads) are parked most of the time on every rank, so in a whole-
/// process diff their waiting dwarfs the training thread's difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    TrainOnCpu,
    TrainOffCpu,
    AllThreads,
}

impl Part {
    pub const ALL: [Part; 3] = [Part::TrainOnCpu, Part::TrainOffCpu, Part::AllThreads];

    pub fn key(self) -> &'static str {
        match self {
            Part::TrainOnCpu => "train-oncpu",
            Part::TrainOffCpu => "train-offcpu",
            Part::AllThreads => "all-threads",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Part::TrainOnCpu => "training thread, on-CPU",
            Part::TrainOffCpu => "training thread, off-CPU by what it waited in",
            Part::AllThreads => "all threads, on- and off-CPU",
        }
    }
}

/// Root-frame suffix of the thread that issues a rank's collectives, when
/// the agent knows it apart from the main thread.
pub const TRAIN_SUFFIX: &str = " [train]";

/// Whether a root frame (thread name) is the rank's training thread: the
/// one the agent marked as issuing its collectives, else the process's
/// main thread (which runs the loop in PyTorch and in the scenarios).
pub fn is_training_thread(root: &str) -> bool {
    root.ends_with(TRAIN_SUFFIX) || root.ends_with(MAIN_SUFFIX)
}

/// An off-CPU stack: captured as the thread left the CPU, so it ends in
/// the scheduler (`docs/stacks.md`). A CPU sample caught inside
/// `schedule` itself counts as off-CPU too; that is microseconds.
pub fn is_off_cpu(stack: &str) -> bool {
    stack
        .rsplit(';')
        .take(4)
        .any(|f| f == "__schedule_[k]" || f == "schedule_[k]")
}

/// What an off-CPU stretch waited in, from the frames on its stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A CUDA sync call (any frame named `…synchronize`): waiting for the
    /// GPU.
    GpuSync,
    /// Inside NCCL: waiting for peers or the network.
    Collective,
    /// A read, write, poll or block-device wait.
    Io,
    /// A mutex, condition variable or futex outside the two above.
    Lock,
    /// A sleep (`nanosleep`): the program chose to wait.
    Sleep,
    Other,
}

impl Wait {
    pub fn label(self) -> &'static str {
        match self {
            Wait::GpuSync => "[off-CPU: GPU sync]",
            Wait::Collective => "[off-CPU: collective]",
            Wait::Io => "[off-CPU: I/O]",
            Wait::Lock => "[off-CPU: lock]",
            Wait::Sleep => "[off-CPU: sleep]",
            Wait::Other => "[off-CPU: other]",
        }
    }
}

/// The first match wins, in this order: a CUDA sync or NCCL call waits in
/// a futex or a sleep underneath, and it is the call that says why.
pub fn wait_of(stack: &str) -> Wait {
    let frames: Vec<&str> = stack.split(';').collect();
    let any = |f: &dyn Fn(&str) -> bool| frames.iter().any(|x| f(x));
    let lower = |x: &str| x.to_ascii_lowercase();
    // `cudaStreamSynchronize`, `cuCtxSynchronize`, `torch.cuda.synchronize`
    // or the job's own wrapper (`Trainer::synchronize`): the CUDA frames
    // themselves are often missing (no frame pointers in libcudart).
    if any(&|x| {
        let name = x.rsplit("::").next().unwrap_or(x);
        lower(name).contains("synchronize")
    }) {
        Wait::GpuSync
    } else if any(&|x| x.starts_with("nccl") || x.starts_with("pnccl")) {
        Wait::Collective
    } else if any(&|x| x.contains("nanosleep")) {
        Wait::Sleep
    } else if any(&|x| {
        let k = x.strip_suffix("_[k]").unwrap_or(x);
        k.starts_with("vfs_read")
            || k.starts_with("vfs_write")
            || k.starts_with("ksys_read")
            || k.starts_with("ksys_write")
            || k.starts_with("ksys_pread")
            || k.starts_with("io_schedule")
            || k.starts_with("do_sys_poll")
            || k.starts_with("do_select")
            || k.starts_with("do_epoll_wait")
            || k.starts_with("sock_recvmsg")
            || k.starts_with("blk_")
    }) {
        Wait::Io
    } else if any(&|x| {
        x.contains("futex")
            || x.contains("pthread_mutex")
            || x.contains("lll_lock")
            || x.contains("pthread_cond")
            || x.contains("Condvar")
            || x.contains("Mutex")
    }) {
        Wait::Lock
    } else {
        Wait::Other
    }
}

/// The stacks of `f` that belong to `part`; off-CPU stacks get a
/// `[off-CPU: …]` frame under the thread so the graph groups them by what
/// they waited in.
pub fn select(f: &Folded, part: Part) -> Folded {
    select_as(f, part, true)
}

/// [`select`], with or without the wait frames: the top frames are found
/// without them, or the wait category would "explain" every difference
/// under it and hide the function where the waiting comes from.
fn select_as(f: &Folded, part: Part, label: bool) -> Folded {
    let mut out = Folded::default();
    for (stack, &w) in &f.stacks {
        let root = root_of(stack);
        let key = match part {
            Part::AllThreads => stack.clone(),
            _ if !is_training_thread(root) => continue,
            Part::TrainOnCpu if is_off_cpu(stack) => continue,
            Part::TrainOnCpu => stack.clone(),
            Part::TrainOffCpu if !is_off_cpu(stack) => continue,
            Part::TrainOffCpu if !label => stack.clone(),
            Part::TrainOffCpu => match stack.split_once(';') {
                Some((root, rest)) => format!("{root};{};{rest}", wait_of(stack).label()),
                None => continue,
            },
        };
        *out.stacks.entry(key).or_default() += w;
    }
    out
}

/// The diff of one part, written next to the main one; `None` when
/// neither side has stacks in it.
fn part_diff(
    flagged: &Folded,
    reference: &Folded,
    part: Part,
    req: &DiffRequest<'_>,
    reference_rank: u32,
    unit: &str,
) -> Result<Option<FlameView>, FlameError> {
    let (f, r) = (select(flagged, part), select(reference, part));
    if f.total() == 0 || r.total() == 0 {
        return Ok(None);
    }
    let svg = req.out_dir.join(format!(
        "rank{}-{}-vs-rank{reference_rank}-diff.svg",
        req.flagged,
        part.key()
    ));
    let lines = differential(&r, &f, true, &svg)?;
    render(
        &String::from_utf8_lossy(&lines),
        &svg,
        &format!(
            "rank {} vs rank {reference_rank}, {}: red = more on rank {}",
            req.flagged,
            part.title(),
            req.flagged
        ),
        unit,
        true,
    )?;
    // A training-thread part as a share of that thread's time; all
    // threads: 1.
    let share = |x: &Folded, all: &Folded| {
        let train: u64 = all
            .stacks
            .iter()
            .filter(|(k, _)| part == Part::AllThreads || is_training_thread(root_of(k)))
            .map(|(_, w)| *w)
            .sum();
        x.total() as f64 / train.max(1) as f64
    };
    Ok(Some(FlameView {
        part: part.key().to_owned(),
        title: part.title().to_owned(),
        diff_svg: svg.display().to_string(),
        flagged_share: share(&f, flagged),
        reference_share: share(&r, reference),
        top_frames: top_frames(
            &select_as(flagged, part, false),
            &select_as(reference, part, false),
            Threads::All,
            req.top,
        ),
    }))
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
        // The training thread is where a rank is late; the other threads'
        // differences are in the all-threads view (`FlameRef::views`).
        _ => (StackView::Cpu, Threads::Main),
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
                diff(&request(StackView::Cpu, Threads::Main))
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
mod tests;

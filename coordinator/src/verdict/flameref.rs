//! What a verdict carries of its flame graph: plain data the report reads;
//! `crate::verdict::flame` computes it (flame → verdict, never back).

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
    /// CPU view only: the same diff split the way it reads best — the
    /// training thread on-CPU, the training thread off-CPU grouped by what
    /// it waited in, and every thread (see `flame::Part`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub views: Vec<FlameView>,
}

/// One part of a CPU diff, with its own differential flame graph.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FlameView {
    /// `train-oncpu`, `train-offcpu` or `all-threads`.
    pub part: String,
    /// What it shows, in words.
    pub title: String,
    pub diff_svg: String,
    /// Share of the flagged rank's training-thread time in this part (all
    /// threads: 1), and the same on the reference.
    pub flagged_share: f64,
    pub reference_share: f64,
    pub top_frames: Vec<FrameDiff>,
}

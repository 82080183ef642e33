//! Folded stack windows per rank, kept for a while so a verdict's slow
//! window can be diffed against healthy ranks when the report is written.
//!
//! Windows arrive on their agent's clock and are moved onto the coordinator
//! clock on arrival (the host's clock fit exists by then: probes start at
//! connect), so one verdict window applies to every rank.

use std::{collections::VecDeque, path::Path, sync::Mutex};

use dashmap::DashMap;
use slowrank_shared::wire::{Batch, StackWindow};

use crate::{clock::CoordNs, verdict::flame, verdict::Verdict};

/// What the store needs of the live state to accept a window: who owns a
/// rank, and each host's clock (the analyzer implements it; the store does
/// not reach into it).
pub trait HostView {
    /// Whether `rank` belongs to `host` now.
    fn rank_on_host(&self, rank: u32, host: &str) -> bool;
    /// `agent_ns` on `host`'s clock, on the coordinator's, with its bound.
    fn to_coord(&self, host: &str, agent_ns: u64) -> (CoordNs, f64);
}

/// Windows kept per rank and view (about 5 minutes at the agent's 1 s
/// interval): bounds memory whatever the job does.
const KEEP_PER_RANK: usize = 600;
/// Bytes of stack windows kept per rank (oldest dropped first): 600
/// windows of a few KiB each is the normal case; a peer sending huge
/// windows is held to this (so 4,096 ranks stay within a few hundred MiB
/// only if windows are small; the per-window cap below keeps them so).
const MAX_BYTES_PER_RANK: usize = 4 << 20;
/// One window larger than this (frame names plus stacks) is refused: an
/// agent folds at most a few thousand distinct stacks per window.
const MAX_WINDOW_BYTES: usize = 1 << 20;

/// Approximate heap bytes of a window (what the caps count).
fn window_bytes(w: &StackWindow) -> usize {
    let strings: usize = w.strings.iter().map(|s| s.len() + 24).sum();
    let stacks: usize = w.stacks.iter().map(|s| s.frames.len() * 4 + 32).sum();
    64 + strings + stacks
}

/// One rank's windows and their byte total.
#[derive(Default)]
struct RankWindows {
    q: VecDeque<StackWindow>,
    bytes: usize,
}
/// How far before a verdict's first sighting the diff window starts, so
/// the onset is inside it (or 10 steps, if longer).
const LOOKBACK_NS: i64 = 5_000_000_000;

/// The verdict's slow window on the coordinator clock: from a little before
/// it was first seen to its last sighting (an episode that closed must not
/// be diluted by the healthy time after it).
fn slow_window(v: &Verdict, step_ns: i64, now_ns: i64) -> Option<(u64, u64)> {
    let start = v
        .first_seen_coord_ns
        .saturating_sub(LOOKBACK_NS.max(10 * step_ns))
        .max(0);
    let seen_iters = v.last_seen_iteration.saturating_sub(v.first_seen_iteration) as i64 + 1;
    let end = if v.active || step_ns == 0 {
        now_ns
    } else {
        (v.first_seen_coord_ns + seen_iters * step_ns).min(now_ns)
    };
    (end > start).then_some((start as u64, end as u64))
}

#[derive(Default)]
pub struct StackStore {
    by_rank: DashMap<u32, RankWindows>,
    /// Windows refused: rank not owned by the sending host, or too large.
    pub refused: std::sync::atomic::AtomicU64,
    /// Windows dropped to keep a rank within its byte cap.
    pub evicted: std::sync::atomic::AtomicU64,
    /// Flame-graph errors of the last report, by verdict id (for the log).
    pub last_errors: Mutex<Vec<(u64, String)>>,
}

impl StackStore {
    /// Keeps the batch's stack windows, on the coordinator clock. Call it
    /// only for a batch the analyzer accepted (not rejected, not a
    /// duplicate); windows of ranks another host owns, and oversized ones,
    /// are refused and counted.
    pub fn add(&self, batch: &Batch, analyzer: &impl HostView) {
        use std::sync::atomic::Ordering::Relaxed;
        for w in &batch.stacks {
            let bytes = window_bytes(w);
            if bytes > MAX_WINDOW_BYTES || !analyzer.rank_on_host(w.rank, &batch.host) {
                self.refused.fetch_add(1, Relaxed);
                continue;
            }
            let mut w = w.clone();
            let (s, _) = analyzer.to_coord(&batch.host, w.start_ns);
            let (e, _) = analyzer.to_coord(&batch.host, w.end_ns);
            w.start_ns = s.max(0) as u64;
            w.end_ns = e.max(0) as u64;
            let mut r = self.by_rank.entry(w.rank).or_default();
            let full = |r: &RankWindows| r.q.len() >= KEEP_PER_RANK;
            let heavy = |r: &RankWindows| !r.q.is_empty() && r.bytes + bytes > MAX_BYTES_PER_RANK;
            while full(&r) || heavy(&r) {
                // Rotating out the oldest of a full queue is the normal
                // case; dropping for weight is counted.
                if !full(&r) {
                    self.evicted.fetch_add(1, Relaxed);
                }
                let Some(old) = r.q.pop_front() else { break };
                r.bytes = r.bytes.saturating_sub(window_bytes(&old));
            }
            r.bytes += bytes;
            r.q.push_back(w);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_rank.is_empty()
    }

    /// Attaches a differential flame graph (SVGs under `dir/flame/`) to
    /// every rank verdict that has stacks over its window `[first seen −
    /// 5 s, now]`. The reference is the median healthy rank: the roles
    /// (pipeline stage, tensor position) are not known to the coordinator
    /// yet, so every unflagged rank is a candidate.
    pub fn annotate(
        &self,
        verdicts: &mut [Verdict],
        world_size: u32,
        step_ms: f64,
        now_ns: i64,
        dir: &Path,
    ) {
        if verdicts.is_empty() || self.is_empty() {
            return;
        }
        let windows: Vec<StackWindow> = self
            .by_rank
            .iter()
            .flat_map(|e| e.value().q.iter().cloned().collect::<Vec<_>>())
            .collect();
        let world = world_size.max(self.by_rank.iter().map(|e| *e.key() + 1).max().unwrap_or(1));
        let layout = flame::Layout {
            tp: 1,
            pp: 1,
            dp: world,
        };
        let step_ns = (step_ms.max(0.0) * 1e6) as i64;
        let errors = flame::annotate(verdicts, &windows, layout, &dir.join("flame"), |v| {
            slow_window(v, step_ns, now_ns)
        });
        let errors: Vec<(u64, String)> = errors
            .into_iter()
            .map(|(id, e)| (id, e.to_string()))
            .collect();
        if let Ok(mut last) = self.last_errors.lock() {
            // Said once per change: the report is rewritten every few seconds.
            for (id, e) in errors.iter().filter(|x| !last.contains(x)) {
                tracing::info!(verdict = id, "no flame graph for this verdict: {e}");
            }
            *last = errors;
        }
    }
}

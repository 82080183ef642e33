//! Per-iteration series for the report page (`report.html`): each rank's
//! arrival lateness and the job's step time, iteration by iteration, for
//! the whole job at bounded size.
//!
//! Recent iterations are kept one per row; when the series outgrows its
//! bound, the older half is merged pairwise (a row then covers several
//! iterations, averaged), so an hour-long job still shows its first minutes
//! — and a verdict's onset from long ago — at coarser resolution. Pure and
//! sans-IO: the analyzer records each sealed iteration's scores.

use crate::classify::stats::RankScore;

/// Cells (rank × row) the series holds at most: bounds `timeline.json` and
/// the page (≈ 10 bytes a cell in JSON, so about 2 MB) whatever the job's
/// size and length.
pub const MAX_CELLS: usize = 200_000;
/// Rows kept however many ranks there are: the step-time chart needs a
/// shape even on a 10,000-rank job.
pub const MIN_ROWS: usize = 64;
/// Rows kept on a small job: one column per pixel-ish of a page's width
/// is as much as a heatmap can show.
pub const MAX_ROWS: usize = 1_200;

/// One row: one iteration, or several merged ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// First iteration the row covers.
    pub first: u64,
    /// Last iteration it covers (== `first` for a single iteration).
    pub last: u64,
    /// Iterations merged in (≤ `last - first + 1`: sealed iterations may
    /// be missing, e.g. during warm-up before the step is known).
    pub count: u32,
    /// Mean step duration (ms) of those iterations that had one.
    pub step_ms: Option<f64>,
    /// Per rank: mean over the row's iterations of its lateness (ms) on its
    /// reference communicator in one iteration (summed over the
    /// iteration's reference instances: how much later than the median
    /// member this rank arrived, per step). Sorted by rank.
    pub late_ms: Vec<(u32, f32)>,
}

/// The series (`timeline.json`, schema [`SCHEMA`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timeline {
    pub schema: String,
    /// Oldest first.
    pub rows: Vec<Row>,
    /// Set when the series was cut to fit [`MAX_TIMELINE_BYTES`]: how many
    /// rows (oldest first) and cells (highest ranks of a kept row) were
    /// left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<crate::report::Truncation>,
}

/// `timeline.json` is at most this long. [`MAX_CELLS`] keeps a normal
/// series near 2 MB, but [`MIN_ROWS`] rows are kept however many ranks
/// agents announce (a 2^20-rank world would make 64 rows of a million
/// cells); 8 MiB is four times the normal size.
pub const MAX_TIMELINE_BYTES: usize = 8 << 20;

pub const SCHEMA: &str = "slowrank.timeline/v1";

impl Default for Timeline {
    fn default() -> Self {
        Self {
            schema: SCHEMA.into(),
            rows: Vec::new(),
            truncated: None,
        }
    }
}

impl Timeline {
    /// Records sealed iteration `it`: its duration (ns) if known and the
    /// ranks' scores. An iteration at or before the newest row is ignored
    /// (iterations are sealed in order; a replay must not double count).
    pub fn record(&mut self, it: u64, step_ns: Option<f64>, scores: &[RankScore]) {
        if self.rows.last().is_some_and(|r| r.last >= it) {
            return;
        }
        let mut late: Vec<(u32, f32)> = scores
            .iter()
            .filter(|s| s.late_ns.is_finite())
            .map(|s| (s.rank, (s.late_ns / 1e6) as f32))
            .collect();
        late.sort_by_key(|x| x.0);
        late.dedup_by_key(|x| x.0);
        self.rows.push(Row {
            first: it,
            last: it,
            count: 1,
            step_ms: step_ns
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(|s| s / 1e6),
            late_ms: late,
        });
        let ranks = self.rows.iter().map(|r| r.late_ms.len()).max().unwrap_or(1);
        let bound = (MAX_CELLS / ranks.max(1)).clamp(MIN_ROWS, MAX_ROWS);
        if self.rows.len() > bound {
            self.compact(bound);
        }
    }

    /// Merges older rows until at most `bound` remain, the finest first
    /// (adjacent rows of the smallest span merge pairwise), so the older
    /// part stays evenly coarse rather than its oldest rows doubling at
    /// every pass; the newest quarter of the bound stays one iteration a
    /// row.
    fn compact(&mut self, bound: usize) {
        let keep_fine = bound / 4;
        while self.rows.len() > bound {
            let split = self.rows.len().saturating_sub(keep_fine);
            let Some(finest) = self.rows[..split].iter().map(|r| r.count).min() else {
                break;
            };
            let mut out: Vec<Row> = Vec::with_capacity(self.rows.len());
            let mut i = 0;
            let mut merged_any = false;
            while i < self.rows.len() {
                let pair = i + 1 < split
                    && self.rows[i].count == finest
                    && self.rows[i + 1].count <= finest;
                if pair {
                    out.push(merge(&self.rows[i], &self.rows[i + 1]));
                    merged_any = true;
                    i += 2;
                } else {
                    out.push(self.rows[i].clone());
                    i += 1;
                }
            }
            self.rows = out;
            if !merged_any {
                break; // nothing left to merge
            }
        }
    }

    /// Cuts the series until its JSON is at most `max_bytes`: the oldest
    /// rows first (the newest is what the page is looked at for), then, in
    /// a last row still too wide, the highest ranks; [`Timeline::truncated`]
    /// says how many of each. Unchanged when it fits.
    pub fn bound_size(&mut self, max_bytes: usize) {
        let size = |t: &Timeline| serde_json::to_string(t).map_or(usize::MAX, |j| j.len());
        let mut len = size(self);
        if len <= max_bytes {
            return;
        }
        let mut t = self.truncated.take().unwrap_or_default();
        t.bound_bytes = max_bytes as u64;
        let room = max_bytes.saturating_sub(256);
        let (mut rows, mut cells) = (0u64, 0u64);
        while len > room && self.rows.len() > 1 {
            let per = (len / self.rows.len()).max(1);
            let n = (len - room).div_ceil(per).clamp(1, self.rows.len() - 1);
            self.rows.drain(..n);
            rows += n as u64;
            len = size(self);
        }
        while len > room {
            let Some(row) = self.rows.last_mut().filter(|r| !r.late_ms.is_empty()) else {
                break;
            };
            let per = (len / row.late_ms.len()).max(1);
            let n = (len - room).div_ceil(per).clamp(1, row.late_ms.len());
            row.late_ms.truncate(row.late_ms.len() - n);
            cells += n as u64;
            len = size(self);
        }
        for (k, n) in [("rows", rows), ("cells", cells)] {
            if n > 0 {
                *t.left_out.entry(k.to_owned()).or_default() += n;
            }
        }
        self.truncated = Some(t);
    }

    /// Ranks that appear anywhere in the series, sorted.
    pub fn ranks(&self) -> Vec<u32> {
        let mut r: Vec<u32> = self
            .rows
            .iter()
            .flat_map(|row| row.late_ms.iter().map(|x| x.0))
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// The row covering iteration `it` (the nearest later one if `it` fell
    /// between rows).
    pub fn row_of(&self, it: u64) -> Option<usize> {
        self.rows.iter().position(|r| r.last >= it)
    }
}

fn merge(a: &Row, b: &Row) -> Row {
    let (wa, wb) = (a.count as f64, b.count as f64);
    let step_ms = match (a.step_ms, b.step_ms) {
        (Some(x), Some(y)) => Some((x * wa + y * wb) / (wa + wb)),
        (x, y) => x.or(y),
    };
    let mut late: Vec<(u32, f32)> = Vec::with_capacity(a.late_ms.len().max(b.late_ms.len()));
    let (mut i, mut j) = (0, 0);
    // A rank missing from one side had no score there: average what exists.
    while i < a.late_ms.len() || j < b.late_ms.len() {
        match (a.late_ms.get(i), b.late_ms.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                let v = (x.1 as f64 * wa + y.1 as f64 * wb) / (wa + wb);
                late.push((x.0, v as f32));
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                late.push(*x);
                i += 1;
            }
            (Some(_), Some(y)) => {
                late.push(*y);
                j += 1;
            }
            (Some(x), None) => {
                late.push(*x);
                i += 1;
            }
            (None, Some(y)) => {
                late.push(*y);
                j += 1;
            }
            (None, None) => break,
        }
    }
    Row {
        first: a.first,
        last: b.last,
        count: a.count + b.count,
        step_ms,
        late_ms: late,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(rank: u32, late_ms: f64) -> RankScore {
        RankScore {
            rank,
            iteration: 0,
            ref_n: 1,
            late_ns: late_ms * 1e6,
            host_late_ns: 0.0,
            gpu_late_ns: None,
            gpu_n: 0,
            excess_wait_ns: 0.0,
            unexplained_ns: 0.0,
            sync_excess_ns: 0.0,
            last_frac: 0.0,
            mean_pos: 0.0,
            inflicted_ns: 0.0,
            blame_ns: 0.0,
            blame_excess_ns: 0.0,
            blame_z: 0.0,
            err_ns: 0.0,
            step_ns: 0.0,
            peers: 0,
            suspicious: false,
            first_t: None,
        }
    }

    #[test]
    fn a_series_past_its_bound_loses_old_rows_then_cells_and_says_so() {
        let mut t = Timeline::default();
        for it in 0..10u64 {
            t.rows.push(Row {
                first: it,
                last: it,
                count: 1,
                step_ms: Some(1.0),
                late_ms: (0..1000).map(|r| (r, 0.5)).collect(),
            });
        }
        let len = |t: &Timeline| serde_json::to_string(t).unwrap().len();
        let full = len(&t);
        let mut same = t.clone();
        same.bound_size(full);
        assert_eq!(same, t, "a series that fits is untouched");
        let mut cut = t.clone();
        cut.bound_size(full / 3);
        assert!(len(&cut) <= full / 3);
        let tr = cut.truncated.as_ref().expect("the cut is said");
        assert_eq!(tr.left_out["rows"], 10 - cut.rows.len() as u64);
        assert_eq!(cut.rows.last().unwrap().last, 9, "the newest row stays");
        let mut narrow = t.clone();
        narrow.bound_size(full / 30);
        assert!(len(&narrow) <= full / 30);
        assert_eq!(narrow.rows.len(), 1);
        let tr = narrow.truncated.as_ref().unwrap();
        assert_eq!(tr.left_out["rows"], 9);
        assert_eq!(
            tr.left_out["cells"],
            1000 - narrow.rows[0].late_ms.len() as u64
        );
        // Read back as written.
        let back: Timeline =
            serde_json::from_str(&serde_json::to_string(&narrow).unwrap()).unwrap();
        assert_eq!(back, narrow);
    }

    #[test]
    fn rows_stay_bounded_and_the_whole_job_stays_covered() {
        let mut t = Timeline::default();
        for it in 0..10_000u64 {
            let late = if it >= 100 { 8.0 } else { 0.0 };
            t.record(it, Some(40e6), &[score(0, 0.0), score(2, late)]);
        }
        assert!(t.rows.len() <= MAX_ROWS, "{}", t.rows.len());
        assert_eq!(t.rows[0].first, 0);
        assert_eq!(t.rows.last().unwrap().last, 9_999);
        assert_eq!(t.rows.iter().map(|r| r.count as u64).sum::<u64>(), 10_000);
        // Consecutive, non-overlapping rows.
        for w in t.rows.windows(2) {
            assert_eq!(w[0].last + 1, w[1].first);
        }
        // The newest rows are single iterations; the onset is still findable.
        assert_eq!(t.rows.last().unwrap().count, 1);
        let onset = t.row_of(100).unwrap();
        assert!(t.rows[onset].first <= 100 && t.rows[onset].last >= 100);
        let late2 = |r: &Row| r.late_ms.iter().find(|x| x.0 == 2).unwrap().1;
        // Evenly coarse: the oldest rows are no coarser than the rest.
        let max_span = t.rows.iter().map(|r| r.count).max().unwrap();
        assert!(
            max_span <= 2 * t.rows[0].count && max_span <= 32,
            "{max_span}"
        );
        assert_eq!(late2(&t.rows[0]), 0.0);
        assert_eq!(late2(t.rows.last().unwrap()), 8.0);
        assert!((t.rows[0].step_ms.unwrap() - 40.0).abs() < 1e-9);
        assert_eq!(t.ranks(), vec![0, 2]);
    }

    #[test]
    fn big_jobs_keep_fewer_rows_and_replays_do_not_double_count() {
        let mut t = Timeline::default();
        let scores: Vec<RankScore> = (0..4096).map(|r| score(r, 0.1)).collect();
        for it in 0..200 {
            t.record(it, None, &scores);
        }
        t.record(150, None, &scores);
        assert!(t.rows.len() <= MIN_ROWS.max(MAX_CELLS / 4096));
        assert_eq!(t.rows.iter().map(|r| r.count as u64).sum::<u64>(), 200);
        assert!(t.rows.iter().all(|r| r.step_ms.is_none()));
    }

    #[test]
    fn merging_averages_by_weight_and_keeps_ranks_seen_on_one_side() {
        let a = Row {
            first: 0,
            last: 2,
            count: 3,
            step_ms: Some(10.0),
            late_ms: vec![(0, 1.0), (1, 3.0)],
        };
        let b = Row {
            first: 3,
            last: 3,
            count: 1,
            step_ms: None,
            late_ms: vec![(1, 7.0), (5, 2.0)],
        };
        let m = merge(&a, &b);
        assert_eq!((m.first, m.last, m.count), (0, 3, 4));
        assert_eq!(m.step_ms, Some(10.0));
        assert_eq!(m.late_ms, vec![(0, 1.0), (1, 4.0), (5, 2.0)]);
    }
}

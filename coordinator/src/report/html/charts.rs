//! The page's two charts, drawn as inline SVG: the lateness heatmap (ranks
//! × iterations) and the step-time line with verdict onsets.

use super::*;

/// Iteration → x position helpers shared by the heatmap and the chart.
struct Axis {
    x0: f64,
    width: f64,
    cols: usize,
}

impl Axis {
    fn x(&self, col: usize) -> f64 {
        self.x0 + self.width * col as f64 / self.cols.max(1) as f64
    }
    fn w(&self) -> f64 {
        self.width / self.cols.max(1) as f64
    }
}

/// Verdict onsets as (timeline row, verdict).
fn onsets<'a>(r: &'a Report, t: &Timeline) -> Vec<(usize, &'a Verdict)> {
    r.verdicts
        .iter()
        .filter_map(|v| t.row_of(v.first_seen_iteration).map(|c| (c, v)))
        .collect()
}

fn median_step(t: &Timeline) -> Option<f64> {
    let mut v: Vec<f64> = t.rows.iter().filter_map(|r| r.step_ms).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Which ranks get a heatmap row: every verdict's ranks, then the latest
/// on average, up to [`MAX_HEATMAP_RANKS`]; drawn in rank order.
fn heatmap_ranks(r: &Report, t: &Timeline) -> (Vec<u32>, usize) {
    let all = t.ranks();
    if all.len() <= MAX_HEATMAP_RANKS {
        return (all.clone(), all.len());
    }
    let mut pick: Vec<u32> = Vec::new();
    for v in &r.verdicts {
        let mut rs = vec![v.rank];
        rs.extend(v.ranks.iter().copied());
        if let Some(l) = &v.link {
            rs.extend(l.ranks);
        }
        for x in rs {
            if !pick.contains(&x) && pick.len() < MAX_HEATMAP_RANKS {
                pick.push(x);
            }
        }
    }
    let mut mean: foldhash::HashMap<u32, (f64, u32)> = Default::default();
    for row in &t.rows {
        for (rk, l) in &row.late_ms {
            let e = mean.entry(*rk).or_default();
            e.0 += *l as f64;
            e.1 += 1;
        }
    }
    let mut by: Vec<(u32, f64)> = mean
        .into_iter()
        .map(|(k, (sum, n))| (k, sum / n.max(1) as f64))
        .collect();
    by.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (rk, _) in by {
        if pick.len() >= MAX_HEATMAP_RANKS {
            break;
        }
        if !pick.contains(&rk) {
            pick.push(rk);
        }
    }
    pick.sort_unstable();
    (pick, all.len())
}

/// Colour level of a lateness: −LEVELS..=LEVELS.
pub(super) fn level(late_ms: f64, full_ms: f64) -> i32 {
    if !late_ms.is_finite() || full_ms <= 0.0 {
        return 0;
    }
    ((late_ms / full_ms) * LEVELS as f64)
        .round()
        .clamp(-LEVELS as f64, LEVELS as f64) as i32
}

pub(super) fn colour(level: i32) -> String {
    // White → red for late, white → blue for early.
    let f = level.unsigned_abs() as f64 / LEVELS as f64;
    let (r, g, b) = if level >= 0 {
        (255.0 - 63.0 * f, 255.0 - 198.0 * f, 255.0 - 212.0 * f)
    } else {
        (255.0 - 215.0 * f, 255.0 - 140.0 * f, 255.0 - 40.0 * f)
    };
    format!("#{:02x}{:02x}{:02x}", r as u8, g as u8, b as u8)
}

fn iter_span(row: &crate::report::timeline::Row) -> String {
    if row.first == row.last {
        format!("iteration {}", row.first)
    } else {
        format!("iterations {}–{}", row.first, row.last)
    }
}

/// Where the heatmap's rows lie: the iteration axis, the first row's top
/// and each row's height.
struct Rows {
    ax: Axis,
    top: f64,
    cell_h: f64,
}

pub(super) fn heatmap(s: &mut String, r: &Report, t: &Timeline) {
    s.push_str("<section id=\"heatmap-section\"><h2>Arrival lateness, rank × iteration</h2>");
    let (ranks, total) = heatmap_ranks(r, t);
    if t.rows.is_empty() || ranks.is_empty() {
        s.push_str("<p class=\"note\">No per-iteration series yet: no iteration sealed, or no timeline.json next to report.json.</p></section>");
        return;
    }
    let step = median_step(t);
    let full = full_scale(t, step);
    let ax = Axis {
        x0: 64.0,
        width: 960.0,
        cols: t.rows.len(),
    };
    let cell_h = (420.0 / ranks.len() as f64).clamp(6.0, 22.0);
    // One line of onset labels per verdict (up to MAX_ONSET_LINES, then
    // they cycle), so verdicts opened close together stay legible.
    let lines = onsets(r, t).len().clamp(1, MAX_ONSET_LINES);
    let top = 10.0 + 13.0 * lines as f64;
    let h = top + cell_h * ranks.len() as f64 + 30.0;
    let _ = write!(
        s,
        "<svg id=\"heatmap\" role=\"img\" viewBox=\"0 0 {:.0} {h:.0}\" width=\"100%\" \
         style=\"max-width:{:.0}px\" xmlns=\"http://www.w3.org/2000/svg\">",
        ax.x0 + ax.width + 10.0,
        ax.x0 + ax.width + 10.0
    );
    let rows = Rows { ax, top, cell_h };
    let label_every = (ranks.len() as f64 * 12.0 / (cell_h * ranks.len() as f64)).ceil() as usize;
    for (i, rk) in ranks.iter().enumerate() {
        heatmap_row(s, t, &rows, i, *rk, i % label_every.max(1) == 0, full);
    }
    let bottom = top + cell_h * ranks.len() as f64;
    onset_markers(s, r, t, &rows, &ranks, bottom);
    axis_labels(s, &rows.ax, t, bottom + 14.0);
    s.push_str("</svg>");
    heatmap_legend(s, full, step, ranks.len(), total);
    s.push_str("</section>");
}

/// The lateness drawn in full colour: a share of the median step, else
/// (no step known) the 99th percentile of the lateness itself.
fn full_scale(t: &Timeline, step: Option<f64>) -> f64 {
    match step {
        Some(st) => FULL_SCALE_STEP_FRACTION * st,
        None => {
            let mut all: Vec<f64> = t
                .rows
                .iter()
                .flat_map(|row| row.late_ms.iter().map(|x| (x.1 as f64).abs()))
                .collect();
            all.sort_by(f64::total_cmp);
            all.get(all.len() * 99 / 100)
                .copied()
                .unwrap_or(1.0)
                .max(1e-3)
        }
    }
}

/// Rank `rk`'s row (the `i`th): its label when `labelled`, and its cells,
/// runs of one colour level drawn as one rectangle.
fn heatmap_row(
    s: &mut String,
    t: &Timeline,
    rows: &Rows,
    i: usize,
    rk: u32,
    labelled: bool,
    full: f64,
) {
    let (ax, cell_h) = (&rows.ax, rows.cell_h);
    let y = rows.top + cell_h * i as f64;
    if labelled {
        let _ = write!(
            s,
            "<text x=\"{:.0}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">rank {rk}</text>",
            ax.x0 - 6.0,
            y + cell_h / 2.0 + 4.0
        );
    }
    let val = |c: usize| {
        t.rows[c]
            .late_ms
            .iter()
            .find(|x| x.0 == rk)
            .map(|x| x.1 as f64)
    };
    let mut col = 0;
    while col < t.rows.len() {
        let v0 = val(col);
        let l0 = v0.map(|v| level(v, full));
        let mut end = col + 1;
        while end < t.rows.len() && val(end).map(|v| level(v, full)) == l0 {
            end += 1;
        }
        if let (Some(l), Some(v)) = (l0, v0) {
            let span = if end - col == 1 {
                iter_span(&t.rows[col])
            } else {
                format!("iterations {}–{}", t.rows[col].first, t.rows[end - 1].last)
            };
            let _ = write!(
                s,
                "<rect class=\"cell\" x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{cell_h:.1}\" fill=\"{}\">\
                 <title>rank {rk}, {span}: {v:+.2} ms vs the median arrival</title></rect>",
                ax.x(col),
                ax.w() * (end - col) as f64 + 0.01,
                colour(l)
            );
        }
        col = end;
    }
}

/// Onsets: a line through the heatmap at the iteration each verdict was
/// first seen, a marker on its rank's row.
fn onset_markers(
    s: &mut String,
    r: &Report,
    t: &Timeline,
    rows: &Rows,
    ranks: &[u32],
    bottom: f64,
) {
    let (ax, top, cell_h) = (&rows.ax, rows.top, rows.cell_h);
    for (n, (c, v)) in onsets(r, t).into_iter().enumerate() {
        let x = ax.x(c);
        let label_y = top - 6.0 - 13.0 * (n % MAX_ONSET_LINES) as f64;
        let _ = write!(
            s,
            "<g class=\"onset\"><line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\" \
             stroke=\"#1c2833\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"11\" font-weight=\"600\"{}>▼ #{} {} {}</text>",
            label_y + 3.0,
            label_y,
            // Near the right edge the label runs leftwards, not off the plot.
            if x > ax.x0 + 0.8 * ax.width {
                " text-anchor=\"end\""
            } else {
                ""
            },
            v.id,
            esc(v.kind.as_str()),
            match &v.link {
                Some(l) => format!("link {}↔{}", l.ranks[0], l.ranks[1]),
                None => format!("rank {}", v.rank),
            }
        );
        if let Some(i) = ranks.iter().position(|x| *x == v.rank) {
            let y = top + cell_h * i as f64;
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"4\" height=\"{cell_h:.1}\" fill=\"#1c2833\"/>",
                x - 2.0
            );
        }
        let _ = write!(
            s,
            "<title>verdict #{} opened here: {}</title></g>",
            v.id,
            esc(&v.headline())
        );
    }
}

/// What a cell means, the colour scale, and how many of the ranks are shown.
fn heatmap_legend(s: &mut String, full: f64, step: Option<f64>, shown: usize, total: usize) {
    let _ = write!(
        s,
        "<div class=\"note\">Each cell: how much later than the median member the rank reached the \
         collectives of its reference communicator in that iteration (summed over them), in ms. \
         <span style=\"background:{};color:#fff;padding:0 6px\">late</span> \
         <span style=\"background:{};color:#fff;padding:0 6px\">early</span>; full colour at ±{full:.1} ms{}. \
         Dashed lines: where each verdict was first seen. Hover a cell for its value.{}</div>",
        colour(LEVELS),
        colour(-LEVELS),
        step.map_or(String::new(), |st| format!(
            " ({:.0}% of the {st:.1} ms step)",
            100.0 * FULL_SCALE_STEP_FRACTION
        )),
        if total > shown {
            format!(" Showing {shown} of {total} ranks: the verdicts' ranks and the latest on average.")
        } else {
            String::new()
        }
    );
}

fn axis_labels(s: &mut String, ax: &Axis, t: &Timeline, y: f64) {
    let n = t.rows.len();
    let ticks = 8.min(n);
    for k in 0..ticks {
        let c = if ticks <= 1 {
            0
        } else {
            k * (n - 1) / (ticks - 1)
        };
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{y:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#5d6d7e\">{}</text>",
            ax.x(c) + ax.w() / 2.0,
            t.rows[c].first
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#5d6d7e\">iteration</text>",
        ax.x0 - 6.0,
        y
    );
}

pub(super) fn step_chart(s: &mut String, r: &Report, t: &Timeline) {
    s.push_str("<section id=\"steps\"><h2>Job step time</h2>");
    let pts: Vec<(usize, f64)> = t
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, row)| row.step_ms.map(|v| (i, v)))
        .collect();
    if pts.is_empty() {
        s.push_str("<p class=\"note\">No step time known yet.</p></section>");
        return;
    }
    let ax = Axis {
        x0: 64.0,
        width: 960.0,
        cols: t.rows.len(),
    };
    let (top, ph) = (16.0, 200.0);
    let mut sorted: Vec<f64> = pts.iter().map(|p| p.1).collect();
    sorted.sort_by(f64::total_cmp);
    // The top of the axis: the 99th percentile with headroom, so one
    // outlier (a checkpoint, a restart) does not flatten the rest.
    let ymax = (sorted[(sorted.len() - 1) * 99 / 100] * 1.15).max(1e-3);
    let y = |v: f64| top + ph - ph * (v.min(ymax) / ymax);
    let _ = write!(
        s,
        "<svg id=\"stepchart\" role=\"img\" viewBox=\"0 0 {:.0} {:.0}\" width=\"100%\" style=\"max-width:{:.0}px\" xmlns=\"http://www.w3.org/2000/svg\">",
        ax.x0 + ax.width + 10.0,
        top + ph + 30.0,
        ax.x0 + ax.width + 10.0
    );
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let _ = write!(
            s,
            "<line x1=\"{:.0}\" x2=\"{:.0}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#e5e8e8\"/>\
             <text x=\"{:.0}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#5d6d7e\">{v:.1} ms</text>",
            ax.x0,
            ax.x0 + ax.width,
            y(v),
            y(v),
            ax.x0 - 6.0,
            y(v) + 4.0
        );
    }
    for (c, v) in onsets(r, t) {
        let x = ax.x(c);
        let _ = write!(
            s,
            "<line class=\"onset\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top:.1}\" y2=\"{:.1}\" stroke=\"#c0392b\" \
             stroke-dasharray=\"4 3\"><title>verdict #{} opened: {}</title></line>",
            top + ph,
            v.id,
            esc(&v.headline())
        );
    }
    let mut path = String::new();
    for (i, (c, v)) in pts.iter().enumerate() {
        let _ = write!(
            path,
            "{}{:.1},{:.1}",
            if i == 0 { "" } else { " " },
            ax.x(*c) + ax.w() / 2.0,
            y(*v)
        );
    }
    let _ = write!(
        s,
        "<polyline points=\"{path}\" fill=\"none\" stroke=\"#2471a3\" stroke-width=\"1.5\"/>"
    );
    axis_labels(s, &ax, t, top + ph + 16.0);
    s.push_str("</svg><div class=\"note\">Duration of each training iteration (merged iterations: their mean). Red dashed lines: verdict onsets.</div></section>");
}

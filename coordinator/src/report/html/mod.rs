//! `report.html`: the report as one self-contained page — no script, font
//! or style fetched from anywhere (clusters are often offline), only
//! inline CSS and inline SVG; the diff flame graphs ride along as `data:`
//! URLs in `<object>` elements, so inferno's own script keeps them
//! interactive (zoom, search) without clashing with each other.
//!
//! Pure: built from an immutable snapshot ([`Page`]: the [`Report`], the
//! per-iteration [`Timeline`] and the flame graphs' SVG text, read by the
//! caller). What the page shows, top to bottom, is what an on-call
//! engineer asks in that order: is something wrong now, who, since when,
//! how much, why (evidence), where in the code, and can I trust it (clock,
//! ingest).

use std::fmt::Write;

use crate::{report::timeline::Timeline, report::Report, verdict::Verdict};

mod charts;

use charts::{heatmap, step_chart};

/// Ranks drawn in the heatmap at most: the verdicts' ranks first, then the
/// latest on average. More rows than this stop being readable.
pub const MAX_HEATMAP_RANKS: usize = 64;
/// Lateness (as a fraction of the step) at which a heatmap cell is fully
/// coloured: a rank a quarter of a step late every iteration is as loud as
/// the page gets; the verdict thresholds start at a few percent.
pub const FULL_SCALE_STEP_FRACTION: f64 = 0.25;
/// Lines of onset labels above the heatmap before they reuse a line.
const MAX_ONSET_LINES: usize = 4;
/// Colour levels per sign: adjacent cells of the same level merge into one
/// rectangle, which keeps a long steady job's page small.
const LEVELS: i32 = 8;

/// Seconds between reloads of the page served live at `/`: about the
/// report writer's period (3 s by default) plus a margin, so a watcher sees
/// each new verdict within seconds without hammering the coordinator.
pub const LIVE_REFRESH_S: u32 = 5;

/// A rendered page that reloads itself every `seconds`.
pub fn with_refresh(html: &str, seconds: u32) -> String {
    html.replacen(
        "<meta charset=\"utf-8\">",
        &format!("<meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"{seconds}\">"),
        1,
    )
}

/// Everything the page shows.
pub struct Page<'a> {
    pub report: &'a Report,
    pub timeline: &'a Timeline,
    /// The diff flame graphs, in the order shown.
    pub flames: Vec<FlameSvg>,
    /// Reload every this many seconds (the page served live); `None` for a
    /// file.
    pub refresh_s: Option<u32>,
}

/// One differential flame graph of a verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct FlameSvg {
    pub verdict: u64,
    /// Which part of the diff ("training thread, on-CPU", ...).
    pub title: String,
    /// The SVG text (inferno's, with its script).
    pub svg: String,
}

/// HTML-escapes text and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = r#"
:root{--bad:#c0392b;--ok:#1e8449;--was:#7f8c8d;--ink:#1c2833;--mute:#5d6d7e;--line:#d5d8dc}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);margin:0;background:#f4f6f7}
header{background:#1c2833;color:#fff;padding:14px 24px}
header h1{font-size:20px;margin:0 0 4px}
header .meta{color:#d5dbdb;font-size:13px}
main{padding:16px 24px;max-width:1280px}
section{background:#fff;border:1px solid var(--line);border-radius:6px;padding:14px 18px;margin:0 0 16px}
h2{font-size:17px;margin:0 0 10px}
.banner{font-size:18px;font-weight:600;padding:12px 16px;border-radius:6px;margin:0 0 16px;border-left:8px solid}
.banner.bad{background:#fdedec;border-color:var(--bad)}
.banner.ok{background:#e9f7ef;border-color:var(--ok)}
.banner div{margin:2px 0}
table{border-collapse:collapse;width:100%;font-size:14px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--mute);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.verdict.active td:first-child{border-left:5px solid var(--bad)}
tr.verdict.closed td:first-child{border-left:5px solid var(--was)}
tr.verdict.closed{color:var(--mute)}
.tag{display:inline-block;padding:1px 7px;border-radius:10px;font-size:12px;font-weight:600;color:#fff}
.tag.now{background:var(--bad)}.tag.was{background:var(--was)}
ul.evidence{margin:4px 0 6px 18px;padding:0;font-size:13.5px}
.note{color:var(--mute);font-size:13px}
.warn{color:var(--bad);font-weight:600}
object.flame{width:100%;height:520px;border:1px solid var(--line);border-radius:4px;background:#fff}
svg text{font-family:system-ui,sans-serif}
code{font-size:13px}
"#;

/// The whole page.
/// `report.html` (and the live page) is at most this long: a bounded
/// report (16 MiB of JSON), the heatmap of a bounded series and the flame
/// graphs make a few MiB normally; past this the flame graphs (files of
/// their own) and then the series (`timeline.json`) are left out of the
/// page, which says so at the top.
pub const MAX_PAGE_BYTES: usize = 48 << 20;

/// The page, within [`MAX_PAGE_BYTES`] (unchanged when it fits).
pub fn render(p: &Page<'_>) -> String {
    render_within(p, MAX_PAGE_BYTES)
}

fn render_within(p: &Page<'_>, max_bytes: usize) -> String {
    let html = render_full(p);
    if html.len() <= max_bytes {
        return html;
    }
    let empty = Timeline::default();
    let cut = |timeline: &Timeline| {
        render_full(&Page {
            report: p.report,
            timeline,
            flames: Vec::new(),
            refresh_s: p.refresh_s,
        })
    };
    let flames = p.flames.len();
    let mut note = format!(
        "This page was cut to fit {max_bytes} bytes: {flames} flame graphs left out \
         (their SVG files are beside the report)"
    );
    let mut html = cut(p.timeline);
    if html.len() > max_bytes {
        note += &format!(
            ", and the per-iteration series ({} rows; timeline.json has it)",
            p.timeline.rows.len()
        );
        html = cut(&empty);
    }
    note += ".";
    let note = format!("<p class=\"warn\"><b>{}</b></p>", esc(&note));
    if html.len() + note.len() > max_bytes {
        // The report alone is too large to show: report.json has it all.
        return format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>slowrank report</title></head><body><main>{}</main></body></html>",
            esc(&format!(
                "This page would be {} bytes, over its {max_bytes}-byte bound: \
                 see report.json and report.txt.",
                html.len()
            ))
        );
    }
    match html.find("<main>") {
        Some(i) => html.insert_str(i + "<main>".len(), &note),
        None => html.push_str(&note),
    }
    html
}

fn render_full(p: &Page<'_>) -> String {
    let r = p.report;
    let mut s = String::with_capacity(64 * 1024);
    let title = match r.verdicts.iter().find(|v| v.active) {
        Some(v) => format!("slowrank: {}", v.headline()),
        None => "slowrank report".to_owned(),
    };
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">{}\
         <title>{}</title><style>{CSS}</style></head><body>",
        p.refresh_s.map_or(String::new(), |t| format!(
            "<meta http-equiv=\"refresh\" content=\"{t}\">"
        )),
        esc(&title)
    );
    header(&mut s, r);
    s.push_str("<main>");
    banner(&mut s, r);
    verdicts(&mut s, r, &p.flames);
    heatmap(&mut s, r, p.timeline);
    step_chart(&mut s, r, p.timeline);
    flames(&mut s, r, &p.flames);
    hangs(&mut s, r);
    clocks(&mut s, r);
    ingest(&mut s, r);
    s.push_str("</main></body></html>\n");
    s
}

fn header(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<header><h1>slowrank report — job {}</h1><div class=\"meta\">{} ranks on {} hosts · \
         {} iterations observed{} · {:.0} s observed · generated {}</div></header>",
        esc(r.job.job_id.as_deref().unwrap_or("?")),
        r.job.world_size,
        r.job.hosts,
        r.job.iterations_observed,
        r.job
            .step_time_ms
            .map_or(String::new(), |t| format!(" · step {t:.1} ms")),
        r.job.observed_seconds,
        r.generated_at.format("%Y-%m-%d %H:%M:%S UTC")
    );
}

/// The one thing to read first: what is wrong now, or that nothing is.
fn banner(s: &mut String, r: &Report) {
    let active: Vec<&Verdict> = r.verdicts.iter().filter(|v| v.active).collect();
    let hangs: Vec<_> = r.hangs.iter().filter(|h| h.active).collect();
    let bad = !active.is_empty() || !hangs.is_empty();
    let _ = write!(
        s,
        "<div class=\"banner {}\" id=\"status\">",
        if bad { "bad" } else { "ok" }
    );
    for h in &hangs {
        let who = match h.missing_count {
            Some(_) => crate::report::fmt_missing(h),
            None => format!("ranks {}", join_u32(&h.missing_ranks)),
        };
        let _ = write!(
            s,
            "<div>HANG: {} never arrived at {} #{} of communicator {}</div>",
            esc(&who),
            esc(&h.op),
            h.sequence,
            esc(&h.communicator)
        );
    }
    for v in &active {
        let _ = write!(
            s,
            "<div>NOW: {} (since iteration {})</div>",
            esc(&v.headline()),
            v.first_seen_iteration
        );
    }
    let stretches = crate::report::stretch_lines(r);
    for line in &stretches {
        let _ = write!(s, "<div>SLOWER: {}</div>", esc(line));
    }
    if !bad {
        let line = if r.job.ranks_seen == 0 {
            "No rank observed yet: no agent has reported a rank process."
        } else if r.verdicts.is_empty() && !stretches.is_empty() {
            "No slow rank found, but the job ran slower than its own pace for a while."
        } else if r.verdicts.is_empty() && !r.transients.is_empty() {
            "No slow rank found now: slow episodes ended before the job did (listed below)."
        } else if r.verdicts.is_empty() {
            "No slow rank found: every rank kept pace within noise."
        } else {
            "No verdict is active now; earlier ones are listed below."
        };
        let _ = write!(s, "<div>{line}</div>");
    }
    s.push_str("</div>");
}

fn verdicts(s: &mut String, r: &Report, flames: &[FlameSvg]) {
    s.push_str("<section id=\"verdicts\"><h2>Verdicts</h2>");
    if r.verdicts.is_empty() {
        s.push_str("<p class=\"note\">None.</p>");
        transients(s, r);
        s.push_str("</section>");
        return;
    }
    s.push_str(
        "<table><thead><tr><th></th><th>who</th><th>kind</th><th class=\"num\">confidence</th>\
         <th class=\"num\">since iteration</th><th class=\"num\">lost GPU-s</th>\
         <th class=\"num\">cost</th><th class=\"num\">clock error</th></tr></thead><tbody>",
    );
    for v in &r.verdicts {
        verdict_row(s, v);
        let _ = write!(
            s,
            "<tr class=\"evidence\"><td></td><td colspan=\"7\"><ul class=\"evidence\">"
        );
        for e in &v.evidence {
            let _ = write!(s, "<li>{}</li>", esc(e));
        }
        s.push_str("</ul>");
        if let Some(f) = &v.flamegraph {
            where_it_differs(s, v, f, flames);
        }
        s.push_str("</td></tr>");
    }
    s.push_str("</tbody></table>");
    transients(s, r);
    s.push_str("</section>");
}

/// Slow episodes too short to be stragglers, one line each.
fn transients(s: &mut String, r: &Report) {
    if r.transients.is_empty() {
        return;
    }
    s.push_str("<p class=\"note\">Transients (slow briefly, then kept pace; not stragglers):</p><ul class=\"evidence\">");
    const SHOWN: usize = 20;
    let n = r.transients.len();
    for v in r.transients.iter().skip(n.saturating_sub(SHOWN)) {
        let _ = write!(
            s,
            "<li>{}: {}-slow, iterations {}–{}</li>",
            esc(&crate::verdict::who(v)),
            v.kind.as_str(),
            v.first_seen_iteration,
            v.first_seen_iteration + v.slow_iterations() - 1
        );
    }
    if n > SHOWN {
        let _ = write!(s, "<li>and {} earlier (report.json)</li>", n - SHOWN);
    }
    s.push_str("</ul>");
}

/// A verdict's row: who, what, since when, what it cost.
fn verdict_row(s: &mut String, v: &Verdict) {
    let who = match &v.link {
        Some(l) => format!("link {}↔{} (from {})", l.ranks[0], l.ranks[1], v.host),
        None if !v.ranks.is_empty() => format!(
            "host {} ({}; rank {} costs most)",
            v.host,
            crate::verdict::span(&v.ranks),
            v.rank
        ),
        None => format!("rank {} on {}", v.rank, v.host),
    };
    let since = match v.closed_iteration {
        Some(c) if !v.active => format!("{}–{}", v.first_seen_iteration, c),
        _ => v.first_seen_iteration.to_string(),
    };
    let _ = write!(
        s,
        "<tr class=\"verdict {}\" id=\"verdict-{}\" data-rank=\"{}\"><td><span class=\"tag {}\">{}</span></td>\
         <td><b>{}</b></td><td>{}-slow</td><td class=\"num\">{:.2}</td><td class=\"num\">{}</td>\
         <td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num\">{:.0} µs</td></tr>",
        if v.active { "active" } else { "closed" },
        v.id,
        v.rank,
        if v.active { "now" } else { "was" },
        if v.active { "NOW" } else { "WAS" },
        esc(&who),
        esc(v.kind.as_str()),
        v.confidence,
        since,
        v.lost_gpu_seconds,
        esc(&v.cost_cell()),
        v.clock_error_us
    );
}

/// The verdict's flame-graph diff in a line: its top frames against the
/// reference rank's, linked to the graph when the page has it.
fn where_it_differs(
    s: &mut String,
    v: &Verdict,
    f: &crate::verdict::FlameRef,
    flames: &[FlameSvg],
) {
    let top: Vec<String> = f
        .top_frames
        .iter()
        .take(3)
        .map(|t| {
            format!(
                "<code>{}</code> {:.1}% vs {:.1}%",
                esc(crate::report::short_frame(&t.frame)),
                100.0 * t.flagged_share,
                100.0 * t.reference_share
            )
        })
        .collect();
    let link = if flames.iter().any(|g| g.verdict == v.id) {
        format!(" (<a href=\"#flame-{}\">flame graph</a>)", v.id)
    } else {
        String::new()
    };
    let _ = write!(
        s,
        "<div class=\"note\">Where it differs from rank {} ({} view){link}: {}</div>",
        f.reference_rank,
        esc(&f.view),
        if top.is_empty() {
            "no frame stands out".to_owned()
        } else {
            top.join(" · ")
        }
    );
}

fn frame_table(s: &mut String, frames: &[crate::verdict::flame::FrameDiff]) {
    if frames.is_empty() {
        s.push_str("<p class=\"note\">No frame stands out.</p>");
        return;
    }
    s.push_str("<table class=\"frames\"><thead><tr><th>frame</th><th>thread</th><th class=\"num\">rank share</th><th class=\"num\">reference</th></tr></thead><tbody>");
    for t in frames.iter().take(5) {
        let _ = write!(
            s,
            "<tr><td><code title=\"{}\">{}</code></td><td>{}</td><td class=\"num\">{:.1}%</td><td class=\"num\">{:.1}%</td></tr>",
            esc(&t.path),
            esc(crate::report::short_frame(&t.frame)),
            esc(&t.thread),
            100.0 * t.flagged_share,
            100.0 * t.reference_share
        );
    }
    s.push_str("</tbody></table>");
}

fn flames(s: &mut String, r: &Report, flames: &[FlameSvg]) {
    s.push_str("<section id=\"flames\"><h2>Where the slow rank's code differs</h2>");
    let mut any = false;
    for v in &r.verdicts {
        let Some(f) = &v.flamegraph else { continue };
        let graphs: Vec<&FlameSvg> = flames.iter().filter(|g| g.verdict == v.id).collect();
        if graphs.is_empty() {
            continue;
        }
        any = true;
        let _ = write!(
            s,
            "<h3 id=\"flame-{}\">Verdict #{}: rank {} vs rank {} (a healthy peer)</h3>\
             <p class=\"note\">Red: more of rank {}'s time than on the reference; blue: less. \
             Click a frame to zoom, Ctrl-F in a graph to search.</p>",
            v.id, v.id, v.rank, f.reference_rank, v.rank
        );
        for g in graphs {
            let part = f.views.iter().find(|p| p.title == g.title);
            match part {
                Some(p) => {
                    let _ = write!(
                        s,
                        "<h4>{} <span class=\"note\">({:.0}% of the training thread's time vs {:.0}% on rank {})</span></h4>",
                        esc(&g.title),
                        100.0 * p.flagged_share,
                        100.0 * p.reference_share,
                        f.reference_rank
                    );
                    frame_table(s, &p.top_frames);
                }
                None => {
                    let _ = write!(s, "<h4>{}</h4>", esc(&g.title));
                    frame_table(s, &f.top_frames);
                }
            }
            let _ = write!(
                s,
                "<object class=\"flame\" type=\"image/svg+xml\" data=\"data:image/svg+xml;base64,{}\" \
                 aria-label=\"differential flame graph of rank {}: {}\"></object>",
                base64(g.svg.as_bytes()),
                v.rank,
                esc(&g.title)
            );
        }
    }
    if !any {
        s.push_str("<p class=\"note\">No flame graph: no verdict had stacks to compare.</p>");
    }
    s.push_str("</section>");
}

fn hangs(s: &mut String, r: &Report) {
    if r.hangs.is_empty() && r.resolved_stalls.is_empty() {
        return;
    }
    s.push_str("<section id=\"hangs\"><h2>Hangs and stalls</h2><table><thead><tr><th>state</th><th>instance</th><th>missing</th><th>arrived</th><th>iteration</th></tr></thead><tbody>");
    for (h, state) in r
        .hangs
        .iter()
        .map(|h| (h, if h.active { "HANG" } else { "resolved" }))
        .chain(
            r.resolved_stalls
                .iter()
                .map(|h| (h, "stall (arrived later)")),
        )
    {
        let _ = write!(
            s,
            "<tr><td>{state}</td><td>{} #{} on {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&h.op),
            h.sequence,
            esc(&h.communicator),
            esc(&match h.missing_count {
                Some(_) => crate::report::fmt_missing(h),
                None => join_u32(&h.missing_ranks),
            }),
            esc(&join_u32(&h.present_ranks)),
            h.iteration.map_or("?".into(), |i| i.to_string())
        );
    }
    s.push_str("</tbody></table></section>");
}

fn opt(v: Option<f64>, digits: usize, unit: &str) -> String {
    v.filter(|x| x.is_finite())
        .map_or("—".into(), |x| format!("{x:.digits$} {unit}"))
}

fn clocks(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<section id=\"clocks\"><h2>Clock per host</h2><p class=\"note\">Every host's clock is \
         mapped onto the coordinator's; a lateness smaller than the error bound is not evidence. \
         Largest bound: {}.</p><table><thead><tr><th>host</th><th class=\"num\">error bound</th>\
         <th class=\"num\">offset</th><th class=\"num\">drift</th><th class=\"num\">probes (clock port)</th>\
         <th class=\"num\">last probe age</th><th>source</th></tr></thead><tbody>",
        opt(r.clock.max_error_us, 1, "µs")
    );
    for h in &r.clock.hosts {
        let stale = h.probe_age_ms.is_some_and(|a| a > 10_000.0);
        let _ = write!(
            s,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{} ({})</td><td class=\"num{}\">{}</td><td>{}</td></tr>",
            esc(&h.host),
            opt(h.error_bound_us, 1, "µs"),
            opt(h.offset_us, 0, "µs"),
            opt(h.drift_ppm, 2, "ppm"),
            h.probe_samples_seen,
            h.udp_samples,
            if stale { " warn" } else { "" },
            opt(h.probe_age_ms, 0, "ms"),
            esc(&h.source)
        );
    }
    s.push_str("</tbody></table></section>");
}

fn ingest(s: &mut String, r: &Report) {
    let i = &r.ingest;
    let c = &i.counters;
    let rejected: u64 = c.records_rejected.values().sum();
    let batches_refused: u64 =
        c.batches_rejected.values().sum::<u64>() + i.transport_rejected.values().sum::<u64>();
    let lost = c.ringbuf_drops + c.spool_drops + c.missing_batches;
    let _ = write!(
        s,
        "<section id=\"ingest\"><h2>Ingest health</h2>{}<table><tbody>",
        if lost > 0 || batches_refused > 0 {
            "<p class=\"warn\">Some data was lost or refused: findings may miss what it held.</p>"
        } else {
            "<p class=\"note\">Nothing lost or refused.</p>"
        }
    );
    let rows: [(&str, String); 9] = [
        ("batches received", c.batches.to_string()),
        ("records accepted", c.records_accepted.to_string()),
        ("records refused", rejected.to_string()),
        ("batches refused", batches_refused.to_string()),
        ("agent ring-buffer drops", c.ringbuf_drops.to_string()),
        ("agent spool drops", c.spool_drops.to_string()),
        (
            "batches missing (sequence gaps)",
            c.missing_batches.to_string(),
        ),
        (
            "collective instances completed / evicted / incomplete",
            format!(
                "{} / {} / {}",
                i.instances_completed, i.instances_evicted, i.instances_incomplete
            ),
        ),
        ("agent connections refused", i.agents_refused.to_string()),
    ];
    for (k, v) in rows {
        let _ = write!(s, "<tr><th>{k}</th><td class=\"num\">{}</td></tr>", esc(&v));
    }
    s.push_str("</tbody></table>");
    if !c.records_rejected.is_empty() || !i.transport_rejected.is_empty() {
        s.push_str("<p class=\"note\">Refusals by reason: ");
        let reasons: Vec<String> = c
            .records_rejected
            .iter()
            .chain(c.batches_rejected.iter())
            .chain(i.transport_rejected.iter())
            .map(|(k, v)| format!("{} {v}", esc(k)))
            .collect();
        s.push_str(&reasons.join(", "));
        s.push_str("</p>");
    }
    if !r.agents.is_empty() {
        agents_table(s, &r.agents);
    }
    s.push_str("</section>");
}

/// Each agent: its host, whether it is connected (or why it went, and
/// the ranks no longer observed since), its batches.
fn agents_table(s: &mut String, agents: &[crate::report::AgentReport]) {
    s.push_str("<table><thead><tr><th>agent</th><th>host</th><th>state</th><th class=\"num\">batches</th></tr></thead><tbody>");
    for a in agents {
        let state = if a.connected {
            "connected".to_owned()
        } else {
            format!(
                "gone ({}){}",
                a.reason.as_deref().unwrap_or("?"),
                if a.ranks_unobserved.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; ranks {} no longer observed",
                        join_u32(&a.ranks_unobserved)
                    )
                }
            )
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            esc(&a.agent_id),
            esc(&a.host),
            esc(&state),
            a.batches
        );
    }
    s.push_str("</tbody></table>");
}

fn join_u32(v: &[u32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Standard base64 (RFC 4648) for the `data:` URLs; small enough not to be
/// worth a dependency.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        o.push(A[(n >> 18) as usize & 63] as char);
        o.push(A[(n >> 12) as usize & 63] as char);
        o.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        o.push(if c.len() > 2 {
            A[n as usize & 63] as char
        } else {
            '='
        });
    }
    o
}

#[cfg(test)]
mod tests {
    use super::charts::{colour, level};
    use super::*;
    use crate::{Analyzer, AnalyzerConfig};

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    /// A page past its bound drops the flame graphs, then the series, and
    /// says so at the top; one that fits is untouched.
    #[test]
    fn a_page_past_its_bound_leaves_out_flames_then_the_series_and_says_so() {
        let report = Analyzer::new(AnalyzerConfig::default()).report();
        let mut timeline = Timeline::default();
        for it in 0..200u64 {
            timeline.rows.push(crate::report::timeline::Row {
                first: it,
                last: it,
                count: 1,
                step_ms: Some(100.0),
                late_ms: (0..64).map(|r| (r, r as f32)).collect(),
            });
        }
        let flame = FlameSvg {
            verdict: 1,
            title: "cpu view".into(),
            svg: format!("<svg>{}</svg>", "x".repeat(100_000)),
        };
        let page = |flames: Vec<FlameSvg>| Page {
            report: &report,
            timeline: &timeline,
            flames,
            refresh_s: None,
        };
        let full = render_full(&page(vec![flame.clone()]));
        assert_eq!(render_within(&page(vec![flame.clone()]), full.len()), full);
        assert!(full.contains("<svg id=\"heatmap\""));
        let bound = full.len() / 2;
        let cut = render_within(&page(vec![flame.clone()]), bound);
        assert!(cut.len() <= bound);
        assert!(cut.contains("1 flame graphs left out"));
        assert!(cut.contains("per-iteration series (200 rows"));
        assert!(!cut.contains("<svg id=\"heatmap\""));
        let tiny = render_within(&page(vec![flame]), 1_000);
        assert!(tiny.len() <= 1_000);
        assert!(tiny.contains("see report.json"));
    }

    #[test]
    fn colour_levels_are_symmetric_and_bounded() {
        assert_eq!(level(0.0, 10.0), 0);
        assert_eq!(level(100.0, 10.0), LEVELS);
        assert_eq!(level(-100.0, 10.0), -LEVELS);
        assert_eq!(level(f64::NAN, 10.0), 0);
        assert_eq!(colour(0), "#ffffff");
    }

    /// A synthetic job with a compute-slow rank: the page names it in the
    /// banner and the verdict rows, marks its onset on the heatmap, and
    /// escapes what agents control (host names).
    #[test]
    fn page_shows_the_verdict_heatmap_onset_and_escapes_hostile_text() {
        let a = crate::synthjob::analyzed(Some(30), 80);
        let mut report = a.report();
        let timeline = a.timeline();
        assert_eq!(report.verdicts.len(), 1, "{:?}", report.verdicts);
        assert!(timeline.rows.len() >= 60, "{}", timeline.rows.len());
        report.clock.hosts[0].host = "<script>alert(1)</script>".into();
        let html = render(&Page {
            report: &report,
            timeline: &timeline,
            flames: vec![FlameSvg {
                verdict: report.verdicts[0].id,
                title: "cpu view".into(),
                svg: "<svg xmlns=\"http://www.w3.org/2000/svg\"/>".into(),
            }],
            refresh_s: None,
        });
        assert!(
            html.contains("NOW: rank 5 on node-1 is compute-slow"),
            "banner"
        );
        assert!(html.contains("class=\"verdict active\""));
        assert!(html.contains("<svg id=\"heatmap\""));
        assert!(html.contains("class=\"onset\""));
        assert!(html.contains("<svg id=\"stepchart\""));
        assert!(!html.contains("<script>alert"), "host name not escaped");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("http-equiv=\"refresh\""));
        // Nothing fetched from the network.
        for bad in ["src=\"http", "href=\"http", "url(http", "@import"] {
            assert!(!html.contains(bad), "{bad}");
        }
    }
}

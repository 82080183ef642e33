//! The human report: the headline, the verdict table and details, hangs
//! and the footer, as `slowrank report` and `report.txt` print them. In: a
//! [`Report`]; out: text.

use super::*;

/// The table a tired on-call engineer reads: one line per finding first,
/// details after.
pub fn render_human(r: &Report) -> String {
    let mut s = String::new();
    human_headline(&mut s, r);
    human_slowdown(&mut s, r);
    human_stretches(&mut s, r);
    human_findings(&mut s, r);
    if !r.verdicts.is_empty() {
        human_verdict_table(&mut s, r);
        for v in &r.verdicts {
            human_verdict_details(&mut s, v);
        }
    }
    human_hangs(&mut s, r);
    human_footer(&mut s, r);
    s
}

/// The job in one line, and what to make of a report with nothing in it.
fn human_headline(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "slowrank report — job {} · {} ranks on {} hosts · {} iterations observed{}",
        r.job.job_id.as_deref().unwrap_or("?"),
        r.job.world_size,
        r.job.hosts,
        r.job.iterations_observed,
        r.job
            .step_time_ms
            .map_or(String::new(), |t| format!(" · step {t:.1} ms"))
    );
    let _ = writeln!(s);
    if r.job.ranks_seen == 0 {
        let _ = writeln!(
            s,
            "No rank observed yet: no agent has reported a rank process ({} agent(s) seen).",
            r.agents.len()
        );
    } else if r.verdicts.is_empty() && r.hangs.is_empty() && r.slowdown.is_none() {
        match r.job.baseline_step_ms {
            // Not "kept its pace": it did not, for a while (SLOWER below).
            _ if !r.slow_stretches.is_empty() => {
                let _ = writeln!(
                    s,
                    "No slow rank found, but the job ran slower than its own pace for a while (SLOWER below)."
                );
            }
            // Not "kept its pace" either: a rank was slow for a while
            // (random 6317-7: two faults on one rank, 27 and 26 iterations
            // long at the end of a 60-step run, a step 11 % over baseline).
            Some(b) if !r.transients.is_empty() => {
                let _ = writeln!(
                    s,
                    "No slow rank found now: {} slow episode(s) ended before the job did (BLIP below); step {:.1} ms, baseline {b:.1} ms.",
                    r.transients.len(),
                    r.job.step_time_ms.unwrap_or(b)
                );
            }
            Some(b) => {
                let _ = writeln!(
                    s,
                    "No slow rank found: the job kept its pace (step {:.1} ms, baseline {b:.1} ms).",
                    r.job.step_time_ms.unwrap_or(b)
                );
            }
            // "Kept its pace" is a claim about a baseline: without one the
            // job may have slowed from its first steps on.
            None => {
                let _ = writeln!(
                    s,
                    "No slow rank found, but too few steps were observed after warm-up to tell whether the job slowed (a baseline needs about {} steps).",
                    crate::classify::pace::MIN_BASELINE_STEPS * 3 / 2
                );
            }
        }
    }
}

/// A slowdown the verdicts do not explain, with its leading candidates.
fn human_slowdown(s: &mut String, r: &Report) {
    use std::fmt::Write;
    if let Some(sd) = &r.slowdown {
        let explained: f64 = r
            .verdicts
            .iter()
            .filter(|v| v.active)
            .map(|v| {
                v.cost_estimate
                    .as_ref()
                    .map_or(v.cost_fraction, |e| e.fraction)
            })
            .sum();
        // The verdicts explain the slowdown when their costs add up to
        // most of it (rise is against the baseline; cost against the
        // slower step: convert).
        let needed = sd.rise / (1.0 + sd.rise);
        // A verdict whose cost the what-if could not measure (a GPU with no
        // GPU-side times) is not evidence that something else is wrong.
        let unmeasured: Vec<u32> = r
            .verdicts
            .iter()
            .filter(|v| v.active && v.cost_iterations == 0 && v.cost_estimate.is_none())
            .map(|v| v.rank)
            .collect();
        if explained < 0.5 * needed {
            let _ = writeln!(
                s,
                "UNEXPLAINED SLOWDOWN: the job's step is {:.1} ms against {:.1} ms before (+{:.0}%) since iteration {}, {}.",
                sd.recent_step_ms,
                sd.baseline_step_ms,
                100.0 * sd.rise,
                sd.since_iteration,
                match (unmeasured.is_empty(), r.verdicts.iter().any(|v| v.active)) {
                    (false, _) => format!(
                        "which {} named below may explain: {} cost is not measured (no replay of its iterations timed it)",
                        fmt_ranks(&unmeasured),
                        if unmeasured.len() == 1 { "its" } else { "their" }
                    ),
                    (true, true) => "more than the verdicts below explain".to_string(),
                    (true, false) => "and no rank is named".to_string(),
                }
            );
            for c in &sd.candidates {
                let _ = writeln!(
                    s,
                    "  leading candidate: rank {} (the recent steps waited for it: {:.1}% of the step on average)",
                    c.rank,
                    100.0 * c.cost_fraction
                );
            }
        }
    }
}

/// The stretches of the run slower than the job's own pace, and what was
/// named meanwhile: an ongoing one the slowdown above already tells is
/// not repeated.
fn human_stretches(s: &mut String, r: &Report) {
    use std::fmt::Write;
    for line in stretch_lines(r) {
        let _ = writeln!(s, "SLOWER {line}");
    }
}

/// One line per slow stretch (text and page), without its tag. A stretch
/// wholly within one verdict's time is that verdict's, which the lines
/// below it tell (a fault near the stretches' floor comes and goes in
/// several stretches: the demo's data loader made three); `report.json`
/// keeps every stretch.
pub fn stretch_lines(r: &Report) -> Vec<String> {
    let within_a_verdict = |st: &crate::classify::stretches::Stretch| {
        r.verdicts.iter().any(|v| {
            v.first_seen_iteration <= st.from_iteration
                && v.closed_iteration.is_none_or(|c| c >= st.to_iteration)
        })
    };
    r.slow_stretches
        .iter()
        .filter(|st| !(st.ongoing && r.slowdown.is_some()))
        .filter(|st| !within_a_verdict(st))
        .map(|st| {
            let during: Vec<String> = r
                .verdicts
                .iter()
                .filter(|v| {
                    v.first_seen_iteration <= st.to_iteration
                        && v.closed_iteration.is_none_or(|c| c >= st.from_iteration)
                })
                .map(|v| match &v.structural {
                    Some(x) => match x.stage {
                        Some(stage) => format!("stage {stage} ({})", x.cause.replace('_', " ")),
                        None => x.cause.replace('_', " "),
                    },
                    None => format!("rank {} ({})", v.rank, v.kind.as_str()),
                })
                .collect();
            let why = if !during.is_empty() {
                format!("named meanwhile: {}", during.join(", "))
            } else if r.job.hosts == 1 {
                "no rank was named: on one host every collective runs over NVLink or shared memory, which gives slowrank no GPU-side times, so a slower GPU, pipeline stage or uneven work there is not told apart".to_string()
            } else {
                "no rank was named".to_string()
            };
            format!(
                "iterations {}–{}{}{}: step {:.1} ms against the job's best pace of {:.1} ms (+{:.0}%); {why}.",
                st.from_iteration,
                st.to_iteration,
                if st.from_first_step { " (slow already at the first step read)" } else { "" },
                if st.ongoing { " (to the last step seen)" } else { "" },
                st.step_ms,
                st.pace_ms,
                100.0 * st.rise
            )
        })
        .collect()
}

/// One line per finding: agents gone, exits, a cut report, hangs,
/// stalls, then the verdicts now and before.
fn human_findings(s: &mut String, r: &Report) {
    use std::fmt::Write;
    for a in r
        .agents
        .iter()
        .filter(|a| !a.connected && !a.ranks_unobserved.is_empty())
    {
        let _ = writeln!(
            s,
            "GONE  agent {} on {} went away{} ({}); {} no longer observed",
            a.agent_id,
            a.host,
            a.disconnected_at
                .map_or(String::new(), |t| format!(" at {}", t.format("%H:%M:%S"))),
            a.reason.as_deref().unwrap_or("?"),
            fmt_ranks(&a.ranks_unobserved)
        );
    }
    if !r.job.exited_ranks.is_empty() {
        let _ = writeln!(s, "EXIT  {} exited", fmt_ranks(&r.job.exited_ranks));
    }
    if let Some(t) = &r.truncated {
        let left: Vec<String> = t.left_out.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(
            s,
            "CUT   report cut to {} bytes: left out {}",
            t.bound_bytes,
            left.join(", ")
        );
    }
    for h in r.hangs.iter().filter(|h| h.active) {
        let _ = writeln!(
            s,
            "HANG  {} of communicator {} instance {} never arrived (stuck since iteration {})",
            fmt_missing(h),
            h.communicator,
            h.sequence,
            h.iteration.map_or("?".into(), |i| i.to_string())
        );
    }
    if !r.blocked_hangs.is_empty() {
        let _ = writeln!(
            s,
            "      {} more stuck instance(s) wait only on ranks blocked by the hang above",
            r.blocked_hangs.len()
        );
    }
    if !r.resolved_stalls.is_empty() {
        let mut ranks: Vec<u32> = r
            .resolved_stalls
            .iter()
            .flat_map(|h| h.missing_ranks.iter().copied())
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let _ = writeln!(
            s,
            "STALL {} instance(s) waited past the hang timeout for {}, which arrived later (not a hang)",
            r.resolved_stalls.len(),
            fmt_ranks(&ranks)
        );
    }
    for v in r.verdicts.iter().filter(|v| v.active) {
        let _ = writeln!(s, "NOW   {}", v.headline());
    }
    for v in r.verdicts.iter().filter(|v| !v.active) {
        let _ = writeln!(
            s,
            "WAS   {} (cleared at iteration {})",
            v.headline(),
            v.closed_iteration.map_or("?".into(), |i| i.to_string())
        );
    }
    human_transients(s, r);
}

/// Transients: one line each, the most recent few.
fn human_transients(s: &mut String, r: &Report) {
    use std::fmt::Write;
    const SHOWN: usize = 5;
    let n = r.transients.len();
    for v in r.transients.iter().skip(n.saturating_sub(SHOWN)) {
        let _ = writeln!(
            s,
            "BLIP  {} was {}-slow for {} iteration(s) ({}–{}), then kept pace: a transient, not a straggler",
            crate::verdict::who(v),
            v.kind.as_str(),
            v.slow_iterations(),
            v.first_seen_iteration,
            v.first_seen_iteration + v.slow_iterations() - 1
        );
    }
    if n > SHOWN {
        let _ = writeln!(
            s,
            "      and {} earlier transient(s) (transients[] in report.json)",
            n - SHOWN
        );
    }
}

/// Every verdict as one row of a table.
fn human_verdict_table(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<6} {:<12} {:<14} {:>5} {:>10} {:>8} {:>7} {:>10}  link / whole host / stage",
        "rank", "host", "kind", "conf", "since iter", "active", "cost", "lost GPU-s"
    );
    for v in &r.verdicts {
        let cost = v.cost_cell();
        let _ = writeln!(
            s,
            "{:<6} {:<12} {:<14} {:>5.2} {:>10} {:>8} {:>7} {:>10.2}  {}",
            if v.structural.is_some() {
                "-".to_string()
            } else {
                v.rank.to_string()
            },
            v.host,
            v.kind.as_str(),
            v.confidence,
            v.first_seen_iteration,
            if v.active { "yes" } else { "no" },
            cost,
            v.lost_gpu_seconds,
            match &v.link {
                Some(l) => format!("{}↔{}", l.ranks[0], l.ranks[1]),
                None if !v.ranks.is_empty() => crate::verdict::span(&v.ranks),
                None => String::new(),
            }
        );
    }
}

/// One verdict's evidence and where its flame graph differs.
fn human_verdict_details(s: &mut String, v: &Verdict) {
    use std::fmt::Write;
    let _ = writeln!(s);
    if let Some(st) = &v.structural {
        let _ = match st.stage {
            Some(stage) => {
                writeln!(s, "pipeline stage {stage} (structural: stage imbalance):")
            }
            None => writeln!(s, "work imbalance (structural):"),
        };
    } else if v.ranks.is_empty() {
        let _ = writeln!(s, "rank {} ({}):", v.rank, v.kind.as_str());
    } else {
        let _ = writeln!(
            s,
            "host {}, {} ({}; rank {} costs the most):",
            v.host,
            crate::verdict::span(&v.ranks),
            v.kind.as_str(),
            v.rank
        );
    }
    for e in &v.evidence {
        let _ = writeln!(s, "  - {e}");
    }
    if let Some(f) = &v.flamegraph {
        let _ = writeln!(
            s,
            "  where it differs ({} view, against rank {}; {}):",
            f.view, f.reference_rank, f.diff_svg
        );
        // The training thread's own differences first (on-CPU,
        // then what it waited in); the whole list when unsplit.
        let parts: Vec<_> = f.views.iter().filter(|p| p.part != "all-threads").collect();
        let lists: Vec<(String, &[crate::verdict::flame::FrameDiff])> = if parts.is_empty() {
            vec![(String::new(), &f.top_frames[..])]
        } else {
            parts
                .iter()
                .map(|p| {
                    let head = format!(
                        "    {} ({:.0}% of the thread's time vs {:.0}%):",
                        p.title,
                        100.0 * p.flagged_share,
                        100.0 * p.reference_share
                    );
                    (head, &p.top_frames[..])
                })
                .collect()
        };
        for (head, frames) in lists {
            if !head.is_empty() {
                let _ = writeln!(s, "{head}");
            }
            for t in frames.iter().take(3) {
                let _ = writeln!(
                    s,
                    "    {:>5.1}% vs {:>5.1}%  {}",
                    t.flagged_share * 100.0,
                    t.reference_share * 100.0,
                    short_frame(&t.frame)
                );
            }
        }
    }
}

/// Each hang: who arrived, who is missing and where they stopped.
fn human_hangs(s: &mut String, r: &Report) {
    use std::fmt::Write;
    for h in &r.hangs {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "hang on {} ({} #{}), {}:",
            h.communicator,
            h.op,
            h.sequence,
            if h.active { "active" } else { "resolved" }
        );
        let _ = writeln!(s, "  - arrived: {}", fmt_ranks(&h.present_ranks));
        if let Some(n) = h.missing_count {
            let _ = writeln!(
                s,
                "  - missing: {}; the first {} of them:",
                fmt_missing(h),
                h.missing.len().min(n as usize)
            );
        }
        for m in &h.missing {
            let _ = writeln!(
                s,
                "  - missing rank {} on {}: last issued #{}, last completed #{}",
                m.rank,
                m.host,
                m.last_seq_seen.map_or("none".into(), |x| x.to_string()),
                m.last_completed_seq
                    .map_or("none".into(), |x| x.to_string())
            );
        }
        if !h.exited_ranks.is_empty() {
            let _ = writeln!(s, "  - exited: {}", fmt_ranks(&h.exited_ranks));
        }
    }
}

/// Clock quality, ingest counters and slowrank's own overhead.
fn human_footer(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "clock: max error {} over {} hosts",
        r.clock
            .max_error_us
            .map_or("unknown".into(), |e| format!("{e:.0} µs")),
        r.clock.hosts.len()
    );
    // A host whose probes stopped keeps being mapped on an extrapolated
    // line; say so, since its bound (and every verdict near it) widens.
    for h in &r.clock.hosts {
        if h.probe_samples_seen >= 100 && h.udp_samples == 0 {
            let _ = writeln!(
                s,
                "  - {}: clock probes never answered on the clock port (UDP, `serve --clock-port`); the QUIC fallback is tens of µs less exact",
                h.host
            );
        }
        if let Some(age) = h.probe_age_ms.filter(|a| *a >= STALE_PROBE_MS) {
            let _ = writeln!(
                s,
                "  - {}: no clock probe answered for {:.0} s; bound widened to {}",
                h.host,
                age / 1e3,
                h.error_bound_us
                    .map_or("unknown".into(), |e| format!("{e:.0} µs"))
            );
        }
    }
    let rejected: u64 = r.ingest.counters.records_rejected.values().sum();
    let batches_rejected: u64 = r.ingest.transport_rejected.values().sum();
    if batches_rejected > 0 || r.ingest.agents_refused > 0 {
        let _ = writeln!(
            s,
            "transport: {} batches rejected ({}), {} agent connections refused",
            batches_rejected,
            r.ingest
                .transport_rejected
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.ingest.agents_refused
        );
    }
    let _ = writeln!(
        s,
        "ingest: {} batches, {} records, {} rejected, {} batches missing, {} ring-buffer drops",
        r.ingest.counters.batches,
        r.ingest.counters.records_accepted,
        rejected,
        r.ingest.counters.missing_batches,
        r.ingest.counters.ringbuf_drops
    );
    if r.ingest.counters.replayed_unjoinable > 0 {
        let _ = writeln!(
            s,
            "        {} replayed records belong to instances split by a coordinator restart (not joinable here)",
            r.ingest.counters.replayed_unjoinable
        );
    }
    if let Some(o) = &r.overhead {
        let _ = writeln!(s, "overhead: {}", o.summary);
    }
}

/// A hang's absent members: its ranks, or past the list's bound the
/// count with ranges.
pub(crate) fn fmt_missing(h: &HangReport) -> String {
    match (h.missing_count, &h.missing_ranges) {
        (Some(count), Some(ranges)) => crate::join::MissingSummary {
            count,
            ranges: ranges.clone(),
            unlisted: h.missing_unlisted.unwrap_or(0),
        }
        .describe(),
        _ => {
            // Members no agent announced have no rank to name.
            let unknown = h.missing.iter().filter(|m| m.rank == UNKNOWN_RANK).count();
            match (h.missing_ranks.is_empty(), unknown) {
                (_, 0) => fmt_ranks(&h.missing_ranks),
                (true, n) => format!("{n} member(s) no agent announced"),
                (false, n) => format!(
                    "{} and {n} member(s) no agent announced",
                    fmt_ranks(&h.missing_ranks)
                ),
            }
        }
    }
}

fn fmt_ranks(r: &[u32]) -> String {
    match r {
        [one] => format!("rank {one}"),
        _ => format!(
            "ranks {}",
            r.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The function name without its module path and generic noise, so the
/// table stays readable (the JSON keeps the full name).
pub(crate) fn short_frame(frame: &str) -> &str {
    let cut = frame.rfind(">::").map(|i| i + 3).or_else(|| {
        // `a::b::c` → `c`, but keep `GPU:kernel` whole.
        frame.rfind("::").map(|i| i + 2)
    });
    cut.map_or(frame, |i| &frame[i..])
}

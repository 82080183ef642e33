//! The straggler study's trace against `slowrank analyze`: job slowdown and
//! cost by dp rank and by stage, the study's figures beside slowrank's, as a
//! markdown table (for BENCHMARKS.md), and the analysis time.
//!
//! ```sh
//! cargo run --release -p slowrank-coordinator --example study_compare -- \
//!     ../shared/traces/stragglers-osdi25/trace-AR.parquet
//! ```
//!
//! Two slowrank columns. "verdicts": a rank's cost is its verdict's
//! `cost_fraction` c (the share of the job's time lost to it); as a
//! slowdown, 1 / (1 − c); a group sums its ranks' fractions. "what-if by
//! group": the study's own decomposition asked of slowrank's what-if — each
//! group (a dp rank, a stage; "all" for the job) fixed at its peers' median
//! in every recorded step, the mean share s of the step saved, 1 / (1 − s).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::Value;
use slowrank_coordinator::replay::{self, cli};

fn main() -> Result<()> {
    let parquet = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: study_compare TRACE.parquet")?,
    );
    let result = parquet.with_file_name(
        parquet
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .replace("trace-", "result-")
            .replace(".parquet", ".json"),
    );
    let study: Value = serde_json::from_str(
        &std::fs::read_to_string(&result).with_context(|| result.display().to_string())?,
    )?;
    let t0 = Instant::now();
    let rec = cli::import(
        cli::Format::Study,
        std::slice::from_ref(&parquet),
        &mut |_| {},
    )?;
    let t_read = t0.elapsed().as_secs_f64();
    let out = replay::replay(&rec, &cli::options(cli::Format::Study, None), &mut |_| {})?;
    let t_all = t0.elapsed().as_secs_f64();
    let r = &out.report;
    let (dp, tp) = (4u32, 4u32);
    let mut by_dp: BTreeMap<u32, f64> = BTreeMap::new();
    let mut by_stage: BTreeMap<u32, f64> = BTreeMap::new();
    let mut total = 0.0;
    for v in &r.verdicts {
        total += v.cost_fraction;
        *by_dp.entry((v.rank / tp) % dp).or_default() += v.cost_fraction;
        *by_stage.entry(v.rank / (dp * tp)).or_default() += v.cost_fraction;
    }
    let slow = |c: f64| 1.0 / (1.0 - c).max(1e-9);
    let f = |v: &Value| v.as_f64().map_or("?".into(), |x| format!("{x:.3}"));
    let group = |g: &str| out.groups.iter().find(|x| x.group == g);
    let by_group = |g: &str| group(g).map_or("?".into(), |x| format!("{:.3}", slow(x.share)));
    println!(
        "| figure | study (what-if simulation) | slowrank: verdicts | slowrank: what-if by group |"
    );
    println!("|---|---|---|---|");
    println!(
        "| job slowdown (recorded step / step without the straggler) | {} | {:.3} | {} |",
        f(&study["blocking_slowdown"]),
        slow(total),
        by_group("all")
    );
    let steps: Vec<f64> = study["step_t_base"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    println!(
        "| step as recorded (mean) | {:.2} s | {} | |",
        steps.iter().sum::<f64>() / steps.len().max(1) as f64,
        r.job
            .step_time_ms
            .map_or("?".into(), |s| format!("{:.2} s", s / 1e3))
    );
    for d in 0..dp {
        println!(
            "| slowdown from dp rank {d} | {} | {:.3} | {} |",
            f(&study["blocking_decompose_by_dp_rank"][d.to_string()]),
            slow(by_dp.get(&d).copied().unwrap_or(0.0)),
            by_group(&format!("dp {d}"))
        );
    }
    for s in 0..4u32 {
        println!(
            "| slowdown from stage {s} | {} | {:.3} | {} |",
            f(&study["blocking_decompose_by_stage"][s.to_string()]),
            slow(by_stage.get(&s).copied().unwrap_or(0.0)),
            by_group(&format!("stage {s}"))
        );
    }
    let per_step: Vec<f64> = study["blocking_step_slowdown"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let range = |v: &mut dyn Iterator<Item = f64>| {
        v.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)))
    };
    let (lo, hi) = range(&mut per_step.iter().copied());
    let ours = group("all").map_or("?".into(), |g| {
        let (a, b) = range(&mut g.per_iteration.iter().map(|x| slow(x.1)));
        format!("{a:.3}–{b:.3} over {} iterations", g.per_iteration.len())
    });
    println!(
        "| job slowdown per step (min–max over {} steps) | {lo:.3}–{hi:.3} | one cost per verdict | {ours} |",
        per_step.len()
    );
    println!();
    println!(
        "verdicts: {}",
        if r.verdicts.is_empty() {
            "none".to_owned()
        } else {
            r.verdicts
                .iter()
                .map(|v| v.headline())
                .collect::<Vec<_>>()
                .join("; ")
        }
    );
    println!(
        "iterations observed {}, records {}, analysis {t_all:.2} s (import {t_read:.2} s)",
        r.job.iterations_observed,
        rec.records()
    );
    Ok(())
}

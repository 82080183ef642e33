//! `slowrank analyze` and `slowrank replay`: read a recorded job, replay it,
//! write the report files. The binary's `main` only dispatches here.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{replay, Recording, ReplayError, ReplayOptions, Replayed};
use crate::report::outputs;

/// The formats `analyze` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// slowrank's own agent records: a run directory with `agent-*.jsonl`
    /// (or `.jsonl.gz`) and `clock.json` or the run's `report.json`.
    Records,
    /// PyTorch profiler (Kineto) traces: one `.json` or `.json.gz` per rank.
    Kineto,
    /// The OSDI'25 straggler study's parquet trace, with `meta-*.yaml`
    /// beside it.
    Study,
}

/// Analyze a recorded job offline: the same clock alignment, join, wait
/// graph, verdicts and report as `slowrank serve`, on recorded timelines.
///
/// Examples:
///   slowrank analyze --format records RUN_DIR --out OUT
///   slowrank analyze --format kineto rank0.json.gz rank1.json.gz --out OUT
///   slowrank analyze --format study trace-AR.parquet --out OUT
///
/// OUT gets report.json, report.txt, trace.json (Perfetto) and
/// analysis.json (what the importer could not use, ranks never observed).
/// The output depends on the input only: the same input gives the same
/// bytes.
#[derive(clap::Args, Debug, Clone)]
pub struct AnalyzeArgs {
    /// What the inputs are.
    #[arg(long, value_enum, default_value = "records")]
    pub format: Format,
    /// Input files or (records) run directories.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Directory for the report files (created).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Print the stable JSON report instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Iterations at the start that never raise a verdict, at most (the
    /// warm-up ends sooner once the steps settle, [lifecycle]
    /// warmup_settle) [default: 20 for records, as `serve`; 0 for traces,
    /// which are usually cut from a job already past its warm-up].
    #[arg(long, value_name = "N")]
    pub warmup_iterations: Option<u64>,
    /// A TOML file of thresholds to use instead of the defaults (only the
    /// keys it names change; `slowrank thresholds` prints them all). An
    /// unknown key is an error. `--warmup-iterations` still wins, and
    /// traces keep a warm-up of 0 unless that flag says otherwise.
    #[arg(long, value_name = "FILE")]
    pub thresholds: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Reads `paths` in `format` into a recording.
pub fn import(
    format: Format,
    paths: &[PathBuf],
    progress: &mut dyn FnMut(f64),
) -> Result<Recording, ReplayError> {
    for p in paths {
        if !p.exists() {
            return Err(ReplayError::io(
                p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        }
    }
    match format {
        Format::Records => super::records::load(paths),
        Format::Kineto => super::kineto::load(paths, progress),
        Format::Study => super::study::load(paths, progress),
    }
}

/// Options for a format: only the warm-up differs (see `--warmup-iterations`).
pub fn options(format: Format, warmup: Option<u64>) -> ReplayOptions {
    options_with(crate::analyzer::AnalyzerConfig::default(), format, warmup)
}

/// [`options`] over `config` (a `--thresholds` file's) instead of the defaults.
pub fn options_with(
    config: crate::analyzer::AnalyzerConfig,
    format: Format,
    warmup: Option<u64>,
) -> ReplayOptions {
    let mut o = ReplayOptions {
        config,
        ..ReplayOptions::default()
    };
    o.config.lifecycle.warmup_iterations = warmup.unwrap_or(match format {
        Format::Records => o.config.lifecycle.warmup_iterations,
        Format::Kineto | Format::Study => 0,
    });
    o
}

/// Prints "analyze: STAGE NN%" at most every 10% (or in place on a terminal).
struct Progress {
    quiet: bool,
    tty: bool,
    stage: &'static str,
    last: i32,
}

impl Progress {
    fn report(&mut self, f: f64) {
        let pct = (f * 100.0) as i32;
        if self.quiet || pct / 10 == self.last / 10 {
            return;
        }
        self.last = pct;
        if self.tty {
            eprint!("\ranalyze: {} {pct:3}%", self.stage);
            if pct >= 100 {
                eprintln!();
            }
        } else {
            eprintln!("analyze: {} {pct}%", self.stage);
        }
    }
}

/// The analysis sidecar: what was read and what could not be used.
pub fn analysis_json(args: &AnalyzeArgs, rec: &Recording, r: &Replayed) -> serde_json::Value {
    let names: Vec<String> = args
        .paths
        .iter()
        .map(|p| {
            p.file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
        })
        .collect();
    serde_json::json!({
        "format": format!("{:?}", args.format).to_lowercase(),
        "inputs": names,
        "hosts": rec.hosts.len(),
        "batches": rec.hosts.iter().map(|h| h.batches.len()).sum::<usize>(),
        "records": rec.records(),
        "world_size": rec.world_size,
        "steps_marked": rec.steps,
        "unobserved_ranks": rec.unobserved_ranks(),
        "notes": rec.notes,
        "alerts": r.lines,
        "what_if_by_group": r.groups,
    })
}

/// Runs `slowrank analyze`.
pub fn run(args: &AnalyzeArgs) -> Result<Replayed, ReplayError> {
    let t0 = Instant::now();
    let mut p = Progress {
        quiet: args.quiet,
        tty: std::io::stderr().is_terminal(),
        stage: "reading",
        last: -10,
    };
    let rec = import(args.format, &args.paths, &mut |f| p.report(f))?;
    let read_s = t0.elapsed().as_secs_f64();
    p.stage = "replaying";
    p.last = -10;
    let config = match &args.thresholds {
        Some(p) => crate::thresholds::load(p)?,
        None => crate::analyzer::AnalyzerConfig::default(),
    };
    let out = replay(
        &rec,
        &options_with(config, args.format, args.warmup_iterations),
        &mut |f| p.report(f),
    )?;
    write(&args.out, &out, &analysis_json(args, &rec, &out))?;
    if !args.quiet {
        for n in &rec.notes {
            eprintln!("note: {n}");
        }
        let missing = rec.unobserved_ranks();
        if !missing.is_empty() {
            eprintln!(
                "note: {} of {} ranks were not observed: {}",
                missing.len(),
                rec.world_size.unwrap_or(0),
                super::kineto::compact(&missing)
            );
        }
        if !out.groups.is_empty() {
            eprintln!("what-if by the source's own groups (each fixed at its peers' median, mean share of the step saved):");
            for g in &out.groups {
                eprintln!(
                    "  {:<10} {:>6.1}%  over {} iterations (ranks {})",
                    g.group,
                    g.share * 100.0,
                    g.per_iteration.len(),
                    super::kineto::compact(&g.ranks)
                );
            }
        }
        eprintln!(
            "analyze: {} records from {} hosts in {:.2} s (read {:.2} s); report in {}",
            rec.records(),
            rec.hosts.len(),
            t0.elapsed().as_secs_f64(),
            read_s,
            args.out.display()
        );
    }
    Ok(out)
}

fn write(dir: &Path, out: &Replayed, analysis: &serde_json::Value) -> Result<(), ReplayError> {
    let err = |e: outputs::OutputError| ReplayError::io(dir, std::io::Error::other(e.to_string()));
    outputs::write_all(dir, &out.report, &out.trace).map_err(err)?;
    let text = serde_json::to_string_pretty(analysis).unwrap_or_default();
    outputs::write_atomic(dir, "analysis.json", text.as_bytes()).map_err(err)
}

//! `slowrank-scenario`: runs simulated training jobs with injected faults.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use slowrank_scenarios::{
    orchestrate::Mode,
    run::{run, RunOptions},
    spec::Spec,
    truth::Outcome,
};

#[derive(Parser)]
#[command(
    name = "slowrank-scenario",
    about = "Run simulated multi-rank GPU training jobs with injected faults and ground truth",
    long_about = "Runs a scenario (a TOML spec: layout, modelled step, faults) as N rank processes \
started like torchrun, over ABI-true stand-ins of libnccl.so.2, libcudart.so.12, libibverbs.so.1 \
and an mlx5 provider, and writes the ground truth (truth.json) and per-rank step times (steps.csv)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a scenario and write DIR/truth.json, DIR/steps.csv and DIR/logs/.
    Run {
        /// Scenario spec (TOML), e.g. scenarios/specs/dp8-compute-slow.toml.
        spec: PathBuf,
        /// Output directory (created; existing files are overwritten).
        #[arg(long)]
        out: PathBuf,
        /// Run the job alone, without coordinator and agents.
        #[arg(long)]
        no_agent: bool,
        /// Stop the run after this many seconds (overrides run.timeout_s).
        #[arg(long)]
        timeout: Option<f64>,
        /// Run at most this many iterations (overrides `iterations`; faults
        /// past the end are dropped).
        #[arg(long)]
        iterations: Option<u64>,
        /// Trainer binary (default: slowrank-trainer next to this binary).
        #[arg(long)]
        trainer: Option<PathBuf>,
        /// Log every NIC completion and NCCL operation to DIR/sim/.
        #[arg(long)]
        trace: bool,
        /// Keep every host in this machine's network namespace. By default,
        /// as root with hosts > 1, each host (its agent and its ranks) runs
        /// in its own network namespace joined by veth, so its link to the
        /// coordinator is a real one that can be taken down or shaped.
        #[arg(long)]
        no_netns: bool,
    },
    /// Score DIR/report.json (the coordinator's) against DIR/truth.json:
    /// per fault matched or missed, false verdicts listed. Exits 1 on any
    /// miss or false finding, 2 when the files cannot be read.
    Score {
        /// Output directory of `slowrank-scenario run`.
        dir: PathBuf,
        /// Print the score as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate: run every spec (default scenarios/specs/, or --random N
    /// generated ones) --seeds times in agent mode, and again without its
    /// faults (the counterfactual: what each fault really cost the job);
    /// score each against its truth, and print the harness's noise floor,
    /// per-class precision/recall, cost error, time to name by measured
    /// cost, false verdicts per healthy hour, a confusion table and the
    /// report's step time against the job's, for slowrank and two naive
    /// baselines on the same runs. Writes OUT/eval.json.
    Eval {
        /// Spec files or directories of specs.
        specs: Vec<PathBuf>,
        /// Runs per spec, each with a different seed (spec seed + 1000·k).
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// Output directory (one small directory per run + eval.json).
        #[arg(long)]
        out: PathBuf,
        /// A few-minute subset for CI: 4 specs (healthy, compute, host, link), 1 seed.
        #[arg(long)]
        quick: bool,
        /// Run at most this many iterations per spec.
        #[arg(long)]
        iterations: Option<u64>,
        /// Latency sweep instead of the matrix: dp8-compute-slow with its
        /// slowdown factor set to each of these (e.g. 1.05,1.1,1.3,2).
        #[arg(long, value_delimiter = ',')]
        sweep_factors: Vec<f64>,
        /// With --sweep-factors: stretch the kernels so one step's GPU work
        /// takes about MS (the spec's is ≈ 48 ms; real training steps take
        /// 0.3–10 s, and some detection costs are fixed in seconds).
        #[arg(long, value_name = "MS", requires = "sweep_factors")]
        sweep_step_ms: Option<f64>,
        /// Keep whole run directories (agent records, libs); default keeps
        /// truth.json, report.json, steps.csv, logs.
        #[arg(long)]
        keep_runs: bool,
        /// Print eval.json instead of the tables.
        #[arg(long)]
        json: bool,
        /// Instead of spec files: N specs drawn by the random generator
        /// (layouts, step shapes, noise, clock skew, 0–2 faults of every
        /// kind incl. structural, healthy runs), written to OUT/<n>/spec.toml
        /// so any one reruns alone with `run OUT/<n>/spec.toml`.
        #[arg(long, value_name = "N")]
        random: Option<u64>,
        /// Seed of --random (choose thresholds on one seed, report on another).
        #[arg(long, default_value_t = 1, requires = "random")]
        seed: u64,
        /// With --random: most ranks per spec (8–64; 16 fits a 2-vCPU machine).
        #[arg(long, default_value_t = slowrank_scenarios::random::DEFAULT_MAX_RANKS, requires = "random")]
        max_ranks: u32,
        /// Stretch every spec's kernels so one step's GPU work takes about MS:
        /// the harness's own noise (2 cores shared by every rank's threads)
        /// is then a smaller share of the step.
        #[arg(long, value_name = "MS")]
        step_ms: Option<f64>,
        /// Pairs of identical healthy runs behind the printed noise floor
        /// (each costs one extra run).
        #[arg(long, default_value_t = slowrank_scenarios::eval::DEFAULT_NOISE_PAIRS)]
        noise_pairs: u64,
        /// Make the counterfactual runs (the same spec without its faults,
        /// which measure what each fault cost) and the noise runs without
        /// agents. Default: with agents, like the evaluated run, so the
        /// probes' own cost is on both sides of the difference.
        #[arg(long)]
        counterfactual_job_only: bool,
        /// Keep the specs OUT already holds finished (each run directory's
        /// done.json) and run only the rest: an evaluation cut off (a
        /// 100-spec random one takes hours) goes on where it stopped. With
        /// `--random K` smaller than the first run's N it scores the first K
        /// specs without running anything. Use the same options and build.
        #[arg(long)]
        resume: bool,
    },
    /// Synthetic load: play N ranks (8 per simulated host, one QUIC
    /// connection per host) into a child `slowrank serve`, with a hidden slow
    /// rank, and print ingest rate, coordinator CPU/RSS over time and the
    /// time from onset to verdict as JSON.
    Flood {
        /// Simulated ranks (a multiple of 8).
        #[arg(long, default_value_t = 1024)]
        ranks: u32,
        /// Collectives per rank per second.
        #[arg(long, default_value_t = 100.0)]
        collectives_per_s: f64,
        /// Seconds of load.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// The hidden slow rank (its GPU reaches collectives --delay-us late from --onset on).
        #[arg(long)]
        slow_rank: Option<u32>,
        /// Seconds after the start when the slow rank turns slow.
        #[arg(long, default_value_t = 5.0)]
        onset: f64,
        /// Lateness of the slow rank per collective (µs).
        #[arg(long, default_value_t = 2000.0)]
        delay_us: f64,
        /// How often each simulated agent ships a batch (the agent's
        /// --flush-ms, whose default this is). The coordinator's cost per
        /// batch sets how many hosts it can take at a given rate: raise it
        /// with the host count.
        #[arg(long, default_value_t = 200)]
        flush_ms: u64,
        /// Working directory (certificate, coordinator log and report).
        #[arg(long, default_value = "/tmp/slowrank-flood")]
        out: PathBuf,
    },
    /// Write the specs `eval --random N --seed S` would run, without
    /// running them: OUT/<n>/spec.toml and a one-line summary of each
    /// (layout and faults). Pick a tuning set by fault kind, then `run`
    /// any one alone.
    Random {
        /// How many specs.
        #[arg(value_name = "N")]
        n: u64,
        /// Seed of the generator (the same as eval's --seed).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Most ranks per spec (eval's --max-ranks).
        #[arg(long, default_value_t = slowrank_scenarios::random::DEFAULT_MAX_RANKS)]
        max_ranks: u32,
        /// Where to write OUT/<n>/spec.toml (default: print only).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Parse and validate specs, printing a one-line summary of each.
    Check {
        /// Spec files.
        #[arg(required = true)]
        specs: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        // stdout carries results (tables, JSON); logs go to stderr.
        .with_writer(std::io::stderr)
        .init();
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// One line: name, layout, and each fault's kind, targets and onset.
fn summary(s: &Spec) -> String {
    let faults: Vec<String> = s
        .faults
        .iter()
        .map(|f| {
            let who = match f.stage {
                Some(st) => format!("stage {st}"),
                None if f.targets().is_empty() => String::from("all"),
                None => format!("{:?}", f.targets()),
            };
            format!(
                "{:?} {who} from {}{}",
                f.kind,
                f.start_iteration,
                f.end_iteration
                    .map(|e| format!(" to {e}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    format!(
        "{}: {} ranks ({}x{}), tp={} pp={} dp={}, {} iterations, faults: {}",
        s.name,
        s.world_size(),
        s.hosts,
        s.ranks_per_host,
        s.parallel.tp,
        s.parallel.pp,
        s.parallel.dp,
        s.iterations,
        if faults.is_empty() {
            String::from("none")
        } else {
            faults.join("; ")
        }
    )
}

fn real_main() -> anyhow::Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Score { dir, json } => {
            let s = slowrank_scenarios::score::score_dir(&dir)
                .with_context(|| format!("scoring {}", dir.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", slowrank_scenarios::score::render(&s));
            }
            Ok(if s.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Eval {
            specs,
            seeds,
            out,
            quick,
            iterations,
            sweep_factors,
            sweep_step_ms,
            keep_runs,
            json,
            random,
            seed,
            max_ranks,
            step_ms,
            noise_pairs,
            counterfactual_job_only,
            resume,
        } => {
            let specs = if specs.is_empty() {
                vec![PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/specs"))]
            } else {
                specs
            };
            let mut opts = slowrank_scenarios::eval::EvalOptions::new(specs, out);
            opts.seeds = if quick { 1 } else { seeds };
            opts.quick = quick;
            opts.iterations = iterations;
            opts.sweep_factors = sweep_factors;
            opts.sweep_step_ms = sweep_step_ms;
            opts.keep_runs = keep_runs;
            opts.random = random.map(|n| (n, seed));
            opts.random_opts.max_ranks = max_ranks;
            if let Some(n) = iterations {
                opts.random_opts.iterations = n;
            }
            opts.step_ms = step_ms;
            opts.noise_pairs = noise_pairs;
            if counterfactual_job_only {
                opts.counterfactual_mode = Mode::JobOnly;
            }
            opts.resume = resume;
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            let r = slowrank_scenarios::eval::run_eval(&opts, command)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", slowrank_scenarios::eval::render(&r));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Flood {
            ranks,
            collectives_per_s,
            seconds,
            slow_rank,
            onset,
            delay_us,
            flush_ms,
            out,
        } => {
            let r = slowrank_scenarios::flood::flood(&slowrank_scenarios::flood::FloodOptions {
                ranks,
                collectives_per_s,
                seconds,
                slow_rank,
                onset_s: onset,
                delay_us,
                flush_ms,
                out,
            })?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Random {
            n,
            seed,
            max_ranks,
            out,
        } => {
            let o = slowrank_scenarios::random::RandomOptions {
                max_ranks,
                ..Default::default()
            };
            for (k, s) in slowrank_scenarios::random::specs(seed, n, &o)
                .iter()
                .enumerate()
            {
                if let Some(out) = &out {
                    let dir = out.join(k.to_string());
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    std::fs::write(dir.join("spec.toml"), toml::to_string(s)?)
                        .with_context(|| format!("writing {}", dir.display()))?;
                }
                println!("{k:>3} {}", summary(s));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check { specs } => {
            for p in specs {
                println!("{}", summary(&Spec::load(&p)?));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            spec,
            out,
            no_agent,
            timeout,
            iterations,
            trainer,
            trace,
            no_netns,
        } => {
            let mut s = Spec::load(&spec)?;
            if let Some(n) = iterations {
                s.iterations = n;
                s.faults.retain(|f| f.start_iteration < n);
                s.validate()?;
            }
            let opts = RunOptions {
                out,
                mode: if no_agent {
                    Mode::JobOnly
                } else {
                    Mode::WithAgents
                },
                trainer,
                timeout: timeout.map(Duration::from_secs_f64),
                progress: true,
                trace,
                netns: !no_netns,
            };
            let summary = run(&s, &opts).with_context(|| format!("scenario {}", s.name))?;
            let t = &summary.truth;
            println!(
                "{}: {:?} ({}) after {:.1} s, {}/{} iterations; truth: {}, steps: {}",
                t.scenario,
                t.outcome,
                t.reason,
                summary.wall.as_secs_f64(),
                t.iterations_completed,
                t.iterations,
                summary.out.join("truth.json").display(),
                summary.out.join("steps.csv").display()
            );
            Ok(match t.outcome {
                Outcome::Completed | Outcome::Hang => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            })
        }
    }
}

//! The launcher: lays out a run directory, starts the hub and the rank
//! processes the way torchrun does, watches them (progress, hangs, timeouts,
//! failures, Ctrl-C), stops them all, and writes `truth.json` and
//! `steps.csv`.

use std::{
    collections::HashSet,
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use slowrank_sim::{
    clock,
    control::{self, Control},
    env,
    hub::Hub,
    report::Report,
};
use tracing::{info, warn};

use crate::{
    children::{self, Children},
    libs::{self, LibDir, LibError},
    netns::{NetnsError, Network},
    orchestrate::{self, Mode, OrchestrateError},
    shaping::{self, Shaping},
    spec::{FaultKind, Spec},
    steps::{StepLog, StepTime},
    truth::{
        Blocked, FaultTruth, InjectedClock, Outcome, RankTruth, Truth, WindowLog, TRUTH_VERSION,
    },
};

/// How to run a scenario.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Run directory (created).
    pub out: PathBuf,
    pub mode: Mode,
    /// The trainer binary; found next to the current executable if `None`.
    pub trainer: Option<PathBuf>,
    /// Overrides the spec's `run.timeout_s`.
    pub timeout: Option<Duration>,
    /// Log a progress line every couple of seconds.
    pub progress: bool,
    /// Have each rank log every NIC completion to `DIR/sim/nic-rank-N.log`
    /// (`qp_num dlid bytes posted_ns completed_ns polled_ns`) and every
    /// NCCL operation to `DIR/sim/coll-rank-N.log` (`key host_ns arrive_ns
    /// release_ns done_ns finished_ns posted_ns`).
    pub trace: bool,
    /// As root with `hosts > 1`, run each host in its own network
    /// namespace joined by veth (see [`crate::netns`]); otherwise hosts are
    /// logical groups sharing the machine's network. With namespaces, a
    /// spec's `communication` faults shape each NIC's port replica on its
    /// host's veth with `tc` (see [`crate::shaping`]); each host's final
    /// class counters go to `DIR/logs/tc-host-N.txt`.
    pub netns: bool,
}

impl RunOptions {
    pub fn job_only(out: impl Into<PathBuf>) -> Self {
        Self {
            out: out.into(),
            mode: Mode::JobOnly,
            trainer: None,
            timeout: None,
            progress: false,
            trace: false,
            netns: true,
        }
    }
}

/// What a finished run produced.
#[derive(Debug)]
pub struct RunSummary {
    pub out: PathBuf,
    pub libs: LibDir,
    pub truth: Truth,
    pub steps: StepLog,
    pub wall: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Libs(#[from] LibError),
    #[error(transparent)]
    Orchestrate(#[from] OrchestrateError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the hub: {0}")]
    Hub(#[from] slowrank_sim::hub::HubError),
    #[error("cannot create a control block: {0}")]
    Control(#[from] slowrank_sim::control::ControlError),
    #[error("the trainer binary slowrank-trainer was not found; build it with `cargo build -p slowrank-scenarios`")]
    NoTrainer,
    #[error("cannot start rank {rank}: {source}")]
    Spawn { rank: u32, source: std::io::Error },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RunError {
    let path = path.display().to_string();
    move |source| RunError::Io { what, path, source }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Unix socket paths are limited to 108 bytes.
pub(crate) fn socket_path(out: &Path) -> PathBuf {
    let p = out.join("sim").join("hub.sock");
    if p.as_os_str().len() < 100 {
        p
    } else {
        std::env::temp_dir().join(format!(
            "slowrank-hub-{}-{}.sock",
            std::process::id(),
            clock::mono_ns()
        ))
    }
}

/// Runs `spec` to the end (completion, hang held, failure, timeout or
/// interruption) and writes the truth and step times into `opts.out`.
pub fn run(spec: &Spec, opts: &RunOptions) -> Result<RunSummary, RunError> {
    let out = &opts.out;
    for d in [out.clone(), out.join("logs"), out.join("sim")] {
        fs::create_dir_all(&d).map_err(io("cannot create", &d))?;
    }
    // A coordinator resumes from what it finds in --out (docs/operations.md,
    // "what survives a restart"): a new run must not inherit an old one's.
    for stale in ["report.json", "ingested.jsonl"] {
        let _ = fs::remove_file(out.join(stale));
    }
    let spec_path = out.join("spec.toml");
    let spec_text = toml::to_string(spec).expect("a spec always serialises");
    fs::write(&spec_path, spec_text).map_err(io("cannot write", &spec_path))?;
    let libs = libs::prepare(&out.join("lib"))?;
    let trainer = opts
        .trainer
        .clone()
        .or_else(|| libs::find_binary("slowrank-trainer"))
        .ok_or(RunError::NoTrainer)?;

    let (tx, rx) = mpsc::channel();
    let hub = Hub::start(&socket_path(out), Some(tx))?;
    // Declared before the services and the ranks: dropped after them.
    let net = if opts.netns && spec.hosts > 1 && is_root() {
        Network::create(spec.hosts)?
    } else {
        Network::default()
    };
    // Dropped before the namespaces: the echo sink stops first.
    let mut shaping = if shaping::wanted(spec, &net) {
        match Shaping::install(spec, &net) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!("{e}; communication faults act through the model's NIC knobs instead");
                None
            }
        }
    } else {
        None
    };
    // Before the services: a SIGTERM while they start must stop them, not
    // kill this process and leave them behind.
    children::catch_signals();
    let services = orchestrate::start(spec, out, opts.mode, &net)?;

    let started_wall_ns = clock::wall_ns();
    let started_mono_ns = clock::mono_ns();
    let run_id = format!("{}-{}", spec.name, started_wall_ns / 1_000_000);
    let layout = spec.layout();
    let model = serde_json::to_string(&spec.sim_model()).expect("model serialises");
    let ld_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", libs.dir.display()),
        _ => libs.dir.display().to_string(),
    };
    let master_port = 29500 + (std::process::id() % 1000);

    let mut kids = Children::default();
    for rank in 0..spec.world_size() {
        let host = layout.host_of(rank);
        let local = layout.local_of(rank);
        let ctl = out.join("sim").join(format!("rank-{rank}.ctl"));
        Control::create(&ctl)?;
        // Senders read their peer NIC's knobs through this link (nic.rs).
        let peer_link = Control::peer_path(&ctl, control::lid_of(host, local));
        let _ = fs::remove_file(&peer_link);
        std::os::unix::fs::symlink(format!("rank-{rank}.ctl"), &peer_link)
            .map_err(io("cannot link", &peer_link))?;
        let log_path = out.join("logs").join(format!("rank-{rank}.log"));
        let log = File::create(&log_path).map_err(io("cannot create", &log_path))?;
        let log2 = log.try_clone().map_err(io("cannot open", &log_path))?;
        let mut cmd = match net.host(host) {
            Some(hn) => hn.wrap(&trainer),
            None => Command::new(&trainer),
        };
        cmd.env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", spec.world_size().to_string())
            .env("LOCAL_WORLD_SIZE", spec.ranks_per_host.to_string())
            .env("GROUP_RANK", host.to_string())
            .env("GROUP_WORLD_SIZE", spec.hosts.to_string())
            .env("ROLE_RANK", rank.to_string())
            .env("ROLE_WORLD_SIZE", spec.world_size().to_string())
            .env("ROLE_NAME", "default")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", master_port.to_string())
            .env("TORCHELASTIC_RUN_ID", &run_id)
            .env("TORCHELASTIC_RESTART_COUNT", "0")
            .env("TORCHELASTIC_MAX_RESTARTS", "0")
            .env("OMP_NUM_THREADS", "1")
            .env("LD_LIBRARY_PATH", &ld_path)
            .env(env::HUB, hub.path())
            .env(env::CONTROL, &ctl)
            .env(env::RANK, rank.to_string())
            .env(env::HOST, host.to_string())
            .env(env::LOCAL, local.to_string())
            .env(env::MODEL, &model)
            .env(env::SPEC, &spec_path)
            .env(env::RUN_DIR, out)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        if let Some(wire) = shaping.as_ref().and_then(|s| s.wire_addr(host)) {
            cmd.env(env::WIRE, wire.to_string());
        }
        if opts.trace {
            let sim = out.join("sim");
            cmd.env(
                "SLOWRANK_SIM_NIC_TRACE",
                sim.join(format!("nic-rank-{rank}.log")),
            )
            .env(
                "SLOWRANK_SIM_COLL_TRACE",
                sim.join(format!("coll-rank-{rank}.log")),
            );
        }
        children::prepare(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|source| RunError::Spawn { rank, source })?;
        kids.push(rank, child);
    }
    info!(
        "{}: {} ranks on {} hosts (tp={} pp={} dp={}), {} iterations, output in {}",
        spec.name,
        spec.world_size(),
        spec.hosts,
        spec.parallel.tp,
        spec.parallel.pp,
        spec.parallel.dp,
        spec.iterations,
        out.display()
    );

    let start = Instant::now();
    let timeout = opts
        .timeout
        .unwrap_or(Duration::from_secs_f64(spec.run.timeout_s));
    let mut steps = StepLog::default();
    let mut windows = WindowLog::default();
    let mut done = HashSet::new();
    let mut exits: Vec<Option<i32>> = vec![None; spec.world_size() as usize];
    let mut hang_since: Option<Instant> = None;
    let mut all_exited: Option<Instant> = None;
    let mut last_progress = Instant::now();
    let mut last_print = Instant::now();
    let (outcome, reason) = loop {
        if let Ok(r) = rx.recv_timeout(Duration::from_millis(100)) {
            for r in std::iter::once(r).chain(rx.try_iter()) {
                match r {
                    Report::Step {
                        rank,
                        iteration,
                        start_ns,
                        end_ns,
                        wall_ns,
                    } => {
                        steps.add(StepTime {
                            rank,
                            iteration,
                            start_ns,
                            end_ns,
                            wall_ns,
                        });
                        last_progress = Instant::now();
                    }
                    Report::Fault {
                        fault,
                        rank,
                        active,
                        iteration,
                        mono_ns,
                        wall_ns,
                    } => {
                        windows.record(fault, active, iteration, mono_ns, wall_ns);
                        if let Some(s) = shaping.as_mut() {
                            s.on_fault(fault, rank, active);
                        }
                        if active
                            && spec
                                .faults
                                .get(fault)
                                .is_some_and(|f| f.kind == FaultKind::Hang)
                        {
                            hang_since.get_or_insert_with(Instant::now);
                        }
                    }
                    Report::Done { rank } => {
                        done.insert(rank);
                    }
                    Report::Hello { .. } => {}
                }
            }
        }
        let mut failed = None;
        for (rank, child) in &mut kids.procs {
            if let Ok(Some(status)) = child.try_wait() {
                exits[*rank as usize] = Some(status.code().unwrap_or(-1));
                if !status.success() && failed.is_none() {
                    failed = Some(format!(
                        "rank {rank} exited with {status} (see logs/rank-{rank}.log)"
                    ));
                }
            }
        }
        if let Some(why) = failed {
            break (Outcome::Failed, why);
        }
        if exits.iter().all(|e| *e == Some(0)) {
            // A rank's last reports travel through the hub thread and may
            // still be queued when its exit is seen: wait for every `Done`
            // (bounded) so the truth counts the final iteration.
            let since = *all_exited.get_or_insert_with(Instant::now);
            if done.len() as u32 >= spec.world_size() || since.elapsed() >= Duration::from_secs(3) {
                break (Outcome::Completed, "every rank finished".to_string());
            }
            continue;
        }
        if let Some(h) = hang_since {
            if h.elapsed() >= Duration::from_secs_f64(spec.run.hang_hold_s) {
                break (
                    Outcome::Hang,
                    format!("hang injected and held for {} s", spec.run.hang_hold_s),
                );
            }
        }
        if children::interrupted() {
            break (Outcome::Interrupted, "interrupted".to_string());
        }
        if start.elapsed() >= timeout {
            break (
                Outcome::Timeout,
                format!("time limit of {:.0} s reached", timeout.as_secs_f64()),
            );
        }
        if hang_since.is_none()
            && last_progress.elapsed() >= Duration::from_secs_f64(spec.run.stall_s)
        {
            break (
                Outcome::Stalled,
                format!("no iteration finished for {} s", spec.run.stall_s),
            );
        }
        if opts.progress && last_print.elapsed() >= Duration::from_secs(2) {
            last_print = Instant::now();
            let it = (0..spec.world_size())
                .map(|r| steps.done_by(r))
                .min()
                .unwrap_or(0);
            let report = fs::read_to_string(out.join("report.json")).ok();
            let open = report.as_deref().and_then(crate::progress::open_verdicts);
            info!(
                "{}",
                crate::progress::line(
                    &spec.name,
                    it,
                    spec.iterations,
                    steps.recent_median_ns(10).map(|n| n as f64 / 1e6),
                    start.elapsed().as_secs_f64(),
                    open.as_deref(),
                )
            );
        }
    };
    // What never completed, before the members are killed.
    let blocked = hub
        .pending()
        .into_iter()
        .map(|p| Blocked {
            key: p.key,
            members: p.n,
            arrived: p.arrived,
            since_mono_ns: p.since_ns,
        })
        .collect();
    let pids = kids.pids();
    kids.kill_all(Duration::from_millis(500));
    if let Some(s) = shaping.take() {
        s.save_stats(&out.join("logs"));
    }
    for (rank, child) in &mut kids.procs {
        if exits[*rank as usize].is_none() {
            exits[*rank as usize] = child.try_wait().ok().flatten().and_then(|s| s.code());
        }
    }
    drop(services);
    drop(hub);
    match outcome {
        Outcome::Completed | Outcome::Hang => info!("{}: {reason} ({outcome:?})", spec.name),
        _ => warn!("{}: {reason} ({outcome:?})", spec.name),
    }

    let truth = Truth {
        version: TRUTH_VERSION,
        scenario: spec.name.clone(),
        seed: spec.seed,
        run_id,
        hosts: spec.hosts,
        ranks_per_host: spec.ranks_per_host,
        world_size: spec.world_size(),
        parallel: spec.parallel,
        iterations: spec.iterations,
        iterations_completed: (0..spec.world_size())
            .map(|r| steps.done_by(r))
            .min()
            .unwrap_or(0),
        outcome,
        reason,
        started_wall_ns,
        ended_wall_ns: clock::wall_ns(),
        started_mono_ns,
        ranks: (0..spec.world_size())
            .map(|r| RankTruth {
                rank: r,
                host: layout.host_of(r),
                local_rank: layout.local_of(r),
                pid: pids[r as usize],
                coords: layout.coords(r),
                exit: exits[r as usize],
            })
            .collect(),
        hosts_clock: orchestrate::host_plans(spec)
            .into_iter()
            .map(|h| InjectedClock {
                host: h.host,
                offset_us: h.clock_offset_us,
                drift_ppm: h.clock_drift_ppm,
            })
            .collect(),
        faults: spec
            .faults
            .iter()
            .enumerate()
            .map(|(i, f)| FaultTruth {
                index: i,
                kind: f.kind,
                ranks: spec.fault_ranks(f),
                spec: f.clone(),
                windows: windows.windows_of(i),
                cost: None,
            })
            .collect(),
        blocked,
    };
    let truth_path = out.join("truth.json");
    let json = serde_json::to_string_pretty(&truth).expect("truth serialises");
    fs::write(&truth_path, json).map_err(io("cannot write", &truth_path))?;
    let steps_path = out.join("steps.csv");
    steps
        .write_csv(&steps_path)
        .map_err(io("cannot write", &steps_path))?;
    Ok(RunSummary {
        out: out.clone(),
        libs,
        truth,
        steps,
        wall: start.elapsed(),
    })
}

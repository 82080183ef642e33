//! `slowrank-agent`: one per host, next to torchrun or wrapping it.
use std::{
    fs::File,
    io::{BufWriter, Write},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, Result};
use clap::Parser;
use slowrank_agent::{
    agent::Agent,
    announced::Announced,
    clock::{self, HostClock},
    discover::Scanner,
    fold::Limits,
    output,
    probes::Probes,
    ship::{client_config_with, ClientIdentity, Uplink, UplinkConfig},
    stack_collector::StackCollector,
    stackfeed::StackFeed,
    stacks::StackConfig,
    stackworker::StackWorker,
};
use slowrank_shared::wire::{self, Batch, Hello};
use tokio::signal::unix::{signal, SignalKind};

/// How long the agent waits at exit for the stack thread to fold the last
/// window (its first symbolization of a process can take seconds).
const STACKS_SETTLE: Duration = Duration::from_secs(20);

/// Shortest and longest wait between two drains of the event ring. The
/// probes submit without a wakeup, so the ring is polled; the wait follows
/// what each drain found (`cadence.rs`). A drain that finds 1/16 of the
/// 1-MiB ring (≈ 800 call records of 80 bytes) goes back to 5 ms, so only a
/// jump from under 5,000 records a second to over 300,000 within one 40-ms
/// wait could fill it.
/// A loop branch that takes longer than this is logged (see the loop).
const LOOP_STALL: Duration = Duration::from_millis(250);
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(40);

mod doctor;

/// Watches the rank processes on this host with eBPF and ships what they do
/// to the slowrank coordinator.
///
/// Needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN) and Linux ≥ 5.15.
///
/// Examples:
///
///   # wrap the job; the agent exits with the job's exit code
///   slowrank-agent --coordinator 10.0.0.1:7700 --ca coordinator.crt -- torchrun ...
///
///   # follow every rank process on this host (torchrun/Slurm/Open MPI env)
///   slowrank-agent --coordinator 10.0.0.1:7700 --ca coordinator.crt
///
///   # records as JSON lines, no coordinator
///   slowrank-agent --output records.jsonl -- torchrun ...
///
///   # why don't I see my job?
///   slowrank-agent doctor
///
///   # probe one function of a program and print the calls as JSON lines
///   slowrank-agent --probe ./app:my_fn --output - -- ./app
#[derive(Parser, Debug)]
#[command(version, verbatim_doc_comment, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Lists the rank processes found, the libraries and symbols resolved,
    /// the probes attached and their hit counts, and what is missing.
    Doctor(doctor::DoctorArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Coordinator address (HOST:PORT). Without it, records only go to --output.
    #[arg(long, value_name = "HOST:PORT")]
    coordinator: Option<SocketAddr>,
    /// The coordinator's certificate (PEM), as written by `slowrank serve
    /// --tls-dir`; under mutual TLS the job CA (`slowrank certs`: ca.crt).
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    ca: Option<PathBuf>,
    /// This agent's certificate for mutual TLS: `slowrank certs --hosts`
    /// writes agents/HOST.crt for each host, bound to HOST; the agent then
    /// reports HOST (a different --host is an error at startup). Without
    /// --hosts, agent.crt (bound to no host: --host or the hostname).
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The key of --cert (`slowrank certs`: agents/HOST.key, or agent.key).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Name in the coordinator's certificate.
    #[arg(long, default_value = "slowrank-coordinator")]
    server_name: String,
    /// Job token the coordinator expects (or env SLOWRANK_TOKEN).
    #[arg(
        long,
        env = "SLOWRANK_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    token: String,
    /// Host name to report (default: the one --cert is issued for, else
    /// this machine's).
    #[arg(long)]
    host: Option<String>,
    /// Only follow processes whose environment has KEY=VALUE (repeatable; e.g.
    /// several agents on one machine, one per simulated host: GROUP_RANK=2).
    #[arg(long = "only-env", value_name = "KEY=VALUE", hide = true)]
    only_env: Vec<String>,
    /// Probe this NCCL / CUDA runtime library file from the start, before
    /// any rank maps it (e.g. the venv's .../nvidia/nccl/lib/libnccl.so.2).
    /// Repeatable. Libraries the ranks map are found without it.
    #[arg(long = "lib", value_name = "FILE")]
    libs: Vec<PathBuf>,
    /// Report calls of PID and all processes it forks from now on, before
    /// the /proc scan classifies them (e.g. the launcher). Repeatable.
    #[arg(long = "watch-tree", value_name = "PID", hide = true)]
    watch_tree: Vec<u32>,
    /// Keep the deep probe set on for the whole run: the verbs provider's
    /// post_send/poll_cq (found through ibv_context.ops), per-QP link records.
    /// Costly where NCCL's proxy spins on poll_cq; normally the coordinator
    /// opens deep windows for a suspect instead. Launch counting runs in it
    /// for the share of every 30 s that --max-overhead leaves, as in those
    /// windows.
    #[arg(long)]
    deep: bool,
    /// Do not sample rank stacks (CPU/off-CPU at 49 Hz; with --deep also
    /// launch sites). Without stacks a verdict has no flame-graph diff.
    #[arg(long)]
    no_stacks: bool,
    /// Probe a C-ABI function: FILE:SYMBOL, FILE an exact path. Repeatable.
    #[arg(long = "probe", value_name = "FILE:SYMBOL")]
    probes: Vec<String>,
    /// Follow an already running process for --probe functions. Repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Also write every record as a JSON line to FILE ("-" for stdout).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// How often a batch is cut and shipped.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    flush_ms: u64,
    /// How often a batch is cut while a deep window the coordinator opened
    /// runs: it is looking for a suspect, and every flush it waits for is
    /// detection latency.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    deep_flush_ms: u64,
    /// Length of the per-rank counter intervals (scheduler split, syncs,
    /// launches). They corroborate a host-slow suspect, so their length is
    /// detection latency; at least --flush-ms.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    interval_ms: u64,
    /// Length of a folded-stack window (the flame graphs' unit): each window
    /// carries its own string table, so it is longer than the intervals.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    stack_window_ms: u64,
    /// How often /proc is scanned for rank processes and new libraries.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    scan_ms: u64,
    /// Where the agent keeps what a restarted agent needs to resume this
    /// host's collectives: each running rank's communicator table (one
    /// small JSON file per host, rewritten when a communicator is created).
    /// NCCL names a communicator only when the job creates it, so without
    /// this an agent restarted mid-job loses every collective of the ranks
    /// already running. A tmpfs is right: the ranks do not outlive a reboot.
    #[arg(long, default_value = "/run/slowrank", value_name = "DIR")]
    state_dir: PathBuf,
    /// Bound of the in-memory spool kept while the coordinator is away.
    #[arg(long, default_value_t = 64 << 20, value_name = "BYTES")]
    spool_bytes: usize,
    /// Most of a rank's time the probes may cost, in percent ("0.5%" or
    /// "0.5"). The agent measures its trap cost at start and counts every
    /// hit; when launch counting would push a rank over this, samples and
    /// the counting in deep windows share what the budget earns over time
    /// (a sample less often, possibly never; a window counting for less of
    /// its length, possibly not at all), and it says so in its log and in
    /// the report.
    #[arg(long, default_value = "0.5%", value_name = "PERCENT", value_parser = parse_percent)]
    max_overhead: f64,
    /// How often the launch/memcpy/malloc counters are attached for a
    /// sample (they trap on every call, so they are off otherwise; deep
    /// windows count too). 0: only in deep windows.
    #[arg(long, default_value_t = slowrank_agent::budget::DEFAULT_PERIOD_S, value_name = "SECS")]
    launch_sample_every: u64,
    /// Length of one launch sample.
    #[arg(long, default_value_t = slowrank_agent::budget::DEFAULT_WINDOW_S, value_name = "SECS")]
    launch_sample_for: u64,
    /// Test-only: offset added to every reported time (simulated host clock).
    #[arg(long, default_value_t = 0, hide = true, allow_hyphen_values = true)]
    sim_clock_offset_ns: i64,
    /// Test-only: drift of the simulated host clock, in ppm.
    #[arg(long, default_value_t = 0.0, hide = true, allow_hyphen_values = true)]
    sim_clock_drift_ppm: f64,
    /// Test-only: file created once the probes are loaded (for launchers
    /// that must not start the job earlier).
    #[arg(long, hide = true, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// The command to run and follow (e.g. torchrun ...), after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(Sub::Doctor(args)) = cli.sub {
        return doctor::run(args);
    }
    let code = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(run(cli.run))?;
    std::process::exit(code);
}

async fn run(cli: RunArgs) -> Result<i32> {
    // Before the probes load: a certificate for another host is a setup
    // mistake to stop on at once, not a refusal on every reconnect.
    let cert_pem = match &cli.cert {
        Some(c) => Some(std::fs::read(c).with_context(|| format!("reading {}", c.display()))?),
        None => None,
    };
    let cert_name = cli.cert.as_ref().map(|c| c.display().to_string());
    let host = slowrank_agent::certhost::resolve_host(
        cli.host.as_deref(),
        cert_pem.as_deref().zip(cert_name.as_deref()),
        clock::hostname,
    )?;
    let host_clock = if cli.sim_clock_offset_ns != 0 || cli.sim_clock_drift_ppm != 0.0 {
        let c = HostClock::simulated(cli.sim_clock_offset_ns, cli.sim_clock_drift_ppm);
        // The drift's epoch, for benchmarks that compare the coordinator's
        // estimate with the truth (loading the probes takes a second or
        // more, 30 µs at 30 ppm).
        tracing::info!(
            offset_ns = c.offset_ns,
            drift_ppm = c.drift_ppm,
            epoch_mono_ns = c.epoch_ns,
            "simulated host clock"
        );
        c
    } else {
        HostClock::real()
    };
    let mut probes = Probes::load().context("loading the eBPF programs")?;
    // Before anything is followed: the calibration follows the agent itself.
    let trap = match slowrank_agent::selfcost::measure(&mut probes) {
        Ok(t) => {
            tracing::info!(
                uprobe_ns = t.entry_ns.round(),
                uprobe_uretprobe_pair_ns = t.pair_ns.round(),
                unprobed_call_ns = t.bare_ns,
                "measured this host's probe trap cost"
            );
            Some(t)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot measure the trap cost: probe hits are reported without their cost, and --max-overhead cannot be enforced");
            None
        }
    };
    let scanner = Scanner::new(&cli.only_env, None)?;
    let mut agent = Agent::new(probes, scanner, host_clock, Limits::default());
    match agent.keep_state(&cli.state_dir, &host) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            ranks = n,
            dir = %cli.state_dir.display(),
            "a previous agent of this host left communicator tables: ranks still running resume their collectives"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "no state directory: an agent restarted mid-job would lose the collectives of ranks already running")
        }
    }
    agent.set_cost_model(
        trap,
        slowrank_agent::budget::Sampler::new(
            cli.max_overhead,
            Duration::from_secs(cli.launch_sample_every),
            Duration::from_secs(cli.launch_sample_for.max(1)),
            trap.map_or(0.0, |t| t.entry_ns),
        ),
    );
    let stacks = if cli.no_stacks {
        None
    } else {
        let config = if cli.deep {
            StackConfig::DEEP
        } else {
            StackConfig::DEFAULT
        };
        let deep = cli.deep;
        let make = move || {
            StackCollector::start(config, deep, clock::mono_ns())
                .map(|c| StackFeed::new(c, host_clock))
        };
        match StackWorker::start(make) {
            Ok(w) => Some(w),
            Err(e) => {
                // Stacks explain a verdict; they never stop the agent.
                tracing::warn!(error = %e, "stack sampling unavailable; verdicts will carry no flame graph");
                None
            }
        }
    };
    for spec in &cli.probes {
        let (file, symbol) = spec
            .rsplit_once(':')
            .with_context(|| format!("--probe {spec}: expected FILE:SYMBOL"))?;
        let path =
            std::fs::canonicalize(file).with_context(|| format!("--probe {spec}: {file}"))?;
        let id = agent.attach_generic(&path, symbol)?;
        tracing::info!(probe = id, path = %path.display(), symbol, "attached uprobe + uretprobe");
    }
    for &pid in &cli.pids {
        agent.probes_mut().follow(pid, None)?;
    }
    for lib in &cli.libs {
        agent
            .preattach(lib)
            .map_err(anyhow::Error::msg)
            .context("--lib")?;
    }
    for &pid in &cli.watch_tree {
        agent.probes_mut().watch_tree(pid)?;
    }
    if cli.deep {
        agent.set_deep(slowrank_agent::agent::Deep::On);
    }

    let agent_id = format!("{host}-{}-{}", std::process::id(), clock::mono_ns());
    let mut uplink = match cli.coordinator {
        Some(addr) => {
            let ca_path = cli.ca.as_ref().context("--coordinator needs --ca FILE")?;
            let ca =
                std::fs::read(ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
            let own = match (cert_pem, &cert_name, &cli.key) {
                (Some(c), Some(n), Some(k)) => Some((
                    c,
                    std::fs::read(k).with_context(|| format!("reading {}", k.display()))?,
                    n.clone(),
                )),
                _ => None,
            };
            let client = client_config_with(
                &ca,
                &ca_path.display().to_string(),
                own.as_ref().map(|(c, k, n)| ClientIdentity {
                    cert_pem: c,
                    key_pem: k,
                    name: n,
                }),
            )?;
            Some(Uplink::spawn(UplinkConfig {
                addr,
                server_name: cli.server_name.clone(),
                client,
                hello: Hello {
                    token: cli.token.clone(),
                    host: host.clone(),
                    agent_id: agent_id.clone(),
                    mono_ns: host_clock.now(),
                    wall_ns: clock::wall_ns(),
                },
                spool_bytes: cli.spool_bytes,
                // The same clock the records are stamped with, or the
                // coordinator would fit the wrong offset.
                clock: host_clock,
                bind: None,
            }))
        }
        None => None,
    };
    let mut out: Option<Box<dyn Write + Send>> = match &cli.output {
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(p) => Some(Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        ))),
        None => None,
    };
    if let Some(f) = &cli.ready_file {
        std::fs::write(f, std::process::id().to_string())
            .with_context(|| format!("writing {}", f.display()))?;
    }

    let mut child = match cli.command.split_first() {
        Some((prog, args)) => {
            // Every process this agent forks is reported from its first
            // instruction (the fork tracepoint grows the watched tree), so
            // the job's first NCCL calls are seen before /proc shows it.
            agent.probes_mut().watch_tree(std::process::id())?;
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(args);
            let child = cmd.spawn().with_context(|| format!("starting {prog}"))?;
            let pid = child.id().context("child has no pid")?;
            agent.scanner_mut().set_root(pid);
            if !cli.probes.is_empty() {
                agent.probes_mut().follow(pid, None)?;
            }
            tracing::info!(pid, "following {prog}");
            Some(child)
        }
        None => None,
    };

    // Deep-probe windows the coordinator asks for (a suspect and references).
    let mut control = uplink.as_mut().and_then(Uplink::take_control_requests);
    let flush_every = Duration::from_millis(cli.flush_ms.max(10));
    let flush_tick = Duration::from_millis(cli.deep_flush_ms.max(10)).min(flush_every);
    let mut flush = tokio::time::interval(flush_tick);
    let mut last_flush = std::time::Instant::now();
    let mut scan = tokio::time::interval(Duration::from_millis(cli.scan_ms.max(5)));
    // The event ring's drains: 5 ms apart while records come fast, up to
    // 40 ms while few do (slowrank_agent::cadence).
    let mut ring_cadence = slowrank_agent::cadence::Cadence::new(
        POLL_MIN,
        POLL_MAX,
        slowrank_shared::maps::EVENTS_BYTES as usize,
    );
    let mut next_poll = tokio::time::Instant::now();
    let interval = Duration::from_millis(cli.interval_ms.max(cli.flush_ms).max(10));
    let mut last_interval = std::time::Instant::now();
    let stack_window = Duration::from_millis(cli.stack_window_ms.max(cli.flush_ms).max(10));
    let mut last_stack_window = std::time::Instant::now();
    let mut exit_code = 0;
    let mut known = Announced::default();
    // Created once: a signal stream keeps deliveries that arrive while the
    // loop body runs (a fresh ctrl_c() future per iteration would lose them).
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    loop {
        let outcome = tokio::select! {
            _ = tokio::time::sleep_until(next_poll) => {
                let t0 = std::time::Instant::now();
                let bytes = agent.poll();
                next_poll = tokio::time::Instant::now() + ring_cadence.after_drain(bytes);
                (false, "draining the event ring", t0)
            }
            req = async { control.as_mut().expect("guarded").recv().await }, if control.is_some() => {
                let t0 = std::time::Instant::now();
                match req {
                    Some(c) if c.deep_enable => {
                        tracing::info!(seconds = c.seconds, "coordinator opened a deep-probe window");
                        let dur = Duration::from_secs(u64::from(c.seconds.max(1)));
                        agent.open_deep_window(dur);
                        if let (Some(s), true) = (stacks.as_ref(), c.launch_sites) { s.open_launch_window(&c.ranks, dur); }
                    }
                    Some(_) if !cli.deep => {
                        tracing::info!("coordinator closed the deep-probe window");
                        agent.set_deep(slowrank_agent::agent::Deep::Off);
                        if let Some(s) = stacks.as_ref() { s.close_launch_window(); }
                    }
                    Some(_) => {}
                    None => control = None,
                }
                (false, "a deep-window request", t0)
            }
            _ = scan.tick() => {
                let t0 = std::time::Instant::now();
                if let Err(e) = agent.scan() {
                    tracing::warn!(error = %e, "discovery pass failed; retrying on the next tick");
                }
                if let Some(s) = stacks.as_ref() {
                    s.sync(agent.ranks().map(|r| (r.identity.pid, r.identity.rank)));
                }
                (false, "a discovery pass", t0)
            }
            _ = flush.tick() => {
                // Half a tick early rather than a whole tick late.
                if !agent.in_deep_window() && last_flush.elapsed() + flush_tick / 2 < flush_every {
                    continue;
                }
                last_flush = std::time::Instant::now();
                let t0 = last_flush;
                let close = last_interval.elapsed() >= interval;
                if close {
                    last_interval = std::time::Instant::now();
                }
                if last_stack_window.elapsed() >= stack_window {
                    last_stack_window = std::time::Instant::now();
                    if let Some(s) = stacks.as_ref() { s.cut_window(clock::mono_ns(), false); }
                }
                cut(&mut agent, stacks.as_ref(), close, &host, &agent_id, uplink.as_ref().map(|u| (u, &mut known)), &mut out)?;
                (false, "cutting a batch", t0)
            }
            status = async { child.as_mut().expect("guarded").wait().await }, if child.is_some() => {
                let status = status?;
                exit_code = status.code().unwrap_or(128 + 9);
                tracing::info!(%status, "job exited");
                (true, "", std::time::Instant::now())
            }
            _ = sigint.recv() => { tracing::info!("interrupted"); exit_code = 130; (true, "", std::time::Instant::now()) }
            _ = sigterm.recv() => { tracing::info!("terminated"); exit_code = 143; (true, "", std::time::Instant::now()) }
        };
        let (done, what, t0) = outcome;
        if done {
            break;
        }
        // One task does discovery, draining and shipping: a branch that
        // holds it this long delays finding a new rank by as much (a job
        // shorter than that can go unseen).
        let took = t0.elapsed();
        if took >= LOOP_STALL {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                "the agent's loop was busy with {what}"
            );
        }
    }
    // Returns of calls in flight at exit land just after it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    agent.scan()?;
    if let Some(s) = stacks.as_ref() {
        s.sync(agent.ranks().map(|r| (r.identity.pid, r.identity.rank)));
        s.cut_window(clock::mono_ns(), true);
        // The last window goes with the last batch: wait for the worker to
        // fold it (symbolizing can take seconds on a loaded host).
        if !s.settle(STACKS_SETTLE) {
            tracing::warn!(limit_s = STACKS_SETTLE.as_secs(), "the stack thread did not finish the last window in time: the last batch goes without it");
        }
    }
    cut(
        &mut agent,
        stacks.as_ref(),
        true,
        &host,
        &agent_id,
        uplink.as_ref().map(|u| (u, &mut known)),
        &mut out,
    )?;
    let drops = agent.drops();
    tracing::info!(?drops, "fold drops");
    if let Some(c) = stacks.as_ref().and_then(|s| s.counters(STACKS_SETTLE)) {
        match c {
            Ok(c) => tracing::info!(
                on_cpu = c.on_cpu,
                off_cpu = c.off_cpu,
                off_cpu_capture_skipped = c.off_cpu_skipped,
                launches = c.launches,
                ringbuf_drops = c.ringbuf_drops,
                queue_drops = c.queue_drops,
                "stack records over the run"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot read the stack counters"),
        }
    }
    log_probe_hits(&agent);
    if let Some(o) = out.as_mut() {
        o.flush()?;
    }
    if let Some(uplink) = uplink {
        let report = uplink.finish(Duration::from_secs(10)).await;
        tracing::info!(
            sent = report.sent,
            unsent = report.unsent,
            dropped = report.dropped,
            "uplink closed"
        );
        if report.unsent > 0 || report.dropped > 0 {
            tracing::error!(
                "{} batches never reached the coordinator",
                report.unsent + report.dropped
            );
        }
    }
    if let Some(f) = &cli.ready_file {
        // Says "everything is shipped" to a launcher: detaching the probes
        // when the process exits can take seconds (one synchronize per
        // uprobe in the kernel), and nobody needs to wait for that.
        let _ = std::fs::remove_file(f);
    }
    Ok(exit_code)
}

/// "0.5%" or "0.5" → 0.005.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: expected a percentage like 0.5%: {e}"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s:?}: a percentage between 0 and 100"));
    }
    Ok(v / 100.0)
}

/// At exit: calls per probe over the run (benchmarks divide them by steps).
/// Paired probes trap twice per call (entry and return).
fn log_probe_hits(agent: &Agent) {
    use slowrank_agent::probes::Attach;
    let totals = agent.counted_totals();
    let mut classes = std::collections::BTreeMap::new();
    for l in agent.libs() {
        for s in &l.symbols {
            let spec = slowrank_agent::catalog::default_set(l.kind)
                .iter()
                .find(|p| p.symbol == s.symbol);
            match (spec.map(|p| p.how), &s.result) {
                (Some(Attach::Count { class }), _) => {
                    classes
                        .entry(class)
                        .or_insert_with(std::collections::BTreeSet::new)
                        .insert(s.symbol);
                }
                (_, Ok(id)) if agent.hits(*id) > 0 => {
                    tracing::info!(
                        probe = s.symbol,
                        calls = agent.hits(*id),
                        windowed = false,
                        "probe calls over the run"
                    );
                }
                _ => {}
            }
        }
    }
    for (class, symbols) in classes {
        let calls = totals[class as usize % totals.len()];
        if calls > 0 {
            tracing::info!(
                probe = symbols.into_iter().collect::<Vec<_>>().join("|"),
                calls,
                windowed = true,
                "probe calls over the run"
            );
        }
    }
}

/// Cuts one batch and ships it.
fn cut(
    agent: &mut Agent,
    stacks: Option<&StackWorker>,
    close_interval: bool,
    host: &str,
    agent_id: &str,
    // With what this agent announced so far (replayed on reconnection).
    uplink: Option<(&Uplink, &mut Announced)>,
    out: &mut Option<Box<dyn Write + Send>>,
) -> Result<()> {
    let spool_drops = uplink.as_ref().map_or(0, |(u, _)| u.dropped());
    let Some(mut batch): Option<Batch> = agent.cut(host, agent_id, close_interval, spool_drops)?
    else {
        // Folded stacks wait in the feed for the next batch.
        return Ok(());
    };
    if let Some(s) = stacks {
        s.training_threads(&agent.issuing_threads());
        s.collectives(&batch.collectives);
        batch.stacks = s.take();
    }
    if let Some(o) = out.as_mut() {
        output::write_records(o, &batch)?;
        o.flush()?;
    }
    if let Some((u, known)) = uplink {
        if known.learn(&batch) {
            u.set_preamble(wire::encode(&known.preamble(&batch))?);
        }
        u.send(wire::encode(&batch)?);
    }
    Ok(())
}

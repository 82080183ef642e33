//! `slowrank`: the coordinator and its tools.
use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use slowrank_coordinator::{
    net::tls::{make_job_pki, make_job_pki_for_hosts, Identity},
    render_human, render_json,
    report::outputs,
    serve::{ServeConfig, Server},
    thresholds,
};

// Many short-lived per-iteration tables: glibc's allocator spent a seventh
// of the coordinator's CPU at 16,384 ranks (BENCHMARKS.md, flood).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Finds the rank that slows a distributed GPU training job down.
///
/// Start `slowrank serve` once per job, then `slowrank-agent` on every host
/// (it needs the certificate `serve` writes and the same job token).
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the coordinator: receive agents' batches, align clocks, decide
    /// which rank is slow and why; alert and keep the report current.
    Serve(ServeArgs),
    /// Show a report written by `slowrank serve --out DIR`.
    Report(ReportArgs),
    /// Make a per-job CA and certificates for mutual TLS: `serve --tls-dir
    /// DIR` then demands agent certificates signed by it. With --hosts, one
    /// agent certificate per host (DIR/agents/HOST.crt, .key): the
    /// coordinator takes each agent's host name from its certificate and
    /// refuses a hello claiming another. Without, one certificate for every
    /// agent (DIR/agent.crt, .key), bound to no host. Give each agent
    /// DIR/ca.crt (--ca) and its certificate and key (--cert, --key); keep
    /// DIR/ca.key offline.
    Certs(CertsArgs),
    /// Analyze a recorded job (slowrank records, PyTorch profiler traces,
    /// the straggler study's parquet) through the same stages as live data.
    /// `slowrank replay DIR --out OUT` replays a recorded run's agent records.
    #[command(visible_alias = "replay")]
    Analyze(slowrank_coordinator::replay::cli::AnalyzeArgs),
    /// Print every threshold and window the analyzer uses, with its
    /// default, as a TOML file: copy it, keep the lines you change, and
    /// pass it to `serve` or `analyze` with --thresholds FILE. What each
    /// one means, and why it has its default, is documented where its
    /// stage defines it (docs/thresholds.md lists them).
    Thresholds,
}

#[derive(clap::Args, Debug)]
struct CertsArgs {
    /// Directory to create the files in (must not hold a job's keys yet).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Extra DNS names or IPs for the coordinator certificate (the name
    /// agents use in --server-name). Repeatable.
    #[arg(long = "san", value_name = "NAME")]
    sans: Vec<String>,
    /// Issue one agent certificate per host, bound to that host name (the
    /// name its agent reports: `slowrank-agent --host`, default the
    /// machine's hostname). Comma-separated or repeated; letters, digits,
    /// '-', '_' and '.'.
    #[arg(long, value_name = "HOST,...", value_delimiter = ',')]
    hosts: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// UDP address to listen on (QUIC).
    #[arg(long, default_value = "0.0.0.0:7700")]
    listen: SocketAddr,
    /// UDP port for clock probes on the --listen address [default: the
    /// --listen port + 1, i.e. 7701; 0: any free port]. Agents are told
    /// which. Probes there are stamped by the kernel at both ends, which
    /// keeps each host's clock within a few µs even on a busy host; if
    /// agents cannot reach it, probes stay on the QUIC connection (less
    /// exact: every stamp then waits for a task wake-up). Open it in
    /// firewalls next to --listen.
    #[arg(long, value_name = "PORT")]
    clock_port: Option<u16>,
    /// Keep every clock probe on the QUIC connection (no clock port).
    #[arg(long)]
    no_clock_port: bool,
    /// Directory for the coordinator's certificate and key; created on first
    /// use (give agents DIR/coordinator.crt as --ca). If `slowrank certs`
    /// made it (DIR/ca.crt exists), agents must also present a certificate
    /// signed by that CA (mutual TLS) and get DIR/ca.crt as --ca.
    #[arg(long, default_value = "./slowrank-tls", value_name = "DIR")]
    tls_dir: PathBuf,
    /// Job token agents must present (or env SLOWRANK_TOKEN).
    #[arg(
        long,
        env = "SLOWRANK_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    token: String,
    /// Keep DIR/report.json, DIR/report.txt, DIR/trace.json and
    /// DIR/report.html (the page; timeline.json holds its series) current
    /// (replaced atomically every --write-every and at shutdown).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Seconds between report rewrites.
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    write_every: f64,
    /// Milliseconds between analyzer passes (sealing iterations, judging
    /// them, alerting). Each pass waits for this at most, so it adds up to
    /// this much to every detection; a pass costs ms, not this much CPU.
    #[arg(long, default_value_t = 100, value_name = "MS")]
    tick_ms: u64,
    /// POST every verdict event (JSON) to this URL.
    #[arg(long, value_name = "URL")]
    webhook: Option<String>,
    /// Run `sh -c CMD` for every verdict event: the event JSON on stdin,
    /// SLOWRANK_EVENT/RANK/HOST/KIND/CONFIDENCE/LINE in the environment.
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// Bound on one webhook request or exec hook run, in seconds.
    #[arg(long, default_value_t = 5.0, value_name = "S")]
    hook_timeout: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics and the report page
    /// at http://ADDR/ (reloads itself every few seconds).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Seconds of deep probes (verbs, per-launch timing) requested from a
    /// suspect's agent when a verdict opens; 0 disables.
    #[arg(long, default_value_t = 30, value_name = "S")]
    deep_window: u32,
    /// Shortest deep window on every agent when the job slowed with nobody
    /// named, or a suspect can only be classed from GPU-side times. At
    /// least 10 of the job's steps (plus a second), renewed while the
    /// slowdown or the suspicion lasts, up to --deep-window. A healthy
    /// job's jitter raises either now and then; at 30 s a healthy dp8 run
    /// had the deep set on for 41 of its 56 s.
    #[arg(long, default_value_t = 5, value_name = "S")]
    suspicion_window: u32,
    /// During a compute-slow suspect's deep window, also record the launch
    /// sites (stack + kernel of every CUDA launch) of the suspect and a
    /// same-host reference: the verdict's flame graph then shows GPU time
    /// per kernel under the code that launched it. Costs a uprobe trap per
    /// launch on those two ranks (≈ 0.3–0.5 µs bare metal, ≈ 4 µs on a VM),
    /// which slows their host side while the window lasts and, where traps
    /// are slow, can blur the verdict's class. Off, a compute-slow verdict's
    /// flame graph is the CPU view.
    #[arg(long)]
    launch_sites: bool,
    /// Iterations at the start of the job that never raise a verdict, at
    /// most (warm-up: allocator, autotuning and data-loader start are slow
    /// on every rank, unevenly); it ends sooner once three steps in a row
    /// agree within 15% ([lifecycle] warmup_settle) [default: 20, or the
    /// --thresholds file's].
    #[arg(long, value_name = "N")]
    warmup_iterations: Option<u64>,
    /// A TOML file of thresholds to use instead of the defaults: only the
    /// keys it names change (`slowrank thresholds` prints every one, with
    /// its default); an unknown key is an error. Flags such as
    /// --warmup-iterations still win over it.
    #[arg(long, value_name = "FILE")]
    thresholds: Option<PathBuf>,
    /// Print every probed call as it arrives (for the generic --probe set).
    #[arg(long)]
    print_calls: bool,
    /// Exit once every agent that connected has disconnected.
    #[arg(long)]
    exit_when_idle: bool,
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Directory given to `serve --out` (or a report.json file).
    dir: PathBuf,
    /// Print the stable JSON (schema slowrank.report/v1) instead of the table.
    #[arg(long, conflicts_with = "html")]
    json: bool,
    /// Write DIR/report.html instead: one self-contained page (no network
    /// fetches) with the verdicts and their evidence, a rank × iteration
    /// heatmap of arrival lateness with each verdict's onset, the job's
    /// step time, the diff flame graphs, per-host clock error and ingest
    /// health. `serve --out DIR` keeps the same file current.
    #[arg(long)]
    html: bool,
}

/// glibc gives threads that allocate their own arenas (up to 8 per core),
/// and the blocking pool's threads (ingest, analyzer tick, report writer)
/// each keep freed memory of their own: 1.3 GB RSS in the 4,096-rank flood
/// instead of 0.5 GB. Two arenas are plenty for a process whose work runs
/// one piece at a time.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // thread is started.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(serve(args))),
        Command::Report(args) => report(args),
        Command::Certs(args) => certs(args),
        Command::Analyze(args) => analyze(args),
        Command::Thresholds => thresholds::defaults_toml()
            .map(|t| print!("{t}"))
            .map_err(Into::into),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn analyze(args: slowrank_coordinator::replay::cli::AnalyzeArgs) -> Result<()> {
    let out = slowrank_coordinator::replay::cli::run(&args)?;
    if args.json {
        println!("{}", render_json(&out.report)?);
    } else {
        print!("{}", render_human(&out.report));
    }
    Ok(())
}

fn report(args: ReportArgs) -> Result<()> {
    let r = outputs::read_report(&args.dir)?;
    if args.html {
        let dir = if args.dir.is_dir() {
            args.dir.clone()
        } else {
            args.dir
                .parent()
                .map_or_else(|| PathBuf::from("."), PathBuf::from)
        };
        let timeline = outputs::read_timeline(&dir)?;
        outputs::write_page(&dir, &r, &timeline)?;
        println!("wrote {}", dir.join(outputs::REPORT_HTML).display());
    } else if args.json {
        println!("{}", render_json(&r)?);
    } else {
        print!("{}", render_human(&r));
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let identity = Identity::load_or_create(&args.tls_dir)
        .with_context(|| format!("TLS identity in {}", args.tls_dir.display()))?;
    if args.token.is_empty() && !identity.requires_client_cert() {
        anyhow::bail!(
            "no job token: set SLOWRANK_TOKEN (or --token), or make a per-job CA with \
             `slowrank certs --out {}` so agents authenticate with certificates",
            args.tls_dir.display()
        );
    }
    if identity.requires_client_cert() {
        tracing::info!(
            "mutual TLS: agents need a certificate from {}/ca.crt",
            args.tls_dir.display()
        );
    }
    let mut cfg = ServeConfig::new(args.listen, args.token);
    cfg.out_dir = args.out.clone();
    cfg.write_every = Duration::from_secs_f64(args.write_every.max(0.1));
    cfg.tick_every = Duration::from_millis(args.tick_ms.max(10));
    cfg.hooks.webhook = args.webhook;
    cfg.hooks.exec = args.exec;
    cfg.hooks.timeout = Duration::from_secs_f64(args.hook_timeout.max(0.1));
    cfg.metrics_listen = args.metrics_listen;
    cfg.deep_window_s = args.deep_window;
    cfg.suspicion_window_s = args.suspicion_window.min(args.deep_window);
    if let Some(p) = &args.thresholds {
        cfg.analyzer = thresholds::load(p)?;
    }
    if let Some(n) = args.warmup_iterations {
        cfg.analyzer.lifecycle.warmup_iterations = n;
    }
    cfg.launch_sites = args.launch_sites;
    cfg.print_calls = args.print_calls;
    cfg.exit_when_idle = args.exit_when_idle;
    let clock_port = args.clock_port.unwrap_or(match args.listen.port() {
        0 => 0,
        p => p.saturating_add(1),
    });
    cfg.probes.clock_port = (!args.no_clock_port).then_some(clock_port);
    let server = Server::bind(cfg, &identity)?;
    eprintln!(
        "slowrank coordinator listening on {} (QUIC); agents need --ca {}",
        server.local_addr()?,
        identity
            .cert_path
            .as_ref()
            .map_or("?".into(), |p| p.display().to_string())
    );
    if let Some(c) = server.clock_port_addr() {
        eprintln!("clock port on {c} (UDP)");
    }
    if let Some(m) = server.metrics_addr() {
        eprintln!("metrics at http://{m}/metrics");
    }
    let summary = server.run(shutdown_signal()).await?;
    let r = &summary.report;
    eprintln!(
        "coordinator done: {} batches, {} rejected, {} agents refused, {} clock samples, {} verdicts ({} active), {} hangs",
        summary.batches,
        summary.batches_rejected,
        summary.agents_refused,
        summary.clock_samples,
        r.verdicts.len(),
        r.verdicts.iter().filter(|v| v.active).count(),
        r.hangs.len()
    );
    if let Some(dir) = &args.out {
        eprintln!("report: slowrank report {}", dir.display());
    }
    Ok(())
}

fn certs(args: CertsArgs) -> Result<()> {
    let pki = if args.hosts.is_empty() {
        make_job_pki(&args.out, &args.sans)
    } else {
        make_job_pki_for_hosts(&args.out, &args.sans, &args.hosts)
    }
    .with_context(|| format!("making the job PKI in {}", args.out.display()))?;
    for f in &pki.files {
        println!("wrote {}", f.display());
    }
    let dir = pki.dir.display();
    println!("coordinator: slowrank serve --tls-dir {dir}   (now requires agent certificates)");
    if args.hosts.is_empty() {
        println!(
            "agents:      slowrank-agent --ca {dir}/ca.crt --cert {dir}/agent.crt --key {dir}/agent.key ...\n\
             (one certificate for every agent: host names are not bound to it; \
             `--hosts` issues one per host)"
        );
    } else {
        println!(
            "agent on HOST: slowrank-agent --host HOST --ca {dir}/ca.crt \
             --cert {dir}/agents/HOST.crt --key {dir}/agents/HOST.key ...\n\
             (its hello must name HOST, or it is refused)"
        );
    }
    println!("keep {dir}/ca.key offline; it is only needed to issue more certificates");
    Ok(())
}

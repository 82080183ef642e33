//! `slowrank-agent`: one per host, next to torchrun or wrapping it.
use std::{
    fs::File,
    io::{BufWriter, Write},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::Parser;
use slowrank_agent::{
    clock,
    launch::Gated,
    output,
    probes::Probes,
    ship::{client_config, Uplink, UplinkConfig},
};
use slowrank_shared::{
    probe::{CallEvent, CallKind},
    wire::{self, Batch, CallRecord, Hello},
};

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
///   # probe one function of a program and print the calls as JSON lines
///   slowrank-agent --probe ./app:my_fn --output - -- ./app
#[derive(Parser, Debug)]
#[command(version, verbatim_doc_comment)]
struct Cli {
    /// Coordinator address (HOST:PORT). Without it, records only go to --output.
    #[arg(long, value_name = "HOST:PORT")]
    coordinator: Option<SocketAddr>,
    /// The coordinator's certificate (PEM), as written by `slowrank serve --tls-dir`.
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    ca: Option<PathBuf>,
    /// Name in the coordinator's certificate.
    #[arg(long, default_value = "slowrank-coordinator")]
    server_name: String,
    /// Job token the coordinator expects (or env SLOWRANK_TOKEN).
    #[arg(long, env = "SLOWRANK_TOKEN", hide_env_values = true, default_value = "")]
    token: String,
    /// Host name to report (default: this machine's).
    #[arg(long)]
    host: Option<String>,
    /// Probe a C-ABI function: FILE:SYMBOL, FILE an exact path. Repeatable.
    #[arg(long = "probe", value_name = "FILE:SYMBOL")]
    probes: Vec<String>,
    /// Follow an already running process. Repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Also write every record as a JSON line to FILE ("-" for stdout).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// How often a batch is cut and shipped.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    flush_ms: u64,
    /// Bound of the in-memory spool kept while the coordinator is away.
    #[arg(long, default_value_t = 64 << 20, value_name = "BYTES")]
    spool_bytes: usize,
    /// The command to run and follow (e.g. torchrun ...), after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(run(cli))?;
    std::process::exit(code);
}

async fn run(cli: Cli) -> Result<i32> {
    if cli.probes.is_empty() {
        bail!("nothing to probe: give --probe FILE:SYMBOL (the NCCL/CUDA probe sets come with rank discovery)");
    }
    let mut probes = Probes::load().context("loading the eBPF programs")?;
    for spec in &cli.probes {
        let (file, symbol) = spec
            .rsplit_once(':')
            .with_context(|| format!("--probe {spec}: expected FILE:SYMBOL"))?;
        let path = std::fs::canonicalize(file).with_context(|| format!("--probe {spec}: {file}"))?;
        let id = probes.attach(&path, symbol)?;
        tracing::info!(probe = id, path = %path.display(), symbol, "attached uprobe + uretprobe");
    }
    for &pid in &cli.pids {
        probes.follow(pid, None)?;
    }

    let host = cli.host.clone().unwrap_or_else(clock::hostname);
    let agent_id = format!("{host}-{}-{}", std::process::id(), clock::mono_ns());
    let uplink = match cli.coordinator {
        Some(addr) => {
            let ca_path = cli.ca.as_ref().context("--coordinator needs --ca FILE")?;
            let ca = std::fs::read(ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
            let client = client_config(&ca, &ca_path.display().to_string())?;
            Some(Uplink::spawn(UplinkConfig {
                addr,
                server_name: cli.server_name.clone(),
                client,
                hello: Hello {
                    token: cli.token.clone(),
                    host: host.clone(),
                    agent_id: agent_id.clone(),
                    mono_ns: clock::mono_ns(),
                    wall_ns: clock::wall_ns(),
                },
                spool_bytes: cli.spool_bytes,
                clock: clock::HostClock::real(),
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

    let mut child = match cli.command.split_first() {
        Some((prog, args)) => {
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(args);
            let gated = Gated::spawn(cmd).with_context(|| format!("starting {prog}"))?;
            let pid = gated.child.id().context("child has no pid")?;
            probes.follow(pid, None)?;
            tracing::info!(pid, "following {prog}");
            Some(gated.release())
        }
        None => None,
    };

    let mut seq = 0u64;
    let mut events: Vec<CallEvent> = Vec::new();
    let mut flush = tokio::time::interval(Duration::from_millis(cli.flush_ms.max(10)));
    let mut poll = tokio::time::interval(Duration::from_millis(5));
    let mut exit_code = 0;
    loop {
        let done = tokio::select! {
            _ = poll.tick() => { probes.drain(&mut events); false }
            _ = flush.tick() => {
                cut(&mut probes, &mut events, &mut seq, &host, &agent_id, uplink.as_ref(), &mut out)?;
                false
            }
            status = async { child.as_mut().expect("guarded").wait().await }, if child.is_some() => {
                let status = status?;
                exit_code = status.code().unwrap_or(128 + 9);
                tracing::info!(%status, "job exited");
                true
            }
            _ = tokio::signal::ctrl_c() => { tracing::info!("interrupted"); exit_code = 130; true }
        };
        if done {
            break;
        }
    }
    // Returns of calls in flight at exit land just after it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    probes.drain(&mut events);
    cut(&mut probes, &mut events, &mut seq, &host, &agent_id, uplink.as_ref(), &mut out)?;
    if let Some(o) = out.as_mut() {
        o.flush()?;
    }
    if let Some(uplink) = uplink {
        let report = uplink.finish(Duration::from_secs(10)).await;
        tracing::info!(sent = report.sent, unsent = report.unsent, dropped = report.dropped, "uplink closed");
        if report.unsent > 0 || report.dropped > 0 {
            tracing::error!("{} batches never reached the coordinator", report.unsent + report.dropped);
        }
    }
    Ok(exit_code)
}

/// Cuts one batch from the pending events and ships it.
fn cut(
    probes: &mut Probes,
    events: &mut Vec<CallEvent>,
    seq: &mut u64,
    host: &str,
    agent_id: &str,
    uplink: Option<&Uplink>,
    out: &mut Option<Box<dyn Write + Send>>,
) -> Result<()> {
    probes.drain(events);
    if events.is_empty() {
        return Ok(());
    }
    let counters = probes.counters()?;
    let batch = Batch {
        host: host.to_owned(),
        agent_id: agent_id.to_owned(),
        seq: *seq,
        mono_ns: clock::mono_ns(),
        wall_ns: clock::wall_ns(),
        probes: probes.descs().to_vec(),
        calls: events
            .drain(..)
            .map(|e| CallRecord {
                ts_ns: e.ts_ns,
                pid: e.pid,
                tid: e.tid,
                probe: e.probe,
                is_return: CallKind::from_raw(e.kind) == Some(CallKind::Return),
                args: e.args,
                ret: e.ret,
            })
            .collect(),
        ringbuf_drops: counters.ringbuf_drops,
        spool_drops: uplink.map_or(0, Uplink::dropped),
        ..Default::default()
    };
    *seq += 1;
    if let Some(o) = out.as_mut() {
        output::write_batch(o, &batch)?;
    }
    if let Some(u) = uplink {
        u.send(wire::encode(&batch)?);
    }
    Ok(())
}

//! `slowrank`: the coordinator and its tools.
use std::{net::SocketAddr, path::PathBuf, sync::atomic::Ordering};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use slowrank_coordinator::{
    ingest::{Ingest, IngestEvent},
    tls::Identity,
};
use slowrank_shared::wire::Batch;
use tokio::sync::mpsc;

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
    /// Run the coordinator: receive agents' batches and report.
    Serve(ServeArgs),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// UDP address to listen on (QUIC).
    #[arg(long, default_value = "0.0.0.0:7700")]
    listen: SocketAddr,
    /// Directory for the coordinator's certificate and key; created on first
    /// use. Give agents DIR/coordinator.crt as --ca.
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
    /// Print every probed call as it arrives (for the generic --probe set).
    #[arg(long)]
    print_calls: bool,
    /// Exit once every agent that connected has disconnected.
    #[arg(long)]
    exit_when_idle: bool,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.command {
        Command::Serve(args) => rt.block_on(serve(args)),
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let identity = Identity::load_or_create(&args.tls_dir)
        .with_context(|| format!("TLS identity in {}", args.tls_dir.display()))?;
    let ingest = Ingest::bind(args.listen, &identity, &args.token)?;
    let stats = ingest.stats();
    eprintln!(
        "slowrank coordinator listening on {} (QUIC); agents need --ca {}",
        ingest.local_addr()?,
        identity
            .cert_path
            .as_ref()
            .map_or("?".into(), |p| p.display().to_string())
    );
    let (tx, mut rx) = mpsc::channel(1024);
    let ingest = std::sync::Arc::new(ingest);
    let server = {
        let ingest = ingest.clone();
        tokio::spawn(async move { ingest.run(tx).await })
    };
    let (mut up, mut calls) = (0usize, 0u64);
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(ev) = ev else { break };
        match ev {
            IngestEvent::AgentUp { agent_id, host } => {
                up += 1;
                println!("agent {agent_id} on {host} connected");
            }
            IngestEvent::Batch { batch, .. } => {
                calls += batch.calls.len() as u64;
                if args.print_calls {
                    print_calls(&batch);
                }
            }
            IngestEvent::AgentDown { agent_id, reason } => {
                up = up.saturating_sub(1);
                println!("agent {agent_id} disconnected ({reason})");
                if args.exit_when_idle && up == 0 {
                    break;
                }
            }
        }
    }
    ingest.close();
    server.abort();
    println!(
        "coordinator done: {} batches, {} calls, {} rejected, {} agents refused",
        stats.batches_ok.load(Ordering::Relaxed),
        calls,
        stats.rejected_total(),
        stats.refused_agents.load(Ordering::Relaxed)
    );
    Ok(())
}

fn print_calls(batch: &Batch) {
    for c in &batch.calls {
        let symbol = batch
            .probes
            .iter()
            .find(|p| p.id == c.probe)
            .map_or("?", |p| p.symbol.as_str());
        if c.is_return {
            println!(
                "[{}] pid {} {symbol} returned {} at {} ns",
                batch.host, c.pid, c.ret, c.ts_ns
            );
        } else {
            println!(
                "[{}] pid {} {symbol}({}, {}) entered at {} ns",
                batch.host, c.pid, c.args[0], c.args[1], c.ts_ns
            );
        }
    }
}

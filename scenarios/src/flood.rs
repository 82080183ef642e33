//! `flood`: a synthetic load generator that plays many agents into one
//! coordinator, to measure how the coordinator scales.
//!
//! It starts `slowrank serve` as a child (so its CPU and memory can be read
//! from `/proc/PID`), then opens one QUIC connection per simulated host
//! (8 ranks each) through the agent's own [`Uplink`] with the same token and
//! CA, and streams, in real time, the records a data-parallel job of N ranks
//! produces: one world communicator, `collectives_per_s` all-reduces per
//! rank per second in steps of [`PER_STEP`] with a gap between steps (so the
//! coordinator finds the iteration), host entry/exit and GPU arrival/done
//! times with jitter. From `onset_s` on, the hidden slow rank's GPU reaches
//! every collective `delay_us` late (a compute-slow rank). Every second it
//! samples the coordinator's CPU, RSS and ingest counter
//! (`--metrics-listen`); it notes when the coordinator's alert line names
//! the hidden rank; and prints all of it as JSON.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::Serialize;
use slowrank_agent::{
    clock::{mono_ns, wall_ns, HostClock},
    ship::{client_config, Uplink, UplinkConfig},
};
use slowrank_shared::wire::{
    self, Batch, CollOp, CollectiveRecord, CommRecord, Hello, RankIdentity,
};

/// Collectives per training step; the step's last one is followed by a gap.
pub const PER_STEP: u64 = 4;
pub const RANKS_PER_HOST: u32 = 8;
const COMM_ID: u64 = 0x5107_f100d;

#[derive(Debug, thiserror::Error)]
pub enum FloodError {
    #[error(transparent)]
    Orchestrate(#[from] crate::orchestrate::OrchestrateError),
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot start the coordinator")]
    Spawn(#[source] std::io::Error),
    #[error("the coordinator wrote no certificate within 30 s; see {0}")]
    NotReady(PathBuf),
    #[error("QUIC client setup")]
    Ship(#[from] slowrank_agent::ship::ShipError),
    #[error("encoding a batch")]
    Wire(#[from] slowrank_shared::wire::WireError),
    #[error("--ranks must be a positive multiple of {RANKS_PER_HOST} (got {0})")]
    Ranks(u32),
    #[error("--slow-rank {0} is outside the {1} ranks")]
    SlowRank(u32, u32),
}

/// What to play.
#[derive(Debug, Clone, Serialize)]
pub struct FloodOptions {
    pub ranks: u32,
    pub collectives_per_s: f64,
    pub seconds: f64,
    pub slow_rank: Option<u32>,
    /// Seconds after the start when the slow rank turns slow.
    pub onset_s: f64,
    /// How late the slow rank's GPU reaches each collective (µs).
    pub delay_us: f64,
    /// How often each simulated agent cuts and ships a batch (ms): the
    /// agent's `--flush-ms`. Per-batch work (a QUIC stream, validation, an
    /// acknowledgement) is what the coordinator pays per host, so this and
    /// the host count set its batch rate.
    pub flush_ms: u64,
    /// Working directory (certificate, report, coordinator log).
    pub out: PathBuf,
}

/// One per-second sample of the coordinator.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t_s: f64,
    /// Coordinator CPU since the previous sample, percent of one core.
    pub cpu_percent: f64,
    pub rss_mib: f64,
    /// Records the coordinator accepted so far (its ingest counter).
    pub records_accepted: Option<u64>,
    /// Records the generator had produced by then.
    pub records_sent: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FloodResult {
    pub options: FloodOptions,
    pub hosts: u32,
    pub coordinator_pid: u32,
    pub coordinator_bin: PathBuf,
    pub records_offered_per_s: f64,
    pub records_sent: u64,
    /// Sent per second of generation (falls short of offered when the
    /// generator itself cannot keep up).
    pub records_sent_per_s: f64,
    pub records_accepted: Option<u64>,
    /// Batch bytes the coordinator received, per rank per second of load.
    pub wire_bytes_per_rank_s: Option<f64>,
    /// Accepted per second over the run, from the coordinator's counter.
    pub ingest_per_s: Option<f64>,
    /// Generator behind its real-time schedule when the time was up (s);
    /// 0 when it sent everything on time.
    pub generator_lag_s: f64,
    /// Seconds from starting the agents until the coordinator counted all
    /// of them connected (the connect storm; `None`: not all within 60 s).
    /// The job starts after it, as a real job's first collective comes
    /// long after its hosts' agents are up (NCCL's bootstrap of thousands
    /// of ranks alone takes longer).
    pub all_connected_s: Option<f64>,
    pub coordinator_cpu_s: f64,
    pub cpu_percent_mean: f64,
    pub rss_mib_max: f64,
    /// RSS over the last third of the run minus over the middle third:
    /// near 0 when memory stopped growing.
    pub rss_growth_mib_late: f64,
    /// Seconds from onset to the first alert naming the slow rank.
    pub verdict_after_onset_s: Option<f64>,
    /// Every alert line the coordinator printed (first 20).
    pub alerts: Vec<String>,
    pub samples: Vec<Sample>,
}

/// Collective `k` (0-based, per rank) starts this long after the job start:
/// `PER_STEP` collectives 10% of a step apart, then the rest of the step idle.
pub fn collective_offset_ns(k: u64, collectives_per_s: f64) -> u64 {
    let step_ns = PER_STEP as f64 / collectives_per_s * 1e9;
    let it = k / PER_STEP;
    let j = k % PER_STEP;
    (it as f64 * step_ns + (0.4 + 0.1 * j as f64) * step_ns) as u64
}

/// Deterministic jitter in [0, 1) from (rank, seq).
fn unit(rank: u32, seq: u64) -> f64 {
    let mut z = (u64::from(rank) << 40) ^ seq ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// The records of instance `seq` for the ranks of `host`, with the job
/// started at monotonic `start_ns`.
pub fn instance_records(
    o: &FloodOptions,
    host: u32,
    seq: u64,
    start_ns: u64,
) -> Vec<CollectiveRecord> {
    let t = start_ns + collective_offset_ns(seq, o.collectives_per_s);
    let onset_ns = start_ns + (o.onset_s * 1e9) as u64;
    let delay_ns = (o.delay_us * 1e3) as u64;
    // Every member's GPU arrives within 100 µs; the instance completes after
    // the last arrival plus a 500 µs transfer.
    let arrive = |r: u32| {
        let mut a = t + 50_000 + (unit(r, seq) * 100_000.0) as u64;
        if Some(r) == o.slow_rank && t >= onset_ns {
            a += delay_ns;
        }
        a
    };
    let last = match o.slow_rank {
        Some(r) if t >= onset_ns => (t + 150_000).max(arrive(r)),
        _ => t + 150_000,
    };
    let done = last + 500_000;
    (host * RANKS_PER_HOST..(host + 1) * RANKS_PER_HOST)
        .map(|r| {
            let entry = t + (unit(r, seq ^ 0xABCD) * 40_000.0) as u64;
            CollectiveRecord {
                pid: 100_000 + r,
                rank: r,
                comm_id: COMM_ID,
                seq,
                op: CollOp::AllReduce,
                bytes: 25 << 20,
                peer: -1,
                host_entry_ns: entry,
                host_exit_ns: entry + 15_000,
                gpu_arrive_ns: arrive(r),
                gpu_done_ns: done,
                launches_before: 30,
                sync_wait_ns_before: 0,
                gpu_busy_before_ns: None,
                ret: 0,
            }
        })
        .collect()
}

fn identities(o: &FloodOptions, host: u32, now: u64) -> (Vec<RankIdentity>, Vec<CommRecord>) {
    let ranks = host * RANKS_PER_HOST..(host + 1) * RANKS_PER_HOST;
    let ids = ranks
        .clone()
        .map(|r| RankIdentity {
            pid: 100_000 + r,
            rank: r,
            world_size: o.ranks,
            local_rank: r % RANKS_PER_HOST,
            local_world_size: RANKS_PER_HOST,
            group_rank: host,
            restart_count: 0,
            job_id: "flood".into(),
            seen_ns: now,
        })
        .collect();
    let comms = ranks
        .map(|r| CommRecord {
            pid: 100_000 + r,
            rank: r,
            comm_id: COMM_ID,
            parent_id: 0,
            color: 0,
            nranks: o.ranks,
            rank_in_comm: r,
            created_ns: now,
            split_ordinal: 0,
            split_key: 0,
            resumed: false,
        })
        .collect();
    (ids, comms)
}

/// `(utime + stime)` seconds and RSS MiB of a process.
fn proc_usage(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / tck;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    let rss = f.get(21)?.parse::<f64>().ok()? * page / (1024.0 * 1024.0);
    Some((cpu, rss))
}

/// The coordinator's `records_accepted` counter from its `/metrics`.
fn scrape_accepted(addr: SocketAddr) -> Option<u64> {
    scrape(addr, "slowrank_ingest_total{what=\"records_accepted\"}")
}

/// One counter of the coordinator's `/metrics`.
fn scrape(addr: SocketAddr, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

fn free_port() -> Result<u16, FloodError> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|source| FloodError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })
}

struct Coordinator {
    child: Child,
    alerts: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_coordinator(
    bin: &Path,
    out: &Path,
    listen: SocketAddr,
    metrics: SocketAddr,
    token: &str,
) -> Result<Coordinator, FloodError> {
    let log = out.join("coordinator.log");
    let err = std::fs::File::create(&log).map_err(|source| FloodError::Io {
        path: log.clone(),
        source,
    })?;
    let mut child = Command::new(bin)
        .arg("serve")
        .arg("--listen")
        .arg(listen.to_string())
        .args(["--clock-port", "0"])
        .arg("--tls-dir")
        .arg(out.join("tls"))
        .arg("--out")
        .arg(out)
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        // Extra `serve` flags to compare settings, as `run` takes them.
        .args(
            std::env::var("SLOWRANK_COORDINATOR_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .env("SLOWRANK_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(FloodError::Spawn)?;
    let alerts = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().expect("piped");
    let a = alerts.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            a.lock().expect("alerts").push((Instant::now(), line));
        }
    });
    let cert = out.join("tls").join("coordinator.crt");
    let t0 = Instant::now();
    while !cert.exists() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            return Err(FloodError::NotReady(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Socket bound right after the certificate is written.
    std::thread::sleep(Duration::from_millis(300));
    Ok(Coordinator { child, alerts })
}

/// Does alert `line` open a verdict on `rank`?
pub fn alert_names_rank(line: &str, rank: u32) -> bool {
    (line.contains("OPEN") || line.contains("REOPEN")) && line.contains(&format!("rank {rank} "))
}

/// Plays the load and measures the coordinator.
pub fn flood(o: &FloodOptions) -> Result<FloodResult, FloodError> {
    if o.ranks == 0 || !o.ranks.is_multiple_of(RANKS_PER_HOST) {
        return Err(FloodError::Ranks(o.ranks));
    }
    if let Some(k) = o.slow_rank.filter(|k| *k >= o.ranks) {
        return Err(FloodError::SlowRank(k, o.ranks));
    }
    std::fs::create_dir_all(&o.out).map_err(|source| FloodError::Io {
        path: o.out.clone(),
        source,
    })?;
    let bin = crate::orchestrate::binary("slowrank")?;
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let metrics = SocketAddr::from(([127, 0, 0, 1], {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| FloodError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })?;
        l.local_addr().map(|a| a.port()).unwrap_or(0)
    }));
    let token = format!("flood-{}", std::process::id());
    let coord = start_coordinator(&bin, &o.out, listen, metrics, &token)?;
    let pid = coord.child.id();
    let ca_path = o.out.join("tls").join("coordinator.crt");
    let ca = std::fs::read(&ca_path).map_err(|source| FloodError::Io {
        path: ca_path.clone(),
        source,
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(FloodError::Runtime)?;
    let hosts = o.ranks / RANKS_PER_HOST;
    let client = client_config(&ca, &ca_path.display().to_string())?;

    let (sent, lag, samples, t_onset, all_connected_s) = rt.block_on(async {
        let mut uplinks = Vec::new();
        for h in 0..hosts {
            let host = format!("flood-{h}");
            uplinks.push(Uplink::spawn(UplinkConfig {
                addr: listen,
                server_name: "slowrank-coordinator".into(),
                client: client.clone(),
                hello: Hello {
                    token: token.clone(),
                    host: host.clone(),
                    agent_id: format!("{host}-{}", std::process::id()),
                    mono_ns: mono_ns(),
                    wall_ns: wall_ns(),
                },
                spool_bytes: 64 << 20,
                clock: HostClock::real(),
                // Its own loopback address, as each real host has its own:
                // the coordinator admits 8 connections before hello per
                // source address, and 512 hosts from 127.0.0.1 queued
                // behind that cap for up to 27 s.
                bind: Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                    127,
                    1 + (h >> 16) as u8,
                    (h >> 8) as u8,
                    h as u8,
                ))),
            }));
        }
        // The job starts once every agent is connected (or after 60 s):
        // records of a job already running while the last of 2,048 hosts
        // is still in its TLS handshake measure the connect storm, which
        // `all_connected_s` reports on its own, not steady ingest.
        let t_connect = Instant::now();
        let mut all_connected_s = None;
        while t_connect.elapsed() < Duration::from_secs(60) {
            let n =
                tokio::task::spawn_blocking(move || scrape(metrics, "slowrank_agents_connected"))
                    .await
                    .ok()
                    .flatten();
            if n.is_some_and(|n| n >= u64::from(hosts)) {
                all_connected_s = Some(t_connect.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Give the clock probes a second before the job starts.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let start_ns = mono_ns();
        let t_start = Instant::now();
        let t_onset = t_start + Duration::from_secs_f64(o.onset_s);
        let mut batch_seq = vec![0u64; hosts as usize];
        let mut next_seq = 0u64;
        let mut sent = 0u64;
        let mut samples = Vec::new();
        let mut last_cpu = proc_usage(pid).map_or(0.0, |u| u.0);
        let mut next_sample = 1.0;
        let total = (o.seconds * o.collectives_per_s) as u64;
        let mut tick = tokio::time::interval(Duration::from_millis(o.flush_ms.max(10)));
        loop {
            tick.tick().await;
            let now = mono_ns();
            // Instances complete (done) by now, not yet sent.
            let mut upto = next_seq;
            while upto < total
                && start_ns
                    + collective_offset_ns(upto, o.collectives_per_s)
                    + 2_000_000
                    + (o.delay_us * 1e3) as u64
                    <= now
            {
                upto += 1;
            }
            for h in 0..hosts {
                let mut b = Batch {
                    host: format!("flood-{h}"),
                    agent_id: format!("flood-{h}-{}", std::process::id()),
                    seq: batch_seq[h as usize],
                    mono_ns: now,
                    wall_ns: wall_ns(),
                    ..Default::default()
                };
                if batch_seq[h as usize] == 0 {
                    (b.ranks, b.comms) = identities(o, h, start_ns);
                }
                for s in next_seq..upto {
                    b.collectives.extend(instance_records(o, h, s, start_ns));
                }
                sent += b.collectives.len() as u64;
                batch_seq[h as usize] += 1;
                match wire::encode(&b) {
                    Ok(bytes) => uplinks[h as usize].send(bytes),
                    Err(e) => tracing::warn!("batch not encoded: {e}"),
                }
            }
            next_seq = upto;
            let el = t_start.elapsed().as_secs_f64();
            if el >= next_sample {
                next_sample += 1.0;
                let (cpu, rss) = proc_usage(pid).unwrap_or((last_cpu, 0.0));
                let accepted = tokio::task::spawn_blocking(move || scrape_accepted(metrics))
                    .await
                    .ok()
                    .flatten();
                samples.push(Sample {
                    t_s: el,
                    cpu_percent: (cpu - last_cpu) * 100.0,
                    rss_mib: rss,
                    records_accepted: accepted,
                    records_sent: sent,
                });
                last_cpu = cpu;
            }
            // Stop at the deadline even when behind: the lag says how far.
            if next_seq >= total || t_start.elapsed().as_secs_f64() >= o.seconds {
                break;
            }
        }
        let behind_ns = (mono_ns().saturating_sub(start_ns))
            .saturating_sub(collective_offset_ns(next_seq, o.collectives_per_s));
        let lag = if next_seq >= total {
            0.0
        } else {
            behind_ns as f64 / 1e9
        };
        // Let the coordinator drain (and alert) before the agents go.
        tokio::time::sleep(Duration::from_secs(3)).await;
        // All at once: one by one, N/8 graces would add up.
        let finishing: Vec<_> = uplinks
            .into_iter()
            .map(|u| tokio::spawn(u.finish(Duration::from_secs(5))))
            .collect();
        // An overloaded coordinator may never acknowledge: bounded wait.
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            for f in finishing {
                let _ = f.await;
            }
        })
        .await;
        (sent, lag.max(0.0), samples, t_onset, all_connected_s)
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let accepted = scrape_accepted(metrics);
    let bytes = scrape(metrics, "slowrank_batch_bytes_received_total");
    let cpu_total = proc_usage(pid).map_or(0.0, |u| u.0);
    let alerts = coord.alerts.lock().expect("alerts").clone();
    drop(coord);
    let verdict_after_onset_s = o.slow_rank.and_then(|k| {
        alerts
            .iter()
            .find(|(_, l)| alert_names_rank(l, k))
            .map(|(t, _)| t.saturating_duration_since(t_onset).as_secs_f64())
    });
    let run_s = o.seconds;
    let rss: Vec<f64> = samples.iter().map(|s| s.rss_mib).collect();
    let third = rss.len() / 3;
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let rss_growth = if third > 0 {
        mean(&rss[2 * third..]) - mean(&rss[third..2 * third])
    } else {
        0.0
    };
    Ok(FloodResult {
        hosts,
        coordinator_pid: pid,
        coordinator_bin: bin,
        records_offered_per_s: f64::from(o.ranks) * o.collectives_per_s,
        records_sent: sent,
        records_sent_per_s: sent as f64 / run_s.max(1e-9),
        records_accepted: accepted,
        wire_bytes_per_rank_s: bytes.map(|b| b as f64 / f64::from(o.ranks) / o.seconds.max(1e-9)),
        ingest_per_s: accepted.map(|a| a as f64 / (run_s + 3.0)),
        generator_lag_s: lag,
        all_connected_s,
        coordinator_cpu_s: cpu_total,
        cpu_percent_mean: mean(&samples.iter().map(|s| s.cpu_percent).collect::<Vec<_>>()),
        rss_mib_max: rss.iter().copied().fold(0.0, f64::max),
        rss_growth_mib_late: rss_growth,
        verdict_after_onset_s,
        alerts: alerts.into_iter().take(20).map(|(_, l)| l).collect(),
        samples,
        options: o.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> FloodOptions {
        FloodOptions {
            ranks: 16,
            collectives_per_s: 100.0,
            flush_ms: 200,
            seconds: 2.0,
            slow_rank: Some(9),
            onset_s: 1.0,
            delay_us: 2000.0,
            out: "/tmp/unused".into(),
        }
    }

    #[test]
    fn schedule_has_a_step_gap() {
        // 100/s, 4 per step: a 40 ms step, collectives at 16, 20, 24, 28 ms.
        let o: Vec<u64> = (0..5).map(|k| collective_offset_ns(k, 100.0)).collect();
        assert_eq!(
            o,
            vec![16_000_000, 20_000_000, 24_000_000, 28_000_000, 56_000_000]
        );
    }

    #[test]
    fn slow_rank_arrives_late_after_onset_only_and_everyone_completes_together() {
        let o = opts();
        let start = 1_000_000_000;
        let before = instance_records(&o, 1, 4, start);
        let after = instance_records(&o, 1, 200, start);
        assert_eq!(before.len(), 8);
        assert_eq!(before[0].rank, 8);
        let late = |v: &[CollectiveRecord]| {
            let med = v[0].gpu_arrive_ns;
            v.iter()
                .find(|r| r.rank == 9)
                .unwrap()
                .gpu_arrive_ns
                .saturating_sub(med)
        };
        assert!(late(&before) < 200_000);
        assert!(late(&after) > 1_800_000);
        assert!(after.iter().all(|r| r.gpu_done_ns == after[0].gpu_done_ns));
        assert!(after.iter().all(|r| r.gpu_done_ns > r.gpu_arrive_ns));
    }

    #[test]
    fn alert_lines_are_matched_by_rank() {
        let l = "2026-11-23T03:27:47Z OPEN   rank 9 on flood-1 is compute-slow, costing 16%";
        assert!(alert_names_rank(l, 9));
        assert!(!alert_names_rank(l, 1));
        assert!(!alert_names_rank("CLOSED rank 9 on x", 9));
    }

    #[test]
    fn bad_options_are_refused() {
        let mut o = opts();
        o.ranks = 12;
        assert!(matches!(flood(&o), Err(FloodError::Ranks(12))));
        o.ranks = 16;
        o.slow_rank = Some(16);
        assert!(matches!(flood(&o), Err(FloodError::SlowRank(16, 16))));
    }
}

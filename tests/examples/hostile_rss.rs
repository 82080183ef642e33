//! Issue 27's bound for a large job, measured: a real `slowrank serve`
//! ingests a 4,096-rank job while the worst memory attacks of the hostile
//! tests run beside it, one after the other and then all at once; for each
//! it prints the coordinator's peak RSS, the rate of a legitimate agent
//! (the hostile tests' [`Legit`], 40 batches a second) and the job's
//! records accepted per second against those offered.
//!
//! The job: rank 0 is the legitimate agent's, ranks 8–4,095 are played by
//! 64 connections of 64 ranks (the `slowrank-scenario flood` records, one
//! 4,088-member communicator), and each attack's token holder owns one of
//! ranks 1–7 (an attacker must own a rank to send records at all).
//!
//! A measurement, not a test (no assertion): run it after a release build,
//!
//! ```text
//! cargo build --release -p slowrank-coordinator --bin slowrank
//! cargo build --release -p slowrank-tests --example hostile_rss
//! SLOWRANK_COORDINATOR_BIN=target/release/slowrank target/release/examples/hostile_rss
//! ```
//!
//! Environment: `BENCH_COLL_PER_S` (collectives per rank per second,
//! default 20), `BENCH_PHASE_S` (seconds per phase, default 20).

#[path = "../tests/hostile/mod.rs"]
mod hostile;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use hostile::*;
use slowrank_agent::{
    clock::{self, HostClock},
    ship::{Uplink, UplinkConfig},
};
use slowrank_coordinator::net::tls::SERVER_NAME;
use slowrank_scenarios::flood::{collective_offset_ns, instance_records, FloodOptions};
use slowrank_shared::wire::{
    self, CollOp, CollectiveRecord, CommRecord, FoldedStack, RankIdentity, StackView, StackWindow,
};

const WORLD: u32 = 4096;
/// Ranks per `flood` host (its unit of records) and flood hosts per
/// connection: 64 connections, fewer than a real job's 512 agents, so the
/// generator (one thread) keeps its schedule; the records are the same.
const FLOOD_HOST_RANKS: u32 = 8;
const HOSTS_PER_CONN: u32 = 8;
const FLOOD_COMM: u64 = 0x5107_f100d;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The 4,096-rank job's load on its own runtime thread.
struct Flood {
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<f64>>,
}

impl Flood {
    fn start(coord: &Coord, coll_per_s: f64) -> Flood {
        let (sent, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (s, st) = (sent.clone(), stop.clone());
        let (addr, client) = (coord.addr, coord.client());
        let o = FloodOptions {
            ranks: WORLD,
            collectives_per_s: coll_per_s,
            seconds: 1e9,
            slow_rank: None,
            onset_s: 1e9,
            delay_us: 0.0,
            flush_ms: 200,
            out: std::env::temp_dir(),
        };
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("flood runtime");
            rt.block_on(async move {
                // Flood hosts 1..512 (ranks 8..4096), eight to a connection.
                let hosts: Vec<Vec<u32>> = (1..WORLD / FLOOD_HOST_RANKS)
                    .collect::<Vec<_>>()
                    .chunks(HOSTS_PER_CONN as usize)
                    .map(<[u32]>::to_vec)
                    .collect();
                let start_ns = clock::mono_ns();
                let mut uplinks = Vec::new();
                for (c, hs) in hosts.iter().enumerate() {
                    let host = format!("flood-{c}");
                    let agent_id = format!("{host}-1");
                    let u = Uplink::spawn(UplinkConfig {
                        addr,
                        server_name: SERVER_NAME.into(),
                        client: client.clone(),
                        hello: hello(&host, &agent_id, TOKEN),
                        spool_bytes: 64 << 20,
                        clock: HostClock::real(),
                        bind: None,
                    });
                    let mut pre = batch(&host, &agent_id, 0, Vec::new());
                    for r in hs[0] * FLOOD_HOST_RANKS..(hs[hs.len() - 1] + 1) * FLOOD_HOST_RANKS {
                        pre.ranks.push(RankIdentity {
                            pid: 100_000 + r,
                            rank: r,
                            world_size: WORLD,
                            local_rank: r % 64,
                            local_world_size: 64,
                            group_rank: c as u32 + 1,
                            restart_count: 0,
                            job_id: "hostile-job".into(),
                            seen_ns: start_ns,
                        });
                        pre.comms.push(CommRecord {
                            pid: 100_000 + r,
                            rank: r,
                            comm_id: FLOOD_COMM,
                            parent_id: 0,
                            color: 0,
                            nranks: WORLD - FLOOD_HOST_RANKS,
                            rank_in_comm: r - FLOOD_HOST_RANKS,
                            created_ns: start_ns,
                            split_ordinal: 0,
                            split_key: 0,
                            resumed: false,
                        });
                    }
                    // Sent as the first batch, and again first on every
                    // reconnection (the preamble, numbered 0).
                    let bytes = wire::encode(&pre).expect("encode");
                    u.set_preamble(bytes.clone());
                    pre.seq = 1;
                    u.send(wire::encode(&pre).expect("encode"));
                    uplinks.push((host, agent_id, u));
                }
                let (mut next, mut seq) = (0u64, 1u64);
                let mut lag_s: f64 = 0.0;
                let mut tick = tokio::time::interval(Duration::from_millis(o.flush_ms));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !st.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let now = clock::mono_ns();
                    let mut upto = next;
                    while start_ns + collective_offset_ns(upto, coll_per_s) + 2_000_000 <= now {
                        upto += 1;
                    }
                    seq += 1;
                    for ((host, agent_id, u), hs) in uplinks.iter().zip(&hosts) {
                        let mut b = batch(host, agent_id, seq, Vec::new());
                        for k in next..upto {
                            for &h in hs {
                                b.collectives.extend(instance_records(&o, h, k, start_ns));
                            }
                        }
                        s.fetch_add(b.collectives.len() as u64, Ordering::Relaxed);
                        u.send(wire::encode(&b).expect("encode"));
                    }
                    next = upto;
                    lag_s = lag_s.max(
                        clock::mono_ns().saturating_sub(now) as f64 / 1e9 - o.flush_ms as f64 / 1e3,
                    );
                }
                for (_, _, u) in uplinks {
                    u.finish(Duration::from_millis(100)).await;
                }
                lag_s.max(0.0)
            })
        });
        Flood {
            sent,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops; the generator's worst lag behind its schedule (s).
    fn stop(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or(f64::NAN)
    }
}

fn accepted(coord: &Coord) -> u64 {
    coord.metric("slowrank_ingest_total{what=\"records_accepted\"}")
}

/// A token holder on `host` owning `rank`, connected from 127.0.0.2.
async fn attacker(coord: &Coord, host: &str, rank: u32) -> (quinn::Endpoint, quinn::Connection) {
    let (ep, conn) = raw_connect(coord, "127.0.0.2").await.expect("QUIC");
    let id = format!("{host}-1");
    let reply = raw_hello(&conn, &hello(host, &id, TOKEN)).await.unwrap();
    assert!(reply.accepted, "{}", reply.reason);
    let b = batch(host, &id, 1, vec![identity(rank, WORLD, 0)]);
    let _ = raw_send(&conn, &b).await;
    (ep, conn)
}

fn comm(rank: u32, id: u64, nranks: u32) -> CommRecord {
    CommRecord {
        pid: 1000 + rank,
        rank,
        comm_id: id,
        parent_id: 0,
        color: 0,
        nranks,
        rank_in_comm: 0,
        created_ns: clock::mono_ns(),
        split_ordinal: 0,
        split_key: 0,
        resumed: false,
    }
}

fn coll(rank: u32, id: u64, seq: u64) -> CollectiveRecord {
    let now = clock::mono_ns();
    CollectiveRecord {
        pid: 1000 + rank,
        rank,
        comm_id: id,
        seq,
        op: CollOp::AllReduce,
        bytes: 1 << 20,
        peer: -1,
        host_entry_ns: now - 1_000_000,
        host_exit_ns: now,
        gpu_arrive_ns: 0,
        gpu_done_ns: 0,
        launches_before: 0,
        sync_wait_ns_before: 0,
        gpu_busy_before_ns: None,
        ret: 0,
    }
}

/// Finding 1: unfinished hellos with 99 streams of 1.2 MB behind them, six
/// connections at a time, and 20 idle ones from another address.
async fn preauth(coord: Arc<Coord>, until: Instant) {
    async fn pin(coord: &Coord, until: Instant) {
        let Ok((_ep, conn)) = raw_connect(coord, "127.0.0.3").await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        };
        if let Ok((mut send, _recv)) = conn.open_bi().await {
            let _ = send.write_all(b"SLRK").await;
            let junk = vec![0x5au8; 1_200_000];
            for _ in 0..99 {
                let (c, junk) = (conn.clone(), junk.clone());
                tokio::spawn(async move {
                    if let Ok((mut s, _r)) = c.open_bi().await {
                        let _ = s.write_all(&junk).await;
                    }
                });
            }
            let left = until.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(left, conn.closed()).await;
        }
    }
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let c = coord.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                pin(&c, until).await;
            }
        }));
    }
    let mut idle = Vec::new();
    for _ in 0..20 {
        if let Ok(c) = raw_connect(&coord, "127.0.0.4").await {
            idle.push(c);
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    drop(idle);
}

/// Finding 5: thousands of communicators with instances that never
/// complete (100 communicators × 40 instances a batch, fresh ids each).
async fn open_instances(coord: Arc<Coord>, until: Instant, host: &str, rank: u32) -> u64 {
    let (_ep, conn) = attacker(&coord, host, rank).await;
    let id = format!("{host}-1");
    let mut n = 0u64;
    let mut seq = 1;
    while Instant::now() < until {
        seq += 1;
        let mut b = batch(host, &id, seq, Vec::new());
        for c in 0..100u64 {
            let cid = 0x1_0000_0000 + seq * 1000 + c;
            b.comms.push(comm(rank, cid, WORLD));
            b.collectives.extend((0..40).map(|s| coll(rank, cid, s)));
        }
        let bytes = tokio::task::spawn_blocking(move || wire::encode(&b).unwrap())
            .await
            .unwrap();
        if raw_send_bytes(&conn, &bytes).await.is_ok() {
            n += 4000;
        }
    }
    n
}

/// Finding 6: communicators of 2^20 ranks (the most a record may claim),
/// with instances on them.
async fn huge_comms(coord: Arc<Coord>, until: Instant, host: &str, rank: u32) -> u64 {
    let (_ep, conn) = attacker(&coord, host, rank).await;
    let id = format!("{host}-1");
    let mut n = 0u64;
    let mut seq = 1;
    while Instant::now() < until {
        seq += 1;
        let mut b = batch(host, &id, seq, Vec::new());
        for c in 0..100u64 {
            let cid = 0x2_0000_0000 + seq * 1000 + c;
            b.comms.push(comm(rank, cid, 1 << 20));
            b.collectives.extend((0..40).map(|s| coll(rank, cid, s)));
        }
        let bytes = tokio::task::spawn_blocking(move || wire::encode(&b).unwrap())
            .await
            .unwrap();
        if raw_send_bytes(&conn, &bytes).await.is_ok() {
            n += 100;
        }
    }
    n
}

/// A window of `n` distinct stacks of 64 frames for `rank`.
fn stacks(rank: u32, n: usize) -> StackWindow {
    let now = clock::mono_ns();
    StackWindow {
        rank,
        view: StackView::Cpu,
        start_ns: now - 1_000_000_000,
        end_ns: now,
        strings: (0..n)
            .map(|i| format!("forged_frame_{i:08}_{}", "x".repeat(40)))
            .collect(),
        stacks: (0..n)
            .map(|i| FoldedStack {
                frames: (0..64).map(|f| ((i + f) % n) as u32).collect(),
                weight: 1_000,
            })
            .collect(),
        records: n as u64,
        truncated: 0,
        overflow_weight: 0,
    }
}

/// Finding 7: batches of ≈ 12 MB of stacks, half for the attacker's own
/// rank (kept up to the per-rank cap), half forged for a rank of the job.
async fn forged_stacks(coord: Arc<Coord>, until: Instant, host: &str, rank: u32) -> u64 {
    let (_ep, conn) = attacker(&coord, host, rank).await;
    let id = format!("{host}-1");
    let template = {
        let mut b = batch(host, &id, 2, Vec::new());
        b.stacks = (0..8)
            .map(|i| stacks(if i % 2 == 0 { rank } else { 100 }, 5_000))
            .collect();
        b
    };
    let mut n = 0u64;
    let mut seq = 1;
    while Instant::now() < until {
        seq += 1;
        let mut b = template.clone();
        b.seq = seq;
        let bytes = tokio::task::spawn_blocking(move || wire::encode(&b).unwrap())
            .await
            .unwrap();
        if raw_send_bytes(&conn, &bytes).await.is_ok() {
            n += 8;
        }
    }
    n
}

struct Row {
    phase: &'static str,
    peak_mib: f64,
    legit: f64,
    accepted_per_s: f64,
    offered_per_s: f64,
    what: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let coll_per_s = env_f64("BENCH_COLL_PER_S", 20.0);
    let phase = Duration::from_secs_f64(env_f64("BENCH_PHASE_S", 20.0));
    let coord = Arc::new(Coord::start("bench4096"));
    eprintln!(
        "coordinator pid {} on {}, {WORLD} ranks at {coll_per_s} collectives/s, {:?} a phase",
        coord.child.id(),
        coord.addr,
        phase
    );
    let legit = Legit::start(&coord, "node-0", "agent-0", vec![identity(0, WORLD, 0)]).await;
    let flood = Flood::start(&coord, coll_per_s);
    // Every connection accepted and the job known before measuring.
    let t0 = Instant::now();
    while coord.metric("slowrank_agents_connected") < 65 && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!(
        "{} agents connected after {:.1} s",
        coord.metric("slowrank_agents_connected"),
        t0.elapsed().as_secs_f64()
    );

    type Attack = fn(Arc<Coord>, Instant) -> futures_like::Boxed;
    let attacks: [(&'static str, Attack); 6] = [
        ("none (baseline)", |_, until| {
            Box::pin(async move {
                tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
                String::new()
            })
        }),
        ("unfinished pre-hello streams (1)", |c, until| {
            Box::pin(async move {
                preauth(c, until).await;
                String::new()
            })
        }),
        ("open instances (5)", |c, until| {
            Box::pin(async move {
                let n = open_instances(c, until, "evil-5", 5).await;
                format!("{n} instances opened")
            })
        }),
        ("2^20-rank communicators (6)", |c, until| {
            Box::pin(async move {
                let n = huge_comms(c, until, "evil-6", 6).await;
                format!("{n} communicators claimed")
            })
        }),
        ("forged stacks (7)", |c, until| {
            Box::pin(async move {
                let n = forged_stacks(c, until, "evil-7", 7).await;
                format!("{n} stack windows sent")
            })
        }),
        ("all four at once", |c, until| {
            Box::pin(async move {
                let (_, a, b, s) = tokio::join!(
                    preauth(c.clone(), until),
                    open_instances(c.clone(), until, "evil-2", 2),
                    huge_comms(c.clone(), until, "evil-3", 3),
                    forged_stacks(c.clone(), until, "evil-4", 4),
                );
                format!("{a} instances, {b} communicators, {s} stack windows")
            })
        }),
    ];
    let mut rows = Vec::new();
    for (name, attack) in attacks {
        let (a0, s0, t) = (
            accepted(&coord),
            flood.sent.load(Ordering::Relaxed),
            Instant::now(),
        );
        let watch = RssWatch::start(coord.child.id());
        let until = Instant::now() + phase;
        let (legit_rate, what) = legit.rate_during(attack(coord.clone(), until)).await;
        // Records cut in the phase have had the grace period to arrive.
        let (a1, s1, took) = (
            accepted(&coord),
            flood.sent.load(Ordering::Relaxed),
            t.elapsed(),
        );
        let peak = watch.stop();
        let row = Row {
            phase: name,
            peak_mib: mib(peak),
            legit: legit_rate,
            accepted_per_s: a1.saturating_sub(a0) as f64 / took.as_secs_f64(),
            offered_per_s: s1.saturating_sub(s0) as f64 / took.as_secs_f64(),
            what,
        };
        eprintln!(
            "{}: peak RSS {:.0} MiB, legitimate agent {:.1}/s, job {:.0} of {:.0} records/s accepted {}",
            row.phase, row.peak_mib, row.legit, row.accepted_per_s, row.offered_per_s, row.what
        );
        rows.push(row);
        // Let the attack's connections go before the next one.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let lag = flood.stop();
    let r = coord.report();
    let report_bytes = std::fs::metadata(coord.dir.join("out").join("report.json"))
        .map(|m| m.len())
        .unwrap_or(0);
    let body = coord.scrape();
    legit.stop();
    let baseline = rows[0].legit.min(f64::from(LEGIT_RATE));
    println!("| attack ({WORLD}-rank job, {coll_per_s} coll/s) | peak RSS | legitimate agent | share of normal | job records accepted/offered per s |");
    println!("| --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {:.0} MiB | {:.1}/s | {:.0} % | {:.0} / {:.0} |",
            r.phase,
            r.peak_mib,
            r.legit,
            100.0 * r.legit / baseline,
            r.accepted_per_s,
            r.offered_per_s
        );
    }
    println!(
        "generator lag ≤ {lag:.2} s; report.json {report_bytes} B; open instances {}, evicted {}; \
         records rejected {}; connections refused {}; stack windows refused {}, evicted {}",
        r["ingest"]["open_instances"],
        r["ingest"]["instances_evicted"],
        r["ingest"]["records_rejected"],
        r["ingest"]["agents_refused_by"],
        metric(&body, "slowrank_stack_windows_refused_total"),
        metric(&body, "slowrank_stack_windows_evicted_total"),
    );
}

/// A boxed attack future (its summary line).
mod futures_like {
    pub type Boxed = std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>;
}

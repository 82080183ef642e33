//! The analyzer's own cost per record, without QUIC or a generator sharing
//! the cores: a flood-shaped job (one world communicator, 8 ranks a host,
//! every host's batch every `FLUSH_MS`) fed straight into
//! [`Analyzer::ingest`], ticked every 100 ms of its clock like `serve`.
//! Prints records per second of ingest time and of ingest + tick time;
//! `flood` measures the whole coordinator, this isolates the pipeline.
//!
//! ```sh
//! cargo bench -p slowrank-coordinator --bench ingest
//! BENCH_RANKS=4096 BENCH_COLL_PER_S=100 cargo bench -p slowrank-coordinator --bench ingest
//! ```

use std::time::{Duration, Instant};

use slowrank_coordinator::{Analyzer, AnalyzerConfig, ClockSample};
use slowrank_shared::wire::{Batch, CollOp, CollectiveRecord, CommRecord, RankIdentity};

// The coordinator binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RANKS_PER_HOST: u32 = 8;
const COMM_ID: u64 = 0x5107_f100d;
/// Agent and coordinator clocks agree; the job starts here.
const START_NS: u64 = 1_000_000_000_000;

fn env_or(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Collective `k` starts this long after the job start: steps of
/// `PER_STEP` collectives 10 % of a step apart, then the step's idle rest
/// (the flood's schedule, so iterations are found as in `flood`).
const PER_STEP: u64 = 4;

fn offset_ns(k: u64, per_s: f64) -> u64 {
    let step_ns = PER_STEP as f64 / per_s * 1e9;
    let (it, j) = (k / PER_STEP, k % PER_STEP);
    (it as f64 * step_ns + (0.4 + 0.1 * j as f64) * step_ns) as u64
}

fn jitter(rank: u32, seq: u64) -> u64 {
    let mut z = (u64::from(rank) << 40) ^ seq ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % 100_000
}

fn record(rank: u32, seq: u64, t: u64) -> CollectiveRecord {
    let entry = t + jitter(rank, seq ^ 0xABCD) / 3;
    CollectiveRecord {
        pid: 100_000 + rank,
        rank,
        comm_id: COMM_ID,
        seq,
        op: CollOp::AllReduce,
        bytes: 25 << 20,
        peer: -1,
        host_entry_ns: entry,
        host_exit_ns: entry + 15_000,
        gpu_arrive_ns: t + 50_000 + jitter(rank, seq),
        gpu_done_ns: t + 650_000,
        launches_before: 30,
        sync_wait_ns_before: 0,
        gpu_busy_before_ns: None,
        ret: 0,
    }
}

fn identities(ranks: u32, host: u32) -> (Vec<RankIdentity>, Vec<CommRecord>) {
    let rs = host * RANKS_PER_HOST..(host + 1) * RANKS_PER_HOST;
    let ids = rs
        .clone()
        .map(|r| RankIdentity {
            pid: 100_000 + r,
            rank: r,
            world_size: ranks,
            local_rank: r % RANKS_PER_HOST,
            local_world_size: RANKS_PER_HOST,
            group_rank: host,
            restart_count: 0,
            job_id: "bench".into(),
            seen_ns: START_NS,
        })
        .collect();
    let comms = rs
        .map(|r| CommRecord {
            pid: 100_000 + r,
            rank: r,
            comm_id: COMM_ID,
            parent_id: 0,
            color: 0,
            nranks: ranks,
            rank_in_comm: r,
            created_ns: START_NS,
            split_ordinal: 0,
            split_key: 0,
            resumed: false,
        })
        .collect();
    (ids, comms)
}

/// This process's resident memory (MiB), from `/proc/self/status`.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let ranks = env_or("BENCH_RANKS", 16_384.0) as u32 / RANKS_PER_HOST * RANKS_PER_HOST;
    let per_s = env_or("BENCH_COLL_PER_S", 25.0);
    let seconds = env_or("BENCH_SECONDS", 10.0);
    let flush_ns = (env_or("BENCH_FLUSH_MS", 200.0) * 1e6) as u64;
    let hosts = ranks / RANKS_PER_HOST;
    let a = Analyzer::new(AnalyzerConfig::default());
    let host_names: Vec<String> = (0..hosts).map(|h| format!("bench-{h}")).collect();
    for h in &host_names {
        a.agent_connected(&format!("{h}-1"), START_NS);
    }
    let total = (seconds * per_s) as u64;
    let mut seq_sent = 0u64;
    let mut batch_seq = vec![0u64; hosts as usize];
    let (mut t_ingest, mut t_tick) = (Duration::ZERO, Duration::ZERO);
    let mut records = 0u64;
    let mut now = START_NS;
    let end = START_NS + (seconds * 1e9) as u64 + 2_000_000_000;
    let mut next_tick = START_NS;
    let mut next_flush = START_NS + flush_ns;
    eprintln!(
        "{ranks} ranks ({hosts} hosts), {per_s} collectives/s, {seconds} s, batches every {} ms",
        flush_ns / 1_000_000
    );
    while now < end {
        // Exact clock probes every 100 ms (20 µs round trips).
        for h in &host_names {
            let _ = a.add_clock_sample(
                h,
                ClockSample {
                    coord_send_ns: now - 10_000,
                    agent_mono_ns: now,
                    agent_hold_ns: 0,
                    coord_recv_ns: now + 10_000,
                    udp: false,
                },
            );
        }
        if now >= next_flush {
            next_flush += flush_ns;
            // Instances done 2 ms ago or earlier.
            let mut upto = seq_sent;
            while upto < total && START_NS + offset_ns(upto, per_s) + 2_000_000 <= now {
                upto += 1;
            }
            let batches: Vec<Batch> = (0..hosts)
                .map(|h| {
                    let mut b = Batch {
                        host: host_names[h as usize].clone(),
                        agent_id: format!("{}-1", host_names[h as usize]),
                        seq: batch_seq[h as usize],
                        mono_ns: now,
                        wall_ns: now,
                        ..Default::default()
                    };
                    if batch_seq[h as usize] == 0 {
                        (b.ranks, b.comms) = identities(ranks, h);
                    }
                    batch_seq[h as usize] += 1;
                    for s in seq_sent..upto {
                        let t = START_NS + offset_ns(s, per_s);
                        b.collectives.extend(
                            (h * RANKS_PER_HOST..(h + 1) * RANKS_PER_HOST).map(|r| record(r, s, t)),
                        );
                    }
                    b
                })
                .collect();
            seq_sent = upto;
            let t0 = Instant::now();
            for b in &batches {
                records += a.ingest(b, now + 1_000_000).accepted;
            }
            t_ingest += t0.elapsed();
        }
        if now >= next_tick {
            next_tick += 100_000_000;
            let t0 = Instant::now();
            a.tick(now as i64);
            t_tick += t0.elapsed();
        }
        now += 100_000_000;
        // Memory as the job goes on: a bounded analyzer levels off.
        if (now - START_NS).is_multiple_of(5_000_000_000) {
            eprintln!(
                "  {:>4.0} s of job: RSS {:.0} MiB",
                (now - START_NS) as f64 / 1e9,
                rss_mib()
            );
        }
    }
    let r = a.report();
    let ing = &r.ingest;
    println!(
        "ingest: {records} records accepted in {:.2} s of ingest ({:.0} records/s); ticks {:.2} s; \
         both {:.0} records/s; instances completed {}, evicted {}, rejected {:?}",
        t_ingest.as_secs_f64(),
        records as f64 / t_ingest.as_secs_f64(),
        t_tick.as_secs_f64(),
        records as f64 / (t_ingest + t_tick).as_secs_f64(),
        ing.instances_completed,
        ing.instances_evicted,
        ing.counters.records_rejected,
    );
    // CPU, not wall time, is what compares runs on a shared machine.
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    println!(
        "process CPU: user {:.2} s, system {:.2} s (generator included)",
        secs(ru.ru_utime),
        secs(ru.ru_stime)
    );
}

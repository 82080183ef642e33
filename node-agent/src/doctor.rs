//! `slowrank-agent doctor`: why don't I see my job?

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use slowrank_agent::{
    agent::Agent,
    catalog::Role,
    clock::HostClock,
    discover::{LibKind, Scanner},
    fold::Limits,
    probes::{Attach, Probes},
    sched::SchedStat,
};
use slowrank_shared::probe::cuda_count;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Watch this long (seconds) to count probe hits before reporting.
    #[arg(long, default_value_t = 3.0)]
    watch: f64,
    /// Only consider processes whose environment has KEY=VALUE (repeatable).
    #[arg(long = "only-env", value_name = "KEY=VALUE")]
    only_env: Vec<String>,
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let mut probes = Probes::load().context(
        "loading the eBPF programs failed: the agent needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) and Linux ≥ 5.15",
    )?;
    println!("eBPF programs: loaded");
    let trap = match slowrank_agent::selfcost::measure(&mut probes) {
        Ok(t) => {
            println!(
                "trap cost on this host: {:.2} µs per uprobe hit, {:.2} µs per uprobe + uretprobe pair (an unprobed call: {:.0} ns)",
                t.entry_ns / 1e3,
                t.pair_ns / 1e3,
                t.bare_ns
            );
            println!(
                "  the always-on set pays one pair per collective and sync call; launch/memcpy/malloc counters (one uprobe per call) run only in deep windows and samples"
            );
            Some(t)
        }
        Err(e) => {
            println!(
                "trap cost on this host: NOT measured ({e:#}); probe cost will be reported unknown"
            );
            None
        }
    };
    let scanner = Scanner::new(&args.only_env, None)?;
    let mut agent = Agent::new(probes, scanner, HostClock::real(), Limits::default());
    if let Some(t) = trap {
        let defaults = Agent::default_sampler(t.entry_ns);
        agent.set_cost_model(Some(t), defaults);
    }
    let end = Instant::now() + Duration::from_secs_f64(args.watch.max(0.0));
    agent.scan()?;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        agent.scan()?;
        agent.poll();
    }
    agent.poll();

    let mut ranks: Vec<_> = agent.ranks().cloned().collect();
    ranks.sort_by_key(|r| r.identity.rank);
    println!("\nrank processes: {}", ranks.len());
    if ranks.is_empty() {
        println!(
            "  none: no process has RANK (torchrun), SLURM_PROCID (Slurm) or OMPI_COMM_WORLD_RANK (Open MPI) in its environment{}",
            if args.only_env.is_empty() { "" } else { " matching --only-env" }
        );
    }
    // The host-slow evidence; without it a host-slow rank on a two-rank
    // communicator is never named.
    if let Some(r) = ranks.first() {
        match SchedStat::read(r.identity.pid) {
            Ok(s) => println!(
                "  scheduler accounting: readable (pid {}: {} ms on a CPU, {} ms waiting for one)",
                r.identity.pid,
                s.oncpu_ns / 1_000_000,
                s.runq_ns / 1_000_000
            ),
            Err(e) => {
                println!("  scheduler accounting: NOT readable ({e}): no host-time split per rank")
            }
        }
    }
    for r in &ranks {
        let i = &r.identity;
        println!(
            "  pid {:>7}  rank {:>5}/{:<5} local {} node {}  restart {}  job {}",
            i.pid,
            i.rank,
            i.world_size,
            i.local_rank,
            if i.group_rank == u32::MAX {
                "?".to_owned()
            } else {
                i.group_rank.to_string()
            },
            i.restart_count,
            if i.job_id.is_empty() { "?" } else { &i.job_id }
        );
    }
    let libs: Vec<_> = agent.libs().cloned().collect();
    for r in &ranks {
        for kind in [LibKind::Nccl, LibKind::Cudart] {
            if !libs
                .iter()
                .any(|l| l.kind == kind && l.mapped_by.contains(&r.identity.pid))
            {
                println!(
                    "  {} not mapped in PID {} yet",
                    kind.soname_hint(),
                    r.identity.pid
                );
            }
        }
    }
    let counts = agent.cuda_counts().unwrap_or_default();
    println!("\nlibraries: {}", libs.len());
    for l in &libs {
        println!(
            "  {:?} {}  (mapped by {:?})",
            l.kind,
            l.path.display(),
            l.mapped_by
        );
        for s in &l.symbols {
            match &s.result {
                Ok(id) => {
                    let how = slowrank_agent::catalog::default_set(l.kind)
                        .iter()
                        .find(|p| p.symbol == s.symbol)
                        .map(|p| (p.how, p.role));
                    let hits = match how {
                        Some((Attach::Count { class }, _)) => format!(
                            "{} calls counted in-kernel (class total over processes)",
                            counts
                                .iter()
                                .map(|(_, c)| c[class as usize % cuda_count::SLOTS])
                                .sum::<u64>()
                        ),
                        Some((_, Role::Count)) | None | Some(_) => {
                            format!("{} hits", agent.hits(*id))
                        }
                    };
                    println!("    ok   {:<28} probe {:>3}  {}", s.symbol, id, hits);
                }
                Err(why) if s.windowed => println!("    win  {:<28} {}", s.symbol, why),
                Err(why) => println!("    --   {:<28} {}", s.symbol, why),
            }
        }
    }
    let c = agent.counters()?;
    println!(
        "\nkernel counters: ring-buffer drops {}, hits from unfollowed processes {}, counter map full {}, out-pointer reads failed {}",
        c.ringbuf_drops, c.unfollowed_hits, c.counts_full, c.out_read_failed
    );
    let d = agent.drops();
    println!("fold drops: {d:?}");
    if d.unknown_comm > 0 {
        println!(
            "  {} collectives ran on communicators created before the probes were attached: start the agent before the job (or give --lib), records need the ncclCommInitRank/ncclCommSplit of each communicator",
            d.unknown_comm
        );
    }
    Ok(())
}

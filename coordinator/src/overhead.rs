//! What slowrank's own probes cost the job, from the agents' self-reports.
//!
//! Each agent measures its host's trap cost at start and counts every probe
//! hit per rank in the kernel; every [`RankInterval`] carries the hits, their
//! estimated cost, the time the windowed launch counters were on, and
//! whether the agent's overhead budget narrowed its sampling. This module
//! sums them per rank and per host for the report ("slowrank's probes cost
//! this job ≈ X% of rank time") and `/metrics`. Plain data, no I/O.
//!
//! The verbs data path's traps (`post_send`, `poll_cq`, deep windows
//! only) are told apart: NCCL's proxy threads take them, not the threads
//! that run the step. On the healthy dp8 overhead job they were three
//! quarters of the self-reported cost (2.0 % of rank time with them, 0.6 %
//! without) while the step moved within its noise (+0.6 % against +0.4 %
//! with no deep window at all; BENCHMARKS.md, 2026-12-05 stop 57): they
//! cost CPU, and step time only where the proxies lack a core.

use std::collections::BTreeMap;

use slowrank_shared::wire::RankInterval;

#[derive(Debug, Default, Clone)]
struct RankCost {
    host: String,
    hits: u64,
    /// Probe cost off the data path: on the threads that run the step.
    cost_ns: u64,
    /// The verbs data path's (NCCL's proxy threads).
    datapath_ns: u64,
    wall_ns: u64,
    counted_ns: u64,
    /// The agent's CPU time apportioned to this rank.
    agent_cpu_ns: u64,
    /// Intervals whose agent had no trap cost (cost unknown).
    unmeasured: u64,
}

#[derive(Debug, Default, Clone)]
struct HostCost {
    trap_pair_ns: u32,
    launch_duty_ppm: u32,
    narrowed_now: bool,
    narrowed_intervals: u64,
    intervals: u64,
}

/// Running sums over every interval accepted.
#[derive(Debug, Default)]
pub struct OverheadTally {
    ranks: BTreeMap<u32, RankCost>,
    hosts: BTreeMap<String, HostCost>,
}

/// One rank's line in the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankOverhead {
    pub rank: u32,
    pub host: String,
    /// Estimated share of the rank's wall time spent in slowrank's probe
    /// traps on the threads that run its step (every probe but the verbs
    /// data path's), in percent; null when its agent could not measure a
    /// trap cost.
    pub percent: Option<f64>,
    /// The verbs data path's traps (deep windows), on NCCL's proxy
    /// threads, in percent of the rank's wall time; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath_percent: Option<f64>,
    pub hits_per_s: f64,
    pub observed_seconds: f64,
    /// Share of the time the launch/memcpy/malloc counters were attached
    /// (deep windows and samples), in percent.
    pub launch_counted_percent: f64,
    /// Its agent's own CPU time apportioned to it, percent of its wall
    /// time: rank time the agent may take where they share cores. Absent
    /// from agents before wire schema 7, which did not measure it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_cpu_percent: Option<f64>,
}

/// One agent host's line in the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostOverhead {
    pub host: String,
    /// Measured cost of one uprobe + uretprobe pair on that host (µs);
    /// null when the agent could not measure it.
    pub trap_pair_us: Option<f64>,
    /// Share of time the agent's budget lets launch samples run (percent).
    pub launch_sample_percent: f64,
    /// The budget (`--max-overhead`) narrows launch counting now.
    pub budget_narrowed: bool,
    /// Intervals in which it did.
    pub narrowed_intervals: u64,
}

/// `report.json`'s `overhead` section.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OverheadReport {
    /// The sentence for humans.
    pub summary: String,
    /// Time-weighted over ranks, percent of rank time; null when no agent
    /// measured its trap cost.
    pub job_percent: Option<f64>,
    pub max_rank_percent: Option<f64>,
    /// The verbs data path's traps, time-weighted over ranks, percent of
    /// rank time ([`RankOverhead::datapath_percent`]); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath_percent: Option<f64>,
    /// The agents' own CPU, time-weighted over ranks, percent of rank
    /// time ([`RankOverhead::agent_cpu_percent`]); null from agents
    /// before wire schema 7, which did not measure it (absent then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_cpu_percent: Option<f64>,
    pub ranks: Vec<RankOverhead>,
    pub hosts: Vec<HostOverhead>,
}

impl OverheadTally {
    pub fn add(&mut self, host: &str, i: &RankInterval) {
        let wall = i.end_ns.saturating_sub(i.start_ns);
        let r = self.ranks.entry(i.rank).or_default();
        if r.host != host {
            r.host = host.to_owned();
        }
        r.hits = r.hits.saturating_add(i.probe_hits);
        // An agent cannot have cost a rank more than the interval's time.
        let all = i.probe_cost_ns.min(wall);
        let datapath = i.datapath_cost_ns.min(all);
        r.cost_ns = r.cost_ns.saturating_add(all - datapath);
        r.datapath_ns = r.datapath_ns.saturating_add(datapath);
        r.wall_ns = r.wall_ns.saturating_add(wall);
        r.counted_ns = r.counted_ns.saturating_add(i.launch_counted_ns.min(wall));
        // No more than the interval's time either (the agent's CPU is
        // shared among its ranks).
        r.agent_cpu_ns = r.agent_cpu_ns.saturating_add(i.agent_cpu_ns.min(wall));
        if i.trap_pair_ns == 0 {
            r.unmeasured += 1;
        }
        let h = self.hosts.entry(host.to_owned()).or_default();
        if i.trap_pair_ns != 0 {
            h.trap_pair_ns = i.trap_pair_ns;
        }
        h.launch_duty_ppm = i.launch_duty_ppm;
        h.narrowed_now = i.budget_narrowed;
        h.intervals += 1;
        h.narrowed_intervals += u64::from(i.budget_narrowed);
    }

    fn percent(r: &RankCost) -> Option<f64> {
        (r.wall_ns > 0 && r.unmeasured == 0).then(|| 100.0 * r.cost_ns as f64 / r.wall_ns as f64)
    }

    /// Per-rank percent of rank time (measured ranks only), for `/metrics`.
    pub fn rank_percents(&self) -> Vec<(u32, f64)> {
        self.ranks
            .iter()
            .filter_map(|(k, r)| Self::percent(r).map(|p| (*k, p)))
            .collect()
    }

    /// Time-weighted job figure (percent), over ranks with a measured cost.
    pub fn job_percent(&self) -> Option<f64> {
        let (cost, wall) = self
            .ranks
            .values()
            .filter(|r| Self::percent(r).is_some())
            .fold((0u64, 0u64), |(c, w), r| {
                (c.saturating_add(r.cost_ns), w.saturating_add(r.wall_ns))
            });
        (wall > 0).then(|| 100.0 * cost as f64 / wall as f64)
    }

    /// The verbs data path's traps as a time-weighted share of rank time
    /// (percent), over ranks with a measured cost; None when none.
    pub fn datapath_percent(&self) -> Option<f64> {
        let (dp, wall) = self
            .ranks
            .values()
            .filter(|r| Self::percent(r).is_some())
            .fold((0u64, 0u64), |(c, w), r| {
                (c.saturating_add(r.datapath_ns), w.saturating_add(r.wall_ns))
            });
        (wall > 0 && dp > 0).then(|| 100.0 * dp as f64 / wall as f64)
    }

    /// The agents' CPU as a time-weighted share of rank time (percent);
    /// None when no agent reported any (agents before wire schema 7).
    pub fn agent_cpu_percent(&self) -> Option<f64> {
        let (cpu, wall) = self.ranks.values().fold((0u64, 0u64), |(c, w), r| {
            (
                c.saturating_add(r.agent_cpu_ns),
                w.saturating_add(r.wall_ns),
            )
        });
        (wall > 0 && cpu > 0).then(|| 100.0 * cpu as f64 / wall as f64)
    }

    pub fn report(&self) -> Option<OverheadReport> {
        if self.ranks.is_empty() {
            return None;
        }
        let ranks: Vec<RankOverhead> = self
            .ranks
            .iter()
            .map(|(k, r)| {
                let secs = r.wall_ns as f64 / 1e9;
                RankOverhead {
                    rank: *k,
                    host: r.host.clone(),
                    percent: Self::percent(r),
                    datapath_percent: (Self::percent(r).is_some() && r.datapath_ns > 0)
                        .then(|| 100.0 * r.datapath_ns as f64 / r.wall_ns as f64),
                    hits_per_s: if secs > 0.0 {
                        r.hits as f64 / secs
                    } else {
                        0.0
                    },
                    observed_seconds: secs,
                    launch_counted_percent: if r.wall_ns > 0 {
                        100.0 * r.counted_ns as f64 / r.wall_ns as f64
                    } else {
                        0.0
                    },
                    agent_cpu_percent: (r.wall_ns > 0 && r.agent_cpu_ns > 0)
                        .then(|| 100.0 * r.agent_cpu_ns as f64 / r.wall_ns as f64),
                }
            })
            .collect();
        let hosts: Vec<HostOverhead> = self
            .hosts
            .iter()
            .map(|(h, c)| HostOverhead {
                host: h.clone(),
                trap_pair_us: (c.trap_pair_ns > 0).then(|| f64::from(c.trap_pair_ns) / 1e3),
                launch_sample_percent: f64::from(c.launch_duty_ppm) / 1e4,
                budget_narrowed: c.narrowed_now,
                narrowed_intervals: c.narrowed_intervals,
            })
            .collect();
        let job = self.job_percent();
        let worst = ranks
            .iter()
            .filter_map(|r| r.percent.map(|p| (r.rank, p)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let mut summary = match (job, worst) {
            (Some(j), Some((rank, p))) => format!(
                "slowrank's probes cost this job ≈ {j:.2}% of rank time (most: rank {rank} at {p:.2}%)"
            ),
            _ => "slowrank's probe cost is unknown: no agent measured its trap cost".to_owned(),
        };
        let datapath = self.datapath_percent();
        if let Some(d) = datapath {
            summary.push_str(&format!(
                "; the deep windows' verbs probes ≈ {d:.2}% more on NCCL's proxy threads (CPU; step time only where they lack a core)"
            ));
        }
        let agent_cpu = self.agent_cpu_percent();
        if let Some(a) = agent_cpu {
            summary.push_str(&format!(
                "; its agents' own CPU ≈ {a:.2}% of rank time more where they share the ranks' cores"
            ));
        }
        let narrowed: Vec<&str> = hosts
            .iter()
            .filter(|h| h.narrowed_intervals > 0)
            .map(|h| h.host.as_str())
            .collect();
        if !narrowed.is_empty() {
            summary.push_str(&format!(
                "; the overhead budget narrowed launch counting (samples, deep windows) on {}",
                narrowed.join(", ")
            ));
        }
        Some(OverheadReport {
            summary,
            job_percent: job,
            max_rank_percent: worst.map(|w| w.1),
            datapath_percent: datapath,
            agent_cpu_percent: agent_cpu,
            ranks,
            hosts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(rank: u32, start: u64, end: u64, cost: u64, narrowed: bool) -> RankInterval {
        RankInterval {
            rank,
            start_ns: start,
            end_ns: end,
            probe_hits: cost / 1000,
            probe_cost_ns: cost,
            trap_pair_ns: 2000,
            launch_counted_ns: (end - start) / 10,
            launch_duty_ppm: 66_666,
            budget_narrowed: narrowed,
            ..Default::default()
        }
    }

    #[test]
    fn job_figure_is_time_weighted_over_ranks() {
        let mut t = OverheadTally::default();
        // Rank 0: 1 ms of 1 s (0.1%); rank 1: 6 ms of 2 s (0.3%).
        t.add("a", &iv(0, 0, 1_000_000_000, 1_000_000, false));
        t.add("b", &iv(1, 0, 1_000_000_000, 3_000_000, false));
        t.add("b", &iv(1, 1_000_000_000, 2_000_000_000, 3_000_000, true));
        let r = t.report().expect("report");
        assert!((r.job_percent.unwrap() - 7.0 / 3e3 * 100.0).abs() < 1e-9);
        assert_eq!(r.max_rank_percent, Some(0.3));
        assert_eq!(r.ranks[1].hits_per_s, 3000.0);
        assert!((r.ranks[0].launch_counted_percent - 10.0).abs() < 1e-9);
        assert_eq!(r.hosts[0].trap_pair_us, Some(2.0));
        assert!(r.hosts[1].budget_narrowed);
        assert!(r.summary.contains("≈ 0.23% of rank time"), "{}", r.summary);
        assert!(
            r.summary.contains("narrowed launch counting"),
            "{}",
            r.summary
        );
        assert_eq!(t.rank_percents(), vec![(0, 0.1), (1, 0.3)]);
        // Agents before wire schema 7 said nothing of their own CPU.
        assert_eq!(r.agent_cpu_percent, None);
        assert!(!r.summary.contains("own CPU"), "{}", r.summary);
    }

    #[test]
    fn the_verbs_data_path_is_told_apart_from_the_steps_threads() {
        let mut t = OverheadTally::default();
        // 12 ms of traps in a second, 8 of them on the proxy's data path.
        let mut a = iv(0, 0, 1_000_000_000, 12_000_000, false);
        a.datapath_cost_ns = 8_000_000;
        t.add("a", &a);
        // Another rank with no deep window: 2 ms.
        t.add("a", &iv(1, 0, 1_000_000_000, 2_000_000, false));
        // A hostile data-path figure is capped at the probe cost.
        let mut c = iv(2, 0, 1_000_000_000, 1_000_000, false);
        c.datapath_cost_ns = u64::MAX;
        t.add("b", &c);
        let r = t.report().expect("report");
        assert_eq!(r.ranks[0].percent, Some(0.4));
        assert_eq!(r.ranks[0].datapath_percent, Some(0.8));
        assert_eq!(r.ranks[1].datapath_percent, None);
        assert_eq!(r.ranks[2].percent, Some(0.0));
        assert!((r.job_percent.unwrap() - 0.2).abs() < 1e-9, "{r:?}");
        assert!((r.datapath_percent.unwrap() - 0.3).abs() < 1e-9, "{r:?}");
        assert!(
            r.summary.contains("≈ 0.20% of rank time")
                && r.summary
                    .contains("verbs probes ≈ 0.30% more on NCCL's proxy threads"),
            "{}",
            r.summary
        );
    }

    #[test]
    fn the_agents_own_cpu_is_told_beside_the_traps() {
        let mut t = OverheadTally::default();
        // 20 ms of agent CPU in a rank's second (2%), 10 ms in the other's.
        let mut a = iv(0, 0, 1_000_000_000, 1_000_000, false);
        a.agent_cpu_ns = 20_000_000;
        let mut b = iv(1, 0, 1_000_000_000, 1_000_000, false);
        b.agent_cpu_ns = 10_000_000;
        t.add("a", &a);
        t.add("a", &b);
        // A hostile figure is capped at the interval's time.
        let mut c = iv(2, 0, 1_000, 0, false);
        c.agent_cpu_ns = u64::MAX;
        t.add("b", &c);
        let r = t.report().expect("report");
        assert!((r.ranks[0].agent_cpu_percent.unwrap() - 2.0).abs() < 1e-9);
        let job = r.agent_cpu_percent.expect("measured");
        let want = 100.0 * (30_000_000.0 + 1_000.0) / (2e9 + 1_000.0);
        assert!((job - want).abs() < 1e-9, "{job} vs {want}");
        assert!(
            r.summary
                .contains("agents' own CPU ≈ 1.50% of rank time more"),
            "{}",
            r.summary
        );
    }

    #[test]
    fn a_hostile_cost_is_capped_and_unmeasured_agents_say_so() {
        let mut t = OverheadTally::default();
        t.add("a", &iv(0, 0, 1000, u64::MAX, false));
        assert_eq!(t.job_percent(), Some(100.0));
        let mut t = OverheadTally::default();
        t.add(
            "a",
            &RankInterval {
                rank: 3,
                end_ns: 1000,
                probe_hits: 10,
                ..Default::default()
            },
        );
        let r = t.report().expect("report");
        assert_eq!(r.job_percent, None);
        assert!(r.summary.contains("unknown"), "{}", r.summary);
        assert!(t.rank_percents().is_empty());
    }
}

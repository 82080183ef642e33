//! **Stage: classify.** In: joined instances, iterations, per-rank counters.
//! Out: per-iteration observations of each subject (suspicious or not, of
//! which class, with evidence). [`stats`] measures lateness and waits;
//! [`intervals`] reads host counters; [`links`] judges queue pairs and NICs;
//! [`hostwide`] folds a late host into one finding; [`sequential`] tests each
//! rank's cost over iterations; [`pace`] watches the job's step; this
//! module says why, and defines the observations the later stages share.
//!
//! Why a rank is slow: compute, host or communication (and hang).
//!
//! * **compute** — the host enqueued on time but the GPU reached the
//!   collective late (GPU-side lateness without host-side lateness), or, with
//!   host times only, the host entered late *because* it had been blocked in a
//!   sync waiting for its own GPU (sync waits longer than its peers').
//! * **host** — the host itself reached the collective late (host-side
//!   lateness about as large as the GPU-side one) while its GPU had drained:
//!   short sync waits; run-queue delay or off-CPU time corroborate.
//! * **communication** — arrivals on time, but the rank's queue pairs (or
//!   one pair: a link) complete slowly compared to the rest of the fabric.

pub mod align;
pub mod hostwide;
pub mod intervals;
pub mod links;
pub mod pace;
pub mod sequential;
pub mod stats;
pub mod stretches;

use crate::classify::intervals::CpuEvidence;
use crate::classify::links::{SlowLink, SlowNic};
use crate::classify::stats::RankScore;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Compute,
    Communication,
    Host,
    Hang,
    /// Not a slow rank: a pipeline stage slower on every replica, or work
    /// imbalance that moves between ranks ([`crate::graph::structure`]).
    Structural,
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Compute => "compute",
            Kind::Communication => "communication",
            Kind::Host => "host",
            Kind::Hang => "hang",
            Kind::Structural => "structural",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Classification {
    pub kind: Kind,
    pub confidence: f64,
    pub evidence: Vec<String>,
    /// The class rests on GPU-side arrivals (the deep set), which a
    /// descheduled host thread does not move: the lifecycle may open sooner.
    pub gpu_side: bool,
}

/// Human duration: "3.21 ms", "412 µs", "1.20 s".
pub fn fmt_ns(ns: f64) -> String {
    let a = ns.abs();
    if a >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// The means over a suspect's window of suspicious iterations.
struct WindowMeans {
    late: f64,
    unexplained: f64,
    /// At least half the window had GPU-side times.
    gpu_known: bool,
    sync_excess: f64,
    step: f64,
    last_frac: f64,
    pos: f64,
    inflicted: f64,
    blame_excess: f64,
    /// The largest clock error bound over the window.
    err: f64,
    peers: usize,
    first: u64,
    last: u64,
}

impl WindowMeans {
    fn of(window: &[RankScore]) -> Self {
        let n = window.len().max(1) as f64;
        Self {
            late: mean(window.iter().map(|s| s.late_ns)),
            unexplained: mean(window.iter().map(|s| s.unexplained_ns)),
            gpu_known: window.iter().filter(|s| s.gpu_late_ns.is_some()).count() as f64 >= n / 2.0,
            sync_excess: mean(window.iter().map(|s| s.sync_excess_ns)),
            step: mean(window.iter().map(|s| s.step_ns)),
            last_frac: mean(window.iter().map(|s| s.last_frac)),
            pos: mean(window.iter().map(|s| s.mean_pos)),
            inflicted: mean(window.iter().map(|s| s.inflicted_ns)),
            blame_excess: mean(window.iter().map(|s| s.blame_excess_ns)),
            err: window.iter().map(|s| s.err_ns).fold(0.0, f64::max),
            peers: window.last().map_or(0, |s| s.peers),
            first: window.first().map_or(0, |s| s.iteration),
            last: window.last().map_or(0, |s| s.iteration),
        }
    }
}

/// Classifies a straggler from its suspicious iterations (`window`, not empty)
/// and corroborating evidence. `persistence` is the Spearman ρ of lateness
/// order across consecutive instances on its reference communicator.
pub fn classify_straggler(
    window: &[RankScore],
    cpu: Option<&CpuEvidence>,
    persistence: Option<f64>,
    min_step_fraction: f64,
) -> Classification {
    let m = WindowMeans::of(window);
    let mut ev = lateness_lines(&m, persistence);
    let (kind, clarity, gpu_side) = decide_kind(&m, window, cpu, &mut ev);
    if kind == Kind::Host {
        if let Some(c) = cpu {
            host_cpu_lines(c, &mut ev);
        }
    } else if m.sync_excess > 0.0 {
        ev.push(format!(
            "its host waits {} per iteration longer than peers in GPU syncs",
            fmt_ns(m.sync_excess)
        ));
    }
    ev.push(format!("clock error bound {} at decision", fmt_ns(m.err)));
    let own = m.unexplained.max(m.blame_excess / 2.0);
    let strength = ((own / m.step.max(1.0)) / (4.0 * min_step_fraction)).clamp(0.0, 1.0);
    let order = m.last_frac.clamp(0.0, 1.0).max(m.pos.clamp(0.0, 1.0));
    let mut confidence = 0.35 + 0.25 * strength + 0.2 * order + 0.2 * clarity.clamp(0.0, 1.0);
    if !m.gpu_known {
        confidence = confidence.min(0.8);
    }
    Classification {
        kind,
        confidence: confidence.clamp(0.0, 0.99),
        evidence: ev,
        gpu_side,
    }
}

/// The evidence lines every straggler gets: how late, how often last,
/// what it cost the others, how persistent.
/// Spearman ρ of consecutive instances' arrival orders from which the
/// evidence says the order persists (below it, the order is mostly noise).
const PERSISTENT_ORDER: f64 = 0.5;

fn lateness_lines(m: &WindowMeans, persistence: Option<f64>) -> Vec<String> {
    let WindowMeans {
        late,
        unexplained,
        step,
        last_frac,
        pos,
        inflicted,
        blame_excess,
        peers,
        first,
        last,
        ..
    } = *m;
    let mut ev = vec![format!(
        "arrives {} late per iteration on its {}-rank reference communicator ({:.0}% of a {} step), iterations {first}–{last}",
        fmt_ns(unexplained),
        peers,
        100.0 * unexplained / step.max(1.0),
        fmt_ns(step)
    )];
    ev.push(format!(
        "last to arrive in {:.0}% of its reference collectives; mean arrival position {:.2} (0 first, 1 last)",
        100.0 * last_frac,
        pos
    ));
    if inflicted > 0.0 {
        ev.push(format!(
            "others waited {} per iteration in instances it arrived last",
            fmt_ns(inflicted)
        ));
    }
    if blame_excess > 0.05 * step {
        ev.push(format!(
            "the wait graph puts {} of GPU waiting per iteration on it beyond its peers (through tensor, pipeline and data-parallel waits)",
            fmt_ns(blame_excess)
        ));
    }
    if let Some(rho) = persistence {
        // ρ is the whole communicator's order from one instance to the
        // next: only a clear one says the same ranks stay behind.
        ev.push(if rho >= PERSISTENT_ORDER {
            format!(
                "lateness order persists across consecutive instances (Spearman ρ {rho:.2}): a persistent straggler, not jitter"
            )
        } else {
            format!(
                "the communicator's lateness order changes from one instance to the next (Spearman ρ {rho:.2}): this rank is late on average, not in every instance"
            )
        });
    }
    if late - unexplained > 0.05 * late.abs() {
        ev.push(format!(
            "{} of its lateness is explained by waiting on other communicators; the rest is its own",
            fmt_ns(late - unexplained)
        ));
    }

    ev
}

/// Compute or host, with how clearly (0–1) and whether GPU-side times
/// decided it; pushes the lines that say why.
///
/// Long on purpose: five rules tried in order, the first that holds
/// decides, each with its evidence lines beside it. Split apart, the order
/// that makes them correct (GPU-side before host-side, drained before CPU)
/// would be spread over functions that each look complete alone.
// Long: five ordered rules, each beside its evidence lines (see above).
fn decide_kind(
    m: &WindowMeans,
    window: &[RankScore],
    cpu: Option<&CpuEvidence>,
    ev: &mut Vec<String>,
) -> (Kind, f64, bool) {
    let (gpu_known, sync_excess) = (m.gpu_known, m.sync_excess);
    // Per-instance means: a late start of the step shows in every instance
    // of the iteration, a longer sync wait once per iteration.
    let host_mean = mean(
        window
            .iter()
            .map(|s| s.host_late_ns / s.ref_n.max(1) as f64),
    );
    let gpu_mean = mean(
        window
            .iter()
            .filter(|s| s.gpu_n > 0)
            .map(|s| s.gpu_late_ns.unwrap_or(0.0) / s.gpu_n as f64),
    );
    // A host-slow rank's GPU drains while its host is late, so it waits
    // *less* in GPU syncs than its peers by about its lateness. A compute-slow
    // rank's host may start late too (it waited for its own GPU at the end of
    // the previous step) but its sync waits do not shrink.
    let drained = if host_mean > 0.0 {
        (-sync_excess).max(0.0) / host_mean
    } else {
        0.0
    };
    // GPU-side lateness decides only where the GPU *was* late: a rank
    // early on both sides (host -471 µs, GPU -413 µs per collective, named
    // for its share of the blame beside a CPU hog) had been called "the
    // GPU reached the collectives late".
    let gpu_side = gpu_known && gpu_mean > 0.0 && host_mean < 0.5 * gpu_mean;
    // The scheduler's split over the same window: a host that is late
    // because it works, waits for a CPU or sleeps longer spends that much
    // more of its time outside GPU syncs. A slow GPU does the opposite (its
    // host waits longer in syncs).
    let cpu_host = cpu_corroborates_host(window, cpu);
    let (kind, clarity) = if gpu_side {
        ev.push(format!(
            "GPU-side lateness {} per collective vs host-side {}",
            fmt_ns(gpu_mean),
            fmt_ns(host_mean)
        ));
        ev.push("the host enqueued on time but the GPU reached the collectives late".into());
        (Kind::Compute, 1.0 - host_mean / gpu_mean.max(1.0))
    } else if gpu_known && host_mean > 0.0 && gpu_mean < 0.5 * host_mean {
        // A GPU with work queued reaches the collective on time or only a
        // little late when its host is late; a slow GPU makes both late by
        // about as much (the host waited for it at the step's sync).
        ev.push(format!(
            "host-side lateness {} per collective vs GPU-side {}: its GPU still had work queued",
            fmt_ns(host_mean),
            fmt_ns(gpu_mean)
        ));
        ev.push("the host reached the collectives late; its GPU was not the bottleneck".into());
        (Kind::Host, 1.0 - gpu_mean.max(0.0) / host_mean)
    } else if host_mean > 0.0 && drained >= 0.5 && (!gpu_known || gpu_mean <= 1.2 * host_mean) {
        // (A GPU clearly later than its host was not drained: it was slow.)
        ev.push(format!(
            "host-side lateness {} per collective{}; its GPU had drained: sync waits {} shorter than its peers'",
            fmt_ns(host_mean),
            if gpu_known { format!(" (GPU-side {})", fmt_ns(gpu_mean)) } else { String::new() },
            fmt_ns(-sync_excess)
        ));
        ev.push("the host reached the collectives late; its GPU was not the bottleneck".into());
        (
            Kind::Host,
            drained.min(1.0) * if gpu_known { 1.0 } else { 0.8 },
        )
    } else if cpu_host && !gpu_known {
        ev.push(format!(
            "host-side lateness {} per collective; its sync waits did not shrink ({} vs peers) but its host spent {:.1}% more of its time outside GPU syncs than its peers'",
            fmt_ns(host_mean),
            fmt_ns(sync_excess),
            100.0 * cpu.map_or(0.0, CpuEvidence::host_excess)
        ));
        ev.push("the host reached the collectives late; its GPU was not the bottleneck".into());
        (Kind::Host, 0.6)
    } else {
        ev.push(format!(
            "host-side lateness {} per collective{} but its sync waits did not shrink ({} vs peers): its GPU is the bottleneck",
            fmt_ns(host_mean),
            if gpu_known { format!(", GPU-side {}", fmt_ns(gpu_mean)) } else { String::new() },
            fmt_ns(sync_excess)
        ));
        ev.push(
            "the host starts each step late only because it waited for its own slow GPU".into(),
        );
        (
            Kind::Compute,
            (1.0 - drained).clamp(0.0, 1.0) * if gpu_known { 0.9 } else { 0.7 },
        )
    };
    (kind, clarity, gpu_side)
}

/// A host-slow rank's scheduler and launch evidence against its peers'.
fn host_cpu_lines(c: &CpuEvidence, ev: &mut Vec<String>) {
    if c.measured && c.oncpu_frac > c.oncpu_frac_peers + 0.01 {
        ev.push(format!(
            "on a CPU {:.1}% of wall time vs {:.1}% on peers: more host work",
            100.0 * c.oncpu_frac,
            100.0 * c.oncpu_frac_peers
        ));
    }
    if c.runq_frac > c.runq_frac_peers + 0.01 {
        ev.push(format!(
            "run-queue delay {:.1}% of wall time vs {:.1}% on peers: CPU contention",
            100.0 * c.runq_frac,
            100.0 * c.runq_frac_peers
        ));
    }
    if c.offcpu_frac > c.offcpu_frac_peers + 0.01 {
        ev.push(format!(
            "off-CPU (outside GPU syncs) {:.1}% of wall time vs {:.1}% on peers",
            100.0 * c.offcpu_frac,
            100.0 * c.offcpu_frac_peers
        ));
    }
    if !c.launches_measured {
        ev.push("launch rate not measured in this window (launches are counted only in deep windows and samples)".to_owned());
    } else if c.launches_per_s_peers > 0.0 && c.launches_per_s < 0.9 * c.launches_per_s_peers {
        ev.push(format!(
            "launch rate {:.0}/s vs {:.0}/s on peers",
            c.launches_per_s, c.launches_per_s_peers
        ));
    }
}

/// Whether the scheduler's split of the rank's time (over the intervals
/// covering `window`) shows the extra host time its lateness claims: at
/// least half its lateness share of the step, and 2% of wall time, more
/// outside GPU syncs than its peers. Run-queue delay counts half: on an
/// oversubscribed host it moves from rank to rank between intervals, while
/// work and sleep are the rank's own.
pub fn cpu_corroborates_host(window: &[RankScore], cpu: Option<&CpuEvidence>) -> bool {
    let Some(c) = cpu.filter(|c| c.measured) else {
        return false;
    };
    let unexplained = mean(window.iter().map(|s| s.unexplained_ns));
    let step = mean(window.iter().map(|s| s.step_ns)).max(1.0);
    let excess = c.host_excess() - 0.5 * (c.runq_frac - c.runq_frac_peers);
    excess >= (0.5 * unexplained / step).max(0.02)
}

/// Whether a class stands without a majority. On a two-rank reference
/// communicator one rank is always last, and a host that ran behind by
/// chance for a few steps looks like a straggler; only direct evidence of
/// the class names it: GPU-side lateness, or a host that waited longer for
/// its GPU (compute), or the scheduler's split (host).
pub fn stands_alone(c: &Classification, window: &[RankScore], cpu: Option<&CpuEvidence>) -> bool {
    match c.kind {
        Kind::Host => cpu_corroborates_host(window, cpu),
        Kind::Compute => {
            let host_mean = mean(
                window
                    .iter()
                    .map(|s| s.host_late_ns / s.ref_n.max(1) as f64),
            );
            let sync_excess = mean(window.iter().map(|s| s.sync_excess_ns));
            c.gpu_side || (host_mean > 0.0 && sync_excess >= 0.5 * host_mean)
        }
        Kind::Communication | Kind::Hang | Kind::Structural => true,
    }
}

pub fn classify_nic(n: &SlowNic, transfer_ratio: Option<f64>) -> Classification {
    let mut ev = vec![
        format!(
            "{} of its {} verbs peers complete slowly: post→completion {} vs {} median of links moving the same chunk size at the same moments ({:.1}×, typical of its last intervals)",
            n.slow_peers.len(),
            n.peers,
            fmt_ns(n.latency_ns),
            fmt_ns(n.baseline_ns),
            n.ratio
        ),
        format!("slow peers: {:?}", n.slow_peers),
        "its arrivals are on time: the time goes into transfers".into(),
    ];
    if let Some(r) = transfer_ratio {
        ev.push(format!(
            "collectives it takes part in transfer {r:.2}× longer than others"
        ));
    }
    let share = n.slow_peers.len() as f64 / n.peers.max(1) as f64;
    Classification {
        kind: Kind::Communication,
        confidence: (0.5 + 0.25 * share + 0.2 * ((n.ratio - 1.0) / 2.0).clamp(0.0, 1.0)).min(0.97),
        evidence: ev,
        // Completions are seen by polls, which a busy host delays.
        gpu_side: false,
    }
}

pub fn classify_link(l: &SlowLink) -> Classification {
    Classification {
        kind: Kind::Communication,
        confidence: (0.55 + 0.3 * ((l.ratio - 1.0) / 2.0).clamp(0.0, 1.0)).min(0.95),
        evidence: vec![
            format!(
                "link between ranks {} and {}: post→completion {} vs {} median of links moving the same chunk size at the same moments ({:.1}×, typical of its last intervals)",
                l.a,
                l.b,
                fmt_ns(l.latency_ns),
                fmt_ns(l.baseline_ns),
                l.ratio
            ),
            "both ends' other links are healthy: the pair (cable, port or path) is slow, not either NIC".into(),
        ],
        gpu_side: false,
    }
}

// What this stage says of each subject every sealed iteration: the
// observations the verdict stage opens and closes verdicts on.

#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum Subject {
    /// A rank arriving late (compute or host).
    Rank(u32),
    /// Placeholder for verdicts read back from `report.json` (not serialized).
    #[default]
    Unknown,
    /// A rank whose links are slow (its NIC).
    Nic(u32),
    /// A pair of ranks whose link is slow (lower rank first).
    Link(u32, u32),
    /// Every rank of one host (named by its lowest rank; see `hostwide`).
    Host(u32),
    /// A pipeline stage slower on every replica ([`crate::graph::structure`]).
    Stage(u32),
    /// Work imbalance that moves between ranks ([`crate::graph::structure`]).
    Imbalance,
}

/// What one sealed iteration says about a subject.
#[derive(Debug, Clone)]
pub struct Observation {
    pub classification: Classification,
    pub rank: u32,
    pub host: String,
    pub link: Option<[u32; 2]>,
    /// Every rank of a host-wide finding (empty otherwise).
    pub ranks: Vec<u32>,
    pub clock_error_ns: f64,
    /// Its own lateness in the iteration (ns; 0 for links and NICs).
    pub late_ns: f64,
    /// GPU time lost to this subject in the iteration (ns).
    pub lost_ns: f64,
    /// GPU time the whole job had in the iteration (ns): world × step.
    pub exposure_ns: f64,
    /// How much shorter the iteration would have been without this
    /// subject's excess (the what-if, ns); `None` when it could not be
    /// measured (no peer of the same role, no arrivals that show it).
    pub saved_ns: Option<f64>,
    /// The iteration's duration (ns).
    pub step_ns: f64,
    /// The saving once a bigger straggler is fixed: (that rank, ns).
    pub once_fixed: Option<(u32, f64)>,
    /// The per-rank sequential test is in alarm ([`crate::classify::sequential`]):
    /// opens without waiting for the window's majority.
    pub alarm: bool,
    /// Named only because an open verdict's sequential evidence still
    /// stands, not by its own lateness this iteration.
    pub held: bool,
    /// A structural finding's cause (then `rank` is its first rank).
    pub structural: Option<Structural>,
    pub at: crate::clock::CoordNs,
    pub wall: Option<chrono::DateTime<chrono::Utc>>,
}

#[cfg(test)]
impl Observation {
    /// A plain observation for tests: `kind` on `rank` of host `h`, every
    /// figure 0; tests set what they check with `..Observation::of(..)`.
    pub fn of(kind: Kind, rank: u32) -> Self {
        Observation {
            classification: Classification {
                kind,
                confidence: 0.9,
                evidence: Vec::new(),
                gpu_side: false,
            },
            rank,
            host: "h".into(),
            link: None,
            ranks: Vec::new(),
            clock_error_ns: 0.0,
            late_ns: 0.0,
            lost_ns: 0.0,
            exposure_ns: 0.0,
            saved_ns: None,
            step_ns: 0.0,
            once_fixed: None,
            alarm: false,
            held: false,
            structural: None,
            at: 0,
            wall: None,
        }
    }
}

/// What a structural verdict is (`structural` in `report.json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Structural {
    /// `stage_imbalance` | `work_imbalance`.
    pub cause: String,
    /// The slower stage (stage imbalance only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<u32>,
}

/// Below this share of the step a verdict "costs the job nothing now":
/// the what-if's own error on a replayed iteration (clock bounds, the
/// peers' median wobbling) is of this order.
pub const OFF_CRITICAL_PATH: f64 = 0.005;

#[cfg(test)]
mod tests {
    use super::*;

    fn score(host_late: f64, gpu_late: Option<f64>, sync_excess: f64) -> RankScore {
        RankScore {
            rank: 5,
            iteration: 10,
            ref_n: 4,
            late_ns: 4e6,
            host_late_ns: host_late,
            gpu_late_ns: gpu_late,
            gpu_n: if gpu_late.is_some() { 4 } else { 0 },
            excess_wait_ns: 0.0,
            unexplained_ns: 4e6,
            sync_excess_ns: sync_excess,
            last_frac: 1.0,
            mean_pos: 1.0,
            inflicted_ns: 2e7,
            blame_ns: 2e7,
            blame_excess_ns: 1.8e7,
            blame_z: 9.0,
            err_ns: 30e3,
            step_ns: 30e6,
            peers: 8,
            suspicious: true,
            first_t: None,
        }
    }

    #[test]
    fn gpu_late_host_on_time_is_compute() {
        let c = classify_straggler(&[score(1e4, Some(4e6), 0.0)], None, Some(0.9), 0.04);
        assert_eq!(c.kind, Kind::Compute);
        assert!(c.confidence > 0.8, "{c:?}");
    }

    #[test]
    fn early_on_both_sides_is_not_a_late_gpu() {
        let c = classify_straggler(&[score(-1.9e6, Some(-1.65e6), 0.0)], None, None, 0.04);
        assert!(!c.gpu_side, "{c:?}");
        assert!(
            !c.evidence
                .iter()
                .any(|e| e.contains("GPU reached the collectives late")),
            "{c:?}"
        );
    }

    #[test]
    fn persistence_is_claimed_only_on_a_persistent_order() {
        let says = |rho: f64| {
            classify_straggler(&[score(1e4, Some(4e6), 0.0)], None, Some(rho), 0.04)
                .evidence
                .iter()
                .any(|e| e.contains("a persistent straggler"))
        };
        assert!(says(0.9));
        // A healthy job's rank late on average under CPU contention had
        // ρ -0.02 and was said to be "a persistent straggler".
        assert!(!says(-0.02));
        assert!(!says(0.22));
    }

    #[test]
    fn both_late_is_host() {
        let c = classify_straggler(&[score(4e6, Some(4e6), -1e6)], None, None, 0.04);
        assert_eq!(c.kind, Kind::Host);
    }

    #[test]
    fn host_much_later_than_its_gpu_is_host_even_with_full_syncs() {
        // Contention: the host is 4x later than its GPU, whose queue hid
        // most of it; its sync waits did not shrink by half its lateness.
        let c = classify_straggler(&[score(4e6, Some(1e6), -0.4e6)], None, None, 0.04);
        assert_eq!(c.kind, Kind::Host, "{c:?}");
        assert!(!c.gpu_side);
        assert!(c
            .evidence
            .iter()
            .any(|e| e.contains("GPU still had work queued")));
    }

    #[test]
    fn shorter_syncs_with_a_gpu_later_than_its_host_is_compute() {
        // Sync waits shrank, but the GPU reached the collectives later than
        // the host did: a drained GPU cannot be later than its host.
        let c = classify_straggler(&[score(4e6, Some(6e6), -4e6)], None, None, 0.04);
        assert_eq!(c.kind, Kind::Compute, "{c:?}");
    }

    #[test]
    fn host_only_long_sync_is_compute_short_sync_is_host() {
        assert_eq!(
            classify_straggler(&[score(4e6, None, 3e6)], None, None, 0.04).kind,
            Kind::Compute
        );
        assert_eq!(
            classify_straggler(&[score(4e6, None, 0.0)], None, None, 0.04).kind,
            Kind::Compute
        );
        let h = classify_straggler(&[score(4e6, None, -2e6)], None, None, 0.04);
        assert_eq!(h.kind, Kind::Host);
        assert!(h.confidence <= 0.8);
    }

    fn cpu(on: f64, runq: f64, off: f64, peers: (f64, f64, f64)) -> CpuEvidence {
        CpuEvidence {
            measured: true,
            oncpu_frac: on,
            oncpu_frac_peers: peers.0,
            runq_frac: runq,
            runq_frac_peers: peers.1,
            offcpu_frac: off,
            offcpu_frac_peers: peers.2,
            launches_per_s: 1000.0,
            launches_per_s_peers: 1000.0,
            launches_measured: true,
        }
    }

    #[test]
    fn a_host_on_two_ranks_needs_the_scheduler_to_show_its_extra_time() {
        // 4 ms late per 30 ms step (13%): half of that must show.
        let w = [score(4e6, None, -3e6)];
        let c = classify_straggler(&w, None, None, 0.04);
        assert_eq!(c.kind, Kind::Host);
        let peers = (0.06, 0.2, 0.24);
        // Asleep outside syncs 15% more of the time: a slow data loader.
        assert!(stands_alone(&c, &w, Some(&cpu(0.06, 0.2, 0.39, peers))));
        // 10% more run-queue delay counts half: not enough alone.
        assert!(!stands_alone(&c, &w, Some(&cpu(0.06, 0.3, 0.24, peers))));
        // The same as its peer: it ran behind by chance.
        assert!(!stands_alone(&c, &w, Some(&cpu(0.06, 0.2, 0.24, peers))));
        // Not measured: no evidence.
        let mut unmeasured = cpu(0.0, 0.0, 0.0, (0.0, 0.0, 0.0));
        unmeasured.measured = false;
        assert!(!stands_alone(&c, &w, Some(&unmeasured)));
        assert!(!stands_alone(&c, &w, None));
    }

    #[test]
    fn compute_on_two_ranks_needs_longer_syncs_or_gpu_times() {
        // Host-side lateness 1 ms per collective; sync waits not shorter.
        let flat = [score(4e6, None, 0.0)];
        let c = classify_straggler(&flat, None, None, 0.04);
        assert_eq!(c.kind, Kind::Compute);
        assert!(!stands_alone(&c, &flat, None));
        let waited = [score(4e6, None, 1e6)];
        let c = classify_straggler(&waited, None, None, 0.04);
        assert_eq!(c.kind, Kind::Compute);
        assert!(stands_alone(&c, &waited, None));
        let gpu = [score(1e4, Some(4e6), 0.0)];
        let c = classify_straggler(&gpu, None, None, 0.04);
        assert!(c.gpu_side && stands_alone(&c, &gpu, None));
    }

    #[test]
    fn extra_host_time_makes_a_flat_sync_host_not_compute() {
        let w = [score(4e6, None, 0.0)];
        let c = classify_straggler(
            &w,
            Some(&cpu(0.3, 0.2, 0.24, (0.06, 0.2, 0.24))),
            None,
            0.04,
        );
        assert_eq!(c.kind, Kind::Host, "{c:?}");
    }
}

//! What `/metrics` says: every family the coordinator exports, its name,
//! type and help, in one place (`docs/operations.md` lists them and
//! `deploy/grafana/slowrank.json` queries them).
//!
//! Names follow Prometheus conventions: base units in the name
//! (`_seconds`, `_bytes`), counters end in `_total`, one family per
//! meaning. Pure: built from plain snapshots, no IO.

use crate::{
    net::ingest::IngestStats,
    report::alert::HookStats,
    report::prom::{Exposition, Type},
    report::IngestCounters,
    verdict::Verdict,
};
use std::sync::atomic::Ordering;

/// One verdict as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VerdictRow {
    pub id: u64,
    pub rank: u32,
    pub host: String,
    pub kind: &'static str,
    pub active: bool,
    pub lost_gpu_seconds: f64,
    /// Closed as a transient ([`Verdict::is_transient`]): its series leave
    /// the verdict families, as it leaves `verdicts[]` in the report, and
    /// `slowrank_transients_total` counts it.
    pub transient: bool,
}

impl VerdictRow {
    pub fn of(v: &Verdict, cfg: &crate::verdict::LifecycleConfig) -> Self {
        Self {
            id: v.id,
            rank: v.rank,
            host: v.host.clone(),
            kind: v.kind.as_str(),
            active: v.active,
            lost_gpu_seconds: v.lost_gpu_seconds,
            transient: v.is_transient(cfg),
        }
    }
}

/// The family every batch refusal goes to, whichever stage refused it.
pub const BATCHES_REJECTED: &str = "slowrank_batches_rejected_total";
const BATCHES_REJECTED_HELP: &str = "Whole batches refused, by reason: by the QUIC ingest before decoding (truncated, invalid_archive, oversized, ...) or by the analyzer (host_changed, cut in the future, ...)";

impl Metrics {
    /// The analyzer's families.
    pub fn exposition(&self) -> Exposition {
        let mut e = Exposition::new();
        self.findings_and_pace(&mut e);
        self.ingest_families(&mut e);
        e
    }

    /// Verdicts, hangs, the step, probe overhead, lateness and clocks.
    fn findings_and_pace(&self, e: &mut Exposition) {
        self.findings(e);
        self.pace(e);
        self.ranks_and_clocks(e);
    }

    /// Each verdict (open or not, its cost), the counts, the hangs.
    fn findings(&self, e: &mut Exposition) {
        let g = Type::Gauge;
        let c = Type::Counter;
        let f = e.family(
            "slowrank_verdict_active",
            g,
            "1 while the verdict is open, 0 once it closed; one series per verdict (labels: verdict id, rank, host, kind)",
        );
        for v in self.verdicts.iter().filter(|v| !v.transient) {
            let (id, rank) = (v.id.to_string(), v.rank.to_string());
            let labels = [
                ("verdict", id.as_str()),
                ("rank", rank.as_str()),
                ("host", v.host.as_str()),
                ("kind", v.kind),
            ];
            f.sample(&labels, if v.active { 1.0 } else { 0.0 });
        }
        let f = e.family(
            "slowrank_verdict_lost_gpu_seconds",
            g,
            "GPU-seconds the job lost to this verdict's rank so far (what-if cost: the job's iterations had the rank kept pace with its peers)",
        );
        for v in self.verdicts.iter().filter(|v| !v.transient) {
            let (id, rank) = (v.id.to_string(), v.rank.to_string());
            let labels = [
                ("verdict", id.as_str()),
                ("rank", rank.as_str()),
                ("host", v.host.as_str()),
                ("kind", v.kind),
            ];
            f.sample(&labels, v.lost_gpu_seconds);
        }
        e.single(
            "slowrank_verdicts_active",
            g,
            "Open verdicts",
            self.verdicts_active as f64,
        );
        e.single(
            "slowrank_verdicts_opened_total",
            c,
            "Verdicts ever opened",
            self.verdicts_total as f64,
        );
        e.single(
            "slowrank_transients_total",
            c,
            "Verdicts that closed as transients (slow only within their naming window, then kept pace): alerted when they began, not stragglers, and gone from the verdict families",
            self.verdicts.iter().filter(|v| v.transient).count() as f64,
        );
        e.single(
            "slowrank_hangs_active",
            g,
            "Hung collective instances",
            self.hangs_active as f64,
        );
    }

    /// The step, iterations sealed, and what the probes cost.
    fn pace(&self, e: &mut Exposition) {
        let g = Type::Gauge;
        let c = Type::Counter;
        let f = e.family(
            "slowrank_step_seconds",
            g,
            "The job's step time now: median duration of the recent training iterations",
        );
        if let Some(s) = self.step_ns.filter(|s| s.is_finite()) {
            f.sample(&[], s / 1e9);
        }
        e.single(
            "slowrank_iterations_sealed_total",
            c,
            "Training iterations analysed",
            self.iterations_sealed as f64,
        );
        let f = e.family(
            "slowrank_rank_probe_overhead_ratio",
            g,
            "Share of the rank's time slowrank's probes cost on the threads that run its step (the agent's measured trap cost × its hits; the verbs data path apart)",
        );
        for (r, p) in &self.probe_overhead_percent {
            f.sample(&[("rank", &r.to_string())], p / 100.0);
        }
        let f = e.family(
            "slowrank_job_probe_overhead_ratio",
            g,
            "Share of all ranks' time slowrank's probes cost, time-weighted",
        );
        if let Some(p) = self.job_probe_overhead_percent {
            f.sample(&[], p / 100.0);
        }
        let f = e.family(
            "slowrank_job_agent_cpu_ratio",
            g,
            "The agents' own CPU time as a share of all ranks' time, time-weighted: rank time they may take where they share the ranks' cores",
        );
        if let Some(p) = self.job_agent_cpu_percent {
            f.sample(&[], p / 100.0);
        }
        let f = e.family(
            "slowrank_job_datapath_probe_overhead_ratio",
            g,
            "The deep windows' verbs data-path probes (post_send, poll_cq) as a share of all ranks' time, time-weighted: CPU on NCCL's proxy threads, step time only where they lack a core",
        );
        if let Some(p) = self.job_datapath_percent {
            f.sample(&[], p / 100.0);
        }
    }

    /// Per rank lateness and the waits it caused; per host clock error
    /// and probes.
    fn ranks_and_clocks(&self, e: &mut Exposition) {
        let g = Type::Gauge;
        let c = Type::Counter;
        let f = e.family(
            "slowrank_rank_lateness_seconds",
            g,
            "EWMA of the rank's lateness vs the median arrival on its reference communicator",
        );
        for (r, l) in &self.rank_lateness_ns {
            f.sample(&[("rank", &r.to_string())], l / 1e9);
        }
        let f = e.family(
            "slowrank_rank_attributed_wait_gpu_seconds_total",
            c,
            "GPU time other ranks spent waiting, attributed to this rank as the root of the wait",
        );
        for (r, l) in &self.rank_wait_attributed_gpu_seconds {
            f.sample(&[("rank", &r.to_string())], *l);
        }
        let f = e.family(
            "slowrank_clock_error_seconds",
            g,
            "Clock error bound per host (half the round-trip spread of the best probes); a lateness below it is not evidence",
        );
        for (h, err) in self.clock_error_ns.iter().filter(|(_, e)| e.is_finite()) {
            f.sample(&[("host", h)], err / 1e9);
        }
        let f = e.family(
            "slowrank_clock_probes_total",
            c,
            "Clock probes answered per host, by path: udp (kernel-stamped clock port) or quic (the fallback)",
        );
        for (h, udp, quic) in &self.clock_probes {
            f.sample(&[("host", h), ("path", "udp")], *udp as f64);
            f.sample(&[("host", h), ("path", "quic")], *quic as f64);
        }
    }

    /// What came in and what was lost: instances, batches, records,
    /// parking.
    fn ingest_families(&self, e: &mut Exposition) {
        let g = Type::Gauge;
        let c = Type::Counter;
        e.single(
            "slowrank_open_instances",
            g,
            "Collective instances waiting for members",
            self.open_instances as f64,
        );
        let mut rows = [
            ("batches", self.ingest.batches),
            ("duplicate_batches", self.ingest.duplicate_batches),
            ("missing_batches", self.ingest.missing_batches),
            ("records_accepted", self.ingest.records_accepted),
            ("ringbuf_drops", self.ingest.ringbuf_drops),
            ("spool_drops", self.ingest.spool_drops),
            ("nccl_errors", self.ingest.nccl_errors),
            ("evicted_instances", self.evicted_instances),
        ];
        rows.sort();
        let f = e.family(
            "slowrank_ingest_total",
            c,
            "Analyzer ingest counters by what: batches, records_accepted, and what was lost (ringbuf_drops and spool_drops on the agents, missing_batches, evicted_instances)",
        );
        for (k, v) in rows {
            f.sample(&[("what", k)], v as f64);
        }
        let f = e.family(
            "slowrank_records_rejected_total",
            c,
            "Records refused by the analyzer, by reason",
        );
        for (k, v) in &self.ingest.records_rejected {
            f.sample(&[("reason", k)], *v as f64);
        }
        let p = &self.ingest.parking;
        let f = e.family(
            "slowrank_parked_records_total",
            c,
            "Collective records parked until their communicator's membership arrived, by outcome (expired and overflow are lost)",
        );
        for (k, v) in [
            ("parked", p.parked),
            ("released", p.released),
            ("expired", p.expired),
            ("overflow", p.overflow),
        ] {
            f.sample(&[("outcome", k)], v as f64);
        }
        e.single(
            "slowrank_parked_records",
            g,
            "Collective records parked now",
            p.held as f64,
        );
        e.single(
            "slowrank_parked_bytes",
            g,
            "Bytes of parked collective records now",
            p.held_bytes as f64,
        );
        let t = &self.ingest.takeover;
        let f = e.family(
            "slowrank_takeover_records_total",
            c,
            "Collective records of members whose communicators a restarted agent took over, by outcome (renumbered and joined, or lost)",
        );
        f.sample(&[("outcome", "renumbered")], t.records as f64);
        f.sample(&[("outcome", "lost")], t.lost as f64);
        let f = e.family(
            "slowrank_takeover_members_total",
            c,
            "Communicator members a restarted agent took over, and how many were lined up with the other members",
        );
        f.sample(&[("state", "taken_over")], t.taken_over as f64);
        f.sample(&[("state", "lined_up")], t.lined_up as f64);
        let f = e.family(BATCHES_REJECTED, c, BATCHES_REJECTED_HELP);
        for (k, v) in &self.ingest.batches_rejected {
            f.sample(&[("reason", k)], *v as f64);
        }
    }
}

/// The serve-side guards against hostile peers whose counters the page
/// shows ([`crate::verdict::stackstore`], [`crate::net::metrics_http`]).
pub struct Guards<'a> {
    pub stacks: &'a crate::verdict::stackstore::StackStore,
    pub http: &'a crate::net::metrics_http::HttpStats,
}

/// The whole `/metrics` page of `slowrank serve`: the analyzer's families
/// plus the transport's and the hooks'.
pub fn serve_exposition(
    metrics: &Metrics,
    ingest: &IngestStats,
    hooks: &HookStats,
    agents_connected: usize,
    guards: &Guards<'_>,
) -> Exposition {
    let mut e = metrics.exposition();
    let f = e.family(BATCHES_REJECTED, Type::Counter, BATCHES_REJECTED_HELP);
    for (k, v) in sorted_counts(&ingest.rejected) {
        f.sample(&[("reason", &k)], v as f64);
    }
    let f = e.family(
        "slowrank_connections_refused_total",
        Type::Counter,
        "Connections refused before or at the hello, by reason",
    );
    for (k, v) in sorted_counts(&ingest.refused) {
        f.sample(&[("reason", &k)], v as f64);
    }
    for (name, help, v) in serve_counters(ingest, hooks, guards) {
        e.single(name, Type::Counter, help, v as f64);
    }
    e.single(
        "slowrank_agents_connected",
        Type::Gauge,
        "Agents connected now",
        agents_connected as f64,
    );
    e
}

/// A by-reason count map's entries, in reason order.
fn sorted_counts(m: &dashmap::DashMap<String, u64>) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = m.iter().map(|e| (e.key().clone(), *e.value())).collect();
    v.sort();
    v
}

/// The transport's, the guards' and the hooks' single counters: (family,
/// help, value).
fn serve_counters(
    ingest: &IngestStats,
    hooks: &HookStats,
    guards: &Guards<'_>,
) -> [(&'static str, &'static str, u64); 14] {
    [
    (
        "slowrank_stack_windows_refused_total",
        "Stack windows refused: for a rank the sending host does not own, or too large",
        guards.stacks.refused.load(Ordering::Relaxed),
    ),
    (
        "slowrank_stack_windows_evicted_total",
        "Stack windows dropped early to keep a rank within its byte cap",
        guards.stacks.evicted.load(Ordering::Relaxed),
    ),
    (
        "slowrank_agents_forgotten_total",
        "Agents that had gone, dropped from the report to keep it bounded",
        ingest.agents_forgotten.load(Ordering::Relaxed),
    ),
    (
        "slowrank_metrics_connections_refused_total",
        "/metrics connections closed unserved: too many open at once",
        guards.http.refused.load(Ordering::Relaxed),
    ),
    (
        "slowrank_metrics_bad_requests_total",
        "/metrics requests dropped: too slow, too large or malformed",
        guards.http.bad_requests.load(Ordering::Relaxed),
    ),
    (
        "slowrank_batches_received_total",
        "Batches that passed validation",
        ingest.batches_ok.load(Ordering::Relaxed),
    ),
    (
        "slowrank_batch_bytes_received_total",
        "Bytes of valid batches",
        ingest.bytes_ok.load(Ordering::Relaxed),
    ),
    (
        "slowrank_agents_refused_total",
        "Agent connections refused (token, malformed or late hello, caps, identity in use)",
        ingest.refused_agents.load(Ordering::Relaxed),
    ),
    (
        "slowrank_clock_datagrams_dropped_total",
        "Clock-port datagrams dropped: not ours, unknown token, bad MAC, wrong address, or answering no outstanding probe",
        ingest.clock_datagrams_dropped.load(Ordering::Relaxed),
    ),
    (
        "slowrank_webhook_ok_total",
        "Webhook deliveries that succeeded",
        hooks.webhook_ok.load(Ordering::Relaxed),
    ),
    (
        "slowrank_webhook_failed_total",
        "Webhook deliveries that failed",
        hooks.webhook_failed.load(Ordering::Relaxed),
    ),
    (
        "slowrank_exec_hook_ok_total",
        "Exec hook runs that succeeded",
        hooks.exec_ok.load(Ordering::Relaxed),
    ),
    (
        "slowrank_exec_hook_failed_total",
        "Exec hook runs that failed",
        hooks.exec_failed.load(Ordering::Relaxed),
    ),
    (
        "slowrank_hook_events_dropped_total",
        "Events not delivered to hooks because they were behind",
        hooks.dropped.load(Ordering::Relaxed),
    ),
]
}

/// Snapshot for Prometheus.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Metrics {
    pub rank_lateness_ns: Vec<(u32, f64)>,
    pub rank_wait_attributed_gpu_seconds: Vec<(u32, f64)>,
    pub verdicts_active: usize,
    pub verdicts_total: usize,
    pub hangs_active: usize,
    pub clock_error_ns: Vec<(String, f64)>,
    /// Per host: probes answered on the clock port, and otherwise.
    pub clock_probes: Vec<(String, u64, u64)>,
    pub ingest: IngestCounters,
    pub open_instances: usize,
    pub evicted_instances: u64,
    pub iterations_sealed: u64,
    pub verdict_trackers: usize,
    pub pending_instances: usize,
    pub recent_instances: usize,
    /// Per rank, percent of its time slowrank's probes cost (agents' figure).
    pub probe_overhead_percent: Vec<(u32, f64)>,
    pub job_probe_overhead_percent: Option<f64>,
    pub job_agent_cpu_percent: Option<f64>,
    pub job_datapath_percent: Option<f64>,
    /// The job's step time now (median of recent iterations), when known.
    pub step_ns: Option<f64>,
    /// Every verdict: (id, rank, host, kind, active, lost GPU-seconds, transient).
    pub verdicts: Vec<crate::report::metrics_text::VerdictRow>,
}

impl Metrics {
    /// Prometheus text exposition format (families in [`crate::report::metrics_text`]).
    pub fn to_prometheus(&self) -> String {
        self.exposition().render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_once_with_conventional_names() {
        let m = Metrics {
            rank_lateness_ns: vec![(0, 1e6), (1, 2e6)],
            rank_wait_attributed_gpu_seconds: vec![(1, 3.5)],
            verdicts_active: 1,
            verdicts_total: 2,
            hangs_active: 0,
            clock_error_ns: vec![("node-0".into(), 2e3), ("node-1".into(), f64::INFINITY)],
            clock_probes: vec![("node-0".into(), 5, 1)],
            ingest: crate::report::IngestCounters {
                batches_rejected: [("host_changed".to_owned(), 1)].into(),
                ..Default::default()
            },
            open_instances: 3,
            evicted_instances: 0,
            iterations_sealed: 10,
            verdict_trackers: 0,
            pending_instances: 0,
            recent_instances: 0,
            probe_overhead_percent: vec![(0, 0.2)],
            job_probe_overhead_percent: Some(0.2),
            job_agent_cpu_percent: Some(1.5),
            job_datapath_percent: Some(0.7),
            step_ns: Some(40e6),
            verdicts: vec![
                VerdictRow {
                    id: 1,
                    rank: 1,
                    host: "node-0".into(),
                    kind: "host",
                    active: true,
                    lost_gpu_seconds: 2.5,
                    transient: false,
                },
                VerdictRow {
                    id: 2,
                    rank: 6,
                    host: "node-1".into(),
                    kind: "host",
                    active: false,
                    lost_gpu_seconds: 0.1,
                    transient: true,
                },
            ],
        };
        let ingest = IngestStats::default();
        ingest.rejected.insert("host_changed".into(), 2);
        ingest.rejected.insert("truncated".into(), 1);
        let guards = Guards {
            stacks: &crate::verdict::stackstore::StackStore::default(),
            http: &crate::net::metrics_http::HttpStats::default(),
        };
        let text = serve_exposition(&m, &ingest, &HookStats::default(), 2, &guards).render();
        let mut seen = foldhash::HashSet::default();
        for l in text.lines().filter(|l| l.starts_with("# HELP ")) {
            let name = l.split(' ').nth(2).unwrap();
            assert!(seen.insert(name.to_owned()), "{name} twice:\n{text}");
        }
        // Both sources' refusals in one family; the same reason adds up.
        assert!(text.contains("slowrank_batches_rejected_total{reason=\"host_changed\"} 3\n"));
        assert!(text.contains("slowrank_batches_rejected_total{reason=\"truncated\"} 1\n"));
        assert!(text.contains("slowrank_step_seconds 0.04\n"), "{text}");
        assert!(text.contains(
            "slowrank_verdict_active{verdict=\"1\",rank=\"1\",host=\"node-0\",kind=\"host\"} 1\n"
        ));
        assert!(text.contains(
            "slowrank_verdict_lost_gpu_seconds{verdict=\"1\",rank=\"1\",host=\"node-0\",kind=\"host\"} 2.5\n"
        ));
        // A transient is counted, not listed as a verdict.
        assert!(text.contains("slowrank_transients_total 1\n"), "{text}");
        assert!(!text.contains("verdict=\"2\""), "{text}");
        // A host without a clock yet has no series rather than +Inf.
        assert!(!text.contains("node-1"), "{text}");
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut w = l.split(' ').skip(2);
            let (name, kind) = (w.next().unwrap(), w.next().unwrap());
            assert_eq!(kind == "counter", name.ends_with("_total"), "{l}");
        }
    }
}

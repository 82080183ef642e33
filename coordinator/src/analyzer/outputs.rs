//! What the runtime shows: the report, trace, timeline, metrics and the
//! slowdown summary, each read from the current state.

use super::*;

impl Analyzer {
    /// The job got slower while no verdict names a rank: the median of the
    /// last few steps is well above the median of the steps before them.
    /// With the default probe set a compute- or communication-slow rank is
    /// often invisible (calls only enqueue; host-side arrivals match), so
    /// `serve` answers this with a deep-probe window on every agent, whose
    /// GPU-side arrivals and verbs latencies name the rank. A slowdown
    /// that began before the warm steps made a baseline (their median is
    /// then the slow step) is an ongoing slow stretch against the job's
    /// best pace ([`crate::classify::stretches`]): a pipeline stage 1.42×
    /// heavier from iteration 27 of a job warm from 20 slowed it 33%, the
    /// report said so, and no deep window ever opened to say why.
    pub fn slowdown(&self) -> Option<Slowdown> {
        let core = lock(&self.core);
        if core.lifecycle.verdicts().any(|v| v.active) {
            return None;
        }
        Self::slowdown_by_history(&core).or_else(|| {
            let s = core
                .pace
                .stretches()
                .into_iter()
                .find(|s| s.ongoing && s.rise > SLOWDOWN_RISE)?;
            Some(Slowdown {
                iteration: core.last_sealed.unwrap_or(0),
                baseline_ms: s.pace_ms,
                recent_ms: s.step_ms,
            })
        })
    }

    /// The last [`SLOWDOWN_RECENT`] warm steps' median against the median
    /// of the warm steps before them. The recent steps include those whole
    /// but not yet sealed: an iteration's end is final once its last
    /// reference instance is in, while sealing waits
    /// [`crate::graph::iteration::IterationConfig::seal_lag`] iterations
    /// more for every rank's records; the deep window this asks for is
    /// the path to a name, so those iterations are detection latency.
    fn slowdown_by_history(core: &Core) -> Option<Slowdown> {
        let mut steps: Vec<f64> = core.steps.iter().copied().collect();
        let mut last = core.last_sealed;
        if let (Some(sealed), Some(ended)) = (core.last_sealed, core.iteration.last_ended()) {
            let warm_from = core.warmup.warm_from();
            for k in (sealed + 1..=ended).filter(|k| *k >= warm_from) {
                let Some(d) = core.iteration.whole_duration_of(k) else {
                    break;
                };
                steps.push(d);
                last = Some(k);
            }
        }
        let n = steps.len();
        if n < SLOWDOWN_RECENT + SLOWDOWN_BASELINE_MIN {
            return None;
        }
        let mut recent = steps.split_off(n - SLOWDOWN_RECENT);
        let from = steps.len().saturating_sub(STEP_HISTORY - SLOWDOWN_RECENT);
        let mut base = steps.split_off(from);
        let (r, b) = (median(&mut recent)?, median(&mut base)?);
        (r > b * (1.0 + SLOWDOWN_RISE)).then(|| Slowdown {
            iteration: last.unwrap_or(0),
            baseline_ms: b / 1e6,
            recent_ms: r / 1e6,
        })
    }

    /// A GPU-bound suspect was held in the last iterations because only the
    /// deep set can tell a slow GPU from a slow NIC: deep probes are wanted.
    pub fn confirmation_wanted(&self) -> bool {
        let core = lock(&self.core);
        match (core.held_for_deep, core.last_sealed) {
            (Some(h), Some(l)) => h + 3 >= l,
            _ => false,
        }
    }

    /// Whether this life's warm-up has ended (its steps settled).
    pub fn warmed_up(&self) -> bool {
        lock(&self.core).warmup.is_warm()
    }

    /// The job's step, once inferred.
    pub fn step(&self) -> Option<std::time::Duration> {
        lock(&self.core)
            .iteration
            .step_ns()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| std::time::Duration::from_nanos(s as u64))
    }

    /// Verdicts opened so far (active or not).
    pub fn verdicts_opened(&self) -> usize {
        lock(&self.core).lifecycle.verdicts().count()
    }

    /// Whether an active verdict rests on what only the deep set sees: a
    /// GPU or a NIC falling behind (compute, communication), or a stage or
    /// work imbalance, which is replayed on wholly GPU-side steps. Host-side
    /// times cannot show any of them, so without the deep set such a
    /// verdict would close as if its fault had gone: random 6317-9's stage
    /// verdict (21 % of the step) cleared at iteration 46 of a fault that
    /// lasted to the end, once its window lapsed (stop 63). A work
    /// imbalance read from host-side rotation keeps the window too: telling
    /// the two apart is not worth a verdict that flaps.
    pub fn active_needs_deep(&self) -> bool {
        lock(&self.core).lifecycle.verdicts().any(|v| {
            v.active
                && matches!(
                    v.kind,
                    classify::Kind::Compute
                        | classify::Kind::Communication
                        | classify::Kind::Structural
                )
        })
    }

    pub(super) fn max_error_ns(&self) -> f64 {
        self.clocks
            .iter()
            .map(|c| c.error_bound_ns())
            .filter(|e| e.is_finite())
            .fold(0.0, f64::max)
    }

    /// The cluster report (`report.json` / the human table).
    pub fn report(&self) -> Report {
        let core = lock(&self.core);
        let mut hosts: Vec<crate::clock::HostClockReport> =
            self.clocks.iter().map(|c| c.summary(c.key())).collect();
        hosts.sort_by(|a, b| a.host.cmp(&b.host));
        let ranks: Vec<RankInfo> = {
            let mut v: Vec<RankInfo> = self.ranks.iter().map(|r| r.clone()).collect();
            v.sort_by_key(|r| r.rank);
            v
        };
        let slowdown = core.pace.slowing();
        let slow_stretches = core.pace.stretches();
        let (verdicts, transients) = report_verdicts(&core, slowdown.as_ref(), &slow_stretches);
        let counters = self.ingest_counters();
        let join = self.joiner.counters();
        let (roots, blocked) = split_hangs(&core.hangs);
        report::Report {
            schema: report::SCHEMA.into(),
            generated_at: Utc::now(),
            job: self.job_info(&core, &ranks, hosts.len()),
            clock: report::ClockInfo {
                max_error_us: {
                    let e = hosts
                        .iter()
                        .filter_map(|h| h.error_bound_us)
                        .fold(0.0, f64::max);
                    if hosts.is_empty() || hosts.iter().any(|h| h.error_bound_us.is_none()) {
                        None
                    } else {
                        Some(e)
                    }
                },
                hosts,
            },
            verdicts,
            transients,
            hangs: roots.iter().map(|h| hang_report(h)).collect(),
            blocked_hangs: blocked.iter().map(|h| hang_report(h)).collect(),
            resolved_stalls: core
                .hangs
                .iter()
                .filter(|h| !h.active)
                .map(hang_report)
                .collect(),
            ingest: report::IngestInfo {
                counters,
                instances_completed: join.completed,
                instances_evicted: join.evicted,
                instances_incomplete: join.incomplete,
                duplicate_records: join.duplicates,
                merged_records: join.merged,
                dropped_late_for_stats: core.stats.dropped_late,
                dropped_overflow: core.stats.dropped_overflow + core.pending_dropped,
                open_instances: self.joiner.open_instances(),
                transport_rejected: BTreeMap::new(),
                agents_refused: 0,
                agents_refused_by: BTreeMap::new(),
                agents_forgotten: 0,
            },
            agents: Vec::new(),
            slowdown,
            slow_stretches,
            overhead: lock(&self.overhead).report(),
            resumed: None,
            truncated: None,
        }
    }

    /// The job as the report's header tells it.
    fn job_info(&self, core: &Core, ranks: &[RankInfo], hosts: usize) -> report::JobInfo {
        let period = core.iteration.period();
        report::JobInfo {
            job_id: ranks
                .iter()
                .map(|r| r.job_id.clone())
                .find(|j| !j.is_empty()),
            world_size: ranks.first().map_or(0, |r| r.world_size),
            ranks_seen: ranks.len(),
            hosts,
            reference_communicator: period.map(|p| format!("{:#x}", p.comm_id)),
            instances_per_iteration: period.map(|p| p.instances_per_iteration),
            step_inferred_by: period.map(|p| p.method),
            baseline_step_ms: core.pace.baseline_ms(),
            iterations_observed: core.last_sealed.map_or(0, |k| k + 1),
            step_time_ms: core.iteration.step_ns().map(|s| s / 1e6),
            observed_seconds: match (core.first_t, core.last_t) {
                (Some(a), Some(b)) => (b - a) as f64 / 1e9,
                _ => 0.0,
            },
            started: core.first_t.and_then(|t| self.wall(t)),
            exited_ranks: ranks
                .iter()
                .filter(|r| r.exited_at.is_some())
                .map(|r| r.rank)
                .collect(),
        }
    }

    /// Chrome / Perfetto trace (`traceEvents`) of the aligned timeline around
    /// each verdict (or the most recent instances when there is none).
    pub fn trace_json(&self) -> serde_json::Value {
        let core = lock(&self.core);
        let mut sections: Vec<crate::report::trace::Section> = Vec::new();
        for (id, snap) in &core.snapshots {
            if let Some(v) = core.lifecycle.get(*id) {
                sections.push(crate::report::trace::Section {
                    title: v.headline(),
                    focus: match &v.link {
                        Some(l) => l.ranks.to_vec(),
                        None => vec![v.rank],
                    },
                    instances: snap.iter().map(|x| &x.1).collect(),
                });
            }
        }
        if sections.is_empty() {
            let n = core.recent.len();
            sections.push(crate::report::trace::Section {
                title: "recent collectives".into(),
                focus: Vec::new(),
                instances: core
                    .recent
                    .iter()
                    .skip(n.saturating_sub(256))
                    .map(|x| &x.1)
                    .collect(),
            });
        }
        let hosts: HashMap<u32, String> = self
            .ranks
            .iter()
            .map(|r| (r.rank, r.host.clone()))
            .collect();
        crate::report::trace::render(&sections, &hosts)
    }

    /// The per-iteration series of the report page (`timeline.json`).
    pub fn timeline(&self) -> crate::report::timeline::Timeline {
        lock(&self.core).timeline.clone()
    }

    /// Gauges and counters for `/metrics`.
    pub fn metrics(&self) -> Metrics {
        let core = lock(&self.core);
        let mut lateness: Vec<(u32, f64)> = core
            .stats
            .lateness_gauge()
            .iter()
            .map(|(r, l)| (*r, *l))
            .collect();
        lateness.sort_by_key(|x| x.0);
        let mut clock: Vec<(String, f64)> = self
            .clocks
            .iter()
            .map(|c| (c.key().clone(), c.error_bound_ns()))
            .collect();
        clock.sort_by(|a, b| a.0.cmp(&b.0));
        let mut probes: Vec<(String, u64, u64)> = self
            .clocks
            .iter()
            .map(|c| {
                let (seen, udp) = c.probe_counts();
                (c.key().clone(), udp, seen.saturating_sub(udp))
            })
            .collect();
        probes.sort();
        let mut lost: Vec<(u32, f64)> = core
            .lost_by_root
            .iter()
            .map(|(r, l)| (*r, *l / 1e9))
            .collect();
        lost.sort_by_key(|x| x.0);
        // One guard: a second lock() in the literal below would wait for the
        // first, whose temporary lives to the end of the statement.
        let (
            probe_overhead_percent,
            job_probe_overhead_percent,
            job_agent_cpu_percent,
            job_datapath_percent,
        ) = {
            let o = lock(&self.overhead);
            (
                o.rank_percents(),
                o.job_percent(),
                o.agent_cpu_percent(),
                o.datapath_percent(),
            )
        };
        Metrics {
            rank_lateness_ns: lateness,
            rank_wait_attributed_gpu_seconds: lost,
            verdicts_active: core.lifecycle.verdicts().filter(|v| v.active).count(),
            verdicts_total: core.lifecycle.verdicts().count(),
            hangs_active: core.hangs.iter().filter(|h| h.active).count(),
            clock_error_ns: clock,
            clock_probes: probes,
            ingest: self.ingest_counters(),
            open_instances: self.joiner.open_instances(),
            evicted_instances: self.joiner.counters().evicted,
            iterations_sealed: core.last_sealed.map_or(0, |k| k + 1),
            verdict_trackers: core.lifecycle.trackers(),
            pending_instances: core.pending.len(),
            recent_instances: core.recent.len(),
            probe_overhead_percent,
            job_probe_overhead_percent,
            job_agent_cpu_percent,
            job_datapath_percent,
            step_ns: core.iteration.step_ns(),
            verdicts: core
                .lifecycle
                .verdicts()
                .map(|v| crate::report::metrics_text::VerdictRow::of(v, core.lifecycle.config()))
                .collect(),
        }
    }
}

/// Every verdict, active first and costliest first, the rise of the job's
/// step put on the one it belongs to: the slowdown against the baseline,
/// or, where the baseline itself was slow (a fault from the first steps),
/// the stretch the run is in against its best pace. Transients apart.
fn report_verdicts(
    core: &Core,
    slowdown: Option<&crate::classify::pace::Slowing>,
    stretches: &[crate::classify::stretches::Stretch],
) -> (Vec<crate::verdict::Verdict>, Vec<crate::verdict::Verdict>) {
    let cfg = core.lifecycle.config();
    let (mut verdicts, transients): (Vec<_>, Vec<_>) = core
        .lifecycle
        .verdicts()
        .cloned()
        .partition(|v| !v.is_transient(cfg));
    verdicts.sort_by(|a, b| {
        b.active
            .cmp(&a.active)
            .then(b.lost_gpu_seconds.total_cmp(&a.lost_gpu_seconds))
    });
    let rise = slowdown.cloned().or_else(|| {
        stretches
            .iter()
            .find(|st| st.ongoing)
            .map(crate::classify::pace::Slowing::of_stretch)
    });
    if let Some(sd) = &rise {
        put_rise_on_its_verdict(sd, core.pace.config().onset_match, &mut verdicts);
    }
    (verdicts, transients)
}

/// The job slowed and the what-if could not cost the verdict that began
/// with it: that verdict carries the rise as its estimated cost
/// ([`crate::classify::pace::rise_owner`]).
fn put_rise_on_its_verdict(
    sd: &crate::classify::pace::Slowing,
    onset_match: u64,
    verdicts: &mut [crate::verdict::Verdict],
) {
    use crate::classify::pace::{rise_owner, Costing};
    let active: Vec<usize> = (0..verdicts.len())
        .filter(|i| verdicts[*i].active)
        .collect();
    let costing: Vec<Costing> = active
        .iter()
        .map(|i| Costing {
            first_seen_iteration: verdicts[*i].first_seen_iteration,
            // A rank the replay put off the critical path explains none of
            // the rise; if the rise began with it, the replay missed it.
            measured: (verdicts[*i].cost_iterations > 0
                && verdicts[*i].cost_fraction >= crate::classify::OFF_CRITICAL_PATH)
                .then_some(verdicts[*i].cost_fraction),
        })
        .collect();
    if let Some((j, e)) = rise_owner(sd, onset_match, &costing) {
        verdicts[active[j]].cost_estimate = Some(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict the replay put off the critical path, first seen when the
    /// step rose, carries the rise; one costed above the floor keeps its
    /// measured cost and says it.
    #[test]
    fn a_rise_goes_to_the_verdict_the_replay_put_off_the_critical_path() {
        let report = crate::synthjob::analyzed(Some(30), 80).report();
        let mut verdicts = report.verdicts.clone();
        let v = verdicts.iter_mut().find(|v| v.active).expect("named");
        v.cost_iterations = 10;
        v.cost_fraction = 0.0;
        let first = v.first_seen_iteration;
        let st = crate::classify::stretches::Stretch {
            from_iteration: first,
            from_first_step: false,
            to_iteration: 79,
            ongoing: true,
            step_ms: 537.4,
            pace_ms: 391.8,
            rise: 537.4 / 391.8 - 1.0,
        };
        let sd = crate::classify::pace::Slowing::of_stretch(&st);
        put_rise_on_its_verdict(&sd, 10, &mut verdicts);
        let v = verdicts.iter().find(|v| v.active).unwrap();
        let e = v.cost_estimate.as_ref().expect("estimated");
        assert!((e.fraction - (537.4 - 391.8) / 537.4).abs() < 1e-9, "{e:?}");
        assert_eq!(v.cost_cell(), "≈27%");
        assert!(
            v.headline()
                .contains("the replay put it off the critical path, which the rise contradicts"),
            "{}",
            v.headline()
        );
        let mut costed = report.verdicts.clone();
        let v = costed.iter_mut().find(|v| v.active).unwrap();
        v.cost_iterations = 10;
        v.cost_fraction = 0.25;
        put_rise_on_its_verdict(&sd, 10, &mut costed);
        assert!(costed.iter().all(|v| v.cost_estimate.is_none()));
    }
}

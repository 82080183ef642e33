//! What the server writes and serves: the report files (on their own task,
//! never twice at once), the live page and `/metrics`.

use super::*;

impl Server {
    /// Renders and writes the report files on the blocking pool.
    pub(super) async fn write_outputs(&self) -> Result<(), OutputError> {
        match self.spawn_write_outputs() {
            Some(h) => Self::writer_result(h.await),
            None => Ok(()),
        }
    }

    pub(super) fn writer_result(
        r: Result<Result<(), OutputError>, tokio::task::JoinError>,
    ) -> Result<(), OutputError> {
        r.unwrap_or_else(|e| {
            warn!("report writer task failed: {e}");
            Ok(())
        })
    }

    /// Starts rendering and writing the report files on the blocking pool
    /// without waiting: the files are fsync'ed, which takes seconds on a
    /// loaded disk, and batches must not wait behind that (their agents
    /// wait for the answer).
    pub(super) fn spawn_write_outputs(
        &self,
    ) -> Option<tokio::task::JoinHandle<Result<(), OutputError>>> {
        let dir = self.cfg.out_dir.clone()?;
        let (a, s, ag, st, pg) = (
            self.analyzer.clone(),
            self.ingest.stats(),
            self.agents.clone(),
            self.stacks.clone(),
            self.page.clone(),
        );
        let (earlier, started, failures) = (
            self.earlier.clone(),
            self.started,
            self.write_failures.clone(),
        );
        let job = move || {
            let t0 = std::time::Instant::now();
            let mut report = build_report(&a, &s, &ag);
            let t1 = t0.elapsed();
            let (world, step_ms) = (
                report.job.world_size,
                report.job.step_time_ms.unwrap_or(0.0),
            );
            st.annotate(
                &mut report.verdicts,
                world,
                step_ms,
                coord_now_ns() as CoordNs,
                &dir,
            );
            // After the annotation: it needs this life's verdict times.
            earlier.merge_into(&mut report, started);
            // Bounded whatever agents send; the page is made from the same.
            if !report.bound_size(crate::report::MAX_REPORT_BYTES) {
                warn!(
                    "report.json is over {} bytes even with every list it may cut cut",
                    crate::report::MAX_REPORT_BYTES
                );
            }
            let t2 = t0.elapsed();
            let trace = a.trace_json();
            let t3 = t0.elapsed();
            let r = outputs::write_all(&dir, &report, &trace).and_then(|()| {
                let html = outputs::write_timeline_and_page(&dir, &report, &a.timeline())?;
                if let Ok(mut p) = pg.lock() {
                    *p = Some(html);
                }
                Ok(())
            });
            if r.is_err() {
                failures.outputs.fetch_add(1, Ordering::Relaxed);
            }
            // After the report: a disk with room for only one keeps that.
            if let Some(boot_id) = crate::resume::boot_id() {
                let clocks = crate::resume::ClockFile {
                    boot_id,
                    hosts: a.clock_seeds(),
                };
                if !clocks.hosts.is_empty() {
                    if let Err(e) = crate::resume::save_clocks(&dir, &clocks) {
                        warn!(error = ?e, "clock models not kept");
                        failures.outputs.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if let Some(b) = a.baselines() {
                if let Err(e) = crate::resume::save_baselines(&dir, &b) {
                    warn!(error = ?e, "the job's baselines not kept");
                    failures.outputs.fetch_add(1, Ordering::Relaxed);
                }
            }
            debug!(target: "slowrank::timing", report_ms = t1.as_secs_f64() * 1e3,
                annotate_ms = (t2 - t1).as_secs_f64() * 1e3, trace_ms = (t3 - t2).as_secs_f64() * 1e3,
                write_ms = (t0.elapsed() - t3).as_secs_f64() * 1e3, "outputs written");
            r
        };
        Some(tokio::task::spawn_blocking(job))
    }
}

pub(super) fn render_metrics(
    analyzer: &Analyzer,
    ingest: &IngestStats,
    hooks: &HookStats,
    agents: &std::sync::Mutex<BTreeMap<String, AgentReport>>,
    stacks: &StackStore,
    http: &HttpStats,
) -> String {
    let connected = agents
        .lock()
        .map(|a| a.values().filter(|a| a.connected).count())
        .unwrap_or(0);
    crate::report::metrics_text::serve_exposition(
        &analyzer.metrics(),
        ingest,
        hooks,
        connected,
        &crate::report::metrics_text::Guards { stacks, http },
    )
    .render()
}

/// The report page served at `/`: the one last written with the report
/// files (it has the flame graphs), or, without `--out`, one rendered now.
pub(super) fn live_page(
    analyzer: &Analyzer,
    stats: &IngestStats,
    agents: &std::sync::Mutex<BTreeMap<String, AgentReport>>,
    page: &std::sync::Mutex<Option<String>>,
) -> String {
    if let Some(html) = page.lock().ok().and_then(|p| p.clone()) {
        return crate::report::html::with_refresh(&html, crate::report::html::LIVE_REFRESH_S);
    }
    let report = build_report(analyzer, stats, agents);
    crate::report::html::render(&crate::report::html::Page {
        report: &report,
        timeline: &analyzer.timeline(),
        flames: Vec::new(),
        refresh_s: Some(crate::report::html::LIVE_REFRESH_S),
    })
}

pub(super) fn write_failures_metrics(s: &mut String, f: &WriteFailures) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "# HELP slowrank_out_write_failures_total Failed writes to --out (full or read-only disk), by file\n# TYPE slowrank_out_write_failures_total counter"
    );
    for (what, v) in [("reports", &f.outputs), ("journal", &f.journal)] {
        let _ = writeln!(
            s,
            "slowrank_out_write_failures_total{{what=\"{what}\"}} {}",
            v.load(Ordering::Relaxed)
        );
    }
}

pub(super) fn build_report(
    analyzer: &Analyzer,
    stats: &IngestStats,
    agents: &std::sync::Mutex<BTreeMap<String, AgentReport>>,
) -> Report {
    let mut r = analyzer.report();
    r.ingest.transport_rejected = stats
        .rejected
        .iter()
        .map(|e| (e.key().clone(), *e.value()))
        .collect();
    r.ingest.agents_refused = stats.refused_agents.load(Ordering::Relaxed);
    r.ingest.agents_refused_by = stats
        .refused
        .iter()
        .map(|e| (e.key().clone(), *e.value()))
        .collect();
    r.ingest.agents_forgotten = stats.agents_forgotten.load(Ordering::Relaxed);
    r.agents = agents
        .lock()
        .map(|a| a.values().cloned().collect())
        .unwrap_or_default();
    // The connection knows first: its "gone" event may still be queued
    // behind batches on a busy coordinator.
    for a in &mut r.agents {
        if a.connected && stats.agents.get(&a.agent_id).is_some_and(|s| !s.connected) {
            a.connected = false;
        }
    }
    r
}

/// Appends the marks of the batches just ingested to the journal.
pub(super) fn journal_marks(
    j: &std::sync::Mutex<crate::resume::Journal>,
    done: &[(String, Box<Batch>, Ack, crate::analyzer::IngestSummary)],
    failures: &WriteFailures,
) {
    let marks: Vec<crate::resume::Mark> = done
        .iter()
        .filter(|(_, _, _, sum)| {
            !sum.preamble && !sum.duplicate_batch && sum.batch_rejected.is_none()
        })
        .map(|(agent_id, b, _, _)| crate::resume::Mark {
            agent_id: agent_id.clone(),
            host: b.host.clone(),
            seq: b.seq,
            ringbuf_drops: b.ringbuf_drops,
            spool_drops: b.spool_drops,
        })
        .collect();
    let r = j.lock().map_err(|_| ()).map(|mut j| j.append(&marks));
    if let Ok(Err(e)) = r {
        // Still acked: holding the agents back on a full disk would lose
        // more than a possible second ingest after a restart.
        if failures.journal.fetch_add(1, Ordering::Relaxed) == 0 {
            warn!(
                "{e}: {}; a restart may ingest these batches twice",
                alert::source_chain(&e)
            );
        }
    }
}

//! Deep windows: the uprobes on every kernel launch and NIC post are costly,
//! so they are opened on demand — on a job slowdown, for verdicts that need
//! GPU-side evidence, and renewed while those stay open.

use super::*;

impl Server {
    /// The job slowed and nobody is named: with calls that only enqueue,
    /// host-side times cannot show a GPU or a NIC falling behind, so every
    /// agent opens a deep window (GPU-side arrivals, verbs latencies) for the
    /// next iterations. At most once per window length.
    pub(super) fn deep_window_on_slowdown(&self) {
        if self.cfg.deep_window_s == 0 {
            return;
        }
        let window = Duration::from_secs(u64::from(self.cfg.deep_window_s));
        if self.renew_deep_for_active(window) {
            return;
        }
        let sd = self.analyzer.slowdown();
        let confirm = self.analyzer.confirmation_wanted();
        if sd.is_none() && !confirm {
            return;
        }
        // A suspicion alone gets the short window.
        let seconds = if sd.is_some() {
            self.cfg.deep_window_s
        } else {
            self.cfg.suspicion_window_s.clamp(1, self.cfg.deep_window_s)
        };
        {
            let Ok(mut last) = self.last_deep_all.lock() else {
                return;
            };
            // Back off while windows name nobody: a job that got slower as a
            // whole (a shared file system, a loaded machine) would otherwise
            // keep the deep probes on for good. 1, 2, 4 … up to 20 long
            // windows apart, counted in long windows whatever this one's
            // length (a short suspicion window must not come three times as
            // often); back to 1 once a verdict has opened.
            if let Some((t, gap, _)) = *last {
                if t.elapsed() < gap {
                    return;
                }
            }
            let named = self.analyzer.verdicts_opened();
            let gap = match *last {
                Some((_, g, before)) if named == before => (g * 2).min(window * 20),
                _ => window,
            };
            *last = Some((std::time::Instant::now(), gap, named));
        }
        let ids = self.connected_agent_ids();
        let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let why = match sd {
            Some(sd) => format!(
                "SLOWER job step {:.1} ms vs {:.1} ms before (iteration {}) with no rank named",
                sd.recent_ms, sd.baseline_ms, sd.iteration
            ),
            None => "SUSPECT a rank's GPU work runs long; a slow GPU or a slow NIC, only GPU-side times tell".into(),
        };
        let line = format!(
            "{now} {why}: deep probes on {} agent(s) for {seconds} s",
            ids.len(),
        );
        info!("{line}");
        if self.cfg.print_alerts {
            println!("{line}");
        }
        self.deep_window_everywhere(ids, seconds);
    }

    /// A deep window of `seconds` on every rank of each agent.
    pub(super) fn deep_window_everywhere(&self, ids: Vec<String>, seconds: u32) {
        if let Ok(mut u) = self.deep_all_until.lock() {
            *u = Some(std::time::Instant::now() + Duration::from_secs(u64::from(seconds)));
        }
        for id in ids {
            let sent = self.ingest.send_control(
                &id,
                Control {
                    deep_enable: true,
                    seconds,
                    ranks: Vec::new(),
                    launch_sites: false,
                },
            );
            debug!(agent = %id, sent, "deep-probe window requested (job-wide)");
        }
    }

    /// Keeps the deep probes on everywhere while a verdict that only they
    /// can confirm is active (a GPU-side comparison needs every member's
    /// GPU times, so every host): renews the job-wide window shortly before
    /// it ends. Returns whether it is keeping them on.
    pub(super) fn renew_deep_for_active(&self, window: Duration) -> bool {
        if !self.analyzer.active_needs_deep() {
            return false;
        }
        let Ok(mut last) = self.last_deep_all.lock() else {
            return false;
        };
        let margin = Duration::from_secs(3).min(window / 2);
        let until = self.deep_all_until.lock().ok().and_then(|u| *u);
        if until.is_some_and(|u| u > std::time::Instant::now() + margin) {
            return true;
        }
        *last = Some((
            std::time::Instant::now(),
            window,
            self.analyzer.verdicts_opened(),
        ));
        drop(last);
        let ids = self.connected_agent_ids();
        info!(
            agents = ids.len(),
            seconds = self.cfg.deep_window_s,
            "deep probes kept on: an active verdict rests on GPU-side or verbs evidence"
        );
        self.deep_window_everywhere(ids, self.cfg.deep_window_s);
        true
    }

    pub(super) fn connected_agent_ids(&self) -> Vec<String> {
        self.agents
            .lock()
            .map(|a| {
                a.values()
                    .filter(|a| a.connected)
                    .map(|a| a.agent_id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Deep probes (verbs, per-launch timing) for the suspect's host.
    pub(super) fn request_deep_window(&self, e: &VerdictEvent) {
        let (Some(v), true) = (&e.verdict, self.cfg.deep_window_s > 0) else {
            return;
        };
        let ids: Vec<String> = self
            .agents
            .lock()
            .map(|a| {
                a.values()
                    .filter(|a| a.connected && a.host == v.host)
                    .map(|a| a.agent_id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut ranks = vec![v.rank];
        if let Some(l) = &v.link {
            ranks = l.ranks.to_vec();
        }
        // Only a compute verdict's flame graph is the launch view.
        let launch_sites =
            self.cfg.launch_sites && crate::verdict::flame::view_for(v.kind).0 == StackView::Launch;
        for id in ids {
            let sent = self.ingest.send_control(
                &id,
                Control {
                    deep_enable: true,
                    seconds: self.cfg.deep_window_s,
                    ranks: ranks.clone(),
                    launch_sites,
                },
            );
            debug!(agent = %id, sent, "deep-probe window requested");
        }
    }
}

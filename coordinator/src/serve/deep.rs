//! Deep windows: the uprobes on every kernel launch and NIC post are costly,
//! so they are opened on demand — on a job slowdown, on a suspicion, for
//! verdicts that need GPU-side evidence, and renewed while those stay open
//! (the rule: [`crate::verdict::deep_ask`]).

use super::*;
use crate::verdict::deep_ask;

impl Server {
    /// Asks every agent for the deep window the analyzer's state calls for
    /// ([`deep_ask::DeepAsk`]: a verdict resting on it, a slowdown nobody is named
    /// for, a suspect only GPU-side times can class), if any.
    pub(super) fn deep_window_on_slowdown(&self) {
        let sd = self.analyzer.slowdown();
        let state = deep_ask::State {
            active_needs_deep: self.analyzer.active_needs_deep(),
            slowdown: sd.is_some(),
            suspicion: self.analyzer.confirmation_wanted(),
            verdicts_opened: self.analyzer.verdicts_opened(),
            step: self.analyzer.step(),
            warm: self.analyzer.warmed_up(),
        };
        let ask = {
            let Ok(mut plan) = self.deep_ask.lock() else {
                return;
            };
            plan.poll(std::time::Instant::now(), &state)
        };
        let Some(ask) = ask else {
            return;
        };
        let ids = self.connected_agent_ids();
        match (ask.reason, ask.renewal) {
            (deep_ask::Reason::Verdict, _) => info!(
                agents = ids.len(),
                seconds = ask.seconds,
                "deep probes kept on: an active verdict rests on GPU-side or verbs evidence"
            ),
            (deep_ask::Reason::Slowdown, true) => info!(
                agents = ids.len(),
                seconds = ask.seconds,
                "deep probes kept on: the job is still slower with nobody named"
            ),
            (deep_ask::Reason::FirstLook, _) => {
                let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let line = format!(
                    "{now} FIRST LOOK the warm-up is over: GPU-side times for a straggler from the job's first steps (no slowdown would show it): deep probes on {} agent(s) for {} s",
                    ids.len(),
                    ask.seconds
                );
                info!("{line}");
            }
            (deep_ask::Reason::Suspicion, true) => info!(
                agents = ids.len(),
                seconds = ask.seconds,
                "deep probes kept on: the suspect is not classed yet"
            ),
            (reason, _) => {
                let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let why = match (reason, sd) {
                    (deep_ask::Reason::Slowdown, Some(sd)) => format!(
                        "SLOWER job step {:.1} ms vs {:.1} ms before (iteration {}) with no rank named",
                        sd.recent_ms, sd.baseline_ms, sd.iteration
                    ),
                    _ => "SUSPECT a rank's GPU work runs long; a slow GPU or a slow NIC, only GPU-side times tell".into(),
                };
                let line = format!(
                    "{now} {why}: deep probes on {} agent(s) for {} s",
                    ids.len(),
                    ask.seconds
                );
                info!("{line}");
                if self.cfg.print_alerts {
                    println!("{line}");
                }
            }
        }
        self.deep_window_everywhere(ids, ask.seconds);
    }

    /// A deep window of `seconds` on every rank of each agent.
    pub(super) fn deep_window_everywhere(&self, ids: Vec<String>, seconds: u32) {
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

//! Alerts: one stdout line per verdict event, a webhook and an exec hook.
//!
//! Hooks run on one worker thread behind a bounded queue, so a slow or dead
//! webhook never holds up ingest: when the queue is full the event is dropped
//! and counted. Every failure is logged and counted for `/metrics`.

use std::{
    io::Write,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{sync_channel, Receiver, SyncSender, TrySendError},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use chrono::{DateTime, SecondsFormat, Utc};

use crate::verdict::{EventKind, VerdictEvent};

/// Events waiting for the hooks before new ones are dropped.
const HOOK_QUEUE: usize = 256;

/// One hook payload (webhook body, exec stdin) is at most this long. A
/// hang's lists are cut to [`crate::join::HANG_LIST_MAX`] entries (its
/// `summary` counts them all, with rank ranges), which keeps a payload to a
/// few KiB; should the rest still exceed this, the verdict and hang
/// details go and the alert line stays. Either cut is said in `truncated`,
/// as in `report.json`. A 4,096-member list made a 600 KB POST per event.
pub const MAX_HOOK_PAYLOAD_BYTES: usize = 256 << 10;

/// `event` as the hooks get it, within [`MAX_HOOK_PAYLOAD_BYTES`].
pub fn hook_payload(event: &VerdictEvent) -> Result<serde_json::Value, serde_json::Error> {
    let mut json = serde_json::to_value(event)?;
    let mut left_out = serde_json::Map::new();
    for list in ["missing", "present_ranks"] {
        if let Some(serde_json::Value::Array(a)) = json.pointer_mut(&format!("/hang/{list}")) {
            if a.len() > crate::join::HANG_LIST_MAX {
                let n = a.len() - crate::join::HANG_LIST_MAX;
                a.truncate(crate::join::HANG_LIST_MAX);
                left_out.insert(format!("hang.{list}"), n.into());
            }
        }
    }
    if json.to_string().len() > MAX_HOOK_PAYLOAD_BYTES {
        for part in ["verdict", "hang"] {
            if let Some(v) = json.get_mut(part).filter(|v| !v.is_null()) {
                *v = serde_json::Value::Null;
                left_out.insert(part.to_owned(), 1.into());
            }
        }
    }
    if !left_out.is_empty() {
        json["truncated"] = serde_json::json!({
            "bound_bytes": MAX_HOOK_PAYLOAD_BYTES,
            "left_out": left_out,
        });
    }
    Ok(json)
}

#[derive(Debug, Clone)]
pub struct HookConfig {
    /// POST each event's JSON here.
    pub webhook: Option<String>,
    /// Run `sh -c CMD` per event: JSON on stdin, `SLOWRANK_*` variables.
    pub exec: Option<String>,
    /// Bound on one webhook request and one exec run.
    pub timeout: Duration,
}

/// Hook outcomes, for `/metrics`.
#[derive(Debug, Default)]
pub struct HookStats {
    pub webhook_ok: AtomicU64,
    pub webhook_failed: AtomicU64,
    pub exec_ok: AtomicU64,
    pub exec_failed: AtomicU64,
    /// Events not delivered to the hooks because their queue was full.
    pub dropped: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
enum HookError {
    #[error("HTTP request failed")]
    Http(#[from] ureq::Error),
    #[error("cannot run the exec hook")]
    Spawn(#[source] std::io::Error),
    #[error("exec hook exited with {0}")]
    Status(std::process::ExitStatus),
    #[error("exec hook still running after {0:?}; killed")]
    Timeout(Duration),
}

/// The alert line a tired on-call engineer reads.
pub fn format_line(e: &VerdictEvent, at: DateTime<Utc>) -> String {
    let time = at.to_rfc3339_opts(SecondsFormat::Secs, true);
    let Some(v) = &e.verdict else {
        return format!("{time} {}", e.line);
    };
    let tag = match e.event {
        EventKind::Opened => "OPEN  ",
        EventKind::Reopened => "REOPEN",
        EventKind::Reclassified => "CLASS ",
        EventKind::Closed => "CLOSED",
        EventKind::HangDetected => "HANG  ",
        EventKind::HangResolved => "UNHANG",
    };
    let at_iteration = e.iteration.map_or("?".into(), |i| i.to_string());
    let status = if e.event == EventKind::Closed {
        format!("cleared at iteration {at_iteration}")
    } else if e.event == EventKind::Reclassified {
        format!(
            "class changed at iteration {at_iteration}, since iteration {}",
            v.first_seen_iteration
        )
    } else {
        format!("since iteration {}", v.first_seen_iteration)
    };
    let mut line = format!(
        "{time} {tag} {} · confidence {:.2} · lost {:.2} GPU-s · {status} · clock ±{:.0} µs",
        v.headline(),
        v.confidence,
        v.lost_gpu_seconds,
        v.clock_error_us
    );
    if let Some(ev) = v.evidence.first() {
        line.push_str(" · ");
        line.push_str(ev);
    }
    line
}

/// Sends events to the configured hooks on a worker thread.
pub struct Hooks {
    tx: Option<SyncSender<serde_json::Value>>,
    worker: Option<JoinHandle<()>>,
    stats: Arc<HookStats>,
}

impl Hooks {
    pub fn start(cfg: HookConfig) -> Self {
        let stats = Arc::new(HookStats::default());
        if cfg.webhook.is_none() && cfg.exec.is_none() {
            return Self {
                tx: None,
                worker: None,
                stats,
            };
        }
        let (tx, rx) = sync_channel(HOOK_QUEUE);
        let st = stats.clone();
        let worker = std::thread::Builder::new()
            .name("slowrank-hooks".into())
            .spawn(move || worker(cfg, rx, &st))
            .ok();
        Self {
            tx: Some(tx),
            worker,
            stats,
        }
    }

    pub fn stats(&self) -> Arc<HookStats> {
        self.stats.clone()
    }

    /// Queues one event; never blocks.
    pub fn send(&self, event: &VerdictEvent) {
        let Some(tx) = &self.tx else { return };
        let json = match hook_payload(event) {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!("cannot serialize verdict event for hooks: {e}");
                return;
            }
        };
        match tx.try_send(json) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("alert hooks are behind; event dropped");
            }
        }
    }

    /// Delivers what is queued (each delivery bounded by the timeout), then stops.
    pub fn finish(mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn worker(cfg: HookConfig, rx: Receiver<serde_json::Value>, stats: &HookStats) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(cfg.timeout))
        .build()
        .into();
    while let Ok(event) = rx.recv() {
        if let Some(url) = &cfg.webhook {
            match post(&agent, url, &event) {
                Ok(()) => stats.webhook_ok.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(%url, "webhook failed: {e}: {}", source_chain(&e));
                    stats.webhook_failed.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
        if let Some(cmd) = &cfg.exec {
            match exec(cmd, &event, cfg.timeout) {
                Ok(()) => stats.exec_ok.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(%cmd, "exec hook failed: {e}: {}", source_chain(&e));
                    stats.exec_failed.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }
}

/// The `source()` chain of an error, for one log line.
pub fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&c.to_string());
        s.push_str("; ");
        cur = c.source();
    }
    s
}

fn post(agent: &ureq::Agent, url: &str, event: &serde_json::Value) -> Result<(), HookError> {
    agent
        .post(url)
        .header("content-type", "application/json")
        .send(event.to_string())?;
    Ok(())
}

fn env_str(event: &serde_json::Value, path: &[&str]) -> String {
    let mut v = event;
    for p in path {
        v = &v[*p];
    }
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn exec(cmd: &str, event: &serde_json::Value, timeout: Duration) -> Result<(), HookError> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("SLOWRANK_EVENT", env_str(event, &["event"]))
        .env("SLOWRANK_LINE", env_str(event, &["line"]))
        .env("SLOWRANK_RANK", env_str(event, &["verdict", "rank"]))
        .env("SLOWRANK_HOST", env_str(event, &["verdict", "host"]))
        .env("SLOWRANK_KIND", env_str(event, &["verdict", "kind"]))
        .env(
            "SLOWRANK_CONFIDENCE",
            env_str(event, &["verdict", "confidence"]),
        )
        .stdin(Stdio::piped())
        .spawn()
        .map_err(HookError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that ignores stdin closes the pipe early; that is fine.
        let _ = stdin.write_all(event.to_string().as_bytes());
    }
    let start = Instant::now();
    loop {
        match child.try_wait().map_err(HookError::Spawn)? {
            Some(s) if s.success() => return Ok(()),
            Some(s) => return Err(HookError::Status(s)),
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HookError::Timeout(timeout));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::EventKind;

    fn event() -> VerdictEvent {
        VerdictEvent {
            event: EventKind::HangDetected,
            iteration: Some(7),
            verdict: None,
            hang: None,
            line: "HANG rank 3 never reached all_reduce #120".into(),
        }
    }

    #[test]
    fn a_hook_payload_lists_a_large_hang_in_short_and_says_what_it_cut() {
        use crate::join::{HangCandidate, InstanceKey, MissingMember, MissingSummary};
        let mut e = event();
        let missing: Vec<MissingMember> = (1..=4096)
            .map(|r| MissingMember {
                rank: r,
                rank_in_comm: r,
                host: format!("node-{}", r / 8),
                last_seq_seen: Some(119),
                last_completed_seq: Some(119),
            })
            .collect();
        e.hang = Some(HangCandidate {
            comm_id: 1,
            key: InstanceKey::Coll(120),
            op: slowrank_shared::wire::CollOp::AllReduce,
            comm_nranks: 4097,
            entered_at: 0,
            first_host: "node-0".into(),
            first_agent_ns: 0,
            present_ranks: vec![0],
            missing,
            summary: Some(MissingSummary::new(4096, (1..=4096).collect())),
        });
        let full = serde_json::to_value(&e).unwrap().to_string().len();
        let p = hook_payload(&e).unwrap();
        let len = p.to_string().len();
        assert!(len < 16 << 10 && len < full / 10, "{len} of {full} bytes");
        assert_eq!(
            p["hang"]["missing"].as_array().unwrap().len(),
            crate::join::HANG_LIST_MAX
        );
        assert_eq!(p["truncated"]["left_out"]["hang.missing"], 4096 - 64);
        assert_eq!(p["hang"]["summary"]["count"], 4096);
        assert_eq!(
            p["hang"]["summary"]["ranges"][0],
            serde_json::json!([1, 4096])
        );
        // A small event is sent as it is.
        let small = hook_payload(&event()).unwrap();
        assert_eq!(small, serde_json::to_value(event()).unwrap());
    }

    #[test]
    fn alert_line_has_time_and_text() {
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            format_line(&event(), at),
            "2026-01-02T03:04:05Z HANG rank 3 never reached all_reduce #120"
        );
    }

    #[test]
    fn exec_hook_gets_json_on_stdin_and_env() {
        let dir = std::env::temp_dir().join(format!("slowrank-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("event.json");
        let env = dir.join("env.txt");
        let hooks = Hooks::start(HookConfig {
            webhook: None,
            exec: Some(format!(
                "cat > {} && echo \"$SLOWRANK_EVENT\" > {}",
                out.display(),
                env.display()
            )),
            timeout: Duration::from_secs(5),
        });
        let stats = hooks.stats();
        hooks.send(&event());
        hooks.finish();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(json["event"], "hang_detected");
        assert_eq!(json["iteration"], 7);
        assert_eq!(
            std::fs::read_to_string(&env).unwrap().trim(),
            "hang_detected"
        );
        assert_eq!(stats.exec_ok.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failing_hooks_are_counted_not_fatal() {
        // Nothing listens on this port: the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let hooks = Hooks::start(HookConfig {
            webhook: Some(format!("http://127.0.0.1:{port}/hook")),
            exec: Some("exit 3".into()),
            timeout: Duration::from_secs(2),
        });
        let stats = hooks.stats();
        hooks.send(&event());
        hooks.send(&event());
        hooks.finish();
        assert_eq!(stats.webhook_failed.load(Ordering::Relaxed), 2);
        assert_eq!(stats.exec_failed.load(Ordering::Relaxed), 2);
        assert_eq!(stats.webhook_ok.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn webhook_posts_the_event_json() {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let addr = server.server_addr().to_ip().unwrap();
        let got = std::thread::spawn(move || {
            let mut req = server.recv().unwrap();
            let mut body = String::new();
            req.as_reader().read_to_string(&mut body).unwrap();
            let method = req.method().to_string();
            req.respond(tiny_http::Response::from_string("ok")).unwrap();
            (method, body)
        });
        let hooks = Hooks::start(HookConfig {
            webhook: Some(format!("http://{addr}/hook")),
            exec: None,
            timeout: Duration::from_secs(5),
        });
        let stats = hooks.stats();
        hooks.send(&event());
        hooks.finish();
        let (method, body) = got.join().unwrap();
        assert_eq!(method, "POST");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["event"], "hang_detected");
        assert_eq!(stats.webhook_ok.load(Ordering::Relaxed), 1);
    }
}

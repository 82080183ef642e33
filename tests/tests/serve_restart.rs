//! A coordinator started again on the same `--out` resumes: batches its
//! earlier life ingested (journaled before they were acknowledged) are
//! known when the agent resends them, and the report says it spans two
//! lives. And `--out` on a full disk: the coordinator keeps serving, counts
//! the failed writes, leaves no temp file and the previous report intact,
//! and writes again once there is room.

mod support;

use std::{
    io::{Read, Write},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use slowrank_agent::{clock::HostClock, ship::client_config, ship::Shipper};
use slowrank_coordinator::{
    net::tls::{Identity, SERVER_NAME},
    serve::{ServeConfig, Server},
};
use slowrank_shared::wire::{self, Batch};
use slowrank_synth::{ClockTruth, Generator, SynthSpec};
use support::*;

/// `n` batches of agent `agent_id` (one synthetic host), seq 1..=n, on the
/// real clock.
fn batches(agent_id: &str, n: u64) -> Vec<Batch> {
    let mut spec = SynthSpec::dp(1, 2);
    spec.clocks = vec![ClockTruth::new(0, 0.0, 0)];
    let mut g = Generator::new(spec);
    let now = slowrank_agent::clock::mono_ns();
    let start = g.spec().start_ns;
    (1..=n)
        .map(|seq| {
            let mut b = g.next_iteration().batches.remove(0).1;
            map_times(&mut b, |t| {
                (now as i128 + t as i128 - start as i128).max(1) as u64
            });
            b.seq = seq;
            b.agent_id = agent_id.into();
            b
        })
        .collect()
}

fn bind(identity: &Identity, out: &Path, write_every: Duration) -> Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap(), TOKEN);
    cfg.out_dir = Some(out.to_path_buf());
    cfg.print_alerts = false;
    cfg.write_every = write_every;
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    Server::bind(cfg, identity).expect("bind")
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("metrics connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("metrics read");
    body
}

async fn send_all(identity: &Identity, addr: std::net::SocketAddr, agent_id: &str, bs: &[Batch]) {
    let client = client_config(identity.cert_pem.as_bytes(), "test CA").unwrap();
    let clock = HostClock::real();
    let agent = Shipper::connect(
        addr,
        SERVER_NAME,
        client,
        &hello("node-0", agent_id, TOKEN, &clock),
    )
    .await
    .expect("agent accepted");
    for b in bs {
        // Waits for the coordinator's answer: ingested (and journaled).
        agent
            .send_encoded(&wire::encode(b).unwrap())
            .await
            .expect("batch answered");
    }
    agent.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_life_knows_what_the_first_ingested() {
    let identity = Identity::generate().expect("identity");
    let out = scratch("serve-restart");
    let all = batches("agent-0", 8);

    let first = bind(&identity, &out, Duration::from_secs(60));
    let addr = first.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let life1 = spawn_on_own_runtime(first, async move {
        let _ = stopped.await;
    });
    send_all(&identity, addr, "agent-0", &all[..5]).await;
    let _ = stop.send(());
    let s1 = life1.await.expect("life 1").expect("serve");
    assert_eq!(s1.report.ingest.counters.batches, 5);

    // The agent never saw the answers to 4 and 5 (say): it sends them again.
    let second = bind(&identity, &out, Duration::from_secs(60));
    let addr = second.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let life2 = spawn_on_own_runtime(second, async move {
        let _ = stopped.await;
    });
    send_all(&identity, addr, "agent-0", &all[3..]).await;
    let _ = stop.send(());
    let s2 = life2.await.expect("life 2").expect("serve");
    let c = &s2.report.ingest.counters;
    assert_eq!(
        (c.batches, c.duplicate_batches, c.missing_batches),
        (3, 2, 0),
        "{c:?}"
    );
    let info = s2.report.resumed.as_ref().expect("spans two lives");
    assert_eq!(info.lives, 2);
    assert_eq!(info.earlier_ingest.batches, 5);
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(on_disk["resumed"]["lives"], 2);
    let _ = std::fs::remove_dir_all(&out);
}

/// A tmpfs of `kib` KiB at `dir` (root only), unmounted on drop.
struct Tmpfs(std::path::PathBuf);
impl Tmpfs {
    fn mount(dir: &Path, kib: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount");
        assert!(ok.success(), "mount tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fills the file system of `dir` with `dir/filler` until a write fails.
fn fill(dir: &Path) {
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_keeps_serving_and_the_last_report() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "needs root (mount) under CI"
        );
        eprintln!(
            "SKIPPED full_disk_keeps_serving_and_the_last_report: needs root to mount a tmpfs"
        );
        return;
    }
    let identity = Identity::generate().expect("identity");
    let base = scratch("full-disk");
    let out = base.join("out");
    let fs = Tmpfs::mount(&out, 512);
    let server = bind(&identity, &out, Duration::from_millis(100));
    let (addr, metrics) = (server.local_addr().unwrap(), server.metrics_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let life = spawn_on_own_runtime(server, async move {
        let _ = stopped.await;
    });
    let report = out.join("report.json");
    wait_for("first report", Duration::from_secs(20), || report.is_file());
    fill(&out);
    let before = std::fs::read(&report).unwrap();
    let failures = || {
        scrape(metrics)
            .lines()
            .find(|l| l.starts_with("slowrank_out_write_failures_total{what=\"reports\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Batches on a full disk: still ingested and answered.
    send_all(&identity, addr, "agent-0", &batches("agent-0", 3)).await;
    wait_for("a counted failed write", Duration::from_secs(20), || {
        failures() >= 2
    });
    assert!(
        temp_files(&out).is_empty(),
        "temp files left: {:?}",
        temp_files(&out)
    );
    assert_eq!(
        std::fs::read(&report).unwrap(),
        before,
        "the previous report was damaged"
    );
    let body = scrape(metrics);
    assert!(
        body.contains("slowrank_ingest_total{what=\"batches\"} 3"),
        "{body}"
    );
    // Room again: the report catches up.
    std::fs::remove_file(out.join("filler")).unwrap();
    wait_for("a report written again", Duration::from_secs(20), || {
        std::fs::read_to_string(&report)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|r| r["ingest"]["batches"] == 3)
    });
    let _ = stop.send(());
    life.await.expect("serve").expect("serve");
    assert!(temp_files(&out).is_empty());
    // Unmount first: a mount point cannot be removed, and `base` was left
    // behind in /tmp on every run while `fs` outlived this line.
    drop(fs);
    let _ = std::fs::remove_dir_all(&base);
}

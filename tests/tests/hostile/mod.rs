//! Attack kit for the hostile-peer tests: a real `slowrank serve` process
//! on loopback, its RSS, a legitimate agent sending at a steady rate
//! beside the attack (how many of its batches are answered), and raw QUIC
//! clients that do what an attacker would.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use slowrank_agent::{
    clock::{self, HostClock},
    ship::{client_config, client_config_with, ClientIdentity, Shipper},
};
use slowrank_coordinator::net::tls::SERVER_NAME;
use slowrank_shared::wire::{self, Batch, Hello, RankIdentity};

pub const TOKEN: &str = "hostile-token";

/// The legitimate agent's steady rate (batches per second): a real agent
/// cuts ≈ 10 a second; 40 keeps the measurement quick yet far below what
/// the coordinator can take.
pub const LEGIT_RATE: u32 = 40;

/// How late a batch may be ingested and still count for the rate: the
/// analyzer closes an iteration's collectives after 3 s (the hang
/// timeout); a batch later than that has lost its use.
pub const GRACE: Duration = Duration::from_secs(3);

/// A legitimate agent beside an attack keeps at least this share of its
/// normal ingest rate (the bar).
pub const MIN_RATE_SHARE: f64 = 0.9;

/// `slowrank serve` as its own process.
pub struct Coord {
    pub child: Child,
    pub dir: PathBuf,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    pub ca_pem: String,
}

impl Coord {
    /// Starts the coordinator binary (built by `cargo build -p
    /// slowrank-coordinator`, or SLOWRANK_COORDINATOR_BIN) on ephemeral
    /// loopback ports, reports under its own scratch dir.
    pub fn start(name: &str) -> Coord {
        Self::launch(name, None)
    }

    /// The same under mutual TLS with no token: `slowrank certs --hosts`
    /// issues one agent certificate per host of `hosts` first
    /// ([`Coord::client_as`]).
    pub fn start_mtls(name: &str, hosts: &[&str]) -> Coord {
        Self::launch(name, Some(hosts))
    }

    fn launch(name: &str, mtls_hosts: Option<&[&str]>) -> Coord {
        let dir = std::env::temp_dir().join(format!(
            "slowrank-hostile-{name}-{}-{}",
            std::process::id(),
            clock::mono_ns()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let bin = slowrank_scenarios::orchestrate::binary("slowrank")
            .expect("the slowrank binary (cargo build -p slowrank-coordinator)");
        if let Some(hosts) = mtls_hosts {
            let out = Command::new(&bin)
                .arg("certs")
                .arg("--out")
                .arg(dir.join("tls"))
                .arg("--hosts")
                .arg(hosts.join(","))
                .output()
                .expect("run slowrank certs");
            assert!(
                out.status.success(),
                "slowrank certs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut serve = Command::new(bin);
        serve
            .args(["serve", "--listen", "127.0.0.1:0", "--clock-port", "0"])
            .arg("--tls-dir")
            .arg(dir.join("tls"))
            .arg("--out")
            .arg(dir.join("out"))
            .args(["--metrics-listen", "127.0.0.1:0", "--write-every", "1"]);
        match mtls_hosts {
            // The certificate is the credential.
            Some(_) => serve.env_remove("SLOWRANK_TOKEN"),
            None => serve.env("SLOWRANK_TOKEN", TOKEN),
        };
        let mut child = serve
            .env(
                "RUST_LOG",
                std::env::var("HOSTILE_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start slowrank serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = dir.join("coordinator.log");
        std::thread::spawn(move || {
            let mut out = std::fs::File::create(log).expect("log file");
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(out, "{line}");
                let _ = tx.send(line);
            }
        });
        let (mut addr, mut metrics) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while addr.is_none() || metrics.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).expect("coordinator start-up lines");
            let word_after = |key: &str| {
                line.split(key)
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .map(|w| w.trim_end_matches("/metrics").to_owned())
            };
            if let Some(w) = word_after("listening on ") {
                addr = w.parse().ok();
            }
            if let Some(w) = word_after("metrics at http://") {
                metrics = w.parse().ok();
            }
        }
        // Under mutual TLS the coordinator's certificate is signed by the
        // job CA, which is what agents trust.
        let ca = if mtls_hosts.is_some() {
            "ca.crt"
        } else {
            "coordinator.crt"
        };
        let ca_pem = std::fs::read_to_string(dir.join("tls").join(ca)).expect("CA file");
        Coord {
            child,
            dir,
            addr: addr.unwrap(),
            metrics: metrics.unwrap(),
            ca_pem,
        }
    }

    /// Resident memory of the coordinator now, in bytes.
    pub fn rss(&self) -> u64 {
        rss_of(self.child.id())
    }

    /// One `/metrics` scrape (body and headers).
    pub fn scrape(&self) -> String {
        scrape(self.metrics)
    }

    /// A counter's value from `/metrics` (0 when absent).
    pub fn metric(&self, series: &str) -> u64 {
        metric(&self.scrape(), series)
    }

    /// The last report.json written.
    pub fn report(&self) -> serde_json::Value {
        let path = self.dir.join("out").join("report.json");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Waits (bounded) for `f` to hold on the latest report.
    pub fn wait_report(
        &self,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = self.report();
            if f(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "report never showed {what}: {r:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn client(&self) -> quinn::ClientConfig {
        client_config(self.ca_pem.as_bytes(), "coordinator CA").expect("client config")
    }

    /// The client an agent on `host` runs with under mutual TLS: the files
    /// `slowrank certs --hosts` wrote for it, read as `slowrank-agent --cert
    /// --key` reads them.
    pub fn client_as(&self, host: &str) -> quinn::ClientConfig {
        let agents = self.dir.join("tls").join("agents");
        let cert = std::fs::read(agents.join(format!("{host}.crt"))).expect("host certificate");
        let key = std::fs::read(agents.join(format!("{host}.key"))).expect("host key");
        client_config_with(
            self.ca_pem.as_bytes(),
            "ca.crt",
            Some(ClientIdentity {
                cert_pem: &cert,
                key_pem: &key,
                name: host,
            }),
        )
        .expect("client config")
    }
}

impl Drop for Coord {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() && std::env::var_os("HOSTILE_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("coordinator files kept in {}", self.dir.display());
        }
    }
}

pub fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Largest RSS of `pid` seen while it runs in the background, until stopped.
pub struct RssWatch {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl RssWatch {
    pub fn start(pid: u32) -> Self {
        let (stop, max) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, m) = (stop.clone(), max.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(rss_of(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            stop,
            max,
            handle: Some(handle),
        }
    }

    /// The largest RSS seen, in bytes.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

pub fn scrape(addr: SocketAddr) -> String {
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

pub fn metric(body: &str, series: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

pub fn hello(host: &str, agent_id: &str, token: &str) -> Hello {
    Hello {
        token: token.to_owned(),
        host: host.to_owned(),
        agent_id: agent_id.to_owned(),
        mono_ns: clock::mono_ns(),
        wall_ns: clock::wall_ns(),
    }
}

pub fn identity(rank: u32, world_size: u32, restart_count: u32) -> RankIdentity {
    RankIdentity {
        pid: 1000 + rank,
        rank,
        world_size,
        local_rank: rank,
        local_world_size: world_size,
        group_rank: 0,
        restart_count,
        job_id: "hostile-job".into(),
        seen_ns: clock::mono_ns(),
    }
}

/// A batch of `agent_id` on `host` numbered `seq`, cut now.
pub fn batch(host: &str, agent_id: &str, seq: u64, ranks: Vec<RankIdentity>) -> Batch {
    Batch {
        host: host.into(),
        agent_id: agent_id.into(),
        seq,
        mono_ns: clock::mono_ns(),
        wall_ns: clock::wall_ns(),
        ranks,
        ..Default::default()
    }
}

/// A connected agent that answers clock probes like a real one.
pub async fn connect(coord: &Coord, host: &str, agent_id: &str) -> Result<Shipper, String> {
    let s = Shipper::connect(
        coord.addr,
        SERVER_NAME,
        coord.client(),
        &hello(host, agent_id, TOKEN),
    )
    .await
    .map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    s.spawn_control(HostClock::real(), tx);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    Ok(s)
}

/// The legitimate agent: sends one batch every 1/[`LEGIT_RATE`] s and
/// waits for each answer; counts the answered ones. It runs on its own
/// runtime thread, so the attack's client work in this process does not
/// slow it: what it measures is the coordinator.
pub struct Legit {
    pub answered: Arc<AtomicU64>,
    pub seq: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Legit {
    pub async fn start(
        coord: &Coord,
        host: &str,
        agent_id: &str,
        ranks: Vec<RankIdentity>,
    ) -> Legit {
        let (answered, seq, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (a, q, st) = (answered.clone(), seq.clone(), stop.clone());
        let (host, agent_id) = (host.to_owned(), agent_id.to_owned());
        let (addr, client) = (coord.addr, coord.client());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("legit runtime");
            rt.block_on(async move {
                let s = match Shipper::connect(
                    addr,
                    SERVER_NAME,
                    client,
                    &hello(&host, &agent_id, TOKEN),
                )
                .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let (tx, mut rx) = tokio::sync::mpsc::channel(8);
                s.spawn_control(HostClock::real(), tx);
                tokio::spawn(async move { while rx.recv().await.is_some() {} });
                let _ = ready_tx.send(Ok(()));
                // Batches are cut on schedule whatever the coordinator does
                // (a real agent spools what it cannot send yet) and sent
                // pipelined like the real agent (`SEND_WINDOW` unanswered at
                // most); answers count as they come.
                let (cut_tx, mut cut_rx) = tokio::sync::mpsc::unbounded_channel();
                let (host2, id2, st2, q2) = (host.clone(), agent_id.clone(), st.clone(), q.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs(1) / LEGIT_RATE);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                    while !st2.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let n = q2.fetch_add(1, Ordering::Relaxed) + 1;
                        let b = batch(&host2, &id2, n, ranks.clone());
                        if cut_tx.send(wire::encode(&b).unwrap()).is_err() {
                            break;
                        }
                    }
                });
                let window = Arc::new(tokio::sync::Semaphore::new(
                    slowrank_agent::ship::SEND_WINDOW,
                ));
                while let Some(bytes) = cut_rx.recv().await {
                    if st.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(permit) = window.clone().acquire_owned().await else {
                        break;
                    };
                    let Ok(pending) = s.begin_send(&bytes).await else {
                        continue;
                    };
                    let a = a.clone();
                    tokio::spawn(async move {
                        if pending.answer().await.is_ok() {
                            a.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(permit);
                    });
                }
                s.close().await;
            });
        });
        ready_rx
            .await
            .expect("legit agent thread")
            .expect("the legitimate agent is accepted");
        Legit {
            answered,
            seq,
            stop,
            thread: Some(thread),
        }
    }

    /// The agent's ingest rate over the next `d`: batches it cut in that
    /// time that the coordinator ingested by the end of a grace period
    /// after it, per second (a batch waiting longer is as good as lost to
    /// the analysis, which judges iterations seconds old).
    pub async fn rate_over(&self, d: Duration) -> f64 {
        self.rate_during(tokio::time::sleep(d)).await.0
    }

    /// The same over the time `f` takes (an attack), and `f`'s output.
    pub async fn rate_during<F: std::future::Future>(&self, f: F) -> (f64, F::Output) {
        let (s0, t0) = (self.seq.load(Ordering::Relaxed), Instant::now());
        let out = f.await;
        let (s1, took) = (self.seq.load(Ordering::Relaxed), t0.elapsed());
        let grace = Instant::now() + GRACE;
        while self.answered.load(Ordering::Relaxed) < s1 && Instant::now() < grace {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let unanswered = s1.saturating_sub(self.answered.load(Ordering::Relaxed));
        let rate = (s1 - s0).saturating_sub(unanswered) as f64 / took.as_secs_f64();
        (rate, out)
    }

    /// Stops sending and closes the connection.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Legit {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A bare QUIC connection from `from` (another loopback address lets an
/// attacker be a different source than the legitimate agent).
pub async fn raw_connect(
    coord: &Coord,
    from: &str,
) -> Result<(quinn::Endpoint, quinn::Connection), String> {
    raw_connect_with(coord, from, coord.client()).await
}

/// The same with the given client (a certificate under mutual TLS).
pub async fn raw_connect_with(
    coord: &Coord,
    from: &str,
    client: quinn::ClientConfig,
) -> Result<(quinn::Endpoint, quinn::Connection), String> {
    let mut ep =
        quinn::Endpoint::client(format!("{from}:0").parse().unwrap()).map_err(|e| e.to_string())?;
    ep.set_default_client_config(client);
    let conn = ep
        .connect(coord.addr, SERVER_NAME)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    Ok((ep, conn))
}

/// Says hello on a raw connection; the coordinator's answer.
pub async fn raw_hello(conn: &quinn::Connection, h: &Hello) -> Result<wire::HelloReply, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(&wire::encode(h).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let _ = send.finish();
    let bytes = recv.read_to_end(4096).await.map_err(|e| e.to_string())?;
    wire::decode(&bytes).map_err(|e| e.to_string())
}

/// Sends one batch on a raw connection and waits for the answer byte.
pub async fn raw_send(conn: &quinn::Connection, b: &Batch) -> Result<u8, String> {
    raw_send_bytes(conn, &wire::encode(b).unwrap()).await
}

/// The same with the batch already encoded (an attacker encodes on its
/// own machine: encoding inside the measured window would take this
/// process's CPU from the legitimate agent, not the coordinator's).
pub async fn raw_send_bytes(conn: &quinn::Connection, bytes: &[u8]) -> Result<u8, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(bytes).await.map_err(|e| e.to_string())?;
    let _ = send.finish();
    let got = tokio::time::timeout(Duration::from_secs(20), recv.read_to_end(8))
        .await
        .map_err(|_| "no answer in 20 s".to_owned())?
        .map_err(|e| e.to_string())?;
    got.first().copied().ok_or_else(|| "empty answer".into())
}

/// `n` repetitions of a hostile test, for the record: HOSTILE_REPEAT=10
/// runs each attack ten times in one test run.
pub fn repetitions() -> usize {
    std::env::var("HOSTILE_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Whether `during` is at least [`MIN_RATE_SHARE`] of the agent's normal
/// rate. Normal is what it cuts ([`LEGIT_RATE`]): a measured rate above
/// that is a catch-up burst after a stall, not a higher baseline.
pub fn keeps_rate(during: f64, measured_normal: f64) -> bool {
    during >= MIN_RATE_SHARE * measured_normal.min(f64::from(LEGIT_RATE))
}

pub fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

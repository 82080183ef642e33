//! The QUIC server agents send batches to.
//!
//! Per connection: the agent opens a bidirectional stream with [`Hello`]
//! (job token); a wrong token, a late or malformed hello, a host or agent
//! id other than the agent's certificate is bound to (mutual TLS with
//! per-host certificates), or an agent id or host another live connection
//! holds is refused, logged (rate-limited) and counted by reason. Until then the connection has a tiny receive window
//! and one stream, and connections waiting for their hello are capped per
//! source address and in total ([`crate::net::admission`]). Then every
//! bidirectional stream carries one batch; streams are read concurrently,
//! each within a deadline and a memory budget, and forwarded in order. Each batch is validated by
//! [`wire::decode`] (header, version, size cap, bytecheck) before anything
//! reads it; a bad one is rejected with its reason and counted, and the
//! connection keeps serving. Nothing an agent sends can stop the server.
//! Alongside, a control stream per agent ([`crate::net::control`]) probes its
//! clock and carries deep-probe window requests ([`Ingest::send_control`]).

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use dashmap::DashMap;
use quinn::{Connection, Endpoint, Incoming};
use rustls::pki_types::CertificateDer;
use slowrank_shared::wire::{
    self, Batch, Control, Hello, HelloReply, HEADER_LEN, MAX_MESSAGE_BYTES,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

pub use crate::net::events::{Ack, IngestEvent};
use crate::net::tls::{Identity, TlsError};
use crate::{
    net::admission::{LiveClaims, LogLimiter, PreauthGate, PreauthRefusal, WaitLine},
    net::clockport::ClockPortServer,
    net::control::{self, ProbeSchedule},
};

mod handshake;
mod order;
mod stream;
use order::forward_in_order;
#[cfg(test)]
use order::{Forward, OrderGate, StreamReadKind};

use handshake::handshake;
use stream::read_batch;

/// Largest hello accepted: a token, a host name, an agent id and two
/// times take a few hundred bytes; this is all a stranger can make us buffer.
const MAX_HELLO: usize = 8 * 1024;
/// From the QUIC handshake's end to the whole hello read: the deadline
/// covers reading it too, so a hello stream opened and never finished
/// cannot pin its connection.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connection-level receive window before the hello is accepted: the hello
/// fits, nothing else does (QUIC's default is unlimited — 100 streams of
/// 1.25 MB each, ≈ 120 MB pinned per stranger's connection).
const PREAUTH_RECEIVE_WINDOW: u32 = 2 * MAX_HELLO as u32;
/// Streams a peer may open before its hello is accepted: the hello's.
const PREAUTH_STREAMS: u32 = 1;
/// Connection-level receive window of an accepted agent: two of the largest
/// batches in flight, so an agent's pipelined batches keep flowing while
/// memory per agent stays bounded.
const AGENT_RECEIVE_WINDOW: u32 = 2 * (HEADER_LEN + MAX_MESSAGE_BYTES) as u32;
/// Per-stream receive window: a 16 MiB batch arrives in a few round trips.
const STREAM_RECEIVE_WINDOW: u32 = 4 << 20;
/// Batch streams an accepted agent may have open at once: its pipeline
/// (`node-agent`'s `SEND_WINDOW`, 8) twice over.
const AGENT_STREAMS: u32 = 16;
/// One batch must arrive within this once its stream is open: a stream
/// left unfinished is dropped (and counted) instead of holding a slot.
const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Handshakes quinn buffers packets for before they are accepted or
/// refused, and the bytes it buffers for each and in total (its defaults:
/// 65,536 handshakes, 10 MiB each, 100 MiB in all).
const MAX_INCOMING: usize =
    crate::net::admission::MAX_PREAUTH_TOTAL as usize + crate::net::admission::MAX_WAITING;
const INCOMING_BUFFER: u64 = 64 * 1024;
const INCOMING_BUFFER_TOTAL: u64 = 16 << 20;
/// Memory for batches between their stream and their answer (read,
/// decoded, queued, being ingested), in KiB: each batch holds twice its
/// wire size (the bytes, then the decoded batch) from its header until it
/// is answered. Whatever agents send, batches in flight stay within this.
const BATCH_BUDGET_KIB: u32 = 256 * 1024;
/// The share of it one connection may hold: three of the largest batches,
/// so one agent (or one token holder) cannot take the budget from the rest.
const CONN_BUDGET_KIB: u32 = 3 * batch_kib(MAX_MESSAGE_BYTES);

/// KiB of budget a batch of `declared` archive bytes holds.
const fn batch_kib(declared: usize) -> u32 {
    (2 * (HEADER_LEN + declared)).div_ceil(1024) as u32
}

/// Agent ids remembered in the per-agent counters; past this the longest
/// gone is forgotten (a peer cycling through ids must not grow the map).
pub const MAX_AGENTS_REMEMBERED: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("TLS setup failed")]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// One connected (or formerly connected) agent.
#[derive(Debug, Clone, Default)]
pub struct AgentState {
    pub host: String,
    pub connected: bool,
    pub batches: u64,
    pub last_seq: Option<u64>,
    pub rejected: u64,
}

/// Counters for /metrics and the report; shared with the accept loop.
#[derive(Debug, Default)]
pub struct IngestStats {
    pub batches_ok: AtomicU64,
    pub bytes_ok: AtomicU64,
    pub refused_agents: AtomicU64,
    /// The same refusals by reason ([`IngestStats::refuse`]).
    pub refused: DashMap<String, u64>,
    /// Agents dropped from `agents` to keep it bounded.
    pub agents_forgotten: AtomicU64,
    /// Rejections by reason class (`WireError::class`, "oversized", ...).
    pub rejected: DashMap<String, u64>,
    pub agents: DashMap<String, AgentState>,
    /// Clock-port datagrams dropped (foreign, bad MAC, stale, …).
    pub clock_datagrams_dropped: Arc<AtomicU64>,
}

impl IngestStats {
    fn reject(&self, agent_id: &str, reason: &str) {
        *self.rejected.entry(reason.to_owned()).or_default() += 1;
        if let Some(mut a) = self.agents.get_mut(agent_id) {
            a.rejected += 1;
        }
    }
    /// Counts a refused connection under `reason`; the total first, so
    /// whoever sees the refusal also sees it in the stats.
    pub fn refuse(&self, reason: &str) {
        self.refused_agents.fetch_add(1, Ordering::Relaxed);
        *self.refused.entry(reason.to_owned()).or_default() += 1;
    }
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().map(|e| *e.value()).sum()
    }
}

/// Control-stream senders of the connected agents, by agent id.
type Controls = DashMap<String, mpsc::Sender<Control>>;

/// What every connection task shares.
struct Shared {
    token: Arc<str>,
    stats: Arc<IngestStats>,
    controls: Arc<Controls>,
    schedule: ProbeSchedule,
    clock_port: Option<Arc<ClockPortServer>>,
    gate: Mutex<PreauthGate>,
    /// Connections that found the gate full, waiting for a place.
    line: Mutex<WaitLine<quinn::Incoming>>,
    /// Told each time a pre-hello place is given back.
    freed: tokio::sync::Notify,
    claims: Mutex<LiveClaims>,
    /// [`BATCH_BUDGET_KIB`], shared by every connection (waiters are
    /// served in turn, so each connection gets its share).
    budget: Arc<Semaphore>,
    /// One rate limit per refusal reason.
    log_limits: Mutex<HashMap<&'static str, LogLimiter>>,
}

impl Shared {
    /// Counts a refusal and logs it, at most once per
    /// [`crate::net::admission::LOG_EVERY`] per reason.
    fn refused(&self, label: &'static str, remote: SocketAddr, detail: &str) {
        self.stats.refuse(label);
        let allow = lock(&self.log_limits)
            .entry(label)
            .or_default()
            .allow(control::coord_now_ns());
        if let Some(held_back) = allow {
            warn!(%remote, reason = label, held_back, "refused connection: {detail}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pre-hello connection's place in the [`PreauthGate`], given back when
/// it says hello or goes away.
struct PreauthSlot<'a> {
    shared: &'a Shared,
    ip: IpAddr,
    held: bool,
}

impl PreauthSlot<'_> {
    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            lock(&self.shared.gate).release(self.ip);
            self.shared.freed.notify_one();
        }
    }
}

impl Drop for PreauthSlot<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The server's transport: tight before the hello (see the constants),
/// widened per connection once it is accepted ([`open_up`]).
fn server_transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.receive_window(PREAUTH_RECEIVE_WINDOW.into())
        .stream_receive_window(STREAM_RECEIVE_WINDOW.into())
        .max_concurrent_bidi_streams(PREAUTH_STREAMS.into())
        .max_concurrent_uni_streams(0u32.into())
        // Liveness: a silent agent (killed, host gone) is let go after
        // AGENT_SILENCE_TIMEOUT; keep-alives keep a quiet live one.
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(quinn::IdleTimeout::try_from(AGENT_SILENCE_TIMEOUT).ok());
    t
}

/// An accepted agent gets the windows and streams its pipeline needs.
fn open_up(conn: &Connection) {
    conn.set_receive_window(AGENT_RECEIVE_WINDOW.into());
    conn.set_max_concurrent_bi_streams(AGENT_STREAMS.into());
}

/// The listening server.
pub struct Ingest {
    endpoint: Endpoint,
    shared: Arc<Shared>,
}

impl Ingest {
    /// Binds the UDP socket; `token` is the job token agents must present.
    pub fn bind(addr: SocketAddr, identity: &Identity, token: &str) -> Result<Self, IngestError> {
        Self::bind_with(addr, identity, token, ProbeSchedule::default())
    }

    /// Same, with a custom clock-probe schedule.
    pub fn bind_with(
        addr: SocketAddr,
        identity: &Identity,
        token: &str,
        schedule: ProbeSchedule,
    ) -> Result<Self, IngestError> {
        let bind_err = |source| IngestError::Bind { addr, source };
        let socket = udp_socket(addr).map_err(bind_err)?;
        let mut server = identity.server_config()?;
        server
            .transport_config(Arc::new(server_transport()))
            .max_incoming(MAX_INCOMING)
            .incoming_buffer_size(INCOMING_BUFFER)
            .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL);
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(bind_err)?;
        let stats = Arc::new(IngestStats::default());
        let clock_port = match schedule.clock_port {
            Some(port) => {
                let at = SocketAddr::new(endpoint.local_addr().map_err(bind_err)?.ip(), port);
                let dropped = stats.clock_datagrams_dropped.clone();
                Some(
                    ClockPortServer::bind(at, dropped)
                        .map_err(|source| IngestError::Bind { addr: at, source })?,
                )
            }
            None => None,
        };
        Ok(Self {
            endpoint,
            shared: Arc::new(Shared {
                token: token.into(),
                stats,
                controls: Arc::new(DashMap::new()),
                schedule,
                clock_port,
                gate: Mutex::new(PreauthGate::default()),
                line: Mutex::new(WaitLine::default()),
                freed: tokio::sync::Notify::new(),
                claims: Mutex::new(LiveClaims::default()),
                budget: Arc::new(Semaphore::new(BATCH_BUDGET_KIB as usize)),
                log_limits: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Sends a control message (deep-probe window) to a connected agent;
    /// false when it is not connected or its queue is full.
    pub fn send_control(&self, agent_id: &str, msg: Control) -> bool {
        self.shared
            .controls
            .get(agent_id)
            .is_some_and(|tx| tx.try_send(msg).is_ok())
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Where the UDP clock port listens, if it is on.
    pub fn clock_port_addr(&self) -> Option<SocketAddr> {
        self.shared
            .clock_port
            .as_ref()
            .and_then(|p| p.local_addr().ok())
    }

    pub fn stats(&self) -> Arc<IngestStats> {
        self.shared.stats.clone()
    }

    /// Stops accepting and closes every connection.
    pub fn close(&self) {
        self.endpoint
            .close(0u32.into(), b"coordinator shutting down");
        if let Some(p) = &self.shared.clock_port {
            p.stop();
        }
    }

    /// Accepts connections until the endpoint is closed, forwarding what they
    /// carry to `events`.
    pub async fn run(&self, events: mpsc::Sender<IngestEvent>) {
        let line = tokio::spawn(serve_line(self.shared.clone(), events.clone()));
        while let Some(incoming) = self.endpoint.accept().await {
            let remote = incoming.remote_address();
            // Capped before the TLS handshake is even answered: a stranger
            // costs nothing past the cap. A full gate lines it up instead.
            let admitted = lock(&self.shared.gate).admit(remote.ip());
            let why = match admitted {
                Ok(()) => {
                    spawn_connection(self.shared.clone(), events.clone(), incoming);
                    continue;
                }
                Err(PreauthRefusal::Total) => {
                    match lock(&self.shared.line).push(Instant::now(), remote.ip(), incoming) {
                        Ok(()) => continue,
                        Err(back) => {
                            back.refuse();
                            PreauthRefusal::Total
                        }
                    }
                }
                Err(why) => {
                    incoming.refuse();
                    why
                }
            };
            self.shared.refused(why.label(), remote, &why.to_string());
        }
        line.abort();
    }
}

/// Serves an admitted connection (its pre-hello place held) in its own task.
fn spawn_connection(shared: Arc<Shared>, events: mpsc::Sender<IngestEvent>, incoming: Incoming) {
    let remote = incoming.remote_address();
    tokio::spawn(async move {
        let slot = PreauthSlot {
            shared: &shared,
            ip: remote.ip(),
            held: true,
        };
        if let Err(reason) = serve_connection(incoming, &shared, &events, slot).await {
            debug!(%remote, "agent connection ended: {reason}");
        }
    });
}

/// Admits the connections waiting in line as pre-hello places come free,
/// and refuses those that waited too long (checked every 100 ms too).
async fn serve_line(shared: Arc<Shared>, events: mpsc::Sender<IngestEvent>) {
    loop {
        tokio::select! {
            () = shared.freed.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let decided = {
            let mut gate = lock(&shared.gate);
            lock(&shared.line).admit(&mut gate, Instant::now())
        };
        for (_, incoming) in decided.admitted {
            spawn_connection(shared.clone(), events.clone(), incoming);
        }
        for (_, incoming, why) in decided.refused {
            let remote = incoming.remote_address();
            incoming.refuse();
            shared.refused(why.label(), remote, &why.to_string());
        }
    }
}

impl Drop for Ingest {
    /// The clock port's reader is a plain thread: tell it to go.
    fn drop(&mut self) {
        if let Some(p) = &self.shared.clock_port {
            p.stop();
        }
    }
}

/// A connection silent this long is closed ("timed out") and its agent shown
/// disconnected. A killed agent (or a dead host) sends nothing more, and
/// operators are promised it is shown gone within 5 s: 4 s of silence plus
/// the event's way to the report. A live agent is never silent that long:
/// both ends send keep-alives every [`KEEP_ALIVE`]. QUIC uses the smaller of
/// the two ends' idle timeouts, so this also bounds the agent's (6 s).
pub const AGENT_SILENCE_TIMEOUT: Duration = Duration::from_secs(4);
/// Four chances per timeout: one lost or late keep-alive on a loaded host
/// does not end a connection.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Tells the agent a batch will never be ingested (no point resending).
/// Receive buffer asked for on the UDP socket. Every agent's packets land
/// in this one socket: at 4,096 ranks (≈ 43 MB/s) the kernel's default
/// 208 KiB overflowed whenever the coordinator was busy for a few
/// milliseconds, dropping ≈ 3,500 datagrams a second, and QUIC's loss
/// recovery then held single agents back for seconds.
const UDP_RECV_BUFFER: usize = 16 << 20;

fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    force_recv_buffer(&sock, UDP_RECV_BUFFER);
    let got = sock.recv_buffer_size().unwrap_or(0);
    if got < UDP_RECV_BUFFER {
        // Without CAP_NET_ADMIN the kernel caps it at net.core.rmem_max.
        let _ = sock.set_recv_buffer_size(UDP_RECV_BUFFER);
    }
    let got = sock.recv_buffer_size().unwrap_or(0);
    if got < UDP_RECV_BUFFER {
        warn!(
            bytes = got,
            "UDP receive buffer smaller than asked ({UDP_RECV_BUFFER} B): raise net.core.rmem_max for large jobs"
        );
    }
    sock.bind(&addr.into())?;
    Ok(sock.into())
}

/// `SO_RCVBUFFORCE` passes `net.core.rmem_max` when the coordinator may
/// (root or CAP_NET_ADMIN); otherwise it fails and the capped size is used.
#[cfg(target_os = "linux")]
fn force_recv_buffer(sock: &socket2::Socket, bytes: usize) {
    use std::os::fd::AsRawFd;
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: a valid socket fd and a c_int option value of the right size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn force_recv_buffer(_: &socket2::Socket, _: usize) {}

/// Why a connection ended before it was accepted.
struct Refusal {
    label: &'static str,
    detail: String,
    /// Milliseconds after which trying again may succeed (0: not by itself).
    retry_after_ms: u32,
}

impl Refusal {
    fn new(label: &'static str, detail: impl Into<String>) -> Self {
        Self {
            label,
            detail: detail.into(),
            retry_after_ms: 0,
        }
    }

    /// A refusal expected to clear by itself after about `wait`.
    fn for_now(mut self, wait: Duration) -> Self {
        self.retry_after_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        self
    }
}

/// Refusals [`handshake`] counts and logs itself (with the hello's names).
const HELLO_REFUSALS: [&str; 5] = [
    "invalid_token",
    "agent_id_in_use",
    "host_in_use",
    "host_not_in_certificate",
    "agent_id_not_in_certificate",
];

/// What reading one batch stream came to, forwarded in stream order.
enum StreamRead {
    /// With the budget it holds until it is answered.
    Batch(Box<Batch>, quinn::SendStream, Held),
    /// Rejected (counted and answered already): the agent does not send
    /// it again.
    Rejected,
    /// Broken or past its deadline, unanswered: the agent sends it again,
    /// and every batch after it, on its next connection.
    Lost,
}

/// Budget a batch holds: its connection's share and the global one.
type Held = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// Where a stream stands among its connection's streams: budget is taken
/// in stream order (`turn` fires when the stream before has its share,
/// `next` tells the one after), so a later stream can never hold the
/// budget an earlier one — which the in-order forwarder waits for — needs.
struct Turn {
    turn: oneshot::Receiver<()>,
    next: oneshot::Sender<()>,
}

/// Keeps `stats.agents` within [`MAX_AGENTS_REMEMBERED`]: forgets agents
/// that are gone (any, when all are: the map holds counters, not state
/// anything depends on).
fn bound_agents(stats: &IngestStats) {
    while stats.agents.len() > MAX_AGENTS_REMEMBERED {
        let victim = stats
            .agents
            .iter()
            .find(|a| !a.connected)
            .map(|a| a.key().clone());
        let Some(id) = victim else { break };
        // Counted where the report's agent list forgets it (`serve`).
        stats.agents.remove(&id);
    }
}

/// One connection from its QUIC handshake to its end: admitted (TLS, then
/// the hello), then batches read and forwarded until it closes.
async fn serve_connection(
    incoming: Incoming,
    shared: &Shared,
    events: &mpsc::Sender<IngestEvent>,
    mut slot: PreauthSlot<'_>,
) -> Result<(), String> {
    let remote = incoming.remote_address();
    let conn = finish_tls(incoming, shared, remote).await?;
    let hello = say_hello(&conn, shared, remote).await?;
    slot.release();
    open_up(&conn);
    let conn_id = conn.stable_id() as u64;
    let agent_id = hello.agent_id.clone();
    info!(host = %hello.host, agent = %agent_id, %remote, "agent connected");
    agent_up(shared, events, &hello).await;
    let control_task = spawn_control(&conn, shared, events, &agent_id, &hello.host);

    // Streams are read concurrently (one slow or unfinished stream holds
    // only its own slot, for at most STREAM_READ_TIMEOUT) and forwarded in
    // the order they were opened, which is the agent's batch order.
    let (order_tx, order_rx) =
        mpsc::channel::<tokio::task::JoinHandle<StreamRead>>(AGENT_STREAMS as usize);
    let forward = tokio::spawn(forward_in_order(order_rx, events.clone(), agent_id.clone()));
    let mut reason = accept_batches(&conn, shared, &agent_id, &hello.host, order_tx).await;
    // What was read before the connection ended still goes in (the
    // accepting side's sender is dropped by now).
    if let Ok(r) = forward.await {
        if !r.is_empty() {
            reason = r;
        }
    }
    control_task.abort();
    agent_down(shared, events, agent_id, &hello.host, conn_id, reason).await;
    Ok(())
}

/// Waits (within [`HELLO_TIMEOUT`]) for the TLS handshake; a failed or
/// slow one is counted as a refusal.
async fn finish_tls(
    incoming: Incoming,
    shared: &Shared,
    remote: SocketAddr,
) -> Result<Connection, String> {
    match tokio::time::timeout(HELLO_TIMEOUT, incoming).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => {
            // Under mutual TLS this is where an agent without a certificate
            // from the job's CA is turned away: count it as a refusal.
            shared.refused(
                "tls_handshake",
                remote,
                &format!("TLS handshake failed: {e}"),
            );
            Err(format!("refused: TLS handshake failed: {e}"))
        }
        Err(_) => {
            shared.refused(
                "hello_timeout",
                remote,
                "TLS handshake not done within 10 s",
            );
            Err("refused: TLS handshake too slow".to_owned())
        }
    }
}

/// Reads the agent's hello; a refusal [`handshake`] did not count itself
/// is counted here and the connection closed with its reason.
async fn say_hello(
    conn: &Connection,
    shared: &Shared,
    remote: SocketAddr,
) -> Result<Hello, String> {
    match handshake(conn, shared).await {
        Ok(h) => Ok(h),
        Err(r) => {
            if !HELLO_REFUSALS.contains(&r.label) {
                shared.refused(r.label, remote, &r.detail);
                conn.close(1u32.into(), r.detail.as_bytes());
            }
            Err(format!("refused: {}", r.detail))
        }
    }
}

/// Marks the agent connected in the counters and tells the analyzer.
async fn agent_up(shared: &Shared, events: &mpsc::Sender<IngestEvent>, hello: &Hello) {
    let stats = &*shared.stats;
    stats
        .agents
        .entry(hello.agent_id.clone())
        .and_modify(|a| a.connected = true)
        .or_insert_with(|| AgentState {
            host: hello.host.clone(),
            connected: true,
            ..Default::default()
        });
    bound_agents(stats);
    let _ = events
        .send(IngestEvent::AgentUp {
            agent_id: hello.agent_id.clone(),
            host: hello.host.clone(),
            connected_mono_ns: hello.mono_ns,
        })
        .await;
}

/// Registers the agent's control channel and runs its control stream
/// (clock probes, deep-probe requests) alongside the batches.
fn spawn_control(
    conn: &Connection,
    shared: &Shared,
    events: &mpsc::Sender<IngestEvent>,
    agent_id: &str,
    host: &str,
) -> tokio::task::JoinHandle<()> {
    let (ctl_tx, ctl_rx) = mpsc::channel(8);
    shared.controls.insert(agent_id.to_owned(), ctl_tx);
    let (conn, id, host, events) = (
        conn.clone(),
        agent_id.to_owned(),
        host.to_owned(),
        events.clone(),
    );
    let schedule = shared.schedule;
    let clock_port = shared.clock_port.clone();
    let controls = shared.controls.clone();
    let connected: Arc<dyn Fn() -> usize + Send + Sync> = Arc::new(move || controls.len());
    tokio::spawn(async move {
        let plan = control::ProbePlan {
            schedule,
            clock_port,
            connected,
        };
        if let Err(e) = control::run(conn, id.clone(), host, events, ctl_rx, plan).await {
            warn!(agent = %id, "control stream ended: {e}");
        }
    })
}

/// Accepts the connection's batch streams, each read in its own task and
/// queued in opening order; returns why the connection ended.
async fn accept_batches(
    conn: &Connection,
    shared: &Shared,
    agent_id: &str,
    host: &str,
    order_tx: mpsc::Sender<tokio::task::JoinHandle<StreamRead>>,
) -> String {
    let conn_budget = Arc::new(Semaphore::new(CONN_BUDGET_KIB as usize));
    let (first, mut turn) = oneshot::channel();
    let _ = first.send(());
    loop {
        // One bidirectional stream per batch: the batch up, the answer
        // down (`wire::BATCH_INGESTED` once ingested, `BATCH_REJECTED`
        // never).
        let (answer, stream) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => break e.to_string(),
        };
        let shared_stats = shared.stats.clone();
        let (id, host) = (agent_id.to_owned(), host.to_owned());
        let budget = (conn_budget.clone(), shared.budget.clone());
        let (next, after) = oneshot::channel();
        let order = Turn {
            turn: std::mem::replace(&mut turn, after),
            next,
        };
        let read = tokio::spawn(async move {
            read_batch(answer, stream, &id, &host, &shared_stats, budget, order).await
        });
        if order_tx.send(read).await.is_err() {
            break "coordinator shutting down".to_owned();
        }
    }
}

/// Lets the agent's names and control channel go and tells the analyzer
/// it is gone.
async fn agent_down(
    shared: &Shared,
    events: &mpsc::Sender<IngestEvent>,
    agent_id: String,
    host: &str,
    conn_id: u64,
    reason: String,
) {
    shared.controls.remove(&agent_id);
    lock(&shared.claims).release(&agent_id, host, conn_id);
    if let Some(mut a) = shared.stats.agents.get_mut(&agent_id) {
        a.connected = false;
    }
    info!(agent = %agent_id, "agent disconnected: {reason}");
    let _ = events
        .send(IngestEvent::AgentDown {
            agent_id,
            reason: reason.clone(),
        })
        .await;
}

#[cfg(test)]
mod tests;

//! The QUIC server agents send batches to.
//!
//! Per connection: the agent opens a bidirectional stream with [`Hello`]
//! (job token); a wrong token is refused, logged and counted. Then every
//! unidirectional stream carries one batch. Each batch is validated by
//! [`wire::decode`] (header, version, size cap, bytecheck) before anything
//! reads it; a bad one is rejected with its reason and counted, and the
//! connection keeps serving. Nothing an agent sends can stop the server.
//! Alongside, a control stream per agent ([`crate::control`]) probes its
//! clock and carries deep-probe window requests ([`Ingest::send_control`]).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use dashmap::DashMap;
use quinn::{Connection, Endpoint, Incoming};
use slowrank_shared::wire::{
    self, Batch, Control, Hello, HelloReply, HEADER_LEN, MAX_MESSAGE_BYTES,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::clock::ClockSample;
use crate::tls::{Identity, TlsError};
use crate::{
    clockport::ClockPort,
    control::{self, ProbeSchedule},
};

/// Largest hello accepted.
const MAX_HELLO: usize = 64 * 1024;
/// An agent must say hello this fast.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The pending answer to the agent for one batch.
#[derive(Debug, Default)]
pub struct Ack(Option<tokio::sync::oneshot::Sender<()>>);

impl Ack {
    /// An answer nobody waits for (batches fed in-process).
    pub fn none() -> Self {
        Self(None)
    }

    /// The batch is ingested: tell the agent it may drop it.
    pub fn done(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// What the ingest path hands to the rest of the coordinator.
#[derive(Debug)]
pub enum IngestEvent {
    AgentUp {
        agent_id: String,
        host: String,
        /// The agent's monotonic clock when it connected (its hello): its
        /// batches cut before this were spooled while it was away.
        connected_mono_ns: u64,
    },
    Batch {
        agent_id: String,
        batch: Box<Batch>,
        /// Answer the agent once the batch is ingested ([`Ack::done`]);
        /// dropped unanswered, the agent keeps it spooled and resends it.
        ack: Ack,
    },
    /// One answered clock probe of `host`'s agent.
    Clock {
        agent_id: String,
        host: String,
        sample: ClockSample,
    },
    AgentDown {
        agent_id: String,
        reason: String,
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
    clock_port: Option<Arc<ClockPort>>,
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
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(identity.server_config()?),
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
                    ClockPort::bind(at, dropped)
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
        while let Some(incoming) = self.endpoint.accept().await {
            let (shared, events) = (self.shared.clone(), events.clone());
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                if let Err(reason) = serve_connection(incoming, &shared, &events).await {
                    warn!(%remote, "agent connection ended: {reason}");
                }
            });
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

fn reject(mut answer: quinn::SendStream) {
    tokio::spawn(async move {
        let _ = answer.write_all(&[wire::BATCH_REJECTED]).await;
        let _ = answer.finish();
    });
}

/// Compares without an early exit, so timing does not leak the token.
fn token_matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

async fn handshake(conn: &Connection, token: &str, stats: &IngestStats) -> Result<Hello, String> {
    let (mut send, mut recv) = tokio::time::timeout(HELLO_TIMEOUT, conn.accept_bi())
        .await
        .map_err(|_| "no hello within 10 s".to_owned())?
        .map_err(|e| format!("connection lost before hello: {e}"))?;
    let bytes = recv
        .read_to_end(MAX_HELLO)
        .await
        .map_err(|e| format!("reading hello: {e}"))?;
    let hello: Hello = match wire::decode(&bytes) {
        Ok(h) => h,
        Err(e) => {
            stats.refused_agents.fetch_add(1, Ordering::Relaxed);
            return Err(format!("malformed hello: {e}"));
        }
    };
    let accepted = token_matches(&hello.token, token);
    if !accepted {
        // Counted before the reply leaves, so whoever sees the refusal also
        // sees it in the stats.
        stats.refused_agents.fetch_add(1, Ordering::Relaxed);
    }
    let reply = HelloReply {
        accepted,
        reason: if accepted {
            String::new()
        } else {
            "invalid job token".to_owned()
        },
    };
    if let Ok(bytes) = wire::encode(&reply) {
        let _ = send.write_all(&bytes).await;
        let _ = send.finish();
        let _ = send.stopped().await;
    }
    if !accepted {
        warn!(
            remote = %conn.remote_address(),
            host = %hello.host,
            agent = %hello.agent_id,
            "refused agent: invalid job token"
        );
        conn.close(1u32.into(), b"invalid job token");
        return Err("refused: invalid job token".to_owned());
    }
    Ok(hello)
}

async fn serve_connection(
    incoming: Incoming,
    shared: &Shared,
    events: &mpsc::Sender<IngestEvent>,
) -> Result<(), String> {
    let stats = &*shared.stats;
    let conn = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            // Under mutual TLS this is where an agent without a certificate
            // from the job's CA is turned away: count it as a refusal.
            stats.refused_agents.fetch_add(1, Ordering::Relaxed);
            return Err(format!("refused: TLS handshake failed: {e}"));
        }
    };
    let hello = handshake(&conn, &shared.token, stats).await?;
    let agent_id = hello.agent_id.clone();
    info!(host = %hello.host, agent = %agent_id, remote = %conn.remote_address(), "agent connected");
    stats
        .agents
        .entry(agent_id.clone())
        .and_modify(|a| a.connected = true)
        .or_insert_with(|| AgentState {
            host: hello.host.clone(),
            connected: true,
            ..Default::default()
        });
    let _ = events
        .send(IngestEvent::AgentUp {
            agent_id: agent_id.clone(),
            host: hello.host.clone(),
            connected_mono_ns: hello.mono_ns,
        })
        .await;
    let (ctl_tx, ctl_rx) = mpsc::channel(8);
    shared.controls.insert(agent_id.clone(), ctl_tx);
    let control_task = {
        let (conn, id, host, events) = (
            conn.clone(),
            agent_id.clone(),
            hello.host.clone(),
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
    };

    let reason = loop {
        // One bidirectional stream per batch: the batch up, the answer down
        // (`wire::BATCH_INGESTED` once ingested, `BATCH_REJECTED` never).
        let (mut answer, mut stream) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => break e.to_string(),
        };
        let bytes = match stream.read_to_end(HEADER_LEN + MAX_MESSAGE_BYTES).await {
            Ok(b) => b,
            Err(quinn::ReadToEndError::TooLong) => {
                stats.reject(&agent_id, "oversized");
                warn!(agent = %agent_id, "rejected batch: larger than the cap");
                reject(answer);
                continue;
            }
            Err(e) => {
                stats.reject(&agent_id, "stream_error");
                warn!(agent = %agent_id, "rejected batch: stream error: {e}");
                continue;
            }
        };
        match wire::decode::<Batch>(&bytes) {
            Ok(mut batch) => {
                if batch.agent_id != agent_id {
                    stats.reject(&agent_id, "agent_id_mismatch");
                    warn!(agent = %agent_id, claimed = %batch.agent_id, "rejected batch: claims another agent");
                    reject(answer);
                    continue;
                }
                // The connection's identity wins over what the batch says.
                batch.host = hello.host.clone();
                stats.batches_ok.fetch_add(1, Ordering::Relaxed);
                stats
                    .bytes_ok
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if let Some(mut a) = stats.agents.get_mut(&agent_id) {
                    a.batches += 1;
                    a.last_seq = Some(batch.seq);
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                if events
                    .send(IngestEvent::Batch {
                        agent_id: agent_id.clone(),
                        batch: Box::new(batch),
                        ack: Ack(Some(tx)),
                    })
                    .await
                    .is_err()
                {
                    break "coordinator shutting down".to_owned();
                }
                // Answer when ingested, without holding up the next batch.
                tokio::spawn(async move {
                    if rx.await.is_ok() {
                        let _ = answer.write_all(&[wire::BATCH_INGESTED]).await;
                        let _ = answer.finish();
                    }
                });
            }
            Err(e) => {
                stats.reject(&agent_id, e.class());
                warn!(agent = %agent_id, "rejected batch: {e}");
                reject(answer);
            }
        }
    };
    control_task.abort();
    shared.controls.remove(&agent_id);
    if let Some(mut a) = stats.agents.get_mut(&agent_id) {
        a.connected = false;
    }
    info!(agent = %agent_id, "agent disconnected: {reason}");
    let _ = events
        .send(IngestEvent::AgentDown {
            agent_id,
            reason: reason.clone(),
        })
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::token_matches;

    #[test]
    fn token_comparison() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abd", "abc"));
        assert!(!token_matches("ab", "abc"));
        assert!(!token_matches("abcd", "abc"));
        assert!(!token_matches("", "abc"));
    }
}

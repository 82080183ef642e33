//! Shipping batches to the coordinator over QUIC (quinn).
//!
//! One connection per agent. The agent opens a bidirectional stream, sends
//! [`Hello`] with the job token and waits for [`HelloReply`]; then every batch
//! travels on its own bidirectional stream, answered on it once the
//! coordinator has ingested it; up to [`SEND_WINDOW`] batches are written
//! before the oldest answer is awaited, in order (the coordinator takes an
//! agent's streams in the order they were opened). TLS authenticates the coordinator (its certificate must
//! chain to the CA file the agent was given); the token authenticates the
//! agent.
//!
//! After the hello the coordinator opens a bidirectional *control* stream:
//! it carries [`ClockProbe`]s, answered at once with the agent's
//! [`HostClock`] (the same clock every record is stamped with, so the
//! coordinator learns exactly the mapping it must undo), and [`Control`]
//! requests for deep-probe windows, handed to the agent's main loop through
//! [`Uplink::take_control_requests`]. It also names the coordinator's UDP
//! clock port ([`ClockPort`]); probes there are answered by
//! [`crate::clockport`] with kernel arrival stamps, the better clock source.

use std::{collections::VecDeque, net::SocketAddr, sync::Arc};

use quinn::{crypto::rustls::QuicClientConfig, Connection, Endpoint, RecvStream, SendStream};
use rustls::pki_types::{pem::PemObject, CertificateDer};
use slowrank_shared::wire::{
    self, Batch, ClockPort, ClockProbe, ClockReply, Control, Hello, HelloReply, MessageKind,
    WireError, HEADER_LEN,
};
use tokio::sync::mpsc;

use crate::spool::SpoolId;
use crate::{clock::HostClock, clockport::Responder};

/// Largest reply the agent reads on the hello stream.
const MAX_REPLY: usize = 64 * 1024;
/// Largest message accepted on the control stream.
const MAX_CONTROL: usize = 64 * 1024;
/// Deep-window requests queued for the main loop before new ones are dropped.
const CONTROL_QUEUE: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("cannot read the PEM file {path} (CA, certificate or key)")]
    Ca {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("invalid TLS setup")]
    Tls(#[from] rustls::Error),
    #[error("invalid QUIC TLS setup")]
    QuicTls(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
    #[error("cannot open a local UDP endpoint")]
    Endpoint(#[source] std::io::Error),
    #[error("cannot start connecting to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: quinn::ConnectError,
    },
    #[error("connection to the coordinator failed")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream write failed")]
    Write(#[from] quinn::WriteError),
    #[error("stream closed")]
    Closed(#[from] quinn::ClosedStream),
    #[error("the coordinator never acknowledged the batch (it went away before ingesting it)")]
    Unacknowledged,
    #[error("reading the coordinator's reply failed")]
    Read(#[from] quinn::ReadToEndError),
    #[error("bad message")]
    Wire(#[from] WireError),
    #[error("the coordinator refused this agent: {0}")]
    Refused(String),
    /// Refused for now: another connection holds this host (the killed
    /// agent this one replaces, until the coordinator times it out).
    #[error("the coordinator refused this agent for now: {reason}")]
    RefusedForNow {
        reason: String,
        retry_after: std::time::Duration,
    },
    #[error("reading the control stream failed")]
    ReadExact(#[from] quinn::ReadExactError),
    #[error("control message of {0} bytes exceeds the {MAX_CONTROL}-byte cap")]
    ControlTooLarge(usize),
}

/// Builds the QUIC client config that trusts exactly the given CA (PEM).
pub fn client_config(ca_pem: &[u8], ca_name: &str) -> Result<quinn::ClientConfig, ShipError> {
    client_config_with(ca_pem, ca_name, None)
}

/// An agent's own certificate chain and key (PEM), for mutual TLS.
pub struct ClientIdentity<'a> {
    pub cert_pem: &'a [u8],
    pub key_pem: &'a [u8],
    pub name: &'a str,
}

/// Like [`client_config`], presenting `identity` when the coordinator asks
/// for a client certificate (mutual TLS, `slowrank certs`).
pub fn client_config_with(
    ca_pem: &[u8],
    ca_name: &str,
    identity: Option<ClientIdentity<'_>>,
) -> Result<quinn::ClientConfig, ShipError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|source| ShipError::Ca {
            path: ca_name.to_owned(),
            source,
        })?;
        roots.add(cert)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots);
    let tls = match identity {
        Some(id) => {
            let pem_err = |source| ShipError::Ca {
                path: id.name.to_owned(),
                source,
            };
            let certs = CertificateDer::pem_slice_iter(id.cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(pem_err)?;
            let key =
                rustls::pki_types::PrivateKeyDer::from_pem_slice(id.key_pem).map_err(pem_err)?;
            tls.with_client_auth_cert(certs, key)?
        }
        None => tls.with_no_client_auth(),
    };
    let mut cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    cfg.transport_config(Arc::new(transport()));
    Ok(cfg)
}

/// A killed coordinator sends nothing back; without keep-alives the agent
/// would wait out quinn's 30 s idle timeout before it spools and reconnects.
/// A link that is down for a few seconds keeps the connection (QUIC
/// retransmits); one down for longer than `IDLE_TIMEOUT` is reconnected.
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6);

fn transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(std::time::Duration::from_secs(1)));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("6 s fits a QUIC varint"),
    ));
    t
}

/// An authenticated connection to the coordinator.
pub struct Shipper {
    // Kept so the endpoint's driver lives as long as the connection.
    _endpoint: Endpoint,
    conn: Connection,
}

impl Shipper {
    /// Connects, says hello and waits for the coordinator to accept us.
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        config: quinn::ClientConfig,
        hello: &Hello,
    ) -> Result<Self, ShipError> {
        Self::connect_from(None, addr, server_name, config, hello).await
    }

    /// [`Shipper::connect`] from the local address `from` (any when None).
    pub async fn connect_from(
        from: Option<std::net::IpAddr>,
        addr: SocketAddr,
        server_name: &str,
        config: quinn::ClientConfig,
        hello: &Hello,
    ) -> Result<Self, ShipError> {
        let bind: SocketAddr = match from {
            Some(ip) => SocketAddr::new(ip, 0),
            None if addr.is_ipv6() => "[::]:0".parse().expect("literal"),
            None => "0.0.0.0:0".parse().expect("literal"),
        };
        let mut endpoint = Endpoint::client(bind).map_err(ShipError::Endpoint)?;
        endpoint.set_default_client_config(config);
        let conn = endpoint
            .connect(addr, server_name)
            .map_err(|source| ShipError::Connect { addr, source })?
            .await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&wire::encode(hello)?).await?;
        send.finish()?;
        let reply: HelloReply = wire::decode(&recv.read_to_end(MAX_REPLY).await?)?;
        if !reply.accepted {
            if reply.retry_after_ms > 0 {
                return Err(ShipError::RefusedForNow {
                    reason: reply.reason,
                    retry_after: std::time::Duration::from_millis(reply.retry_after_ms.into()),
                });
            }
            return Err(ShipError::Refused(reply.reason));
        }
        Ok(Self {
            _endpoint: endpoint,
            conn,
        })
    }

    /// Sends one batch on its own stream.
    pub async fn send(&self, batch: &Batch) -> Result<(), ShipError> {
        self.send_encoded(&wire::encode(batch)?).await
    }

    /// Sends an already encoded message (e.g. from the spool) and waits for
    /// the coordinator's answer. Delivered only once the coordinator says it
    /// ingested the batch: a transport-level acknowledgement is not enough
    /// (a coordinator killed between receiving and ingesting loses it), so
    /// without the answer the batch stays spooled and is sent again.
    pub async fn send_encoded(&self, bytes: &[u8]) -> Result<(), ShipError> {
        let pending = self.begin_send(bytes).await?;
        pending.answer().await
    }

    /// Opens the batch's stream and writes it; the answer is awaited
    /// separately ([`PendingAnswer::answer`]), so the next batch can go out
    /// meanwhile. Streams are opened in call order, and the coordinator
    /// takes them in that order: batches stay in order.
    pub async fn begin_send(&self, bytes: &[u8]) -> Result<PendingAnswer, ShipError> {
        let t0 = std::time::Instant::now();
        let (mut send, recv) = self.conn.open_bi().await?;
        send.write_all(bytes).await?;
        send.finish()?;
        Ok(PendingAnswer {
            recv,
            t0,
            written_us: t0.elapsed().as_micros() as u64,
            bytes: bytes.len(),
        })
    }

    /// Answers the coordinator's control streams (clock probes, deep-window
    /// requests) until the connection ends. Probe answers are read from
    /// `clock`; deep-window requests go to `requests`.
    pub fn spawn_control(
        &self,
        clock: HostClock,
        requests: mpsc::Sender<Control>,
    ) -> tokio::task::JoinHandle<()> {
        let conn = self.conn.clone();
        tokio::spawn(async move {
            while let Ok((send, recv)) = conn.accept_bi().await {
                let coordinator = conn.remote_address();
                tokio::spawn(control_stream(
                    send,
                    recv,
                    coordinator,
                    clock,
                    requests.clone(),
                ));
            }
        })
    }

    /// Closes the connection cleanly after pending streams are acknowledged.
    pub async fn close(self) {
        self.conn.close(0u32.into(), b"agent done");
        self._endpoint.wait_idle().await;
    }
}

/// A batch written to the coordinator whose answer is still to come.
pub struct PendingAnswer {
    recv: RecvStream,
    t0: std::time::Instant,
    written_us: u64,
    bytes: usize,
}

impl PendingAnswer {
    /// Waits for the coordinator's answer: `Ok` once it ingested the batch
    /// (or rejected it for good: then it is not worth resending).
    pub async fn answer(mut self) -> Result<(), ShipError> {
        let answer = self
            .recv
            .read_to_end(8)
            .await
            .map_err(|_| ShipError::Unacknowledged)?;
        tracing::debug!(
            written_us = self.written_us,
            acked_us = self.t0.elapsed().as_micros() as u64,
            bytes = self.bytes,
            "batch acknowledged"
        );
        match answer.first() {
            Some(&wire::BATCH_INGESTED) => Ok(()),
            Some(&wire::BATCH_REJECTED) => {
                tracing::warn!(
                    bytes = self.bytes,
                    "the coordinator rejected a batch (see its log); not resending it"
                );
                Ok(())
            }
            _ => Err(ShipError::Unacknowledged),
        }
    }
}

/// Reads one framed message (header + archive); `None` at a clean end.
async fn read_frame(recv: &mut RecvStream) -> Result<Option<Vec<u8>>, ShipError> {
    let mut header = [0u8; HEADER_LEN];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let (_, len) = wire::peek_header(&header)?;
    if len > MAX_CONTROL {
        return Err(ShipError::ControlTooLarge(len));
    }
    let mut frame = vec![0u8; HEADER_LEN + len];
    frame[..HEADER_LEN].copy_from_slice(&header);
    recv.read_exact(&mut frame[HEADER_LEN..]).await?;
    Ok(Some(frame))
}

async fn control_stream(
    mut send: SendStream,
    mut recv: RecvStream,
    coordinator: SocketAddr,
    clock: HostClock,
    requests: mpsc::Sender<Control>,
) {
    if let Err(e) = answer_control(&mut send, &mut recv, coordinator, clock, &requests).await {
        tracing::warn!("control stream ended: {e}");
    }
}

async fn answer_control(
    send: &mut SendStream,
    recv: &mut RecvStream,
    coordinator: SocketAddr,
    clock: HostClock,
    requests: &mpsc::Sender<Control>,
) -> Result<(), ShipError> {
    // Lives as long as the control stream: the clock port's token is this
    // connection's.
    let mut _responder: Option<Responder> = None;
    while let Some(frame) = read_frame(recv).await? {
        let (kind, _) = wire::peek_header(frame[..HEADER_LEN].try_into().expect("header"))?;
        match kind {
            MessageKind::ClockProbe => {
                // Decode, then read the clock, then encode: the coordinator
                // stamps before encoding a probe and after decoding a reply,
                // so both halves of the round trip carry the same work and
                // the midpoint stays unbiased.
                let probe: ClockProbe = wire::decode(&frame)?;
                let agent_mono_ns = clock.now();
                let reply = ClockReply {
                    seq: probe.seq,
                    coord_send_ns: probe.coord_send_ns,
                    agent_mono_ns,
                };
                send.write_all(&wire::encode(&reply)?).await?;
            }
            MessageKind::ClockPort => {
                let p: ClockPort = wire::decode(&frame)?;
                let at = SocketAddr::new(coordinator.ip(), p.port);
                _responder = None;
                match Responder::spawn(at, p.token, p.key, clock) {
                    Ok(r) => {
                        tracing::info!(%at, "answering clock probes on the coordinator's clock port");
                        _responder = Some(r);
                    }
                    Err(e) => {
                        tracing::warn!(%at, "clock port not used ({e}); clock probes stay on the control stream")
                    }
                }
            }
            MessageKind::Control => {
                let c: Control = wire::decode(&frame)?;
                tracing::info!(enable = c.deep_enable, seconds = c.seconds, ranks = ?c.ranks, "coordinator requests a deep-probe window");
                if requests.try_send(c).is_err() {
                    tracing::warn!(
                        "deep-window request dropped: the agent has not taken the previous ones"
                    );
                }
            }
            other => tracing::warn!(?other, "unexpected message on the control stream; ignored"),
        }
    }
    Ok(())
}

/// Where and how to reach the coordinator.
#[derive(Clone)]
pub struct UplinkConfig {
    pub addr: SocketAddr,
    pub server_name: String,
    pub client: quinn::ClientConfig,
    pub hello: Hello,
    /// Bound of the in-memory spool while the coordinator is away.
    pub spool_bytes: usize,
    /// The clock this agent reports in; clock probes are answered from it.
    pub clock: HostClock,
    /// The local address to connect from (any when None). A load test
    /// playing many hosts on one machine gives each its own loopback
    /// address, as real hosts have: the coordinator caps connections
    /// before hello per source address.
    pub bind: Option<std::net::IpAddr>,
}

/// What the uplink did, reported when it finishes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UplinkReport {
    pub sent: u64,
    /// Still spooled when the agent had to stop.
    pub unsent: u64,
    /// Evicted from the spool because its bound was hit.
    pub dropped: u64,
}

/// A background task that owns the connection and the spool: batches are
/// queued, sent in order, and kept across reconnects.
pub struct Uplink {
    tx: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    preamble: Preamble,
    task: tokio::task::JoinHandle<UplinkReport>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<tokio::sync::Notify>,
    control: Option<mpsc::Receiver<Control>>,
}

impl Uplink {
    pub fn spawn(cfg: UplinkConfig) -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (ctl_tx, ctl_rx) = mpsc::channel(CONTROL_QUEUE);
        let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(tokio::sync::Notify::new());
        let preamble = Preamble::default();
        let task = tokio::spawn(uplink_task(
            cfg,
            rx,
            ctl_tx,
            dropped.clone(),
            stop.clone(),
            preamble.clone(),
        ));
        Self {
            tx,
            preamble,
            task,
            dropped,
            stop,
            control: Some(ctl_rx),
        }
    }

    /// The coordinator's deep-probe window requests (once; later calls get `None`).
    pub fn take_control_requests(&mut self) -> Option<mpsc::Receiver<Control>> {
        self.control.take()
    }

    /// Queues an encoded batch.
    pub fn send(&self, bytes: Vec<u8>) {
        let _ = self.tx.send(bytes);
    }

    /// What a coordinator must know before this agent's next batches make
    /// sense (its ranks and communicators, announced once in some earlier
    /// batch), encoded as a batch with `seq` 0. It is sent first on every
    /// reconnection: a coordinator that restarted learns it again, one that
    /// did not ignores it as a resend (`seq` 0 is below what it has seen).
    pub fn set_preamble(&self, bytes: Vec<u8>) {
        if let Ok(mut p) = self.preamble.lock() {
            *p = Some(bytes);
        }
    }

    /// Batches evicted from the spool so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends what is queued, waiting at most `grace` for the coordinator.
    pub async fn finish(self, grace: std::time::Duration) -> UplinkReport {
        drop(self.tx);
        let stop = self.stop.clone();
        let mut task = self.task;
        tokio::select! {
            r = &mut task => r.unwrap_or_default(),
            _ = tokio::time::sleep(grace) => {
                stop.notify_one();
                task.await.unwrap_or_default()
            }
        }
    }
}

type Preamble = Arc<std::sync::Mutex<Option<Vec<u8>>>>;

/// Batches written to the coordinator before the oldest unanswered one is
/// waited for.
pub const SEND_WINDOW: usize = 8;

type InFlight = VecDeque<(SpoolId, tokio::task::JoinHandle<Result<(), ShipError>>)>;

/// The connection is gone: its unanswered batches stay spooled and go
/// again, from the oldest, on the next one (the coordinator ignores the
/// ones it had already ingested as resends).
fn lose(inflight: &mut InFlight, last_sent: &mut Option<SpoolId>) {
    for (_, t) in inflight.drain(..) {
        t.abort();
    }
    *last_sent = None;
}

async fn uplink_task(
    cfg: UplinkConfig,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    control: mpsc::Sender<Control>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<tokio::sync::Notify>,
    preamble: Preamble,
) -> UplinkReport {
    use std::time::Duration;
    let mut spool = crate::spool::Spool::new(cfg.spool_bytes);
    let mut conn: Option<Shipper> = None;
    let mut control_task: Option<tokio::task::JoinHandle<()>> = None;
    let mut report = UplinkReport::default();
    let mut backoff = Duration::from_millis(200);
    let mut open = true;
    let mut connected_before = false;
    // Batches written on the current connection and not yet answered, oldest
    // first; `last_sent` is the newest of them (None: resend from the front).
    let mut inflight: InFlight = VecDeque::new();
    let mut last_sent: Option<SpoolId> = None;
    loop {
        // Take everything queued without waiting.
        loop {
            match rx.try_recv() {
                Ok(b) => {
                    spool.push(b);
                }
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        dropped.store(spool.dropped(), std::sync::atomic::Ordering::Relaxed);
        if spool.is_empty() && !open {
            break;
        }
        // Connect eagerly, even with nothing to send: the coordinator probes
        // our clock from the moment we say hello, before the job's first batch.
        if conn.is_none() {
            let mut retry_soon = None;
            match Shipper::connect_from(
                cfg.bind,
                cfg.addr,
                &cfg.server_name,
                cfg.client.clone(),
                &cfg.hello,
            )
            .await
            {
                Ok(s) => {
                    tracing::info!(addr = %cfg.addr, spooled = spool.len(), "connected to coordinator");
                    backoff = Duration::from_millis(200);
                    if let Some(t) = control_task.take() {
                        t.abort();
                    }
                    control_task = Some(s.spawn_control(cfg.clock, control.clone()));
                    let replay = connected_before
                        .then(|| preamble.lock().ok().and_then(|p| p.clone()))
                        .flatten();
                    connected_before = true;
                    match replay {
                        Some(p) => match s.send_encoded(&p).await {
                            Ok(()) => conn = Some(s),
                            Err(e) => tracing::warn!("lost the coordinator: {e}; spooling"),
                        },
                        None => conn = Some(s),
                    }
                }
                Err(ShipError::Refused(reason)) => {
                    tracing::error!(
                        "coordinator refused this agent: {reason}; keeping records spooled"
                    );
                }
                Err(ShipError::RefusedForNow {
                    reason,
                    retry_after,
                }) => {
                    // Expected right after a restart: not an error, and no
                    // backoff (the old connection goes within seconds).
                    tracing::warn!(
                        retry_ms = retry_after.as_millis() as u64,
                        spooled = spool.len(),
                        "coordinator refused this agent for now: {reason}; trying again soon"
                    );
                    retry_soon = Some(retry_after.min(std::time::Duration::from_secs(5)));
                }
                Err(e) => {
                    tracing::warn!(addr = %cfg.addr, spooled = spool.len(), "coordinator unreachable: {e}");
                }
            }
            if conn.is_none() {
                let wait = retry_soon.take().unwrap_or(backoff);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.notified() => break,
                }
                if wait == backoff {
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                continue;
            }
        }
        let shipper = conn.as_ref().expect("connected");
        // Up to SEND_WINDOW batches go out before the oldest is answered: one
        // at a time, a coordinator busy for half a second (a big analyzer
        // tick) stalled every agent behind its answers, and their backlogs
        // held back whole 4,096-rank collectives.
        if inflight.len() < SEND_WINDOW {
            if let Some((id, bytes)) = spool.next_after(last_sent) {
                match shipper.begin_send(bytes).await {
                    Ok(p) => {
                        last_sent = Some(id);
                        inflight.push_back((id, tokio::spawn(p.answer())));
                    }
                    Err(e) => {
                        tracing::warn!("lost the coordinator: {e}; spooling");
                        lose(&mut inflight, &mut last_sent);
                        conn = None;
                    }
                }
                continue;
            }
        }
        let Some((_, oldest)) = inflight.front_mut() else {
            // Nothing in flight and nothing new to send.
            tokio::select! {
                b = rx.recv() => match b { Some(b) => { spool.push(b); } None => open = false },
                _ = shipper.conn.closed() => {
                    tracing::warn!("lost the coordinator while idle; reconnecting");
                    lose(&mut inflight, &mut last_sent);
                    conn = None;
                }
                _ = stop.notified() => break,
            }
            continue;
        };
        tokio::select! {
            r = oldest => {
                let (id, _) = inflight.pop_front().expect("front");
                match r {
                    Ok(Ok(())) => {
                        spool.delivered(id);
                        report.sent += 1;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!("lost the coordinator: {e}; spooling");
                        lose(&mut inflight, &mut last_sent);
                        conn = None;
                    }
                    Err(e) => {
                        tracing::warn!("batch answer task failed: {e}; resending");
                        lose(&mut inflight, &mut last_sent);
                        conn = None;
                    }
                }
            }
            b = rx.recv(), if open => match b { Some(b) => { spool.push(b); } None => open = false },
            _ = stop.notified() => break,
        }
    }
    for (_, t) in inflight {
        t.abort();
    }
    if let Some(t) = control_task {
        t.abort();
    }
    if let Some(s) = conn {
        s.close().await;
    }
    report.unsent = spool.len() as u64;
    report.dropped = spool.dropped();
    report
}

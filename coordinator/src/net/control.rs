//! The control stream the coordinator keeps with every agent.
//!
//! After the hello the coordinator opens one bidirectional stream per agent.
//! Down it go [`ClockProbe`]s (a burst at connect so the clock is known before
//! the first batch matters, then one every 50 ms, each followed by an
//! immediate second probe once answered) and [`Control`] requests
//! (deep-probe windows); up come [`ClockReply`]s. First, though, it names
//! the UDP clock port ([`crate::net::clockport`]): once the agent says hello
//! there, probes go that way, kernel-stamped at both ends, and the control
//! stream carries them again only while the port stays silent. Each answered probe becomes
//! a [`ClockSample`] stamped on the coordinator's monotonic clock — the clock
//! the analyzer reasons in — and is handed on as [`IngestEvent::Clock`].
//! Replies are matched against the probes actually sent, so an agent cannot
//! invent samples.

use std::{sync::Arc, time::Duration};

use quinn::{Connection, RecvStream, SendStream};
use slowrank_shared::wire::{
    self, ClockPort, ClockProbe, ClockReply, Control, MessageKind, HEADER_LEN,
};
use tokio::sync::mpsc;

use crate::{
    clock::ClockSample,
    net::clockport::{self, Probes, Registration},
    net::events::IngestEvent,
};

/// Largest message accepted on the control stream.
const MAX_CONTROL: usize = 64 * 1024;

pub use crate::net::clockport::coord_now_ns;

/// When probes are sent.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSchedule {
    /// Probes sent right after the hello…
    pub burst: u32,
    /// …this far apart…
    pub burst_gap: Duration,
    /// …then one every `every`…
    pub every: Duration,
    /// …or less often when many agents are connected: scheduled probes
    /// across all agents stay under this many per second (each costs a
    /// round trip of QUIC packets; at 512 agents the default rate alone
    /// was 20,000 per second, more than the batches cost). The estimator
    /// keeps one minimum-RTT probe per second, so a probe every second per
    /// agent still tracks offset and drift.
    pub max_total_per_s: u32,
    /// Follow every answered probe at once with a second one. A host idle
    /// for `every` wakes slowly (deep CPU idle, parked threads), which makes
    /// the first leg of a lone probe slower than the return leg — a bias
    /// round trips cannot see. Sent the moment the answer lands, the
    /// follow-up finds both ends awake, so its two legs match; the estimator's
    /// minimum-RTT filter then prefers it.
    pub follow_up: bool,
    /// UDP port of the kernel-stamped clock port on the listen address
    /// (0: any free port, told to each agent); `None` keeps every probe on
    /// the control stream.
    pub clock_port: Option<u16>,
}

impl Default for ProbeSchedule {
    /// About 20 probes per second (≈ 2 KB/s each way): the estimator keeps
    /// the minimum-RTT probe of each second, and the more candidates it has,
    /// the closer that one is to an unqueued, symmetric round trip.
    fn default() -> Self {
        Self {
            burst: 20,
            burst_gap: Duration::from_millis(10),
            every: Duration::from_millis(50),
            max_total_per_s: 2_000,
            follow_up: true,
            clock_port: Some(0),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("connection lost")]
    Connection(#[from] quinn::ConnectionError),
    #[error("writing to the agent failed")]
    Write(#[from] quinn::WriteError),
    #[error("reading from the agent failed")]
    Read(#[from] quinn::ReadExactError),
    #[error("bad control message")]
    Wire(#[from] wire::WireError),
    #[error("control message of {0} bytes exceeds the {MAX_CONTROL}-byte cap")]
    TooLarge(usize),
    #[error("unexpected {0:?} message from the agent")]
    Unexpected(MessageKind),
    #[error("the coordinator is shutting down")]
    Shutdown,
}

/// Reads one framed message (header + archive); `None` at a clean end.
async fn read_frame(recv: &mut RecvStream) -> Result<Option<Vec<u8>>, ControlError> {
    let mut header = [0u8; HEADER_LEN];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let (_, len) = wire::peek_header(&header)?;
    if len > MAX_CONTROL {
        return Err(ControlError::TooLarge(len));
    }
    let mut frame = vec![0u8; HEADER_LEN + len];
    frame[..HEADER_LEN].copy_from_slice(&header);
    recv.read_exact(&mut frame[HEADER_LEN..]).await?;
    Ok(Some(frame))
}

/// How probes are sent to every agent.
pub(crate) struct ProbePlan {
    pub schedule: ProbeSchedule,
    pub clock_port: Option<Arc<clockport::ClockPortServer>>,
    /// Agents connected now (the probe rate is shared among them).
    pub connected: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// Probes `conn`'s agent and forwards `commands` to it until the connection
/// ends or the coordinator stops listening.
pub(crate) async fn run(
    conn: Connection,
    agent_id: String,
    host: String,
    events: mpsc::Sender<IngestEvent>,
    commands: mpsc::Receiver<Control>,
    plan: ProbePlan,
) -> Result<(), ControlError> {
    let ProbePlan {
        schedule,
        clock_port,
        connected,
    } = plan;
    let (mut send, recv) = conn.open_bi().await?;
    let probes = Arc::new(Probes::new(schedule.follow_up));
    let udp = match &clock_port {
        Some(port) => match port.register(&agent_id, &host, probes.clone(), events.clone()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(agent = %agent_id, "clock port not offered: {e}");
                None
            }
        },
        None => None,
    };
    if let Some(r) = &udp {
        let offer = ClockPort {
            port: r.port(),
            token: r.token(),
            key: r.key(),
        };
        send.write_all(&wire::encode(&offer)?).await?;
    }
    let writer = write_loop(send, commands, schedule, &probes, udp.as_ref(), &*connected);
    let reader = read_loop(recv, &agent_id, &host, &events, &probes);
    tokio::select! {
        r = writer => r,
        r = reader => r,
    }
}

async fn write_loop(
    mut send: SendStream,
    mut commands: mpsc::Receiver<Control>,
    schedule: ProbeSchedule,
    probes: &Probes,
    udp: Option<&Registration>,
    connected: &(dyn Fn() -> usize + Send + Sync),
) -> Result<(), ControlError> {
    let mut seq = 0u64;
    let mut scheduled = 0u64;
    let mut commands_open = true;
    loop {
        let gap = if scheduled < u64::from(schedule.burst) {
            schedule.burst_gap
        } else {
            let share = Duration::from_secs_f64(
                connected() as f64 / f64::from(schedule.max_total_per_s.max(1)),
            );
            schedule.every.max(share).min(Duration::from_secs(1))
        };
        send_probe(probes, &mut send, udp, seq, true).await?;
        seq += 1;
        scheduled += 1;
        let sleep = tokio::time::sleep(gap);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                _ = probes.follow.notified() => {
                    send_probe(probes, &mut send, udp, seq, false).await?;
                    seq += 1;
                }
                c = commands.recv(), if commands_open => match c {
                    Some(c) => send.write_all(&wire::encode(&c)?).await?,
                    None => commands_open = false,
                },
            }
        }
    }
}

async fn read_loop(
    mut recv: RecvStream,
    agent_id: &str,
    host: &str,
    events: &mpsc::Sender<IngestEvent>,
    probes: &Probes,
) -> Result<(), ControlError> {
    while let Some(frame) = read_frame(&mut recv).await? {
        let reply: ClockReply = match wire::decode(&frame) {
            Ok(r) => r,
            Err(wire::WireError::WrongKind { got, .. }) => {
                return Err(ControlError::Unexpected(got))
            }
            Err(e) => return Err(e.into()),
        };
        // Stamped after decoding, as the agent stamps after decoding the
        // probe: each half of the round trip then carries one encode and one
        // decode, and the midpoint is unbiased.
        let coord_recv_ns = coord_now_ns();
        if !probes.answered(reply.seq, reply.coord_send_ns) {
            tracing::warn!(agent = %agent_id, seq = reply.seq, "clock reply to a probe never sent; ignored");
            continue;
        }
        let sample = ClockSample {
            coord_send_ns: reply.coord_send_ns,
            agent_mono_ns: reply.agent_mono_ns,
            agent_hold_ns: 0,
            coord_recv_ns,
            udp: false,
        };
        let ev = IngestEvent::Clock {
            agent_id: agent_id.to_owned(),
            host: host.to_owned(),
            sample,
        };
        if events.send(ev).await.is_err() {
            return Err(ControlError::Shutdown);
        }
    }
    Ok(())
}
/// Records and sends probe `seq`: on the clock port when the agent
/// answers there, else on the control stream.
async fn send_probe(
    probes: &Probes,
    send: &mut SendStream,
    udp: Option<&Registration>,
    seq: u64,
    lead: bool,
) -> Result<(), ControlError> {
    let route = udp.and_then(|r| r.route(seq).map(|addr| (r, addr)));
    let coord_send_ns = probes.record(seq, lead);
    match route {
        Some((r, addr)) => {
            if let Err(e) = r.send(addr, seq, coord_send_ns) {
                tracing::debug!(%addr, "clock probe not sent on the clock port: {e}");
            }
        }
        None => {
            send.write_all(&wire::encode(&ClockProbe { seq, coord_send_ns })?)
                .await?
        }
    }
    Ok(())
}

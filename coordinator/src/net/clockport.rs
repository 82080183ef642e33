//! The coordinator's UDP clock port ([`slowrank_shared::clock_udp`]).
//!
//! Each agent connection registers here with a random token and MAC key,
//! which the control stream hands to the agent
//! ([`slowrank_shared::wire::ClockPort`]).
//! The agent says hello from its own UDP socket; from then on the control
//! stream's probes go out here instead, stamped just before `sendto`, and
//! come back with the agent's kernel arrival stamp and hold time; the
//! answer's own arrival is the kernel's stamp here. One plain thread reads
//! the socket, so no task wake-up sits inside a measured interval.
//!
//! Answers are accepted only with a valid MAC, from the address that said
//! hello, and only for probes actually sent and not yet answered (the
//! control stream's bookkeeping); they are then handed on exactly like
//! control-stream answers.

use std::{
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use dashmap::DashMap;
use slowrank_shared::clock_udp::{Datagram, Key, StampedSocket, Token, MAX_DATAGRAM};
use tokio::sync::mpsc;

use std::collections::BTreeMap;

use tokio::sync::Notify;

use crate::{clock::ClockSample, net::events::IngestEvent};

/// Unanswered probes remembered (older ones are forgotten).
const MAX_OUTSTANDING: usize = 256;

/// CLOCK_MONOTONIC in ns: the coordinator's clock for probes, batches and ticks.
pub fn coord_now_ns() -> u64 {
    slowrank_shared::clock_udp::mono_ns()
}

/// Probe bookkeeping shared by the writer, the reader and the clock port.
pub(crate) struct Probes {
    /// seq → (send time, whether a follow-up should answer it).
    outstanding: std::sync::Mutex<BTreeMap<u64, (u64, bool)>>,
    /// Raised when a scheduled probe's answer arrived.
    pub(crate) follow: Notify,
    pub(crate) follow_up: bool,
}

impl Probes {
    pub(crate) fn new(follow_up: bool) -> Self {
        Self {
            outstanding: std::sync::Mutex::new(BTreeMap::new()),
            follow: Notify::new(),
            follow_up,
        }
    }

    /// Records probe `seq` as sent now, returning its send time.
    pub(crate) fn record(&self, seq: u64, lead: bool) -> u64 {
        let coord_send_ns = coord_now_ns();
        let mut o = self.outstanding.lock().unwrap_or_else(|e| e.into_inner());
        o.insert(seq, (coord_send_ns, lead && self.follow_up));
        while o.len() > MAX_OUTSTANDING {
            o.pop_first();
        }
        coord_send_ns
    }

    /// An answer to probe `seq` sent at `coord_send_ns` arrived: true if
    /// that probe was sent and not answered yet (it is forgotten now).
    pub(crate) fn answered(&self, seq: u64, coord_send_ns: u64) -> bool {
        let sent = self
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq);
        match sent {
            Some((t, lead)) if t == coord_send_ns => {
                if lead {
                    self.follow.notify_one();
                }
                true
            }
            _ => false,
        }
    }
}

/// Consecutive unanswered UDP probes after which the control stream takes
/// over again (at 20 probes a second, two seconds of silence).
const GIVE_UP_AFTER: u32 = 40;

/// The shortest round trip a hold time may leave: two passes through the
/// kernel's UDP path cannot be quicker, even on loopback. A reported hold
/// that would leave less is cut to leave this, so no answer can make its
/// probe look shorter than any real one and win the estimator's
/// minimum-round-trip choice on a made-up offset.
pub const MIN_ROUND_TRIP_NS: u64 = 2_000;

/// The bound socket and the connections registered on it.
pub struct ClockPortServer {
    sock: StampedSocket,
    peers: DashMap<Token, Arc<Peer>>,
    stop: AtomicBool,
    /// Datagrams dropped: foreign, unknown token, bad MAC, wrong address,
    /// stale (shared with [`crate::net::ingest::IngestStats`] for `/metrics`).
    pub dropped: Arc<AtomicU64>,
}

/// One agent connection as the clock port knows it.
pub(crate) struct Peer {
    key: Key,
    agent_id: String,
    host: String,
    /// Where its hellos come from; unset until the first one.
    addr: Mutex<Option<SocketAddr>>,
    probes: Arc<Probes>,
    events: mpsc::Sender<IngestEvent>,
    unanswered: AtomicU32,
    /// Counter of the newest hello taken: an older or equal one is a replay.
    last_hello: AtomicU64,
}

/// A connection's place on the port; dropping it forgets the token.
pub(crate) struct Registration {
    port: Arc<ClockPortServer>,
    token: Token,
    peer: Arc<Peer>,
}

impl ClockPortServer {
    /// Binds `addr` (port 0: any free port) and starts the reader thread;
    /// dropped datagrams are counted in `dropped`.
    pub fn bind(addr: SocketAddr, dropped: Arc<AtomicU64>) -> io::Result<Arc<Self>> {
        let sock = StampedSocket::bind(addr, Duration::from_millis(250))?;
        let port = Arc::new(Self {
            sock,
            peers: DashMap::new(),
            stop: AtomicBool::new(false),
            dropped,
        });
        let reader = port.clone();
        thread::Builder::new()
            .name("clock-port".into())
            .spawn(move || reader.read_loop())?;
        Ok(port)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Stops the reader thread (within its read timeout).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub(crate) fn register(
        self: &Arc<Self>,
        agent_id: &str,
        host: &str,
        probes: Arc<Probes>,
        events: mpsc::Sender<IngestEvent>,
    ) -> io::Result<Registration> {
        let mut secret = [0u8; 48];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| io::Read::read_exact(&mut f, &mut secret))?;
        let token: Token = secret[..16].try_into().expect("16 bytes");
        let key: Key = secret[16..].try_into().expect("32 bytes");
        let peer = Arc::new(Peer {
            key,
            agent_id: agent_id.to_owned(),
            host: host.to_owned(),
            addr: Mutex::new(None),
            probes,
            events,
            unanswered: AtomicU32::new(0),
            last_hello: AtomicU64::new(0),
        });
        self.peers.insert(token, peer.clone());
        Ok(Registration {
            port: self.clone(),
            token,
            peer,
        })
    }

    fn read_loop(&self) {
        let mut buf = [0u8; MAX_DATAGRAM + 1];
        while !self.stop.load(Ordering::Relaxed) {
            let Some(got) = self.sock.next(&mut buf) else {
                continue;
            };
            let b = &buf[..got.len];
            let peer = Datagram::token_of(b)
                .ok()
                .and_then(|t| self.peers.get(&t).map(|p| p.clone()));
            let Some((peer, d)) =
                peer.and_then(|p| Datagram::decode(b, &p.key).ok().map(|d| (p, d)))
            else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            match d {
                Datagram::Hello { counter, .. } => {
                    // Only the reader thread stores it: load-then-store is safe.
                    if counter <= peer.last_hello.load(Ordering::Relaxed) {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    peer.last_hello.store(counter, Ordering::Relaxed);
                    let mut addr = peer.addr.lock().unwrap_or_else(|e| e.into_inner());
                    if *addr != Some(got.from) {
                        tracing::info!(agent = %peer.agent_id, from = %got.from, kernel_stamped = got.kernel_stamped, "agent answers clock probes on the clock port");
                        *addr = Some(got.from);
                    }
                }
                Datagram::Answer {
                    seq,
                    coord_send_ns,
                    agent_recv_ns,
                    agent_send_ns,
                    ..
                } => {
                    let from_peer =
                        *peer.addr.lock().unwrap_or_else(|e| e.into_inner()) == Some(got.from);
                    let known = from_peer && peer.probes.answered(seq, coord_send_ns);
                    if !known || agent_send_ns < agent_recv_ns {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    peer.unanswered.store(0, Ordering::Relaxed);
                    let total = got.mono_ns.saturating_sub(coord_send_ns);
                    let hold = (agent_send_ns - agent_recv_ns)
                        .min(total.saturating_sub(MIN_ROUND_TRIP_NS));
                    let sample = ClockSample {
                        coord_send_ns,
                        agent_mono_ns: agent_recv_ns,
                        agent_hold_ns: hold,
                        coord_recv_ns: got.mono_ns,
                        udp: true,
                    };
                    let ev = IngestEvent::Clock {
                        agent_id: peer.agent_id.clone(),
                        host: peer.host.clone(),
                        sample,
                    };
                    // A plain thread: waiting for room is fine, and a
                    // closed channel means the coordinator is stopping.
                    if peer.events.blocking_send(ev).is_err() {
                        return;
                    }
                }
                Datagram::Probe { .. } => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Registration {
    pub fn token(&self) -> Token {
        self.token
    }

    pub fn key(&self) -> Key {
        self.peer.key
    }

    pub fn port(&self) -> u16 {
        self.port.local_addr().map_or(0, |a| a.port())
    }

    /// Where probe `seq` should go: the clock port once the agent said
    /// hello there and keeps answering (every tenth probe retries after it
    /// went quiet), else `None` (the control stream).
    pub fn route(&self, seq: u64) -> Option<SocketAddr> {
        let addr = (*self.peer.addr.lock().unwrap_or_else(|e| e.into_inner()))?;
        let quiet = self.peer.unanswered.load(Ordering::Relaxed) >= GIVE_UP_AFTER;
        (!quiet || seq.is_multiple_of(10)).then_some(addr)
    }

    /// Sends probe `seq`, stamped `coord_send_ns`, to `addr`.
    pub fn send(&self, addr: SocketAddr, seq: u64, coord_send_ns: u64) -> io::Result<()> {
        let d = Datagram::Probe {
            token: self.token,
            seq,
            coord_send_ns,
        };
        self.peer.unanswered.fetch_add(1, Ordering::Relaxed);
        self.port
            .sock
            .send_to(&d.encode(&self.peer.key), addr)
            .map(|_| ())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.port.peers.remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(reg: &Registration, seq: u64, coord_send_ns: u64, hold: u64) -> Vec<u8> {
        answer_under(reg.token(), &reg.key(), seq, coord_send_ns, hold)
    }

    fn answer_under(token: Token, key: &Key, seq: u64, coord_send_ns: u64, hold: u64) -> Vec<u8> {
        let agent_recv_ns = 7_000_000_000;
        Datagram::Answer {
            token,
            seq,
            coord_send_ns,
            agent_recv_ns,
            agent_send_ns: agent_recv_ns + hold,
        }
        .encode(key)
    }

    /// The real port and reader thread against a stand-in agent socket:
    /// probes go out only after a hello, answers become UDP samples with
    /// the hold taken out, strangers, forgeries and replays are dropped, and a port
    /// that stops answering hands probes back to the control stream.
    #[tokio::test]
    async fn answers_become_samples_and_silence_falls_back() {
        let port = ClockPortServer::bind("127.0.0.1:0".parse().unwrap(), Arc::default()).unwrap();
        let probes = Arc::new(Probes::new(false));
        let (tx, mut rx) = mpsc::channel(16);
        let reg = port
            .register("agent-0", "node-0", probes.clone(), tx)
            .unwrap();
        let at = port.local_addr().unwrap();
        assert_eq!(reg.route(0), None, "no hello yet: control stream");

        let agent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        agent
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let hello = Datagram::Hello {
            token: reg.token(),
            counter: 1,
        }
        .encode(&reg.key());
        agent.send_to(&hello, at).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while reg.route(1).is_none() {
            assert!(std::time::Instant::now() < deadline, "hello not seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let to = reg.route(1).unwrap();
        assert_eq!(to, agent.local_addr().unwrap());
        // The same hello replayed from elsewhere does not move the route.
        stranger.send_to(&hello, at).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while port.dropped.load(Ordering::Relaxed) < 1 {
            assert!(std::time::Instant::now() < deadline, "replay not seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(reg.route(1), Some(to), "a replayed hello moved the route");
        port.dropped.store(0, Ordering::Relaxed);

        let sent = probes.record(1, false);
        reg.send(to, 1, sent).unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = agent.recv_from(&mut buf).unwrap();
        assert_eq!(
            Datagram::decode(&buf[..n], &reg.key()).unwrap(),
            Datagram::Probe {
                token: reg.token(),
                seq: 1,
                coord_send_ns: sent
            }
        );
        // A stranger with the right key, a forgery under another key, then
        // a made-up probe: dropped.
        stranger.send_to(&answer(&reg, 1, sent, 0), at).unwrap();
        let forged = answer_under(reg.token(), &[1u8; 32], 1, sent, 0);
        agent.send_to(&forged, at).unwrap();
        agent.send_to(&answer(&reg, 99, sent, 0), at).unwrap();
        // A hold can be no longer than the round trip it sits in (the port
        // clamps it): answered within 26 µs, a 40-µs hold read 26,407 ns
        // (1 of 12 suite runs). The stand-in holds as long as it says.
        std::thread::sleep(Duration::from_millis(1));
        agent.send_to(&answer(&reg, 1, sent, 40_000), at).unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(3), rx.recv())
            .await
            .expect("a sample")
            .expect("open");
        let IngestEvent::Clock { sample, host, .. } = ev else {
            panic!("not a clock event: {ev:?}")
        };
        assert_eq!(host, "node-0");
        assert!(sample.udp);
        assert_eq!(sample.agent_hold_ns, 40_000);
        assert_eq!(sample.coord_send_ns, sent);
        assert!(sample.coord_recv_ns > sent);
        // The replay of an answered probe is dropped too.
        agent.send_to(&answer(&reg, 1, sent, 0), at).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            rx.try_recv().is_err(),
            "stranger, forged, made-up or replayed answer accepted"
        );
        assert_eq!(port.dropped.load(Ordering::Relaxed), 4);

        // Forty probes unanswered: only every tenth still tries the port.
        for seq in 2..42 {
            reg.send(to, seq, probes.record(seq, false)).unwrap();
        }
        assert_eq!(reg.route(41), None);
        assert_eq!(reg.route(50), Some(to));
        drop(reg);
        assert!(
            port.peers.is_empty(),
            "token kept after the connection ended"
        );
        port.stop();
    }
}

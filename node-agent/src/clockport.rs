//! Answers the coordinator's clock probes on its UDP clock port
//! ([`slowrank_shared::clock_udp`]): the probe's arrival is the kernel's
//! stamp, the answer says how long the agent held it, so the agent's own
//! scheduling (a busy runtime, a parked thread) never enters the estimate.
//!
//! One plain thread per connection, blocked in `recv`: it wakes for a probe
//! and answers at once. It says hello every second (the coordinator learns
//! the address from it, through NAT too) and stops when its [`Responder`]
//! is dropped. Probes on the QUIC control stream are answered as before, so
//! a blocked UDP port costs accuracy, not the clock.

use std::{
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use slowrank_shared::clock_udp::{Datagram, Key, StampedSocket, Token, MAX_DATAGRAM};

use crate::clock::HostClock;

const HELLO_EVERY: Duration = Duration::from_secs(1);

/// A running responder; dropping it stops the thread within a second.
pub struct Responder {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
}

impl Responder {
    /// Binds an ephemeral UDP port and answers probes sent to `token` and
    /// MAC'd with `key`, on `clock`.
    pub fn spawn(
        coordinator: SocketAddr,
        token: Token,
        key: Key,
        clock: HostClock,
    ) -> io::Result<Self> {
        let any: SocketAddr = if coordinator.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let sock = StampedSocket::bind(any, Duration::from_millis(250))?;
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let (s, a) = (stop.clone(), answered.clone());
        thread::Builder::new()
            .name("clock-port".into())
            .spawn(move || serve(sock, coordinator, (token, key), clock, &s, &a))?;
        Ok(Self { stop, answered })
    }

    /// Probes answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(
    sock: StampedSocket,
    coordinator: SocketAddr,
    (token, key): (Token, Key),
    clock: HostClock,
    stop: &AtomicBool,
    answered: &AtomicU64,
) {
    // Counted so the coordinator can refuse a replayed hello.
    let mut hellos = 0u64;
    let mut last_hello: Option<Instant> = None;
    let mut buf = [0u8; MAX_DATAGRAM + 1];
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        if last_hello.is_none_or(|t| t.elapsed() >= HELLO_EVERY) {
            hellos += 1;
            let hello = Datagram::Hello {
                token,
                counter: hellos,
            }
            .encode(&key);
            if let Err(e) = sock.send_to(&hello, coordinator) {
                if !warned {
                    tracing::warn!(%coordinator, "clock port unreachable ({e}); clock probes stay on the control stream");
                    warned = true;
                }
            }
            last_hello = Some(Instant::now());
        }
        let Some(got) = sock.next(&mut buf) else {
            continue;
        };
        // The MAC is checked, not the source: a multi-homed coordinator
        // may answer from another of its addresses. Answers go to
        // `coordinator` whatever the source.
        let Ok(Datagram::Probe {
            token: t,
            seq,
            coord_send_ns,
        }) = Datagram::decode(&buf[..got.len], &key)
        else {
            continue;
        };
        if t != token {
            continue;
        }
        let agent_recv_ns = clock.map(got.mono_ns);
        let answer = Datagram::Answer {
            token,
            seq,
            coord_send_ns,
            agent_recv_ns,
            agent_send_ns: clock.now(),
        };
        if sock.send_to(&answer.encode(&key), coordinator).is_ok() {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in coordinator: the responder says hello, answers a probe
    /// with the echo, the kernel arrival on its clock and how long it held
    /// it; a probe under another token or key is not answered.
    #[test]
    fn answers_probes_with_arrival_and_hold() {
        let coord =
            StampedSocket::bind("127.0.0.1:0".parse().unwrap(), Duration::from_secs(3)).unwrap();
        let token = [3u8; 16];
        let key = [5u8; 32];
        let clock = HostClock::simulated(5_000_000, 0.0);
        let r = Responder::spawn(coord.local_addr().unwrap(), token, key, clock).unwrap();
        let mut buf = [0u8; 128];
        let hello = coord.recv(&mut buf).unwrap().expect("hello");
        assert_eq!(
            Datagram::decode(&buf[..hello.len], &key),
            Ok(Datagram::Hello { token, counter: 1 })
        );
        let agent = hello.from;
        let wrong = Datagram::Probe {
            token: [4u8; 16],
            seq: 1,
            coord_send_ns: 1,
        };
        coord.send_to(&wrong.encode(&key), agent).unwrap();
        let forged = Datagram::Probe {
            token,
            seq: 1,
            coord_send_ns: 1,
        };
        coord.send_to(&forged.encode(&[6u8; 32]), agent).unwrap();
        let sent = crate::clock::mono_ns();
        let probe = Datagram::Probe {
            token,
            seq: 2,
            coord_send_ns: sent,
        };
        coord.send_to(&probe.encode(&key), agent).unwrap();
        let ans = loop {
            let got = coord.recv(&mut buf).unwrap().expect("an answer");
            match Datagram::decode(&buf[..got.len], &key).unwrap() {
                Datagram::Hello { .. } => continue,
                a => break (a, got),
            }
        };
        let (
            Datagram::Answer {
                seq,
                coord_send_ns,
                agent_recv_ns,
                agent_send_ns,
                ..
            },
            got,
        ) = ans
        else {
            panic!("not an answer: {ans:?}")
        };
        assert_eq!((seq, coord_send_ns), (2, sent));
        assert!(agent_send_ns >= agent_recv_ns);
        // On this host's clock shifted by 5 ms: the probe arrived after it
        // was sent and was answered before the answer arrived.
        let recv = agent_recv_ns - 5_000_000;
        let back = agent_send_ns - 5_000_000;
        assert!(recv + 2_000 >= sent, "arrival {recv} before send {sent}");
        assert!(
            back <= got.mono_ns + 2_000,
            "answer {back} after arrival {}",
            got.mono_ns
        );
        // The count follows the send: wait for it. The wrong probes went
        // first, so by then they were read (and not answered).
        let deadline = Instant::now() + Duration::from_secs(2);
        while r.answered() < 1 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(r.answered(), 1, "a wrong token or key was answered");
    }
}

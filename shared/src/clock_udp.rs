//! The clock port: round-trip clock probes over plain UDP, stamped by the
//! kernel on arrival at both ends.
//!
//! Why not only the QUIC control stream: there every stamp is taken in user
//! space after a task wake-up, and the two legs do not wake the same way (the
//! coordinator's write hands the packet to another task, the agent answers
//! from the task that read it). On a loaded VM that left a one-sided 20–50 µs
//! error no round trip can see. Here the probe's arrival is the kernel's
//! receive stamp (`SIOCGSTAMPNS`) on each side, and the agent reports how
//! long it held the probe (NTP's four timestamps), so neither side's
//! scheduling enters the estimate; what is left is the network path.
//!
//! Datagrams are fixed-size and little-endian. Each names its connection by
//! a token and ends in a MAC (HMAC-SHA-256, first 16 bytes) under a key;
//! both were handed out on the authenticated QUIC control stream
//! ([`crate::wire::ClockPort`]), and only the token is ever sent in clear.
//! Without the MAC anyone on the path could rewrite an answer's agent
//! times and move the host's clock; with it, such a datagram is dropped.
//!
//! ```text
//!  0  4  magic "SRCK"      5  u8 kind      8  [u8; 16] token
//!  4  u8 version (2)       6  2 zero bytes
//! kind 1 hello  (agent → coordinator): MAC                          40 bytes
//! kind 2 probe  (coordinator → agent): seq, coord_send_ns, MAC      56 bytes
//! kind 3 answer (agent → coordinator): seq, coord_send_ns,
//!                                      agent_recv_ns, agent_send_ns, MAC 72 bytes
//! ```

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    time::Duration,
};

const MAGIC: [u8; 4] = *b"SRCK";
/// 3: the hello carries a counter, so a replayed hello is refused.
const VERSION: u8 = 3;
const MAC_LEN: usize = 16;
/// Longest datagram (the answer).
pub const MAX_DATAGRAM: usize = 72;

/// Names a connection on the clock port (sent in clear).
pub type Token = [u8; 16];
/// Authenticates its datagrams (never sent outside TLS).
pub type Key = [u8; 32];

/// One clock-port datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datagram {
    /// "Here I am": lets the coordinator learn the agent's address (through
    /// NAT as well); repeated every second. `counter` grows with every hello
    /// of the connection: the coordinator takes only a hello newer than the
    /// last it took, so one replayed from elsewhere cannot move the route.
    Hello { token: Token, counter: u64 },
    Probe {
        token: Token,
        seq: u64,
        coord_send_ns: u64,
    },
    Answer {
        token: Token,
        seq: u64,
        coord_send_ns: u64,
        /// Agent clock when the probe arrived (kernel stamp).
        agent_recv_ns: u64,
        /// Agent clock just before the answer was sent.
        agent_send_ns: u64,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DatagramError {
    #[error("clock datagram of {0} bytes has the wrong size for its kind")]
    Size(usize),
    #[error("not a slowrank clock datagram (bad magic or version)")]
    Foreign,
    #[error("unknown clock datagram kind {0}")]
    Kind(u8),
    #[error("clock datagram fails its MAC (forged, altered or another connection's)")]
    Mac,
}

fn mac(key: &Key, body: &[u8]) -> [u8; MAC_LEN] {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&k, body);
    tag.as_ref()[..MAC_LEN].try_into().expect("16 bytes")
}

impl Datagram {
    pub fn token(&self) -> &Token {
        match self {
            Self::Hello { token, .. } | Self::Probe { token, .. } | Self::Answer { token, .. } => {
                token
            }
        }
    }

    /// The datagram's bytes, MAC'd under `key`.
    pub fn encode(&self, key: &Key) -> Vec<u8> {
        let (kind, words): (u8, &[u64]) = match self {
            Self::Hello { counter, .. } => (1, std::slice::from_ref(counter)),
            Self::Probe {
                seq, coord_send_ns, ..
            } => (2, &[*seq, *coord_send_ns]),
            Self::Answer {
                seq,
                coord_send_ns,
                agent_recv_ns,
                agent_send_ns,
                ..
            } => (3, &[*seq, *coord_send_ns, *agent_recv_ns, *agent_send_ns]),
        };
        let mut out = Vec::with_capacity(MAX_DATAGRAM);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, kind, 0, 0]);
        out.extend_from_slice(self.token());
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        let tag = mac(key, &out);
        out.extend_from_slice(&tag);
        out
    }

    /// The token a datagram claims, to find its key: checks only the
    /// header and the size for its kind.
    pub fn token_of(b: &[u8]) -> Result<Token, DatagramError> {
        if b.len() < 24 + MAC_LEN {
            return Err(DatagramError::Size(b.len()));
        }
        if b[0..4] != MAGIC || b[4] != VERSION {
            return Err(DatagramError::Foreign);
        }
        let want = match b[5] {
            1 => 32,
            2 => 40,
            3 => 56,
            k => return Err(DatagramError::Kind(k)),
        } + MAC_LEN;
        if b.len() != want {
            return Err(DatagramError::Size(b.len()));
        }
        Ok(b[8..24].try_into().expect("16 bytes"))
    }

    /// Checks the datagram against `key` and reads it.
    pub fn decode(b: &[u8], key: &Key) -> Result<Self, DatagramError> {
        let token = Self::token_of(b)?;
        let (body, tag) = b.split_at(b.len() - MAC_LEN);
        // Constant-time check of the truncated tag.
        if !constant_eq(&mac(key, body), tag) {
            return Err(DatagramError::Mac);
        }
        let word = |i: usize| u64::from_le_bytes(b[24 + 8 * i..32 + 8 * i].try_into().expect("8"));
        Ok(match b[5] {
            1 => Self::Hello {
                token,
                counter: word(0),
            },
            2 => Self::Probe {
                token,
                seq: word(0),
                coord_send_ns: word(1),
            },
            _ => Self::Answer {
                token,
                seq: word(0),
                coord_send_ns: word(1),
                agent_recv_ns: word(2),
                agent_send_ns: word(3),
            },
        })
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// CLOCK_MONOTONIC in ns.
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_MONOTONIC and CLOCK_REALTIME at one moment: the realtime read
/// bracketed by two monotonic ones, the narrowest of a few tries kept. Two
/// plain reads in a row were apart by however long the thread was
/// preempted between them, and a datagram's monotonic arrival, carried over
/// from its realtime stamp, was off by as much: beside a CPU hog a clock
/// probe's answer was 1 ms off the truth (`tests/tests/quic.rs`).
pub fn paired_clocks() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..8 {
        let before = mono_ns();
        let real = clock_ns(libc::CLOCK_REALTIME);
        let after = mono_ns();
        let width = after.saturating_sub(before);
        if width < best.0 {
            best = (width, before + width / 2, real);
        }
        // Two vDSO reads take well under a microsecond unpreempted.
        if width <= 2_000 {
            break;
        }
    }
    (best.1, best.2)
}

/// `clock_gettime(id)` in ns.
pub fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `SIOCGSTAMPNS` (linux/sockios.h): the receive stamp of the last datagram read.
const SIOCGSTAMPNS: libc::c_ulong = 0x8907;

/// A UDP socket whose reads return when each datagram reached the host.
#[derive(Debug)]
pub struct StampedSocket {
    sock: UdpSocket,
}

/// One datagram read from a [`StampedSocket`].
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    /// CLOCK_MONOTONIC ns at arrival: the kernel's stamp, or the read's own
    /// time where the kernel gave none (later than the truth, so a bound
    /// built on it stays valid, only wider).
    pub mono_ns: u64,
    pub kernel_stamped: bool,
}

impl StampedSocket {
    /// Binds `addr` and asks the kernel to stamp arrivals. `timeout` bounds
    /// each read so a thread serving the socket can notice it should stop.
    pub fn bind(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let sock = UdpSocket::bind(addr)?;
        sock.set_read_timeout(Some(timeout))?;
        // The first SIOCGSTAMPNS turns stamping on for the socket (it has
        // nothing to return yet: ENOENT). SO_TIMESTAMPNS would instead move
        // the stamp into control messages and leave the ioctl without one.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid fd; SIOCGSTAMPNS writes one timespec.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGSTAMPNS as _, &mut ts) };
        let err = io::Error::last_os_error();
        if rc != 0 && err.raw_os_error() != Some(libc::ENOENT) {
            return Err(err);
        }
        Ok(Self { sock })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.sock.send_to(buf, to)
    }

    /// Reads one datagram for a serving loop: `None` when the read timed
    /// out or failed (a failing socket is tried again 100 ms later, so a
    /// loop around it neither spins nor stops; unconnected UDP sockets
    /// practically never fail a read).
    pub fn next(&self, buf: &mut [u8]) -> Option<Received> {
        match self.recv(buf) {
            Ok(r) => r,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                None
            }
        }
    }

    /// Reads one datagram; `Ok(None)` when the read timed out.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let (len, from) = match self.sock.recv_from(buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let (now_mono, now_real) = paired_clocks();
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid fd; SIOCGSTAMPNS writes one timespec.
        let rc = unsafe { libc::ioctl(self.sock.as_raw_fd(), SIOCGSTAMPNS as _, &mut ts) };
        let stamp_real = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        // The stamp is on the realtime clock; the age it gives is carried
        // over to the monotonic one. A datagram the kernel did not stamp
        // (stamping is switched on system-wide a moment after the first
        // request) gets the ioctl's own time, after `now_real`: its "age"
        // wraps and the read time is used, as it is after a clock step.
        let age = now_real.wrapping_sub(stamp_real);
        let (mono_ns, kernel_stamped) = if rc == 0 && stamp_real != 0 && age < 1_000_000_000 {
            (now_mono - age, true)
        } else {
            (now_mono, false)
        };
        Ok(Some(Received {
            len,
            from,
            mono_ns,
            kernel_stamped,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_clocks_read_monotonic_within_the_call() {
        for _ in 0..100 {
            let before = mono_ns();
            let (mono, real) = paired_clocks();
            let after = mono_ns();
            assert!(before <= mono && mono <= after, "{before} {mono} {after}");
            assert!(real > 1_600_000_000_000_000_000, "realtime {real}");
        }
    }

    #[test]
    fn datagrams_round_trip_and_reject_garbage_and_forgeries() {
        let token = [7u8; 16];
        let key = [9u8; 32];
        for d in [
            Datagram::Hello { token, counter: 7 },
            Datagram::Probe {
                token,
                seq: 3,
                coord_send_ns: 99,
            },
            Datagram::Answer {
                token,
                seq: 3,
                coord_send_ns: 99,
                agent_recv_ns: 5,
                agent_send_ns: 6,
            },
        ] {
            let b = d.encode(&key);
            assert_eq!(Datagram::token_of(&b), Ok(token));
            assert_eq!(Datagram::decode(&b, &key), Ok(d));
            assert_eq!(
                Datagram::decode(&b[..b.len() - 1], &key),
                Err(DatagramError::Size(b.len() - 1))
            );
            // Another connection's key, or one flipped bit of a time.
            assert_eq!(Datagram::decode(&b, &[8u8; 32]), Err(DatagramError::Mac));
            let mut altered = b.clone();
            altered[b.len() - MAC_LEN - 1] ^= 1;
            assert_eq!(Datagram::decode(&altered, &key), Err(DatagramError::Mac));
        }
        let mut b = Datagram::Hello { token, counter: 1 }.encode(&key);
        b[0] = b'X';
        assert_eq!(Datagram::decode(&b, &key), Err(DatagramError::Foreign));
        b[0] = b'S';
        b[5] = 9;
        assert_eq!(Datagram::decode(&b, &key), Err(DatagramError::Kind(9)));
        assert_eq!(Datagram::decode(&[0; 3], &key), Err(DatagramError::Size(3)));
    }

    /// The kernel stamps arrivals: a datagram read 30 ms after it was sent
    /// reports when it arrived, not when it was read.
    #[test]
    fn reads_return_the_kernel_arrival_time() {
        let a =
            StampedSocket::bind("127.0.0.1:0".parse().unwrap(), Duration::from_secs(2)).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Stamping is switched on system-wide by deferred work: until then
        // a datagram carries the read time (and says so). Give it a few tries.
        for _ in 0..10 {
            let sent = mono_ns();
            b.send_to(b"x", a.local_addr().unwrap()).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            let mut buf = [0u8; 8];
            let r = a.recv(&mut buf).unwrap().expect("a datagram");
            let read = mono_ns();
            assert_eq!(r.len, 1);
            if !r.kernel_stamped {
                assert!(
                    r.mono_ns >= read - 1_000_000,
                    "unstamped, yet not the read time"
                );
                continue;
            }
            assert!(
                r.mono_ns >= sent - 1_000,
                "stamp {} before send {sent}",
                r.mono_ns
            );
            assert!(
                read - r.mono_ns >= 25_000_000,
                "stamp {} is the read time {read}, not the arrival",
                r.mono_ns
            );
            return;
        }
        panic!("no datagram in ten was stamped by the kernel");
    }
}

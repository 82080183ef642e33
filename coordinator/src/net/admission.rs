//! Who may hold a connection to the coordinator, and for how long, as
//! plain data (the QUIC side in [`crate::net::ingest`] asks; nothing here does IO).
//!
//! - [`PreauthGate`]: connections that have not yet said a valid hello are
//!   capped per source address and in total, so nobody without the token can
//!   hold more than a bounded amount of the coordinator's memory.
//! - [`LiveClaims`]: with a shared token, the first live connection of an
//!   agent id and of a host owns them; a second live connection claiming
//!   either is refused (an impostor cannot feed that host's clock model,
//!   poison its batch numbering, or end its session by leaving).
//! - [`LogLimiter`]: refusals are logged at a bounded rate (an attacker must
//!   not be able to fill the disk through the log either).

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    time::{Duration, Instant},
};

/// Connections from one source address still before their hello. A host
/// runs one agent, which opens one connection at a time (a reconnect after
/// a dropped link can briefly overlap the old one); 8 leaves room for NAT
/// (several hosts behind one address) without letting one address pin more
/// than 8 × the pre-hello window.
pub const MAX_PREAUTH_PER_ADDR: u32 = 8;

/// Connections before their hello, from everybody. 512 agents reconnecting
/// at once after a coordinator restart fit (refused ones retry within 5 s);
/// each costs at most the pre-hello receive window plus QUIC's own
/// per-connection state, so the total stays in the tens of MiB.
pub const MAX_PREAUTH_TOTAL: u32 = 1024;

/// Connections that found every pre-hello place taken, waiting for one.
/// Refused, an agent backs off (0.2 s doubling to 5 s), so 2,048 hosts
/// connecting at once to a busy coordinator took 14 s to all get in; a
/// waiting connection costs only its first datagrams until admitted
/// (quinn holds them, within its bounds on handshakes not yet answered:
/// [`MAX_PREAUTH_TOTAL`] in progress plus these).
pub const MAX_WAITING: usize = MAX_PREAUTH_TOTAL as usize;

/// How long a connection may wait for a pre-hello place: well inside the
/// agent's connect timeout, so one admitted late still finds its agent.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// At most one log line per this interval for each kind of refusal; the
/// rest are counted and the count is said on the next line.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// Why a connection was turned away before its hello was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PreauthRefusal {
    #[error("too many connections before hello from this address (cap {MAX_PREAUTH_PER_ADDR})")]
    PerAddress,
    #[error("too many connections before hello in total (cap {MAX_PREAUTH_TOTAL})")]
    Total,
    #[error("no place before hello came free within {MAX_WAIT:?}")]
    Waited,
}

impl PreauthRefusal {
    /// The label it is counted under.
    pub fn label(self) -> &'static str {
        match self {
            Self::PerAddress => "preauth_per_address",
            Self::Total => "preauth_total",
            Self::Waited => "preauth_waited",
        }
    }
}

/// Counts of connections that have not said hello yet.
#[derive(Debug)]
pub struct PreauthGate {
    per_addr: HashMap<IpAddr, u32>,
    total: u32,
    max_per_addr: u32,
    max_total: u32,
}

impl Default for PreauthGate {
    fn default() -> Self {
        Self::new(MAX_PREAUTH_PER_ADDR, MAX_PREAUTH_TOTAL)
    }
}

impl PreauthGate {
    pub fn new(max_per_addr: u32, max_total: u32) -> Self {
        Self {
            per_addr: HashMap::new(),
            total: 0,
            max_per_addr,
            max_total,
        }
    }

    /// Admits one more pre-hello connection from `addr`, or says why not.
    /// Every admission must be paired with one [`PreauthGate::release`].
    pub fn admit(&mut self, addr: IpAddr) -> Result<(), PreauthRefusal> {
        if self.total >= self.max_total {
            return Err(PreauthRefusal::Total);
        }
        let n = self.per_addr.entry(addr).or_insert(0);
        if *n >= self.max_per_addr {
            return Err(PreauthRefusal::PerAddress);
        }
        *n += 1;
        self.total += 1;
        Ok(())
    }

    /// The connection said hello (or went away).
    pub fn release(&mut self, addr: IpAddr) {
        if let Some(n) = self.per_addr.get_mut(&addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_addr.remove(&addr);
            }
            self.total = self.total.saturating_sub(1);
        }
    }

    /// Pre-hello connections now.
    pub fn pending(&self) -> u32 {
        self.total
    }
}

/// Connections waiting for a pre-hello place ([`PreauthGate`]), oldest
/// first; each is admitted when a place frees or refused once it waited
/// `max_wait` (or, on arrival, when `cap` are waiting already).
#[derive(Debug)]
pub struct WaitLine<T> {
    queue: VecDeque<(Instant, IpAddr, T)>,
    cap: usize,
    max_wait: Duration,
}

/// What one [`WaitLine::admit`] decided.
#[derive(Debug)]
pub struct Decided<T> {
    /// Given a place in the gate: to be served now.
    pub admitted: Vec<(IpAddr, T)>,
    /// To be refused, and why.
    pub refused: Vec<(IpAddr, T, PreauthRefusal)>,
}

impl<T> Default for WaitLine<T> {
    fn default() -> Self {
        Self::new(MAX_WAITING, MAX_WAIT)
    }
}

impl<T> WaitLine<T> {
    pub fn new(cap: usize, max_wait: Duration) -> Self {
        Self {
            queue: VecDeque::new(),
            cap,
            max_wait,
        }
    }

    /// Puts a connection in line; gives it back when the line is full.
    pub fn push(&mut self, now: Instant, ip: IpAddr, item: T) -> Result<(), T> {
        if self.queue.len() >= self.cap {
            return Err(item);
        }
        self.queue.push_back((now, ip, item));
        Ok(())
    }

    /// Admits waiting connections, oldest first, while `gate` has places;
    /// refuses those that waited too long, and one whose address holds
    /// its share of places already.
    pub fn admit(&mut self, gate: &mut PreauthGate, now: Instant) -> Decided<T> {
        let mut d = Decided {
            admitted: Vec::new(),
            refused: Vec::new(),
        };
        while let Some((since, ip, _)) = self.queue.front() {
            let (since, ip) = (*since, *ip);
            if now.saturating_duration_since(since) > self.max_wait {
                let (_, ip, item) = self.queue.pop_front().expect("front");
                d.refused.push((ip, item, PreauthRefusal::Waited));
                continue;
            }
            match gate.admit(ip) {
                Ok(()) => {
                    let (_, ip, item) = self.queue.pop_front().expect("front");
                    d.admitted.push((ip, item));
                }
                Err(PreauthRefusal::Total) => break,
                Err(why) => {
                    let (_, ip, item) = self.queue.pop_front().expect("front");
                    d.refused.push((ip, item, why));
                }
            }
        }
        d
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Why an authenticated hello was still refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("agent id {0:?} is already connected")]
    AgentInUse(String),
    #[error("host {0:?} already has a connected agent")]
    HostInUse(String),
}

impl ClaimError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::AgentInUse(_) => "agent_id_in_use",
            Self::HostInUse(_) => "host_in_use",
        }
    }
}

/// Which live connection owns each agent id and each host.
#[derive(Debug, Default)]
pub struct LiveClaims {
    agents: HashMap<String, u64>,
    hosts: HashMap<String, u64>,
}

impl LiveClaims {
    /// Connection `conn` claims `agent_id` on `host`: granted only when no
    /// other live connection holds either.
    pub fn claim(&mut self, agent_id: &str, host: &str, conn: u64) -> Result<(), ClaimError> {
        if self.agents.get(agent_id).is_some_and(|c| *c != conn) {
            return Err(ClaimError::AgentInUse(agent_id.to_owned()));
        }
        if self.hosts.get(host).is_some_and(|c| *c != conn) {
            return Err(ClaimError::HostInUse(host.to_owned()));
        }
        self.agents.insert(agent_id.to_owned(), conn);
        self.hosts.insert(host.to_owned(), conn);
        Ok(())
    }

    /// Connection `conn` went away: it gives up what it held (and nothing
    /// another connection holds).
    pub fn release(&mut self, agent_id: &str, host: &str, conn: u64) {
        if self.agents.get(agent_id) == Some(&conn) {
            self.agents.remove(agent_id);
        }
        if self.hosts.get(host) == Some(&conn) {
            self.hosts.remove(host);
        }
    }

    pub fn live(&self) -> usize {
        self.agents.len()
    }
}

/// One log line per [`LOG_EVERY`] at most.
#[derive(Debug, Default)]
pub struct LogLimiter {
    last: Option<u64>,
    suppressed: u64,
}

impl LogLimiter {
    /// At coordinator time `now_ns`: `Some(n)` when a line may be written
    /// (`n` lines were suppressed since the last one), `None` to stay quiet.
    pub fn allow(&mut self, now_ns: u64) -> Option<u64> {
        let every = LOG_EVERY.as_nanos() as u64;
        match self.last {
            Some(t) if now_ns.saturating_sub(t) < every => {
                self.suppressed = self.suppressed.saturating_add(1);
                None
            }
            _ => {
                self.last = Some(now_ns);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preauth_caps_per_address_and_in_total() {
        let (a, b, c) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let mut g = PreauthGate::new(2, 3);
        assert!(g.admit(a).is_ok());
        assert!(g.admit(a).is_ok());
        assert_eq!(g.admit(a), Err(PreauthRefusal::PerAddress));
        assert!(g.admit(b).is_ok());
        assert_eq!(g.admit(c), Err(PreauthRefusal::Total));
        g.release(a);
        assert_eq!(g.pending(), 2);
        assert!(g.admit(c).is_ok());
        // A release for an address never admitted changes nothing.
        g.release("10.9.9.9".parse().unwrap());
        assert_eq!(g.pending(), 3);
        for ip in [a, b, c] {
            g.release(ip);
        }
        assert_eq!(g.pending(), 0);
        assert!(g.per_addr.is_empty());
    }

    /// A connection that found the gate full waits its turn instead of
    /// being refused: admitted as places free, oldest first; refused once
    /// it waited too long, or on arrival when the line is full.
    #[test]
    fn a_full_gate_lines_connections_up_instead_of_refusing_them() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let t0 = Instant::now();
        let mut g = PreauthGate::new(2, 2);
        let mut line = WaitLine::new(3, Duration::from_secs(2));
        g.admit(ip("10.0.0.1")).unwrap();
        g.admit(ip("10.0.0.2")).unwrap();
        for (n, a) in ["10.0.0.3", "10.0.0.4", "10.0.0.5"].iter().enumerate() {
            assert!(line.push(t0, ip(a), n).is_ok());
        }
        assert_eq!(line.push(t0, ip("10.0.0.6"), 9), Err(9), "line full");
        let d = line.admit(&mut g, t0);
        assert!(d.admitted.is_empty() && d.refused.is_empty());
        g.release(ip("10.0.0.1"));
        let d = line.admit(&mut g, t0 + Duration::from_secs(1));
        assert_eq!(d.admitted, vec![(ip("10.0.0.3"), 0)], "oldest first");
        assert_eq!((line.len(), g.pending()), (2, 2));
        g.release(ip("10.0.0.2"));
        let d = line.admit(&mut g, t0 + Duration::from_secs(3));
        assert!(d.admitted.is_empty());
        assert_eq!(d.refused.len(), 2, "waited past max_wait");
        assert!(d.refused.iter().all(|r| r.2 == PreauthRefusal::Waited));
        assert!(line.is_empty());
        // An address at its own cap is refused from the line, not kept.
        let mut g = PreauthGate::new(1, 2);
        g.admit(ip("10.0.0.1")).unwrap();
        line.push(t0, ip("10.0.0.1"), 7).unwrap();
        line.push(t0, ip("10.0.0.2"), 8).unwrap();
        let d = line.admit(&mut g, t0);
        assert_eq!(d.refused[0].2, PreauthRefusal::PerAddress);
        assert_eq!(d.admitted, vec![(ip("10.0.0.2"), 8)]);
    }

    #[test]
    fn second_live_claim_of_an_agent_or_host_is_refused() {
        let mut l = LiveClaims::default();
        l.claim("a0", "h0", 1).unwrap();
        assert_eq!(
            l.claim("a0", "h9", 2),
            Err(ClaimError::AgentInUse("a0".into()))
        );
        assert_eq!(
            l.claim("a9", "h0", 2),
            Err(ClaimError::HostInUse("h0".into()))
        );
        // The impostor leaving frees nothing of the owner's.
        l.release("a0", "h0", 2);
        assert_eq!(
            l.claim("a0", "h0", 3),
            Err(ClaimError::AgentInUse("a0".into()))
        );
        // Once the owner is gone, the next connection may have them.
        l.release("a0", "h0", 1);
        assert_eq!(l.live(), 0);
        l.claim("a0", "h0", 3).unwrap();
    }

    #[test]
    fn log_lines_are_rate_limited_and_count_what_was_held_back() {
        let mut l = LogLimiter::default();
        let s = 1_000_000_000u64;
        assert_eq!(l.allow(10 * s), Some(0));
        assert_eq!(l.allow(11 * s), None);
        assert_eq!(l.allow(12 * s), None);
        assert_eq!(l.allow(15 * s), Some(2));
        assert_eq!(l.allow(16 * s), None);
    }
}

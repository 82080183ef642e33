//! `communication` faults as real `tc` shaping, when hosts are network
//! namespaces ([`crate::netns`]).
//!
//! The simulated collectives meet at the hub and their timing comes from the
//! cost model, so the job's data never crosses a host's veth and shaping the
//! veth alone would slow nothing but the agent's uplink. Instead every NIC's
//! port gets a small physical *replica* on its host's `eth0`: an htb class
//! of [`wire::PORT_RATE_BPS`] (50 Mbit/s) that carries only the datagrams of
//! that rank's port monitor (UDP source port [`wire::source_port`]); all
//! other traffic (the agent's uplink) falls into an unshaped 10 Gbit/s
//! default class. The port monitor in the `libmlx5.so.1` stand-in times a
//! burst through its class every [`wire::PERIOD`] against the launcher's
//! echo sink ([`EchoSink`]) and feeds the measured fraction of nominal
//! bandwidth to the NIC and the cost model. A communication fault changes
//! the rate of its rank's class (`tc class change`), so the slowdown the
//! job sees went through a real, shaped link and was measured there.
//!
//! Only bandwidth is shaped: htb cannot add a fixed delay and this machine
//! has no netem, so a fault's `extra_latency_us` stays a model knob, and so
//! do `link` faults (one pair of NICs has no link of its own on a veth).
//!
//! Shaping is on when hosts are namespaces and the spec has at least one
//! communication fault; the ranks learn it from [`slowrank_sim::env::WIRE`].

use std::{
    collections::{BTreeSet, HashMap},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use slowrank_sim::{clock, wire};
use tracing::{debug, info, warn};

use crate::{
    command::{self, CommandError},
    layout::Layout,
    netns::Network,
    spec::{FaultKind, Spec},
};

/// The interface of a host inside its namespace.
const DEV: &str = "eth0";
/// Rate of the default class: everything that is not a port replica.
const DEFAULT_RATE: &str = "10gbit";
/// htb quantum of every class: one Ethernet frame (silences htb's
/// "quantum is big" warnings at these rates).
const QUANTUM: &str = "1514";

#[derive(Debug, thiserror::Error)]
pub enum ShapingError {
    #[error("{0}; are tc (iproute2) and the htb/u32 modules available?")]
    Command(#[from] CommandError),
    #[error("cannot start the port echo sink: {0}")]
    Sink(#[source] std::io::Error),
}

/// Whether `spec` run on `net` gets its ports shaped.
pub fn wanted(spec: &Spec, net: &Network) -> bool {
    !net.hosts.is_empty()
        && spec
            .faults
            .iter()
            .any(|f| f.kind == FaultKind::Communication)
}

fn tc(netns: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ShapingError> {
    let mut all = vec!["-n", netns];
    all.extend_from_slice(args);
    Ok(command::run("tc", &all, stdin)?)
}

/// `htb` parameters of a port class at `bw` of nominal bandwidth.
fn port_class_args(bw: f64) -> String {
    let b = wire::BUCKET_BYTES;
    format!(
        "htb rate {}bit burst {b} cburst {b} quantum {QUANTUM}",
        wire::class_rate_bps(bw)
    )
}

/// The `tc -batch` script that gives host `eth0` its classes.
fn install_script(ranks_per_host: u32) -> String {
    let mut s = format!(
        "qdisc add dev {DEV} root handle 1: htb default 1\n\
         class add dev {DEV} parent 1: classid 1:1 htb rate {DEFAULT_RATE} quantum {QUANTUM}\n"
    );
    for local in 0..ranks_per_host {
        let class = wire::class_id(local);
        s.push_str(&format!(
            "class add dev {DEV} parent 1: classid {class} {}\n\
             filter add dev {DEV} parent 1: protocol ip prio 1 u32 match ip sport {} 0xffff flowid {class}\n",
            port_class_args(1.0),
            wire::source_port(local),
        ));
    }
    s
}

/// The burst each sender is sending: its sequence number and the kernel
/// receive times of its datagrams so far.
#[derive(Debug, Default)]
struct Bursts {
    current: HashMap<SocketAddr, (u64, Vec<u64>)>,
}

impl Bursts {
    /// Datagram `seq` (`last` of its burst or not) from `from` arrived at
    /// `at_ns`: the echo to send back when it closes a burst.
    fn on_datagram(
        &mut self,
        from: SocketAddr,
        seq: u64,
        last: bool,
        at_ns: u64,
    ) -> Option<[u8; 16]> {
        let e = self.current.entry(from).or_insert((seq, Vec::new()));
        // Bursts queue in order behind each other in their class: a new
        // sequence number starts a new burst.
        if e.0 != seq {
            e.0 = seq;
            e.1.clear();
        }
        // A burst is at most BURST_PACKETS datagrams; a bigger one is not
        // a port monitor's and must not grow the sink without bound.
        if e.1.len() < wire::BURST_PACKETS {
            e.1.push(at_ns);
        }
        last.then(|| wire::encode_echo(seq, wire::pace(&e.1)))
    }
}

/// `recvmsg` with the kernel's receive timestamp (`SO_TIMESTAMPNS`, ns of
/// `CLOCK_REALTIME`), or the current time when it brought none.
fn recv_stamped(sock: &UdpSocket, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr, u64)> {
    // SAFETY: plain recvmsg into buffers that outlive the call; the control
    // messages are read within the length the kernel reports, unaligned.
    unsafe {
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 16];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = (&mut addr as *mut libc::sockaddr_in).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, 0);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut at_ns = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                at_ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        let from = SocketAddr::from((
            Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            u16::from_be(addr.sin_port),
        ));
        Ok((n as usize, from, at_ns.unwrap_or_else(clock::wall_ns)))
    }
}

/// Answers the last datagram of every port-monitor burst with its sequence
/// number and the burst's pace (see [`wire`]), from the kernel's receive
/// timestamps so that the sink's own scheduling does not count. Runs in the
/// launcher's namespace, so a burst crosses its host's veth (and its shaped
/// class) on the way; the echo comes back unshaped. Stops on drop.
pub struct EchoSink {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoSink {
    pub fn start() -> std::io::Result<Self> {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        let on: libc::c_int = 1;
        // SAFETY: setsockopt on our socket with an int option.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Every rank's bursts land here at once: room for many bursts, so a
        // sink thread that waits for a CPU loses no datagram (FORCE needs
        // root, which shaping has; the plain option is the fallback).
        let bytes: libc::c_int = 8 << 20;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            // SAFETY: setsockopt on our socket with an int option.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&bytes as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                break;
            }
        }
        // Bounded waits so that a drop is seen.
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let port = sock.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("port-echo".into())
            .spawn(move || {
                let mut buf = vec![0u8; 2048];
                let mut bursts = Bursts::default();
                while !flag.load(Ordering::Relaxed) {
                    let Ok((n, from, at_ns)) = recv_stamped(&sock, &mut buf) else {
                        continue;
                    };
                    let Some((seq, last)) = wire::decode(&buf[..n]) else {
                        continue;
                    };
                    if let Some(echo) = bursts.on_datagram(from, seq, last, at_ns) {
                        let _ = sock.send_to(&echo, from);
                    }
                }
            })?;
        Ok(Self {
            port,
            stop,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for EchoSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A host's namespace as shaping needs it.
struct ShapedHost {
    host: u32,
    netns: String,
    outer: Ipv4Addr,
}

/// The shaped ports of one run: classes installed, echo sink running, and
/// which communication faults are on for which rank.
pub struct Shaping {
    hosts: Vec<ShapedHost>,
    layout: Layout,
    /// Bandwidth fraction of each communication fault (by spec index).
    fault_bw: HashMap<usize, f64>,
    /// Active communication faults per rank.
    active: HashMap<u32, BTreeSet<usize>>,
    /// Rate each rank's class has now (fraction of nominal).
    applied: HashMap<u32, f64>,
    sink: EchoSink,
}

impl Shaping {
    /// Installs the port classes on every host of `net` and starts the
    /// echo sink.
    pub fn install(spec: &Spec, net: &Network) -> Result<Self, ShapingError> {
        let sink = EchoSink::start().map_err(ShapingError::Sink)?;
        let script = install_script(spec.ranks_per_host);
        for h in &net.hosts {
            tc(&h.netns, &["-batch", "-"], Some(&script))?;
        }
        info!(
            "shaping: {} ports per host replicated on each host's {DEV} at {} Mbit/s \
             (htb classes 1:10.., UDP source ports {}..), echo sink on port {}",
            spec.ranks_per_host,
            wire::PORT_RATE_BPS / 1_000_000,
            wire::SOURCE_PORT_BASE,
            sink.port()
        );
        Ok(Self {
            hosts: net
                .hosts
                .iter()
                .map(|h| ShapedHost {
                    host: h.host,
                    netns: h.netns.clone(),
                    outer: h.outer,
                })
                .collect(),
            layout: spec.layout(),
            fault_bw: spec
                .faults
                .iter()
                .enumerate()
                .filter(|(_, f)| f.kind == FaultKind::Communication)
                .map(|(i, f)| (i, f.network().1))
                .collect(),
            active: HashMap::new(),
            applied: HashMap::new(),
            sink,
        })
    }

    fn host(&self, host: u32) -> Option<&ShapedHost> {
        self.hosts.iter().find(|h| h.host == host)
    }

    /// The echo sink as reached from `host` (the value of [`slowrank_sim::env::WIRE`]
    /// for its ranks).
    pub fn wire_addr(&self, host: u32) -> Option<SocketAddr> {
        self.host(host)
            .map(|h| SocketAddr::from((h.outer, self.sink.port())))
    }

    /// Fault `fault` turned on or off on `rank`: re-shapes the rank's port
    /// if its combined bandwidth changed (the smallest fraction of its
    /// active communication faults, as the injector combines them).
    pub fn on_fault(&mut self, fault: usize, rank: u32, active: bool) {
        if !self.fault_bw.contains_key(&fault) {
            return;
        }
        let set = self.active.entry(rank).or_default();
        if active {
            set.insert(fault);
        } else {
            set.remove(&fault);
        }
        let bw = set
            .iter()
            .filter_map(|i| self.fault_bw.get(i))
            .fold(1f64, |a, b| a.min(*b));
        if self.applied.get(&rank).copied().unwrap_or(1.0) == bw {
            return;
        }
        let (host, local) = (self.layout.host_of(rank), self.layout.local_of(rank));
        match self.set_port(host, local, bw) {
            Ok(()) => {
                info!(
                    "shaping: rank {rank} (host {host}, class {}) port at {:.3} of nominal ({} bit/s)",
                    wire::class_id(local),
                    bw,
                    wire::class_rate_bps(bw)
                );
                self.applied.insert(rank, bw);
            }
            Err(e) => warn!("shaping: cannot re-shape rank {rank}'s port: {e}"),
        }
    }

    /// Sets the rate of port `local` of `host` to `bw` of nominal.
    pub fn set_port(&self, host: u32, local: u32, bw: f64) -> Result<(), ShapingError> {
        let Some(h) = self.host(host) else {
            return Ok(());
        };
        let class = wire::class_id(local);
        let htb = port_class_args(bw);
        let mut args = vec![
            "class", "change", "dev", DEV, "parent", "1:", "classid", &class,
        ];
        args.extend(htb.split(' '));
        tc(&h.netns, &args, None).map(drop)
    }

    /// Writes each host's final `tc -s class show` to `logs/tc-host-N.txt`
    /// under `logs` (the namespaces, and their counters, are deleted when
    /// the run ends).
    pub fn save_stats(&self, logs: &Path) {
        for h in &self.hosts {
            let path = logs.join(format!("tc-host-{}.txt", h.host));
            match tc(&h.netns, &["-s", "class", "show", "dev", DEV], None) {
                Ok(text) => {
                    if let Err(e) = std::fs::write(&path, text) {
                        warn!("shaping: cannot write {}: {e}", path.display());
                    } else {
                        debug!("shaping: host {} classes in {}", h.host, path.display());
                    }
                }
                Err(e) => warn!("shaping: cannot read host {}'s classes: {e}", h.host),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_script_has_one_class_and_filter_per_port() {
        let s = install_script(2);
        assert_eq!(
            s,
            "qdisc add dev eth0 root handle 1: htb default 1\n\
             class add dev eth0 parent 1: classid 1:1 htb rate 10gbit quantum 1514\n\
             class add dev eth0 parent 1: classid 1:10 htb rate 50000000bit burst 1600 cburst 1600 quantum 1514\n\
             filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip sport 47000 0xffff flowid 1:10\n\
             class add dev eth0 parent 1: classid 1:11 htb rate 50000000bit burst 1600 cburst 1600 quantum 1514\n\
             filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip sport 47001 0xffff flowid 1:11\n"
        );
        assert_eq!(
            port_class_args(0.1),
            "htb rate 5000000bit burst 1600 cburst 1600 quantum 1514"
        );
    }

    #[test]
    fn the_echo_sink_answers_only_last_datagrams() {
        let sink = EchoSink::start().unwrap();
        let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        s.connect((Ipv4Addr::LOCALHOST, sink.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; wire::PACKET_BYTES];
        let mut burst = vec![(7, false)];
        burst.extend((0..wire::MIN_TIMED - 1).map(|_| (8, false)));
        burst.push((8, true));
        for (seq, last) in burst {
            wire::encode(&mut buf, seq, last);
            s.send(&buf).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut echo = [0u8; 32];
        let n = s.recv(&mut echo).unwrap();
        let (seq, pace) = wire::decode_echo(&echo[..n]).unwrap();
        assert_eq!(seq, 8);
        // Burst 8's datagrams went 5 ms apart (more when this thread slept
        // long).
        let pace = pace.expect("enough datagrams to time");
        assert!(
            (Duration::from_millis(4)..Duration::from_millis(200)).contains(&pace),
            "{pace:?}"
        );
        drop(sink);
    }

    #[test]
    fn bursts_are_per_sender_and_sequence_number() {
        let a: SocketAddr = "10.0.0.2:47000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:47001".parse().unwrap();
        let mut s = Bursts::default();
        let pace_of = |echo: [u8; 16]| wire::decode_echo(&echo).unwrap();
        // Burst 1 of `a`, 100 ns a gap, with burst 5 of `b` (300 ns a gap)
        // in between.
        for k in 0..wire::MIN_TIMED as u64 - 1 {
            assert_eq!(s.on_datagram(a, 1, false, 1000 + 100 * k), None);
            assert_eq!(s.on_datagram(b, 5, false, 1000 + 300 * k), None);
        }
        let last = 1000 + 100 * (wire::MIN_TIMED as u64 - 1);
        let echo = s.on_datagram(a, 1, true, last).unwrap();
        assert_eq!(pace_of(echo), (1, Some(Duration::from_nanos(100))));
        let last = 1000 + 300 * (wire::MIN_TIMED as u64 - 1);
        let echo = s.on_datagram(b, 5, true, last).unwrap();
        assert_eq!(pace_of(echo), (5, Some(Duration::from_nanos(300))));
        // Burst 2 of `a` lost most of its datagrams: no measurement.
        assert_eq!(s.on_datagram(a, 2, false, 9000), None);
        let echo = s.on_datagram(a, 2, true, 9500).unwrap();
        assert_eq!(pace_of(echo), (2, None));
    }
}

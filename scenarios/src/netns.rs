//! Hosts as network namespaces: with `hosts > 1` and root, each simulated
//! host gets its own network namespace, joined to the launcher's namespace
//! by a veth pair, and its agent and rank processes run inside it. The agent
//! then reaches the coordinator over a real link that a test can take down
//! (`ip link set ... down`) or shape (`tc`), as on a real cluster.
//!
//! Layout for host `h` of the `R`-th run of launcher pid `P`, address slot
//! `S`: namespace `slowrank-P-R-hH`; veth `srXXXXXXXXhH` (a hex tag of `P`
//! and `R`) in the launcher's namespace with
//! `10.77.S.(4h+1)/30`, its peer `eth0` inside with `10.77.S.(4h+2)/30` and a
//! default route back. Processes enter with `nsenter --net=...` (it execs
//! the program: the pid stays the one the launcher started).
//!
//! Everything is deleted on drop; namespaces left by a killed launcher are
//! deleted by the next run (their pid is gone).

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use tracing::{info, warn};

use crate::command::{self, CommandError};

/// Where `ip netns` keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Namespaces of this tool start with this.
const PREFIX: &str = "slowrank-";
/// Hosts per run (4 addresses of a /24 each).
pub const MAX_HOSTS: u32 = 63;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "hosts as network namespaces need root (CAP_NET_ADMIN); run as root or pass --no-netns"
    )]
    NotRoot,
    #[error("{hosts} hosts do not fit one address slot (at most {MAX_HOSTS}); pass --no-netns")]
    TooManyHosts { hosts: u32 },
    #[error("{0}; is iproute2 installed and are network namespaces allowed here? (--no-netns runs hosts as logical groups)")]
    Command(#[from] CommandError),
    #[error("no free 10.77.X.0/24 address slot on this machine")]
    NoSlot,
}

/// One host's namespace and link.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostNet {
    pub host: u32,
    /// `ip netns` name.
    pub netns: String,
    /// The veth end in the launcher's namespace.
    pub veth: String,
    /// The launcher-side address (the coordinator is reached here).
    pub outer: Ipv4Addr,
    /// The host's own address, inside the namespace.
    pub inner: Ipv4Addr,
}

impl HostNet {
    /// The namespace file `nsenter --net=` takes.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.netns)
    }

    /// `cmd` rewritten to run inside this host's namespace.
    pub fn wrap(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Takes the host's link down (`up == false`) or brings it back: the
    /// host is cut off from the coordinator, as with a pulled cable.
    pub fn set_link(&self, up: bool) -> Result<(), NetnsError> {
        ip(&[
            "link",
            "set",
            "dev",
            &self.veth,
            if up { "up" } else { "down" },
        ])
    }
}

/// The namespaces of one run; deleted on drop.
#[derive(Debug, Default)]
pub struct Network {
    pub hosts: Vec<HostNet>,
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    command::run("ip", args, None)?;
    Ok(())
}

/// Whether a process with this pid exists.
fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Deletes namespaces whose launcher is gone (a killed earlier run).
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !pid_alive(pid) {
            match ip(&["netns", "del", &name]) {
                Ok(()) => info!("removed stale network namespace {name}"),
                Err(e) => warn!("cannot remove stale network namespace {name}: {e}"),
            }
        }
    }
}

/// A /24 under 10.77/16 that no interface of this machine uses yet.
fn free_slot() -> Result<u8, NetnsError> {
    let used = command::run("ip", &["-o", "-4", "addr", "show"], None)?;
    let start = (std::process::id() % 256) as u16;
    (0..256u16)
        .map(|i| ((start + i) % 256) as u8)
        .find(|s| !used.contains(&format!(" 10.77.{s}.")))
        .ok_or(NetnsError::NoSlot)
}

impl Network {
    /// Creates one namespace per host (root only).
    pub fn create(hosts: u32) -> Result<Network, NetnsError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NetnsError::NotRoot);
        }
        if hosts > MAX_HOSTS {
            return Err(NetnsError::TooManyHosts { hosts });
        }
        remove_stale();
        let slot = free_slot()?;
        let pid = std::process::id();
        // A process may run several scenarios; the last one's namespaces can
        // outlive it briefly (a process still exiting inside keeps one).
        static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Interface names have at most 15 bytes.
        let tag = (u64::from(pid) << 12 | u64::from(run & 0xfff)) % 0x1_0000_0000;
        let mut net = Network::default();
        for h in 0..hosts {
            let hn = HostNet {
                host: h,
                netns: format!("{PREFIX}{pid}-{run}-h{h}"),
                veth: format!("sr{tag:08x}h{h}"),
                outer: Ipv4Addr::new(10, 77, slot, (4 * h + 1) as u8),
                inner: Ipv4Addr::new(10, 77, slot, (4 * h + 2) as u8),
            };
            // Pushed first so that a failure half-way still cleans up.
            net.hosts.push(hn.clone());
            setup(&hn)?;
        }
        info!(
            "{hosts} hosts as network namespaces ({}-h0.., links 10.77.{slot}.0/24)",
            format_args!("{PREFIX}{pid}-{run}")
        );
        Ok(net)
    }

    /// The network of host `h`, if hosts are namespaces.
    pub fn host(&self, h: u32) -> Option<&HostNet> {
        self.hosts.iter().find(|n| n.host == h)
    }
}

fn setup(h: &HostNet) -> Result<(), NetnsError> {
    let ns = h.netns.as_str();
    let outer = format!("{}/30", h.outer);
    let inner = format!("{}/30", h.inner);
    let gw = h.outer.to_string();
    ip(&["netns", "add", ns])?;
    ip(&[
        "link", "add", &h.veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    ip(&["addr", "add", &outer, "dev", &h.veth])?;
    ip(&["link", "set", "dev", &h.veth, "up"])?;
    ip(&["-n", ns, "addr", "add", &inner, "dev", "eth0"])?;
    ip(&["-n", ns, "link", "set", "dev", "eth0", "up"])?;
    ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
    ip(&["-n", ns, "route", "add", "default", "via", &gw])?;
    Ok(())
}

impl Drop for Network {
    fn drop(&mut self) {
        for h in &self.hosts {
            // Deleting the namespace destroys its veth end and so the pair.
            if let Err(e) = ip(&["netns", "del", &h.netns]) {
                warn!("cannot delete network namespace {}: {e}", h.netns);
            }
        }
    }
}

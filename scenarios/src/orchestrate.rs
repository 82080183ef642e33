//! Per-host services next to the job: the one place where, in agent mode,
//! one `slowrank-agent` per simulated host (given that host's clock offset
//! and drift as a test-only setting) and one coordinator are started and
//! stopped. Without agents it starts nothing.
//!
//! Agent mode lays out, under the run directory:
//! `coordinator/tls/` (the coordinator's certificate), `logs/coordinator.log`,
//! `logs/agent-host-N.log`, and `agent-host-N.jsonl` (each agent's records
//! as JSON lines, `--output`).

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    libs,
    netns::{HostNet, Network},
    spec::Spec,
};

/// What runs next to the rank processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The job alone (`--no-agent`).
    JobOnly,
    /// Coordinator + one agent per host.
    WithAgents,
}

/// What a host's agent is started with.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPlan {
    pub host: u32,
    /// Global ranks on this host.
    pub ranks: std::ops::Range<u32>,
    /// Clock skew the agent applies to its timestamps (test-only setting).
    pub clock_offset_us: i64,
    pub clock_drift_ppm: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum OrchestrateError {
    #[error("cannot find the {0} binary next to this one or in cargo's target directory: build it (cargo build -p slowrank-agent -p slowrank-coordinator)")]
    NoBinary(&'static str),
    #[error("cannot start {what}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} did not get ready within {secs} s; see {log}")]
    NotReady {
        what: String,
        secs: u64,
        log: PathBuf,
    },
    #[error("{what} exited during start-up ({status}); see {log}")]
    Died {
        what: String,
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no free local UDP port for the coordinator")]
    NoPort(#[source] std::io::Error),
    #[error("interrupted while starting {what}; the services started so far were stopped")]
    Interrupted { what: String },
}

/// The per-host plan of a spec.
pub fn host_plans(spec: &Spec) -> Vec<HostPlan> {
    (0..spec.hosts)
        .map(|h| HostPlan {
            host: h,
            ranks: h * spec.ranks_per_host..(h + 1) * spec.ranks_per_host,
            clock_offset_us: spec.clock.offset_us(h),
            clock_drift_ppm: spec.clock.drift_ppm(h),
        })
        .collect()
}

/// Extra `slowrank serve` arguments, given the run directory: the report,
/// table and trace land next to `truth.json`, where `score` looks for them.
/// `SLOWRANK_COORDINATOR_ARGS` adds flags for experiments (e.g.
/// `--metrics-listen 127.0.0.1:9911` to read the wire counters).
fn coordinator_extra_args(run_dir: &Path) -> Vec<String> {
    let mut v = vec!["--out".into(), run_dir.display().to_string()];
    if let Ok(extra) = std::env::var("SLOWRANK_COORDINATOR_ARGS") {
        v.extend(extra.split_whitespace().map(String::from));
    }
    v
}

/// `DIR/sim/services.json`: how each service was started (agent mode), so
/// fault tests can kill one and start it again the same way.
pub const SERVICES_FILE: &str = "services.json";

/// The content of [`SERVICES_FILE`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServicesFile {
    /// The job token (`SLOWRANK_TOKEN`) both sides were given.
    pub token: String,
    pub coordinator: ServiceEntry,
    /// One per host, in host order.
    pub agents: Vec<ServiceEntry>,
    /// Each host's network namespace and link (empty when hosts are
    /// logical groups), so fault tests can take a host's link down.
    #[serde(default)]
    pub networks: Vec<HostNet>,
}

/// One started service.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServiceEntry {
    pub pid: u32,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub log: PathBuf,
    /// Agents: the ready file (holds the pid of the agent that owns it).
    pub ready: Option<PathBuf>,
}

impl ServiceEntry {
    fn of(cmd: &Command, log: &Path, ready: Option<PathBuf>) -> Self {
        Self {
            pid: 0,
            program: PathBuf::from(cmd.get_program()),
            args: cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            log: log.to_owned(),
            ready,
        }
    }
}

/// The pid an agent wrote into its ready file, if the file is still there.
fn ready_owner(ready: &Path) -> Option<i32> {
    fs::read_to_string(ready).ok()?.trim().parse().ok()
}

/// A started helper process.
#[derive(Debug)]
struct Proc {
    what: String,
    child: Child,
    /// Exists while the process is up and has work in flight (agents).
    ready: Option<PathBuf>,
}

/// Services started for a run; stopped when dropped (agents first, so their
/// last batches reach the coordinator).
#[derive(Debug, Default)]
pub struct Services {
    pub hosts: Vec<HostPlan>,
    /// Records of host N's agent (agent mode).
    pub agent_outputs: Vec<PathBuf>,
    /// The coordinator's address (agent mode).
    pub coordinator: Option<std::net::SocketAddr>,
    agents: Vec<Proc>,
    coordinator_proc: Option<Proc>,
    /// When the services were started, and where their CPU account goes
    /// ([`SERVICES_CPU_FILE`]) when they are stopped.
    started: Option<(Instant, PathBuf)>,
}

/// `DIR/sim/services-cpu.json`: the CPU time the coordinator and the agents
/// used over the run, read just before they are stopped. On this machine
/// they share the ranks' cores (on a real job the coordinator runs
/// elsewhere), so the overhead benchmark needs it to split a step-time cost
/// into the services' CPU and the probes' traps.
pub const SERVICES_CPU_FILE: &str = "services-cpu.json";

/// The content of [`SERVICES_CPU_FILE`].
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ServicesCpu {
    /// Seconds from the services' start to the account.
    pub wall_s: f64,
    /// User + system CPU seconds of the coordinator.
    pub coordinator_s: f64,
    /// User + system CPU seconds of all agents together.
    pub agents_s: f64,
    /// The scheduling class the services ran in (`normal` or `idle`).
    pub sched: String,
}

/// User + system CPU seconds of `pid` so far, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

/// `SLOWRANK_SERVICES_SCHED` (benchmarks only): `idle` runs the coordinator
/// and the agents in the `SCHED_IDLE` class, `coordinator-idle` the
/// coordinator alone. An idle-class service takes no CPU a rank wants, so
/// the overhead benchmark can split a probe set's step-time cost into the
/// coordinator's CPU (on a real job it runs on another machine), the
/// agents' CPU and the probes' traps. Never a default: on a loaded host an
/// idle-class agent starves and its buffers overflow.
fn services_sched() -> &'static str {
    match std::env::var("SLOWRANK_SERVICES_SCHED").as_deref() {
        Ok("idle") => "idle",
        Ok("coordinator-idle") => "coordinator-idle",
        _ => "normal",
    }
}

/// Puts a service started by `cmd` in `SCHED_IDLE` when
/// [`services_sched`] asks for it (`agent`: whether it is an agent).
fn apply_sched(cmd: &mut Command, agent: bool) {
    let idle = match services_sched() {
        "idle" => true,
        "coordinator-idle" => !agent,
        _ => false,
    };
    if !idle {
        return;
    }
    // SAFETY: only an async-signal-safe syscall between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl Services {
    /// What the services' CPU account is now (see [`SERVICES_CPU_FILE`]).
    fn cpu_account(&self) -> Option<ServicesCpu> {
        let (t0, _) = self.started.as_ref()?;
        Some(ServicesCpu {
            wall_s: t0.elapsed().as_secs_f64(),
            coordinator_s: self
                .coordinator_proc
                .as_ref()
                .and_then(|p| cpu_seconds(p.child.id()))
                .unwrap_or(0.0),
            agents_s: self
                .agents
                .iter()
                .filter_map(|p| cpu_seconds(p.child.id()))
                .sum(),
            sched: services_sched().to_string(),
        })
    }
}

/// Starts the coordinator and the agents (agent mode) before the ranks.
///
/// With `net` holding namespaces, the coordinator listens on every address
/// and each agent runs in its host's namespace, reaching the coordinator
/// through the host's link.
pub fn start(
    spec: &Spec,
    run_dir: &Path,
    mode: Mode,
    net: &Network,
) -> Result<Services, OrchestrateError> {
    let hosts = host_plans(spec);
    match mode {
        Mode::JobOnly => {
            let mut s = Services::default();
            s.hosts = hosts;
            Ok(s)
        }
        Mode::WithAgents => start_agents(hosts, run_dir, net),
    }
}

/// A helper binary: `$SLOWRANK_AGENT_BIN` / `$SLOWRANK_COORDINATOR_BIN` when
/// set (tests point them at what cargo just built), else next to this
/// executable, else in cargo's target directory.
pub fn binary(name: &'static str) -> Result<PathBuf, OrchestrateError> {
    let var = match name {
        "slowrank-agent" => "SLOWRANK_AGENT_BIN",
        _ => "SLOWRANK_COORDINATOR_BIN",
    };
    if let Some(p) = std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Ok(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file())
        .or_else(|| libs::find_binary(name))
        .ok_or(OrchestrateError::NoBinary(name))
}

fn log_file(path: &Path) -> Result<(Stdio, Stdio), OrchestrateError> {
    let io = |source| OrchestrateError::Io {
        path: path.to_owned(),
        source,
    };
    let f = fs::File::create(path).map_err(io)?;
    let g = f.try_clone().map_err(io)?;
    Ok((Stdio::from(f), Stdio::from(g)))
}

fn start_agents(
    hosts: Vec<HostPlan>,
    run_dir: &Path,
    net: &Network,
) -> Result<Services, OrchestrateError> {
    let coordinator_bin = binary("slowrank")?;
    let agent_bin = binary("slowrank-agent")?;
    let logs = run_dir.join("logs");
    let tls = run_dir.join("coordinator").join("tls");
    for d in [&logs, &tls] {
        fs::create_dir_all(d).map_err(|source| OrchestrateError::Io {
            path: d.clone(),
            source,
        })?;
    }
    // Agents in namespaces come in through their hosts' links.
    let listen_ip = if net.hosts.is_empty() {
        std::net::Ipv4Addr::LOCALHOST
    } else {
        std::net::Ipv4Addr::UNSPECIFIED
    };
    let port = std::net::UdpSocket::bind((listen_ip, 0))
        .and_then(|s| s.local_addr())
        .map_err(OrchestrateError::NoPort)?
        .port();
    let addr = std::net::SocketAddr::from((listen_ip, port));
    let token = format!("scenario-{}-{}", std::process::id(), port);
    let mut services = Services::default();
    services.started = Some((Instant::now(), run_dir.join("sim").join(SERVICES_CPU_FILE)));
    services.hosts = hosts.clone();
    services.coordinator = Some(std::net::SocketAddr::from((
        std::net::Ipv4Addr::LOCALHOST,
        port,
    )));

    let clog = logs.join("coordinator.log");
    let (o, e) = log_file(&clog)?;
    let mut cmd = Command::new(&coordinator_bin);
    cmd.arg("serve")
        .arg("--listen")
        .arg(addr.to_string())
        // The listen port was free; its neighbour (the default) may not be.
        .args(["--clock-port", "0"])
        .arg("--tls-dir")
        .arg(&tls)
        .args(coordinator_extra_args(run_dir))
        .env("SLOWRANK_TOKEN", &token)
        .stdout(o)
        .stderr(e);
    crate::children::die_with_launcher(&mut cmd);
    apply_sched(&mut cmd, false);
    let mut record = ServicesFile {
        token: token.clone(),
        coordinator: ServiceEntry::of(&cmd, &clog, None),
        agents: Vec::new(),
        networks: net.hosts.clone(),
    };
    let child = cmd.spawn().map_err(|source| OrchestrateError::Spawn {
        what: "the coordinator".into(),
        source,
    })?;
    record.coordinator.pid = child.id();
    services.coordinator_proc = Some(Proc {
        what: "coordinator".into(),
        child,
        ready: None,
    });
    let cert = tls.join("coordinator.crt");
    wait_ready(
        services.coordinator_proc.as_mut().expect("set"),
        &cert,
        &clog,
        Duration::from_secs(20),
    )?;
    // The certificate is written before the socket is bound; agents retry
    // their connection anyway (spool + reconnect).

    let launcher = std::process::id().to_string();
    for h in &hosts {
        let out = run_dir.join(format!("agent-host-{}.jsonl", h.host));
        let ready = run_dir
            .join("sim")
            .join(format!("agent-host-{}.ready", h.host));
        let _ = fs::remove_file(&ready);
        let alog = logs.join(format!("agent-host-{}.log", h.host));
        let (o, e) = log_file(&alog)?;
        let (mut cmd, reach) = match net.host(h.host) {
            Some(hn) => (
                hn.wrap(&agent_bin),
                std::net::SocketAddr::from((hn.outer, port)),
            ),
            None => (Command::new(&agent_bin), addr),
        };
        cmd.arg("--coordinator")
            .arg(reach.to_string())
            .arg("--ca")
            .arg(&cert)
            .arg("--host")
            .arg(format!("host-{}", h.host))
            .arg(format!("--only-env=GROUP_RANK={}", h.host))
            // This run's ranks only, not another scenario's on the machine.
            .arg(format!(
                "--only-env={}={}",
                slowrank_sim::env::HUB,
                crate::run::socket_path(run_dir).display()
            ))
            .arg("--output")
            .arg(&out)
            // This run's own: two runs on one machine name their hosts alike.
            .arg("--state-dir")
            .arg(run_dir.join("agent-state"))
            .arg("--watch-tree")
            .arg(&launcher)
            .arg("--ready-file")
            .arg(&ready)
            .arg(format!(
                "--sim-clock-offset-ns={}",
                h.clock_offset_us * 1000
            ))
            .arg(format!("--sim-clock-drift-ppm={}", h.clock_drift_ppm))
            .env("SLOWRANK_TOKEN", &token)
            .stdout(o)
            .stderr(e);
        // Probed from the start: the trainer dlopens them right after exec.
        for lib in ["libnccl.so.2", "libcudart.so.12", "libibverbs.so.1"] {
            let p = run_dir.join("lib").join(lib);
            if p.exists() {
                cmd.arg("--lib").arg(p);
            }
        }
        // Extra agent flags for experiments, e.g. SLOWRANK_AGENT_ARGS=--deep.
        if let Ok(extra) = std::env::var("SLOWRANK_AGENT_ARGS") {
            cmd.args(extra.split_whitespace());
        }
        crate::children::die_with_launcher(&mut cmd);
        apply_sched(&mut cmd, true);
        let child = cmd.spawn().map_err(|source| OrchestrateError::Spawn {
            what: format!("the agent of host {}", h.host),
            source,
        })?;
        let mut entry = ServiceEntry::of(&cmd, &alog, Some(ready.clone()));
        entry.pid = child.id();
        record.agents.push(entry);
        let mut proc = Proc {
            what: format!("agent of host {}", h.host),
            child,
            ready: Some(ready.clone()),
        };
        // Attaching takes seconds per library, minutes on a loaded machine.
        wait_ready(&mut proc, &ready, &alog, Duration::from_secs(180))?;
        services.agents.push(proc);
        services.agent_outputs.push(out);
    }
    let path = run_dir.join("sim").join(SERVICES_FILE);
    let text = serde_json::to_string_pretty(&record).expect("services serialise");
    fs::write(&path, text).map_err(|source| OrchestrateError::Io { path, source })?;
    tracing::info!(coordinator = %addr, agents = hosts.len(), "agent mode: coordinator and agents started");
    Ok(services)
}

fn wait_ready(
    p: &mut Proc,
    file: &Path,
    log: &Path,
    limit: Duration,
) -> Result<(), OrchestrateError> {
    let t0 = Instant::now();
    loop {
        if file.exists() {
            return Ok(());
        }
        // Ctrl-C or SIGTERM while an agent attaches (minutes when loaded):
        // give up now; the caller's `Services` stops what is already up.
        if crate::children::interrupted() {
            stop(p, Duration::from_secs(2));
            return Err(OrchestrateError::Interrupted {
                what: p.what.clone(),
            });
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            return Err(OrchestrateError::Died {
                what: p.what.clone(),
                status,
                log: log.to_owned(),
            });
        }
        if t0.elapsed() > limit {
            stop(p, Duration::ZERO);
            return Err(OrchestrateError::NotReady {
                what: p.what.clone(),
                secs: limit.as_secs(),
                log: log.to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGINT (both binaries flush and exit on it), then SIGKILL after `grace`.
fn stop(p: &mut Proc, grace: Duration) {
    if let Ok(Some(_)) = p.child.try_wait() {
        return;
    }
    // SAFETY: signalling a child we started and have not reaped.
    unsafe { libc::kill(p.child.id() as i32, libc::SIGINT) };
    let t0 = Instant::now();
    while t0.elapsed() < grace {
        if let Ok(Some(_)) = p.child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
    tracing::warn!("{} did not stop in time; killed", p.what);
}

impl Drop for Services {
    fn drop(&mut self) {
        // Before the flush at exit, which is not the run's.
        if let (Some(cpu), Some((_, path))) = (self.cpu_account(), self.started.as_ref()) {
            tracing::info!(
                coordinator_s = cpu.coordinator_s,
                agents_s = cpu.agents_s,
                wall_s = cpu.wall_s,
                sched = %cpu.sched,
                "services' CPU over the run"
            );
            let _ = fs::write(path, serde_json::to_string(&cpu).expect("serialises"));
        }
        // Agents flush their last batch and drain the uplink (≤ 10 s).
        for p in &mut self.agents {
            // SAFETY: signalling a child we started and have not reaped.
            unsafe { libc::kill(p.child.id() as i32, libc::SIGINT) };
            // An agent started again for this host (a restart test) took over
            // the ready file; it gets the same request to flush and stop.
            if let Some(pid) = p.ready.as_deref().and_then(ready_owner) {
                if pid > 0 && pid as u32 != p.child.id() {
                    // SAFETY: plain signal to the pid that owns the ready file.
                    unsafe { libc::kill(pid, libc::SIGINT) };
                }
            }
        }
        // An agent removes its ready file once its last batch is shipped;
        // its exit (detaching every uprobe) can take seconds more and is
        // left to a reaper thread.
        let t0 = Instant::now();
        for mut p in std::mem::take(&mut self.agents) {
            let replaced = |p: &Proc| {
                p.ready
                    .as_deref()
                    .and_then(ready_owner)
                    .is_some_and(|pid| pid as u32 != p.child.id())
            };
            while t0.elapsed() < Duration::from_secs(20)
                && p.ready.as_ref().is_some_and(|f| f.exists())
                && (replaced(&p) || !matches!(p.child.try_wait(), Ok(Some(_))))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            if p.ready.as_ref().is_some_and(|f| f.exists()) {
                stop(&mut p, Duration::ZERO);
            } else {
                std::thread::spawn(move || {
                    let _ = p.child.wait();
                });
            }
        }
        if let Some(p) = self.coordinator_proc.as_mut() {
            let t0 = Instant::now();
            stop(p, Duration::from_secs(10));
            tracing::info!(
                "coordinator stopped after {:.1} s",
                t0.elapsed().as_secs_f64()
            );
        }
    }
}

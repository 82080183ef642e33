//! Shared plumbing for the end-to-end tests: an in-process `slowrank serve`
//! on loopback QUIC and agents' uplinks with simulated host clocks.
#![allow(dead_code)]

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use slowrank_agent::{
    clock::{self, HostClock},
    ship::{client_config, Uplink, UplinkConfig},
};
use slowrank_coordinator::{
    net::control::ProbeSchedule,
    net::tls::{Identity, SERVER_NAME},
    serve::{ServeConfig, ServeError, ServeSummary, Server},
};
use slowrank_shared::wire::{Batch, Hello};

pub const TOKEN: &str = "e2e-token";

/// A fresh, empty directory under the system temp dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "slowrank-{name}-{}-{}",
        std::process::id(),
        clock::mono_ns()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Binds a coordinator on an ephemeral loopback port.
pub fn server(identity: &Identity, out: Option<PathBuf>) -> Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().expect("addr"), TOKEN);
    cfg.out_dir = out;
    cfg.exit_when_idle = true;
    cfg.print_alerts = true;
    cfg.tick_every = Duration::from_millis(200);
    cfg.probes = ProbeSchedule::default();
    Server::bind(cfg, identity).expect("bind coordinator")
}

/// Runs `server` on a dedicated 2-thread runtime until `shutdown` resolves
/// (or, with `exit_when_idle`, its agents are gone); the result arrives on
/// the returned channel.
pub fn spawn_on_own_runtime(
    server: Server,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::sync::oneshot::Receiver<Result<ServeSummary, ServeError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("coordinator runtime");
        let _ = tx.send(rt.block_on(server.run(shutdown)));
    });
    rx
}

pub fn hello(host: &str, agent_id: &str, token: &str, clock: &HostClock) -> Hello {
    Hello {
        token: token.to_owned(),
        host: host.to_owned(),
        agent_id: agent_id.to_owned(),
        mono_ns: clock.now(),
        wall_ns: clock::wall_ns(),
    }
}

pub fn uplink(identity: &Identity, addr: SocketAddr, hello: Hello, clock: HostClock) -> Uplink {
    let client = client_config(identity.cert_pem.as_bytes(), "test CA").expect("client config");
    Uplink::spawn(UplinkConfig {
        addr,
        server_name: SERVER_NAME.to_owned(),
        client,
        hello,
        spool_bytes: 64 << 20,
        clock,
        bind: None,
    })
}

/// Rewrites every agent time in `b` with `f` (durations stay as they are).
pub fn map_times(b: &mut Batch, f: impl Fn(u64) -> u64) {
    let g = |t: u64| if t == 0 { 0 } else { f(t) };
    b.mono_ns = g(b.mono_ns);
    for r in &mut b.ranks {
        r.seen_ns = g(r.seen_ns);
    }
    for e in &mut b.exits {
        e.exit_ns = g(e.exit_ns);
    }
    for c in &mut b.comms {
        c.created_ns = g(c.created_ns);
    }
    for c in &mut b.collectives {
        c.host_entry_ns = g(c.host_entry_ns);
        c.host_exit_ns = g(c.host_exit_ns);
        c.gpu_arrive_ns = g(c.gpu_arrive_ns);
        c.gpu_done_ns = g(c.gpu_done_ns);
    }
    for i in &mut b.intervals {
        i.start_ns = g(i.start_ns);
        i.end_ns = g(i.end_ns);
    }
    for l in &mut b.links {
        l.start_ns = g(l.start_ns);
        l.end_ns = g(l.end_ns);
    }
    for c in &mut b.calls {
        c.ts_ns = g(c.ts_ns);
    }
}

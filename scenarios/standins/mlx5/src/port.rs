//! The port monitor: with `SLOWRANK_SIM_WIRE=<addr>:<port>` (set by the
//! launcher when it shapes each NIC's port replica on the host's veth with
//! `tc`, see `slowrank_sim::wire`), a thread sends a small UDP burst through
//! this NIC's replica every period, gets back from the launcher's echo sink
//! how far apart the shaping let its datagrams go, and writes the fraction
//! of nominal bandwidth that shows into the control block, where the NIC
//! and the cost model apply it to the simulated traffic. A `communication` fault's
//! bandwidth is then a property of a real link, measured, not a knob read.
//!
//! Each change of the applied fraction (and the initial 1.0) is appended to
//! `$SLOWRANK_RUN_DIR/sim/port-rank-N.log` as `mono_ns factor`.

use std::{
    fs::OpenOptions,
    io::{ErrorKind, LineWriter, Write},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    path::PathBuf,
    sync::Once,
    time::{Duration, Instant},
};

use slowrank_sim::{
    clock,
    control::{Control, MAX_LOCAL},
    env,
    wire::{self, Smoother},
};

/// Starts the monitor of the port of the NIC with `lid`, once per process
/// and only when the launcher shapes ports.
pub fn start(lid: u16) {
    static STARTED: Once = Once::new();
    let Some(sink) = std::env::var(env::WIRE)
        .ok()
        .and_then(|s| s.trim().parse::<SocketAddr>().ok())
    else {
        return;
    };
    STARTED.call_once(|| {
        let local = u32::from(lid.max(1) - 1) % MAX_LOCAL;
        let spawned = std::thread::Builder::new()
            .name("port-monitor".into())
            .spawn(move || {
                if let Err(e) = monitor(sink, local) {
                    eprintln!("[slowrank libmlx5] port monitor stopped: {e}");
                }
            });
        if let Err(e) = spawned {
            eprintln!("[slowrank libmlx5] cannot start the port monitor: {e}");
        }
    });
}

/// `port-rank-N.log` of this rank, if the run directory is known.
fn log_file() -> Option<LineWriter<std::fs::File>> {
    let dir = PathBuf::from(std::env::var_os(env::RUN_DIR)?).join("sim");
    let rank = env::u32_var(env::RANK)?;
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("port-rank-{rank}.log")))
        .ok()?;
    Some(LineWriter::new(f))
}

fn monitor(sink: SocketAddr, local: u32) -> std::io::Result<()> {
    let ctl = Control::current();
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, wire::source_port(local)))?;
    sock.connect(sink)?;
    let mut log = log_file();
    let mut record = |factor: f64| {
        ctl.set_port_bw_factor(factor);
        if let Some(w) = log.as_mut() {
            let _ = writeln!(w, "{} {factor}", clock::mono_ns());
        }
    };
    record(1.0);
    let mut smoother = Smoother::default();
    let mut applied = 1.0;
    let mut buf = [0u8; wire::PACKET_BYTES];
    for seq in 1u64.. {
        if let Some(measured) = burst(&sock, seq, &mut buf) {
            let f = smoother.push(measured);
            if f != applied {
                applied = f;
                record(f);
            }
        }
        std::thread::sleep(wire::PERIOD);
    }
    Ok(())
}

/// Sends burst `seq` and waits for its echo: the fraction of nominal
/// bandwidth it shows, or `None` when no echo came within
/// [`wire::ECHO_TIMEOUT`], the sink could not time the burst or could not
/// be reached. That is no measurement, not a slow port: counting a lost
/// echo as the slowest measurable port made healthy NICs 150× slower for a
/// period whenever the sink fell behind.
fn burst(sock: &UdpSocket, seq: u64, buf: &mut [u8]) -> Option<f64> {
    let t0 = Instant::now();
    for i in 0..wire::BURST_PACKETS {
        wire::encode(buf, seq, i + 1 == wire::BURST_PACKETS);
        sock.send(buf).ok()?;
    }
    let deadline = t0 + wire::ECHO_TIMEOUT;
    let mut echo = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match sock.recv(&mut echo) {
            Ok(n) => match wire::decode_echo(&echo[..n]) {
                Some((s, pace)) if s == seq => return pace.map(wire::factor),
                // The echo of a burst that timed out: stale.
                _ => {}
            },
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

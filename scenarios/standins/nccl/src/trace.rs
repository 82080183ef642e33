//! Optional collective trace for tests and ground truth: with
//! `SLOWRANK_SIM_COLL_TRACE=<file>`, every operation this rank completes
//! appends `key host_ns arrive_ns release_ns done_ns finished_ns posted_ns`
//! (monotonic ns: the host issued the call, this GPU reached it, the last
//! member's GPU reached it, the modelled transfer finished, this GPU's stream
//! could move on: the later of `done_ns` and the proxy polling the last
//! completion; just before the first chunk went to `post_send`, 0 when the
//! operation did not use the NIC).

use std::{
    fs::OpenOptions,
    io::{LineWriter, Write},
    sync::{Mutex, OnceLock},
};

pub const ENV: &str = "SLOWRANK_SIM_COLL_TRACE";

fn sink() -> Option<&'static Mutex<LineWriter<std::fs::File>>> {
    static SINK: OnceLock<Option<Mutex<LineWriter<std::fs::File>>>> = OnceLock::new();
    SINK.get_or_init(|| {
        let path = std::env::var_os(ENV)?;
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()?;
        Some(Mutex::new(LineWriter::new(f)))
    })
    .as_ref()
}

pub fn collective(
    key: &str,
    host_ns: u64,
    arrive_ns: u64,
    release_ns: u64,
    done_ns: u64,
    finished_ns: u64,
    posted_ns: u64,
) {
    if let Some(s) = sink() {
        let mut w = s.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            w,
            "{key} {host_ns} {arrive_ns} {release_ns} {done_ns} {finished_ns} {posted_ns}"
        );
    }
}

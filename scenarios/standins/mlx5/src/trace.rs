//! Optional NIC trace for tests and ground truth: with
//! `SLOWRANK_SIM_NIC_TRACE=<file>`, every completion handed to `poll_cq`
//! appends `qp_num dlid bytes posted_ns completed_ns polled_ns`.

use std::{
    fs::OpenOptions,
    io::{LineWriter, Write},
    sync::{Mutex, OnceLock},
};

use crate::objects::Pending;

pub const ENV: &str = "SLOWRANK_SIM_NIC_TRACE";

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

pub fn completion(p: &Pending, polled_ns: u64) {
    if let Some(s) = sink() {
        let mut w = s.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            w,
            "{} {} {} {} {} {}",
            p.wc.qp_num, p.dlid, p.wc.byte_len, p.posted_ns, p.at_ns, polled_ns
        );
    }
}

//! `--output FILE`: the records as JSON lines, for debugging and tests.

use std::io::Write;

use serde::Serialize;
use slowrank_shared::wire::Batch;

#[derive(Serialize)]
struct CallLine<'a> {
    host: &'a str,
    seq: u64,
    ts_ns: u64,
    pid: u32,
    tid: u32,
    probe: u32,
    symbol: &'a str,
    kind: &'static str,
    args: [u64; slowrank_shared::probe::MAX_ARGS],
    ret: u64,
}

/// Writes one JSON object per call record in `batch`.
pub fn write_batch(out: &mut impl Write, batch: &Batch) -> std::io::Result<()> {
    for c in &batch.calls {
        let symbol = batch
            .probes
            .iter()
            .find(|p| p.id == c.probe)
            .map_or("?", |p| p.symbol.as_str());
        let line = CallLine {
            host: &batch.host,
            seq: batch.seq,
            ts_ns: c.ts_ns,
            pid: c.pid,
            tid: c.tid,
            probe: c.probe,
            symbol,
            kind: if c.is_return { "return" } else { "entry" },
            args: c.args,
            ret: c.ret,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

//! `--print-calls`: each generic probe's calls of a batch, one line each,
//! on stdout (for a first look at a library nobody has probed before).

use slowrank_shared::wire::Batch;

pub(super) fn print_calls(batch: &Batch) {
    for c in &batch.calls {
        let symbol = batch
            .probes
            .iter()
            .find(|p| p.id == c.probe)
            .map_or("?", |p| p.symbol.as_str());
        if c.is_return {
            println!(
                "[{}] pid {} {symbol} returned {} at {} ns",
                batch.host, c.pid, c.ret, c.ts_ns
            );
        } else {
            println!(
                "[{}] pid {} {symbol}({}, {}) entered at {} ns",
                batch.host, c.pid, c.args[0], c.args[1], c.ts_ns
            );
        }
    }
}

//! Writes real wire encodings (batches of a synthetic job, a hello, a hello
//! reply) into a directory, as the seed corpus of the `batch_decode` fuzz
//! target: `cargo run -p slowrank-coordinator --example fuzz_seeds -- DIR`.

use std::path::PathBuf;

use slowrank_shared::wire::{self, Hello, HelloReply};
use slowrank_synth::{Generator, SynthSpec};

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or_else(|| anyhow::anyhow!("usage: fuzz_seeds DIR"))?,
    );
    std::fs::create_dir_all(&dir)?;
    let mut n = 0;
    let mut write = |name: String, bytes: Vec<u8>| -> anyhow::Result<()> {
        std::fs::write(dir.join(name), bytes)?;
        n += 1;
        Ok(())
    };
    // Small jobs keep seeds small: the first batches carry identities and
    // communicators, later ones collectives, intervals and link records.
    for (name, spec) in [
        ("dp2x2", SynthSpec::dp(2, 2)),
        ("3d", SynthSpec::three_d(2, 2, 1, 2)),
    ] {
        let mut g = Generator::new(spec);
        for it in 0..2 {
            for (i, (_, b)) in g.next_iteration().batches.iter().enumerate() {
                write(format!("{name}-it{it}-host{i}.bin"), wire::encode(b)?)?;
            }
        }
    }
    write(
        "hello.bin".into(),
        wire::encode(&Hello {
            token: "token".into(),
            host: "node-0".into(),
            agent_id: "agent-0".into(),
            mono_ns: 1,
            wall_ns: 2,
        })?,
    )?;
    write(
        "hello-reply.bin".into(),
        wire::encode(&HelloReply {
            accepted: false,
            reason: "invalid job token".into(),
            retry_after_ms: 0,
        })?,
    )?;
    write(
        "empty-batch.bin".into(),
        wire::encode(&slowrank_shared::wire::Batch::default())?,
    )?;
    println!("wrote {n} seeds to {}", dir.display());
    Ok(())
}

//! Structured: a batch with arbitrary field values (or a real one from the
//! synthetic job) must round-trip exactly; then its encoding, corrupted by
//! flips, overwrites, truncation and junk, must decode to Ok or Err — never
//! a panic.
#![no_main]

use libfuzzer_sys::{arbitrary::Unstructured, fuzz_target};
use slowrank_fuzz::{arbitrary_batch, corrupt, job, mutate_batch};
use slowrank_shared::wire::{self, Batch};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let batch = if u.arbitrary::<bool>().unwrap_or(false) {
        match arbitrary_batch(&mut u) {
            Ok(b) => b,
            Err(_) => return,
        }
    } else {
        let jobs = &job().batches;
        let Ok(i) = u.choose_index(jobs.len()) else {
            return;
        };
        let mut b = jobs[i].1.clone();
        if mutate_batch(&mut u, &mut b).is_err() {
            return;
        }
        b
    };
    let mut bytes = wire::encode(&batch).expect("small batches encode");
    assert_eq!(wire::decode::<Batch>(&bytes).expect("round trip"), batch);
    if corrupt(&mut u, &mut bytes).is_err() {
        return;
    }
    let _ = wire::decode::<Batch>(&bytes);
});

//! The walking-skeleton demo target: a tiny "training loop" whose step
//! function the agent probes. The real simulated jobs are `slowrank-scenario`.
use std::time::Duration;

/// One step. `no_mangle` + `inline(never)` keep it a real, findable call.
#[no_mangle]
#[inline(never)]
pub extern "C" fn slowrank_demo_step(iteration: u64, work_us: u64) -> u64 {
    std::thread::sleep(Duration::from_micros(work_us));
    std::hint::black_box(iteration * 2 + 1)
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    for i in 0..n {
        slowrank_demo_step(i, 1000 + 500 * (i % 3));
        std::thread::sleep(Duration::from_millis(50));
    }
}

//! Device memory: addresses only. Nothing ever dereferences device memory in
//! the simulation, so `cudaMalloc` hands out unbacked addresses in a range
//! that looks like the UVA range of a real device.

use std::sync::atomic::{AtomicU64, Ordering};

const BASE: u64 = 0x7e00_0000_0000;
static NEXT: AtomicU64 = AtomicU64::new(BASE);

/// A fresh 512-byte aligned device address range of `size` bytes.
pub fn alloc(size: usize) -> u64 {
    let size = (size as u64).max(1).div_ceil(512) * 512;
    NEXT.fetch_add(size, Ordering::Relaxed)
}

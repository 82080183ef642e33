//! Stack records written by the eBPF stack programs into the `STACKS` ring
//! buffer (CPU samples, off-CPU intervals, CUDA launch sites).
//!
//! Fixed-size and `#[repr(C)]` like [`crate::probe::CallEvent`]: both sides
//! compile this module, the size assertion catches a layout mismatch.

/// User-space frames kept per stack (deeper stacks are truncated at the root
/// end and flagged).
pub const MAX_USER_FRAMES: usize = 64;
/// Kernel frames kept per stack.
pub const MAX_KERNEL_FRAMES: usize = 32;

/// What produced a [`StackEvent`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackKind {
    /// A timer sample of a running thread (perf event, CPU clock).
    OnCpu = 1,
    /// A thread switched out; `weight_ns` is the off-CPU time accumulated
    /// since its previous off-CPU record (sampled by time, see the program).
    OffCpu = 2,
    /// A `cudaLaunchKernel` call: user stack plus the kernel's host-side
    /// function pointer in `addr`.
    Launch = 3,
    /// Entry of a CUDA sync call (`cudaDeviceSynchronize` …); no stack.
    SyncCall = 4,
    /// Return of a CUDA sync call: the GPU finished all work enqueued
    /// before the matching [`StackKind::SyncCall`]; no stack.
    SyncReturn = 5,
}

impl StackKind {
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::OnCpu),
            2 => Some(Self::OffCpu),
            3 => Some(Self::Launch),
            4 => Some(Self::SyncCall),
            5 => Some(Self::SyncReturn),
            _ => None,
        }
    }
}

/// `flags` bits.
pub mod flag {
    /// The user stack filled every slot: it may be cut short.
    pub const USER_TRUNCATED: u32 = 1;
    /// The kernel stack filled every slot.
    pub const KERNEL_TRUNCATED: u32 = 2;
    /// `bpf_get_stack` failed for the user stack (e.g. no frame pointer
    /// chain, or the page was not resident).
    pub const USER_ERROR: u32 = 4;
    /// `bpf_get_stack` failed for the kernel stack.
    pub const KERNEL_ERROR: u32 = 8;
}

/// One stack as the kernel saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// Time this record stands for: the sampling period for on-CPU samples,
    /// the accumulated off-CPU time for off-CPU records, 0 for launches.
    pub weight_ns: u64,
    /// Launches: the kernel's function pointer (first argument).
    pub addr: u64,
    /// Thread-group id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// [`StackKind`] as a raw `u32`.
    pub kind: u32,
    /// [`flag`] bits.
    pub flags: u32,
    /// Valid entries in `user`.
    pub user_len: u32,
    /// Valid entries in `kernel`.
    pub kernel_len: u32,
    /// The thread's name (`comm`), NUL-padded.
    pub comm: [u8; 16],
    /// User return addresses, innermost first.
    pub user: [u64; MAX_USER_FRAMES],
    /// Kernel return addresses, innermost first.
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// Size of [`StackEvent`] between kernel and user space.
pub const STACK_EVENT_SIZE: usize = 48 + 16 + 8 * (MAX_USER_FRAMES + MAX_KERNEL_FRAMES);
const _: () = assert!(core::mem::size_of::<StackEvent>() == STACK_EVENT_SIZE);

impl StackEvent {
    /// Reads a record from ring-buffer bytes; `None` when the length is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != STACK_EVENT_SIZE {
            return None;
        }
        // SAFETY: length checked; plain integers, any bit pattern is valid;
        // read_unaligned tolerates the ring buffer's alignment.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<StackEvent>()) })
    }

    /// The valid user frames (innermost first).
    pub fn user_frames(&self) -> &[u64] {
        &self.user[..(self.user_len as usize).min(MAX_USER_FRAMES)]
    }

    /// The valid kernel frames (innermost first).
    pub fn kernel_frames(&self) -> &[u64] {
        &self.kernel[..(self.kernel_len as usize).min(MAX_KERNEL_FRAMES)]
    }

    /// The thread name up to the first NUL.
    pub fn comm(&self) -> &[u8] {
        let end = self
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.comm.len());
        &self.comm[..end]
    }
}

/// Indices into the `STACK_COUNTERS` per-CPU array.
pub mod stack_counter {
    /// Records the ring buffer had no room for.
    pub const RINGBUF_DROPS: u32 = 0;
    /// On-CPU samples taken (of followed processes).
    pub const ON_CPU: u32 = 1;
    /// Off-CPU records emitted.
    pub const OFF_CPU: u32 = 2;
    /// Launch records emitted.
    pub const LAUNCH: u32 = 3;
    /// Switch-outs of followed threads whose stack was not captured (the
    /// capture is sampled, see `node-agent-ebpf/src/stacks.rs`).
    pub const OFF_CPU_SKIPPED: u32 = 4;
    /// Number of counters.
    pub const COUNT: u32 = 5;
}

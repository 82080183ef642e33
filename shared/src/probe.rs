//! Records written by the eBPF programs into the `EVENTS` ring buffer.
//!
//! Both sides compile this module, so the layout is fixed by `#[repr(C)]` and
//! checked by the size assertion below: a mismatch fails the build instead of
//! silently misreading kernel data.

/// Number of integer arguments captured at function entry (x86-64 SysV
/// passes the first six in registers).
pub const MAX_ARGS: usize = 6;

/// Whether an event was produced at function entry or at function return.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    Entry = 1,
    Return = 2,
}

impl CallKind {
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Entry),
            2 => Some(Self::Return),
            _ => None,
        }
    }
}

/// One probed call boundary, as the kernel saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallEvent {
    /// `bpf_ktime_get_ns()`: the host's CLOCK_MONOTONIC, in nanoseconds.
    pub ts_ns: u64,
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The probe's id, given by the agent as the attach cookie.
    pub probe: u32,
    /// [`CallKind`] as a raw `u32`.
    pub kind: u32,
    /// Integer arguments at entry; zero at return.
    pub args: [u64; MAX_ARGS],
    /// Return value (`rax`) at return; zero at entry.
    pub ret: u64,
}

/// Size of [`CallEvent`] on the wire between kernel and user space.
pub const CALL_EVENT_SIZE: usize = 80;
const _: () = assert!(core::mem::size_of::<CallEvent>() == CALL_EVENT_SIZE);

impl CallEvent {
    /// Reads an event from ring-buffer bytes; `None` when the length is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != CALL_EVENT_SIZE {
            return None;
        }
        // SAFETY: the length is checked above, every bit pattern is a valid
        // CallEvent (plain integers), and read_unaligned tolerates any
        // alignment of the ring-buffer slice.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<CallEvent>()) })
    }
}

/// Indices into the `COUNTERS` per-CPU array the programs maintain.
pub mod counter {
    /// Events the ring buffer had no room for.
    pub const RINGBUF_DROPS: u32 = 0;
    /// Hits from processes the agent does not follow (filtered in-kernel).
    pub const UNFOLLOWED_HITS: u32 = 1;
    /// Number of counters.
    pub const COUNT: u32 = 2;
}

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
    /// A [`ObjectSnapshot`] of the object an out-pointer call produced.
    Snapshot = 3,
}

impl CallKind {
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Entry),
            2 => Some(Self::Return),
            3 => Some(Self::Snapshot),
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
    /// Processes whose CUDA counters found `CUDA_COUNTS` full.
    pub const COUNTS_FULL: u32 = 2;
    /// Out-pointer reads (`ncclComm_t*` at init/split return) that failed.
    pub const OUT_READ_FAILED: u32 = 3;
    /// Exec notices the `EXECS` ring buffer had no room for (the agent then
    /// looks at every process again).
    pub const EXECS_LOST: u32 = 4;
    /// Number of counters.
    pub const COUNT: u32 = 5;
}

/// Stack words captured by the `call_entry_stack` program: arguments passed
/// in memory (a by-value `ncclUniqueId` is 128 bytes; the 7th and 8th
/// integer arguments of `ncclAllReduce`/`ncclReduce`) start at `rsp + 8`.
pub const STACK_WORDS: usize = 16;

/// An entry event with the first stack words and the process's launch count
/// at that moment (so the agent can say how many kernels were launched
/// before a collective without one event per launch).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackEvent {
    pub call: CallEvent,
    /// Sum of the launch counters of this process when the call was entered.
    pub launches: u64,
    pub stack: [u64; STACK_WORDS],
}

/// Size of [`StackEvent`] in the ring buffer.
pub const STACK_EVENT_SIZE: usize = CALL_EVENT_SIZE + 8 + 8 * STACK_WORDS;
const _: () = assert!(core::mem::size_of::<StackEvent>() == STACK_EVENT_SIZE);

impl StackEvent {
    /// Reads an event from ring-buffer bytes; `None` when the length is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != STACK_EVENT_SIZE {
            return None;
        }
        // SAFETY: as for CallEvent: length checked, plain integers.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<StackEvent>()) })
    }
}

/// Attach-cookie layout: the low 32 bits are the probe id; bits 32..40 hold
/// `1 + index` of an out-pointer argument (`ncclComm_t*`) whose target the
/// return probe reads and reports in `args[0]`, or 0 for none; for
/// `count_call` bits 40..48 hold the [`cuda_count`] class.
pub mod cookie {
    pub const OUT_ARG_SHIFT: u64 = 32;
    pub const CLASS_SHIFT: u64 = 40;
    pub fn probe_id(cookie: u64) -> u32 {
        cookie as u32
    }
    pub fn out_arg(cookie: u64) -> Option<usize> {
        match (cookie >> OUT_ARG_SHIFT) & 0xff {
            0 => None,
            n => Some(n as usize - 1),
        }
    }
    pub fn class(cookie: u64) -> u32 {
        ((cookie >> CLASS_SHIFT) & 0xff) as u32
    }
}

/// Classes of CUDA runtime calls counted in the kernel, per process, by the
/// `count_call` program (one slot each in a [`CudaCounts`]).
pub mod cuda_count {
    pub const LAUNCH: u32 = 0;
    pub const GRAPH_LAUNCH: u32 = 1;
    pub const MEMCPY: u32 = 2;
    pub const MALLOC: u32 = 3;
    pub const FREE: u32 = 4;
    /// Slots in [`super::CudaCounts`].
    pub const SLOTS: usize = 8;
}

/// Per-process call counters (`CUDA_COUNTS` map value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCounts {
    pub counts: [u64; cuda_count::SLOTS],
}

/// Bytes of an object captured by [`ObjectSnapshot`].
pub const SNAPSHOT_BYTES: usize = 2048;

/// The first bytes of the object a call returned through its out-pointer
/// (the `ncclComm` behind `*comm` after `ncclCommInitRank`/`ncclCommSplit`),
/// read in the kernel at return so the agent has them even if it reads its
/// ring buffer after the process ended. `call.args[0]` is the object's
/// address; `call.kind` is [`CallKind::Snapshot`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectSnapshot {
    pub call: CallEvent,
    pub bytes: [u8; SNAPSHOT_BYTES],
}

/// Size of [`ObjectSnapshot`] in the ring buffer.
pub const SNAPSHOT_EVENT_SIZE: usize = CALL_EVENT_SIZE + SNAPSHOT_BYTES;
const _: () = assert!(core::mem::size_of::<ObjectSnapshot>() == SNAPSHOT_EVENT_SIZE);

impl ObjectSnapshot {
    /// Reads an event from ring-buffer bytes; `None` when the length is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != SNAPSHOT_EVENT_SIZE {
            return None;
        }
        // SAFETY: length checked; plain integers and bytes.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<ObjectSnapshot>()) })
    }
}

/// Value of the `FOLLOWED` map: a followed process's rank and the probe
/// traps it took, counted in the program that already looked it up (one
/// atomic add per hit), so the agent can say what its probes cost each rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// Global rank, or `u32::MAX` while not known.
    pub rank: u32,
    pub _pad: u32,
    /// uprobe (function entry) hits.
    pub entry_hits: u64,
    /// uretprobe (function return) hits.
    pub return_hits: u64,
    /// Of those, the verbs data path's (`post_send`, `poll_cq`): NCCL's
    /// proxy threads take them, not the threads that run the step.
    pub datapath_entry_hits: u64,
    pub datapath_return_hits: u64,
}

impl Followed {
    pub fn new(rank: u32) -> Self {
        Self {
            rank,
            ..Self::default()
        }
    }
}

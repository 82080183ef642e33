//! slowrank's eBPF programs.
//!
//! Minimum kernel: 5.15 (ring buffer 5.8, `bpf_get_attach_cookie` for
//! uprobes 5.15). One program pair serves every probed function: the agent
//! attaches `call_entry`/`call_return` once per library *file* with the probe
//! id as the attach cookie, and the `FOLLOWED` map decides in-kernel which
//! processes count, so a host with many ranks holds one attachment per
//! function, not one per process.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// BPF has an atomic add instruction, but core's Atomic* types are not
// offered on this target; the intrinsic lowers to it.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_user, bpf_probe_read_user_buf,
    },
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext,
};
use slowrank_shared::probe::{
    counter, cuda_count, CallEvent, CallKind, CudaCounts, Followed, ObjectSnapshot, StackEvent,
    MAX_ARGS, SNAPSHOT_BYTES, STACK_WORDS,
};

mod stacks;

/// Call events for user space. The agent may resize it before load.
/// Ring records are submitted without waking a reader: the agent drains its
/// rings on a timer and never sleeps in epoll, so the default wake-up (an
/// irq_work, an IPI on a VM, whenever the ring was empty) bought nothing.
pub const NO_WAKEUP: u64 = aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(slowrank_shared::maps::EVENTS_BYTES, 0);

/// Followed process ids (tgid → rank, or u32::MAX when not yet known, and
/// the probe traps the process took: what slowrank costs it).
#[map]
static FOLLOWED: HashMap<u32, Followed> = HashMap::with_max_entries(4096, 0);

/// Processes descending from a watched root (the wrapped command or the
/// launcher), added in-kernel at fork: their calls are reported before the
/// agent's /proc scan has classified them, so a rank that initialises NCCL
/// right after exec is not missed. The agent prunes dead entries.
#[map]
static TREE: HashMap<u32, u32> = HashMap::with_max_entries(65536, 0);

/// Every exec on the host (tgid), so the agent's /proc scan reads only the
/// processes that are new or changed image instead of every process's stat
/// twenty times a second.
#[map]
static EXECS: RingBuf = RingBuf::with_byte_size(64 << 10, 0);

/// Settings written by the agent: [0] = offset of `child_pid` in the
/// `sched_process_fork` record (from the tracepoint's format file).
#[map]
static CONFIG: Array<u32> = Array::with_max_entries(4, 0);

/// Per-CPU counters indexed by `slowrank_shared::probe::counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
fn bump(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Whether a probe fired at a function's entry or at its return (for the
/// per-process hit counts in `FOLLOWED`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hit {
    Entry,
    Return,
    /// The verbs data path's probes, counted apart as well.
    DataPathEntry,
    DataPathReturn,
}

/// [`followed`], or for a communicator's creation (a probe with an
/// out-pointer: `ncclCommInitRank*`, `ncclCommSplit`) any process: a rank
/// the agent finds after it created its communicators would otherwise be
/// unnamed for its whole run (beside a CPU hog, the agent found two of a
/// host's four ranks 0.85 s late, after their init). These calls are a few
/// per process; the agent holds an unknown process's events for a while
/// (its limbo) and replays them once it follows it.
#[inline(always)]
fn followed_or_creation(hit: Hit, cookie: u64) -> Option<(u32, u32)> {
    if let Some(who) = followed(hit) {
        return Some(who);
    }
    slowrank_shared::probe::cookie::out_arg(cookie)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    Some(((pid_tgid >> 32) as u32, pid_tgid as u32))
}

/// Returns (pid, tid) when the current process is followed, and counts the
/// hit against a followed process.
#[inline(always)]
fn followed(hit: Hit) -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if let Some(f) = FOLLOWED.get_ptr_mut(pid) {
        // SAFETY: map value pointer valid for this program run; several
        // threads of one process hit at once, hence the atomic add.
        unsafe {
            let slot = match hit {
                Hit::Entry | Hit::DataPathEntry => core::ptr::addr_of_mut!((*f).entry_hits),
                Hit::Return | Hit::DataPathReturn => core::ptr::addr_of_mut!((*f).return_hits),
            };
            atomic_add(slot, 1);
            match hit {
                Hit::DataPathEntry => {
                    atomic_add(core::ptr::addr_of_mut!((*f).datapath_entry_hits), 1)
                }
                Hit::DataPathReturn => {
                    atomic_add(core::ptr::addr_of_mut!((*f).datapath_return_hits), 1)
                }
                Hit::Entry | Hit::Return => {}
            }
        }
        return Some((pid, pid_tgid as u32));
    }
    // SAFETY: read-only lookup of a plain u32 value.
    if unsafe { TREE.get(pid) }.is_none() {
        bump(counter::UNFOLLOWED_HITS);
        return None;
    }
    Some((pid, pid_tgid as u32))
}

#[inline(always)]
fn emit(
    ctx: *mut core::ffi::c_void,
    kind: CallKind,
    args: [u64; MAX_ARGS],
    ret: u64,
    who: (u32, u32),
) {
    let Some(mut slot) = EVENTS.reserve::<CallEvent>(0) else {
        bump(counter::RINGBUF_DROPS);
        return;
    };
    // SAFETY: the cookie helper only reads the context it is given.
    let cookie = unsafe { bpf_get_attach_cookie(ctx) };
    slot.write(CallEvent {
        // SAFETY: helper with no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        pid: who.0,
        tid: who.1,
        probe: cookie as u32,
        kind: kind as u32,
        args,
        ret,
    });
    slot.submit(NO_WAKEUP);
}

#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    // SAFETY: the cookie helper only reads the context it is given.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let Some(who) = followed_or_creation(Hit::Entry, cookie) else {
        return 0;
    };
    remember_out_ptr(&ctx, cookie);
    let mut args = [0u64; MAX_ARGS];
    let mut i = 0;
    while i < MAX_ARGS {
        args[i] = ctx.arg::<u64>(i).unwrap_or(0);
        i += 1;
    }
    emit(ctx.as_ptr(), CallKind::Entry, args, 0, who);
    0
}

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    let Some(who) = followed(Hit::Return) else {
        return 0;
    };
    let ret: u64 = ctx.ret();
    emit(ctx.as_ptr(), CallKind::Return, [0; MAX_ARGS], ret, who);
    0
}

/// CUDA call counters per followed process (tgid), bumped in-kernel by
/// `count_call`: launches are far too frequent to ship one by one.
#[map]
static CUDA_COUNTS: HashMap<u32, CudaCounts> = HashMap::with_max_entries(4096, 0);

/// Out-pointer argument of a call in flight (pid_tgid → address), read at
/// return so the agent learns the `ncclComm_t` an init/split produced.
#[map]
static OUT_PTRS: HashMap<u64, u64> = HashMap::with_max_entries(16384, 0);

#[inline(always)]
fn remember_out_ptr(ctx: &ProbeContext, cookie: u64) {
    if let Some(i) = slowrank_shared::probe::cookie::out_arg(cookie) {
        // The verifier rejects a context access at a computed offset, so the
        // register is read with the probe-read helper (word index in pt_regs).
        let word: u64 = match i {
            0 => 14, // rdi
            1 => 13, // rsi
            2 => 12, // rdx
            3 => 11, // rcx
            4 => 9,  // r8
            5 => 8,  // r9
            _ => return,
        };
        let addr = ctx.regs as u64 + word * 8;
        // SAFETY: reads the saved registers through the checked helper.
        let Ok(ptr) = (unsafe { bpf_probe_read_kernel(addr as *const u64) }) else {
            return;
        };
        let _ = OUT_PTRS.insert(bpf_get_current_pid_tgid(), ptr, 0);
    }
}

/// Launch count of process `pid` (sum of the launch classes).
#[inline(always)]
fn launches_of(pid: u32) -> u64 {
    // SAFETY: read-only lookup of plain integers.
    match unsafe { CUDA_COUNTS.get(pid) } {
        Some(c) => {
            c.counts[cuda_count::LAUNCH as usize] + c.counts[cuda_count::GRAPH_LAUNCH as usize]
        }
        None => 0,
    }
}

/// Entry probe for functions with arguments in memory: captures the six
/// register arguments, the first stack words and the process's launch count.
#[uprobe]
pub fn call_entry_stack(ctx: ProbeContext) -> u32 {
    // SAFETY: the cookie helper only reads the context it is given.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let Some(who) = followed_or_creation(Hit::Entry, cookie) else {
        return 0;
    };
    remember_out_ptr(&ctx, cookie);
    let Some(mut slot) = EVENTS.reserve::<StackEvent>(0) else {
        bump(counter::RINGBUF_DROPS);
        return 0;
    };
    let mut args = [0u64; MAX_ARGS];
    let mut i = 0;
    while i < MAX_ARGS {
        args[i] = ctx.arg::<u64>(i).unwrap_or(0);
        i += 1;
    }
    // SAFETY: regs points at the probed task's saved registers.
    let sp = unsafe { (*ctx.regs).rsp };
    let mut stack = [0u64; STACK_WORDS];
    // rsp points at the return address; memory arguments follow it.
    // SAFETY: reads user memory through the checked helper.
    let _ = unsafe {
        bpf_probe_read_user_buf(
            (sp + 8) as *const u8,
            core::slice::from_raw_parts_mut(stack.as_mut_ptr().cast::<u8>(), 8 * STACK_WORDS),
        )
    };
    slot.write(StackEvent {
        call: CallEvent {
            // SAFETY: helper with no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
            pid: who.0,
            tid: who.1,
            probe: cookie as u32,
            kind: CallKind::Entry as u32,
            args,
            ret: 0,
        },
        launches: launches_of(who.0),
        stack,
    });
    slot.submit(NO_WAKEUP);
    0
}

/// Return probe that also reports the value behind the out-pointer saved at
/// entry (`*comm` after `ncclCommInitRank`/`ncclCommSplit`) in `args[0]`.
#[uretprobe]
pub fn call_return_out(ctx: RetProbeContext) -> u32 {
    // SAFETY: the cookie helper only reads the context it is given.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let Some(who) = followed_or_creation(Hit::Return, cookie) else {
        return 0;
    };
    let key = bpf_get_current_pid_tgid();
    let mut args = [0u64; MAX_ARGS];
    // SAFETY: read-only lookup of a plain u64.
    if let Some(ptr) = unsafe { OUT_PTRS.get(key) } {
        let ptr = *ptr;
        // SAFETY: reads user memory through the checked helper.
        match unsafe { bpf_probe_read_user(ptr as *const u64) } {
            Ok(v) => args[0] = v,
            Err(_) => bump(counter::OUT_READ_FAILED),
        }
        args[1] = ptr;
        let _ = OUT_PTRS.remove(key);
    }
    let ret: u64 = ctx.ret();
    emit(ctx.as_ptr(), CallKind::Return, args, ret, who);
    if args[0] != 0 {
        snapshot(&ctx, args[0], who);
    }
    0
}

/// Emits the first SNAPSHOT_BYTES of the object at `addr` (zeroes where it
/// could not be read).
#[inline(always)]
fn snapshot(ctx: &RetProbeContext, addr: u64, who: (u32, u32)) {
    let Some(mut slot) = EVENTS.reserve::<ObjectSnapshot>(0) else {
        bump(counter::RINGBUF_DROPS);
        return;
    };
    let p = slot.as_mut_ptr();
    // SAFETY: `p` is the reserved, exclusively owned slot; fields are
    // written in place (the struct is too large for the BPF stack).
    unsafe {
        (*p).call = CallEvent {
            ts_ns: bpf_ktime_get_ns(),
            pid: who.0,
            tid: who.1,
            probe: bpf_get_attach_cookie(ctx.as_ptr()) as u32,
            kind: CallKind::Snapshot as u32,
            args: [addr, 0, 0, 0, 0, 0],
            ret: 0,
        };
        let buf = &mut (*p).bytes;
        if bpf_probe_read_user_buf(addr as *const u8, buf).is_err() {
            // The object may end near an unmapped page: keep what fits.
            let half = &mut buf[..SNAPSHOT_BYTES / 4];
            if bpf_probe_read_user_buf(addr as *const u8, half).is_err() {
                (*p).call.args[1] = 1;
            }
        }
    }
    slot.submit(NO_WAKEUP);
}

#[cfg(target_arch = "bpf")]
#[inline(always)]
unsafe fn atomic_add(slot: *mut u64, v: u64) {
    // SAFETY: caller passes a valid map value slot.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            slot, v,
        )
    };
}

#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
unsafe fn atomic_add(slot: *mut u64, v: u64) {
    // SAFETY: only compiled for host type checks; never runs.
    unsafe { *slot += v };
}

#[tracepoint]
pub fn on_fork(ctx: TracePointContext) -> u32 {
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read-only lookups of plain u32 values.
    if unsafe { TREE.get(parent) }.is_none() {
        return 0;
    }
    let Some(&off) = CONFIG.get(0) else { return 0 };
    if off == 0 || off > 256 {
        return 0;
    }
    // SAFETY: reads the tracepoint record through the checked helper.
    if let Ok(child) = unsafe { ctx.read_at::<i32>(off as usize) } {
        let _ = TREE.insert(child as u32, parent, 0);
    }
    0
}

#[tracepoint]
pub fn on_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if EXECS.output::<u32>(&tgid, 0).is_err() {
        bump(counter::EXECS_LOST);
    }
    0
}

/// Counts a call per process in `CUDA_COUNTS` (class from the cookie); no
/// ring-buffer event.
#[uprobe]
pub fn count_call(ctx: ProbeContext) -> u32 {
    let Some((pid, _)) = followed(Hit::Entry) else {
        return 0;
    };
    // SAFETY: the cookie helper only reads the context it is given.
    let class =
        slowrank_shared::probe::cookie::class(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    if class as usize >= cuda_count::SLOTS {
        return 0;
    }
    let mut ptr = CUDA_COUNTS.get_ptr_mut(pid);
    if ptr.is_none() {
        let _ = CUDA_COUNTS.insert(pid, CudaCounts::default(), BPF_NOEXIST as u64);
        ptr = CUDA_COUNTS.get_ptr_mut(pid);
    }
    let Some(ptr) = ptr else {
        bump(counter::COUNTS_FULL);
        return 0;
    };
    // SAFETY: map value pointer valid for this program run; the slot is
    // shared between CPUs, hence the atomic add.
    unsafe {
        let slot = (*ptr).counts.as_mut_ptr().add(class as usize);
        atomic_add(slot, 1);
    }
    0
}

// ---- Verbs (deep set) -------------------------------------------------
// Offsets from rdma-core's <infiniband/verbs.h> (x86-64), checked against
// the installed header by scenarios/tests/abi.rs on the stand-in's copy.
const QP_NUM_OFF: u64 = 52; // struct ibv_qp.qp_num
const WR_SG_LIST_OFF: u64 = 16; // struct ibv_send_wr.sg_list
const WR_NUM_SGE_OFF: u64 = 24; // .num_sge
const WR_OPCODE_OFF: u64 = 28; // .opcode
const WR_SEND_FLAGS_OFF: u64 = 32; // .send_flags
const SGE_LENGTH_OFF: u64 = 8; // struct ibv_sge.length
const WC_SIZE: u64 = 48; // sizeof(struct ibv_wc)
const WC_STATUS_OFF: u64 = 8;
const WC_BYTE_LEN_OFF: u64 = 20;
const WC_QP_NUM_OFF: u64 = 28;
const ATTR_STATE_OFF: u64 = 0; // struct ibv_qp_attr.qp_state
const ATTR_DEST_QPN_OFF: u64 = 28; // .dest_qp_num
const ATTR_DLID_OFF: u64 = 80; // .ah_attr.dlid
/// Completions reported per poll_cq return (the rest are counted in args[4]).
const WC_PER_POLL: u64 = 16;

/// `wc` array of a poll_cq in flight (pid_tgid → address).
#[map]
static WC_PTRS: HashMap<u64, u64> = HashMap::with_max_entries(16384, 0);

#[inline(always)]
fn user<T>(addr: u64) -> T
where
    T: Default,
{
    // SAFETY: reads user memory through the checked helper; 0 on a fault.
    unsafe { bpf_probe_read_user(addr as *const T) }.unwrap_or_default()
}

/// The provider's `post_send(qp, wr, bad_wr)`, attached at its file offset
/// (found through `ibv_context.ops`). Entry only: args = [qp, qp_num,
/// bytes of the first sge, wr_id, opcode, num_sge | send_flags << 32].
#[uprobe]
pub fn verbs_post_send(ctx: ProbeContext) -> u32 {
    let Some(who) = followed(Hit::DataPathEntry) else {
        return 0;
    };
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    let wr: u64 = ctx.arg(1).unwrap_or(0);
    let sg: u64 = user(wr + WR_SG_LIST_OFF);
    let args = [
        qp,
        u64::from(user::<u32>(qp + QP_NUM_OFF)),
        u64::from(user::<u32>(sg + SGE_LENGTH_OFF)),
        user::<u64>(wr),
        user::<u32>(wr + WR_OPCODE_OFF) as u64,
        user::<u32>(wr + WR_NUM_SGE_OFF) as u64
            | (user::<u32>(wr + WR_SEND_FLAGS_OFF) as u64) << 32,
    ];
    emit(ctx.as_ptr(), CallKind::Entry, args, 0, who);
    0
}

/// The provider's `poll_cq(cq, n, wc)` entry: remembers `wc`, emits nothing
/// (NCCL's proxy spins on it).
#[uprobe]
pub fn verbs_poll_entry(ctx: ProbeContext) -> u32 {
    if followed(Hit::DataPathEntry).is_none() {
        return 0;
    }
    let wc: u64 = ctx.arg(2).unwrap_or(0);
    let _ = WC_PTRS.insert(bpf_get_current_pid_tgid(), wc, 0);
    0
}

/// `poll_cq` return: one event per completion (up to WC_PER_POLL), only
/// when it returned completions. args = [wr_id, qp_num, byte_len, status,
/// completions returned, index].
#[uretprobe]
pub fn verbs_poll_return(ctx: RetProbeContext) -> u32 {
    let Some(who) = followed(Hit::DataPathReturn) else {
        return 0;
    };
    let key = bpf_get_current_pid_tgid();
    // SAFETY: read-only lookup of a plain u64.
    let Some(&wc) = (unsafe { WC_PTRS.get(key) }) else {
        return 0;
    };
    let _ = WC_PTRS.remove(key);
    let n: i32 = ctx.ret();
    if n <= 0 {
        return 0;
    }
    let n = n as u64;
    let mut i = 0u64;
    while i < WC_PER_POLL {
        if i >= n {
            break;
        }
        let e = wc + i * WC_SIZE;
        let args = [
            user::<u64>(e),
            u64::from(user::<u32>(e + WC_QP_NUM_OFF)),
            u64::from(user::<u32>(e + WC_BYTE_LEN_OFF)),
            user::<u32>(e + WC_STATUS_OFF) as u64,
            n,
            i,
        ];
        emit(ctx.as_ptr(), CallKind::Return, args, n, who);
        i += 1;
    }
    0
}

/// `ibv_modify_qp(qp, attr, mask)` entry: args = [qp, qp_num, mask,
/// dest_qp_num, dlid, new state].
///
/// Reported for any process, like the communicator creations: a QP is
/// brought up once, inside the rank's communicator init, and a rank the
/// agent finds after that would carry no destination for its links. A few
/// calls per QP; the agent holds an unknown process's for a while (limbo).
#[uprobe]
pub fn verbs_modify_qp(ctx: ProbeContext) -> u32 {
    let who = followed(Hit::Entry).unwrap_or_else(|| {
        let pid_tgid = bpf_get_current_pid_tgid();
        ((pid_tgid >> 32) as u32, pid_tgid as u32)
    });
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    let attr: u64 = ctx.arg(1).unwrap_or(0);
    let mask: u64 = ctx.arg(2).unwrap_or(0);
    let args = [
        qp,
        u64::from(user::<u32>(qp + QP_NUM_OFF)),
        mask & 0xffff_ffff,
        u64::from(user::<u32>(attr + ATTR_DEST_QPN_OFF)),
        u64::from(user::<u16>(attr + ATTR_DLID_OFF)),
        user::<u32>(attr + ATTR_STATE_OFF) as u64,
    ];
    emit(ctx.as_ptr(), CallKind::Entry, args, 0, who);
    0
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {}

//! Stack programs: where followed rank processes spend their time (on and
//! off the CPU) and which code launches which GPU kernels.
//!
//! - `stack_sample` (perf event, CPU clock, per CPU): user + kernel stack of
//!   the running thread.
//! - `stack_switch` (BTF tracepoint sched_switch): captures the user stack of
//!   a followed thread as it leaves the CPU; when it comes back after `d` ns,
//!   a block of at least the off-CPU period is emitted with weight `d`, a
//!   shorter one with probability `d / period` and weight `period`. Every
//!   block's expected weight is its own duration (an unbiased sample of
//!   off-CPU time by *time*, like the CPU clock for on-CPU time) and the
//!   ring-buffer rate stays below two records per period of off-CPU time
//!   however often a thread switches. Capturing a stack costs microseconds
//!   and a polling thread leaves the CPU thousands of times a second, so the
//!   capture itself is sampled: a thread whose recent blocks were shorter than
//!   the period is captured with probability `q` = recent block / period (at
//!   least 1/`MIN_CAPTURE_DIV`), chosen before the block's length is known,
//!   and a captured block's weight is divided by `q` — still unbiased, with
//!   long sleepers (`q` = 1) exactly as before. The kernel stack (3× the
//!   user stack's cost to unwind) is taken only for a block that is emitted,
//!   at its switch-in, from the still-blocked task (`bpf_get_task_stack`):
//!   most captures end in a block too short to emit, and their kernel
//!   unwinding was most of the program's time (on the overhead job
//!   ≈ 5,000 captures a second per agent for ≈ 500 records). (A per-thread running total emitted
//!   at the block that crosses the period is *not* unbiased: a long wait
//!   right after a short sleep absorbs the sleep every time, and an 8 ms
//!   slow data loader followed by a 30 ms sync wait vanished from the
//!   flame graph.)
//! - `stack_launch` (uprobe on `cudaLaunchKernel`, deep set): user stack at
//!   the launch plus the kernel's function pointer.
//!
//! Stacks go through the ring buffer (`bpf_get_stack`), never a stack-id map
//! (which collides and silently merges stacks when full). Processes are
//! selected by `STACK_PIDS`, separate from the call probes' `FOLLOWED`, so
//! stacks can be switched on for a few ranks only.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_stack,
        bpf_get_task_stack, bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map, perf_event, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, PerfEventContext, ProbeContext, RetProbeContext},
    EbpfContext,
};
use slowrank_shared::stack::{
    flag, stack_counter, StackEvent, StackKind, MAX_KERNEL_FRAMES, MAX_USER_FRAMES,
};

/// Stack records for user space.
#[map]
static STACKS: RingBuf = RingBuf::with_byte_size(slowrank_shared::maps::STACKS_BYTES, 0);

/// Processes (tgid) whose stacks are recorded; the value is unused (rank).
#[map]
static STACK_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// Settings written by the agent: index 0 = off-CPU period in ns (0 = off).
#[map]
static STACK_CONFIG: Array<u64> = Array::with_max_entries(4, 0);

/// Per-CPU counters indexed by `slowrank_shared::stack::stack_counter`.
#[map]
static STACK_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stack_counter::COUNT, 0);

/// Off-CPU state of one thread: when it left the CPU and the stack it left
/// with.
#[repr(C)]
pub struct OffCpu {
    ts_out: u64,
    /// The thread's recent off-CPU block length: the longest recent block,
    /// decaying by 1/16 a block (0: none seen yet).
    last_away: u64,
    /// The capture probability of this block times the period, in ns
    /// (0: this block's stack was not captured).
    q_ns: u64,
    ev: StackEvent,
}

/// The lowest capture probability is 1 / this: a thread of 100-µs sleeps is
/// captured once in 16 switches, not each time.
const MIN_CAPTURE_DIV: u64 = 16;

/// Keyed by the thread's `task_struct` address: the switch-in side has the
/// incoming task's pointer, not its pid (a BTF tracepoint's arguments).
#[map]
static OFF_CPU: HashMap<u64, OffCpu> = HashMap::with_max_entries(16384, 0);

/// A zeroed `OffCpu` to insert from (too big for the 512-byte BPF stack).
#[map]
static OFF_CPU_ZERO: PerCpuArray<OffCpu> = PerCpuArray::with_max_entries(1, 0);

const USER_BYTES: u32 = (MAX_USER_FRAMES * 8) as u32;
const KERNEL_BYTES: u32 = (MAX_KERNEL_FRAMES * 8) as u32;

#[inline(always)]
fn bump(index: u32) {
    if let Some(slot) = STACK_COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// (tgid, tid) of the current thread when its process is followed.
#[inline(always)]
fn followed() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // SAFETY: read-only lookup of a plain value.
    unsafe { STACK_PIDS.get(pid) }?;
    Some((pid, pid_tgid as u32))
}

/// Fills the stacks, identity and comm of `ev` for the current thread.
///
/// # Safety
/// `ev` must point to writable memory for a whole `StackEvent` (a ring-buffer
/// reservation or a map value).
#[inline(always)]
unsafe fn fill(ctx: *mut core::ffi::c_void, ev: *mut StackEvent, who: (u32, u32), kernel: bool) {
    let mut flags = 0;
    let n = bpf_get_stack(
        ctx,
        (*ev).user.as_mut_ptr().cast(),
        USER_BYTES,
        BPF_F_USER_STACK as u64,
    );
    if n < 0 {
        flags |= flag::USER_ERROR;
        (*ev).user_len = 0;
    } else {
        (*ev).user_len = (n as u32) / 8;
        if n as u32 >= USER_BYTES {
            flags |= flag::USER_TRUNCATED;
        }
    }
    (*ev).kernel_len = 0;
    if kernel {
        let n = bpf_get_stack(ctx, (*ev).kernel.as_mut_ptr().cast(), KERNEL_BYTES, 0);
        if n < 0 {
            flags |= flag::KERNEL_ERROR;
        } else {
            (*ev).kernel_len = (n as u32) / 8;
            if n as u32 >= KERNEL_BYTES {
                flags |= flag::KERNEL_TRUNCATED;
            }
        }
    }
    (*ev).flags = flags;
    (*ev).pid = who.0;
    (*ev).tid = who.1;
    (*ev).comm = bpf_get_current_comm().unwrap_or([0; 16]);
}

/// Reserves, fills and submits one record.
#[inline(always)]
fn emit(ctx: *mut core::ffi::c_void, kind: StackKind, addr: u64, who: (u32, u32), kernel: bool) {
    let Some(mut slot) = STACKS.reserve::<StackEvent>(0) else {
        bump(stack_counter::RINGBUF_DROPS);
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` is the reservation, sized for a StackEvent.
    unsafe {
        (*ev).ts_ns = bpf_ktime_get_ns();
        (*ev).weight_ns = 0;
        (*ev).addr = addr;
        (*ev).kind = kind as u32;
        fill(ctx, ev, who, kernel);
    }
    slot.submit(crate::NO_WAKEUP);
}

#[perf_event]
pub fn stack_sample(ctx: PerfEventContext) -> u32 {
    let Some(who) = followed() else { return 0 };
    bump(stack_counter::ON_CPU);
    emit(ctx.as_ptr(), StackKind::OnCpu, 0, who, true);
    0
}

#[uprobe]
pub fn stack_launch(ctx: ProbeContext) -> u32 {
    let Some(who) = followed() else { return 0 };
    bump(stack_counter::LAUNCH);
    let func: u64 = ctx.arg(0).unwrap_or(0);
    emit(ctx.as_ptr(), StackKind::Launch, func, who, false);
    0
}

/// A sync call boundary: no stack, just who and when (GPU progress marks
/// for the launch view's GPU time estimate).
#[inline(always)]
fn sync_mark(kind: StackKind) {
    let Some(who) = followed() else { return };
    let Some(mut slot) = STACKS.reserve::<StackEvent>(0) else {
        bump(stack_counter::RINGBUF_DROPS);
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` is the reservation, sized for a StackEvent; only the
    // header is meaningful (user_len = kernel_len = 0).
    unsafe {
        (*ev).ts_ns = bpf_ktime_get_ns();
        (*ev).weight_ns = 0;
        (*ev).addr = 0;
        (*ev).pid = who.0;
        (*ev).tid = who.1;
        (*ev).kind = kind as u32;
        (*ev).flags = 0;
        (*ev).user_len = 0;
        (*ev).kernel_len = 0;
        (*ev).comm = [0; 16];
    }
    slot.submit(crate::NO_WAKEUP);
}

#[uprobe]
pub fn stack_sync_call(_ctx: ProbeContext) -> u32 {
    sync_mark(StackKind::SyncCall);
    0
}

#[uretprobe]
pub fn stack_sync_return(_ctx: RetProbeContext) -> u32 {
    sync_mark(StackKind::SyncReturn);
    0
}

/// `prev_state` of a thread on its last switch (`do_task_dead`): the raw
/// `__state` the BTF tracepoint passes, not the classic record's report bits.
const TASK_DEAD: u32 = 0x80;

/// Captures the user stack of a followed thread leaving the CPU.
#[inline(always)]
fn switch_out(ctx: &BtfTracePointContext, task: u64, who: (u32, u32), now: u64) {
    let state: u32 = ctx.arg(3);
    if state & TASK_DEAD != 0 {
        // Its last switch: free the slot, or the map fills with dead threads.
        let _ = OFF_CPU.remove(task);
        return;
    }
    if OFF_CPU.get_ptr_mut(task).is_none() {
        if let Some(zero) = OFF_CPU_ZERO.get_ptr(0) {
            // SAFETY: map value pointer of the right type.
            let _ = OFF_CPU.insert(task, unsafe { &*zero }, 0);
        }
    }
    let period = STACK_CONFIG.get(0).copied().unwrap_or(0);
    if period == 0 {
        return;
    }
    if let Some(st) = OFF_CPU.get_ptr_mut(task) {
        // SAFETY: map value of this thread; only this CPU runs it now.
        unsafe {
            (*st).ts_out = now;
            // q·period from the last block (a first block is captured).
            let last = (*st).last_away;
            let q_ns = if last == 0 || last >= period {
                period
            } else if last < period / MIN_CAPTURE_DIV {
                period / MIN_CAPTURE_DIV
            } else {
                last
            };
            if q_ns < period && u64::from(bpf_get_prandom_u32()) % period >= q_ns {
                (*st).q_ns = 0;
                bump(stack_counter::OFF_CPU_SKIPPED);
                return;
            }
            (*st).q_ns = q_ns.max(1);
            (*st).ev.kind = StackKind::OffCpu as u32;
            (*st).ev.addr = 0;
            // The kernel stack waits for the switch-in, if the block is emitted.
            fill(ctx.as_ptr(), core::ptr::addr_of_mut!((*st).ev), who, false);
        }
    }
}

/// The kernel stack of `next`, still blocked where it left the CPU, into
/// its record.
///
/// # Safety
/// `st` must point to the map value of `next`.
#[inline(always)]
unsafe fn fill_kernel_of(next: *mut aya_ebpf::bindings::task_struct, st: *mut OffCpu) {
    let n = bpf_get_task_stack(next, (*st).ev.kernel.as_mut_ptr().cast(), KERNEL_BYTES, 0);
    if n < 0 {
        (*st).ev.flags |= flag::KERNEL_ERROR;
        (*st).ev.kernel_len = 0;
    } else {
        (*st).ev.kernel_len = (n as u32) / 8;
        if n as u32 >= KERNEL_BYTES {
            (*st).ev.flags |= flag::KERNEL_TRUNCATED;
        }
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct
/// *next, unsigned int prev_state)`: a BTF tracepoint, cheaper than the
/// classic one (no record is built) and it hands over both tasks.
#[btf_tracepoint(function = "sched_switch")]
pub fn stack_switch(ctx: BtfTracePointContext) -> u32 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // Switch-out: `current` is still the previous task.
    if let Some(who) = followed() {
        let prev: u64 = ctx.arg(1);
        switch_out(&ctx, prev, who, now);
    }
    // Switch-in of a thread we saw leave.
    let next_task: *mut aya_ebpf::bindings::task_struct = ctx.arg(2);
    let next = next_task as u64;
    let Some(st) = OFF_CPU.get_ptr_mut(next) else {
        return 0;
    };
    let period = STACK_CONFIG.get(0).copied().unwrap_or(0);
    // SAFETY: map value; the thread is not running, nobody else writes it.
    unsafe {
        let away = if (*st).ts_out != 0 && now > (*st).ts_out {
            now - (*st).ts_out
        } else {
            0
        };
        (*st).ts_out = 0;
        let q_ns = (*st).q_ns;
        (*st).q_ns = 0;
        if away != 0 {
            // A decaying maximum (−1/16 a block): a thread that sleeps long
            // every few short waits keeps capturing its long sleeps (a lone
            // last-block predictor gave them q = 1/16 and 16× the weight).
            let decayed = (*st).last_away - (*st).last_away / 16;
            (*st).last_away = if away > decayed { away } else { decayed };
        }
        if period == 0 || away == 0 || q_ns == 0 {
            return 0;
        }
        // Expected weight = q · E[weight | captured] = the block's length:
        // a block of at least q·period is emitted with weight away / q, a
        // shorter one with probability away / (q·period) and weight period.
        let weight = if away >= q_ns {
            if q_ns >= period {
                away
            } else {
                // away · period / q_ns without overflowing for hour-long blocks.
                (away / q_ns) * period + (away % q_ns) * period / q_ns
            }
        } else if u64::from(bpf_get_prandom_u32()) % q_ns < away {
            period
        } else {
            return 0;
        };
        (*st).ev.weight_ns = weight;
        (*st).ev.ts_ns = now;
        fill_kernel_of(next_task, st);
        if STACKS
            .output::<StackEvent>(&(*st).ev, crate::NO_WAKEUP)
            .is_err()
        {
            bump(stack_counter::RINGBUF_DROPS);
        } else {
            bump(stack_counter::OFF_CPU);
        }
    }
    0
}

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

use aya_ebpf::{
    helpers::{bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use slowrank_shared::probe::{counter, CallEvent, CallKind, MAX_ARGS};

/// Call events for user space. The agent may resize it before load.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Followed process ids (tgid → rank, or u32::MAX when not yet known).
#[map]
static FOLLOWED: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

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

/// Returns (pid, tid) when the current process is followed.
#[inline(always)]
fn followed() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // SAFETY: read-only lookup of a plain u32 value.
    if unsafe { FOLLOWED.get(&pid) }.is_none() {
        bump(counter::UNFOLLOWED_HITS);
        return None;
    }
    Some((pid, pid_tgid as u32))
}

#[inline(always)]
fn emit(ctx: *mut core::ffi::c_void, kind: CallKind, args: [u64; MAX_ARGS], ret: u64, who: (u32, u32)) {
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
    slot.submit(0);
}

#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    let Some(who) = followed() else { return 0 };
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
    let Some(who) = followed() else { return 0 };
    let ret: u64 = ctx.ret();
    emit(ctx.as_ptr(), CallKind::Return, [0; MAX_ARGS], ret, who);
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

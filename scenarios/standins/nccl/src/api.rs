//! The exported API (`nccl.h`, NCCL 2.21). As in the real library, each
//! entry point is the strong symbol `pncclX`, and `ncclX` is a weak alias of
//! it (the aliases must sit in this module: `.set` resolves only within the
//! codegen unit that defines the target).

#![allow(non_snake_case)]

use std::{
    ffi::{c_char, c_int, c_void},
    sync::Arc,
};

use slowrank_sim::{abi::nccl::*, cost::Kind};

use crate::{
    comm::{self, Comm},
    group,
    task::Part,
};

type CommHandle = *mut c_void;

fn report(what: &str, e: impl std::fmt::Display) -> NcclResult {
    eprintln!("[slowrank libnccl] {what}: {e}");
    NCCL_SYSTEM_ERROR
}

/// Borrows the communicator behind a handle (an `Arc<Comm>` raw pointer).
unsafe fn comm_of(h: CommHandle) -> Option<Arc<Comm>> {
    if h.is_null() {
        return None;
    }
    let p = h as *const Comm;
    // SAFETY: handles come from `publish` and stay alive until destroyed.
    unsafe {
        Arc::increment_strong_count(p);
        Some(Arc::from_raw(p))
    }
}

fn publish(c: Comm) -> CommHandle {
    Arc::into_raw(Arc::new(c)) as CommHandle
}

/// `ncclResult_t ncclGetVersion(int *version)`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetVersion(version: *mut c_int) -> NcclResult {
    if version.is_null() {
        return NCCL_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out pointer.
    unsafe { *version = NCCL_VERSION_CODE };
    NCCL_SUCCESS
}

/// `ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetUniqueId(out: *mut NcclUniqueId) -> NcclResult {
    if out.is_null() {
        return NCCL_INVALID_ARGUMENT;
    }
    let mut id = NcclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // Like NCCL: a bootstrap socket address (AF_INET, port, 127.0.0.1)
    // followed by a random magic.
    id.internal[0..2].copy_from_slice(&(libc::AF_INET as u16).to_le_bytes());
    id.internal[2..4].copy_from_slice(&29400u16.to_be_bytes());
    id.internal[4..8].copy_from_slice(&[127, 0, 0, 1]);
    // SAFETY: filling our own buffer.
    let got = unsafe { libc::getrandom(id.internal[16..48].as_mut_ptr().cast(), 32, 0) };
    if got != 32 {
        return NCCL_SYSTEM_ERROR;
    }
    // SAFETY: non-null out pointer.
    unsafe { *out = id };
    NCCL_SUCCESS
}

/// `ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks,
/// ncclUniqueId commId, int rank)` — `commId` is 128 bytes by value.
#[no_mangle]
pub unsafe extern "C" fn pncclCommInitRank(
    out: *mut CommHandle,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    if out.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
        return NCCL_INVALID_ARGUMENT;
    }
    match comm::init(&comm_id.internal, nranks as u32, rank as u32) {
        Ok(c) => {
            // SAFETY: non-null out pointer.
            unsafe { *out = publish(c) };
            NCCL_SUCCESS
        }
        Err(e) => report("ncclCommInitRank", e),
    }
}

/// `ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
/// ncclUniqueId commId, int rank, ncclConfig_t* config)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommInitRankConfig(
    out: *mut CommHandle,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    _config: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { pncclCommInitRank(out, nranks, comm_id, rank) }
}

/// `ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
/// ncclComm_t *newcomm, ncclConfig_t* config)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommSplit(
    parent: CommHandle,
    color: c_int,
    key: c_int,
    out: *mut CommHandle,
    _config: *mut c_void,
) -> NcclResult {
    // SAFETY: caller's handle.
    let Some(p) = (unsafe { comm_of(parent) }) else {
        return NCCL_INVALID_ARGUMENT;
    };
    if out.is_null() || (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
        return NCCL_INVALID_ARGUMENT;
    }
    match comm::split(&p, color, key) {
        Ok(c) => {
            // SAFETY: non-null out pointer.
            unsafe { *out = c.map_or(std::ptr::null_mut(), publish) };
            NCCL_SUCCESS
        }
        Err(e) => report("ncclCommSplit", e),
    }
}

/// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommDestroy(c: CommHandle) -> NcclResult {
    if c.is_null() {
        return NCCL_INVALID_ARGUMENT;
    }
    // SAFETY: the handle's own reference; queued work holds its own.
    drop(unsafe { Arc::from_raw(c as *const Comm) });
    NCCL_SUCCESS
}

/// `ncclResult_t ncclCommAbort(ncclComm_t comm)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommAbort(c: CommHandle) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { pncclCommDestroy(c) }
}

/// `ncclResult_t ncclCommCount(const ncclComm_t comm, int* count)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommCount(c: CommHandle, count: *mut c_int) -> NcclResult {
    // SAFETY: caller's handle and out pointer.
    match unsafe { comm_of(c) } {
        Some(c) if !count.is_null() => {
            unsafe { *count = c.nranks() as c_int };
            NCCL_SUCCESS
        }
        _ => NCCL_INVALID_ARGUMENT,
    }
}

/// `ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommUserRank(c: CommHandle, rank: *mut c_int) -> NcclResult {
    // SAFETY: caller's handle and out pointer.
    match unsafe { comm_of(c) } {
        Some(c) if !rank.is_null() => {
            unsafe { *rank = c.rank as c_int };
            NCCL_SUCCESS
        }
        _ => NCCL_INVALID_ARGUMENT,
    }
}

/// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommGetAsyncError(
    _c: CommHandle,
    err: *mut NcclResult,
) -> NcclResult {
    if err.is_null() {
        return NCCL_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out pointer.
    unsafe { *err = NCCL_SUCCESS };
    NCCL_SUCCESS
}

/// `const char* ncclGetErrorString(ncclResult_t result)`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetErrorString(r: NcclResult) -> *const c_char {
    let s: &'static std::ffi::CStr = match r {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

fn collective(
    c: CommHandle,
    kind: Kind,
    count: usize,
    dtype: NcclDataType,
    whole: bool,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: caller's handle.
    let Some(comm) = (unsafe { comm_of(c) }) else {
        return NCCL_INVALID_ARGUMENT;
    };
    let Some(size) = type_size(dtype) else {
        return NCCL_INVALID_ARGUMENT;
    };
    // All-gather / reduce-scatter counts are per member.
    let per = count as u64 * size;
    let bytes = if whole {
        per
    } else {
        per * u64::from(comm.nranks())
    };
    group::submit(stream, Part::collective(comm, kind, bytes))
}

fn check_op(op: NcclRedOp) -> bool {
    // Built-in ops, or a handle from ncclRedOpCreatePreMulSum (>= NUM_OPS).
    op >= 0
}

/// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff,
/// size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
/// cudaStream_t stream)` — 7 arguments, `stream` on the stack.
#[no_mangle]
pub unsafe extern "C" fn pncclAllReduce(
    _send: *const c_void,
    _recv: *mut c_void,
    count: usize,
    dtype: NcclDataType,
    op: NcclRedOp,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    if !check_op(op) {
        return NCCL_INVALID_ARGUMENT;
    }
    collective(c, Kind::AllReduce, count, dtype, true, stream)
}

/// `ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff,
/// size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`.
#[no_mangle]
pub unsafe extern "C" fn pncclAllGather(
    _send: *const c_void,
    _recv: *mut c_void,
    sendcount: usize,
    dtype: NcclDataType,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    collective(c, Kind::AllGather, sendcount, dtype, false, stream)
}

/// `ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
/// size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
/// cudaStream_t stream)`.
#[no_mangle]
pub unsafe extern "C" fn pncclReduceScatter(
    _send: *const c_void,
    _recv: *mut c_void,
    recvcount: usize,
    dtype: NcclDataType,
    op: NcclRedOp,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    if !check_op(op) {
        return NCCL_INVALID_ARGUMENT;
    }
    collective(c, Kind::ReduceScatter, recvcount, dtype, false, stream)
}

/// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff,
/// size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
/// cudaStream_t stream)`.
#[no_mangle]
pub unsafe extern "C" fn pncclBroadcast(
    _send: *const c_void,
    _recv: *mut c_void,
    count: usize,
    dtype: NcclDataType,
    root: c_int,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    if root < 0 {
        return NCCL_INVALID_ARGUMENT;
    }
    collective(c, Kind::Broadcast, count, dtype, true, stream)
}

/// `ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff,
/// size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
/// ncclComm_t comm, cudaStream_t stream)` — 8 arguments.
#[no_mangle]
pub unsafe extern "C" fn pncclReduce(
    _send: *const c_void,
    _recv: *mut c_void,
    count: usize,
    dtype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    if !check_op(op) || root < 0 {
        return NCCL_INVALID_ARGUMENT;
    }
    collective(c, Kind::Reduce, count, dtype, true, stream)
}

fn p2p(
    send: bool,
    count: usize,
    dtype: NcclDataType,
    peer: c_int,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: caller's handle.
    let Some(comm) = (unsafe { comm_of(c) }) else {
        return NCCL_INVALID_ARGUMENT;
    };
    let Some(size) = type_size(dtype) else {
        return NCCL_INVALID_ARGUMENT;
    };
    if peer < 0 || peer as u32 >= comm.nranks() || peer as u32 == comm.rank {
        return NCCL_INVALID_ARGUMENT;
    }
    group::submit(
        stream,
        Part::p2p(comm, send, peer as u32, count as u64 * size),
    )
}

/// `ncclResult_t ncclSend(const void* sendbuff, size_t count,
/// ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)`.
#[no_mangle]
pub unsafe extern "C" fn pncclSend(
    _send: *const c_void,
    count: usize,
    dtype: NcclDataType,
    peer: c_int,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    p2p(true, count, dtype, peer, c, stream)
}

/// `ncclResult_t ncclRecv(void* recvbuff, size_t count,
/// ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)`.
#[no_mangle]
pub unsafe extern "C" fn pncclRecv(
    _recv: *mut c_void,
    count: usize,
    dtype: NcclDataType,
    peer: c_int,
    c: CommHandle,
    stream: *mut c_void,
) -> NcclResult {
    p2p(false, count, dtype, peer, c, stream)
}

/// `ncclResult_t ncclGroupStart(void)`.
#[no_mangle]
pub unsafe extern "C" fn pncclGroupStart() -> NcclResult {
    group::start()
}

/// `ncclResult_t ncclGroupEnd(void)`.
#[no_mangle]
pub unsafe extern "C" fn pncclGroupEnd() -> NcclResult {
    group::end()
}

macro_rules! weak_aliases {
    ($($name:literal),* $(,)?) => {
        $(core::arch::global_asm!(
            concat!(".weak ", $name),
            concat!(".type ", $name, ", @function"),
            concat!(".set ", $name, ", p", $name),
        );)*
    };
}

weak_aliases!(
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommSplit",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommUserRank",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclReduce",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
);

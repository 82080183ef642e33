//! `nccl.h` (NCCL 2.21).

use std::ffi::c_int;

/// `ncclResult_t`.
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// `NCCL_VERSION(2, 21, 5)`.
pub const NCCL_VERSION_CODE: c_int = 22105;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclUniqueId`: 128 bytes, passed **by value** to `ncclCommInitRank`
/// (so on x86-64 it is copied onto the caller's stack, never in registers).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId {
    pub internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclUniqueId({:02x?}..)", &self.internal[..8])
    }
}

/// `ncclDataType_t`.
pub type NcclDataType = c_int;
pub const NCCL_INT8: NcclDataType = 0;
pub const NCCL_UINT8: NcclDataType = 1;
pub const NCCL_INT32: NcclDataType = 2;
pub const NCCL_UINT32: NcclDataType = 3;
pub const NCCL_INT64: NcclDataType = 4;
pub const NCCL_UINT64: NcclDataType = 5;
pub const NCCL_FLOAT16: NcclDataType = 6;
pub const NCCL_FLOAT32: NcclDataType = 7;
pub const NCCL_FLOAT64: NcclDataType = 8;
pub const NCCL_BFLOAT16: NcclDataType = 9;
pub const NCCL_FLOAT8E4M3: NcclDataType = 10;
pub const NCCL_FLOAT8E5M2: NcclDataType = 11;

/// Bytes per element, `None` for an unknown type.
pub fn type_size(t: NcclDataType) -> Option<u64> {
    match t {
        NCCL_INT8 | NCCL_UINT8 | NCCL_FLOAT8E4M3 | NCCL_FLOAT8E5M2 => Some(1),
        NCCL_FLOAT16 | NCCL_BFLOAT16 => Some(2),
        NCCL_INT32 | NCCL_UINT32 | NCCL_FLOAT32 => Some(4),
        NCCL_INT64 | NCCL_UINT64 | NCCL_FLOAT64 => Some(8),
        _ => None,
    }
}

/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;
pub const NCCL_SUM: NcclRedOp = 0;
pub const NCCL_PROD: NcclRedOp = 1;
pub const NCCL_MAX: NcclRedOp = 2;
pub const NCCL_MIN: NcclRedOp = 3;
pub const NCCL_AVG: NcclRedOp = 4;
pub const NCCL_NUM_OPS: NcclRedOp = 5;

/// Opaque `ncclComm_t` / `cudaStream_t` as seen through the ABI.
pub type Handle = *mut std::ffi::c_void;

//! C ABI of the real libraries, as `#[repr(C)]` Rust types and constants
//! taken from `nccl.h`, `cuda_runtime_api.h`/`driver_types.h` and
//! rdma-core's `infiniband/verbs.h`. Offsets of the verbs structs are checked
//! against the installed header by the scenarios' tests.

pub mod cuda;
pub mod nccl;
pub mod verbs;

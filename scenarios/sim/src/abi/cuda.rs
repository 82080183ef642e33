//! CUDA runtime types (CUDA 12).

use std::ffi::{c_int, c_uint, c_void};

/// `cudaError_t`.
pub type CudaError = c_int;
pub const CUDA_SUCCESS: CudaError = 0;
pub const CUDA_ERROR_INVALID_VALUE: CudaError = 1;
pub const CUDA_ERROR_MEMORY_ALLOCATION: CudaError = 2;
pub const CUDA_ERROR_INVALID_DEVICE: CudaError = 101;
pub const CUDA_ERROR_INVALID_RESOURCE_HANDLE: CudaError = 400;
pub const CUDA_ERROR_NOT_READY: CudaError = 600;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CudaError = 900;

/// `dim3`: 12 bytes, passed by value in two integer registers per argument.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

impl Dim3 {
    pub const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };
}

/// `cudaLaunchConfig_t` (for `cudaLaunchKernelExC`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    pub grid_dim: Dim3,
    pub block_dim: Dim3,
    pub dynamic_smem_bytes: usize,
    pub stream: *mut c_void,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `cudaMemcpyKind`.
pub type MemcpyKind = c_int;
pub const MEMCPY_HOST_TO_HOST: MemcpyKind = 0;
pub const MEMCPY_HOST_TO_DEVICE: MemcpyKind = 1;
pub const MEMCPY_DEVICE_TO_HOST: MemcpyKind = 2;
pub const MEMCPY_DEVICE_TO_DEVICE: MemcpyKind = 3;
pub const MEMCPY_DEFAULT: MemcpyKind = 4;

/// `cudaHostFn_t`.
pub type HostFn = unsafe extern "C" fn(user_data: *mut c_void);

/// `cudaStreamCaptureMode`.
pub const STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;

/// CUDA runtime version reported (12.4).
pub const CUDART_VERSION: c_int = 12040;

/// Simulation convention: a kernel's first argument (`args[0]`) points to a
/// `u64` holding its modelled duration in nanoseconds at nominal GPU speed.
/// Real kernels take device pointers there; the simulated GPU has no other
/// way to know how much work a kernel is.
pub const KERNEL_DURATION_ARG: usize = 0;

//! The CUDA runtime, found by soname at run time like NCCL's own cudart
//! wrapper (the already-loaded `libcudart.so.12` is reused).

use std::{ffi::c_void, sync::OnceLock};

use slowrank_sim::abi::cuda::{CudaError, HostFn};

type LaunchHostFunc = unsafe extern "C" fn(*mut c_void, HostFn, *mut c_void) -> CudaError;

/// `cudaLaunchHostFunc`, or `None` when no libcudart can be loaded.
pub fn launch_host_func() -> Option<LaunchHostFunc> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let addr = (*F.get_or_init(|| {
        // SAFETY: dlopen/dlsym with valid C strings; handle kept for ever.
        unsafe {
            let h = libc::dlopen(
                c"libcudart.so.12".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                return None;
            }
            let f = libc::dlsym(h, c"cudaLaunchHostFunc".as_ptr());
            (!f.is_null()).then_some(f as usize)
        }
    }))?;
    // SAFETY: the symbol has cudaLaunchHostFunc's signature.
    Some(unsafe { std::mem::transmute::<usize, LaunchHostFunc>(addr) })
}

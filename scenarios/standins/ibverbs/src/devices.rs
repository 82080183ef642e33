//! Provider registration and the device list.

use std::{
    ffi::{c_char, c_int, CString},
    sync::{Mutex, OnceLock},
};

use slowrank_sim::abi::verbs::{ibv_device, ProviderOps, IBV_NODE_CA, IBV_TRANSPORT_IB};

/// The provider library, found through the library path like rdma-core's
/// `libmlx5-rdmav34.so`.
const PROVIDER: &str = "libmlx5.so.1";

static PROVIDER_OPS: Mutex<Option<&'static ProviderOps>> = Mutex::new(None);

/// Called by the provider's constructor.
pub fn register(ops: &'static ProviderOps) {
    *PROVIDER_OPS.lock().unwrap_or_else(|p| p.into_inner()) = Some(ops);
}

/// The registered provider, loading it on first use.
pub fn provider() -> Option<&'static ProviderOps> {
    if let Some(ops) = *PROVIDER_OPS.lock().unwrap_or_else(|p| p.into_inner()) {
        return Some(ops);
    }
    let name = CString::new(PROVIDER).expect("no NUL");
    // SAFETY: dlopen with a valid C string; the handle is kept for ever. The
    // provider's constructor registers itself during this call.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    *PROVIDER_OPS.lock().unwrap_or_else(|p| p.into_inner())
}

fn fill(dst: &mut [c_char], s: &str) {
    let max = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as c_char;
    }
}

/// The devices (one per simulated NIC), created once and never freed, so
/// `ibv_device` pointers stay valid like rdma-core's.
pub fn devices() -> &'static [usize] {
    static DEVS: OnceLock<Vec<usize>> = OnceLock::new();
    DEVS.get_or_init(|| {
        let Some(ops) = provider() else {
            return Vec::new();
        };
        // SAFETY: provider function.
        let n = unsafe { (ops.num_devices)() }.max(0);
        (0..n)
            .map(|i| {
                // SAFETY: plain data; zero is valid for every field.
                let mut d: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
                d.node_type = IBV_NODE_CA;
                d.transport_type = IBV_TRANSPORT_IB;
                fill(&mut d.name, &format!("mlx5_{i}"));
                fill(&mut d.dev_name, &format!("uverbs{i}"));
                fill(
                    &mut d.dev_path,
                    &format!("/sys/class/infiniband_verbs/uverbs{i}"),
                );
                fill(
                    &mut d.ibdev_path,
                    &format!("/sys/class/infiniband/mlx5_{i}"),
                );
                Box::into_raw(d) as usize
            })
            .collect()
    })
}

/// Index of `dev` in the device list.
pub fn index_of(dev: *mut ibv_device) -> Option<c_int> {
    devices()
        .iter()
        .position(|&d| d == dev as usize)
        .map(|i| i as c_int)
}

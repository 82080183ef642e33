//! Exported verbs entry points (`infiniband/verbs.h`, rdma-core 44).
//! The C names are aliases set in this module so that the version script
//! can version them (an alias must sit in its target's codegen unit).

use std::{
    ffi::{c_char, c_int, c_void},
    ptr,
};

use slowrank_sim::abi::verbs::{
    ibv_context, ibv_cq, ibv_device, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr,
    ibv_qp_init_attr, ProviderOps,
};

use crate::devices;

const EINVAL: c_int = libc::EINVAL;
const ENODEV: c_int = libc::ENODEV;

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

fn ops() -> Option<&'static ProviderOps> {
    devices::provider()
}

/// `struct ibv_device **ibv_get_device_list(int *num_devices)`.
unsafe extern "C" fn get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let devs = devices::devices();
    if devs.is_empty() {
        set_errno(libc::ENOSYS);
        return ptr::null_mut();
    }
    if !num.is_null() {
        // SAFETY: caller's out pointer.
        unsafe { *num = devs.len() as c_int };
    }
    let mut list: Vec<*mut ibv_device> = devs.iter().map(|&d| d as *mut ibv_device).collect();
    list.push(ptr::null_mut());
    Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_device
}

/// `void ibv_free_device_list(struct ibv_device **list)`.
unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let n = devices::devices().len() + 1;
    // SAFETY: allocated by get_device_list with exactly n entries.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n)) });
}

/// `const char *ibv_get_device_name(struct ibv_device *device)`.
unsafe extern "C" fn get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        return ptr::null();
    }
    // SAFETY: a device from our list.
    unsafe { (*dev).name.as_ptr() }
}

/// `struct ibv_context *ibv_open_device(struct ibv_device *device)`.
unsafe extern "C" fn open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let (Some(ops), Some(i)) = (ops(), devices::index_of(dev)) else {
        set_errno(ENODEV);
        return ptr::null_mut();
    };
    // SAFETY: provider call with a device of ours.
    unsafe { (ops.alloc_context)(dev, i) }
}

/// `int ibv_close_device(struct ibv_context *context)`.
unsafe extern "C" fn close_device(ctx: *mut ibv_context) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !ctx.is_null() => unsafe { (ops.free_context)(ctx) },
        _ => EINVAL,
    }
}

/// `int ibv_query_port(struct ibv_context *, uint8_t port_num, struct ibv_port_attr *)`.
unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !ctx.is_null() && !attr.is_null() => unsafe {
            (ops.query_port)(ctx, port, attr)
        },
        _ => EINVAL,
    }
}

/// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)`.
unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !ctx.is_null() => unsafe { (ops.alloc_pd)(ctx) },
        _ => ptr::null_mut(),
    }
}

/// `int ibv_dealloc_pd(struct ibv_pd *pd)`.
unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !pd.is_null() => unsafe { (ops.dealloc_pd)(pd) },
        _ => EINVAL,
    }
}

/// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)`.
unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !pd.is_null() => unsafe { (ops.reg_mr)(pd, addr, len, access) },
        _ => ptr::null_mut(),
    }
}

/// `int ibv_dereg_mr(struct ibv_mr *mr)`.
unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !mr.is_null() => unsafe { (ops.dereg_mr)(mr) },
        _ => EINVAL,
    }
}

/// `struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe,
/// void *cq_context, struct ibv_comp_channel *channel, int comp_vector)`.
unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c_void,
    comp_vector: c_int,
) -> *mut ibv_cq {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !ctx.is_null() => unsafe {
            (ops.create_cq)(ctx, cqe, cq_context, channel, comp_vector)
        },
        _ => ptr::null_mut(),
    }
}

/// `int ibv_destroy_cq(struct ibv_cq *cq)`.
unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !cq.is_null() => unsafe { (ops.destroy_cq)(cq) },
        _ => EINVAL,
    }
}

/// `struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)`.
unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !pd.is_null() && !attr.is_null() => unsafe { (ops.create_qp)(pd, attr) },
        _ => ptr::null_mut(),
    }
}

/// `int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)`.
unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !qp.is_null() && !attr.is_null() => unsafe { (ops.modify_qp)(qp, attr, mask) },
        _ => EINVAL,
    }
}

/// `int ibv_destroy_qp(struct ibv_qp *qp)`.
unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    match ops() {
        // SAFETY: provider call.
        Some(ops) if !qp.is_null() => unsafe { (ops.destroy_qp)(qp) },
        _ => EINVAL,
    }
}

/// `void verbs_register_driver_34(const struct verbs_device_ops *ops)`;
/// here with the stand-in's own [`ProviderOps`] table.
unsafe extern "C" fn register_driver(ops: *const ProviderOps) {
    if !ops.is_null() {
        // SAFETY: the provider's table is a static in the provider library,
        // which is never unloaded.
        devices::register(unsafe { &*ops });
    }
}

macro_rules! export {
    ($($name:literal => $f:path),* $(,)?) => {
        $(core::arch::global_asm!(
            concat!(".globl ", $name),
            concat!(".type ", $name, ", @function"),
            concat!(".set ", $name, ", {f}"),
            f = sym $f,
        );)*
    };
}

export! {
    "ibv_get_device_list" => get_device_list,
    "ibv_free_device_list" => free_device_list,
    "ibv_get_device_name" => get_device_name,
    "ibv_open_device" => open_device,
    "ibv_close_device" => close_device,
    "ibv_query_port" => query_port,
    "ibv_alloc_pd" => alloc_pd,
    "ibv_dealloc_pd" => dealloc_pd,
    "ibv_reg_mr" => reg_mr,
    "ibv_dereg_mr" => dereg_mr,
    "ibv_create_cq" => create_cq,
    "ibv_destroy_cq" => destroy_cq,
    "ibv_create_qp" => create_qp,
    "ibv_modify_qp" => modify_qp,
    "ibv_destroy_qp" => destroy_qp,
    "verbs_register_driver_34" => register_driver,
}

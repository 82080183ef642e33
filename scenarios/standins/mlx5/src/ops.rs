//! The provider's functions: the control path behind libibverbs' exported
//! calls, and the data path installed in every context's ops table.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    ffi::{c_int, c_void},
    sync::{
        atomic::{AtomicU16, AtomicU32, Ordering},
        Mutex,
    },
};

use slowrank_sim::{
    abi::verbs::{
        ibv_context, ibv_cq, ibv_device, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr,
        ibv_qp_init_attr, ibv_send_wr, ibv_wc, ProviderOps, IBV_MTU_4096, IBV_PORT_ACTIVE,
        IBV_QPS_RESET, IBV_QPS_RTS, IBV_QP_AV, IBV_QP_DEST_QPN, IBV_QP_STATE, IBV_SEND_SIGNALED,
        IBV_WC_RDMA_WRITE, IBV_WC_SEND, IBV_WC_SUCCESS, IBV_WR_SEND,
    },
    clock,
    control::lid_of,
    env,
};

use crate::{
    nic::Nic,
    objects::{Context, Cq, Pending, Qp},
    port, trace,
};

/// Registered with libibverbs by the constructor.
pub static PROVIDER: ProviderOps = ProviderOps {
    name: c"mlx5".as_ptr(),
    num_devices,
    alloc_context,
    free_context,
    query_port,
    alloc_pd,
    dealloc_pd,
    reg_mr,
    dereg_mr,
    create_cq,
    destroy_cq,
    create_qp,
    modify_qp,
    destroy_qp,
};

fn zeroed<T>() -> T {
    // SAFETY: only used for the C structs, for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// One NIC per GPU on the host.
unsafe extern "C" fn num_devices() -> c_int {
    env::u32_var("LOCAL_WORLD_SIZE").map_or(8, |n| n.max(1) as c_int)
}

unsafe extern "C" fn alloc_context(dev: *mut ibv_device, index: c_int) -> *mut ibv_context {
    let host = env::u32_var(env::HOST).unwrap_or(0);
    let mut ibv: ibv_context = zeroed();
    ibv.device = dev;
    ibv.cmd_fd = -1;
    ibv.async_fd = -1;
    ibv.num_comp_vectors = 1;
    ibv.ops.poll_cq = Some(mlx5_poll_cq);
    ibv.ops.post_send = Some(mlx5_post_send);
    ibv.ops.post_recv = Some(mlx5_post_recv);
    ibv.ops.req_notify_cq = Some(mlx5_req_notify_cq);
    let lid = lid_of(host, index.max(0) as u32);
    port::start(lid);
    let ctx = Box::new(Context {
        ibv,
        nic: Nic::new(lid),
        next_qpn: AtomicU32::new(0x80),
    });
    Box::into_raw(ctx).cast()
}

unsafe extern "C" fn free_context(ctx: *mut ibv_context) -> c_int {
    // SAFETY: allocated by alloc_context as a Context.
    drop(unsafe { Box::from_raw(ctx.cast::<Context>()) });
    0
}

unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    _port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: our context; caller's out pointer.
    unsafe {
        let c = &*ctx.cast::<Context>();
        let mut a: ibv_port_attr = zeroed();
        a.state = IBV_PORT_ACTIVE;
        a.max_mtu = IBV_MTU_4096;
        a.active_mtu = IBV_MTU_4096;
        a.gid_tbl_len = 1;
        a.max_msg_sz = 1 << 30;
        a.pkey_tbl_len = 1;
        a.lid = c.nic.lid;
        a.sm_lid = 1;
        a.active_width = 2; // 4x
        a.active_speed = 64; // HDR
        a.phys_state = 5; // LinkUp
        a.link_layer = 1; // InfiniBand
        *attr = a;
    }
    0
}

unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    Box::into_raw(Box::new(ibv_pd {
        context: ctx,
        handle: 1,
    }))
}

unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: allocated by alloc_pd.
    drop(unsafe { Box::from_raw(pd) });
    0
}

unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    _access: c_int,
) -> *mut ibv_mr {
    static NEXT_KEY: AtomicU32 = AtomicU32::new(0x1000);
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    Box::into_raw(Box::new(ibv_mr {
        // SAFETY: a pd of ours.
        context: unsafe { (*pd).context },
        pd,
        addr,
        length: len,
        handle: key,
        lkey: key,
        rkey: key,
    }))
}

unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: allocated by reg_mr.
    drop(unsafe { Box::from_raw(mr) });
    0
}

unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c_void,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    let mut ibv: ibv_cq = zeroed();
    ibv.context = ctx;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.cqe = cqe;
    Box::into_raw(Box::new(Cq {
        ibv,
        pending: Mutex::new(BinaryHeap::new()),
    }))
    .cast()
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: allocated by create_cq as a Cq.
    drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
    0
}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: pd and attr of the caller, context of ours.
    unsafe {
        let ctx = (*pd).context;
        let c = &*ctx.cast::<Context>();
        let a = &*attr;
        let mut ibv: ibv_qp = zeroed();
        ibv.context = ctx;
        ibv.qp_context = a.qp_context;
        ibv.pd = pd;
        ibv.send_cq = a.send_cq;
        ibv.recv_cq = a.recv_cq;
        ibv.qp_num = c.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        ibv.state = IBV_QPS_RESET;
        ibv.qp_type = a.qp_type;
        Box::into_raw(Box::new(Qp {
            ibv,
            sq_sig_all: a.sq_sig_all != 0,
            dest_qp_num: AtomicU32::new(0),
            dlid: AtomicU16::new(0),
        }))
        .cast()
    }
}

unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: our QP, caller's attr.
    unsafe {
        let q = &mut *qp.cast::<Qp>();
        let a = &*attr;
        if mask & IBV_QP_STATE != 0 {
            q.ibv.state = a.qp_state;
        }
        if mask & IBV_QP_DEST_QPN != 0 {
            q.dest_qp_num.store(a.dest_qp_num, Ordering::Relaxed);
        }
        if mask & IBV_QP_AV != 0 {
            q.dlid.store(a.ah_attr.dlid, Ordering::Relaxed);
        }
    }
    0
}

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: allocated by create_qp as a Qp.
    drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
    0
}

/// `ops.post_send`: queue each work request on the simulated NIC.
unsafe extern "C" fn mlx5_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: our QP/context/CQ; the caller's WR chain and SGE lists.
    unsafe {
        let q = &*qp.cast::<Qp>();
        if q.ibv.state != IBV_QPS_RTS {
            if !bad_wr.is_null() {
                *bad_wr = wr;
            }
            return libc::EINVAL;
        }
        let ctx = &*q.ibv.context.cast::<Context>();
        let cq = &*q.ibv.send_cq.cast::<Cq>();
        let dlid = q.dlid.load(Ordering::Relaxed);
        let mut cur = wr;
        while !cur.is_null() {
            let w = &*cur;
            let bytes: u64 = (0..w.num_sge.max(0) as usize)
                .map(|i| u64::from((*w.sg_list.add(i)).length))
                .sum();
            let posted_ns = clock::mono_ns();
            let at_ns = ctx.nic.send(bytes, dlid);
            if q.sq_sig_all || w.send_flags & IBV_SEND_SIGNALED != 0 {
                let mut wc: ibv_wc = zeroed();
                wc.wr_id = w.wr_id;
                wc.status = IBV_WC_SUCCESS;
                wc.opcode = if w.opcode == IBV_WR_SEND {
                    IBV_WC_SEND
                } else {
                    IBV_WC_RDMA_WRITE
                };
                wc.byte_len = bytes.min(u64::from(u32::MAX)) as u32;
                wc.qp_num = q.ibv.qp_num;
                cq.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Reverse(Pending {
                        at_ns,
                        posted_ns,
                        dlid,
                        wc,
                    }));
            }
            cur = w.next;
        }
    }
    0
}

/// `ops.poll_cq`: completions whose time has come, oldest first.
unsafe extern "C" fn mlx5_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: our CQ; the caller's array of num_entries.
    unsafe {
        let c = &*cq.cast::<Cq>();
        let now = clock::mono_ns();
        let mut pending = c.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        while n < num_entries {
            match pending.peek() {
                Some(Reverse(p)) if p.at_ns <= now => {
                    let Reverse(p) = pending.pop().expect("peeked");
                    trace::completion(&p, now);
                    *wc.add(n as usize) = p.wc;
                    n += 1;
                }
                _ => break,
            }
        }
        n
    }
}

/// `ops.post_recv`: receives need no modelling; accepted.
unsafe extern "C" fn mlx5_post_recv(
    _qp: *mut ibv_qp,
    _wr: *mut c_void,
    _bad: *mut *mut c_void,
) -> c_int {
    0
}

unsafe extern "C" fn mlx5_req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    0
}

/// `bool mlx5dv_is_supported(struct ibv_device *device)`.
unsafe extern "C" fn is_supported(_dev: *mut ibv_device) -> bool {
    true
}

core::arch::global_asm!(
    ".globl mlx5dv_is_supported",
    ".type mlx5dv_is_supported, @function",
    ".set mlx5dv_is_supported, {f}",
    f = sym is_supported,
);

//! rdma-core's `infiniband/verbs.h` (rdma-core 44, Debian 12), the subset
//! the stand-ins use, with the same field offsets; `tests/verbs_abi.rs` in
//! the scenarios crate compiles a C program against the installed header and
//! compares every offset listed in [`OFFSETS`].

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub const IBV_SYSFS_NAME_MAX: usize = 64;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

// enum ibv_node_type / ibv_transport_type
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;
// enum ibv_qp_type
pub const IBV_QPT_RC: c_int = 2;
// enum ibv_qp_state
pub const IBV_QPS_RESET: c_int = 0;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_WR_SEND: c_int = 2;
// enum ibv_send_flags
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
// enum ibv_wc_status / ibv_wc_opcode
pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_SEND: c_int = 0;
pub const IBV_WC_RDMA_WRITE: c_int = 1;
// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
// enum ibv_port_state / ibv_mtu
pub const IBV_PORT_ACTIVE: c_int = 4;
pub const IBV_MTU_4096: c_int = 5;

/// `struct _ibv_device_ops`.
#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

pub type PollCqFn =
    unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
pub type PostSendFn = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(qp: *mut ibv_qp, wr: *mut c_void, bad_wr: *mut *mut c_void) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;

/// `struct ibv_context_ops`: the legacy ops table at the start of every
/// context. `ibv_post_send`/`ibv_poll_cq` are `static inline` in the header
/// and jump through `post_send`/`poll_cq` here.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: *mut c_void,
    pub bind_mw: *mut c_void,
    pub dealloc_mw: *mut c_void,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: *mut c_void,
    pub _compat_resize_cq: *mut c_void,
    pub _compat_destroy_cq: *mut c_void,
    pub _compat_create_srq: *mut c_void,
    pub _compat_modify_srq: *mut c_void,
    pub _compat_query_srq: *mut c_void,
    pub _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: *mut c_void,
    pub _compat_create_qp: *mut c_void,
    pub _compat_query_qp: *mut c_void,
    pub _compat_modify_qp: *mut c_void,
    pub _compat_destroy_qp: *mut c_void,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: *mut c_void,
    pub _compat_destroy_ah: *mut c_void,
    pub _compat_attach_mcast: *mut c_void,
    pub _compat_detach_mcast: *mut c_void,
    pub _compat_async_event: *mut c_void,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut c_void,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `union ibv_gid` (8-byte aligned through its `__be64` view).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes). The `wr` union is kept as its `rdma`
/// view (`remote_addr`, `rkey`) padded to the union's size.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub _wr_union_rest: [u32; 5],
    pub qp_type_xrc_remote_srqn: u32,
    pub _bind_mw_tso: [u64; 6],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        // SAFETY: plain data; null pointers and zeros are valid.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// How a provider plugs into the stand-in libibverbs: the provider's
/// constructor passes this table to `verbs_register_driver_34` (the real
/// rdma-core registers a `struct verbs_device_ops` the same way). Not a
/// header struct; both stand-ins compile this definition.
#[repr(C)]
pub struct ProviderOps {
    pub name: *const c_char,
    pub num_devices: unsafe extern "C" fn() -> c_int,
    pub alloc_context:
        unsafe extern "C" fn(device: *mut ibv_device, index: c_int) -> *mut ibv_context,
    pub free_context: unsafe extern "C" fn(ctx: *mut ibv_context) -> c_int,
    pub query_port:
        unsafe extern "C" fn(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(ctx: *mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        access: c_int,
    ) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(mr: *mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut c_void,
        comp_vector: c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int,
    pub create_qp:
        unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp:
        unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int,
}

/// `(C expression, Rust offset or size)` pairs checked against the header.
pub const OFFSETS: &[(&str, usize)] = &[
    (
        "sizeof(struct ibv_device)",
        std::mem::size_of::<ibv_device>(),
    ),
    (
        "offsetof(struct ibv_device, name)",
        std::mem::offset_of!(ibv_device, name),
    ),
    (
        "offsetof(struct ibv_device, ibdev_path)",
        std::mem::offset_of!(ibv_device, ibdev_path),
    ),
    (
        "sizeof(struct ibv_context_ops)",
        std::mem::size_of::<ibv_context_ops>(),
    ),
    (
        "offsetof(struct ibv_context_ops, poll_cq)",
        std::mem::offset_of!(ibv_context_ops, poll_cq),
    ),
    (
        "offsetof(struct ibv_context_ops, req_notify_cq)",
        std::mem::offset_of!(ibv_context_ops, req_notify_cq),
    ),
    (
        "offsetof(struct ibv_context_ops, post_send)",
        std::mem::offset_of!(ibv_context_ops, post_send),
    ),
    (
        "offsetof(struct ibv_context_ops, post_recv)",
        std::mem::offset_of!(ibv_context_ops, post_recv),
    ),
    (
        "sizeof(struct ibv_context)",
        std::mem::size_of::<ibv_context>(),
    ),
    (
        "offsetof(struct ibv_context, ops)",
        std::mem::offset_of!(ibv_context, ops),
    ),
    (
        "offsetof(struct ibv_context, ops.poll_cq)",
        std::mem::offset_of!(ibv_context, ops) + std::mem::offset_of!(ibv_context_ops, poll_cq),
    ),
    (
        "offsetof(struct ibv_context, ops.post_send)",
        std::mem::offset_of!(ibv_context, ops) + std::mem::offset_of!(ibv_context_ops, post_send),
    ),
    (
        "offsetof(struct ibv_context, cmd_fd)",
        std::mem::offset_of!(ibv_context, cmd_fd),
    ),
    (
        "offsetof(struct ibv_context, num_comp_vectors)",
        std::mem::offset_of!(ibv_context, num_comp_vectors),
    ),
    (
        "offsetof(struct ibv_context, mutex)",
        std::mem::offset_of!(ibv_context, mutex),
    ),
    (
        "offsetof(struct ibv_context, abi_compat)",
        std::mem::offset_of!(ibv_context, abi_compat),
    ),
    ("sizeof(struct ibv_pd)", std::mem::size_of::<ibv_pd>()),
    ("sizeof(struct ibv_mr)", std::mem::size_of::<ibv_mr>()),
    (
        "offsetof(struct ibv_mr, lkey)",
        std::mem::offset_of!(ibv_mr, lkey),
    ),
    (
        "offsetof(struct ibv_mr, rkey)",
        std::mem::offset_of!(ibv_mr, rkey),
    ),
    ("sizeof(struct ibv_cq)", std::mem::size_of::<ibv_cq>()),
    (
        "offsetof(struct ibv_cq, cqe)",
        std::mem::offset_of!(ibv_cq, cqe),
    ),
    (
        "offsetof(struct ibv_cq, cond)",
        std::mem::offset_of!(ibv_cq, cond),
    ),
    (
        "offsetof(struct ibv_cq, async_events_completed)",
        std::mem::offset_of!(ibv_cq, async_events_completed),
    ),
    ("sizeof(struct ibv_qp)", std::mem::size_of::<ibv_qp>()),
    (
        "offsetof(struct ibv_qp, send_cq)",
        std::mem::offset_of!(ibv_qp, send_cq),
    ),
    (
        "offsetof(struct ibv_qp, qp_num)",
        std::mem::offset_of!(ibv_qp, qp_num),
    ),
    (
        "offsetof(struct ibv_qp, state)",
        std::mem::offset_of!(ibv_qp, state),
    ),
    (
        "offsetof(struct ibv_qp, qp_type)",
        std::mem::offset_of!(ibv_qp, qp_type),
    ),
    (
        "offsetof(struct ibv_qp, events_completed)",
        std::mem::offset_of!(ibv_qp, events_completed),
    ),
    (
        "sizeof(struct ibv_qp_init_attr)",
        std::mem::size_of::<ibv_qp_init_attr>(),
    ),
    (
        "offsetof(struct ibv_qp_init_attr, cap)",
        std::mem::offset_of!(ibv_qp_init_attr, cap),
    ),
    (
        "offsetof(struct ibv_qp_init_attr, qp_type)",
        std::mem::offset_of!(ibv_qp_init_attr, qp_type),
    ),
    (
        "sizeof(struct ibv_ah_attr)",
        std::mem::size_of::<ibv_ah_attr>(),
    ),
    (
        "offsetof(struct ibv_ah_attr, dlid)",
        std::mem::offset_of!(ibv_ah_attr, dlid),
    ),
    (
        "offsetof(struct ibv_ah_attr, port_num)",
        std::mem::offset_of!(ibv_ah_attr, port_num),
    ),
    (
        "sizeof(struct ibv_qp_attr)",
        std::mem::size_of::<ibv_qp_attr>(),
    ),
    (
        "offsetof(struct ibv_qp_attr, dest_qp_num)",
        std::mem::offset_of!(ibv_qp_attr, dest_qp_num),
    ),
    (
        "offsetof(struct ibv_qp_attr, cap)",
        std::mem::offset_of!(ibv_qp_attr, cap),
    ),
    (
        "offsetof(struct ibv_qp_attr, ah_attr)",
        std::mem::offset_of!(ibv_qp_attr, ah_attr),
    ),
    (
        "offsetof(struct ibv_qp_attr, ah_attr.dlid)",
        std::mem::offset_of!(ibv_qp_attr, ah_attr) + std::mem::offset_of!(ibv_ah_attr, dlid),
    ),
    (
        "offsetof(struct ibv_qp_attr, alt_ah_attr)",
        std::mem::offset_of!(ibv_qp_attr, alt_ah_attr),
    ),
    (
        "offsetof(struct ibv_qp_attr, pkey_index)",
        std::mem::offset_of!(ibv_qp_attr, pkey_index),
    ),
    (
        "offsetof(struct ibv_qp_attr, port_num)",
        std::mem::offset_of!(ibv_qp_attr, port_num),
    ),
    (
        "offsetof(struct ibv_qp_attr, rate_limit)",
        std::mem::offset_of!(ibv_qp_attr, rate_limit),
    ),
    ("sizeof(struct ibv_sge)", std::mem::size_of::<ibv_sge>()),
    (
        "sizeof(struct ibv_send_wr)",
        std::mem::size_of::<ibv_send_wr>(),
    ),
    (
        "offsetof(struct ibv_send_wr, sg_list)",
        std::mem::offset_of!(ibv_send_wr, sg_list),
    ),
    (
        "offsetof(struct ibv_send_wr, num_sge)",
        std::mem::offset_of!(ibv_send_wr, num_sge),
    ),
    (
        "offsetof(struct ibv_send_wr, opcode)",
        std::mem::offset_of!(ibv_send_wr, opcode),
    ),
    (
        "offsetof(struct ibv_send_wr, send_flags)",
        std::mem::offset_of!(ibv_send_wr, send_flags),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
        std::mem::offset_of!(ibv_send_wr, remote_addr),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
        std::mem::offset_of!(ibv_send_wr, rkey),
    ),
    (
        "offsetof(struct ibv_send_wr, qp_type)",
        std::mem::offset_of!(ibv_send_wr, qp_type_xrc_remote_srqn),
    ),
    (
        "offsetof(struct ibv_send_wr, bind_mw)",
        std::mem::offset_of!(ibv_send_wr, _bind_mw_tso),
    ),
    ("sizeof(struct ibv_wc)", std::mem::size_of::<ibv_wc>()),
    (
        "offsetof(struct ibv_wc, status)",
        std::mem::offset_of!(ibv_wc, status),
    ),
    (
        "offsetof(struct ibv_wc, byte_len)",
        std::mem::offset_of!(ibv_wc, byte_len),
    ),
    (
        "offsetof(struct ibv_wc, qp_num)",
        std::mem::offset_of!(ibv_wc, qp_num),
    ),
    (
        "offsetof(struct ibv_wc, slid)",
        std::mem::offset_of!(ibv_wc, slid),
    ),
    (
        "offsetof(struct ibv_wc, dlid_path_bits)",
        std::mem::offset_of!(ibv_wc, dlid_path_bits),
    ),
    (
        "sizeof(struct ibv_port_attr)",
        std::mem::size_of::<ibv_port_attr>(),
    ),
    (
        "offsetof(struct ibv_port_attr, lid)",
        std::mem::offset_of!(ibv_port_attr, lid),
    ),
    (
        "offsetof(struct ibv_port_attr, port_cap_flags2)",
        std::mem::offset_of!(ibv_port_attr, port_cap_flags2),
    ),
    // Enum values the stand-ins rely on.
    ("IBV_QPT_RC", IBV_QPT_RC as usize),
    ("IBV_QPS_RTS", IBV_QPS_RTS as usize),
    ("IBV_QP_AV", IBV_QP_AV as usize),
    ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as usize),
    ("IBV_QP_STATE", IBV_QP_STATE as usize),
    (
        "IBV_WR_RDMA_WRITE_WITH_IMM",
        IBV_WR_RDMA_WRITE_WITH_IMM as usize,
    ),
    ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as usize),
    ("IBV_SEND_INLINE", IBV_SEND_INLINE as usize),
    ("IBV_WC_RDMA_WRITE", IBV_WC_RDMA_WRITE as usize),
    ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as usize),
    ("IBV_MTU_4096", IBV_MTU_4096 as usize),
];

// SAFETY: a provider's table is immutable static data (function pointers and
// a string literal), shared read-only between threads.
unsafe impl Sync for ProviderOps {}

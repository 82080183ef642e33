//! Provider-side objects. Each begins with the public verbs struct, so the
//! pointer handed to the application is also ours (rdma-core does the same
//! with `container_of`).

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    sync::{
        atomic::{AtomicU16, AtomicU32},
        Mutex,
    },
};

use slowrank_sim::abi::verbs::{ibv_context, ibv_cq, ibv_qp, ibv_wc};

use crate::nic::Nic;

#[repr(C)]
pub struct Context {
    pub ibv: ibv_context,
    pub nic: Nic,
    pub next_qpn: AtomicU32,
}

/// A completion waiting for its time.
pub struct Pending {
    pub at_ns: u64,
    pub posted_ns: u64,
    pub dlid: u16,
    pub wc: ibv_wc,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.at_ns == other.at_ns && self.wc.wr_id == other.wc.wr_id
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ns, self.wc.wr_id).cmp(&(other.at_ns, other.wc.wr_id))
    }
}

#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq,
    pub pending: Mutex<BinaryHeap<Reverse<Pending>>>,
}

#[repr(C)]
pub struct Qp {
    pub ibv: ibv_qp,
    pub sq_sig_all: bool,
    pub dest_qp_num: AtomicU32,
    pub dlid: AtomicU16,
}

//! The IB transport's control path: open this rank's NIC through
//! `libibverbs.so.1` (dlopen'ed by soname, as NCCL's ibvwrap does), create
//! one RC queue pair per peer on another host, swap QP numbers through the
//! bootstrap, and bring the QPs to RTS with `ibv_modify_qp` carrying the
//! peer's QP number and LID.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::{c_int, c_void, CStr},
    sync::OnceLock,
};

use serde::{Deserialize, Serialize};
use serde_json::json;
use slowrank_sim::{abi::verbs::*, control::MAX_LOCAL, hub::client::with_local};

use crate::comm::Me;

/// A connected queue pair to one peer.
#[derive(Debug, Clone, Copy)]
pub struct PeerQp {
    /// `struct ibv_qp *`, as an address so the map is `Send`.
    pub qp: usize,
}

/// Verbs entry points plus this process's opened NIC.
pub struct Net {
    pub pd: usize,
    pub cq: usize,
    pub lkey: u32,
    pub lid: u16,
    create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
}

/// Base of the (unbacked) device buffers NCCL registers with the NIC.
const BUFFER_BASE: usize = 0x7d00_0000_0000;
const BUFFER_LEN: usize = 64 << 20;

unsafe fn sym<T>(h: *mut c_void, name: &CStr) -> Result<T, String> {
    // SAFETY: valid handle and name; the caller names the right type.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("libibverbs.so.1 has no {}", name.to_string_lossy()));
    }
    // SAFETY: T is a function pointer type of the symbol.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn open() -> Result<Net, String> {
    // SAFETY: plain C calls into the verbs library with valid arguments; the
    // objects live for the whole process, like NCCL's.
    unsafe {
        let h = libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if h.is_null() {
            return Err("cannot dlopen libibverbs.so.1".into());
        }
        let get_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device =
            sym(h, c"ibv_get_device_list")?;
        let open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context =
            sym(h, c"ibv_open_device")?;
        let query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int =
            sym(h, c"ibv_query_port")?;
        let alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd =
            sym(h, c"ibv_alloc_pd")?;
        let reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr =
            sym(h, c"ibv_reg_mr")?;
        let create_cq: unsafe extern "C" fn(
            *mut ibv_context,
            c_int,
            *mut c_void,
            *mut c_void,
            c_int,
        ) -> *mut ibv_cq = sym(h, c"ibv_create_cq")?;

        let mut n = 0;
        let list = get_list(&mut n);
        if list.is_null() || n == 0 {
            return Err("no RDMA devices".into());
        }
        // One NIC per GPU: the local rank's own.
        let me = crate::comm::me();
        let local = (u32::from(me.lid) - 1) % MAX_LOCAL;
        let dev = *list.add((local as usize) % n as usize);
        let ctx = open_device(dev);
        if ctx.is_null() {
            return Err("ibv_open_device failed".into());
        }
        let mut port: ibv_port_attr = std::mem::zeroed();
        if query_port(ctx, 1, &mut port) != 0 {
            return Err("ibv_query_port failed".into());
        }
        let pd = alloc_pd(ctx);
        let cq = create_cq(ctx, 4096, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let mr = reg_mr(
            pd,
            BUFFER_BASE as *mut c_void,
            BUFFER_LEN,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        );
        if pd.is_null() || cq.is_null() || mr.is_null() {
            return Err("cannot allocate PD/CQ/MR".into());
        }
        Ok(Net {
            pd: pd as usize,
            cq: cq as usize,
            lkey: (*mr).lkey,
            lid: port.lid,
            create_qp: sym(h, c"ibv_create_qp")?,
            modify_qp: sym(h, c"ibv_modify_qp")?,
        })
    }
}

/// This process's NIC, opened on first use.
pub fn net() -> Result<&'static Net, String> {
    static NET: OnceLock<Result<Net, String>> = OnceLock::new();
    NET.get_or_init(open).as_ref().map_err(Clone::clone)
}

pub fn buffer_addr() -> u64 {
    BUFFER_BASE as u64
}

#[derive(Serialize, Deserialize)]
struct QpInfo {
    lid: u16,
    /// Member index -> our QP number toward it.
    qpns: BTreeMap<u32, u32>,
}

impl Net {
    fn create(&self) -> Result<*mut ibv_qp, String> {
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.cq as *mut ibv_cq,
            recv_cq: self.cq as *mut ibv_cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: valid PD and attributes.
        let qp = unsafe { (self.create_qp)(self.pd as *mut ibv_pd, &mut attr) };
        if qp.is_null() {
            Err("ibv_create_qp failed".into())
        } else {
            Ok(qp)
        }
    }

    /// RESET -> INIT -> RTR (peer QP number and LID) -> RTS.
    fn bring_up(&self, qp: *mut ibv_qp, dest_qp_num: u32, dlid: u16) -> Result<(), String> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            qp_access_flags: (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) as u32,
            ..Default::default()
        };
        let steps = [
            (
                IBV_QPS_INIT,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            ),
            (
                IBV_QPS_RTR,
                IBV_QP_STATE
                    | IBV_QP_AV
                    | IBV_QP_PATH_MTU
                    | IBV_QP_DEST_QPN
                    | IBV_QP_RQ_PSN
                    | IBV_QP_MAX_DEST_RD_ATOMIC
                    | IBV_QP_MIN_RNR_TIMER,
            ),
            (
                IBV_QPS_RTS,
                IBV_QP_STATE
                    | IBV_QP_TIMEOUT
                    | IBV_QP_RETRY_CNT
                    | IBV_QP_RNR_RETRY
                    | IBV_QP_SQ_PSN
                    | IBV_QP_MAX_QP_RD_ATOMIC,
            ),
        ];
        for (state, mask) in steps {
            a.qp_state = state;
            if state == IBV_QPS_RTR {
                a.path_mtu = IBV_MTU_4096;
                a.dest_qp_num = dest_qp_num;
                a.ah_attr.dlid = dlid;
                a.ah_attr.port_num = 1;
                a.max_dest_rd_atomic = 1;
                a.min_rnr_timer = 12;
            }
            if state == IBV_QPS_RTS {
                a.timeout = 20;
                a.retry_cnt = 7;
                a.rnr_retry = 7;
                a.max_rd_atomic = 1;
            }
            // SAFETY: our QP and a valid attribute struct.
            if unsafe { (self.modify_qp)(qp, &mut a, mask) } != 0 {
                return Err(format!("ibv_modify_qp to state {state} failed"));
            }
        }
        Ok(())
    }
}

/// Connects this member (`rank`) of communicator `id` to every member on
/// another host. No-op (and no verbs at all) for a single-host communicator:
/// intra-host traffic goes over NVLink.
pub fn connect(id: u64, rank: u32, members: &[Me]) -> Result<HashMap<u32, PeerQp>, String> {
    let mine = members[rank as usize];
    if members.iter().all(|m| m.host == mine.host) {
        return Ok(HashMap::new());
    }
    let net = net()?;
    let mut qps = HashMap::new();
    let mut info = QpInfo {
        lid: net.lid,
        qpns: BTreeMap::new(),
    };
    for (i, m) in members.iter().enumerate() {
        if m.host != mine.host {
            let qp = net.create()?;
            // SAFETY: a QP just created.
            let qpn = unsafe { (*qp).qp_num };
            info.qpns.insert(i as u32, qpn);
            qps.insert(i as u32, (qp as usize, qpn));
        }
    }
    let all = with_local(|c| {
        c.exchange(
            &format!("qp/{id:016x}"),
            members.len() as u32,
            rank,
            json!(info),
        )
    })
    .map_err(|e| e.to_string())?;
    let mut out = HashMap::new();
    for (i, (qp, _qpn)) in qps {
        let peer: QpInfo = serde_json::from_value(all[i as usize].clone())
            .map_err(|e| format!("bad QP exchange payload: {e}"))?;
        let dest = *peer
            .qpns
            .get(&rank)
            .ok_or_else(|| format!("member {i} has no QP toward {rank}"))?;
        net.bring_up(qp as *mut ibv_qp, dest, peer.lid)?;
        out.insert(i, PeerQp { qp });
    }
    Ok(out)
}

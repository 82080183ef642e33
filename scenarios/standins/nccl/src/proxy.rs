//! The proxy thread: the only code that touches the verbs data path. When a
//! member's GPU reaches a collective with a peer on another host, the proxy
//! posts the first chunk right away (so the first `post_send` of an instance
//! marks the GPU's arrival, as with real NCCL), then paces the remaining
//! chunks over the transfer window once every member has arrived (the
//! credits a real receiver would return), and polls the completion queue —
//! sleeping between polls instead of spinning, since this machine has two
//! cores.
//!
//! `post_send` and `poll_cq` are called exactly as the `static inline`
//! wrappers in `verbs.h` do: through `qp->context->ops`.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, Sender},
        Arc, Condvar, Mutex, OnceLock,
    },
    time::Duration,
};

use slowrank_sim::{abi::verbs::*, clock, model::Model};

/// Op ids (the `wr_id` above the chunk index).
static NEXT_OP: AtomicU64 = AtomicU64::new(1);

/// Size of one clear-to-send FIFO entry (NCCL's `ncclIbSendFifo`).
const CTS_BYTES: u32 = 64;

/// One member's network share of one collective or send, or a receiver's
/// clear-to-send.
pub struct NetOp {
    id: u64,
    qp: usize,
    cq: usize,
    lkey: u32,
    addr: u64,
    chunks: u32,
    chunk_bytes: u32,
    /// Work request opcode and flags of every post.
    opcode: std::ffi::c_int,
    send_flags: std::ffi::c_uint,
    /// (all members arrived, transfer done), monotonic ns.
    plan: Mutex<Option<(u64, u64)>>,
    st: Mutex<(u32, u32, bool)>, // posted, completed, done
    cv: Condvar,
    /// When the proxy saw the last completion (monotonic ns; 0 = not yet).
    polled_all_ns: AtomicU64,
    /// Just before the first chunk was posted (monotonic ns; 0 = not yet):
    /// ground truth for the agent's GPU-side arrival.
    first_post_ns: AtomicU64,
}

impl NetOp {
    pub fn new(qp: usize, cq: usize, lkey: u32, addr: u64, bytes: u64, model: &Model) -> Arc<Self> {
        let chunks = bytes
            .div_ceil(model.chunk_bytes.max(1))
            .clamp(1, u64::from(model.max_chunks.max(1))) as u32;
        let chunk_bytes = (bytes / u64::from(chunks)).clamp(1, u64::from(u32::MAX)) as u32;
        let wr = (IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED);
        Self::with((qp, cq, lkey, addr), chunks, chunk_bytes, wr)
    }

    fn with(
        (qp, cq, lkey, addr): (usize, usize, u32, u64),
        chunks: u32,
        chunk_bytes: u32,
        (opcode, send_flags): (std::ffi::c_int, std::ffi::c_uint),
    ) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_OP.fetch_add(1, Ordering::Relaxed),
            qp,
            cq,
            lkey,
            addr,
            chunks,
            chunk_bytes,
            opcode,
            send_flags,
            plan: Mutex::new(None),
            st: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
            polled_all_ns: AtomicU64::new(0),
            first_post_ns: AtomicU64::new(0),
        })
    }

    /// A receiver's clear-to-send: when its GPU reaches a receive from a
    /// member on another host, NCCL's proxy writes a small inline RDMA write
    /// into the sender's FIFO (`ncclIbPostFifo`) saying the buffer is ready.
    /// One post, so it marks the receiver's GPU arrival the way a sender's
    /// first chunk marks the sender's.
    pub fn clear_to_send(qp: usize, cq: usize, lkey: u32, addr: u64) -> Arc<Self> {
        let wr = (IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
        Self::with((qp, cq, lkey, addr), 1, CTS_BYTES, wr)
    }

    /// Lets the proxy post the rest of the data.
    pub fn set_plan(&self, release_ns: u64, done_ns: u64) {
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) = Some((release_ns, done_ns));
    }

    /// Blocks until every chunk was posted and its completion polled;
    /// returns when the proxy polled the last one (monotonic ns).
    pub fn wait(&self) -> u64 {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        while !st.2 {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        self.polled_all_ns.load(Ordering::Relaxed)
    }

    /// When the first chunk was posted (monotonic ns, taken just before the
    /// call; 0 = not yet).
    pub fn first_post_ns(&self) -> u64 {
        self.first_post_ns.load(Ordering::Relaxed)
    }

    fn post(&self, k: u32) -> bool {
        let mut sge = ibv_sge {
            addr: self.addr + u64::from(k) * u64::from(self.chunk_bytes),
            length: self.chunk_bytes,
            lkey: self.lkey,
        };
        let mut wr = ibv_send_wr {
            wr_id: (self.id << 16) | u64::from(k),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: self.opcode,
            send_flags: self.send_flags,
            ..Default::default()
        };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        let qp = self.qp as *mut ibv_qp;
        // SAFETY: a connected QP of ours; `ibv_post_send` inline semantics.
        unsafe {
            match (*(*qp).context).ops.post_send {
                Some(post_send) => post_send(qp, &mut wr, &mut bad) == 0,
                None => false,
            }
        }
    }

    /// Posts what is due; returns false if posting failed.
    fn advance(&self, now: u64) -> bool {
        let plan = *self.plan.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        if st.0 == 0 {
            self.first_post_ns
                .store(clock::mono_ns(), Ordering::Relaxed);
            if !self.post(0) {
                return false;
            }
            st.0 = 1;
        }
        if let Some((rel, done)) = plan {
            let span = done.saturating_sub(rel);
            while st.0 < self.chunks {
                let due = rel + span * u64::from(st.0) / u64::from(self.chunks);
                if due > now {
                    break;
                }
                if !self.post(st.0) {
                    return false;
                }
                st.0 += 1;
            }
        }
        true
    }

    fn complete_one(&self) {
        self.st.lock().unwrap_or_else(|p| p.into_inner()).1 += 1;
    }

    /// Marks the op done when all chunks completed, or on failure.
    fn finish_if_complete(&self, failed: bool) -> bool {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        if failed || (st.0 == self.chunks && st.1 >= self.chunks) {
            self.polled_all_ns
                .store(clock::mono_ns(), Ordering::Relaxed);
            st.2 = true;
            self.cv.notify_all();
            return true;
        }
        false
    }
}

fn sender() -> &'static Mutex<Sender<Arc<NetOp>>> {
    static TX: OnceLock<Mutex<Sender<Arc<NetOp>>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        let interval = Duration::from_micros(Model::from_env().poll_interval_us.max(1));
        std::thread::Builder::new()
            .name("nccl-proxy".into())
            .stack_size(512 * 1024)
            .spawn(move || run(rx, interval))
            .expect("cannot spawn the NCCL proxy thread");
        Mutex::new(tx)
    })
}

/// Posts `op`'s first chunk now and hands it to the proxy thread. A real
/// NCCL proxy spins on the GPU's progress flag, so its first post follows
/// the GPU's arrival within microseconds; this proxy sleeps between polls
/// (two cores), so the arriving stream posts the first chunk itself
/// (through the same `ops.post_send`) and the proxy does the rest.
pub fn submit(op: Arc<NetOp>) {
    // A failed post is retried, and reported, by the proxy.
    let _ = op.advance(clock::mono_ns());
    let _ = sender().lock().unwrap_or_else(|p| p.into_inner()).send(op);
}

/// Completions polled before their op reached the proxy, by op id, kept at
/// most this many ops.
const MAX_EARLY: usize = 4096;

/// Polls `cq` dry. A completion whose op is not (yet) in `active` is kept in
/// `early`: `submit` posts the first chunk before the op reaches this
/// thread, and a poll for another op on the same CQ can pop it in between —
/// dropping it would leave that op waiting forever.
fn poll(cq: usize, active: &HashMap<u64, Arc<NetOp>>, early: &mut HashMap<u64, u32>) {
    let cq = cq as *mut ibv_cq;
    let mut wcs = [ibv_wc::default(); 16];
    loop {
        // SAFETY: our CQ; `ibv_poll_cq` inline semantics.
        let n = unsafe {
            match (*(*cq).context).ops.poll_cq {
                Some(poll_cq) => poll_cq(cq, wcs.len() as i32, wcs.as_mut_ptr()),
                None => 0,
            }
        };
        for wc in &wcs[..n.max(0) as usize] {
            let id = wc.wr_id >> 16;
            match active.get(&id) {
                Some(op) => op.complete_one(),
                None if early.len() < MAX_EARLY || early.contains_key(&id) => {
                    *early.entry(id).or_default() += 1;
                }
                None => eprintln!("[slowrank libnccl] completion for unknown op {id} dropped"),
            }
        }
        if n < wcs.len() as i32 {
            break;
        }
    }
}

/// Takes `op` on, crediting completions polled before it arrived.
fn adopt(op: Arc<NetOp>, active: &mut HashMap<u64, Arc<NetOp>>, early: &mut HashMap<u64, u32>) {
    for _ in 0..early.remove(&op.id).unwrap_or(0) {
        op.complete_one();
    }
    active.insert(op.id, op);
}

fn run(rx: Receiver<Arc<NetOp>>, interval: Duration) {
    clock::precise_sleeps();
    let mut active: HashMap<u64, Arc<NetOp>> = HashMap::new();
    let mut early: HashMap<u64, u32> = HashMap::new();
    loop {
        if active.is_empty() {
            match rx.recv() {
                Ok(op) => adopt(op, &mut active, &mut early),
                Err(_) => return,
            }
        }
        while let Ok(op) = rx.try_recv() {
            adopt(op, &mut active, &mut early);
        }
        let now = clock::mono_ns();
        let mut failed = Vec::new();
        let mut cqs: Vec<usize> = Vec::new();
        for op in active.values() {
            if !op.advance(now) {
                failed.push(op.id);
            }
            if !cqs.contains(&op.cq) {
                cqs.push(op.cq);
            }
        }
        for cq in cqs {
            poll(cq, &active, &mut early);
        }
        active.retain(|id, op| !op.finish_if_complete(failed.contains(id)));
        if !active.is_empty() {
            std::thread::sleep(interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race behind a 3-D run that hung forever: the stream posts chunk 0,
    /// the proxy (polling the shared CQ for another op) pops its completion
    /// before the op reached it. The completion must count once it does.
    #[test]
    fn completions_polled_before_the_op_arrived_are_credited() {
        let model = Model::default();
        let op = NetOp::new(0, 0, 0, 0, 1, &model);
        assert_eq!(op.chunks, 1);
        op.st.lock().unwrap().0 = 1; // chunk 0 posted by the stream
        let mut early: HashMap<u64, u32> = HashMap::new();
        *early.entry(op.id).or_default() += 1; // polled by the proxy
        let mut active = HashMap::new();
        adopt(op.clone(), &mut active, &mut early);
        assert!(early.is_empty());
        assert!(
            op.finish_if_complete(false),
            "the early completion was lost"
        );
    }
}

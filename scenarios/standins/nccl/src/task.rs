//! Collective work as it runs on the simulated GPU. A [`Task`] is one host
//! function on a CUDA stream holding one operation, or every operation of a
//! `ncclGroupStart/End` issued on that stream.

use std::{
    ffi::c_void,
    sync::{Arc, OnceLock},
};

use serde::{Deserialize, Serialize};
use serde_json::json;
use slowrank_sim::{
    abi::nccl::{NcclResult, NCCL_SUCCESS, NCCL_UNHANDLED_CUDA_ERROR},
    clock,
    control::Control,
    cost::{self, Kind, Member, NetState},
    hub::{client::with_local, ExchangeReq},
    model::Model,
    rng,
};

use crate::{
    comm::Comm,
    cuda, net,
    proxy::{self, NetOp},
    trace,
};

pub fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(Model::from_env)
}

pub enum PartKind {
    Coll(Kind),
    Send { peer: u32 },
    Recv { peer: u32 },
}

/// One operation of one communicator.
pub struct Part {
    pub comm: Arc<Comm>,
    pub kind: PartKind,
    /// Bytes the collective moves (see `cost::collective_ns`) or sends.
    pub bytes: u64,
    /// Names the instance across members (hub exchange key).
    key: String,
    noise: u64,
    /// When the host thread issued the call (monotonic ns).
    host_ns: u64,
}

impl Part {
    /// A collective; takes the communicator's next sequence number.
    pub fn collective(comm: Arc<Comm>, kind: Kind, bytes: u64) -> Part {
        let seq = comm.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Part {
            key: format!("c/{:016x}/{seq}", comm.id),
            noise: rng::hash(&[comm.id, seq]),
            host_ns: clock::mono_ns(),
            comm,
            kind: PartKind::Coll(kind),
            bytes,
        }
    }

    /// A send to, or receive from, member `peer`.
    pub fn p2p(comm: Arc<Comm>, send: bool, peer: u32, bytes: u64) -> Part {
        let (from, to) = if send {
            (comm.rank, peer)
        } else {
            (peer, comm.rank)
        };
        let k = comm.next_p2p(from, to);
        Part {
            key: format!("p/{:016x}/{from}-{to}/{k}", comm.id),
            noise: rng::hash(&[comm.id, u64::from(from), u64::from(to), k]),
            host_ns: clock::mono_ns(),
            kind: if send {
                PartKind::Send { peer }
            } else {
                PartKind::Recv { peer }
            },
            comm,
            bytes,
        }
    }

    /// (hub exchange size, our index in it).
    fn slot(&self) -> (u32, u32) {
        match self.kind {
            PartKind::Coll(_) => (self.comm.nranks(), self.comm.rank),
            PartKind::Send { .. } => (2, 0),
            PartKind::Recv { .. } => (2, 1),
        }
    }

    /// The member this one sends to over the network, and how many bytes.
    fn net_target(&self) -> Option<(u32, u64)> {
        let c = &self.comm;
        match self.kind {
            PartKind::Coll(kind) => {
                let hosts = c.hosts();
                let peer = cost::ring_send_peer(&hosts, c.rank as usize)? as u32;
                let v = cost::send_volume(kind, self.bytes, hosts.len(), cost::channels(&hosts));
                Some((peer, v))
            }
            PartKind::Send { peer } => c.qps.contains_key(&peer).then_some((peer, self.bytes)),
            PartKind::Recv { .. } => None,
        }
    }

    /// The proxy's first network work when the GPU gets here: data to the
    /// ring or p2p peer, or a receiver's clear-to-send to its sender.
    fn net_op(&self, net: &net::Net) -> Option<Arc<NetOp>> {
        let c = &self.comm;
        if let PartKind::Recv { peer } = self.kind {
            let qp = c.qps.get(&peer)?;
            return Some(NetOp::clear_to_send(
                qp.qp,
                net.cq,
                net.lkey,
                net::buffer_addr(),
            ));
        }
        let (peer, bytes) = self.net_target()?;
        let qp = c.qps.get(&peer)?;
        Some(NetOp::new(
            qp.qp,
            net.cq,
            net.lkey,
            net::buffer_addr(),
            bytes,
            model(),
        ))
    }

    fn members(&self, arrivals: &[Arrival]) -> Vec<Member> {
        let c = &self.comm;
        let idx: Vec<u32> = match self.kind {
            PartKind::Coll(_) => (0..c.nranks()).collect(),
            PartKind::Send { peer } => vec![c.rank, peer],
            PartKind::Recv { peer } => vec![peer, c.rank],
        };
        idx.iter()
            .zip(arrivals)
            .map(|(&i, a)| {
                let m = c.members[i as usize];
                Member {
                    host: m.host,
                    lid: m.lid,
                    net: a.net.clone(),
                }
            })
            .collect()
    }

    fn transfer_ns(&self, arrivals: &[Arrival]) -> u64 {
        let members = self.members(arrivals);
        match self.kind {
            PartKind::Coll(kind) => {
                cost::collective_ns(model(), kind, self.bytes, &members, self.noise)
            }
            _ => cost::p2p_ns(model(), self.bytes, &members[0], &members[1], self.noise),
        }
    }
}

/// What a member says when its GPU reaches the operation.
#[derive(Serialize, Deserialize)]
struct Arrival {
    /// Monotonic ns.
    t: u64,
    net: NetState,
}

pub struct Task {
    pub parts: Vec<Part>,
}

/// Puts `parts` on `stream` as one unit of GPU work.
pub fn enqueue(stream: *mut c_void, parts: Vec<Part>) -> NcclResult {
    if parts.is_empty() {
        return NCCL_SUCCESS;
    }
    let Some(launch) = cuda::launch_host_func() else {
        return NCCL_UNHANDLED_CUDA_ERROR;
    };
    let task = Box::into_raw(Box::new(Task { parts }));
    // SAFETY: run_task takes back ownership of `task` when the stream runs it.
    let rc = unsafe { launch(stream, run_task, task.cast()) };
    if rc != 0 {
        // SAFETY: not enqueued, still ours.
        drop(unsafe { Box::from_raw(task) });
        return NCCL_UNHANDLED_CUDA_ERROR;
    }
    NCCL_SUCCESS
}

unsafe extern "C" fn run_task(data: *mut c_void) {
    // SAFETY: created by `enqueue` and run exactly once.
    let task = unsafe { Box::from_raw(data.cast::<Task>()) };
    task.run();
}

impl Task {
    fn run(&self) {
        let arrive = clock::mono_ns();
        let ctl = Control::current();
        // The GPU is here: the proxy's first post goes out now.
        let netops: Vec<Option<Arc<NetOp>>> = self
            .parts
            .iter()
            .map(|p| {
                let op = p.net_op(net::net().ok()?)?;
                proxy::submit(op.clone());
                Some(op)
            })
            .collect();
        let reqs: Vec<ExchangeReq> = self
            .parts
            .iter()
            .map(|p| {
                let me = p.comm.rank as usize;
                let lids = p
                    .comm
                    .members
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != me)
                    .map(|(_, m)| m.lid);
                let (n, idx) = p.slot();
                ExchangeReq {
                    key: p.key.clone(),
                    n,
                    idx,
                    payload: json!(Arrival {
                        t: arrive,
                        net: NetState::read(ctl, lids),
                    }),
                }
            })
            .collect();
        let results = match with_local(|c| c.exchange_many(&reqs)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("[slowrank libnccl] rendezvous failed: {e}");
                return;
            }
        };
        let mut end = arrive;
        let mut traced = Vec::with_capacity(self.parts.len());
        for ((part, payloads), netop) in self.parts.iter().zip(results).zip(&netops) {
            let arrivals: Vec<Arrival> = payloads
                .into_iter()
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect();
            let release = arrivals.iter().map(|a| a.t).max().unwrap_or(arrive);
            let done = release + part.transfer_ns(&arrivals);
            if let Some(op) = netop {
                op.set_plan(release, done);
            }
            end = end.max(done);
            let posted = netop.as_ref().map_or(0, |op| op.first_post_ns());
            traced.push((&part.key, part.host_ns, release, done, posted));
        }
        // The stream can move on once the modelled transfer ended and the
        // proxy polled every completion (later than `done` when it was slow
        // to post or poll); the executor's own wake-up delay is not counted.
        let mut finished = end;
        for op in netops.iter().flatten() {
            finished = finished.max(op.wait());
        }
        clock::sleep_until(end);
        for (key, host_ns, release, done, posted) in traced {
            trace::collective(key, host_ns, arrive, release, done, finished, posted);
        }
    }
}

//! Communicators: bootstrap (all-gather of member identities through the
//! hub), splits, and per-communicator counters that name collective
//! instances.

use std::{
    collections::HashMap,
    sync::{atomic::AtomicU64, Mutex, OnceLock},
};

use serde::{Deserialize, Serialize};
use serde_json::json;
use slowrank_sim::{
    control::lid_of,
    env,
    hub::{client::with_local, HubError},
    rng,
};

use crate::net::{self, PeerQp};

/// Who this process is in the simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Me {
    pub global: u32,
    pub host: u32,
    pub lid: u16,
}

pub fn me() -> Me {
    static ME: OnceLock<Me> = OnceLock::new();
    *ME.get_or_init(|| {
        let global = env::u32_var(env::RANK)
            .or_else(|| env::u32_var("RANK"))
            .unwrap_or(std::process::id());
        let host = env::u32_var(env::HOST)
            .or_else(|| env::u32_var("GROUP_RANK"))
            .unwrap_or(0);
        let local = env::u32_var(env::LOCAL)
            .or_else(|| env::u32_var("LOCAL_RANK"))
            .unwrap_or(0);
        Me {
            global,
            host,
            lid: lid_of(host, local),
        }
    })
}

/// One communicator as this member sees it.
pub struct Comm {
    pub id: u64,
    pub rank: u32,
    pub members: Vec<Me>,
    /// Next collective sequence number (issue order on the host).
    pub seq: AtomicU64,
    /// Sends/receives issued per (sender, receiver) pair.
    pub p2p: Mutex<HashMap<(u32, u32), u64>>,
    /// Splits of this communicator so far.
    pub splits: AtomicU64,
    /// Queue pairs to members on other hosts, by member index.
    pub qps: HashMap<u32, PeerQp>,
}

impl Comm {
    pub fn nranks(&self) -> u32 {
        self.members.len() as u32
    }

    pub fn hosts(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.host).collect()
    }

    /// Next sequence number of the point-to-point stream `from -> to`.
    pub fn next_p2p(&self, from: u32, to: u32) -> u64 {
        let mut m = self.p2p.lock().unwrap_or_else(|p| p.into_inner());
        let c = m.entry((from, to)).or_insert(0);
        *c += 1;
        *c - 1
    }
}

/// Why a communicator could not be made.
#[derive(Debug)]
pub enum CommError {
    Hub(HubError),
    Net(String),
    Bad(String),
}

impl From<HubError> for CommError {
    fn from(e: HubError) -> Self {
        Self::Hub(e)
    }
}

impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hub(e) => write!(f, "bootstrap: {e}"),
            Self::Net(e) => write!(f, "network setup: {e}"),
            Self::Bad(e) => write!(f, "{e}"),
        }
    }
}

fn parse<T: for<'de> Deserialize<'de>>(v: serde_json::Value) -> Result<T, CommError> {
    serde_json::from_value(v).map_err(|e| CommError::Bad(format!("bad bootstrap payload: {e}")))
}

fn finish(id: u64, rank: u32, members: Vec<Me>) -> Result<Comm, CommError> {
    let qps = net::connect(id, rank, &members).map_err(CommError::Net)?;
    Ok(Comm {
        id,
        rank,
        members,
        seq: AtomicU64::new(0),
        p2p: Mutex::new(HashMap::new()),
        splits: AtomicU64::new(0),
        qps,
    })
}

/// `ncclCommInitRank`: every member joins the bootstrap exchange of the
/// unique id and learns the others.
pub fn init(unique_id: &[u8], nranks: u32, rank: u32) -> Result<Comm, CommError> {
    let id = rng::fnv1a(unique_id);
    let payloads =
        with_local(|c| c.exchange(&format!("init/{id:016x}"), nranks, rank, json!(me())))?;
    let members = payloads
        .into_iter()
        .map(parse::<Me>)
        .collect::<Result<Vec<_>, _>>()?;
    finish(id, rank, members)
}

#[derive(Serialize, Deserialize)]
struct SplitReq {
    color: i32,
    key: i32,
}

/// `ncclCommSplit`: collective over the parent; `None` for `NCCL_SPLIT_NOCOLOR`.
/// The child's id is a hash of (parent id, split number, color).
pub fn split(parent: &Comm, color: i32, key: i32) -> Result<Option<Comm>, CommError> {
    let k = parent
        .splits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let payloads = with_local(|c| {
        c.exchange(
            &format!("split/{:016x}/{k}", parent.id),
            parent.nranks(),
            parent.rank,
            json!(SplitReq { color, key }),
        )
    })?;
    let reqs = payloads
        .into_iter()
        .map(parse::<SplitReq>)
        .collect::<Result<Vec<_>, _>>()?;
    if color < 0 {
        return Ok(None);
    }
    let mut group: Vec<(i32, u32)> = reqs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.color == color)
        .map(|(i, r)| (r.key, i as u32))
        .collect();
    group.sort_unstable();
    let rank = group
        .iter()
        .position(|g| g.1 == parent.rank)
        .ok_or_else(|| CommError::Bad("split lost this member".into()))? as u32;
    let members = group.iter().map(|g| parent.members[g.1 as usize]).collect();
    let id = rng::hash(&[parent.id, k, color as u64]);
    finish(id, rank, members).map(Some)
}

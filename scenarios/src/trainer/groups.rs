//! Process groups as PyTorch / Megatron make them: a world communicator from
//! `ncclCommInitRank` (unique id handed out through the store, like
//! TCPStore), tensor- and pipeline-parallel communicators split from it with
//! `ncclCommSplit`, data-parallel communicators from their own
//! `ncclCommInitRank`. Each group has its own NCCL stream.
//!
//! Creation order (every rank): world init; TP split (if tp > 1); PP split
//! (if pp > 1); DP init (if 1 < dp < world; DP is the world itself when the
//! job is data-parallel only).

use slowrank_sim::{abi::nccl::NcclUniqueId, hub::HubClient};

use super::{
    cuda::{Cuda, Stream},
    nccl::{Comm, Nccl},
    TrainerError,
};
use crate::layout::Layout;

/// One process group.
pub struct Pg {
    pub comm: Comm,
    pub stream: Stream,
    /// Global ranks, in communicator order.
    pub members: Vec<u32>,
    /// This rank's index in `members`.
    pub index: u32,
}

impl Pg {
    fn new(comm: Comm, stream: Stream, members: Vec<u32>, rank: u32) -> Self {
        let index = members.iter().position(|m| *m == rank).unwrap_or(0) as u32;
        Self {
            comm,
            stream,
            members,
            index,
        }
    }
}

pub struct Groups {
    pub world: Pg,
    pub tp: Option<Pg>,
    pub pp: Option<Pg>,
    /// `None` when dp == 1; the world communicator when dp == world size.
    pub dp: Option<Pg>,
}

impl Groups {
    /// Destroys every communicator (the DP one only if it is not the world).
    pub fn destroy(&self, nccl: &Nccl) -> Result<(), TrainerError> {
        let mut comms: Vec<Comm> = [&self.tp, &self.pp, &self.dp]
            .into_iter()
            .flatten()
            .map(|g| g.comm)
            .filter(|c| *c != self.world.comm)
            .collect();
        comms.push(self.world.comm);
        comms.into_iter().try_for_each(|c| nccl.destroy(c))
    }
}

fn hex(id: &NcclUniqueId) -> String {
    id.internal.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<NcclUniqueId, TrainerError> {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).unwrap_or(""), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| TrainerError::Env("bad ncclUniqueId in the store".into()))?;
    let internal = bytes
        .try_into()
        .map_err(|_| TrainerError::Env("ncclUniqueId in the store has the wrong length".into()))?;
    Ok(NcclUniqueId { internal })
}

/// The unique id of `key`: made by `leader`, fetched by everyone else.
fn shared_id(
    store: &mut HubClient,
    nccl: &Nccl,
    key: &str,
    leader: bool,
) -> Result<NcclUniqueId, TrainerError> {
    if leader {
        let id = nccl.unique_id()?;
        store.set(key, &hex(&id))?;
        Ok(id)
    } else {
        unhex(&store.get(key)?)
    }
}

pub fn create(
    cuda: &Cuda,
    nccl: &Nccl,
    store: &mut HubClient,
    layout: &Layout,
    rank: u32,
) -> Result<Groups, TrainerError> {
    let world_members: Vec<u32> = (0..layout.world()).collect();
    let id = shared_id(store, nccl, "nccl-id/world", rank == 0)?;
    let world_comm = nccl.init_rank(layout.world(), id, rank)?;
    let world = Pg::new(world_comm, cuda.stream()?, world_members, rank);

    let tp = if layout.tp > 1 {
        let (color, members) = layout.tp_group(rank);
        Some(Pg::new(
            nccl.split(world.comm, color, rank)?,
            cuda.stream()?,
            members,
            rank,
        ))
    } else {
        None
    };
    let pp = if layout.pp > 1 {
        let (color, members) = layout.pp_group(rank);
        Some(Pg::new(
            nccl.split(world.comm, color, rank)?,
            cuda.stream()?,
            members,
            rank,
        ))
    } else {
        None
    };
    let dp = if layout.dp == layout.world() && layout.dp > 1 {
        Some(Pg::new(
            world.comm,
            world.stream,
            world.members.clone(),
            rank,
        ))
    } else if layout.dp > 1 {
        let (g, members) = layout.dp_group(rank);
        let index = members.iter().position(|m| *m == rank).unwrap_or(0) as u32;
        let id = shared_id(store, nccl, &format!("nccl-id/dp/{g}"), index == 0)?;
        let comm = nccl.init_rank(layout.dp, id, index)?;
        Some(Pg::new(comm, cuda.stream()?, members, rank))
    } else {
        None
    };
    Ok(Groups { world, tp, pp, dp })
}

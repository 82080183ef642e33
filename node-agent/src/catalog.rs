//! Which functions of which library are probed, how, and what each probe
//! means to the fold. Argument positions follow the x86-64 SysV ABI: the
//! 128-byte by-value `ncclUniqueId` goes to memory (the stack) and does not
//! use a register, so `rank` in `ncclCommInitRank` arrives in `rdx`
//! (args[2]); 7th/8th integer arguments are stack words 0/1.

use slowrank_shared::{probe::cuda_count, wire::CollOp};

use crate::{discover::LibKind, probes::Attach};

/// What a probe id stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `ncclCommInitRank[Config](comm*, nranks, id (stack), rank, …)`.
    CommInit,
    /// `ncclCommSplit(parent, color, key, newcomm*, config)`.
    CommSplit,
    /// `ncclCommDestroy/Abort(comm)`.
    CommDestroy,
    /// A collective or send/recv; where its arguments are.
    Coll {
        op: CollOp,
        args: CollArgs,
    },
    GroupStart,
    GroupEnd,
    /// `cuda{Stream,Event}Synchronize`.
    Sync,
    /// `cudaDeviceSynchronize`: like `Sync`, and every stream is drained at
    /// its return (an anchor for [`crate::gpuside`]).
    DeviceSync,
    /// Counted in-kernel only.
    Count,
    /// A user-given `--probe FILE:SYMBOL`.
    Generic,
    /// `ibv_open_device(device)`: returns the context whose ops table holds
    /// the provider's post_send/poll_cq.
    VerbsOpen,
    /// `ibv_modify_qp(qp, attr, mask)`: a QP's peer (dest QPN, DLID).
    ModifyQp,
    /// The provider's post_send / poll_cq (deep set, attached by offset).
    PostSend,
    PollCq,
}

/// Where a collective's count, datatype, comm, stream and peer/root are.
/// `Reg(i)` is register argument i, `Stack(i)` stack word i.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollArgs {
    pub count: Loc,
    pub dtype: Loc,
    pub comm: Loc,
    pub stream: Loc,
    /// Peer for send/recv.
    pub peer: Option<Loc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    Reg(u8),
    Stack(u8),
}

/// One function to probe.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSpec {
    pub symbol: &'static str,
    pub role: Role,
    pub how: Attach,
}

const fn coll(
    op: CollOp,
    count: Loc,
    dtype: Loc,
    comm: Loc,
    stream: Loc,
    peer: Option<Loc>,
) -> Role {
    Role::Coll {
        op,
        args: CollArgs {
            count,
            dtype,
            comm,
            stream,
            peer,
        },
    }
}

use Loc::{Reg, Stack};

const NCCL: &[ProbeSpec] = &[
    ProbeSpec {
        symbol: "ncclCommInitRank",
        role: Role::CommInit,
        how: Attach::CallOut {
            out_arg: 0,
            stack: true,
        },
    },
    ProbeSpec {
        symbol: "ncclCommInitRankConfig",
        role: Role::CommInit,
        how: Attach::CallOut {
            out_arg: 0,
            stack: true,
        },
    },
    ProbeSpec {
        symbol: "ncclCommSplit",
        role: Role::CommSplit,
        how: Attach::CallOut {
            out_arg: 3,
            stack: false,
        },
    },
    ProbeSpec {
        symbol: "ncclCommDestroy",
        role: Role::CommDestroy,
        how: Attach::Call,
    },
    ProbeSpec {
        symbol: "ncclCommAbort",
        role: Role::CommDestroy,
        how: Attach::Call,
    },
    // (send, recv, count, dtype, op, comm, stream)
    ProbeSpec {
        symbol: "ncclAllReduce",
        role: coll(CollOp::AllReduce, Reg(2), Reg(3), Reg(5), Stack(0), None),
        how: Attach::StackCall,
    },
    // (send, recv, sendcount, dtype, comm, stream)
    ProbeSpec {
        symbol: "ncclAllGather",
        role: coll(CollOp::AllGather, Reg(2), Reg(3), Reg(4), Reg(5), None),
        how: Attach::StackCall,
    },
    // (send, recv, recvcount, dtype, op, comm, stream)
    ProbeSpec {
        symbol: "ncclReduceScatter",
        role: coll(
            CollOp::ReduceScatter,
            Reg(2),
            Reg(3),
            Reg(5),
            Stack(0),
            None,
        ),
        how: Attach::StackCall,
    },
    // (send, recv, count, dtype, root, comm, stream)
    ProbeSpec {
        symbol: "ncclBroadcast",
        role: coll(
            CollOp::Broadcast,
            Reg(2),
            Reg(3),
            Reg(5),
            Stack(0),
            Some(Reg(4)),
        ),
        how: Attach::StackCall,
    },
    // (send, recv, count, dtype, op, root, comm, stream)
    ProbeSpec {
        symbol: "ncclReduce",
        role: coll(
            CollOp::Reduce,
            Reg(2),
            Reg(3),
            Stack(0),
            Stack(1),
            Some(Reg(5)),
        ),
        how: Attach::StackCall,
    },
    // (send, recv, count, dtype, comm, stream)
    ProbeSpec {
        symbol: "ncclAlltoAll",
        role: coll(CollOp::AllToAll, Reg(2), Reg(3), Reg(4), Reg(5), None),
        how: Attach::StackCall,
    },
    // (buf, count, dtype, peer, comm, stream)
    ProbeSpec {
        symbol: "ncclSend",
        role: coll(CollOp::Send, Reg(1), Reg(2), Reg(4), Reg(5), Some(Reg(3))),
        how: Attach::StackCall,
    },
    ProbeSpec {
        symbol: "ncclRecv",
        role: coll(CollOp::Recv, Reg(1), Reg(2), Reg(4), Reg(5), Some(Reg(3))),
        how: Attach::StackCall,
    },
    ProbeSpec {
        symbol: "ncclGroupStart",
        role: Role::GroupStart,
        how: Attach::Call,
    },
    ProbeSpec {
        symbol: "ncclGroupEnd",
        role: Role::GroupEnd,
        how: Attach::Call,
    },
];

const fn count(symbol: &'static str, class: u32) -> ProbeSpec {
    ProbeSpec {
        symbol,
        role: Role::Count,
        how: Attach::Count { class },
    }
}

const fn sync(symbol: &'static str) -> ProbeSpec {
    ProbeSpec {
        symbol,
        role: Role::Sync,
        how: Attach::Call,
    }
}

const CUDART: &[ProbeSpec] = &[
    count("cudaLaunchKernel", cuda_count::LAUNCH),
    count("cudaLaunchKernel_ptsz", cuda_count::LAUNCH),
    count("cudaLaunchKernelExC", cuda_count::LAUNCH),
    count("cudaLaunchKernelExC_ptsz", cuda_count::LAUNCH),
    count("cudaLaunchCooperativeKernel", cuda_count::LAUNCH),
    count("cudaGraphLaunch", cuda_count::GRAPH_LAUNCH),
    count("cudaGraphLaunch_ptsz", cuda_count::GRAPH_LAUNCH),
    count("cudaMemcpy", cuda_count::MEMCPY),
    count("cudaMemcpyAsync", cuda_count::MEMCPY),
    count("cudaMemcpyAsync_ptsz", cuda_count::MEMCPY),
    count("cudaMalloc", cuda_count::MALLOC),
    count("cudaFree", cuda_count::FREE),
    sync("cudaStreamSynchronize"),
    sync("cudaStreamSynchronize_ptsz"),
    sync("cudaEventSynchronize"),
    ProbeSpec {
        symbol: "cudaDeviceSynchronize",
        role: Role::DeviceSync,
        how: Attach::Call,
    },
];

/// Rare verbs calls, always on: they tell the agent where the provider's
/// data-path functions are and which QP talks to which peer. The data path
/// itself (post_send/poll_cq) is the deep set, attached by offset.
const VERBS: &[ProbeSpec] = &[
    ProbeSpec {
        symbol: "ibv_open_device",
        role: Role::VerbsOpen,
        how: Attach::Call,
    },
    ProbeSpec {
        symbol: "ibv_modify_qp",
        role: Role::ModifyQp,
        how: Attach::VerbsModifyQp,
    },
];

/// The default probe set of a library.
pub fn default_set(kind: LibKind) -> &'static [ProbeSpec] {
    match kind {
        LibKind::Nccl => NCCL,
        LibKind::Cudart => CUDART,
        LibKind::Verbs => VERBS,
        LibKind::Provider => &[],
    }
}

/// Byte offsets in `struct ibv_context` (rdma-core, x86-64) of the ops
/// table's `poll_cq` and `post_send` pointers: `device` (8) + 11 and 25
/// pointers into `struct ibv_context_ops`.
pub const CTX_POLL_CQ_OFF: u64 = 8 + 11 * 8;
pub const CTX_POST_SEND_OFF: u64 = 8 + 25 * 8;

/// Bytes of one element of an `ncclDataType_t`; `None` for an unknown type.
pub fn dtype_size(dtype: u64) -> Option<u64> {
    Some(match dtype {
        0 | 1 => 1,   // int8, uint8
        2 | 3 => 4,   // int32, uint32
        4 | 5 => 8,   // int64, uint64
        6 => 2,       // float16
        7 => 4,       // float32
        8 => 8,       // float64
        9 => 2,       // bfloat16
        10 | 11 => 1, // fp8 e4m3 / e5m2
        _ => return None,
    })
}

/// Names of the symbols a library exports (dynamic symbol table), for
/// skipping absent functions quietly and for `doctor`.
pub fn exported(path: &std::path::Path) -> std::io::Result<Vec<String>> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path)?;
    let file = object::File::parse(&*data)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok(file
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| {
            s.name()
                .ok()
                .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_sizes() {
        assert_eq!(dtype_size(9), Some(2));
        assert_eq!(dtype_size(7), Some(4));
        assert_eq!(dtype_size(99), None);
    }
}

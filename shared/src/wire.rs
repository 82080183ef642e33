//! The agent → coordinator wire format.
//!
//! Every message is a 12-byte header followed by an rkyv archive:
//!
//! ```text
//! offset 0  magic   b"SLRK"
//!        4  u16 LE  schema version (SCHEMA_VERSION)
//!        6  u8      message kind (MessageKind)
//!        7  u8      reserved, 0
//!        8  u32 LE  archive length in bytes
//!       12  ...     rkyv archive
//! ```
//!
//! [`decode`] checks the header, caps the size *before* touching the archive,
//! copies it to an aligned buffer and validates it with bytecheck, so a
//! truncated, oversized, wrong-version or garbage message is an error with a
//! reason, never a panic or an out-of-bounds read.

use rkyv::{
    api::high::{HighSerializer, HighValidator},
    bytecheck::CheckBytes,
    de::Pool,
    rancor::{self, Strategy},
    ser::allocator::ArenaHandle,
    util::AlignedVec,
    Archive, Deserialize, Serialize,
};

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"SLRK";
/// Bumped on any incompatible change of the types below (8: a
/// communicator taken over by a restarted agent, [`CommRecord::resumed`];
/// 9: the verbs data path's share of a rank's probe cost,
/// [`RankInterval::datapath_cost_ns`]).
pub const SCHEMA_VERSION: u16 = 9;
/// A per-host agent certificate (`slowrank certs --hosts`) carries its
/// host as a URI SAN with this prefix: the coordinator binds the agent to
/// that host, and the agent takes its host name from it.
pub const CERT_HOST_URI_PREFIX: &str = "urn:slowrank:host:";

/// The host a certificate's URI SANs bind it to ([`CERT_HOST_URI_PREFIX`]):
/// `Ok(None)` for none (a job-wide certificate), `Err` with every host for
/// a certificate naming several, which binds it to none of them. The one
/// reading both the coordinator (who an agent is) and the agent (who it
/// says it is) use, so the two cannot disagree.
pub fn cert_host_of<'a>(
    uris: impl Iterator<Item = &'a str>,
) -> Result<Option<String>, Vec<String>> {
    let mut hosts: Vec<String> = uris
        .filter_map(|u| u.strip_prefix(CERT_HOST_URI_PREFIX))
        .map(str::to_owned)
        .collect();
    hosts.sort();
    hosts.dedup();
    match hosts.len() {
        0 => Ok(None),
        1 => Ok(hosts.pop()),
        _ => Err(hosts),
    }
}
/// Bytes before the archive.
pub const HEADER_LEN: usize = 12;
/// Largest archive accepted; anything bigger is rejected unread.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// The coordinator's one-byte answer on a batch stream once the batch was
/// ingested (accounted for in its state and log): the agent may drop it.
pub const BATCH_INGESTED: u8 = 0;
/// The answer for a batch that will never be ingested (malformed, too
/// large, another agent's): resending it would not help.
pub const BATCH_REJECTED: u8 = 1;

/// Why a message was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("message is {0} bytes, shorter than the {HEADER_LEN}-byte header")]
    Truncated(usize),
    #[error("bad magic {0:02x?}: not a slowrank message")]
    BadMagic([u8; 4]),
    #[error("schema version {got} is not supported (this build speaks {SCHEMA_VERSION})")]
    Version { got: u16 },
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("expected a {expected:?} message, got {got:?}")]
    WrongKind {
        expected: MessageKind,
        got: MessageKind,
    },
    #[error("archive of {0} bytes exceeds the {MAX_MESSAGE_BYTES}-byte cap")]
    TooLarge(usize),
    #[error("header says {declared} archive bytes but {actual} follow")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("archive failed validation: {0}")]
    Invalid(String),
    #[error("cannot serialize: {0}")]
    Serialize(String),
}

impl WireError {
    /// A short, stable name for counting rejections by reason.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Truncated(_) => "truncated",
            Self::BadMagic(_) => "bad_magic",
            Self::Version { .. } => "wrong_version",
            Self::UnknownKind(_) => "unknown_kind",
            Self::WrongKind { .. } => "wrong_kind",
            Self::TooLarge(_) => "oversized",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::Invalid(_) => "invalid_archive",
            Self::Serialize(_) => "serialize",
        }
    }
}

/// What a message carries; stored in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageKind {
    Hello = 1,
    HelloReply = 2,
    Batch = 3,
    ClockProbe = 4,
    ClockReply = 5,
    Control = 6,
    ClockPort = 7,
}

impl MessageKind {
    fn from_raw(raw: u8) -> Result<Self, WireError> {
        match raw {
            1 => Ok(Self::Hello),
            2 => Ok(Self::HelloReply),
            3 => Ok(Self::Batch),
            4 => Ok(Self::ClockProbe),
            5 => Ok(Self::ClockReply),
            6 => Ok(Self::Control),
            7 => Ok(Self::ClockPort),
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

/// A type that travels as one message.
pub trait Message {
    const KIND: MessageKind;
}

/// First message on a connection: who the agent is and its credential.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Hello {
    /// Shared job token; compared in constant time by the coordinator.
    pub token: String,
    /// Host name the agent reports (e.g. `node-5`).
    pub host: String,
    /// Unique per agent process, so a restarted agent is told apart.
    pub agent_id: String,
    /// Agent's monotonic and wall clocks when it said hello (ns).
    pub mono_ns: u64,
    pub wall_ns: u64,
}
impl Message for Hello {
    const KIND: MessageKind = MessageKind::Hello;
}

/// The coordinator's answer to [`Hello`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HelloReply {
    pub accepted: bool,
    /// Why the agent was refused; empty when accepted.
    pub reason: String,
    /// Non-zero when the refusal should clear by itself: another connection
    /// holds this agent's host or id, and a dead one (a killed agent's) is
    /// closed within the coordinator's silence timeout. Try again after this
    /// many milliseconds rather than backing off: a restarted agent that
    /// backed off to 5 s connected only after its job had ended.
    pub retry_after_ms: u32,
}
impl Message for HelloReply {
    const KIND: MessageKind = MessageKind::HelloReply;
}

/// What one probe id (the attach cookie) stands for.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ProbeDesc {
    pub id: u32,
    /// Exact file the probe is attached in (from `/proc/PID/maps` or the CLI).
    pub path: String,
    pub symbol: String,
}

/// One call boundary seen by a probe, on the agent host's monotonic clock.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CallRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub probe: u32,
    /// True for a return, false for an entry.
    pub is_return: bool,
    pub args: [u64; crate::probe::MAX_ARGS],
    pub ret: u64,
}

/// Who a rank process is, read from its environment (torchrun, Slurm or
/// Open MPI variables).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RankIdentity {
    pub pid: u32,
    /// Global rank (`RANK`, `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`).
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    /// Node index (`GROUP_RANK`), `u32::MAX` when unknown.
    pub group_rank: u32,
    /// `TORCHELASTIC_RESTART_COUNT`: an elastic restart brings new PIDs.
    pub restart_count: u32,
    /// `TORCHELASTIC_RUN_ID` / `SLURM_JOB_ID`; empty when unknown.
    pub job_id: String,
    /// Agent monotonic ns when the agent started following it.
    pub seen_ns: u64,
}

/// A rank process that ended.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RankExit {
    pub pid: u32,
    pub rank: u32,
    pub exit_ns: u64,
}

/// NCCL collective and point-to-point operations.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[rkyv(derive(Debug, PartialEq))]
#[repr(u8)]
pub enum CollOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Send,
    Recv,
}

/// A communicator as one member created it. `comm_id` is the same on every
/// member: a hash of the `ncclUniqueId`, or of (parent id, color) for a split.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CommRecord {
    pub pid: u32,
    pub rank: u32,
    pub comm_id: u64,
    /// 0 when not made by `ncclCommSplit`.
    pub parent_id: u64,
    pub color: i32,
    /// 0 for a split whose size the agent could not read from the
    /// communicator object: the coordinator works it out from every
    /// member's `split_ordinal`, `color` and `split_key` (NCCL's rule: the
    /// members of one color, ordered by key, ties by parent rank).
    pub nranks: u32,
    /// This member's rank inside the communicator (meaningless while
    /// `nranks` is 0).
    pub rank_in_comm: u32,
    pub created_ns: u64,
    /// For a split: which `ncclCommSplit` on the parent this is (0-based;
    /// every member of the parent makes them in the same order).
    pub split_ordinal: u32,
    /// For a split: the key this member passed.
    pub split_key: i32,
    /// Re-announced by an agent that restarted while this member's process
    /// ran (its communicator table kept in the agent's state file): the
    /// collectives it missed while no agent watched are unknown, so its
    /// `seq` starts again at 0 from its first collective after the
    /// takeover, and the coordinator lines them up with the other members'
    /// instances (`coordinator/src/join/realign.rs`).
    pub resumed: bool,
}

/// One member's view of one collective instance. `(comm_id, seq)` names the
/// instance across the cluster; times are the agent host's monotonic ns.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CollectiveRecord {
    pub pid: u32,
    pub rank: u32,
    pub comm_id: u64,
    /// 0-based, per communicator, in issue order on this member.
    pub seq: u64,
    pub op: CollOp,
    pub bytes: u64,
    /// Peer rank in the communicator for send/recv, -1 otherwise.
    pub peer: i32,
    /// The host thread entered / left the NCCL call (enqueue only: Trap 1).
    pub host_entry_ns: u64,
    pub host_exit_ns: u64,
    /// The GPU reached the collective (first proxy post_send, deep set); 0 = unknown.
    pub gpu_arrive_ns: u64,
    /// The collective completed on this member (last completion polled); 0 = unknown.
    pub gpu_done_ns: u64,
    /// CUDA launches and host time spent in sync calls since the previous
    /// collective on this rank.
    pub launches_before: u32,
    pub sync_wait_ns_before: u64,
    /// Time the GPU spent running this rank's kernels since its previous
    /// collective, when the source records kernels (profiler traces, the
    /// straggler study); `None` from the agent, which does not trace
    /// kernels. It tells the rank's own GPU work from an idle GPU waiting
    /// on something the source does not show (a host-side barrier, a
    /// collective of an unrecorded group).
    pub gpu_busy_before_ns: Option<u64>,
    /// `ncclResult_t` returned by the call.
    pub ret: i32,
}

/// Per-rank counters over one interval.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RankInterval {
    pub pid: u32,
    pub rank: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub launches: u64,
    /// Host time inside launch calls.
    pub launch_ns: u64,
    pub sync_calls: u64,
    /// Host time blocked in stream/event/device synchronize.
    pub sync_wait_ns: u64,
    /// The main thread's time on a CPU (scheduler accounting); 0 with
    /// `runq_delay_ns` and `offcpu_ns` when not measured.
    pub oncpu_ns: u64,
    /// Runnable but waiting for a CPU.
    pub runq_delay_ns: u64,
    /// Neither on a CPU nor runnable: asleep or blocked, blocking GPU
    /// syncs included (`sync_wait_ns` says how much of it they were).
    pub offcpu_ns: u64,
    /// How much of the interval the launch/memcpy/malloc counters were
    /// attached (deep windows and launch samples; they are off otherwise,
    /// to spare the job a trap per launch). `launches` counts only that
    /// time: the rate is `launches / launch_counted_ns`; 0 = not counted.
    pub launch_counted_ns: u64,
    /// uprobe/uretprobe traps this rank took in the interval (counted
    /// in-kernel, every probe of every set).
    pub probe_hits: u64,
    /// The agent's estimate of the rank's time those traps cost: hits ×
    /// this host's trap cost measured at agent start.
    pub probe_cost_ns: u64,
    /// Of `probe_cost_ns`, the verbs data path's (deep windows:
    /// `post_send`, `poll_cq`), taken by NCCL's proxy threads rather than
    /// the threads that run the step (schema 9; 0 before).
    pub datapath_cost_ns: u64,
    /// This host's measured cost of one uprobe + uretprobe pair (ns; 0 =
    /// not measured).
    pub trap_pair_ns: u32,
    /// Share of time (ppm) the agent's overhead budget allows the launch
    /// counters to be on; below the default sampling share when the budget
    /// narrowed it.
    pub launch_duty_ppm: u32,
    /// The overhead budget (`--max-overhead`) made the agent narrow its
    /// launch sampling or deep windows in this interval.
    pub budget_narrowed: bool,
    /// The agent's own CPU time over the interval, shared equally among
    /// the intervals of its ranks closed with this one: rank time it may
    /// have taken where it shares the ranks' cores (on a 2-vCPU host with
    /// 4 ranks it does; on a GPU host with cores to spare, barely).
    pub agent_cpu_ns: u64,
}

/// Per queue-pair traffic over an interval (deep probe set).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LinkRecord {
    pub pid: u32,
    pub rank: u32,
    /// Global rank at the other end, when the QP was mapped to a peer.
    pub peer_rank: i64,
    pub qp_num: u32,
    pub dest_qp_num: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub posts: u64,
    pub completions: u64,
    /// Sum of post→completion latencies, for the mean.
    pub post_to_completion_ns: u64,
    pub bytes: u64,
    /// Remote port LID from `ibv_modify_qp` (0 = unknown); with the QP
    /// numbers it joins both ends (`links::resolve_peer_ranks`).
    pub dlid: u32,
}

/// A batch of records from one agent.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Batch {
    pub host: String,
    pub agent_id: String,
    /// Per-agent sequence number, so the coordinator sees gaps and resends.
    pub seq: u64,
    /// Agent monotonic and wall clock when the batch was cut (ns).
    pub mono_ns: u64,
    pub wall_ns: u64,
    pub ranks: Vec<RankIdentity>,
    pub exits: Vec<RankExit>,
    pub comms: Vec<CommRecord>,
    pub collectives: Vec<CollectiveRecord>,
    pub intervals: Vec<RankInterval>,
    pub links: Vec<LinkRecord>,
    /// Raw probe descriptors and call boundaries (generic probes, `--probe`).
    pub probes: Vec<ProbeDesc>,
    pub calls: Vec<CallRecord>,
    /// Ring-buffer drops counted in the kernel since the agent started.
    pub ringbuf_drops: u64,
    /// Batches the agent's spool discarded since it started (bound hit).
    pub spool_drops: u64,
    /// Folded stacks per rank, view and window (CPU and launch sites).
    pub stacks: Vec<StackWindow>,
}
impl Message for Batch {
    const KIND: MessageKind = MessageKind::Batch;
}

/// Coordinator → agent on the control stream: "read your clock now".
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockProbe {
    pub seq: u64,
    /// Coordinator monotonic ns when the probe left (echoed back).
    pub coord_send_ns: u64,
}
impl Message for ClockProbe {
    const KIND: MessageKind = MessageKind::ClockProbe;
}

/// Agent → coordinator: the answer to one [`ClockProbe`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReply {
    pub seq: u64,
    /// Echo of the probe's `coord_send_ns`, so the coordinator keeps no state.
    pub coord_send_ns: u64,
    /// The agent's reporting clock (the one its records use) when it answered.
    pub agent_mono_ns: u64,
}
impl Message for ClockReply {
    const KIND: MessageKind = MessageKind::ClockReply;
}

/// Coordinator → agent on the control stream: where the UDP clock port
/// listens (same address as the QUIC endpoint), the token naming this
/// connection there and the key its datagrams are MAC'd with
/// ([`crate::clock_udp`]). An agent that cannot reach it keeps answering
/// probes on the control stream.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockPort {
    pub port: u16,
    pub token: [u8; 16],
    pub key: [u8; 32],
}
impl Message for ClockPort {
    const KIND: MessageKind = MessageKind::ClockPort;
}

/// Coordinator → agent on the control stream: open or close a deep-probe
/// window (verbs post/poll, per-launch timing) for some ranks.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// True opens the window, false closes it now.
    pub deep_enable: bool,
    /// Window length; the agent closes it by itself afterwards.
    pub seconds: u32,
    /// Global ranks the window is for; empty means every rank of the host.
    pub ranks: Vec<u32>,
    /// Also record launch sites (stack + kernel per CUDA launch) of the
    /// named ranks and a reference: for a compute-slow suspect, whose flame
    /// graph is the launch view. Each launch then traps on the main thread,
    /// which on a slow-trap VM reclassified a host-slow suspect, so it is
    /// asked for only where it is needed.
    pub launch_sites: bool,
}
impl Message for Control {
    const KIND: MessageKind = MessageKind::Control;
}

/// For framed streams carrying several messages: checks a 12-byte header and
/// returns the kind and the archive length that follows it.
pub fn peek_header(header: &[u8; HEADER_LEN]) -> Result<(MessageKind, usize), WireError> {
    let magic: [u8; 4] = header[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != SCHEMA_VERSION {
        return Err(WireError::Version { got: version });
    }
    let kind = MessageKind::from_raw(header[6])?;
    let declared = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as usize;
    if declared > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(declared));
    }
    Ok((kind, declared))
}

/// Serializes `value` with its header.
pub fn encode<T>(value: &T) -> Result<Vec<u8>, WireError>
where
    T: Message + for<'a> Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
{
    let archive =
        rkyv::to_bytes::<rancor::Error>(value).map_err(|e| WireError::Serialize(e.to_string()))?;
    if archive.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(archive.len()));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + archive.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SCHEMA_VERSION.to_le_bytes());
    out.push(T::KIND as u8);
    out.push(0);
    out.extend_from_slice(&(archive.len() as u32).to_le_bytes());
    out.extend_from_slice(&archive);
    Ok(out)
}

/// Reads and checks the header; returns the kind and the archive bytes.
pub fn split_header(bytes: &[u8]) -> Result<(MessageKind, &[u8]), WireError> {
    if bytes.len() < HEADER_LEN {
        return Err(WireError::Truncated(bytes.len()));
    }
    let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != SCHEMA_VERSION {
        return Err(WireError::Version { got: version });
    }
    let kind = MessageKind::from_raw(bytes[6])?;
    let declared = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    if declared > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(declared));
    }
    let body = &bytes[HEADER_LEN..];
    if body.len() != declared {
        return Err(WireError::LengthMismatch {
            declared,
            actual: body.len(),
        });
    }
    Ok((kind, body))
}

/// Validates and deserializes one message of type `T`.
pub fn decode<T>(bytes: &[u8]) -> Result<T, WireError>
where
    T: Message + Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, Strategy<Pool, rancor::Error>>,
{
    let (kind, body) = split_header(bytes)?;
    if kind != T::KIND {
        return Err(WireError::WrongKind {
            expected: T::KIND,
            got: kind,
        });
    }
    // rkyv needs the archive aligned; the network buffer is not.
    let mut aligned = AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<T, rancor::Error>(&aligned).map_err(|e| WireError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch {
            host: "node-0".into(),
            agent_id: "a1".into(),
            seq: 7,
            probes: vec![ProbeDesc {
                id: 0,
                path: "/x/libnccl.so.2".into(),
                symbol: "ncclAllReduce".into(),
            }],
            calls: (0..100)
                .map(|i| CallRecord {
                    ts_ns: 1000 + i,
                    pid: 42,
                    tid: 43,
                    probe: 0,
                    is_return: i % 2 == 1,
                    args: [i, 2, 3, 4, 5, 6],
                    ret: 9,
                })
                .collect(),
            ringbuf_drops: 3,
            ..Default::default()
        }
    }

    #[test]
    fn control_messages_round_trip_and_frame() {
        let p = ClockProbe {
            seq: 3,
            coord_send_ns: 99,
        };
        let bytes = encode(&p).unwrap();
        let (kind, len) = peek_header(bytes[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(kind, MessageKind::ClockProbe);
        assert_eq!(len, bytes.len() - HEADER_LEN);
        assert_eq!(decode::<ClockProbe>(&bytes).unwrap(), p);
        let c = Control {
            deep_enable: true,
            seconds: 30,
            ranks: vec![5, 6],
            launch_sites: true,
        };
        assert_eq!(decode::<Control>(&encode(&c).unwrap()).unwrap(), c);
        let r = ClockReply {
            seq: 3,
            coord_send_ns: 99,
            agent_mono_ns: 7,
        };
        assert!(matches!(
            decode::<ClockProbe>(&encode(&r).unwrap()),
            Err(WireError::WrongKind { .. })
        ));
        let mut bad = bytes.clone();
        bad[0] = 0;
        assert!(peek_header(bad[..HEADER_LEN].try_into().unwrap()).is_err());
    }

    #[test]
    fn round_trip() {
        let b = batch();
        let bytes = encode(&b).unwrap();
        assert_eq!(decode::<Batch>(&bytes).unwrap(), b);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode(&batch()).unwrap();
        for len in 0..bytes.len() {
            assert!(
                decode::<Batch>(&bytes[..len]).is_err(),
                "len {len} accepted"
            );
        }
    }

    #[test]
    fn header_faults_have_reasons() {
        let good = encode(&batch()).unwrap();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(decode::<Batch>(&b), Err(WireError::BadMagic(_))));
        let mut b = good.clone();
        b[4] = 99;
        assert_eq!(decode::<Batch>(&b), Err(WireError::Version { got: 99 }));
        let mut b = good.clone();
        b[6] = 77;
        assert_eq!(decode::<Batch>(&b), Err(WireError::UnknownKind(77)));
        let mut b = good.clone();
        b[8..12].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert!(matches!(decode::<Batch>(&b), Err(WireError::TooLarge(_))));
        assert!(matches!(
            decode::<Hello>(&good),
            Err(WireError::WrongKind { .. })
        ));
    }

    #[test]
    fn corrupted_archive_is_rejected_not_panicking() {
        let good = encode(&batch()).unwrap();
        // Flip bytes across the archive; each result must be Ok or Err, never
        // a panic, and pointer-bearing regions must be caught by bytecheck.
        let mut rejected = 0;
        for i in HEADER_LEN..good.len() {
            let mut b = good.clone();
            b[i] ^= 0xff;
            if decode::<Batch>(&b).is_err() {
                rejected += 1;
            }
        }
        assert!(rejected > 0, "no corruption was detected");
        // Garbage of the right length with a valid header.
        let mut b = good[..HEADER_LEN].to_vec();
        b.extend(std::iter::repeat_n(0xAB, good.len() - HEADER_LEN));
        assert!(matches!(decode::<Batch>(&b), Err(WireError::Invalid(_))));
    }
}

/// Which stacks a [`StackWindow`] folds.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[rkyv(derive(Debug, PartialEq))]
#[repr(u8)]
pub enum StackView {
    /// Where the rank's threads spend wall time: on-CPU samples plus off-CPU
    /// time, weights in microseconds of thread time.
    Cpu = 0,
    /// Where the rank launches GPU kernels: the launching user stack with a
    /// `GPU:<kernel>` leaf, weights in launches.
    Launch = 1,
}

/// One distinct stack and its weight.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FoldedStack {
    /// Indices into [`StackWindow::strings`], root first.
    pub frames: Vec<u32>,
    pub weight: u64,
}

/// Folded stacks of one rank over one window, with an interned string table.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StackWindow {
    pub rank: u32,
    pub view: StackView,
    /// Agent monotonic clock (ns).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Frame names, referenced by index from `stacks`.
    pub strings: Vec<String>,
    pub stacks: Vec<FoldedStack>,
    /// Raw records folded into this window.
    pub records: u64,
    /// Records whose user or kernel stack hit the frame limit (cut at the root end).
    pub truncated: u64,
    /// Weight of distinct stacks beyond the agent's bound, folded into one
    /// `[other stacks]` entry instead.
    pub overflow_weight: u64,
}

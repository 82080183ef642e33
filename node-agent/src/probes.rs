//! Loading the eBPF object, attaching uprobe/uretprobe pairs and reading the
//! call events they produce.
//!
//! Requires root (or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN) and Linux ≥ 5.15
//! (ring buffer, uprobe attach cookies).

use std::path::{Path, PathBuf};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        ProgramError, UProbe,
    },
    Ebpf, EbpfError, EbpfLoader,
};
use slowrank_shared::maps as bpf_maps;
use slowrank_shared::{
    probe::{cookie, counter, cuda_count, CallEvent, ObjectSnapshot, StackEvent},
    wire::ProbeDesc,
};

/// The eBPF object built by build.rs from `node-agent-ebpf`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-agent"));

const ENTRY_PROG: &str = "call_entry";
const RETURN_PROG: &str = "call_return";
const ENTRY_STACK_PROG: &str = "call_entry_stack";
const RETURN_OUT_PROG: &str = "call_return_out";
const COUNT_PROG: &str = "count_call";
const POST_SEND_PROG: &str = "verbs_post_send";
const POLL_ENTRY_PROG: &str = "verbs_poll_entry";
const POLL_RETURN_PROG: &str = "verbs_poll_return";
const MODIFY_QP_PROG: &str = "verbs_modify_qp";
const PROGRAMS: [&str; 9] = [
    ENTRY_PROG,
    RETURN_PROG,
    ENTRY_STACK_PROG,
    RETURN_OUT_PROG,
    COUNT_PROG,
    POST_SEND_PROG,
    POLL_ENTRY_PROG,
    POLL_RETURN_PROG,
    MODIFY_QP_PROG,
];

/// `slowrank_shared::probe::Followed` as user space reads it (aya's `Pod`
/// is not implementable for a foreign type): [rank | pad << 32, entry hits,
/// return hits, data-path entry hits, data-path return hits].
type FollowedRaw = [u64; 5];
const _: () = assert!(
    std::mem::size_of::<FollowedRaw>() == std::mem::size_of::<slowrank_shared::probe::Followed>()
);

/// How a function is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// Entry (register arguments) and return.
    Call,
    /// Entry with stack words and launch count, and return.
    StackCall,
    /// Like `Call`/`StackCall` (`stack`), and the return also reports the
    /// value behind out-pointer argument `out_arg` (an `ncclComm_t*`).
    CallOut { out_arg: u8, stack: bool },
    /// Entry only, counted per process in-kernel in class `class`.
    Count { class: u32 },
    /// A verbs provider's `post_send` (entry only).
    VerbsPostSend,
    /// A verbs provider's `poll_cq` (events only for completions).
    VerbsPollCq,
    /// `ibv_modify_qp` (entry only).
    VerbsModifyQp,
}

/// One event from the ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEvent {
    Call(CallEvent),
    Stack(StackEvent),
    /// Rare (communicator creation) and 2 KiB: boxed.
    Snapshot(Box<ObjectSnapshot>),
}

impl RawEvent {
    pub fn call(&self) -> &CallEvent {
        match self {
            Self::Call(c) => c,
            Self::Stack(s) => &s.call,
            Self::Snapshot(s) => &s.call,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot load the eBPF object (are you root, kernel ≥ 5.15?)")]
    Load(#[source] Box<EbpfError>),
    #[error("eBPF program {0} missing from the object")]
    MissingProgram(&'static str),
    #[error("eBPF map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("cannot load program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot attach {kind} to {symbol} in {path}")]
    Attach {
        kind: &'static str,
        symbol: String,
        path: PathBuf,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("map operation on {map} failed")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
}

/// Kernel-side counters, summed over CPUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub ringbuf_drops: u64,
    pub unfollowed_hits: u64,
    pub counts_full: u64,
    pub out_read_failed: u64,
    pub execs_lost: u64,
}

/// What one [`Probes::drain_raw`] read from the event ring.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Records moved out.
    pub records: usize,
    /// Items of an unexpected size (dropped).
    pub bad: usize,
    /// Bytes of the ring they took (for [`crate::cadence`]).
    pub bytes: usize,
}

/// The loaded programs, their attachments and the event ring buffer.
pub struct Probes {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    descs: Vec<ProbeDesc>,
    links: std::collections::HashMap<u32, Vec<(&'static str, UProbeLinkId)>>,
    /// Exec notices (`on_exec`), when that tracepoint is attached.
    execs: Option<RingBuf<MapData>>,
    /// `EXECS_LOST` as last read: a rise means notices were lost.
    execs_lost: u64,
}

/// Size of the call-event ring buffer. The deep set's `poll_cq` events
/// fill 1 MiB in ~0.1 s on a busy host; an agent loop stalled by probe
/// attachment (up to seconds on a loaded VM) then lost events, and a lost
/// `ncclGroupEnd` return once held a rank's records back for the rest of the
/// run. 8 MiB of locked memory rides out ~1 s of that.
pub const EVENTS_BYTES: u32 = 8 << 20;

impl Probes {
    /// Loads the object and both programs; attaches nothing yet.
    pub fn load() -> Result<Self, ProbeError> {
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(bpf_maps::EVENTS, EVENTS_BYTES)
            .load(OBJECT)
            .map_err(|e| ProbeError::Load(Box::new(e)))?;
        for name in PROGRAMS {
            let prog: &mut UProbe = ebpf
                .program_mut(name)
                .ok_or(ProbeError::MissingProgram(name))?
                .try_into()
                .map_err(|e| ProbeError::Program {
                    name,
                    source: Box::new(e),
                })?;
            prog.load().map_err(|e| ProbeError::Program {
                name,
                source: Box::new(e),
            })?;
        }
        attach_fork_tracepoint(&mut ebpf);
        let execs = attach_exec_tracepoint(&mut ebpf);
        let events = RingBuf::try_from(
            ebpf.take_map(bpf_maps::EVENTS)
                .ok_or(ProbeError::MissingMap(bpf_maps::EVENTS))?,
        )
        .map_err(|e| ProbeError::Map {
            map: bpf_maps::EVENTS,
            source: Box::new(e),
        })?;
        Ok(Self {
            ebpf,
            events,
            descs: Vec::new(),
            links: std::collections::HashMap::new(),
            execs,
            execs_lost: 0,
        })
    }

    /// Processes (tgid) that exec'd since the last call, for the /proc
    /// scan; `None` when the exec tracepoint is not attached or notices were
    /// lost (then the scan must read every process).
    pub fn take_execs(&mut self) -> Option<Vec<u32>> {
        let ring = self.execs.as_mut()?;
        let mut pids = Vec::new();
        while let Some(item) = ring.next() {
            if let Some(b) = item.get(..4) {
                pids.push(u32::from_ne_bytes(b.try_into().expect("4 bytes")));
            }
        }
        let lost = match self.counters() {
            Ok(c) => c.execs_lost,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the exec counter: reading every process");
                return None;
            }
        };
        if lost != self.execs_lost {
            tracing::warn!(
                lost = lost - self.execs_lost,
                "exec notices lost: reading every process this scan"
            );
            self.execs_lost = lost;
            return None;
        }
        Some(pids)
    }

    /// Attaches an entry and a return probe to `symbol` in the file `path`
    /// (an exact path, e.g. from `/proc/PID/maps`: aya matches bare library
    /// names loosely). Fires for every process mapping that file; the
    /// `FOLLOWED` map filters in-kernel. Returns the probe id.
    ///
    /// Only use this on C-ABI functions: a uretprobe on a frame that a C++
    /// exception unwinds through aborts the target.
    pub fn attach(&mut self, path: &Path, symbol: &str) -> Result<u32, ProbeError> {
        self.attach_as(path, symbol, Attach::Call)
    }

    /// Attaches `symbol` in `path` the way `how` says; returns the probe id.
    /// Same rules as [`Probes::attach`]: exact paths, C-ABI functions only.
    pub fn attach_as(&mut self, path: &Path, symbol: &str, how: Attach) -> Result<u32, ProbeError> {
        self.attach_at(
            path,
            UProbeAttachLocation::Symbol(symbol),
            symbol,
            how,
            None,
        )
    }

    /// Like [`Probes::attach_as`], limited to process `pid` (the kernel
    /// filters: no other process traps). For the agent's self-measurement.
    pub fn attach_own(
        &mut self,
        path: &Path,
        symbol: &str,
        how: Attach,
        pid: u32,
    ) -> Result<u32, ProbeError> {
        self.attach_at(
            path,
            UProbeAttachLocation::Symbol(symbol),
            symbol,
            how,
            Some(pid),
        )
    }

    /// Attaches at a file offset (a function found through a function
    /// pointer, e.g. a verbs provider's ops); detachable with [`Probes::detach`].
    pub fn attach_offset(
        &mut self,
        path: &Path,
        offset: u64,
        how: Attach,
    ) -> Result<u32, ProbeError> {
        let name = format!("+{offset:#x}");
        self.attach_at(
            path,
            UProbeAttachLocation::AbsoluteOffset(offset),
            &name,
            how,
            None,
        )
    }

    /// Detaches every program attached for probe `id` (its id is not reused).
    pub fn detach(&mut self, id: u32) {
        for (prog, link) in self.links.remove(&id).unwrap_or_default() {
            if let Some(p) = self.ebpf.program_mut(prog) {
                if let Ok(p) = <&mut UProbe>::try_from(p) {
                    if let Err(e) = p.detach(link) {
                        tracing::warn!(probe = id, error = %e, "detach failed");
                    }
                }
            }
        }
    }

    /// Detaches every program of probes `ids` on a helper thread: each
    /// uprobe detach waits for a kernel synchronisation (0.1–0.3 s each on a
    /// loaded VM, seconds for a set), which must not stall the agent's loop.
    /// The receiver fires (or hangs up) once all are gone; until then they
    /// still trap.
    pub fn detach_background(&mut self, ids: &[u32]) -> std::sync::mpsc::Receiver<()> {
        let mut owned = Vec::new();
        for id in ids {
            for (prog, link) in self.links.remove(id).unwrap_or_default() {
                let Some(p) = self.ebpf.program_mut(prog) else {
                    continue;
                };
                let Ok(p) = <&mut UProbe>::try_from(p) else {
                    continue;
                };
                match p.take_link(link) {
                    Ok(l) => owned.push(l),
                    Err(e) => tracing::warn!(probe = id, error = %e, "detach failed"),
                }
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("slowrank-detach".into())
            .spawn(move || {
                use aya::programs::links::Link;
                for l in owned {
                    if let Err(e) = l.detach() {
                        tracing::warn!(error = %e, "detach failed");
                    }
                }
                let _ = tx.send(());
            });
        if let Err(e) = spawned {
            // The closure and its links were dropped: dropping detaches
            // (inline), and the receiver sees the sender gone.
            tracing::warn!(error = %e, "no detach thread; detached inline");
        }
        rx
    }

    fn attach_at(
        &mut self,
        path: &Path,
        location: UProbeAttachLocation<'_>,
        symbol: &str,
        how: Attach,
        pid: Option<u32>,
    ) -> Result<u32, ProbeError> {
        let id = self.descs.len() as u32;
        let base = u64::from(id);
        let plan: &[(&'static str, &'static str, u64)] = &match how {
            Attach::Call => [
                (ENTRY_PROG, "uprobe", base),
                (RETURN_PROG, "uretprobe", base),
            ],
            Attach::StackCall => [
                (ENTRY_STACK_PROG, "uprobe", base),
                (RETURN_PROG, "uretprobe", base),
            ],
            Attach::CallOut { out_arg, stack } => {
                let c = base | (u64::from(out_arg) + 1) << cookie::OUT_ARG_SHIFT;
                let entry = if stack { ENTRY_STACK_PROG } else { ENTRY_PROG };
                [(entry, "uprobe", c), (RETURN_OUT_PROG, "uretprobe", c)]
            }
            Attach::Count { class } => {
                let c = base | u64::from(class) << cookie::CLASS_SHIFT;
                [(COUNT_PROG, "uprobe", c), ("", "", 0)]
            }
            Attach::VerbsPostSend => [(POST_SEND_PROG, "uprobe", base), ("", "", 0)],
            Attach::VerbsPollCq => [
                (POLL_ENTRY_PROG, "uprobe", base),
                (POLL_RETURN_PROG, "uretprobe", base),
            ],
            Attach::VerbsModifyQp => [(MODIFY_QP_PROG, "uprobe", base), ("", "", 0)],
        };
        let mut links = Vec::new();
        for &(prog, kind, cookie) in plan.iter().filter(|p| !p.0.is_empty()) {
            let loc = match &location {
                UProbeAttachLocation::Symbol(s) => UProbeAttachLocation::Symbol(s),
                UProbeAttachLocation::SymbolOffset(s, o) => {
                    UProbeAttachLocation::SymbolOffset(s, *o)
                }
                UProbeAttachLocation::AbsoluteOffset(o) => UProbeAttachLocation::AbsoluteOffset(*o),
            };
            let link = attach_one(&mut self.ebpf, prog, path, loc, cookie, pid).map_err(|source| {
                ProbeError::Attach {
                    kind,
                    symbol: symbol.to_owned(),
                    path: path.to_owned(),
                    source: Box::new(source),
                }
            });
            match link {
                Ok(l) => links.push((prog, l)),
                Err(e) => {
                    // Leave nothing half-attached.
                    self.links.insert(id, links);
                    self.detach(id);
                    return Err(e);
                }
            }
        }
        self.links.insert(id, links);
        self.descs.push(ProbeDesc {
            id,
            path: path.display().to_string(),
            symbol: symbol.to_owned(),
        });
        Ok(id)
    }

    /// What each probe id stands for.
    pub fn descs(&self) -> &[ProbeDesc] {
        &self.descs
    }

    /// Starts counting calls from process `pid`.
    pub fn follow(&mut self, pid: u32, rank: Option<u32>) -> Result<(), ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::FOLLOWED,
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, FollowedRaw> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::FOLLOWED)
                .ok_or(ProbeError::MissingMap(bpf_maps::FOLLOWED))?,
        )
        .map_err(map_err)?;
        // Keep the hit counts of a process followed again (a rank learnt).
        let mut v = map.get(&pid, 0).unwrap_or([0; 5]);
        v[0] = u64::from(rank.unwrap_or(u32::MAX));
        map.insert(pid, v, 0).map_err(map_err)
    }

    /// Probe traps per followed process so far: (pid, [entry hits, return
    /// hits, of which the verbs data path's entry and return hits]),
    /// counted in-kernel by every program.
    pub fn followed_hits(&self) -> Result<Vec<(u32, [u64; 4])>, ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::FOLLOWED,
            source: Box::new(e),
        };
        let map: HashMap<_, u32, FollowedRaw> = HashMap::try_from(
            self.ebpf
                .map(bpf_maps::FOLLOWED)
                .ok_or(ProbeError::MissingMap(bpf_maps::FOLLOWED))?,
        )
        .map_err(map_err)?;
        map.iter()
            .map(|r| {
                r.map(|(pid, v)| (pid, [v[1], v[2], v[3], v[4]]))
                    .map_err(map_err)
            })
            .collect()
    }

    /// Reports calls from `pid` and every process it forks from now on,
    /// before they are classified (the wrapped command, a launcher).
    pub fn watch_tree(&mut self, pid: u32) -> Result<(), ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::TREE,
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::TREE)
                .ok_or(ProbeError::MissingMap(bpf_maps::TREE))?,
        )
        .map_err(map_err)?;
        map.insert(pid, pid, 0).map_err(map_err)
    }

    /// Stops reporting an unclassified process (e.g. another agent's rank).
    pub fn unwatch(&mut self, pid: u32) -> Result<(), ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::TREE,
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::TREE)
                .ok_or(ProbeError::MissingMap(bpf_maps::TREE))?,
        )
        .map_err(map_err)?;
        // Absent already (pruned, never forked under a root): nothing to do.
        let _ = map.remove(&pid);
        let _ = map_err;
        Ok(())
    }

    /// Forgets tree entries of processes that no longer exist (or are not
    /// in `keep`). Returns how many were removed.
    pub fn prune_tree(&mut self, keep: &dyn Fn(u32) -> bool) -> Result<usize, ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::TREE,
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::TREE)
                .ok_or(ProbeError::MissingMap(bpf_maps::TREE))?,
        )
        .map_err(map_err)?;
        let dead: Vec<u32> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|p| !keep(*p))
            .collect();
        for p in &dead {
            let _ = map.remove(p);
        }
        Ok(dead.len())
    }

    /// Stops counting calls from `pid` (e.g. after it exited).
    pub fn unfollow(&mut self, pid: u32) -> Result<(), ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::FOLLOWED,
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, FollowedRaw> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::FOLLOWED)
                .ok_or(ProbeError::MissingMap(bpf_maps::FOLLOWED))?,
        )
        .map_err(map_err)?;
        match map.remove(&pid) {
            Err(e) if !is_not_found(&e) => Err(map_err(e)),
            _ => Ok(()),
        }
    }

    /// Moves every pending event (plain and stack entries) into `out`;
    /// says how many, how many had an unexpected size and how many bytes
    /// of the ring they took. Never blocks.
    pub fn drain_raw(&mut self, out: &mut Vec<RawEvent>) -> Drained {
        let mut d = Drained::default();
        while let Some(item) = self.events.next() {
            d.bytes += item.len();
            if let Some(ev) = CallEvent::from_bytes(&item) {
                out.push(RawEvent::Call(ev));
            } else if let Some(ev) = StackEvent::from_bytes(&item) {
                out.push(RawEvent::Stack(ev));
            } else if let Some(ev) = ObjectSnapshot::from_bytes(&item) {
                out.push(RawEvent::Snapshot(Box::new(ev)));
            } else {
                d.bad += 1;
                continue;
            }
            d.records += 1;
        }
        d
    }

    /// Per-process CUDA call counters kept in the kernel (`count_call`).
    pub fn cuda_counts(&self) -> Result<Vec<(u32, [u64; cuda_count::SLOTS])>, ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::CUDA_COUNTS,
            source: Box::new(e),
        };
        let map: HashMap<_, u32, [u64; cuda_count::SLOTS]> = HashMap::try_from(
            self.ebpf
                .map(bpf_maps::CUDA_COUNTS)
                .ok_or(ProbeError::MissingMap(bpf_maps::CUDA_COUNTS))?,
        )
        .map_err(map_err)?;
        map.iter().map(|r| r.map_err(map_err)).collect()
    }

    /// Forgets the counters of a process that exited.
    pub fn forget_counts(&mut self, pid: u32) -> Result<(), ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::CUDA_COUNTS,
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, [u64; cuda_count::SLOTS]> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::CUDA_COUNTS)
                .ok_or(ProbeError::MissingMap(bpf_maps::CUDA_COUNTS))?,
        )
        .map_err(map_err)?;
        match map.remove(&pid) {
            Err(e) if !is_not_found(&e) => Err(map_err(e)),
            _ => Ok(()),
        }
    }

    /// Moves every pending event into `out`; returns how many. Never blocks.
    /// Records of an unexpected size (a kernel/user mismatch) are skipped and
    /// counted in the return's second value.
    pub fn drain(&mut self, out: &mut Vec<CallEvent>) -> (usize, usize) {
        let (mut n, mut bad) = (0, 0);
        while let Some(item) = self.events.next() {
            match CallEvent::from_bytes(&item) {
                Some(ev) => {
                    out.push(ev);
                    n += 1;
                }
                None => bad += 1,
            }
        }
        (n, bad)
    }

    /// Reads the kernel-side counters.
    pub fn counters(&self) -> Result<Counters, ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: bpf_maps::COUNTERS,
            source: Box::new(e),
        };
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map(bpf_maps::COUNTERS)
                .ok_or(ProbeError::MissingMap(bpf_maps::COUNTERS))?,
        )
        .map_err(map_err)?;
        let sum = |i: u32| -> Result<u64, ProbeError> {
            Ok(arr.get(&i, 0).map_err(map_err)?.iter().sum())
        };
        Ok(Counters {
            ringbuf_drops: sum(counter::RINGBUF_DROPS)?,
            unfollowed_hits: sum(counter::UNFOLLOWED_HITS)?,
            counts_full: sum(counter::COUNTS_FULL)?,
            out_read_failed: sum(counter::OUT_READ_FAILED)?,
            execs_lost: sum(counter::EXECS_LOST)?,
        })
    }
}

/// A delete of an absent key: aya reports it as a syscall error (ENOENT).
fn is_not_found(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Attaches the fork tracepoint that grows `TREE`. Without it (format file
/// unreadable, no tracefs) the agent only sees processes after its /proc
/// scan found them; that is logged, not fatal.
fn attach_fork_tracepoint(ebpf: &mut Ebpf) {
    let root = match crate::tracefs::ensure_mounted() {
        Ok(root) => root,
        Err(e) => {
            tracing::warn!(error = %e, "no fork tracepoint: ranks are seen only once /proc shows them, and calls they make before that are missed");
            return;
        }
    };
    let offset = std::fs::read_to_string(root.join("events/sched/sched_process_fork/format"))
        .ok()
        .and_then(|f| field_offset(&f, "child_pid"));
    let Some(offset) = offset else {
        tracing::warn!(
            "sched_process_fork format not readable: ranks are seen only once /proc shows them"
        );
        return;
    };
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let mut cfg: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
            ebpf.map_mut(bpf_maps::CONFIG).ok_or("CONFIG map missing")?,
        )?;
        cfg.set(0, offset, 0)?;
        attach_sched_tracepoint(ebpf, "on_fork", "sched_process_fork")
    })();
    if let Err(e) = result {
        tracing::warn!(error = %e, "fork tracepoint not attached: ranks are seen only once /proc shows them");
    }
}

/// Attaches the exec tracepoint and returns its notice ring. Without it
/// the /proc scan reads every process each pass (logged, not fatal).
fn attach_exec_tracepoint(ebpf: &mut Ebpf) -> Option<RingBuf<MapData>> {
    let result = (|| -> Result<RingBuf<MapData>, Box<dyn std::error::Error>> {
        crate::tracefs::ensure_mounted()?;
        attach_sched_tracepoint(ebpf, "on_exec", "sched_process_exec")?;
        let map = ebpf.take_map(bpf_maps::EXECS).ok_or("EXECS map missing")?;
        Ok(RingBuf::try_from(map)?)
    })();
    match result {
        Ok(ring) => Some(ring),
        Err(e) => {
            tracing::warn!(error = %e, "exec tracepoint not attached: the /proc scan reads every process each pass");
            None
        }
    }
}

/// Loads program `prog` and attaches it to the `sched:event` tracepoint.
fn attach_sched_tracepoint(
    ebpf: &mut Ebpf,
    prog: &str,
    event: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let program: &mut aya::programs::TracePoint = ebpf
        .program_mut(prog)
        .ok_or_else(|| format!("{prog} missing"))?
        .try_into()?;
    program.load()?;
    program.attach("sched", event)?;
    Ok(())
}

/// `offset:N` of `field` in a tracepoint format file.
fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|l| {
        let l = l.trim();
        let decl = l.strip_prefix("field:")?.split(';').next()?;
        if decl.split_whitespace().last()? != field {
            return None;
        }
        l.split(';')
            .find_map(|p| p.trim().strip_prefix("offset:")?.parse().ok())
    })
}

/// The one place that calls `UProbe::attach`: its shape changes between aya
/// releases (0.14 takes an attach point with a cookie and a scope). `pid`
/// limits the probe to one process (the kernel filters: others never trap).
pub(crate) fn attach_one(
    ebpf: &mut Ebpf,
    prog: &'static str,
    path: &Path,
    location: UProbeAttachLocation<'_>,
    cookie: u64,
    pid: Option<u32>,
) -> Result<UProbeLinkId, ProgramError> {
    let program: &mut UProbe = ebpf
        .program_mut(prog)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()?;
    let point = UProbeAttachPoint {
        location,
        cookie: Some(cookie),
    };
    let scope = match pid.and_then(std::num::NonZeroU32::new) {
        Some(pid) => UProbeScope::OneProcess(pid),
        None => UProbeScope::AllProcesses,
    };
    program.attach(point, path, scope)
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

    use super::{bpf_maps, OBJECT};

    /// The object's maps are exactly the names in `slowrank_shared::maps`:
    /// a map renamed on one side only fails here, not at load on a host.
    #[test]
    fn maps_match_the_object() {
        let obj = object::File::parse(OBJECT).expect("the built eBPF object parses");
        let sections: Vec<_> = obj
            .sections()
            .filter(|s| matches!(s.name(), Ok("maps") | Ok(".maps")))
            .map(|s| s.index())
            .collect();
        assert!(!sections.is_empty(), "no maps section in the eBPF object");
        let mut found: Vec<&str> = obj
            .symbols()
            .filter(|s| s.kind() != SymbolKind::Section)
            .filter(|s| s.section_index().is_some_and(|i| sections.contains(&i)))
            .filter_map(|s| s.name().ok())
            .filter(|n| !n.is_empty())
            .collect();
        found.sort_unstable();
        found.dedup();
        let mut want = bpf_maps::ALL.to_vec();
        want.sort_unstable();
        assert_eq!(
            found, want,
            "the object's maps vs slowrank_shared::maps::ALL"
        );
    }
}

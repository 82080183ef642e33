//! Loading the eBPF object, attaching uprobe/uretprobe pairs and reading the
//! call events they produce.
//!
//! Requires root (or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN) and Linux ≥ 5.15
//! (ring buffer, uprobe attach cookies).

use std::path::{Path, PathBuf};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        ProgramError, UProbe,
    },
    Ebpf, EbpfError, EbpfLoader,
};
use slowrank_shared::{
    probe::{counter, CallEvent},
    wire::ProbeDesc,
};

/// The eBPF object built by build.rs from `node-agent-ebpf`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-agent"));

const ENTRY_PROG: &str = "call_entry";
const RETURN_PROG: &str = "call_return";

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
}

/// The loaded programs, their attachments and the event ring buffer.
pub struct Probes {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    descs: Vec<ProbeDesc>,
}

impl Probes {
    /// Loads the object and both programs; attaches nothing yet.
    pub fn load() -> Result<Self, ProbeError> {
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .map_err(|e| ProbeError::Load(Box::new(e)))?;
        for name in [ENTRY_PROG, RETURN_PROG] {
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
        let events = RingBuf::try_from(
            ebpf.take_map("EVENTS")
                .ok_or(ProbeError::MissingMap("EVENTS"))?,
        )
        .map_err(|e| ProbeError::Map {
            map: "EVENTS",
            source: Box::new(e),
        })?;
        Ok(Self {
            ebpf,
            events,
            descs: Vec::new(),
        })
    }

    /// Attaches an entry and a return probe to `symbol` in the file `path`
    /// (an exact path, e.g. from `/proc/PID/maps`: aya matches bare library
    /// names loosely). Fires for every process mapping that file; the
    /// `FOLLOWED` map filters in-kernel. Returns the probe id.
    ///
    /// Only use this on C-ABI functions: a uretprobe on a frame that a C++
    /// exception unwinds through aborts the target.
    pub fn attach(&mut self, path: &Path, symbol: &str) -> Result<u32, ProbeError> {
        let id = self.descs.len() as u32;
        for (prog, kind) in [(ENTRY_PROG, "uprobe"), (RETURN_PROG, "uretprobe")] {
            attach_one(&mut self.ebpf, prog, path, symbol, u64::from(id)).map_err(|source| {
                ProbeError::Attach {
                    kind,
                    symbol: symbol.to_owned(),
                    path: path.to_owned(),
                    source: Box::new(source),
                }
            })?;
        }
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
            map: "FOLLOWED",
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, u32> =
            HashMap::try_from(self.ebpf.map_mut("FOLLOWED").ok_or(ProbeError::MissingMap("FOLLOWED"))?)
                .map_err(map_err)?;
        map.insert(pid, rank.unwrap_or(u32::MAX), 0).map_err(map_err)
    }

    /// Stops counting calls from `pid` (e.g. after it exited).
    pub fn unfollow(&mut self, pid: u32) -> Result<(), ProbeError> {
        let map_err = |e| ProbeError::Map {
            map: "FOLLOWED",
            source: Box::new(e),
        };
        let mut map: HashMap<_, u32, u32> =
            HashMap::try_from(self.ebpf.map_mut("FOLLOWED").ok_or(ProbeError::MissingMap("FOLLOWED"))?)
                .map_err(map_err)?;
        match map.remove(&pid) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(e)),
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
            map: "COUNTERS",
            source: Box::new(e),
        };
        let arr: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("COUNTERS").ok_or(ProbeError::MissingMap("COUNTERS"))?)
                .map_err(map_err)?;
        let sum = |i: u32| -> Result<u64, ProbeError> {
            Ok(arr.get(&i, 0).map_err(map_err)?.iter().sum())
        };
        Ok(Counters {
            ringbuf_drops: sum(counter::RINGBUF_DROPS)?,
            unfollowed_hits: sum(counter::UNFOLLOWED_HITS)?,
        })
    }
}

/// The one place that calls `UProbe::attach`: its shape changes between aya
/// releases (0.14 takes an attach point with a cookie and a scope).
fn attach_one(
    ebpf: &mut Ebpf,
    prog: &'static str,
    path: &Path,
    symbol: &str,
    cookie: u64,
) -> Result<(), ProgramError> {
    let program: &mut UProbe = ebpf
        .program_mut(prog)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()?;
    let point = UProbeAttachPoint {
        location: UProbeAttachLocation::Symbol(symbol),
        cookie: Some(cookie),
    };
    program.attach(point, path, UProbeScope::AllProcesses)?;
    Ok(())
}

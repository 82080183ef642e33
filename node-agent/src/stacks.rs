//! Loading and attaching the stack programs (`node-agent-ebpf/src/stacks.rs`)
//! and reading their records.
//!
//! One perf event per online CPU samples whatever runs there; one
//! sched_switch tracepoint gives off-CPU time; in the deep set a uprobe on
//! `cudaLaunchKernel` records launch sites. Which processes count is decided
//! in the kernel by `STACK_PIDS` ([`StackSampler::follow`]).

use std::{
    collections::VecDeque,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::cadence::Cadence;
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::{UProbeAttachLocation, UProbeLinkId},
        BtfTracePoint, PerfEvent, ProgramError, UProbe,
    },
    Btf, Ebpf, EbpfError, EbpfLoader,
};
use slowrank_shared::maps as bpf_maps;
use slowrank_shared::stack::{stack_counter, StackEvent, StackKind};

/// The same object `probes.rs` loads; a separate instance keeps the stack
/// maps and programs independent of the call probes.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-agent"));

const SAMPLE_PROG: &str = "stack_sample";
const SWITCH_PROG: &str = "stack_switch";
const LAUNCH_PROG: &str = "stack_launch";
const SYNC_CALL_PROG: &str = "stack_sync_call";
const SYNC_RETURN_PROG: &str = "stack_sync_return";

/// CUDA runtime calls that return only once the GPU drained (the work
/// enqueued before them is done): progress marks for GPU time estimates.
pub const SYNC_SYMBOLS: [&str; 3] = [
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
];

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("cannot load the eBPF object (are you root, kernel ≥ 5.15?)")]
    Load(#[source] Box<EbpfError>),
    #[error("eBPF program {0} missing from the object")]
    MissingProgram(&'static str),
    #[error("eBPF map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("cannot load or attach {name}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot read the kernel's BTF (/sys/kernel/btf/vmlinux): off-CPU stacks need it (--no-stacks runs without)")]
    Btf(#[source] Box<aya::BtfError>),
    #[error("cannot list online CPUs")]
    Cpus(#[source] std::io::Error),
    #[error(transparent)]
    Tracefs(#[from] crate::tracefs::TracefsError),
    #[error("map operation on {map} failed")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
}

/// What to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackConfig {
    /// On-CPU sampling frequency per CPU (Hz).
    pub cpu_hz: u64,
    /// Record off-CPU time too (sampled by time at the same rate).
    pub off_cpu: bool,
}

impl StackConfig {
    /// Default probe set: cheap enough to leave on (49 Hz is off the 50/100 Hz
    /// beat of periodic work).
    pub const DEFAULT: Self = Self {
        cpu_hz: 49,
        off_cpu: true,
    };
    /// Deep set, for a suspect and its reference ranks over a window.
    pub const DEEP: Self = Self {
        cpu_hz: 199,
        off_cpu: true,
    };

    /// The time one on-CPU sample stands for.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.cpu_hz.max(1)
    }
}

/// Size of the kernel's per-thread off-CPU value (three u64 + a StackEvent).
const OFF_CPU_VALUE_SIZE: usize = 24 + slowrank_shared::stack::STACK_EVENT_SIZE;

/// Kernel-side counters, summed over CPUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StackCounters {
    pub ringbuf_drops: u64,
    pub on_cpu: u64,
    pub off_cpu: u64,
    pub launches: u64,
    /// Switch-outs whose stack capture was sampled away.
    pub off_cpu_skipped: u64,
    /// Records the drain thread took from the kernel but dropped because
    /// the fold fell [`MAX_DRAINED`] records behind.
    pub queue_drops: u64,
}

/// Records the drain thread holds for the fold, at most (≈ 830 bytes each:
/// ≈ 13 MiB, seconds of a deep window's launches while a first
/// symbolization holds the fold up).
pub const MAX_DRAINED: usize = 16384;

/// The drain thread's waits between drains ([`crate::cadence`]): 2 ms while
/// records come fast, up to 10 ms while few do (the fixed 2-ms sleep woke
/// it 500 times a second on an idle host). 10 ms of a deep window's
/// launch-site captures is a few hundred records, a few % of the ring.
const DRAIN_MIN: Duration = Duration::from_millis(2);
const DRAIN_MAX: Duration = Duration::from_millis(10);

/// Records taken from the kernel's ring, waiting for the fold.
#[derive(Default)]
struct Drained {
    events: Mutex<VecDeque<StackEvent>>,
    dropped: AtomicU64,
    bad: AtomicU64,
}

/// Where the fold reads records from: the kernel's ring itself, or (once
/// [`StackSampler::drain_on_thread`] ran) the queue a thread of its own
/// fills. The fold symbolizes, and a process's first symbolization reads
/// every ELF file it maps: seconds on a loaded host, while the 8 MiB ring
/// (≈ 10,000 records) overflowed (the stacks test beside two busy loops:
/// 2,568 and 4,957 records dropped in one run).
enum Ring {
    Here(RingBuf<MapData>),
    Thread(DrainThread),
}

/// The drain thread and what it fills; stopped and joined on drop.
struct DrainThread {
    drained: Arc<Drained>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for DrainThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Decodes one ring record (on-CPU samples get the sampling period).
fn decode(item: &[u8], period: u64) -> Option<StackEvent> {
    let mut ev = StackEvent::from_bytes(item)?;
    if StackKind::from_raw(ev.kind) == Some(StackKind::OnCpu) {
        ev.weight_ns = period;
    }
    Some(ev)
}

fn drain_loop(mut ring: RingBuf<MapData>, period: u64, drained: &Drained, stop: &AtomicBool) {
    let mut batch = Vec::new();
    let mut cadence = Cadence::new(DRAIN_MIN, DRAIN_MAX, bpf_maps::STACKS_BYTES as usize);
    while !stop.load(Ordering::Relaxed) {
        let mut bytes = 0;
        let mut full = false;
        while let Some(item) = ring.next() {
            bytes += item.len();
            match decode(&item, period) {
                Some(ev) => batch.push(ev),
                None => {
                    drained.bad.fetch_add(1, Ordering::Relaxed);
                }
            }
            if batch.len() >= 1024 {
                full = true;
                break;
            }
        }
        // A drain cut short by the batch size goes on at once.
        let wait = if full {
            Duration::ZERO
        } else {
            cadence.after_drain(bytes)
        };
        if batch.is_empty() {
            std::thread::sleep(wait);
            continue;
        }
        let mut q = drained.events.lock().unwrap_or_else(|p| p.into_inner());
        for ev in batch.drain(..) {
            if q.len() >= MAX_DRAINED {
                drained.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                q.push_back(ev);
            }
        }
        drop(q);
        std::thread::sleep(wait);
    }
}

/// The loaded and attached stack programs.
pub struct StackSampler {
    ebpf: Ebpf,
    ring: Ring,
    config: StackConfig,
}

/// The uprobes of one launch site ([`StackSampler::attach_launch_site`]).
#[derive(Debug)]
pub struct SiteLinks(Vec<(&'static str, UProbeLinkId)>);

fn prog_err(name: &'static str) -> impl FnOnce(ProgramError) -> StackError {
    move |e| StackError::Program {
        name,
        source: Box::new(e),
    }
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> StackError {
    move |e| StackError::Map {
        map,
        source: Box::new(e),
    }
}

impl StackSampler {
    /// Loads the programs and starts sampling (no process is followed yet).
    pub fn start(config: StackConfig) -> Result<Self, StackError> {
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .map_err(|e| StackError::Load(Box::new(e)))?;
        let period = config.period_ns();
        {
            let mut cfg: Array<_, u64> = Array::try_from(
                ebpf.map_mut(bpf_maps::STACK_CONFIG)
                    .ok_or(StackError::MissingMap(bpf_maps::STACK_CONFIG))?,
            )
            .map_err(map_err(bpf_maps::STACK_CONFIG))?;
            // Off-CPU time is emitted once per period per thread, like a sample.
            cfg.set(0, if config.off_cpu { period } else { 0 }, 0)
                .map_err(map_err(bpf_maps::STACK_CONFIG))?;
        }
        let sample: &mut PerfEvent = ebpf
            .program_mut(SAMPLE_PROG)
            .ok_or(StackError::MissingProgram(SAMPLE_PROG))?
            .try_into()
            .map_err(prog_err(SAMPLE_PROG))?;
        sample.load().map_err(prog_err(SAMPLE_PROG))?;
        let cpus = aya::util::online_cpus().map_err(|(_, e)| StackError::Cpus(e))?;
        for cpu in cpus {
            sample
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(config.cpu_hz),
                    false,
                )
                .map_err(prog_err(SAMPLE_PROG))?;
        }
        if config.off_cpu {
            // A BTF tracepoint: the kernel's BTF types its arguments (the
            // two tasks), and no classic trace record is built per switch.
            let btf = Btf::from_sys_fs().map_err(|e| StackError::Btf(Box::new(e)))?;
            let switch: &mut BtfTracePoint = ebpf
                .program_mut(SWITCH_PROG)
                .ok_or(StackError::MissingProgram(SWITCH_PROG))?
                .try_into()
                .map_err(prog_err(SWITCH_PROG))?;
            switch
                .load("sched_switch", &btf)
                .map_err(prog_err(SWITCH_PROG))?;
            switch.attach().map_err(prog_err(SWITCH_PROG))?;
        }
        let ring = RingBuf::try_from(
            ebpf.take_map(bpf_maps::STACKS)
                .ok_or(StackError::MissingMap(bpf_maps::STACKS))?,
        )
        .map_err(map_err(bpf_maps::STACKS))?;
        Ok(Self {
            ebpf,
            ring: Ring::Here(ring),
            config,
        })
    }

    /// Moves the draining of the kernel's ring to a thread of its own, so
    /// a slow fold (a first symbolization) does not make the ring overflow;
    /// [`StackSampler::drain`] then takes what that thread drained. If the
    /// thread cannot start, records are drained here as before.
    pub fn drain_on_thread(&mut self) {
        let drained = Arc::new(Drained::default());
        let stop = Arc::new(AtomicBool::new(false));
        let period = self.config.period_ns();
        if matches!(self.ring, Ring::Thread(_)) {
            return;
        }
        // A stand-in with flags of its own: dropped when replaced, it
        // must not stop the real thread.
        let ring = std::mem::replace(
            &mut self.ring,
            Ring::Thread(DrainThread {
                drained: Arc::default(),
                stop: Arc::default(),
                thread: None,
            }),
        );
        let Ring::Here(ring) = ring else {
            unreachable!("checked above");
        };
        let (d, st) = (drained.clone(), stop.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("slowrank-stackring".into())
            .spawn(move || {
                // The ring comes back if the caller is gone (cannot happen).
                let ring: RingBuf<MapData> = match rx.recv() {
                    Ok(r) => r,
                    Err(_) => return,
                };
                drain_loop(ring, period, &d, &st);
            });
        match spawned {
            Ok(t) => {
                tx.send(ring).expect("the drain thread waits for its ring");
                self.ring = Ring::Thread(DrainThread {
                    drained,
                    stop,
                    thread: Some(t),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the stack ring's drain thread: draining with the fold");
                self.ring = Ring::Here(ring);
            }
        }
    }

    pub fn config(&self) -> StackConfig {
        self.config
    }

    /// Records launch sites of `cudart` (exact path from /proc/PID/maps) for
    /// process `pid` only or (None) every process mapping it: a uprobe on
    /// `cudaLaunchKernel` (stack + kernel pointer) and an entry/return pair
    /// on each CUDA sync call ([`SYNC_SYMBOLS`]: when the GPU is known to
    /// have drained). Deep set. All or nothing: on an error what was
    /// attached is detached again.
    pub fn attach_launch_site(
        &mut self,
        cudart: &Path,
        pid: Option<u32>,
    ) -> Result<SiteLinks, StackError> {
        let mut links = SiteLinks(Vec::new());
        let mut plan: Vec<(&'static str, &'static str)> = vec![(LAUNCH_PROG, "cudaLaunchKernel")];
        for name in [SYNC_CALL_PROG, SYNC_RETURN_PROG] {
            plan.extend(SYNC_SYMBOLS.iter().map(|sym| (name, *sym)));
        }
        for (name, sym) in plan {
            if let Err(e) = self.attach_site_probe(name, sym, cudart, pid, &mut links) {
                self.detach_launch_site(links);
                return Err(e);
            }
        }
        Ok(links)
    }

    fn attach_site_probe(
        &mut self,
        name: &'static str,
        sym: &'static str,
        cudart: &Path,
        pid: Option<u32>,
        links: &mut SiteLinks,
    ) -> Result<(), StackError> {
        let prog: &mut UProbe = self
            .ebpf
            .program_mut(name)
            .ok_or(StackError::MissingProgram(name))?
            .try_into()
            .map_err(prog_err(name))?;
        if prog.fd().is_err() {
            prog.load().map_err(prog_err(name))?;
        }
        let link = crate::probes::attach_one(
            &mut self.ebpf,
            name,
            cudart,
            UProbeAttachLocation::Symbol(sym),
            0,
            pid,
        )
        .map_err(prog_err(name))?;
        links.0.push((name, link));
        Ok(())
    }

    /// Detaches one launch site's probes: its launches stop trapping. A
    /// detach that fails is logged; the link goes anyway.
    pub fn detach_launch_site(&mut self, links: SiteLinks) {
        for (name, link) in links.0 {
            let Some(prog) = self.ebpf.program_mut(name) else {
                continue;
            };
            if let Ok(p) = <&mut UProbe>::try_from(prog) {
                if let Err(e) = p.detach(link) {
                    tracing::warn!(program = name, error = %e, "detaching a deep stack probe failed");
                }
            }
        }
    }

    /// Starts recording stacks of process `pid`.
    pub fn follow(&mut self, pid: u32, rank: u32) -> Result<(), StackError> {
        let mut map: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::STACK_PIDS)
                .ok_or(StackError::MissingMap(bpf_maps::STACK_PIDS))?,
        )
        .map_err(map_err(bpf_maps::STACK_PIDS))?;
        map.insert(pid, rank, 0)
            .map_err(map_err(bpf_maps::STACK_PIDS))
    }

    /// Stops recording `pid` (e.g. it exited).
    pub fn unfollow(&mut self, pid: u32) -> Result<(), StackError> {
        let mut map: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(bpf_maps::STACK_PIDS)
                .ok_or(StackError::MissingMap(bpf_maps::STACK_PIDS))?,
        )
        .map_err(map_err(bpf_maps::STACK_PIDS))?;
        match map.remove(&pid) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(bpf_maps::STACK_PIDS)(e)),
        }
    }

    /// Moves pending records into `out` (on-CPU samples get the sampling
    /// period as weight). Returns (records, records of the wrong size).
    pub fn drain(&mut self, out: &mut Vec<StackEvent>) -> (usize, usize) {
        let (mut n, mut bad) = (0, 0);
        let period = self.config.period_ns();
        match &mut self.ring {
            Ring::Here(ring) => {
                while let Some(item) = ring.next() {
                    match decode(&item, period) {
                        Some(ev) => {
                            out.push(ev);
                            n += 1;
                        }
                        None => bad += 1,
                    }
                }
            }
            Ring::Thread(DrainThread { drained, .. }) => {
                let mut q = drained.events.lock().unwrap_or_else(|p| p.into_inner());
                n = q.len();
                out.extend(q.drain(..));
                bad = drained.bad.swap(0, Ordering::Relaxed) as usize;
            }
        }
        (n, bad)
    }

    /// Threads with off-CPU state held in the kernel (exited threads free
    /// theirs on their last context switch).
    pub fn off_cpu_threads(&self) -> Result<usize, StackError> {
        let map = self
            .ebpf
            .map(bpf_maps::OFF_CPU)
            .ok_or(StackError::MissingMap(bpf_maps::OFF_CPU))?;
        let keys: HashMap<_, u64, [u8; OFF_CPU_VALUE_SIZE]> =
            HashMap::try_from(map).map_err(map_err(bpf_maps::OFF_CPU))?;
        Ok(keys.keys().filter(Result::is_ok).count())
    }

    /// Reads the kernel-side counters.
    pub fn counters(&self) -> Result<StackCounters, StackError> {
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map(bpf_maps::STACK_COUNTERS)
                .ok_or(StackError::MissingMap(bpf_maps::STACK_COUNTERS))?,
        )
        .map_err(map_err(bpf_maps::STACK_COUNTERS))?;
        let sum = |i: u32| -> Result<u64, StackError> {
            Ok(arr
                .get(&i, 0)
                .map_err(map_err(bpf_maps::STACK_COUNTERS))?
                .iter()
                .sum())
        };
        Ok(StackCounters {
            ringbuf_drops: sum(stack_counter::RINGBUF_DROPS)?,
            on_cpu: sum(stack_counter::ON_CPU)?,
            off_cpu: sum(stack_counter::OFF_CPU)?,
            launches: sum(stack_counter::LAUNCH)?,
            off_cpu_skipped: sum(stack_counter::OFF_CPU_SKIPPED)?,
            queue_drops: match &self.ring {
                Ring::Here(_) => 0,
                Ring::Thread(t) => t.drained.dropped.load(Ordering::Relaxed),
            },
        })
    }
}

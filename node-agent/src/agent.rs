//! The agent's core loop pieces, without I/O policy: discover ranks, attach
//! the probe sets to their libraries, drain and fold events, and cut what
//! was folded into a [`Batch`]. `main.rs` drives it on timers; `doctor` and
//! the tests drive it directly.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use slowrank_shared::{
    probe::CallKind,
    wire::{Batch, CallRecord},
};

use crate::{
    budget::{self, CostSample, Sampler},
    catalog::{self, Role},
    clock::{self, HostClock},
    commlayout::{self, CommLayout},
    discover::{self, DiscoverError, LibKind, Scanner},
    fold::{FoldDrops, Folder, Limits},
    probes::{ProbeError, Probes, RawEvent},
    sched::SchedStat,
    selfcost::{CountWindow, HitLedger, TrapCost},
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Discover(#[from] DiscoverError),
}

/// How one function of one library fared.
#[derive(Debug, Clone)]
pub struct SymbolStatus {
    pub symbol: &'static str,
    /// Probe id, or why it is not attached.
    pub result: Result<u32, String>,
    /// A windowed counter: attached only in deep windows and launch
    /// samples (`result` is its state when the status was taken).
    pub windowed: bool,
}

/// A launch/memcpy/malloc counter of one library file: attached only while
/// counting is on (deep windows, launch samples), because it traps on every
/// call the rank makes.
#[derive(Debug, Clone)]
struct Windowed {
    path: PathBuf,
    spec: catalog::ProbeSpec,
    id: Option<u32>,
}

/// A library file the agent found and what it attached there.
#[derive(Debug, Clone)]
pub struct LibStatus {
    pub kind: LibKind,
    pub path: PathBuf,
    pub symbols: Vec<SymbolStatus>,
    /// Pids that map it (from /proc/PID/maps), as last seen.
    pub mapped_by: Vec<u32>,
}

/// Why a windowed counter shows as not attached.
const WINDOWED_OFF: &str = "windowed: attached in deep windows and launch samples only";

/// Splits given up on after this long without an answer (it was a count of
/// polls, 2,000 of 5 ms; the polls' period follows the traffic now).
const SPLIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A pending split is shipped for the coordinator to work out once the
/// layout has learnt nothing new for this long: only another init can
/// teach it more, and a job makes its inits at start-up. The coordinator
/// parks the split's collectives until its size is known, and records
/// released after their iterations were sealed are lost to the verdicts:
/// a 10-s wait cost a pp2 × dp4 job on one rank per host 24 of its first
/// iterations on two of its four pipelines (eval seed 9241, spec 8).
const SPLIT_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// A rank's `/proc/PID/maps`, as last read.
struct MapsRead {
    vsize: u64,
    scan: u64,
    libs: Vec<(LibKind, PathBuf)>,
}

/// Scans between reads of a rank's maps when its vsize did not move (20
/// scans of the default 50 ms: a second).
const MAPS_RECHECK_SCANS: u64 = 20;
/// Under `--deep`, launch counting runs the budget's share
/// ([`Sampler::deep_window`]) of each period this long: the coordinator's
/// long window (`serve --deep-window`).
const DEEP_COUNT_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

pub struct Agent {
    probes: Probes,
    scanner: Scanner,
    folder: Folder,
    clock: HostClock,
    libs: BTreeMap<PathBuf, LibStatus>,
    layout: CommLayout,
    /// When each pending split was first tried.
    split_tries: HashMap<(u32, u64), std::time::Instant>,
    /// When an init last taught the communicator layout something.
    layout_learnt_at: std::time::Instant,
    /// Raw calls of user-given `--probe` functions.
    calls: Vec<CallRecord>,
    generic: Vec<bool>,
    events: Vec<RawEvent>,
    bad_events: u64,
    /// Entry events seen per probe id (doctor).
    hits: Vec<u64>,
    scans: u64,
    /// Libraries each rank mapped at its last `/proc/PID/maps` read.
    maps_read: std::collections::HashMap<u32, MapsRead>,
    seq: u64,
    /// Provider functions found through `ibv_context.ops`: (file, offset,
    /// role) → probe id while attached.
    deep_targets: BTreeMap<(PathBuf, u64, DeepFn), Option<u32>>,
    deep: Deep,
    windowed: Vec<Windowed>,
    counting: CountWindow,
    ledger: HitLedger,
    own_cpu: crate::selfcost::OwnCpu,
    trap: Option<TrapCost>,
    sampler: Sampler,
    /// Start and length of the current deep window, for its budgeted
    /// share of launch counting.
    deep_count: Option<(std::time::Instant, std::time::Duration)>,
    /// Until when launch counting runs in the coordinator's deep windows:
    /// what the overhead budget's ledger granted them.
    window_counting_until: Option<std::time::Instant>,
    /// Latest in-kernel counts per process, kept after it exits (run totals).
    class_totals: BTreeMap<u32, [u64; slowrank_shared::probe::cuda_count::SLOTS]>,
    /// The state file a restarted agent takes the communicators over from.
    takeover: Option<Takeover>,
}

/// The agent's side of [`crate::takeover`]: the file, what the previous
/// agent left in it, and what this one has announced since.
struct Takeover {
    path: PathBuf,
    host: String,
    /// Left by the previous agent, for the ranks not yet found again.
    left: crate::takeover::Saved,
    /// Final communicator records by (pid, communicator id).
    records: BTreeMap<(u32, u64), slowrank_shared::wire::CommRecord>,
    /// [`Folder::comm_changes`] at the last successful write.
    written: u64,
    /// The last write failed (said once until one succeeds).
    failing: bool,
}

/// Which provider function a deep target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeepFn {
    PostSend,
    PollCq,
}

/// Whether the deep probe set is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deep {
    Off,
    On,
    Until(std::time::Instant),
}

impl Agent {
    pub fn new(probes: Probes, scanner: Scanner, clock: HostClock, limits: Limits) -> Self {
        Self {
            probes,
            scanner,
            folder: Folder::new(clock, limits),
            clock,
            libs: BTreeMap::new(),
            layout: CommLayout::default(),
            split_tries: HashMap::new(),
            layout_learnt_at: std::time::Instant::now(),
            calls: Vec::new(),
            generic: Vec::new(),
            events: Vec::new(),
            bad_events: 0,
            hits: Vec::new(),
            scans: 0,
            maps_read: std::collections::HashMap::new(),
            seq: 0,
            deep_targets: BTreeMap::new(),
            deep: Deep::Off,
            windowed: Vec::new(),
            counting: CountWindow::default(),
            ledger: HitLedger::default(),
            own_cpu: crate::selfcost::OwnCpu::start(),
            trap: None,
            class_totals: BTreeMap::new(),
            deep_count: None,
            window_counting_until: None,
            sampler: Self::default_sampler(0.0),
            takeover: None,
        }
    }

    /// Keeps the communicator tables in `dir` and takes over those a
    /// previous agent of `host` left there ([`crate::takeover`]). Returns
    /// how many rank processes the previous agent left.
    pub fn keep_state(
        &mut self,
        dir: &Path,
        host: &str,
    ) -> Result<usize, crate::takeover::TakeoverError> {
        std::fs::create_dir_all(dir).map_err(|source| crate::takeover::TakeoverError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let path = crate::takeover::path(dir, host);
        let left = crate::takeover::load(&path)?;
        let n = left.procs.len();
        self.takeover = Some(Takeover {
            path,
            host: host.to_owned(),
            left,
            records: BTreeMap::new(),
            written: 0,
            failing: false,
        });
        Ok(n)
    }

    /// Takes over what the previous agent knew of a rank just found.
    fn take_over(&mut self, pid: u32, rank: u32) {
        let Some(t) = self.takeover.as_mut() else {
            return;
        };
        let Some(saved) =
            crate::takeover::start_ticks(pid).and_then(|start| t.left.take(pid, start))
        else {
            return;
        };
        let n = self.folder.take_over(&saved);
        tracing::info!(
            pid,
            rank,
            communicators = n,
            "took over the communicators the previous agent knew: their collectives resume, numbered again from here"
        );
    }

    /// Rewrites the state file when a communicator table changed; a failed
    /// write (a full disk) is said once and tried again at the next cut.
    fn save_state(&mut self, comms: &[slowrank_shared::wire::CommRecord], exits: &[u32]) {
        let Some(t) = self.takeover.as_mut() else {
            return;
        };
        for c in comms {
            if c.nranks > 0 && c.comm_id != 0 {
                t.records.insert((c.pid, c.comm_id), c.clone());
            }
        }
        for pid in exits {
            t.records.retain(|(p, _), _| p != pid);
        }
        let changes = self.folder.comm_changes();
        if changes == t.written {
            return;
        }
        let saved = crate::takeover::build(
            &t.host,
            self.folder.comm_tables(),
            &t.records,
            crate::takeover::start_ticks,
        );
        match crate::takeover::save(&t.path, &saved) {
            Ok(()) => {
                t.written = changes;
                t.failing = false;
            }
            Err(e) if !t.failing => {
                t.failing = true;
                tracing::warn!(error = %e, "cannot keep the communicator tables: an agent restarted now could not resume this host's collectives (tried again at every batch)");
            }
            Err(_) => {}
        }
    }

    /// Launch sampling with the default period, window and budget, for a
    /// host whose counted call costs `entry_ns`.
    pub fn default_sampler(entry_ns: f64) -> Sampler {
        Sampler::new(
            budget::DEFAULT_MAX_OVERHEAD,
            std::time::Duration::from_secs(budget::DEFAULT_PERIOD_S),
            std::time::Duration::from_secs(budget::DEFAULT_WINDOW_S),
            entry_ns,
        )
    }

    /// This host's measured trap cost ([`crate::selfcost::measure`]) and the
    /// launch sampling under the overhead budget. Without a trap cost the
    /// agent reports hits but no cost, and the budget cannot narrow.
    pub fn set_cost_model(&mut self, trap: Option<TrapCost>, sampler: Sampler) {
        self.trap = trap;
        self.sampler = sampler;
    }

    pub fn trap_cost(&self) -> Option<TrapCost> {
        self.trap
    }

    /// The overhead budget's current plan.
    pub fn budget_plan(&self) -> budget::Plan {
        self.sampler.plan()
    }

    pub fn probes_mut(&mut self) -> &mut Probes {
        &mut self.probes
    }

    pub fn scanner_mut(&mut self) -> &mut Scanner {
        &mut self.scanner
    }

    pub fn libs(&self) -> impl Iterator<Item = &LibStatus> {
        self.libs.values()
    }

    pub fn ranks(&self) -> impl Iterator<Item = &discover::Rank> {
        self.scanner.ranks()
    }

    pub fn drops(&self) -> FoldDrops {
        self.folder.drops()
    }

    /// Attaches a user-given generic probe (raw calls shipped as-is).
    pub fn attach_generic(&mut self, path: &Path, symbol: &str) -> Result<u32, ProbeError> {
        let id = self.probes.attach(path, symbol)?;
        self.folder.set_role(id, Role::Generic);
        self.mark_generic(id, true);
        Ok(id)
    }

    fn mark_generic(&mut self, id: u32, g: bool) {
        let i = id as usize;
        if self.generic.len() <= i {
            self.generic.resize(i + 1, false);
        }
        self.generic[i] = g;
    }

    /// One discovery pass: new ranks are followed and their libraries
    /// probed; ranks that went away are unfollowed and reported; libraries
    /// mapped since the last pass (dlopen) are probed.
    pub fn scan(&mut self) -> Result<(), AgentError> {
        let now = clock::mono_ns();
        let execs = self.probes.take_execs();
        let changes = self.scanner.scan_with_execs(now, execs.as_deref())?;
        tracing::trace!(
            execs = ?execs.as_ref().map(Vec::len),
            new = changes.new.len(),
            gone = changes.gone.len(),
            took_us = (clock::mono_ns().saturating_sub(now)) / 1000,
            "discovery pass"
        );
        self.folder.expire_limbo(now);
        for pid in changes.foreign {
            self.probes.unwatch(pid)?;
            self.folder.forget_limbo(pid);
        }
        self.scans += 1;
        if self.scans.is_multiple_of(20) {
            self.probes
                .prune_tree(&|pid| Path::new(&format!("/proc/{pid}")).exists())?;
        }
        if !changes.gone.is_empty() {
            // Their final launch counts, before the counters are forgotten.
            self.poll();
            let counts = self.probes.cuda_counts()?;
            self.folder.launch_counts(&counts);
            // Their last hits too, before the unfollow drops them.
            self.ledger.counts(&counts);
            self.ledger.hits(&self.probes.followed_hits()?);
            self.class_totals.extend(counts.iter().copied());
        }
        for r in changes.gone {
            let pid = r.identity.pid;
            self.probes.unfollow(pid)?;
            self.probes.forget_counts(pid)?;
            self.folder.remove_rank(pid, now);
            tracing::info!(pid, rank = r.identity.rank, "rank process ended");
        }
        for r in changes.new {
            let id = &r.identity;
            tracing::info!(
                pid = id.pid,
                rank = id.rank,
                local_rank = id.local_rank,
                restart = id.restart_count,
                "found rank process"
            );
            self.probes.follow(id.pid, Some(id.rank))?;
            self.folder.add_rank(id.clone(), now);
            self.take_over(id.pid, id.rank);
            if !self.windowed.is_empty() {
                // The job runs: its first launch sample a moment from now.
                self.sampler.arm(now);
            }
            // Before the job dlopens them: the files its loader will find.
            for (kind, path) in discover::library_path_libs(&r.lib_dirs) {
                self.attach_lib(kind, &path);
            }
        }
        let ranks: Vec<(u32, u64)> = self
            .scanner
            .ranks()
            .map(|r| (r.identity.pid, r.vsize))
            .collect();
        self.maps_read
            .retain(|pid, _| ranks.iter().any(|r| r.0 == *pid));
        for lib in self.libs.values_mut() {
            lib.mapped_by.clear();
        }
        for (pid, vsize) in ranks {
            // A rank's maps are long (every shared object of a PyTorch
            // process): read again when a mapping came or went, and once a
            // second whatever vsize says.
            let fresh = match self.maps_read.get(&pid) {
                Some(m) => {
                    m.vsize != vsize || vsize == 0 || self.scans - m.scan >= MAPS_RECHECK_SCANS
                }
                None => true,
            };
            if fresh {
                let libs = discover::mapped_libs(pid);
                self.maps_read.insert(
                    pid,
                    MapsRead {
                        vsize,
                        scan: self.scans,
                        libs,
                    },
                );
            }
            let libs = self.maps_read[&pid].libs.clone();
            for (kind, path) in libs {
                self.attach_lib(kind, &path);
                if let Some(l) = self.libs.get_mut(&path) {
                    l.mapped_by.push(pid);
                }
            }
        }
        Ok(())
    }

    /// Probes a library file before any rank maps it (`--lib`); an error
    /// when the name is not one the agent knows.
    pub fn preattach(&mut self, path: &Path) -> Result<(), String> {
        let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let kind = LibKind::of(path)
            .or_else(|| LibKind::of(&real))
            .ok_or_else(|| {
                format!(
                    "{}: not a library the agent probes (libnccl.so*, libcudart.so*)",
                    path.display()
                )
            })?;
        self.attach_lib(kind, &real);
        Ok(())
    }

    /// Attaches the default probe set of a library file once.
    fn attach_lib(&mut self, kind: LibKind, path: &Path) {
        if self.libs.contains_key(path) {
            return;
        }
        let exported = match catalog::exported(path) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the library's symbols");
                Vec::new()
            }
        };
        let mut symbols = Vec::new();
        for spec in catalog::default_set(kind) {
            let windowed = spec.role == Role::Count;
            let result = if !exported.iter().any(|s| s == spec.symbol) {
                Err("not exported by this library".to_owned())
            } else if windowed {
                self.windowed.push(Windowed {
                    path: path.to_owned(),
                    spec: *spec,
                    id: None,
                });
                // Probed before any rank maps it (--lib, LD_LIBRARY_PATH):
                // a job is starting.
                self.sampler.arm(clock::mono_ns());
                Err(WINDOWED_OFF.to_owned())
            } else {
                match self.probes.attach_as(path, spec.symbol, spec.how) {
                    Ok(id) => {
                        self.folder.set_role(id, spec.role);
                        self.mark_generic(id, false);
                        Ok(id)
                    }
                    Err(e) => {
                        let msg = error_chain(&e);
                        tracing::warn!(symbol = spec.symbol, path = %path.display(), error = %msg, "attach failed");
                        Err(msg)
                    }
                }
            };
            symbols.push(SymbolStatus {
                symbol: spec.symbol,
                result,
                windowed,
            });
        }
        let attached = symbols.iter().filter(|s| s.result.is_ok()).count();
        tracing::info!(path = %path.display(), ?kind, attached, "probed library");
        self.libs.insert(
            path.to_owned(),
            LibStatus {
                kind,
                path: path.to_owned(),
                symbols,
                mapped_by: Vec::new(),
            },
        );
        if self.windowed.iter().any(|w| w.id.is_some()) {
            // Counting now: this file's counters join in.
            self.attach_windowed();
        }
    }

    /// Attaches the windowed counters while a deep window or a launch
    /// sample runs, detaches them otherwise. Detached, they cost nothing: an
    /// attached uprobe traps even when its program returns at once.
    /// Detaching runs on a helper thread (seconds for the set on a loaded
    /// VM; the launch symbols go first). Counted time ends when it starts:
    /// it is the launch rate's denominator, while the traps of counters not
    /// yet gone are still counted as hits, so the cost stays right.
    fn update_counting(&mut self) {
        let in_deep = match self.deep {
            Deep::Off => false,
            // `--deep`: launch counting runs the budget's share of every
            // long window, as it does in the windows a coordinator opens
            // (the verbs probes stay on throughout).
            Deep::On => self.deep_count.is_some_and(|(start, period)| {
                self.sampler
                    .counting_in_lasting_deep(start.elapsed(), period)
            }),
            // What the budget's ledger granted the windows.
            Deep::Until(_) => self
                .window_counting_until
                .is_some_and(|u| std::time::Instant::now() < u),
        };
        let want = self.sampler.sampling(clock::mono_ns()) || in_deep;
        let attached = self.windowed.iter().any(|w| w.id.is_some());
        if want && !attached {
            self.attach_windowed();
            if self.windowed.iter().any(|w| w.id.is_some()) {
                self.counting.set(true, clock::mono_ns());
                tracing::info!("launch counters attached (deep window or launch sample)");
            }
        } else if !want && attached {
            let ids: Vec<u32> = self
                .windowed
                .iter_mut()
                .filter_map(|w| w.id.take())
                .collect();
            drop(self.probes.detach_background(&ids));
            self.counting.set(false, clock::mono_ns());
            self.set_windowed_status();
            tracing::info!("launch counters detaching");
        }
    }

    fn attach_windowed(&mut self) {
        for i in 0..self.windowed.len() {
            if self.windowed[i].id.is_some() {
                continue;
            }
            let (path, spec) = (self.windowed[i].path.clone(), self.windowed[i].spec);
            match self.probes.attach_as(&path, spec.symbol, spec.how) {
                Ok(id) => {
                    self.folder.set_role(id, spec.role);
                    self.mark_generic(id, false);
                    self.windowed[i].id = Some(id);
                }
                Err(e) => {
                    tracing::warn!(symbol = spec.symbol, path = %path.display(), error = %error_chain(&e), "launch counter not attached")
                }
            }
        }
        self.set_windowed_status();
    }

    /// Mirrors the windowed counters' state into the library status (doctor).
    fn set_windowed_status(&mut self) {
        for w in &self.windowed {
            if let Some(l) = self.libs.get_mut(&w.path) {
                if let Some(s) = l.symbols.iter_mut().find(|s| s.symbol == w.spec.symbol) {
                    s.result = w.id.ok_or_else(|| WINDOWED_OFF.to_owned());
                }
            }
        }
    }

    /// Drains the ring buffer into the fold. Cheap; call often.
    /// Drains the event ring and feeds the fold; returns the bytes of the
    /// ring the drain read (for the wait before the next, [`crate::cadence`]).
    pub fn poll(&mut self) -> usize {
        let drained = self.probes.drain_raw(&mut self.events);
        self.bad_events += drained.bad as u64;
        let mut events = std::mem::take(&mut self.events);
        events.retain(|e| {
            let c = e.call();
            if CallKind::from_raw(c.kind) == Some(CallKind::Entry) {
                let i = c.probe as usize;
                if self.hits.len() <= i {
                    self.hits.resize(i + 1, 0);
                }
                self.hits[i] += 1;
            }
            if self.generic.get(c.probe as usize).copied().unwrap_or(false) {
                self.calls.push(CallRecord {
                    ts_ns: self.clock.map(c.ts_ns),
                    pid: c.pid,
                    tid: c.tid,
                    probe: c.probe,
                    is_return: CallKind::from_raw(c.kind) == Some(CallKind::Return),
                    args: c.args,
                    ret: c.ret,
                });
                false
            } else {
                true
            }
        });
        self.folder.feed(&mut events);
        events.clear();
        self.events = events;
        self.resolve_splits(false);
        self.find_provider_functions();
        if let Deep::Until(t) = self.deep {
            if std::time::Instant::now() >= t {
                self.set_deep(Deep::Off);
            }
        }
        self.update_counting();
        drained.bytes
    }

    /// Switches the deep probe set (the verbs provider's post_send/poll_cq)
    /// on, off, or on until a deadline. Attaching and detaching uprobes is
    /// slow (a kernel synchronisation each), so windows should be seconds,
    /// not milliseconds.
    pub fn set_deep(&mut self, deep: Deep) {
        if deep == Deep::On && self.deep != Deep::On {
            self.deep_count = Some((std::time::Instant::now(), DEEP_COUNT_PERIOD));
        }
        self.deep = deep;
        let on = deep != Deep::Off;
        let keys: Vec<(PathBuf, u64, DeepFn)> = self.deep_targets.keys().cloned().collect();
        for key in keys {
            let attached = self.deep_targets[&key];
            match (on, attached) {
                (true, None) => {
                    let (how, role) = match key.2 {
                        DeepFn::PostSend => (crate::probes::Attach::VerbsPostSend, Role::PostSend),
                        DeepFn::PollCq => (crate::probes::Attach::VerbsPollCq, Role::PollCq),
                    };
                    match self.probes.attach_offset(&key.0, key.1, how) {
                        Ok(id) => {
                            self.folder.set_role(id, role);
                            self.mark_generic(id, false);
                            tracing::info!(path = %key.0.display(), offset = key.1, func = ?key.2, probe = id, "deep probe attached");
                            self.deep_targets.insert(key, Some(id));
                        }
                        Err(e) => {
                            tracing::warn!(path = %key.0.display(), offset = key.1, error = %error_chain(&e), "deep probe not attached")
                        }
                    }
                }
                (false, Some(id)) => {
                    // Off the loop's thread: a poll_cq probe still attached
                    // a moment longer costs less than a stalled drain.
                    drop(self.probes.detach_background(&[id]));
                    self.deep_targets.insert(key, None);
                }
                _ => {}
            }
        }
        // GPU-side attribution needs every post from here on.
        let posts_seen = self
            .deep_targets
            .iter()
            .any(|(k, id)| k.2 == DeepFn::PostSend && id.is_some());
        self.folder.set_deep(on && posts_seen, clock::mono_ns());
        self.update_counting();
    }

    /// Opens a deep window of `dur` from now (the control stream's entry
    /// point; `--deep` keeps it open for good). The launch counters run in
    /// it too, for as much of it as the overhead budget allows: the verbs
    /// probes are the coordinator's evidence and keep the whole window.
    pub fn open_deep_window(&mut self, dur: std::time::Duration) {
        if self.deep == Deep::On {
            // `--deep` keeps the set on for good; a window would end it.
            return;
        }
        let now = std::time::Instant::now();
        // A renewal asks only for what runs past the counting granted
        // before.
        let left = self
            .window_counting_until
            .map_or(std::time::Duration::ZERO, |u| {
                u.saturating_duration_since(now)
            });
        let granted = left
            + self
                .sampler
                .deep_window(clock::mono_ns(), dur.saturating_sub(left));
        if granted < dur {
            tracing::warn!(
                window_s = dur.as_secs_f64(),
                launch_counting_s = granted.as_secs_f64(),
                "overhead budget: launch counting in the deep window shortened (counting would cost more than --max-overhead; the budget's ledger grants what it earned)"
            );
        }
        self.window_counting_until = Some(now + granted);
        self.deep_count = Some((now, dur));
        self.set_deep(Deep::Until(std::time::Instant::now() + dur));
    }

    /// A deep window the coordinator opened is running (not `--deep`).
    pub fn in_deep_window(&self) -> bool {
        matches!(self.deep, Deep::Until(t) if t > std::time::Instant::now())
    }

    /// Deep targets found so far: (file, offset, function, attached probe).
    pub fn deep_targets(&self) -> Vec<(PathBuf, u64, DeepFn, Option<u32>)> {
        self.deep_targets
            .iter()
            .map(|((p, o, f), id)| (p.clone(), *o, *f, *id))
            .collect()
    }

    /// QPs of `pid` mapped to a peer (qp_num, dest_qp_num, dlid).
    /// (pid, tid) of the threads seen issuing collectives.
    pub fn issuing_threads(&self) -> Vec<(u32, u32)> {
        self.folder.issuing_threads()
    }

    pub fn qp_peers(&self, pid: u32) -> Vec<(u32, u32, u16)> {
        self.folder.qp_peers(pid)
    }

    /// Reads the ops table of every newly opened verbs context (Trap 2:
    /// `ibv_post_send`/`ibv_poll_cq` are inline and jump through it) and
    /// turns the function pointers into (file, offset) targets.
    fn find_provider_functions(&mut self) {
        let contexts = self.folder.take_contexts();
        if contexts.is_empty() {
            return;
        }
        let mut added = false;
        for (pid, ctx) in contexts {
            for (off, func) in [
                (catalog::CTX_POST_SEND_OFF, DeepFn::PostSend),
                (catalog::CTX_POLL_CQ_OFF, DeepFn::PollCq),
            ] {
                let Some(addr) = commlayout::read_object(pid, ctx + off).and_then(|b| {
                    b.get(..8)
                        .map(|w| u64::from_le_bytes(w.try_into().expect("8")))
                }) else {
                    tracing::warn!(pid, ctx, "cannot read the verbs context's ops table");
                    continue;
                };
                match discover::file_offset(pid, addr) {
                    Some((path, offset)) => {
                        if !self
                            .deep_targets
                            .contains_key(&(path.clone(), offset, func))
                        {
                            tracing::info!(pid, path = %path.display(), offset, ?func, "verbs provider function found through ibv_context.ops");
                            self.deep_targets.insert((path, offset, func), None);
                            added = true;
                        }
                    }
                    None => tracing::warn!(pid, addr, "provider function not in a mapped file"),
                }
            }
        }
        if added && self.deep != Deep::Off {
            self.set_deep(self.deep);
        }
    }

    /// Learns the communicator layout from new inits and completes pending
    /// splits. Objects are read while the process is surely alive (right
    /// after the call); `last` gives up on what is still ambiguous.
    fn resolve_splits(&mut self, last: bool) {
        let inits = self.folder.take_inits();
        if !inits.is_empty() {
            self.layout_learnt_at = std::time::Instant::now();
        }
        for (pid, ptr, rank, nranks) in inits {
            match self.folder.snapshot(pid, ptr) {
                Some(bytes) => self.layout.learn_bytes(bytes, rank, nranks),
                None => self.layout.learn(pid, ptr, rank, nranks),
            }
        }
        self.folder.fill_split_snapshots();
        type Done = (u32, u64, Option<(u32, u32)>);
        let mut done: Vec<Done> = Vec::new();
        for s in self.folder.pending_splits().iter_mut() {
            if s.snapshot.is_none() {
                s.snapshot = commlayout::read_object(s.pid, s.comm_ptr);
                if s.snapshot.is_none() {
                    tracing::debug!(
                        pid = s.pid,
                        ptr = s.comm_ptr,
                        "cannot read a split communicator object"
                    );
                }
            }
            let found = s.snapshot.as_deref().and_then(|m| self.layout.decode(m));
            let since = *self
                .split_tries
                .entry((s.pid, s.comm_ptr))
                .or_insert_with(std::time::Instant::now);
            let quiet =
                since.elapsed() >= SPLIT_QUIET && self.layout_learnt_at.elapsed() >= SPLIT_QUIET;
            if found.is_some() || last || quiet || since.elapsed() >= SPLIT_WAIT {
                done.push((s.pid, s.comm_ptr, found));
            }
        }
        for (pid, ptr, found) in done {
            self.split_tries.remove(&(pid, ptr));
            if found.is_none() {
                tracing::info!(pid, ptr, candidates = ?self.layout.candidates(), "cannot read a split communicator's size here: shipped for the coordinator to work out from every member's color and key");
            }
            self.folder.resolve_split(pid, ptr, found);
        }
    }

    /// Before the last cut: splits still ambiguous are given up (counted).
    pub fn finish(&mut self) {
        self.poll();
        self.resolve_splits(true);
    }

    /// Folds what is pending and cuts a batch (None when there is nothing
    /// to say). `close_interval` also closes the per-rank interval counters.
    pub fn cut(
        &mut self,
        host: &str,
        agent_id: &str,
        close_interval: bool,
        spool_drops: u64,
    ) -> Result<Option<Batch>, AgentError> {
        self.poll();
        let counts = self.probes.cuda_counts()?;
        self.folder.launch_counts(&counts);
        self.ledger.counts(&counts);
        self.class_totals.extend(counts.iter().copied());
        let now = clock::mono_ns();
        if close_interval {
            self.folder
                .close_intervals(now, |pid| SchedStat::read(pid).ok());
        }
        let mut folded = self.folder.take();
        let exited: Vec<u32> = folded.exits.iter().map(|e| e.pid).collect();
        self.save_state(&folded.comms, &exited);
        if !folded.intervals.is_empty() {
            self.ledger.hits(&self.probes.followed_hits()?);
            let counted = if close_interval {
                self.counting.take(now)
            } else {
                0
            };
            self.account(&mut folded.intervals, counted);
        }
        if folded.is_empty() && self.calls.is_empty() {
            return Ok(None);
        }
        let counters = self.probes.counters()?;
        let batch = Batch {
            host: host.to_owned(),
            agent_id: agent_id.to_owned(),
            seq: self.seq,
            mono_ns: self.clock.map(now),
            wall_ns: clock::wall_ns(),
            ranks: folded.ranks,
            exits: folded.exits,
            comms: folded.comms,
            collectives: folded.collectives,
            intervals: folded.intervals,
            links: folded.links,
            probes: if self.calls.is_empty() {
                Vec::new()
            } else {
                self.probes.descs().to_vec()
            },
            calls: std::mem::take(&mut self.calls),
            ringbuf_drops: counters.ringbuf_drops,
            spool_drops,
            stacks: Vec::new(),
        };
        self.seq += 1;
        Ok(Some(batch))
    }

    /// Fills the cost fields of closed intervals and feeds the budget.
    /// `counted`: host-wide time the launch counters were on since the last
    /// close.
    fn account(&mut self, intervals: &mut [slowrank_shared::wire::RankInterval], counted: u64) {
        let plan = self.sampler.plan();
        let mut samples = Vec::with_capacity(intervals.len());
        // Shared equally: the agent works for every rank it follows.
        let own = self.own_cpu.take() / intervals.len().max(1) as u64;
        for i in intervals.iter_mut() {
            i.agent_cpu_ns = own;
            let t = self.ledger.take(i.pid);
            let dur = i.end_ns.saturating_sub(i.start_ns).max(1);
            i.launch_counted_ns = counted.min(dur);
            i.probe_hits = t.entry_hits + t.return_hits;
            i.launch_duty_ppm = (plan.duty * 1e6) as u32;
            i.budget_narrowed = plan.narrowed;
            if let Some(trap) = self.trap {
                let cost = trap.cost_ns(t.entry_hits, t.return_hits);
                i.probe_cost_ns = cost as u64;
                i.datapath_cost_ns =
                    trap.cost_ns(t.datapath_entry_hits, t.datapath_return_hits) as u64;
                i.trap_pair_ns = trap.pair_ns.round().min(f64::from(u32::MAX)) as u32;
                let always = (cost - t.counted_calls as f64 * trap.entry_ns).max(0.0);
                samples.push(CostSample {
                    always_on: always / dur as f64,
                    counted_calls: t.counted_calls,
                    counted_ns: i.launch_counted_ns,
                });
            }
            if self.scanner.ranks().all(|r| r.identity.pid != i.pid) {
                // Its last interval (the rank exited).
                self.ledger.forget(i.pid);
            }
        }
        if let Some(p) = self.sampler.observe(&samples) {
            if p.narrowed {
                tracing::warn!(
                    duty_percent = 100.0 * p.duty,
                    projected_percent = 100.0 * p.projected,
                    "overhead budget: launch samples narrowed (the probes would cost more than --max-overhead)"
                );
            } else {
                tracing::info!(
                    duty_percent = 100.0 * p.duty,
                    "overhead budget: launch samples back to their default"
                );
            }
        }
    }

    /// Calls counted in-kernel per class over the run, every process the
    /// agent saw (exited ones included).
    pub fn counted_totals(&self) -> [u64; slowrank_shared::probe::cuda_count::SLOTS] {
        let mut t = [0; slowrank_shared::probe::cuda_count::SLOTS];
        for c in self.class_totals.values() {
            for (a, b) in t.iter_mut().zip(c) {
                *a += b;
            }
        }
        t
    }

    /// Kernel-side counters (drops, unfollowed hits).
    pub fn counters(&self) -> Result<crate::probes::Counters, ProbeError> {
        self.probes.counters()
    }

    /// Entry events seen for probe `id` (counted probes: see `cuda_counts`).
    pub fn hits(&self, id: u32) -> u64 {
        self.hits.get(id as usize).copied().unwrap_or(0)
    }

    /// Per-process in-kernel CUDA counters.
    pub fn cuda_counts(
        &self,
    ) -> Result<Vec<(u32, [u64; slowrank_shared::probe::cuda_count::SLOTS])>, ProbeError> {
        self.probes.cuda_counts()
    }

    /// Ring-buffer records of an unexpected size (kernel/user mismatch).
    pub fn bad_events(&self) -> u64 {
        self.bad_events
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

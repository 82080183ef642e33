//! Addresses → frame names with blazesym, while the process is alive.
//!
//! A process's memory maps are cached in blazesym when it is first seen
//! ([`Symbolizer::register`]), so stacks recorded shortly before it exits
//! still symbolize. Names are cached per (pid, address). Where blazesym
//! reports inlined functions (with its `dwarf` feature, off for now: the
//! symbol tables are much cheaper) they become frames of their own.

use std::{collections::HashMap, sync::Arc};

use blazesym::symbolize::{
    cache::{Cache, Process as CacheProcess},
    source::{Kernel, Process, Source},
    Input, Symbolized, Symbolizer as Blaze,
};

/// Frame name for an address blazesym cannot place.
pub const UNKNOWN: &str = "[unknown]";

/// Entries kept in the name cache before it is cleared (bounds memory on
/// long runs; the cost of a clear is re-symbolizing hot addresses).
const MAX_CACHED: usize = 1 << 18;

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error("cannot cache the memory maps of process {pid} (exited?)")]
    Register {
        pid: u32,
        #[source]
        source: blazesym::Error,
    },
}

/// A name or names for one address: innermost first (inlined callees
/// before the function they were inlined into).
pub type Frames = Arc<[Arc<str>]>;

pub struct Symbolizer {
    blaze: Blaze,
    user: HashMap<(u32, u64), Frames>,
    kernel: HashMap<u64, Frames>,
    unknown: Frames,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Self {
            blaze: Blaze::new(),
            user: HashMap::new(),
            kernel: HashMap::new(),
            unknown: Arc::from([Arc::<str>::from(UNKNOWN)]),
        }
    }

    /// Caches `pid`'s memory maps so it symbolizes after it exits. Call
    /// again after it loads libraries (dlopen) to pick them up.
    pub fn register(&mut self, pid: u32) -> Result<(), SymbolizeError> {
        // Also caches /tmp/perf-PID.map when there is one (JITs, Python ≥
        // 3.12 with `-X perf`), so those frames survive the exit too.
        self.blaze
            .cache(&Cache::Process(CacheProcess::new(pid.into())))
            .map_err(|source| SymbolizeError::Register { pid, source })
    }

    /// Drops the names cached for `pid` (it exited and was folded).
    pub fn forget(&mut self, pid: u32) {
        self.user.retain(|(p, _), _| *p != pid);
    }

    /// Names of user addresses of `pid`. `addrs` are return addresses except
    /// the first (`first_is_ip`): we look up `addr - 1` for those so a call
    /// at the very end of a function is not attributed to the next one.
    pub fn user(&mut self, pid: u32, addrs: &[u64], first_is_ip: bool) -> Vec<Frames> {
        let lookup: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                if i == 0 && first_is_ip {
                    a
                } else {
                    a.saturating_sub(1)
                }
            })
            .collect();
        if self.user.len() > MAX_CACHED {
            self.user.clear();
        }
        let missing: Vec<u64> = lookup
            .iter()
            .copied()
            .filter(|a| !self.user.contains_key(&(pid, *a)))
            .collect();
        if !missing.is_empty() {
            let src = Source::Process(Process::new(pid.into()));
            let names = self.resolve(&src, &missing);
            for (a, n) in missing.into_iter().zip(names) {
                self.user.insert((pid, a), n);
            }
        }
        lookup
            .iter()
            .map(|a| {
                self.user
                    .get(&(pid, *a))
                    .cloned()
                    .unwrap_or_else(|| self.unknown.clone())
            })
            .collect()
    }

    /// Names of kernel return addresses (the first is the interrupted IP).
    pub fn kernel(&mut self, addrs: &[u64]) -> Vec<Frames> {
        let lookup: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
            .collect();
        let missing: Vec<u64> = lookup
            .iter()
            .copied()
            .filter(|a| !self.kernel.contains_key(a))
            .collect();
        if !missing.is_empty() {
            let src = Source::Kernel(Kernel::default());
            let names = self.resolve(&src, &missing);
            for (a, n) in missing.into_iter().zip(names) {
                self.kernel.insert(a, n);
            }
        }
        lookup
            .iter()
            .map(|a| {
                self.kernel
                    .get(a)
                    .cloned()
                    .unwrap_or_else(|| self.unknown.clone())
            })
            .collect()
    }

    fn resolve(&self, src: &Source, addrs: &[u64]) -> Vec<Frames> {
        match self.blaze.symbolize(src, Input::AbsAddr(addrs)) {
            Ok(syms) => syms
                .into_iter()
                .map(|s| match s {
                    Symbolized::Sym(sym) => {
                        let mut v: Vec<Arc<str>> = sym
                            .inlined
                            .iter()
                            .rev()
                            .map(|f| Arc::<str>::from(f.name.as_ref()))
                            .collect();
                        v.push(Arc::from(sym.name.as_ref()));
                        Arc::from(v)
                    }
                    Symbolized::Unknown(_) => self.unknown.clone(),
                })
                .collect(),
            Err(e) => {
                // A process that exited before it was registered: every
                // frame is unknown, which the folded stacks count.
                tracing::debug!(error = %e, "symbolization failed");
                vec![self.unknown.clone(); addrs.len()]
            }
        }
    }
}

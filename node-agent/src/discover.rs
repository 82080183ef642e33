//! Finding rank processes and the libraries they use, from `/proc`.
//!
//! A rank carries its identity in its environment (torchrun, Slurm or Open
//! MPI variables). The scanner keeps the set of processes it has classified,
//! keyed by pid *and* start time so a recycled pid is a new process, and
//! reports new ranks and ranks that went away. Libraries come from
//! `/proc/PID/maps` (exact paths, so copies inside pip packages are found) and,
//! before they are mapped, from the directories in the rank's
//! `LD_LIBRARY_PATH`, so probes sit on a library before the job dlopens it.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
};

use slowrank_shared::wire::RankIdentity;

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("--only-env {0:?}: expected KEY=VALUE")]
    BadFilter(String),
    #[error("cannot list {path}")]
    Proc {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Which library a file is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LibKind {
    Nccl,
    Cudart,
    Verbs,
    /// A verbs provider (`libmlx5.so*`, …): probed through the ops table.
    Provider,
}

impl LibKind {
    /// Classifies a file name (`libnccl.so.2`, `libcudart.so.13`, …); any
    /// soname version, never a fixed one.
    pub fn of(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_str()?;
        let is = |stem: &str| name == stem || name.starts_with(&format!("{stem}."));
        if is("libnccl.so") {
            Some(Self::Nccl)
        } else if is("libcudart.so") {
            Some(Self::Cudart)
        } else if is("libibverbs.so") {
            Some(Self::Verbs)
        } else if [
            "libmlx5.so",
            "libmlx4.so",
            "libefa.so",
            "libbnxt_re-rdmav34.so",
            "libmana.so",
        ]
        .iter()
        .any(|s| is(s))
        {
            Some(Self::Provider)
        } else {
            None
        }
    }

    pub fn soname_hint(self) -> &'static str {
        match self {
            Self::Nccl => "libnccl.so",
            Self::Cudart => "libcudart.so",
            Self::Verbs => "libibverbs.so",
            Self::Provider => "verbs provider (libmlx5.so, …)",
        }
    }
}

/// A rank process found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rank {
    pub identity: RankIdentity,
    /// `/proc/PID/stat` start time (clock ticks), to tell recycled pids apart.
    pub start_time: u64,
    /// Directories of the rank's `LD_LIBRARY_PATH`.
    pub lib_dirs: Vec<PathBuf>,
    /// Virtual memory size at the last scan: a library mapped (dlopen)
    /// changes it, so `/proc/PID/maps` is read again only then.
    pub vsize: u64,
}

/// What changed since the previous scan.
#[derive(Debug, Default)]
pub struct Changes {
    pub new: Vec<Rank>,
    /// Ranks that exited (or whose pid now names another process).
    pub gone: Vec<Rank>,
    /// Rank processes that `--only-env` assigns to another agent.
    pub foreign: Vec<u32>,
}

/// Scans `/proc` for rank processes.
#[derive(Debug)]
pub struct Scanner {
    proc_root: PathBuf,
    only_env: Vec<(String, String)>,
    /// When wrapping a command: only it and its descendants count.
    root_pid: Option<u32>,
    ranks: HashMap<u32, Rank>,
    /// (pid, start time) → command name of processes judged not to be
    /// ranks. An exec keeps pid and start time but changes the name (the
    /// fork-then-exec of a launcher is seen half-way), so a new name means a
    /// new look; the whole set is also forgotten every `RECHECK_SCANS` scans
    /// for an exec that keeps its name (python → python).
    ignored: HashMap<(u32, u64), String>,
    /// pid → (ppid, start time) of every process the last scan listed, for
    /// scans told which processes exec'd: the others are not read again.
    seen: HashMap<u32, (u32, u64)>,
    scans: u64,
    /// The scan that last listed `/proc` (`None`: list on the next).
    listed: Option<u64>,
}

const RECHECK_SCANS: u64 = 40;
/// Scans from one listing of `/proc` to the next while exec notices
/// arrive and none came: the passes between read only the ranks' own
/// `stat` (an exit, a pid reused, a library mapped). Every program starts
/// with an exec, so a new rank lists `/proc` at once; a process that
/// appears without one (a fork that never execs, which carries its
/// parent's environment) waits at most this many scans (1 s at the default
/// 50 ms). Listing `/proc` twenty times a second was a tenth of the
/// agents' CPU on a healthy dp8 run (perf, stop 63).
pub const LISTING_EVERY_SCANS: u64 = 20;

impl Scanner {
    /// `only_env` entries are `KEY=VALUE`; a process counts only if its
    /// environment has all of them (several agents on one machine).
    pub fn new(only_env: &[String], root_pid: Option<u32>) -> Result<Self, DiscoverError> {
        let only_env = only_env
            .iter()
            .map(|f| {
                f.split_once('=')
                    .filter(|(k, _)| !k.is_empty())
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| DiscoverError::BadFilter(f.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            proc_root: PathBuf::from("/proc"),
            only_env,
            root_pid,
            ranks: HashMap::new(),
            ignored: HashMap::new(),
            seen: HashMap::new(),
            scans: 0,
            listed: None,
        })
    }

    /// Restricts the scan to the descendants of `pid` (set once the wrapped
    /// command has started).
    pub fn set_root(&mut self, pid: u32) {
        self.root_pid = Some(pid);
        self.ignored.clear();
        self.listed = None;
    }

    /// Ranks currently followed.
    pub fn ranks(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.values()
    }

    /// One pass over `/proc` that reads every process; `now_ns` stamps
    /// newly seen ranks.
    pub fn scan(&mut self, now_ns: u64) -> Result<Changes, DiscoverError> {
        self.scan_with_execs(now_ns, None)
    }

    /// One pass over `/proc`. With `execs`, the processes that exec'd since
    /// the last pass (the kernel's exec notices), only those, new pids and
    /// the ranks are read: a host's hundreds of other processes cost one
    /// directory listing, not a `stat` each twenty times a second; and
    /// while no notice came, not even that but every
    /// [`LISTING_EVERY_SCANS`]th pass (the others read the ranks' `stat`).
    /// `None` (no notices, or some were lost) reads every process.
    pub fn scan_with_execs(
        &mut self,
        now_ns: u64,
        execs: Option<&[u32]>,
    ) -> Result<Changes, DiscoverError> {
        self.scans += 1;
        if execs.is_some_and(<[u32]>::is_empty)
            && self
                .listed
                .is_some_and(|l| self.scans - l < LISTING_EVERY_SCANS)
        {
            return Ok(self.ranks_only());
        }
        self.listed = Some(self.scans);
        let mut changes = Changes::default();
        match execs {
            None => {
                self.seen.clear();
                if self.scans.is_multiple_of(RECHECK_SCANS) {
                    self.ignored.clear();
                }
            }
            Some(pids) => {
                // An exec keeps pid and start time: look again.
                let execed: HashSet<u32> = pids.iter().copied().collect();
                if !execed.is_empty() {
                    self.seen.retain(|p, _| !execed.contains(p));
                    self.ignored.retain(|(p, _), _| !execed.contains(p));
                }
            }
        }
        let incremental = execs.is_some();
        let entries = fs::read_dir(&self.proc_root).map_err(|source| DiscoverError::Proc {
            path: self.proc_root.clone(),
            source,
        })?;
        let mut alive: HashSet<u32> = HashSet::new();
        let mut parents: HashMap<u32, u32> = HashMap::new();
        let mut fresh: Vec<(u32, u64, String, u64)> = Vec::new();
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if incremental && !self.ranks.contains_key(&pid) {
                if let Some(&(ppid, _)) = self.seen.get(&pid) {
                    alive.insert(pid);
                    parents.insert(pid, ppid);
                    continue;
                }
            }
            let Some((ppid, start, comm, vsize)) = stat(&self.proc_root, pid) else {
                continue;
            };
            if let Some(r) = self.ranks.get_mut(&pid) {
                r.vsize = vsize;
            }
            alive.insert(pid);
            parents.insert(pid, ppid);
            if incremental {
                self.seen.insert(pid, (ppid, start));
            }
            match self.ranks.get(&pid) {
                Some(r) if r.start_time == start => continue,
                Some(_) => {
                    // Same pid, another process: the old rank is gone.
                    changes.gone.push(self.ranks.remove(&pid).expect("present"));
                }
                None => {}
            }
            if self.ignored.get(&(pid, start)) != Some(&comm) {
                fresh.push((pid, start, comm, vsize));
            }
        }
        let gone: Vec<u32> = self
            .ranks
            .keys()
            .filter(|p| !alive.contains(p))
            .copied()
            .collect();
        for pid in gone {
            changes.gone.push(self.ranks.remove(&pid).expect("present"));
        }
        self.ignored.retain(|(p, _), _| alive.contains(p));
        self.seen.retain(|p, _| alive.contains(p));
        for (pid, start, comm, vsize) in fresh {
            if let Some(root) = self.root_pid {
                if !descends_from(&parents, pid, root) {
                    // Not ours (yet): a process can't become a descendant
                    // later, so remember the verdict.
                    self.ignored.insert((pid, start), comm);
                    continue;
                }
            }
            let Ok(raw) = fs::read(self.proc_root.join(pid.to_string()).join("environ")) else {
                // Kernel threads and processes gone meanwhile.
                tracing::trace!(pid, %comm, "not a rank: its environment cannot be read");
                self.ignored.insert((pid, start), comm);
                continue;
            };
            let env = parse_environ(&raw);
            match identity(&env, &self.only_env) {
                Some(mut identity) => {
                    identity.pid = pid;
                    identity.seen_ns = now_ns;
                    let lib_dirs = env
                        .get("LD_LIBRARY_PATH")
                        .map(|v| {
                            v.split(':')
                                .filter(|d| !d.is_empty())
                                .map(PathBuf::from)
                                .collect()
                        })
                        .unwrap_or_default();
                    let rank = Rank {
                        identity,
                        start_time: start,
                        lib_dirs,
                        vsize,
                    };
                    self.ranks.insert(pid, rank.clone());
                    changes.new.push(rank);
                }
                None => {
                    // `RUST_LOG=slowrank_agent::discover=trace`: why a process
                    // the user expected was not taken for a rank.
                    tracing::trace!(pid, %comm, env_vars = env.len(), incremental, "not a rank");
                    if !self.only_env.is_empty() && identity(&env, &[]).is_some() {
                        changes.foreign.push(pid);
                    }
                    self.ignored.insert((pid, start), comm);
                }
            }
        }
        Ok(changes)
    }
}

impl Scanner {
    /// A pass between listings: each rank's `stat` only.
    fn ranks_only(&mut self) -> Changes {
        let mut changes = Changes::default();
        let pids: Vec<u32> = self.ranks.keys().copied().collect();
        for pid in pids {
            match stat(&self.proc_root, pid) {
                Some((_, start, _, vsize)) if start == self.ranks[&pid].start_time => {
                    self.ranks.get_mut(&pid).expect("present").vsize = vsize;
                }
                other => {
                    changes.gone.push(self.ranks.remove(&pid).expect("present"));
                    if other.is_some() {
                        // Another process holds the pid: read it next pass.
                        self.listed = None;
                    }
                }
            }
        }
        changes
    }
}

fn descends_from(parents: &HashMap<u32, u32>, mut pid: u32, root: u32) -> bool {
    for _ in 0..64 {
        if pid == root {
            return true;
        }
        match parents.get(&pid) {
            Some(&p) if p != 0 && p != pid => pid = p,
            _ => return false,
        }
    }
    false
}

/// (ppid, start time, command name, virtual memory size) from
/// `/proc/PID/stat`; vsize (field 23) changes when a library is mapped.
fn stat(root: &Path, pid: u32) -> Option<(u32, u64, String, u64)> {
    let s = fs::read_to_string(root.join(pid.to_string()).join("stat")).ok()?;
    let comm = s[s.find('(')? + 1..s.rfind(')')?].to_owned();
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, starttime field 22.
    Some((
        f.get(1)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
        comm,
        f.get(20).and_then(|v| v.parse().ok()).unwrap_or(0),
    ))
}

/// `KEY=VALUE\0…` to a map.
pub fn parse_environ(raw: &[u8]) -> HashMap<String, String> {
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let s = std::str::from_utf8(kv).ok()?;
            let (k, v) = s.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// A rank identity from torchrun, Slurm or Open MPI variables, if the
/// environment passes the filters. `pid`/`seen_ns` are left 0.
pub fn identity(
    env: &HashMap<String, String>,
    only_env: &[(String, String)],
) -> Option<RankIdentity> {
    if !only_env.iter().all(|(k, v)| env.get(k) == Some(v)) {
        return None;
    }
    let num = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| env.get(*k)?.trim().parse::<u32>().ok())
    };
    let text = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| env.get(*k).cloned())
            .unwrap_or_default()
    };
    let rank = num(&["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"])?;
    Some(RankIdentity {
        pid: 0,
        rank,
        world_size: num(&[
            "WORLD_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "SLURM_NTASKS",
            "PMI_SIZE",
        ])
        .unwrap_or(0),
        local_rank: num(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"])
            .unwrap_or(0),
        local_world_size: num(&[
            "LOCAL_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "SLURM_NTASKS_PER_NODE",
        ])
        .unwrap_or(0),
        group_rank: num(&["GROUP_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK"])
            .unwrap_or(u32::MAX),
        restart_count: num(&["TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"]).unwrap_or(0),
        job_id: text(&[
            "TORCHELASTIC_RUN_ID",
            "SLURM_JOB_ID",
            "OMPI_MCA_orte_ess_jobid",
        ]),
        seen_ns: 0,
    })
}

/// Libraries of interest mapped by `pid`, by exact path (deleted or
/// replaced files, marked " (deleted)" by the kernel, are skipped).
pub fn mapped_libs(pid: u32) -> Vec<(LibKind, PathBuf)> {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut out: Vec<(LibKind, PathBuf)> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        if !path.starts_with('/') || line.ends_with("(deleted)") {
            continue;
        }
        let p = PathBuf::from(path);
        if let Some(k) = LibKind::of(&p) {
            if !out.iter().any(|(_, q)| *q == p) {
                out.push((k, p));
            }
        }
    }
    out
}

/// The file and file offset that address `addr` of process `pid` maps
/// (for attaching a uprobe to a function known only by a pointer).
pub fn file_offset(pid: u32, addr: u64) -> Option<(PathBuf, u64)> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (range, _perms, off) = (f.next()?, f.next()?, f.next()?);
        let path = f.nth(2)?;
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
        );
        let off = u64::from_str_radix(off, 16).ok()?;
        (a <= addr && addr < b && path.starts_with('/'))
            .then(|| (PathBuf::from(path), addr - a + off))
    })
}

/// Candidate libraries in a rank's `LD_LIBRARY_PATH` directories, resolved
/// to real files (the same inode a later dlopen maps): NCCL, the CUDA
/// runtime and libibverbs; verbs providers are found through the ops table.
pub fn library_path_libs(dirs: &[PathBuf]) -> Vec<(LibKind, PathBuf)> {
    let mut out: Vec<(LibKind, PathBuf)> = Vec::new();
    for d in dirs {
        let Ok(rd) = fs::read_dir(d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let Some(k) = LibKind::of(&p) else { continue };
            if !matches!(k, LibKind::Nccl | LibKind::Cudart | LibKind::Verbs) {
                continue;
            }
            let Ok(real) = fs::canonicalize(&p) else {
                continue;
            };
            if !out.iter().any(|(_, q)| *q == real) {
                out.push((k, real));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn torchrun_slurm_and_ompi_environments() {
        let t = identity(
            &env(&[
                ("RANK", "5"),
                ("WORLD_SIZE", "8"),
                ("LOCAL_RANK", "1"),
                ("LOCAL_WORLD_SIZE", "4"),
                ("GROUP_RANK", "1"),
                ("TORCHELASTIC_RESTART_COUNT", "2"),
                ("TORCHELASTIC_RUN_ID", "job7"),
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(
            (
                t.rank,
                t.world_size,
                t.local_rank,
                t.group_rank,
                t.restart_count
            ),
            (5, 8, 1, 1, 2)
        );
        assert_eq!(t.job_id, "job7");
        let s = identity(
            &env(&[
                ("SLURM_PROCID", "3"),
                ("SLURM_NTASKS", "16"),
                ("SLURM_JOB_ID", "99"),
            ]),
            &[],
        )
        .unwrap();
        assert_eq!((s.rank, s.world_size, s.job_id.as_str()), (3, 16, "99"));
        let o = identity(
            &env(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4")]),
            &[],
        )
        .unwrap();
        assert_eq!((o.rank, o.world_size, o.group_rank), (2, 4, u32::MAX));
        assert!(identity(&env(&[("HOME", "/root")]), &[]).is_none());
    }

    #[test]
    fn only_env_filters() {
        let e = env(&[("RANK", "0"), ("GROUP_RANK", "1")]);
        let f = |s: &str| Scanner::new(&[s.to_owned()], None).unwrap().only_env;
        assert!(identity(&e, &f("GROUP_RANK=1")).is_some());
        assert!(identity(&e, &f("GROUP_RANK=0")).is_none());
        assert!(Scanner::new(&["nokey".to_owned()], None).is_err());
    }

    #[test]
    fn library_names_any_soname_version() {
        let k = |s: &str| LibKind::of(Path::new(s));
        assert_eq!(
            k("/x/site-packages/nvidia/nccl/lib/libnccl.so.2"),
            Some(LibKind::Nccl)
        );
        assert_eq!(k("/usr/lib/libcudart.so.13"), Some(LibKind::Cudart));
        assert_eq!(k("/usr/lib/libcudart.so"), Some(LibKind::Cudart));
        assert_eq!(k("/usr/lib/libmlx5.so.1"), Some(LibKind::Provider));
        assert_eq!(k("/usr/lib/libibverbs.so.1.14"), Some(LibKind::Verbs));
        assert_eq!(k("/usr/lib/libnccl-net.so"), None);
    }

    /// A fake `/proc` entry: `stat` (ppid, start time, name) and `environ`.
    fn fake_proc(root: &Path, pid: u32, comm: &str, start: u64, env: &[(&str, &str)]) {
        let d = root.join(pid.to_string());
        fs::create_dir_all(&d).unwrap();
        // Fields 3.. after the name: state, ppid, then 17 more up to starttime (22).
        let mut rest = vec!["S".to_owned(), "1".to_owned()];
        rest.extend(std::iter::repeat_n("0".to_owned(), 17));
        rest.push(start.to_string());
        fs::write(
            d.join("stat"),
            format!("{pid} ({comm}) {}\n", rest.join(" ")),
        )
        .unwrap();
        let raw: Vec<u8> = env
            .iter()
            .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
            .collect();
        fs::write(d.join("environ"), raw).unwrap();
    }

    #[test]
    fn a_scan_told_the_execs_reads_only_new_and_execed_processes() {
        let root = std::env::temp_dir().join(format!("slowrank-proc-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fake_proc(&root, 100, "python", 7, &[("HOME", "/root")]);
        let mut s = Scanner::new(&[], None).unwrap();
        s.proc_root = root.clone();
        assert!(s.scan_with_execs(1, Some(&[])).unwrap().new.is_empty());
        // python execs python with the rank's variables: same pid, start
        // time and name. Without its exec notice the scan does not read it
        // again (the cost this saves); with it, the rank is found.
        fake_proc(
            &root,
            100,
            "python",
            7,
            &[("RANK", "3"), ("WORLD_SIZE", "8")],
        );
        assert!(s.scan_with_execs(2, Some(&[])).unwrap().new.is_empty());
        let c = s.scan_with_execs(3, Some(&[100])).unwrap();
        assert_eq!(
            c.new.iter().map(|r| r.identity.rank).collect::<Vec<_>>(),
            [3]
        );
        // A new pid without a notice (a fork that never exec'd) is read
        // at the next listing of /proc: passes between read only the ranks.
        fake_proc(
            &root,
            200,
            "python",
            9,
            &[("RANK", "4"), ("WORLD_SIZE", "8")],
        );
        let mut passes = 0;
        let c = loop {
            passes += 1;
            let c = s.scan_with_execs(4, Some(&[])).unwrap();
            if !c.new.is_empty() || passes > LISTING_EVERY_SCANS {
                break c;
            }
        };
        assert_eq!(
            c.new.iter().map(|r| r.identity.pid).collect::<Vec<_>>(),
            [200]
        );
        assert_eq!(
            passes, LISTING_EVERY_SCANS,
            "the 20th pass after the last listing"
        );
        // A rank's stat is read every time: its pid reused by another
        // process (new start time) ends the old rank.
        fake_proc(&root, 200, "python", 11, &[("HOME", "/root")]);
        let c = s.scan_with_execs(5, Some(&[])).unwrap();
        assert_eq!(
            c.gone.iter().map(|r| r.identity.pid).collect::<Vec<_>>(),
            [200]
        );
        // Gone from the listing: gone, whatever the notices say.
        fs::remove_dir_all(root.join("100")).unwrap();
        let c = s.scan_with_execs(6, Some(&[])).unwrap();
        assert_eq!(
            c.gone.iter().map(|r| r.identity.pid).collect::<Vec<_>>(),
            [100]
        );
        // Without notices (some were lost) every process is read again.
        fake_proc(&root, 300, "python", 13, &[("HOME", "/root")]);
        assert!(s.scan_with_execs(7, Some(&[])).unwrap().new.is_empty());
        fake_proc(&root, 300, "python", 15, &[("RANK", "5")]);
        assert!(s.scan_with_execs(8, Some(&[])).unwrap().new.is_empty());
        let c = s.scan_with_execs(9, None).unwrap();
        assert_eq!(
            c.new.iter().map(|r| r.identity.pid).collect::<Vec<_>>(),
            [300]
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn scan_finds_nothing_foreign_and_parses_stat() {
        // This test process has no rank variables unless the harness sets them.
        let mut s = Scanner::new(&["SLOWRANK_TEST_NEVER=1".to_owned()], None).unwrap();
        let c = s.scan(1).unwrap();
        assert!(c.new.is_empty() && c.gone.is_empty());
        let (ppid, start, _, vsize) = stat(Path::new("/proc"), std::process::id()).unwrap();
        assert!(ppid > 0 && start > 0 && vsize > 0);
    }
}

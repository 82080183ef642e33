//! A CPU quota shared by chosen threads: the simulated rank's "own cores".
//!
//! A real 8-GPU host has 100+ cores and a noisy neighbour on a rank's cores
//! slows that rank alone. On a 2-vCPU VM running every rank, unbounded busy
//! threads slow all ranks alike (the step went from 35 to 51 ms and no rank
//! stood out). So the contention fault puts the rank's training thread and
//! its busy neighbours into one cgroup with a CPU quota: they fight over
//! that quota, and the rest of the machine loses no more than the quota.
//!
//! cgroup v1's `cpu` controller only: it moves single threads (`tasks`).
//! (v2 moves threads only inside a threaded subtree of the process's own
//! cgroup; a host without v1 `cpu` gets no cap and the old behaviour.)

use std::path::{Path, PathBuf};

/// Where a v1 `cpu` hierarchy is mounted.
const V1_CPU: &str = "/sys/fs/cgroup/cpu";
/// Scheduling period of the quota: short, so a throttled thread waits
/// milliseconds, not a whole 100 ms default period.
const PERIOD_US: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum CpuCapError {
    #[error("no cgroup v1 cpu controller at {V1_CPU}")]
    NoController,
    #[error("cgroup {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A cgroup with a CPU quota; removed (its threads moved back) on drop.
#[derive(Debug)]
pub struct CpuCap {
    dir: PathBuf,
    root: PathBuf,
    /// Each thread moved in, and the cgroup it came from.
    threads: Vec<(i32, PathBuf)>,
}

fn write(path: &Path, value: &str) -> Result<(), CpuCapError> {
    std::fs::write(path, value).map_err(|source| CpuCapError::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl CpuCap {
    /// A cgroup named `name` allowed `cpus` CPUs' worth of time.
    pub fn new(name: &str, cpus: f64) -> Result<Self, CpuCapError> {
        let root = PathBuf::from(V1_CPU);
        if !root.join("cpu.cfs_quota_us").exists() {
            return Err(CpuCapError::NoController);
        }
        let dir = root.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CpuCapError::Io { path: dir, source }),
        }
        let cap = Self {
            dir,
            root,
            threads: Vec::new(),
        };
        write(&cap.dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
        let quota = ((cpus * PERIOD_US as f64) as u64).max(1000);
        write(&cap.dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        Ok(cap)
    }

    /// Moves thread `tid` of this process into the cgroup.
    pub fn add(&mut self, tid: i32) -> Result<(), CpuCapError> {
        let from = self.origin(tid);
        write(&self.dir.join("tasks"), &tid.to_string())?;
        self.threads.push((tid, from));
        Ok(())
    }

    /// The `cpu` cgroup `tid` is in now (the hierarchy's root if unknown).
    fn origin(&self, tid: i32) -> PathBuf {
        let path = format!("/proc/self/task/{tid}/cgroup");
        let rel = std::fs::read_to_string(path).ok().and_then(|s| {
            s.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrl, p) = (f.next()?, f.next()?, f.next()?);
                ctrl.split(',')
                    .any(|c| c == "cpu")
                    .then(|| p.trim_start_matches('/').to_string())
            })
        });
        self.root.join(rel.unwrap_or_default())
    }

    /// The calling thread's id.
    pub fn current_thread() -> i32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // Threads that already exited are simply gone.
        for (tid, from) in &self.threads {
            let _ = std::fs::write(from.join("tasks"), tid.to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(cap: &CpuCap, tid: i32) -> bool {
        std::fs::read_to_string(cap.dir.join("tasks"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == tid.to_string()))
    }

    #[test]
    fn a_thread_goes_in_and_comes_back_out() {
        let name = format!("slowrank-test-{}", std::process::id());
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let mut cap = match CpuCap::new(&name, 0.5) {
            Ok(c) => c,
            // Without v1 `cpu` (or as a user) the contention scenario runs
            // with unbounded neighbours; there is nothing to check here.
            Err(e @ CpuCapError::NoController) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) if !root => {
                eprintln!("skipped (not root): {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let quota = std::fs::read_to_string(cap.dir.join("cpu.cfs_quota_us")).expect("quota");
        assert_eq!(quota.trim(), "5000");
        let tid = CpuCap::current_thread();
        cap.add(tid).expect("add");
        assert!(contains(&cap, tid));
        let (dir, from) = (cap.dir.clone(), cap.threads[0].1.clone());
        drop(cap);
        assert!(!dir.exists());
        let back = std::fs::read_to_string(from.join("tasks")).expect("origin");
        assert!(back.lines().any(|l| l.trim() == tid.to_string()));
    }
}

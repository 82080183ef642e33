//! Where a rank's main thread spent its time, from the scheduler's own
//! accounting (`/proc/PID/task/PID/schedstat`): on a CPU, runnable but
//! waiting for one, or asleep. It is the direct evidence that a rank's host
//! is slow — busier than its peers, descheduled, or blocked outside GPU
//! syncs — and costs one small read per rank per interval, no probe.
//!
//! Needs `CONFIG_SCHED_INFO` (on in every distribution kernel; Linux ≥ 2.6.9).
//! Only the main thread is read: it is the one that launches kernels and
//! enters collectives (a data-loader thread that holds it back shows as the
//! main thread's sleep).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a schedstat line: {line:?}")]
    Parse { path: PathBuf, line: String },
}

/// Cumulative scheduler times of one thread (ns since it started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStat {
    pub oncpu_ns: u64,
    pub runq_ns: u64,
}

impl SchedStat {
    /// Parses `"<on-cpu ns> <run-queue ns> <timeslices>"`.
    pub fn parse(line: &str) -> Option<Self> {
        let mut f = line.split_ascii_whitespace().map(str::parse::<u64>);
        let oncpu_ns = f.next()?.ok()?;
        let runq_ns = f.next()?.ok()?;
        f.next()?.ok()?;
        Some(Self { oncpu_ns, runq_ns })
    }

    /// The main thread of `pid`, as the kernel accounts it now.
    pub fn read(pid: u32) -> Result<Self, SchedError> {
        let path = PathBuf::from(format!("/proc/{pid}/task/{pid}/schedstat"));
        let line = std::fs::read_to_string(&path).map_err(|source| SchedError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&line).ok_or_else(|| SchedError::Parse {
            path,
            line: line.trim().to_owned(),
        })
    }

    /// Time between `earlier` and `self` (counters only grow; a reused pid
    /// reads as nothing rather than as a huge delta).
    pub fn since(&self, earlier: &SchedStat) -> SchedStat {
        SchedStat {
            oncpu_ns: self.oncpu_ns.saturating_sub(earlier.oncpu_ns),
            runq_ns: self.runq_ns.saturating_sub(earlier.runq_ns),
        }
    }
}

/// One interval's split of a thread's wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedDelta {
    pub oncpu_ns: u64,
    pub runq_ns: u64,
    /// Asleep or blocked: wall time neither on a CPU nor runnable (GPU
    /// syncs that block included).
    pub offcpu_ns: u64,
}

impl SchedDelta {
    pub fn over(wall_ns: u64, d: SchedStat) -> Self {
        Self {
            oncpu_ns: d.oncpu_ns,
            runq_ns: d.runq_ns,
            offcpu_ns: wall_ns.saturating_sub(d.oncpu_ns.saturating_add(d.runq_ns)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_line() {
        assert_eq!(
            SchedStat::parse("189416129 14459895 499\n"),
            Some(SchedStat {
                oncpu_ns: 189_416_129,
                runq_ns: 14_459_895
            })
        );
        assert_eq!(SchedStat::parse("12 x 3"), None);
        assert_eq!(SchedStat::parse("12 13"), None);
    }

    #[test]
    fn a_busy_thread_reads_as_on_cpu_and_a_sleeping_one_as_off_cpu() {
        let me = std::process::id();
        // The test harness runs tests on worker threads; the process's main
        // thread is parked meanwhile, so read this thread by its tid.
        let tid = unsafe { libc::gettid() } as u32;
        let read = || {
            let p = format!("/proc/{me}/task/{tid}/schedstat");
            SchedStat::parse(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        let a = read();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(60) {
            std::hint::spin_loop();
        }
        let b = read();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let c = read();
        let busy = b.since(&a);
        let slept = c.since(&b);
        assert!(busy.oncpu_ns + busy.runq_ns >= 50_000_000, "{busy:?}");
        assert!(slept.oncpu_ns < 20_000_000, "{slept:?}");
        let d = SchedDelta::over(60_000_000, slept);
        assert!(d.offcpu_ns >= 40_000_000, "{d:?}");
    }

    #[test]
    fn the_main_thread_of_this_process_is_readable() {
        let s = SchedStat::read(std::process::id()).unwrap();
        assert!(s.oncpu_ns > 0);
        assert!(matches!(
            SchedStat::read(u32::MAX),
            Err(SchedError::Read { .. })
        ));
    }
}

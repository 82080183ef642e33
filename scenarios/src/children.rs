//! Rank processes: spawned in their own process groups, killed with their
//! whole group when the launcher stops them, and taken down by the kernel
//! (`PR_SET_PDEATHSIG`) if the launcher itself dies.

use std::{
    os::unix::process::CommandExt,
    process::{Child, Command},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

/// A set of children that are all killed on drop.
#[derive(Default)]
pub struct Children {
    pub procs: Vec<(u32, Child)>,
}

/// Makes `cmd` a killable child: own process group, dies with its parent.
pub fn prepare(cmd: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The launcher may already be gone.
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Makes a service (coordinator, agent) die with the launcher, in the
/// launcher's process group: a launcher killed outright (SIGKILL, a crash)
/// leaves no coordinator or agent running on for nobody. Kept in the
/// launcher's group so a terminal's Ctrl-C still reaches it directly.
///
/// The signal is tied to the spawning *thread*: spawn services from the
/// thread that outlives them (the one that holds `Services`).
pub fn die_with_launcher(cmd: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

impl Children {
    pub fn push(&mut self, rank: u32, child: Child) {
        self.procs.push((rank, child));
    }

    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|(_, c)| c.id()).collect()
    }

    /// SIGTERM to every group, then SIGKILL to what is left after `grace`.
    pub fn kill_all(&mut self, grace: Duration) {
        for (_, c) in &self.procs {
            // SAFETY: signalling the process group we created for the child.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline
            && self
                .procs
                .iter_mut()
                .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for (_, c) in &mut self.procs {
            if matches!(c.try_wait(), Ok(None)) {
                // SAFETY: as above.
                unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            }
            let _ = c.wait();
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.kill_all(Duration::from_millis(200));
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT / SIGTERM / SIGHUP into [`interrupted`] so the launcher
/// can stop its children and still write the truth file.
pub fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing an async-signal-safe handler.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

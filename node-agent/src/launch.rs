//! Starting the wrapped job so that not one call escapes the probes.
//!
//! The job must not run a single instruction before the agent has put its pid
//! into the `FOLLOWED` map, or its first calls race the probes. Holding the
//! child in `pre_exec` does not work: `Command::spawn` itself waits until the
//! child has exec'd. So the child execs a tiny `/bin/sh` gate first: it waits
//! for one byte on fd 3, then execs the job in place (same pid). The agent
//! follows that pid, then releases the gate. If the agent dies, the pipe
//! reads EOF and the job runs unobserved rather than hanging.

use std::{io, os::fd::RawFd};

use tokio::process::{Child, Command};

/// The gate script: `$@` is the job. fd 3 is closed before the job starts.
const GATE: &str = r#"read -r _ <&3 || :; exec "$@" 3<&-"#;

/// A spawned child held before the job's `exec`; call [`Gated::release`].
pub struct Gated {
    pub child: Child,
    write_fd: RawFd,
}

impl Gated {
    /// Starts `prog args...` behind the gate.
    pub fn spawn(prog: &str, args: &[String]) -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: valid out-array; O_CLOEXEC so neither end leaks into the job.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let (read_fd, write_fd) = (fds[0], fds[1]);
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(GATE)
            .arg("slowrank-gate")
            .arg(prog)
            .args(args);
        // SAFETY: dup2 is async-signal-safe; the copy on fd 3 has no CLOEXEC,
        // so the gate shell (and only it, it closes fd 3 before the job) sees it.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(read_fd, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        // SAFETY: our copy of the read end is no longer needed.
        unsafe { libc::close(read_fd) };
        match spawned {
            Ok(child) => Ok(Self { child, write_fd }),
            Err(e) => {
                // SAFETY: closing our own descriptor.
                unsafe { libc::close(write_fd) };
                Err(e)
            }
        }
    }

    /// Lets the gate exec the job.
    pub fn release(self) -> Child {
        let b = b"\n";
        // SAFETY: writing to and closing our own pipe.
        unsafe {
            libc::write(self.write_fd, b.as_ptr().cast(), 1);
            libc::close(self.write_fd);
        }
        self.child
    }
}

#[cfg(test)]
mod tests {
    use super::Gated;

    #[tokio::test]
    async fn job_runs_only_after_release_and_keeps_the_pid() {
        let dir = std::env::temp_dir().join(format!("slowrank-gate-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let script = format!("echo $$ > {}", dir.display());
        let gated = Gated::spawn("/bin/sh", &["-c".into(), script]).unwrap();
        let pid = gated.child.id().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!dir.exists(), "the job must not start before release");
        let mut child = gated.release();
        assert!(child.wait().await.unwrap().success());
        let ran_as: u32 = std::fs::read_to_string(&dir)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(ran_as, pid, "the job runs in the followed pid");
        let _ = std::fs::remove_file(&dir);
    }

    #[tokio::test]
    async fn missing_program_fails_with_the_job_status_not_a_hang() {
        let gated = Gated::spawn("/nonexistent/slowrank-no-such-prog", &[]).unwrap();
        let status = gated.release().wait().await.unwrap();
        assert_eq!(status.code(), Some(127), "sh reports command not found");
    }
}

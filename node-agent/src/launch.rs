//! Starting the wrapped job so that not one call escapes the probes.
//!
//! The child is forked, then waits in `pre_exec` on a pipe until the agent has
//! put its pid into the `FOLLOWED` map; only then does it exec the job.
//! Following it after a plain spawn would race the job's first calls.

use std::{io, os::fd::RawFd};

use tokio::process::{Child, Command};

/// A spawned child held before `exec`; call [`Gated::release`] to let it run.
pub struct Gated {
    pub child: Child,
    write_fd: RawFd,
}

impl Gated {
    /// Forks `cmd` and holds it before exec.
    pub fn spawn(mut cmd: Command) -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: valid out-array; O_CLOEXEC so the job never inherits them.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let (read_fd, write_fd) = (fds[0], fds[1]);
        // SAFETY: the closure only calls async-signal-safe functions (close,
        // read) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::close(write_fd);
                let mut b = 0u8;
                // Returns on the release byte, or on EOF if the agent died:
                // the job then runs unobserved rather than hanging.
                loop {
                    let n = libc::read(read_fd, (&mut b as *mut u8).cast(), 1);
                    if n >= 0 || *libc::__errno_location() != libc::EINTR {
                        break;
                    }
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

    /// Lets the child exec the job.
    pub fn release(self) -> Child {
        let b = 1u8;
        // SAFETY: writing one byte to our pipe, then closing it.
        unsafe {
            libc::write(self.write_fd, (&b as *const u8).cast(), 1);
            libc::close(self.write_fd);
        }
        self.child
    }
}

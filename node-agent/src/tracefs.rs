//! tracefs, where tracepoint attaches read event ids and formats.
//!
//! Minimal systems (containers, VMs without systemd) do not mount it. Every
//! tracepoint the agent uses (process fork, scheduler switch) needs it, and
//! a fork tracepoint that silently fails costs the ranks' first calls — the
//! communicator set-up — so the agent mounts it before the first attach.

use std::path::{Path, PathBuf};

/// Where tracefs is looked for, in order.
const ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
#[error("tracefs is not mounted at /sys/kernel/tracing and mounting it failed")]
pub struct TracefsError(#[source] pub std::io::Error);

/// The tracefs root, mounting it at `/sys/kernel/tracing` when neither
/// usual place has it (needs root).
pub fn ensure_mounted() -> Result<PathBuf, TracefsError> {
    if let Some(root) = find() {
        return Ok(root);
    }
    tracing::info!("mounting tracefs at /sys/kernel/tracing");
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", ROOTS[0]])
        .status()
        .map_err(TracefsError)?;
    // Another agent starting beside this one may have won the race.
    match find() {
        Some(root) => Ok(root),
        None => Err(TracefsError(std::io::Error::other(format!(
            "mount exited with {status}"
        )))),
    }
}

/// The first root with events in it, if any.
pub fn find() -> Option<PathBuf> {
    ROOTS
        .iter()
        .map(Path::new)
        .find(|r| r.join("events").exists())
        .map(Path::to_path_buf)
}

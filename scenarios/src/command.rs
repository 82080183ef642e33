//! The system tools the launcher drives (`ip`, `tc`): one place that spawns
//! them, feeds their stdin and turns a failure into an error carrying the
//! command line and what it printed on stderr.

use std::{
    io::Write,
    process::{Command, Stdio},
};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("`{cmd}` failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("cannot run `{cmd}`")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `program args` (with `stdin` piped in, if given); its stdout on
/// success.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, CommandError> {
    let cmd = format!("{program} {}", args.join(" "));
    let spawn = |source| CommandError::Spawn {
        cmd: cmd.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error shows as the tool's own failure below.
        let _ = pipe.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CommandError::Failed {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

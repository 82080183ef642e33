//! Scratch directories for tests: a run's output (with its copy of the
//! stand-in libraries, tens of MB) goes away when the test passes and stays,
//! named on stderr, when it fails, so a red test still leaves its logs and a
//! green suite does not fill the disk run after run.

use std::{
    ops::Deref,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

/// A directory under the system temp dir, removed on drop unless the
/// dropping thread is panicking (a failed assertion).
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A fresh, empty `slowrank-<name>-<pid>-<n>` directory.
    pub fn new(name: &str) -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("slowrank-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Deref for ScratchDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for a look (the test failed)", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_on_drop_and_kept_on_panic() {
        let d = ScratchDir::new("scratch-unit").unwrap();
        std::fs::write(d.join("f"), b"x").unwrap();
        let p = d.path().to_path_buf();
        drop(d);
        assert!(!p.exists());

        let kept = std::thread::spawn(|| {
            let d = ScratchDir::new("scratch-unit-panic").unwrap();
            let p = d.path().to_path_buf();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let _d = d;
                panic!("assertion failed");
            }))
            .unwrap_err();
            p
        })
        .join()
        .unwrap();
        assert!(kept.exists());
        std::fs::remove_dir_all(kept).unwrap();
    }
}

//! The stand-in libraries under their real names.
//!
//! Cargo builds each stand-in as `lib<crate>.so` (with the real soname
//! inside); [`prepare`] copies them into a directory as `libnccl.so.2`,
//! `libcudart.so.12`, `libibverbs.so.1` and `libmlx5.so.1` (plus the
//! unversioned development symlinks), ready for `LD_LIBRARY_PATH`.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// Exact paths of the laid-out libraries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibDir {
    pub dir: PathBuf,
    pub nccl: PathBuf,
    pub cudart: PathBuf,
    pub verbs: PathBuf,
    pub provider: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum LibError {
    #[error(
        "stand-in library {0} not found (looked in {1}); build it with `cargo build -p slowrank-scenarios` or set SLOWRANK_STANDIN_DIR"
    )]
    NotBuilt(String, String),
    #[error("cannot lay out {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// (cargo artifact, real file name, development symlink).
pub const STANDINS: [(&str, &str, &str); 4] = [
    ("libslowrank_standin_nccl.so", "libnccl.so.2", "libnccl.so"),
    (
        "libslowrank_standin_cudart.so",
        "libcudart.so.12",
        "libcudart.so",
    ),
    (
        "libslowrank_standin_ibverbs.so",
        "libibverbs.so.1",
        "libibverbs.so",
    ),
    ("libslowrank_standin_mlx5.so", "libmlx5.so.1", "libmlx5.so"),
];

/// Directories that may hold cargo's build outputs, best first.
pub fn artifact_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SLOWRANK_STANDIN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        for a in exe.ancestors().skip(1).take(2) {
            dirs.push(a.to_path_buf());
            dirs.push(a.join("deps"));
        }
    }
    let built = PathBuf::from(env!("SLOWRANK_BUILD_PROFILE_DIR"));
    dirs.push(built.join("deps"));
    dirs.push(built);
    dirs
}

/// Where cargo left the stand-in `artifact` (e.g. `libslowrank_standin_nccl.so`).
pub fn find_artifact(artifact: &str) -> Result<PathBuf, LibError> {
    let dirs = artifact_dirs();
    dirs.iter()
        .map(|d| d.join(artifact))
        .filter(|p| p.is_file())
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
        .ok_or_else(|| {
            LibError::NotBuilt(
                artifact.to_string(),
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

/// Finds a binary of this package (e.g. `slowrank-trainer`) next to the
/// current executable or in cargo's profile directory.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    artifact_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Copies the stand-ins into `dir` under their real names.
pub fn prepare(dir: &Path) -> Result<LibDir, LibError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| LibError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    let mut out = Vec::new();
    for (artifact, real, dev) in STANDINS {
        let src = find_artifact(artifact)?;
        let dst = dir.join(real);
        // Copy to a temporary name and rename, so a process that has the
        // old file mapped keeps a consistent image.
        let tmp = dir.join(format!(".{real}.tmp"));
        fs::copy(&src, &tmp).map_err(io(&tmp))?;
        fs::rename(&tmp, &dst).map_err(io(&dst))?;
        let link = dir.join(dev);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(real, &link).map_err(io(&link))?;
        out.push(dst);
    }
    let mut it = out.into_iter();
    let mut next = || it.next().expect("four stand-ins");
    Ok(LibDir {
        dir: dir.to_path_buf(),
        nccl: next(),
        cudart: next(),
        verbs: next(),
        provider: next(),
    })
}

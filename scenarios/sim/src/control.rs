//! Per-rank control block: a small file mmap'd by every stand-in library
//! inside one rank process (each library has its own copy of this crate, so
//! statics are not shared) and written by the fault injector.
//!
//! All fields are atomics; floats are stored as their bit patterns.

use std::{
    fs::OpenOptions,
    io,
    os::fd::AsRawFd,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
};

/// Identifies an initialised block.
pub const MAGIC: u64 = 0x534c_524b_4354_4c32; // "SLRKCTL2"
/// Most NICs addressable by LID in the link tables.
pub const MAX_LID: usize = 1024;
/// Ranks per host the LID scheme supports.
pub const MAX_LOCAL: u32 = 32;

/// The LID of the NIC of rank `local` on host `host` (one NIC per GPU).
pub fn lid_of(host: u32, local: u32) -> u16 {
    (1 + host * MAX_LOCAL + local) as u16
}

/// The live fault knobs of one rank.
#[repr(C)]
pub struct Control {
    magic: AtomicU64,
    /// Multiplier on every kernel and copy duration of this rank's GPU.
    compute_factor: AtomicU64,
    /// Added to every inter-host transfer hop of this rank's NIC (ns).
    nic_extra_latency_ns: AtomicU64,
    /// Fraction of nominal NIC bandwidth left (1.0 = healthy), as injected.
    nic_bw_factor: AtomicU64,
    /// Fraction of nominal bandwidth the NIC's port replica on the host's
    /// veth showed when last measured (1.0 = healthy or not measured; see
    /// [`crate::wire`]). Written by the `libmlx5.so.1` stand-in.
    port_bw_factor: AtomicU64,
    /// Per peer NIC (indexed by LID): extra latency and bandwidth fraction
    /// of the link between this rank's NIC and that one.
    link_extra_latency_ns: [AtomicU64; MAX_LID],
    link_bw_factor: [AtomicU64; MAX_LID],
}

/// Why a control block could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control block {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("control block {0} is not initialised")]
    NotInitialised(String),
}

fn f(bits: &AtomicU64) -> f64 {
    f64::from_bits(bits.load(Ordering::Relaxed))
}

impl Control {
    fn reset(&self) {
        self.compute_factor.store(1f64.to_bits(), Ordering::Relaxed);
        self.nic_extra_latency_ns.store(0, Ordering::Relaxed);
        self.nic_bw_factor.store(1f64.to_bits(), Ordering::Relaxed);
        self.port_bw_factor.store(1f64.to_bits(), Ordering::Relaxed);
        for i in 0..MAX_LID {
            self.link_extra_latency_ns[i].store(0, Ordering::Relaxed);
            self.link_bw_factor[i].store(1f64.to_bits(), Ordering::Relaxed);
        }
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// A healthy block private to this process (no file).
    pub fn private() -> &'static Control {
        // SAFETY: all-zero bytes are valid atomics; reset() then initialises.
        let block: &'static Control = Box::leak(Box::new(unsafe { std::mem::zeroed::<Control>() }));
        block.reset();
        block
    }

    fn map(path: &Path, create: bool) -> Result<&'static Control, ControlError> {
        let err = |source| ControlError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
            .map_err(err)?;
        let len = std::mem::size_of::<Control>();
        if create {
            file.set_len(len as u64).map_err(err)?;
        }
        // SAFETY: mapping a file we hold open, shared, for its whole length.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: the mapping is page aligned, long enough, lives forever
        // (never unmapped) and holds only atomics.
        let block = unsafe { &*(ptr as *const Control) };
        if create {
            block.reset();
        } else if block.magic.load(Ordering::Acquire) != MAGIC {
            return Err(ControlError::NotInitialised(path.display().to_string()));
        }
        Ok(block)
    }

    /// Creates (or resets) the block file at `path`; used by the launcher.
    pub fn create(path: &Path) -> Result<&'static Control, ControlError> {
        Self::map(path, true)
    }

    /// Opens an initialised block.
    pub fn open(path: &Path) -> Result<&'static Control, ControlError> {
        Self::map(path, false)
    }

    /// Where the launcher links the block of the rank whose NIC has `lid`,
    /// next to `own` (this rank's block file).
    pub fn peer_path(own: &Path, lid: u16) -> std::path::PathBuf {
        own.with_file_name(format!("lid-{lid}.ctl"))
    }

    /// The block of the rank whose NIC has `lid`, when the launcher linked
    /// one next to this process's own block (`None` outside the harness).
    pub fn peer(lid: u16) -> Option<&'static Control> {
        let own = std::env::var_os(crate::env::CONTROL)?;
        Self::open(&Self::peer_path(Path::new(&own), lid)).ok()
    }

    /// This process's block: the file named by [`crate::env::CONTROL`], or a
    /// private healthy block when unset or unusable (a library used outside
    /// the harness behaves like healthy hardware).
    pub fn current() -> &'static Control {
        static CURRENT: OnceLock<&'static Control> = OnceLock::new();
        CURRENT.get_or_init(|| {
            std::env::var_os(crate::env::CONTROL)
                .and_then(|p| Self::open(Path::new(&p)).ok())
                .unwrap_or_else(Self::private)
        })
    }

    pub fn compute_factor(&self) -> f64 {
        f(&self.compute_factor)
    }
    pub fn set_compute_factor(&self, v: f64) {
        self.compute_factor.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn nic_extra_latency_ns(&self) -> u64 {
        self.nic_extra_latency_ns.load(Ordering::Relaxed)
    }
    /// The injected NIC bandwidth knob alone (see [`Self::nic_bw`]).
    pub fn nic_bw_factor(&self) -> f64 {
        f(&self.nic_bw_factor)
    }
    /// The measured fraction of the NIC's port replica.
    pub fn port_bw_factor(&self) -> f64 {
        f(&self.port_bw_factor)
    }
    pub fn set_port_bw_factor(&self, v: f64) {
        self.port_bw_factor.store(v.to_bits(), Ordering::Relaxed);
    }
    /// Fraction of nominal bandwidth the NIC has: the injected knob times
    /// what its port replica measured. What every NIC bandwidth reader uses.
    pub fn nic_bw(&self) -> f64 {
        self.nic_bw_factor() * self.port_bw_factor()
    }
    pub fn set_nic(&self, extra_latency_ns: u64, bw_factor: f64) {
        self.nic_extra_latency_ns
            .store(extra_latency_ns, Ordering::Relaxed);
        self.nic_bw_factor
            .store(bw_factor.to_bits(), Ordering::Relaxed);
    }
    /// Link to the NIC with `lid`: (extra latency ns, bandwidth fraction).
    pub fn link(&self, lid: u16) -> (u64, f64) {
        let i = usize::from(lid).min(MAX_LID - 1);
        (
            self.link_extra_latency_ns[i].load(Ordering::Relaxed),
            f(&self.link_bw_factor[i]),
        )
    }
    pub fn set_link(&self, lid: u16, extra_latency_ns: u64, bw_factor: f64) {
        let i = usize::from(lid).min(MAX_LID - 1);
        self.link_extra_latency_ns[i].store(extra_latency_ns, Ordering::Relaxed);
        self.link_bw_factor[i].store(bw_factor.to_bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_of_one_file_see_each_other() {
        let dir = std::env::temp_dir().join(format!("slowrank-ctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl");
        let a = Control::create(&path).unwrap();
        let b = Control::open(&path).unwrap();
        assert_eq!(b.compute_factor(), 1.0);
        assert_eq!(b.nic_bw(), 1.0);
        a.set_nic(0, 0.5);
        a.set_port_bw_factor(0.25);
        assert_eq!(b.nic_bw(), 0.125);
        a.set_compute_factor(1.5);
        a.set_link(lid_of(1, 2), 7000, 0.25);
        assert_eq!(b.compute_factor(), 1.5);
        assert_eq!(b.link(lid_of(1, 2)), (7000, 0.25));
        assert_eq!(b.link(lid_of(1, 3)), (0, 1.0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn uninitialised_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("slowrank-ctl0-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl");
        std::fs::write(&path, vec![0u8; std::mem::size_of::<Control>()]).unwrap();
        assert!(matches!(
            Control::open(&path),
            Err(ControlError::NotInitialised(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Shared by the agent's eBPF tests.

/// eBPF needs root: without it a test skips with a loud reason, except
/// under CI (`CI` set), where a skip would hide a broken probe path.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: CI must run as root so the eBPF probes are really exercised");
    }
    eprintln!("\n*** SKIPPED {test}: not root, cannot load eBPF. Run as root (sudo -E cargo test) to exercise the probes. ***\n");
    false
}

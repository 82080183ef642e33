//! Rebuild the eBPF object when bpf-linker changes: the linker is not a
//! dependency cargo knows about.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}

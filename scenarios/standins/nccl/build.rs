//! Real soname, and the weak `ncclX` aliases added to the exported set
//! (rustc's own version script exports the `pncclX` functions).
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=nccl.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/nccl.map");
}

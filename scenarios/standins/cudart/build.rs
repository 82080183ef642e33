//! Gives the cdylib the real soname and `@@libcudart.so.12` symbol versions.
//! rustc passes its own (anonymous) version script too; LLD, the default
//! linker of Rust on x86-64 Linux, merges both.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=cudart.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.12");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/cudart.map");
}

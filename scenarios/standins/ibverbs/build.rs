//! Real soname and rdma-core's symbol versions (`IBVERBS_1.1`,
//! `IBVERBS_PRIVATE_34`); LLD merges this script with rustc's own.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=ibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/ibverbs.map");
}

//! Real soname; the version script exports only the `mlx5dv_*` API, like
//! the real provider, so the data-path functions stay file-local symbols.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=mlx5.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmlx5.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/mlx5.map");
}

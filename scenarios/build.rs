//! Records where cargo puts this build's artifacts, so `libs::prepare` can
//! find the stand-in libraries from any crate's tests, not only ours.
fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
    let profile_dir = std::path::Path::new(&out)
        .ancestors()
        .nth(3)
        .expect("OUT_DIR has a profile directory")
        .to_path_buf();
    println!(
        "cargo:rustc-env=SLOWRANK_BUILD_PROFILE_DIR={}",
        profile_dir.display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}

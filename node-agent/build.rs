//! Builds the eBPF programs in `node-agent-ebpf` for `bpfel-unknown-none`
//! with aya-build (nightly + rust-src + bpf-linker, see scripts/setup.sh) and
//! leaves the object in `OUT_DIR/node-agent`, which `probes.rs` embeds.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "node-agent-ebpf")
        .ok_or_else(|| anyhow!("node-agent-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    // The shared #[repr(C)] types are compiled into the object too.
    println!("cargo:rerun-if-changed={}/../shared/src", root_dir);
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "node-agent-ebpf",
            root_dir: root_dir.as_str(),
            no_default_features: false,
            features: &[],
        }],
        aya_build::Toolchain::default(),
    )
}

//! Builds the BPF programs (`profiler-ebpf`) for the agent's target
//! architecture with nightly + bpf-linker, so the agent can embed the object
//! with `include_bytes_aligned!`. `cargo xtask setup` installs the toolchain.

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "profiler-ebpf")
        .ok_or_else(|| anyhow!("profiler-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("profiler-ebpf manifest has no parent directory"))?;
    // The shared types change the BPF object too.
    println!("cargo:rerun-if-changed={}/../profiler-common/src", root_dir);
    aya_build::build_ebpf(
        [Package {
            name: "profiler-ebpf",
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context(
        "building the BPF programs failed: run `cargo xtask setup` (nightly rust-src, \
         LLVM 22 and bpf-linker)",
    )
}

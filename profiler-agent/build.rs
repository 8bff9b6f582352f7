//! Builds the BPF programs (`profiler-ebpf`) for the agent's target
//! architecture with nightly + bpf-linker, so the agent can embed the object
//! with `include_bytes_aligned!`. `cargo xtask setup` installs the toolchain.
//!
//! Also generates the wire formats the agent writes by hand no longer: pprof
//! and Pyroscope's push messages, from the `.proto` files in `proto/`
//! (protox parses them in Rust, prost-build writes the structs: no protoc).

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    generate_protos()?;
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

/// `$OUT_DIR/perftools.profiles.rs`, `push.v1.rs`, `types.v1.rs`.
fn generate_protos() -> anyhow::Result<()> {
    const FILES: [&str; 2] = ["profile.proto", "pyroscope/push.proto"];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(FILES, ["proto"])
        .map_err(|e| anyhow!("parsing the .proto files in proto/: {e}"))?;
    // prost-build derives Copy for messages of plain numbers (ValueType,
    // Label, Line, Function), which the encoder passes by value.
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("generating Rust from the .proto files in proto/")
}

//! Builds the BPF programs (`profiler-ebpf`) for the target architecture
//! with nightly + bpf-linker, so the crate can embed the objects with
//! `include_bytes_aligned!`. `cargo xtask setup` installs the toolchain.
//!
//! This is what aya-build's `build_ebpf` does, except for its output: it
//! forwards every line of the nested cargo's stderr (`Compiling core ...`,
//! some 20 of them) as a `cargo:warning`, which a newcomer reads as
//! warnings. Here a successful build says nothing (xtask prints one
//! progress line before it builds), real compiler warnings are forwarded,
//! and a failed build shows the nested cargo's whole output.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, anyhow, bail};
use cargo_metadata::{Message, diagnostic::DiagnosticLevel};

/// The BPF crate, built as a package of this workspace.
const PACKAGE: &str = "profiler-ebpf";

/// Functions the kernel must verify on their own (global functions; see
/// `profiler_walk_step` in profiler-ebpf's unwind.rs). bpf-linker makes
/// every symbol it is not told to export internal, and the kernel then
/// verifies a function inside each of its callers.
const GLOBAL_FUNCTIONS: &[&str] = &[
    "profiler_walk_step",
    "profiler_frame_pointer_step",
    "profiler_go_labels",
    "profiler_python_step",
    "profiler_hotspot_step",
];

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_OBJECTS");
    if std::env::var_os("CARGO_FEATURE_OBJECTS").is_none() {
        return Ok(());
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .ok_or_else(|| anyhow!("profiler-bpf has no parent directory"))?;
    let source = workspace.join(PACKAGE);
    // The programs and the shared types both change the objects.
    println!("cargo:rerun-if-changed={}", source.display());
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("profiler-common/src").display()
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    build(&out_dir).context(
        "building the BPF programs failed: run `cargo xtask setup` (nightly rust-src, \
         LLVM 22 and bpf-linker)",
    )
}

fn build(out_dir: &Path) -> anyhow::Result<()> {
    let endian = std::env::var("CARGO_CFG_TARGET_ENDIAN")?;
    let target = match endian.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported endianness {other}"),
    };
    // The programs read pt_regs and signal frames of the machine they run
    // on: they are built for the agent's architecture.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let target_dir = out_dir.join("ebpf-target");
    let mut command = Command::new("rustup");
    command
        .args(["run", "nightly", "cargo", "build", "--package", PACKAGE])
        .args(["--bins", "--release", "--message-format=json"])
        .args(["--target", target, "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!(
                "--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf\x1f\
                 -Clink-arg=--export={}",
                GLOBAL_FUNCTIONS.join(",")
            ),
        )
        // The outer build's compiler is stable; the nested one must be
        // rustup's nightly.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let mut stderr = child.stderr.take().expect("piped stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut executables = Vec::new();
    let mut diagnostics = Vec::new();
    for message in Message::parse_stream(stdout) {
        match message.context("reading the nested cargo's messages")? {
            Message::CompilerArtifact(artifact) => {
                if let Some(executable) = artifact.executable {
                    executables.push((artifact.target.name, executable.into_std_path_buf()));
                }
            }
            Message::CompilerMessage(message) => {
                let level = &message.message.level;
                if matches!(level, DiagnosticLevel::Warning | DiagnosticLevel::Error) {
                    diagnostics.push(message.message.rendered.unwrap_or_default());
                }
            }
            _ => {}
        }
    }
    let status = child.wait()?;
    let stderr = stderr.join().unwrap_or_default();
    for diagnostic in &diagnostics {
        for line in diagnostic.lines() {
            println!("cargo:warning={line}");
        }
    }
    if !status.success() {
        // cargo shows a failed build script's stderr: all of it, since
        // anything there may be the cause (a missing bpf-linker, LLVM).
        for line in BufReader::new(stderr.as_bytes())
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{line}");
        }
        bail!("{command:?} failed: {status}");
    }
    for (name, binary) in executables {
        let destination = out_dir.join(&name);
        std::fs::copy(&binary, &destination).with_context(|| {
            format!("copying {} to {}", binary.display(), destination.display())
        })?;
    }
    Ok(())
}

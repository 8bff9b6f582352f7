//! The agent under test: its binary, running it, and what every test
//! needs first (BPF privileges, the workspace, one test at a time).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::http::{http_get, wait_for};

/// The workspace root (this crate lives in `tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

pub(crate) fn target_dir() -> PathBuf {
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
/// failure, never a silent pass. Also builds the agent (without
/// `PROFILER_AGENT_BIN`) now, before the test starts its fixtures: a
/// build started after them outlives a fixture that runs for seconds.
pub fn require_bpf_privileges() {
    if let Err(reason) = profiler_sampling::sampler::check_privileges() {
        panic!(
            "this end-to-end test loads BPF programs and cannot run here: {reason}. \
             Run the tests as root (CI={})",
            std::env::var("CI").unwrap_or_default()
        );
    }
    agent_bin();
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

/// A `record` run watched from outside: its report (stderr), its peak
/// resident memory and how long it took.
pub struct Watched {
    pub report: String,
    pub peak_kib: u64,
    pub took: Duration,
}

/// Runs `record` with `args`, polling the agent's peak RSS (`VmHWM`)
/// until it exits; fails if it runs past a minute or fails.
pub fn record_watched(args: &[&str]) -> Watched {
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut child = Command::new(agent_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The report is read on a thread of its own: a long one must not
    // block the agent on a full pipe while it is polled.
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            let hwm = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0);
            peak = peak.max(hwm);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("profiler-agent {args:?} did not end within a minute");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let report = reader.join().unwrap();
    assert!(
        status.success(),
        "profiler-agent {args:?} failed ({status}): {report}"
    );
    Watched {
        report,
        peak_kib: peak,
        took: started.elapsed(),
    }
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

/// One test at a time within a test binary: the continuous tests each spin
/// CPU-bound fixtures on a 2-core machine.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

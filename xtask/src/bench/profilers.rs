//! The profilers compared, each started system-wide at the same rate, told
//! when it is ready (loaded and attached), measured, and stopped with
//! SIGINT the way a person would stop it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::Env;
use super::bpf_stats::{self, BpfCounters};
use super::process::{Managed, read_usage, wait_until};

/// bcc compiles its program with clang on start: allow for a slow machine.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a profiler may take to write its output after SIGINT.
const STOP_TIMEOUT: Duration = Duration::from_secs(180);
/// After the program is loaded, attaching to every CPU takes a moment.
const SETTLE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    None,
    Agent,
    /// The agent walking frame pointers only (no unwind tables).
    AgentFramePointers,
    /// The agent without reading Go labels (the cost of reading them).
    AgentNoGoLabels,
    Perf,
    Bpftrace,
    Bcc,
}

impl Tool {
    pub const ALL: [Tool; 7] = [
        Tool::None,
        Tool::Agent,
        Tool::AgentFramePointers,
        Tool::AgentNoGoLabels,
        Tool::Perf,
        Tool::Bpftrace,
        Tool::Bcc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tool::None => "no profiler",
            Tool::Agent => "profiler-agent",
            Tool::AgentFramePointers => "profiler-agent --frame-pointers-only",
            Tool::AgentNoGoLabels => "profiler-agent --runtimes cpython,hotspot",
            Tool::Perf => "perf record",
            Tool::Bpftrace => "bpftrace",
            Tool::Bcc => "bcc profile",
        }
    }

    /// The exact command line, for the report (paths shortened).
    pub fn command_line(self, hz: u64) -> String {
        match self {
            Tool::None => "-".into(),
            Tool::Agent => format!("profiler-agent -F {hz} --duration 30m --output agent.pb.gz"),
            Tool::AgentFramePointers => format!(
                "profiler-agent -F {hz} --frame-pointers-only --duration 30m --output agent.pb.gz"
            ),
            Tool::AgentNoGoLabels => {
                format!(
                    "profiler-agent -F {hz} --runtimes cpython,hotspot --duration 30m --output agent.pb.gz"
                )
            }
            Tool::Perf => format!("perf record -F {hz} -g -a -o perf.data"),
            Tool::Bpftrace => format!("bpftrace -e '{}'", bpftrace_program(hz)),
            Tool::Bcc => format!("profile-bpfcc -F {hz} -f"),
        }
    }

    /// The workloads the overhead runs measure under this tool: every one,
    /// except for the label-less agent, which only differs on Go.
    pub fn workloads(self) -> &'static [super::workloads::Workload] {
        use super::workloads::Workload;
        match self {
            Tool::AgentNoGoLabels => &[Workload::GoService],
            _ => &Workload::ALL,
        }
    }

    pub fn loads_bpf(self) -> bool {
        matches!(
            self,
            Tool::Agent
                | Tool::AgentFramePointers
                | Tool::AgentNoGoLabels
                | Tool::Bpftrace
                | Tool::Bcc
        )
    }

    /// Starts the tool system-wide at `hz` and waits until it samples.
    /// `label` keeps the output files of repetitions apart.
    pub fn start(self, env: &Env, hz: u64, label: &str) -> anyhow::Result<Running> {
        self.start_scoped(env, hz, label, None)
    }

    /// As `start`, but only process `pid` when given (agent and perf).
    pub fn start_scoped(
        self,
        env: &Env,
        hz: u64,
        label: &str,
        pid: Option<u32>,
    ) -> anyhow::Result<Running> {
        let log = env.out.join(format!("{}-{label}.log", self.file_stem()));
        let (mut command, output) = match self {
            Tool::None => {
                return Ok(Running {
                    tool: self,
                    process: None,
                    log,
                    output: None,
                });
            }
            Tool::Agent => {
                let output = env.out.join(format!("agent-{label}.pb.gz"));
                return start_agent(env, hz, &output, &log, pid, &[]);
            }
            Tool::AgentFramePointers => {
                let output = env.out.join(format!("agent-fp-{label}.pb.gz"));
                return start_agent(env, hz, &output, &log, pid, &["--frame-pointers-only"]);
            }
            Tool::AgentNoGoLabels => {
                let output = env.out.join(format!("agent-nolabels-{label}.pb.gz"));
                return start_agent(
                    env,
                    hz,
                    &output,
                    &log,
                    pid,
                    &["--runtimes", "cpython,hotspot"],
                );
            }
            Tool::Perf => {
                let output = env.out.join(format!("perf-{label}.data"));
                let mut c = Command::new("perf");
                c.args(["record", "-F", &hz.to_string(), "-g"]);
                match pid {
                    Some(pid) => c.args(["-p", &pid.to_string()]),
                    None => c.arg("-a"),
                };
                c.arg("-o").arg(&output);
                (c, output)
            }
            Tool::Bpftrace => {
                let mut c = Command::new("bpftrace");
                c.args(["-e", &bpftrace_program(hz)]);
                (c, log.clone())
            }
            Tool::Bcc => {
                let mut c = Command::new("profile-bpfcc");
                c.args(["-F", &hz.to_string(), "-f"]);
                if let Some(headers) = &env.bcc_kernel_source {
                    c.env("BCC_KERNEL_SOURCE", headers);
                }
                (c, log.clone())
            }
        };
        let mut process = Managed::spawn_logged(&mut command, self.name(), &log)?;
        process.watch();
        let pid = process.pid();
        if self == Tool::Perf {
            // perf writes its header before it enables the events.
            wait_until(&mut process, &log, READY_TIMEOUT, || {
                std::fs::metadata(&output).is_ok_and(|m| m.len() > 0)
            })?;
            std::thread::sleep(SETTLE);
        } else {
            wait_until(&mut process, &log, READY_TIMEOUT, || {
                !bpf_stats::program_ids(pid).is_empty()
            })?;
        }
        std::thread::sleep(SETTLE);
        Ok(Running {
            tool: self,
            process: Some(process),
            log,
            output: Some(output),
        })
    }

    fn file_stem(self) -> &'static str {
        match self {
            Tool::None => "none",
            Tool::Agent => "agent",
            Tool::AgentFramePointers => "agent-fp",
            Tool::AgentNoGoLabels => "agent-nolabels",
            Tool::Perf => "perf",
            Tool::Bpftrace => "bpftrace",
            Tool::Bcc => "bcc",
        }
    }
}

fn bpftrace_program(hz: u64) -> String {
    format!("profile:hz:{hz} {{ @[ustack, kstack] = count(); }}")
}

/// Starts the agent system-wide at `hz`, writing `output` (its extension
/// picks the format) when stopped, and waits until it samples.
pub fn start_agent(
    env: &Env,
    hz: u64,
    output: &Path,
    log: &Path,
    pid: Option<u32>,
    extra: &[&str],
) -> anyhow::Result<Running> {
    let mut command = agent_command(env, hz, output, Duration::from_secs(1800));
    if let Some(pid) = pid {
        command.args(["--pid", &pid.to_string()]);
    }
    command.args(extra);
    let mut process = Managed::spawn_logged(&mut command, Tool::Agent.name(), log)?;
    process.watch();
    // It prints this line once its programs are attached on every CPU.
    wait_until(&mut process, log, READY_TIMEOUT, || {
        std::fs::read_to_string(log).is_ok_and(|t| t.contains("profiling "))
    })?;
    std::thread::sleep(SETTLE);
    Ok(Running {
        tool: Tool::Agent,
        process: Some(process),
        log: log.to_path_buf(),
        output: Some(output.to_path_buf()),
    })
}

/// The agent, system-wide, until SIGINT (or `limit`, a bound in case the
/// bench dies without stopping it).
pub fn agent_command(env: &Env, hz: u64, output: &Path, limit: Duration) -> Command {
    let mut c = Command::new(&env.agent);
    c.args(["-F", &hz.to_string(), "--duration"])
        .arg(format!("{}s", limit.as_secs().max(1)))
        .arg("--output")
        .arg(output);
    c
}

/// A profiler that is sampling.
pub struct Running {
    pub tool: Tool,
    process: Option<Managed>,
    pub log: PathBuf,
    pub output: Option<PathBuf>,
}

/// The profiler's counters at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub at: Instant,
    pub cpu_seconds: f64,
    pub bpf: Option<BpfCounters>,
}

/// What a profiler cost between two snapshots.
#[derive(Debug, Clone, Copy, Default)]
pub struct WindowCost {
    pub wall_seconds: f64,
    /// The profiler process's CPU seconds per wall second.
    pub cpu_per_wall: f64,
    /// BPF program runs (samples, idle ones included) and their time.
    pub bpf: Option<BpfCounters>,
}

impl WindowCost {
    /// The profiler process's CPU time per BPF run, in microseconds.
    pub fn user_us_per_sample(&self) -> Option<f64> {
        let runs = self.bpf?.run_cnt;
        (runs > 0).then(|| self.cpu_per_wall * self.wall_seconds * 1e6 / runs as f64)
    }
}

impl Running {
    /// Wraps a profiler that was started elsewhere and is sampling (the
    /// continuous agent, which is told apart from `record` by its command).
    pub fn from_process(
        tool: Tool,
        process: Managed,
        log: PathBuf,
        output: Option<PathBuf>,
    ) -> Running {
        Running {
            tool,
            process: Some(process),
            log,
            output,
        }
    }

    /// The profiler's process id (None for `Tool::None`).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Managed::pid)
    }

    pub fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let at = Instant::now();
        let Some(process) = &self.process else {
            return Ok(Snapshot {
                at,
                cpu_seconds: 0.0,
                bpf: None,
            });
        };
        let Some(usage) = read_usage(process.pid()) else {
            bail!("{} exited while it was being measured", self.tool.name());
        };
        let name = (self.tool == Tool::Agent).then_some("sample_stack");
        let bpf = if self.tool.loads_bpf() {
            bpf_stats::perf_event_counters(process.pid(), name)?
        } else {
            None
        };
        Ok(Snapshot {
            at,
            // Windows are differences of two snapshots: to the nanosecond
            // where the kernel keeps schedstat, in clock ticks otherwise.
            cpu_seconds: super::process::thread_cpu_seconds(process.pid())
                .unwrap_or(usage.cpu_seconds),
            bpf,
        })
    }

    pub fn cost(start: &Snapshot, end: &Snapshot) -> WindowCost {
        let wall = end.at.duration_since(start.at).as_secs_f64().max(1e-9);
        WindowCost {
            wall_seconds: wall,
            cpu_per_wall: (end.cpu_seconds - start.cpu_seconds).max(0.0) / wall,
            bpf: match (start.bpf, end.bpf) {
                (Some(a), Some(b)) => Some(b.since(a)),
                _ => None,
            },
        }
    }

    /// Stops the profiler (SIGINT), waits for it to write its output, and
    /// returns its peak RSS, total CPU seconds and log.
    pub fn stop(mut self) -> anyhow::Result<Stopped> {
        let Some(process) = self.process.take() else {
            return Ok(Stopped::default());
        };
        // The agent must stop when told. A baseline that hangs on its way
        // out (bpftrace, now and then, after SIGINT) has already been
        // measured: its window's costs stand.
        let name = process.name.clone();
        let log_tail = || super::process::log_tail(&self.log);
        let (status, usage) = process
            .stop_tracer(STOP_TIMEOUT, self.tool == Tool::Agent)
            .map_err(|error| anyhow::anyhow!("{error:#}:\n{}", log_tail()))?;
        // perf and bcc exit non-zero on SIGINT in some versions; only the
        // agent's own exit status is a result here.
        if let Some(status) = status
            && self.tool == Tool::Agent
            && !status.success()
        {
            bail!("{name} failed ({status}):\n{}", log_tail());
        }
        Ok(Stopped {
            peak_rss_bytes: usage.peak_rss_bytes,
            cpu_seconds: usage.cpu_seconds,
            log: std::fs::read_to_string(&self.log).unwrap_or_default(),
        })
    }
}

#[derive(Debug, Default)]
pub struct Stopped {
    pub peak_rss_bytes: u64,
    /// CPU seconds over the whole run: start-up, sampling and writing.
    pub cpu_seconds: f64,
    pub log: String,
}

/// What the agent's closing report says.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgentReport {
    pub samples_written: u64,
    pub processes: u64,
    pub taken: u64,
    pub idle: u64,
    pub lost: u64,
}

impl AgentReport {
    /// Parses "wrote F (pprof): N samples from M processes in Xs" and
    /// "kernel: A samples taken, B idle, C outside --pid, D lost ...".
    pub fn parse(log: &str) -> AgentReport {
        let mut report = AgentReport::default();
        let number_before = |line: &str, word: &str| -> u64 {
            let words: Vec<&str> = line.split_whitespace().collect();
            words
                .windows(2)
                .find(|w| w[1].trim_end_matches(',') == word)
                .and_then(|w| w[0].parse().ok())
                .unwrap_or(0)
        };
        for line in log.lines() {
            let line = line.trim();
            if line.starts_with("wrote ") {
                report.samples_written = number_before(line, "samples");
                report.processes = number_before(line, "processes");
            } else if let Some(rest) = line.strip_prefix("kernel:") {
                report.taken = number_before(rest, "samples");
                report.idle = number_before(rest, "idle");
                report.lost = number_before(rest, "lost");
            }
        }
        report
    }
}

//! Off-CPU profiling's cost on the profiled program (section 9): a
//! context-switch-heavy workload (two threads ping-ponging a byte through
//! pipes, each switch a blocked interval) and the Go service, under no
//! profiler, the agent sampling CPU only, the agent with `--off-cpu`
//! (default sampling period, and every interval recorded), libbpf-tools'
//! `offcputime` and a bpftrace `sched_switch` script, all system-wide; each
//! profiled throughput divided by the unprofiled throughput of the same
//! repetition. Also the cost goroutine-level blocking would have: uprobes
//! on the Go runtime's park and ready points, counted by bpftrace, on the
//! Go service and on a busy Go HTTP server.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::bpf_stats::{self, BpfCounters};
use super::process::{Managed, wait_until};
use super::profilers::READY_TIMEOUT;
use super::stats::Summary;
use super::workloads::{Workload, run_counting};
use super::{Env, Plan};

/// The bpftrace script: the classic off-CPU recipe on the stable
/// tracepoint (stack of the thread leaving, summed when it comes back).
const BPFTRACE_OFF_CPU: &str = "tracepoint:sched:sched_switch { \
     @ts[args->prev_pid] = nsecs; @ks[args->prev_pid] = kstack; @us[args->prev_pid] = ustack; \
     $t = @ts[args->next_pid]; \
     if ($t) { @off[@ks[args->next_pid], @us[args->next_pid]] = sum(nsecs - $t); \
     delete(@ts[args->next_pid]); } }";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    None,
    AgentCpu,
    AgentOffCpu,
    AgentOffCpuEvery,
    Offcputime,
    Bpftrace,
    /// bpftrace counting uprobes on runtime.gopark and runtime.ready: the
    /// least goroutine-level blocking would cost (Go workloads only).
    GoParkProbes,
}

impl Condition {
    pub const ALL: [Condition; 7] = [
        Condition::None,
        Condition::AgentCpu,
        Condition::AgentOffCpu,
        Condition::AgentOffCpuEvery,
        Condition::Offcputime,
        Condition::Bpftrace,
        Condition::GoParkProbes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Condition::None => "no profiler",
            Condition::AgentCpu => "profiler-agent (CPU only)",
            Condition::AgentOffCpu => "profiler-agent --off-cpu",
            Condition::AgentOffCpuEvery => "profiler-agent --off-cpu --off-cpu-period 0",
            Condition::Offcputime => "libbpf-tools offcputime",
            Condition::Bpftrace => "bpftrace sched_switch script",
            Condition::GoParkProbes => "bpftrace uprobes on runtime.gopark + runtime.ready",
        }
    }

    pub fn command_line(self, hz: u64) -> String {
        match self {
            Condition::None => "-".into(),
            Condition::AgentCpu => format!("profiler-agent -F {hz} -o agent.pb.gz"),
            Condition::AgentOffCpu => format!("profiler-agent -F {hz} --off-cpu -o agent.pb.gz"),
            Condition::AgentOffCpuEvery => {
                format!("profiler-agent -F {hz} --off-cpu --off-cpu-period 0 -o agent.pb.gz")
            }
            Condition::Offcputime => "offcputime (min 1 us, kernel and user stacks)".into(),
            Condition::Bpftrace => format!("bpftrace -e '{BPFTRACE_OFF_CPU}'"),
            Condition::GoParkProbes => {
                "bpftrace -e 'uprobe:BINARY:runtime.gopark, uprobe:BINARY:runtime.ready \
                 { @[probe] = count(); }' (both Go binaries)"
                    .into()
            }
        }
    }

    fn applies_to(self, workload: OffCpuWorkload) -> bool {
        self != Condition::GoParkProbes || workload.go_binary().is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffCpuWorkload {
    PingPong,
    GoService,
    GoServer,
    Syscalls,
}

impl OffCpuWorkload {
    pub const ALL: [OffCpuWorkload; 4] = [
        OffCpuWorkload::PingPong,
        OffCpuWorkload::GoService,
        OffCpuWorkload::GoServer,
        OffCpuWorkload::Syscalls,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OffCpuWorkload::PingPong => "pipe ping-pong (2 threads, 2 context switches per op)",
            OffCpuWorkload::GoService => Workload::GoService.name(),
            OffCpuWorkload::GoServer => {
                "Go HTTP server (net/http on loopback, 4 keep-alive clients per CPU)"
            }
            // What any program at system calls costs: a tracer that walks
            // stacks where a system call returns slows every call.
            OffCpuWorkload::Syscalls => {
                "system calls (1 thread writes and reads back a pipe, no blocking)"
            }
        }
    }

    /// The Go binary the workload runs, under the bench's bin directory.
    fn go_binary(self) -> Option<&'static str> {
        match self {
            OffCpuWorkload::PingPong | OffCpuWorkload::Syscalls => None,
            OffCpuWorkload::GoService => Some("goservice"),
            OffCpuWorkload::GoServer => Some("goserver"),
        }
    }

    fn run(self, env: &Env, seconds: f64) -> anyhow::Result<f64> {
        match self {
            OffCpuWorkload::PingPong => run_counting(
                Command::new(env.bins.join("pingpong")).arg(format!("{seconds}")),
                "pingpong",
                env,
                seconds,
            ),
            OffCpuWorkload::GoService => Workload::GoService.run(env, seconds),
            OffCpuWorkload::GoServer => run_counting(
                Command::new(env.bins.join("goserver")).arg(format!("{seconds}")),
                "goserver",
                env,
                seconds,
            ),
            OffCpuWorkload::Syscalls => run_counting(
                Command::new(env.bins.join("syscalls")).arg(format!("{seconds}")),
                "syscalls",
                env,
                seconds,
            ),
        }
    }
}

#[derive(Debug, Default)]
pub struct OffCpuBench {
    /// (repetition, condition, workload, ops per second)
    pub rates: Vec<(usize, Condition, OffCpuWorkload, f64)>,
    /// Context switches per second of each workload, unprofiled.
    pub switches: Vec<(OffCpuWorkload, f64)>,
    /// BPF run time of the agent's off-CPU programs per context switch,
    /// and runs per second.
    pub agent_bpf: Vec<(Condition, OffCpuWorkload, BpfCounters, f64)>,
    /// Hits per second of the Go runtime's park and ready points, by
    /// workload.
    pub gopark_rate: Vec<(OffCpuWorkload, f64)>,
    pub errors: Vec<String>,
}

impl OffCpuBench {
    pub fn ratios(&self, condition: Condition, workload: OffCpuWorkload) -> Option<Summary> {
        let base = |rep: usize| {
            self.rates
                .iter()
                .find(|r| r.0 == rep && r.1 == Condition::None && r.2 == workload)
                .map(|r| r.3)
        };
        let ratios: Vec<f64> = self
            .rates
            .iter()
            .filter(|r| r.1 == condition && r.2 == workload)
            .filter_map(|r| Some(r.3 / base(r.0)?))
            .collect();
        Summary::of(&ratios)
    }

    pub fn bpf_ns_per_switch(&self, condition: Condition, workload: OffCpuWorkload) -> Option<f64> {
        let switches = Summary::of(
            &self
                .switches
                .iter()
                .filter(|s| s.0 == workload)
                .map(|s| s.1)
                .collect::<Vec<_>>(),
        )?;
        let per_second: Vec<f64> = self
            .agent_bpf
            .iter()
            .filter(|b| b.0 == condition && b.1 == workload)
            .map(|b| b.2.run_time_ns as f64 / b.3)
            .collect();
        Some(Summary::of(&per_second)?.median / switches.median.max(1.0))
    }
}

pub fn run(env: &Env, plan: &Plan) -> OffCpuBench {
    let mut results = OffCpuBench::default();
    let mut broken: Vec<Condition> = Vec::new();
    if let Err(error) = crate::setup::mount_tracefs() {
        results.errors.push(format!("off-CPU: {error:#}"));
    }
    for rep in 0..plan.reps {
        let mut order = Condition::ALL.to_vec();
        order.rotate_left(rep % Condition::ALL.len());
        for condition in order {
            if broken.contains(&condition) {
                continue;
            }
            eprintln!(
                "bench: off-CPU, repetition {}/{}: {}",
                rep + 1,
                plan.reps,
                condition.name()
            );
            if let Err(error) = one_condition(env, plan, rep, condition, &mut results) {
                results
                    .errors
                    .push(format!("off-CPU under {}: {error:#}", condition.name()));
                broken.push(condition);
            }
        }
    }
    results
}

fn one_condition(
    env: &Env,
    plan: &Plan,
    rep: usize,
    condition: Condition,
    results: &mut OffCpuBench,
) -> anyhow::Result<()> {
    let seconds = plan.window.as_secs_f64();
    let mut tracer = start(env, plan, rep, condition)?;
    for workload in OffCpuWorkload::ALL {
        if !condition.applies_to(workload) {
            continue;
        }
        let before = tracer.as_ref().map(|t| bpf_counters(t.pid())).transpose()?;
        let switches_before = context_switches();
        let started = std::time::Instant::now();
        let rate = workload.run(env, seconds)?;
        let wall = started.elapsed().as_secs_f64();
        let switched = context_switches().saturating_sub(switches_before) as f64 / wall;
        results.rates.push((rep, condition, workload, rate));
        if condition == Condition::None {
            results.switches.push((workload, switched));
        }
        if let (Some(tracer), Some(before)) = (&tracer, before)
            && matches!(
                condition,
                Condition::AgentOffCpu | Condition::AgentOffCpuEvery | Condition::AgentCpu
            )
        {
            let after = bpf_counters(tracer.pid())?;
            results
                .agent_bpf
                .push((condition, workload, after.since(before), wall));
        }
    }
    if let Some(tracer) = tracer.take() {
        let log = tracer_log(env, rep, condition);
        let is_agent = matches!(
            condition,
            Condition::AgentCpu | Condition::AgentOffCpu | Condition::AgentOffCpuEvery
        );
        let status = tracer.stop_tracer(Duration::from_secs(180), is_agent);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let status = match status.map(|(status, _)| status) {
            Ok(Some(status)) => status,
            // A peer that hung at exit: its throughputs stand.
            Ok(None) => return Ok(()),
            Err(error) => anyhow::bail!("{error:#}: {text}"),
        };
        if is_agent && !status.success() {
            anyhow::bail!("the agent failed ({status}): {text}");
        }
        if condition == Condition::GoParkProbes {
            // "@[uprobe:BINARY:runtime.gopark]: N" lines, summed per
            // binary, per second of its run.
            for workload in OffCpuWorkload::ALL {
                let Some(binary) = workload.go_binary() else {
                    continue;
                };
                let hits: f64 = text
                    .lines()
                    .filter(|l| l.starts_with("@[") && l.contains(&format!("/{binary}:")))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                results.gopark_rate.push((workload, hits / seconds));
            }
        }
        // Profiles and stack dumps are not needed afterwards.
        let _ = std::fs::remove_file(env.out.join(format!("offcpu-{rep}.pb.gz")));
    }
    Ok(())
}

fn tracer_log(env: &Env, rep: usize, condition: Condition) -> PathBuf {
    env.out
        .join(format!("offcpu-{rep}-{}.log", condition as u8))
}

/// Starts the tracer of `condition` system-wide and waits until it traces.
fn start(
    env: &Env,
    plan: &Plan,
    rep: usize,
    condition: Condition,
) -> anyhow::Result<Option<Managed>> {
    let log = tracer_log(env, rep, condition);
    let output = env.out.join(format!("offcpu-{rep}.pb.gz"));
    let mut command = match condition {
        Condition::None => return Ok(None),
        Condition::AgentCpu | Condition::AgentOffCpu | Condition::AgentOffCpuEvery => {
            let mut c =
                super::profilers::agent_command(env, plan.hz, &output, Duration::from_secs(1800));
            match condition {
                Condition::AgentOffCpu => {
                    c.arg("--off-cpu");
                }
                Condition::AgentOffCpuEvery => {
                    c.args(["--off-cpu", "--off-cpu-period", "0s"]);
                }
                _ => {}
            }
            c
        }
        Condition::Offcputime => Command::new("offcputime"),
        Condition::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.args(["-e", BPFTRACE_OFF_CPU]);
            c
        }
        Condition::GoParkProbes => {
            let probes: Vec<String> = OffCpuWorkload::ALL
                .iter()
                .filter_map(|w| w.go_binary())
                .flat_map(|b| {
                    let binary = env.bins.join(b).display().to_string();
                    [
                        format!("uprobe:{binary}:runtime.gopark"),
                        format!("uprobe:{binary}:runtime.ready"),
                    ]
                })
                .collect();
            let mut c = Command::new("bpftrace");
            c.args([
                "-e",
                &format!("{} {{ @[probe] = count(); }}", probes.join(", ")),
            ]);
            c
        }
    };
    let mut process = Managed::spawn_logged(&mut command, condition.name(), &log)?;
    process.watch();
    let pid = process.pid();
    wait_until(&mut process, &log, READY_TIMEOUT, || {
        let attached = !bpf_stats::program_ids(pid).is_empty();
        match condition {
            // It prints this once every program is attached.
            Condition::AgentCpu | Condition::AgentOffCpu | Condition::AgentOffCpuEvery => {
                std::fs::read_to_string(&log).is_ok_and(|t| t.contains("profiling "))
            }
            _ => attached,
        }
    })?;
    std::thread::sleep(Duration::from_secs(1));
    Ok(Some(process))
}

/// Summed run time of every BPF program `pid` holds.
fn bpf_counters(pid: u32) -> anyhow::Result<BpfCounters> {
    Ok(bpf_stats::program_counters(pid, None)?.unwrap_or_default())
}

/// Context switches of the whole machine so far (`ctxt` of /proc/stat).
fn context_switches() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("ctxt "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

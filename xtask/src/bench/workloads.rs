//! The programs profiled. Each runs for a given number of seconds and
//! prints `ops N seconds S`, so throughput is work done per second.

use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use super::Env;
use super::process::{Managed, log_tail};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    GoService,
    /// The Go service built with the newest Go the setup installs (only
    /// side by side with bpftrace, beside the Go 1.19 build).
    GoServiceNewGo,
    Syscalls,
    DeepStacks,
    NoFramePointers,
    FramePointers,
}

/// The Go service's binary built with the newest Go
/// (`tools::build_workloads`).
pub const GO_SERVICE_NEW_GO: &str = "goservice-go1.27";

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::GoService,
        Workload::Syscalls,
        Workload::DeepStacks,
        Workload::NoFramePointers,
        Workload::FramePointers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::GoService => "Go service (JSON, SHA-256, maps; 1 goroutine per CPU)",
            Workload::GoServiceNewGo => "the same Go service built with Go 1.27",
            Workload::Syscalls => "C syscalls (64-byte pipe write+read, 1 thread)",
            Workload::DeepStacks => "C deep stacks (100 frames, 1 thread per CPU)",
            Workload::NoFramePointers => {
                "C -O2 without frame pointers (qsort comparator + 4-deep chain, 1 thread)"
            }
            Workload::FramePointers => "the same C built with frame pointers",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Workload::GoService => "go-service",
            Workload::GoServiceNewGo => "go-service-1.27",
            Workload::Syscalls => "syscalls",
            Workload::DeepStacks => "deep-stacks",
            Workload::NoFramePointers => "no-frame-pointers",
            Workload::FramePointers => "frame-pointers",
        }
    }

    pub(super) fn command(self, env: &Env, seconds: f64) -> Command {
        let mut c = match self {
            Workload::GoService => Command::new(env.bins.join("goservice")),
            Workload::GoServiceNewGo => Command::new(env.bins.join(GO_SERVICE_NEW_GO)),
            Workload::Syscalls => Command::new(env.bins.join("syscalls")),
            Workload::DeepStacks => Command::new(env.bins.join("deepstacks")),
            Workload::NoFramePointers => Command::new(env.bins.join("qsortchain-nofp")),
            Workload::FramePointers => Command::new(env.bins.join("qsortchain-fp")),
        };
        c.arg(format!("{seconds}"));
        if self == Workload::DeepStacks {
            c.arg(env.cpus.to_string());
        }
        c
    }

    /// Runs the workload for `seconds`; its throughput in ops per second.
    pub fn run(self, env: &Env, seconds: f64) -> anyhow::Result<f64> {
        run_counting(&mut self.command(env, seconds), self.short(), env, seconds)
    }
}

/// Runs a program that prints `ops N seconds S` and returns N / S.
pub fn run_counting(
    command: &mut Command,
    name: &str,
    env: &Env,
    seconds: f64,
) -> anyhow::Result<f64> {
    let log = env.out.join(format!("workload-{name}.log"));
    let process = Managed::spawn_logged(command, name, &log)?;
    let (status, _) = process.wait(Duration::from_secs_f64(seconds + 60.0))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        anyhow::bail!("workload {name} failed ({status}):\n{}", log_tail(&log));
    }
    parse_rate(&text)
        .with_context(|| format!("workload {name} printed no `ops N seconds S`: {text}"))
}

fn parse_rate(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("ops "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let ops: f64 = words.get(1)?.parse().ok()?;
    let seconds: f64 = words.get(3)?.parse().ok()?;
    (seconds > 0.0).then_some(ops / seconds)
}

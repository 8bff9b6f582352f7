//! `cargo xtask bench [--quick] [--agent PATH] [--only SCENARIO]`: the agent side by side with
//! perf, bpftrace and bcc on this machine, in one run. The full run writes
//! BENCHMARKS.md; `--quick` runs every scenario for a second or two (a
//! smoke test of the harness, called from `cargo xtask test`) and writes
//! target/bench/BENCHMARKS-quick.md instead.

mod bpf_stats;
mod codec;
mod continuous;
mod gostate;
mod growth;
mod interpreters;
mod java;
mod listener;
mod offcpu;
mod overhead;
mod probes;
mod process;
mod profilers;
mod report;
mod sidebyside;
mod stats;
mod stripped;
mod tools;
mod unwinding;
mod workloads;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The scenarios `--only` can name, in the order a full run runs them.
const SCENARIOS: &[&str] = &[
    "overhead",
    "growth",
    "codec",
    "listener",
    "off-cpu",
    "probes",
    "stripped",
    "go-state",
    "java",
    "side-by-side",
    "interpreters",
    "continuous",
    "unwinding",
];

/// Paths and facts every scenario uses.
pub struct Env {
    pub agent: PathBuf,
    /// The built workloads.
    pub bins: PathBuf,
    /// Scratch: logs, profiles, perf.data.
    pub out: PathBuf,
    pub bcc_kernel_source: Option<PathBuf>,
    pub cpus: usize,
}

/// How long and how often: the full run or the quick smoke run.
pub struct Plan {
    pub quick: bool,
    pub hz: u64,
    /// Each workload's run under each condition.
    pub window: Duration,
    pub reps: usize,
    pub process_counts: Vec<usize>,
    pub stack_counts: Vec<u64>,
    pub stacks_hz: u64,
    pub stacks_window: Duration,
    pub addresses: usize,
    pub encode_hz: u64,
    pub encode_window: Duration,
    /// `profiler-agent run --window`: one profile per window.
    pub continuous_window: Duration,
    /// From the agent's readiness to the first measured window boundary
    /// (start-up, first symbolization of every binary, caches filling).
    pub continuous_warmup: Duration,
    /// Before each growth window (processes, busy CPUs): see
    /// `growth::measure`.
    pub growth_warmup: Duration,
    /// Whole windows measured in steady state.
    pub continuous_windows: u64,
    /// Idle processes of the second continuous configuration.
    pub idle_processes: usize,
    /// perf's and bpftrace's settle time and measured period under the
    /// same load (the same-run baseline of the continuous agent).
    pub baseline_warmup: Duration,
    pub baseline_steady: Duration,
    /// The baselines run (quick: perf only, bpftrace's start and exit
    /// are slow).
    pub baselines: Vec<profilers::Tool>,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        let seconds = Duration::from_secs;
        Plan {
            quick,
            hz: 100,
            window: if quick { seconds(1) } else { seconds(6) },
            reps: if quick { 1 } else { 5 },
            process_counts: vec![1, 100, 1000],
            stack_counts: vec![10, 1_000, 100_000],
            stacks_hz: if quick { 1000 } else { 10_000 },
            stacks_window: if quick { seconds(1) } else { seconds(8) },
            addresses: if quick { 1000 } else { 20_000 },
            // 10 kHz on each of 2 CPUs for 5 s: about 100,000 samples.
            encode_hz: if quick { 1000 } else { 10_000 },
            encode_window: if quick { seconds(1) } else { seconds(5) },
            // Full: 10 s warm-up, then 12 windows of 5 s (60 s). Quick:
            // two 2 s windows, enough to see windows built and exported.
            continuous_window: if quick { seconds(2) } else { seconds(5) },
            continuous_warmup: if quick { seconds(1) } else { seconds(10) },
            growth_warmup: if quick { seconds(0) } else { seconds(10) },
            continuous_windows: if quick { 2 } else { 12 },
            idle_processes: 200,
            baseline_warmup: if quick { seconds(0) } else { seconds(2) },
            baseline_steady: if quick { seconds(1) } else { seconds(30) },
            baselines: if quick {
                vec![profilers::Tool::Perf]
            } else {
                vec![profilers::Tool::Perf, profilers::Tool::Bpftrace]
            },
        }
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut quick = false;
    let mut agent: Option<PathBuf> = None;
    let mut only: Option<String> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--agent" => agent = Some(rest.next().context("--agent needs a path")?.into()),
            "--only" => only = Some(rest.next().context("--only needs a scenario")?.clone()),
            other => bail!(
                "bench: unknown argument {other:?} (use --quick, --agent PATH, --only SCENARIO)"
            ),
        }
    }
    let uid = crate::shell::output(std::process::Command::new("id").arg("-u"));
    if uid.is_none_or(|u| u.trim() != "0") {
        bail!("bench loads BPF programs and runs perf system-wide: run it as root");
    }
    let started = Instant::now();
    let root = crate::workspace_root();
    tools::install()?;
    let agent = match agent {
        Some(path) => path,
        None => crate::build_release()?,
    };
    let scratch = root.join("target/bench");
    let env = Env {
        agent,
        bins: scratch.join("bin"),
        out: scratch.join(if quick { "quick" } else { "full" }),
        bcc_kernel_source: tools::bcc_kernel_source(&scratch)?,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    std::fs::create_dir_all(&env.out)?;
    tools::build_workloads(&root, &env.bins)?;
    let plan = Plan::new(quick);
    let _stats = bpf_stats::StatsEnabled::enable()?;

    let mut results = report::Results {
        load_before: load_average(),
        ..report::Results::default()
    };
    // One scenario alone (`--only go-state`), for working on it; the
    // report then says the others were not run.
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if let Some(name) = &only
        && !SCENARIOS.contains(&name.as_str())
    {
        bail!(
            "bench: no scenario {name:?} (one of {})",
            SCENARIOS.join(", ")
        );
    }
    let mut errors = Vec::new();
    if wanted("overhead") {
        results.overhead = overhead::run(&env, &plan);
        errors.append(&mut results.overhead.errors);
    }
    let mut attempt = |what: &str, result: anyhow::Result<()>| {
        if let Err(error) = result {
            errors.push(format!("{what}: {error:#}"));
        }
    };
    if wanted("growth") {
        attempt(
            "processes",
            growth::processes(&env, &plan).map(|r| results.processes = r),
        );
        attempt(
            "stacks",
            growth::stacks(&env, &plan).map(|r| results.stacks = r),
        );
        attempt("CPUs", growth::cpus(&env, &plan).map(|r| results.cpus = r));
    }
    if wanted("codec") {
        attempt(
            "symbolization",
            codec::symbolize(&env, &plan).map(|r| results.symbolize = r),
        );
        attempt(
            "Go symbolization",
            codec::go_symbolize(&env, &plan).map(|r| results.go_symbolize = Some(r)),
        );
        attempt(
            "encoding",
            codec::encoding(&env, &plan).map(|r| results.encoding = Some(r)),
        );
    }
    if wanted("listener") {
        attempt(
            "listener",
            listener::run(&env, &plan).map(|r| results.listener = Some(r)),
        );
    }
    if wanted("off-cpu") {
        results.off_cpu = offcpu::run(&env, &plan);
        errors.append(&mut results.off_cpu.errors);
    }
    if wanted("probes") {
        results.probes = probes::run(&env, &plan);
        errors.append(&mut results.probes.errors);
    }
    if wanted("stripped") {
        results.stripped = stripped::run(&env, &plan);
        errors.append(&mut results.stripped.errors);
    }
    if wanted("go-state") {
        results.go_state = gostate::run(&env, &plan);
        errors.append(&mut results.go_state.errors);
    }
    if wanted("java") {
        results.java = java::run(&env, &plan);
        errors.append(&mut results.java.errors);
    }
    if wanted("side-by-side") {
        results.side_by_side = sidebyside::run(&env, &plan);
        errors.append(&mut results.side_by_side.errors);
    }
    if wanted("interpreters") {
        results.interpreters = interpreters::run(&env, &plan);
        errors.append(&mut results.interpreters.errors);
    }
    if wanted("continuous") {
        results.continuous = continuous::run(&env, &plan);
        errors.append(&mut results.continuous.errors);
    }
    if wanted("unwinding") {
        let (unwinding, mut unwinding_errors) = unwinding::run(&env, &plan);
        results.unwinding = unwinding;
        errors.append(&mut unwinding_errors);
    }
    results.load_after = load_average();
    results.elapsed = started.elapsed();
    results.errors = errors;

    let text = report::markdown(&env, &plan, &results);
    println!("{text}");
    let path = if quick || only.is_some() {
        scratch.join(if quick {
            "BENCHMARKS-quick.md"
        } else {
            "BENCHMARKS-partial.md"
        })
    } else {
        root.join("BENCHMARKS.md")
    };
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    for (name, svg) in report::plots(&results) {
        let file = scratch.join(name);
        std::fs::write(&file, svg).with_context(|| format!("writing {}", file.display()))?;
    }
    eprintln!(
        "bench: wrote {} in {:.0} s",
        path.display(),
        results.elapsed.as_secs_f64()
    );
    if !results.errors.is_empty() {
        bail!(
            "bench: {} scenario(s) failed:\n{}",
            results.errors.len(),
            results.errors.join("\n")
        );
    }
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

//! Probe cost (section 8): a loop of operations between two USDT probes
//! (`tests/fixtures/bench/probeloop.c`) unprobed, under `profiler-agent
//! latency --budget 0 START END` and under the bpftrace script that does
//! the same (`@s[tid] = nsecs` at the start, `hist(nsecs - @s[tid])` at
//! the end), both attached by path before the workload starts. Per tool:
//! the kernel's run time of its uprobe programs per operation (start and
//! end, from bpf_stats), and the workload's throughput over the unprobed
//! one in the same repetition. The trap into the kernel at each probe costs
//! both the same and is in the throughput, not in the BPF time.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::bpf_stats::{self, BpfCounters};
use super::process::{Managed, wait_until};
use super::profilers::READY_TIMEOUT;
use super::stats::Summary;
use super::workloads::run_counting;
use super::{Env, Plan};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracer {
    None,
    Agent,
    Bpftrace,
}

impl Tracer {
    pub const ALL: [Tracer; 3] = [Tracer::None, Tracer::Agent, Tracer::Bpftrace];

    pub fn name(self) -> &'static str {
        match self {
            Tracer::None => "no probes",
            Tracer::Agent => "profiler-agent latency START END",
            Tracer::Bpftrace => "bpftrace start/end hist() script",
        }
    }
}

#[derive(Debug, Default)]
pub struct ProbeBench {
    /// (repetition, tracer, operations per second, BPF counters of the
    /// tracer's programs over the run)
    pub runs: Vec<(usize, Tracer, f64, Option<BpfCounters>)>,
    pub errors: Vec<String>,
}

impl ProbeBench {
    /// Throughput under `tracer` over the unprobed throughput, per
    /// repetition.
    pub fn throughput(&self, tracer: Tracer) -> Option<Summary> {
        let base = |rep: usize| {
            self.runs
                .iter()
                .find(|r| r.0 == rep && r.1 == Tracer::None)
                .map(|r| r.2)
        };
        let ratios: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.1 == tracer)
            .filter_map(|r| Some(r.2 / base(r.0)?))
            .collect();
        Summary::of(&ratios)
    }

    /// BPF nanoseconds per operation (a start and an end run each).
    pub fn bpf_ns_per_operation(&self, tracer: Tracer) -> Option<Summary> {
        let values: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.1 == tracer)
            .filter_map(|r| r.3?.ns_per_run().map(|ns| 2.0 * ns))
            .collect();
        Summary::of(&values)
    }
}

fn workload(env: &Env) -> PathBuf {
    env.bins.join("probeloop")
}

fn log_of(env: &Env, rep: usize, tracer: Tracer) -> PathBuf {
    env.out.join(format!("probes-{rep}-{}.log", tracer as u8))
}

pub fn run(env: &Env, plan: &Plan) -> ProbeBench {
    let mut results = ProbeBench::default();
    let mut broken: Vec<Tracer> = Vec::new();
    for rep in 0..plan.reps {
        let mut order = Tracer::ALL.to_vec();
        order.rotate_left(rep % Tracer::ALL.len());
        for tracer in order {
            if broken.contains(&tracer) {
                continue;
            }
            eprintln!(
                "bench: probes, repetition {}/{}: {}",
                rep + 1,
                plan.reps,
                tracer.name()
            );
            if let Err(error) = one_run(env, plan, rep, tracer, &mut results) {
                results
                    .errors
                    .push(format!("probes under {}: {error:#}", tracer.name()));
                broken.push(tracer);
            }
        }
    }
    results
}

fn one_run(
    env: &Env,
    plan: &Plan,
    rep: usize,
    tracer: Tracer,
    results: &mut ProbeBench,
) -> anyhow::Result<()> {
    let seconds = plan.window.as_secs_f64();
    let binary = workload(env).display().to_string();
    let start_probe = format!("usdt:{binary}:bench:op__start");
    let end_probe = format!("usdt:{binary}:bench:op__done");
    let log = log_of(env, rep, tracer);
    let mut command = match tracer {
        Tracer::None => None,
        Tracer::Agent => {
            let mut c = Command::new(&env.agent);
            c.args(["latency", "--budget", "0", &start_probe, &end_probe]);
            Some(c)
        }
        Tracer::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.args([
                "-e",
                &format!(
                    "{start_probe} {{ @s[tid] = nsecs; }} \
                     {end_probe} /@s[tid]/ {{ @h = hist(nsecs - @s[tid]); delete(@s[tid]); }}"
                ),
            ]);
            Some(c)
        }
    };
    let tracer_process = match command.as_mut() {
        None => None,
        Some(command) => {
            let mut process = Managed::spawn_logged(command, tracer.name(), &log)?;
            process.watch();
            let pid = process.pid();
            wait_until(&mut process, &log, READY_TIMEOUT, || {
                match tracer {
                    // It prints this once every uprobe is attached.
                    Tracer::Agent => {
                        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("attached "))
                    }
                    _ => !bpf_stats::program_ids(pid).is_empty(),
                }
            })?;
            std::thread::sleep(Duration::from_millis(500));
            Some(process)
        }
    };
    let counters = |process: &Option<Managed>| -> anyhow::Result<Option<BpfCounters>> {
        match process {
            Some(p) => bpf_stats::program_counters(p.pid(), Some("kprobe")),
            None => Ok(None),
        }
    };
    let before = counters(&tracer_process)?;
    let rate = run_counting(
        Command::new(workload(env)).arg(format!("{seconds}")),
        "probeloop",
        env,
        seconds,
    )?;
    let after = counters(&tracer_process)?;
    let bpf = match (before, after) {
        (Some(b), Some(a)) => Some(a.since(b)),
        (None, Some(a)) => Some(a),
        _ => None,
    };
    if let Some(process) = tracer_process {
        let (status, _) = process.stop_tracer(Duration::from_secs(60), tracer == Tracer::Agent)?;
        if let Some(status) = status
            && tracer == Tracer::Agent
            && !status.success()
        {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            anyhow::bail!("the agent failed ({status}): {text}");
        }
    }
    results.runs.push((rep, tracer, rate, bpf));
    Ok(())
}

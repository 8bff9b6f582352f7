//! Java: a JVM service-like workload (tests/fixtures/bench/javaservice,
//! one busy thread per CPU) alone, under the agent at 100 Hz, and under
//! JFR's `profile` settings (the JVM's own sampler), conditions rotated
//! within each repetition and each profiled rate divided by the same
//! repetition's unprofiled one; the BPF time per sample while the agent
//! walks the JVM's stacks (Java frames) next to its time on a native
//! workload (the deep-stacks C program) in the same run; and the agent's
//! CPU and peak memory over the Java runs (symbolizing included).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

use super::bpf_stats::{BpfCounters, perf_event_counters};
use super::process::read_usage;
use super::profilers::start_agent;
use super::stats::{Summary, mib};
use super::{Env, Plan};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Alone,
    Agent,
    Jfr,
}

impl Condition {
    const ALL: [Condition; 3] = [Condition::Alone, Condition::Agent, Condition::Jfr];
}

#[derive(Debug, Default)]
pub struct JavaBench {
    /// (repetition, condition, ops per second)
    pub rates: Vec<(usize, Condition, f64)>,
    /// The agent's BPF nanoseconds per run, on the JVM and on the native
    /// deep-stacks workload.
    pub bpf_java_ns: Vec<f64>,
    pub bpf_native_ns: Vec<f64>,
    /// The agent's CPU seconds per wall second and peak RSS on the JVM.
    pub agent_cpu_per_wall: Vec<f64>,
    pub agent_peak_rss: u64,
    pub errors: Vec<String>,
}

impl JavaBench {
    pub fn ratios(&self, condition: Condition) -> Option<Summary> {
        let alone = |rep: usize| {
            self.rates
                .iter()
                .find(|r| r.0 == rep && r.1 == Condition::Alone)
                .map(|r| r.2)
        };
        let ratios: Vec<f64> = self
            .rates
            .iter()
            .filter(|r| r.1 == condition)
            .filter_map(|r| Some(r.2 / alone(r.0)?))
            .collect();
        Summary::of(&ratios)
    }
}

/// The workload's warm-up (JavaService.java): the JIT compiles, a profiler
/// attaches.
const WARMUP: std::time::Duration = std::time::Duration::from_secs(4);

/// Builds the workload's classes into `dir`.
fn build(root: &Path, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let status = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg(root.join("tests/fixtures/bench/javaservice/JavaService.java"))
        .status()
        .context("running javac (Debian's openjdk-17-jdk-headless)")?;
    if !status.success() {
        bail!("javac JavaService.java failed");
    }
    Ok(())
}

/// Starts the workload (`extra` JVM options first); returns it with its
/// pid as it starts its 4 s warm-up (a profiler attaches meanwhile).
fn start(dir: &Path, seconds: f64, extra: &[String]) -> anyhow::Result<(Child, u32)> {
    let mut child = Command::new("java")
        .args(extra)
        .arg("-cp")
        .arg(dir)
        .arg("JavaService")
        .arg(format!("{seconds}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting java")?;
    let stdout = child.stdout.as_mut().context("java's stdout")?;
    // JFR logs its start on stdout first.
    let mut reader = BufReader::new(stdout);
    let mut said = String::new();
    for _ in 0..20 {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        if let Some(pid) = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
        {
            return Ok((child, pid));
        }
        said.push_str(&line);
    }
    bail!("the workload said {said:?}, not \"ready PID\"")
}

/// Waits for the workload; its ops per second.
fn finish(mut child: Child) -> anyhow::Result<f64> {
    let mut stdout = String::new();
    if let Some(out) = child.stdout.as_mut() {
        for line in BufReader::new(out).lines() {
            stdout.push_str(&line?);
            stdout.push('\n');
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("the workload failed ({status})");
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with("ops "))
        .context("no `ops` line")?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let ops: f64 = words.get(1).and_then(|w| w.parse().ok()).context("ops")?;
    let seconds: f64 = words
        .get(3)
        .and_then(|w| w.parse().ok())
        .context("seconds")?;
    Ok(ops / seconds)
}

pub fn run(env: &Env, plan: &Plan) -> JavaBench {
    let mut results = JavaBench::default();
    if let Err(error) = measure(env, plan, &mut results) {
        results.errors.push(format!("Java: {error:#}"));
    }
    results
}

fn measure(env: &Env, plan: &Plan, results: &mut JavaBench) -> anyhow::Result<()> {
    let dir = env.out.join("javaservice");
    build(&crate::workspace_root(), &dir)?;
    let seconds = plan.window.as_secs_f64();
    for rep in 0..plan.reps {
        let mut order = Condition::ALL.to_vec();
        order.rotate_left(rep % Condition::ALL.len());
        for condition in order {
            eprintln!(
                "bench: Java, repetition {}/{}: {condition:?}",
                rep + 1,
                plan.reps
            );
            let rate = match condition {
                Condition::Alone => {
                    let (child, _) = start(&dir, seconds, &[])?;
                    finish(child)?
                }
                Condition::Jfr => {
                    let recording = env.out.join("javaservice.jfr");
                    let option = format!(
                        "-XX:StartFlightRecording=settings=profile,filename={}",
                        recording.display()
                    );
                    let (child, _) = start(&dir, seconds, &[option])?;
                    finish(child)?
                }
                Condition::Agent => {
                    let started = std::time::Instant::now();
                    let (child, pid) = start(&dir, seconds, &[])?;
                    let output = env.out.join("java-agent.pb.gz");
                    let log = env.out.join("java-agent.log");
                    let agent = start_agent(env, plan.hz, &output, &log, Some(pid), &[])?;
                    let agent_pid = agent.pid().context("the agent's pid")?;
                    // The BPF time and the agent's CPU over most of the
                    // measured phase (the agent stops by itself when the
                    // workload exits).
                    std::thread::sleep(WARMUP.saturating_sub(started.elapsed()));
                    let before = perf_event_counters(agent_pid, None)?.unwrap_or_default();
                    let usage_before = read_usage(agent_pid).unwrap_or_default();
                    let measured = seconds * 0.8;
                    std::thread::sleep(std::time::Duration::from_secs_f64(measured));
                    let after = perf_event_counters(agent_pid, None)?.unwrap_or_default();
                    let usage_after = read_usage(agent_pid).unwrap_or_default();
                    let rate = finish(child)?;
                    // It may have stopped already (its process exited).
                    let _ = agent.stop();
                    if let Some(ns) = after.since(before).ns_per_run() {
                        results.bpf_java_ns.push(ns);
                    }
                    results.agent_cpu_per_wall.push(
                        (usage_after.cpu_seconds - usage_before.cpu_seconds) / measured.max(0.1),
                    );
                    results.agent_peak_rss = results.agent_peak_rss.max(usage_after.peak_rss_bytes);
                    rate
                }
            };
            results.rates.push((rep, condition, rate));
        }
        // The same agent on a native workload in the same repetition.
        results.bpf_native_ns.push(native_ns(env, plan)?);
    }
    Ok(())
}

/// The agent's BPF ns per run while it samples the deep-stacks C workload
/// (measured as on the JVM: after it attached, over most of a window).
fn native_ns(env: &Env, plan: &Plan) -> anyhow::Result<f64> {
    let seconds = plan.window.as_secs_f64();
    let mut workload = Command::new(env.bins.join("deepstacks"))
        .arg(format!("{}", seconds + WARMUP.as_secs_f64() + 2.0))
        .stdout(Stdio::null())
        .spawn()
        .context("starting deepstacks")?;
    let output = env.out.join("java-native-agent.pb.gz");
    let log = env.out.join("java-native-agent.log");
    let agent = start_agent(env, plan.hz, &output, &log, Some(workload.id()), &[])?;
    let agent_pid = agent.pid().context("the agent's pid")?;
    let before = perf_event_counters(agent_pid, None)?.unwrap_or_default();
    std::thread::sleep(std::time::Duration::from_secs_f64(seconds * 0.8));
    let after: BpfCounters = perf_event_counters(agent_pid, None)?.unwrap_or_default();
    agent.stop()?;
    let _ = workload.kill();
    let _ = workload.wait();
    after
        .since(before)
        .ns_per_run()
        .context("no BPF runs on the native workload")
}

/// The report's section.
pub fn section(md: &mut String, plan: &Plan, r: &JavaBench) {
    use std::fmt::Write as _;
    let _ = writeln!(md, "## 11. Java (HotSpot)\n");
    let _ = writeln!(
        md,
        "`tests/fixtures/bench/javaservice` on Debian's OpenJDK 17 (one busy thread per CPU: \
         sorting records with a lambda, hashing, strings, a map) for {:.0} s, alone, under the \
         agent at {} Hz (`--pid`, Java frames on), and under JFR (`-XX:StartFlightRecording=\
         settings=profile`: the JVM's own sampler, 10 ms), conditions rotated within each of {} \
         repetitions; ratios are each profiled rate over the same repetition's unprofiled one. \
         BPF time per run is the agent's perf-event program (every sample of every CPU, \
         filtered ones included) while it profiles the JVM, and while it profiles the C \
         deep-stacks workload in the same repetition.\n",
        plan.window.as_secs_f64(),
        plan.hz,
        plan.reps
    );
    let show = |s: Option<Summary>, scale: f64, digits: usize, unit: &str| {
        s.map_or("-".to_string(), |s| s.show(scale, digits, unit))
    };
    let _ = writeln!(md, "| measure | value |");
    let _ = writeln!(md, "|---|---|");
    let _ = writeln!(
        md,
        "| JVM throughput under the agent / alone | {} |",
        show(r.ratios(Condition::Agent), 1.0, 3, "")
    );
    let _ = writeln!(
        md,
        "| JVM throughput under JFR (profile) / alone | {} |",
        show(r.ratios(Condition::Jfr), 1.0, 3, "")
    );
    let _ = writeln!(
        md,
        "| agent BPF ns per run, the JVM | {} |",
        show(Summary::of(&r.bpf_java_ns), 1.0, 0, " ns")
    );
    let _ = writeln!(
        md,
        "| agent BPF ns per run, native deep stacks | {} |",
        show(Summary::of(&r.bpf_native_ns), 1.0, 0, " ns")
    );
    let _ = writeln!(
        md,
        "| agent CPU while profiling the JVM (share of one core) | {} |",
        show(Summary::of(&r.agent_cpu_per_wall), 100.0, 2, " %")
    );
    let _ = writeln!(
        md,
        "| agent peak RSS | {:.1} MiB |\n",
        mib(r.agent_peak_rss)
    );
}

//! Interpreter walks: the BPF time per sample while the agent walks 30
//! interpreter frames, next to its time on a native stack of the same
//! depth (the deep-stacks C program at depth 30, one thread per CPU),
//! workloads alternated within each repetition: CPython (one process per
//! CPU, each in a 30-deep recursion whose innermost frame spins in
//! bytecode) and HotSpot in its interpreter (`-Xint`, one thread per CPU,
//! the same recursion); and the agent's CPU while it profiles them.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::profilers::{Running, start_agent};
use super::stats::Summary;
use super::{Env, Plan};

/// Debian's own interpreter (a stripped distribution build), not whatever
/// `python3` a PATH finds first.
const PYTHON: &str = "/usr/bin/python3";

/// Python frames in each sample of the Python workload (`level` 30 times;
/// `<module>` is one more).
const DEPTH: usize = 30;

const SCRIPT: &str = r#"import sys, time

def level(n):
    if n == 0:
        x = 0
        for i in range(20000):
            x += i
        return x
    return level(n - 1) + 1

deadline = time.monotonic() + float(sys.argv[1])
ops = 0
while time.monotonic() < deadline:
    level(int(sys.argv[2]) - 1)
    ops += 1
print(f"ops {ops} seconds {sys.argv[1]}")
"#;

const JAVA: &str = r#"public class Deep {
    static long level(int n) {
        if (n == 0) {
            long x = 0;
            for (int i = 0; i < 20000; i++) x += i;
            return x;
        }
        return level(n - 1) + 1;
    }

    public static void main(String[] args) throws Exception {
        long deadline = System.nanoTime() + (long) (Double.parseDouble(args[0]) * 1e9);
        int depth = Integer.parseInt(args[1]);
        Thread[] threads = new Thread[Integer.parseInt(args[2])];
        for (int t = 0; t < threads.length; t++) {
            threads[t] = new Thread(() -> {
                while (System.nanoTime() < deadline) level(depth - 1);
            });
            threads[t].start();
        }
        for (Thread thread : threads) thread.join();
    }
}
"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Python,
    Java,
    Native,
}

#[derive(Debug, Default)]
pub struct InterpreterBench {
    /// `PYTHON -V`.
    pub python: String,
    /// The agent's BPF nanoseconds per run on each workload.
    pub python_ns: Vec<f64>,
    pub java_ns: Vec<f64>,
    pub native_ns: Vec<f64>,
    /// Interpreter frames the agent wrote per sample (from its report), to
    /// show the walks measured were the interpreter's.
    pub python_frames_per_sample: Vec<f64>,
    pub java_frames_per_sample: Vec<f64>,
    /// The agent's CPU seconds per wall second while it profiled them.
    pub agent_cpu_python: Vec<f64>,
    pub agent_cpu_java: Vec<f64>,
    pub errors: Vec<String>,
}

impl InterpreterBench {
    /// An interpreter's BPF time per sample over the native one's, per
    /// repetition.
    fn ratio(&self, interpreter: &[f64]) -> Option<Summary> {
        let ratios: Vec<f64> = interpreter
            .iter()
            .zip(&self.native_ns)
            .map(|(python, native)| python / native)
            .collect();
        Summary::of(&ratios)
    }
}

pub fn run(env: &Env, plan: &Plan) -> InterpreterBench {
    let mut results = InterpreterBench::default();
    if let Err(error) = measure(env, plan, &mut results) {
        results.errors.push(format!("interpreters: {error:#}"));
    }
    results
}

fn measure(env: &Env, plan: &Plan, results: &mut InterpreterBench) -> anyhow::Result<()> {
    let version = Command::new(PYTHON)
        .arg("-V")
        .output()
        .with_context(|| format!("running {PYTHON} -V"))?;
    results.python = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let script = env.out.join("interpreter-walk.py");
    std::fs::write(&script, SCRIPT).context("writing the Python workload")?;
    let classes = env.out.join("interpreter-walk-java");
    std::fs::create_dir_all(&classes)?;
    std::fs::write(classes.join("Deep.java"), JAVA).context("writing the Java workload")?;
    let status = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .arg(classes.join("Deep.java"))
        .status()
        .context("running javac (Debian's openjdk-17-jdk-headless)")?;
    anyhow::ensure!(status.success(), "javac Deep.java failed");
    for rep in 0..plan.reps {
        let mut order = [Workload::Python, Workload::Java, Workload::Native];
        order.rotate_left(rep % 3);
        for workload in order {
            eprintln!(
                "bench: interpreter walks, repetition {}/{}: {workload:?}",
                rep + 1,
                plan.reps
            );
            let seconds = plan.window.as_secs_f64() + 20.0;
            let mut children: Vec<Child> = match workload {
                Workload::Python => (0..env.cpus)
                    .map(|_| {
                        Command::new(PYTHON)
                            .arg(&script)
                            .arg(format!("{seconds}"))
                            .arg(DEPTH.to_string())
                            .stdout(Stdio::null())
                            .spawn()
                            .with_context(|| format!("starting {PYTHON}"))
                    })
                    .collect::<anyhow::Result<_>>()?,
                Workload::Java => vec![
                    Command::new("java")
                        .arg("-Xint")
                        .arg("-cp")
                        .arg(&classes)
                        .arg("Deep")
                        .arg(format!("{seconds}"))
                        .arg(DEPTH.to_string())
                        .arg(env.cpus.to_string())
                        .stdout(Stdio::null())
                        .spawn()
                        .context("starting java")?,
                ],
                Workload::Native => vec![
                    Command::new(env.bins.join("deepstacks"))
                        .arg(format!("{seconds}"))
                        .arg(env.cpus.to_string())
                        .arg(DEPTH.to_string())
                        .stdout(Stdio::null())
                        .spawn()
                        .context("starting deepstacks")?,
                ],
            };
            let measured = measure_agent(env, plan, workload, results);
            for child in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            measured?;
        }
    }
    Ok(())
}

/// The agent, whole machine, over one window of the running workload.
fn measure_agent(
    env: &Env,
    plan: &Plan,
    workload: Workload,
    results: &mut InterpreterBench,
) -> anyhow::Result<()> {
    let output = env.out.join("interpreter-agent.pb.gz");
    let log = env.out.join("interpreter-agent.log");
    let agent = start_agent(env, plan.hz, &output, &log, None, &[])?;
    // A JVM is registered once the agent has read its libjvm's tables.
    if workload == Workload::Java {
        std::thread::sleep(Duration::from_secs(2));
    }
    // The BPF counters and the agent's CPU (schedstat, to the nanosecond)
    // at both ends of the window, as every profiler window is measured.
    let start = agent.snapshot()?;
    std::thread::sleep(plan.window);
    let end = agent.snapshot()?;
    let stopped = agent.stop()?;
    let cost = Running::cost(&start, &end);
    let ns = cost
        .bpf
        .and_then(|bpf| bpf.ns_per_run())
        .context("no BPF runs in the window")?;
    match workload {
        Workload::Native => results.native_ns.push(ns),
        Workload::Python | Workload::Java => {
            let (times, cpu, frames, name) = if workload == Workload::Python {
                (
                    &mut results.python_ns,
                    &mut results.agent_cpu_python,
                    &mut results.python_frames_per_sample,
                    "Python",
                )
            } else {
                (
                    &mut results.java_ns,
                    &mut results.agent_cpu_java,
                    &mut results.java_frames_per_sample,
                    "Java",
                )
            };
            times.push(ns);
            cpu.push(cost.cpu_per_wall);
            if let Some(per_sample) = frames_per_sample(&stopped.log, name) {
                frames.push(per_sample);
            }
        }
    }
    // Let the next workload start on quiet CPUs.
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// "… N <language> frames written …" over "wrote … M samples" in the
/// agent's report.
fn frames_per_sample(report: &str, language: &str) -> Option<f64> {
    let number_before = |line: &str, word: &str| -> Option<f64> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| w.trim_end_matches(',') == word)?;
        words.get(at.checked_sub(1)?)?.parse().ok()
    };
    let phrase = format!("{language} frames written");
    let frames = report.lines().find_map(|l| {
        let at = l.find(&phrase)?;
        number_before(&l[..at + language.len()], language)
    })?;
    let samples = report
        .lines()
        .find(|l| l.starts_with("wrote "))
        .and_then(|l| number_before(l, "samples"))?;
    (samples > 0.0).then(|| frames / samples)
}

/// The report's section.
pub fn section(md: &mut String, plan: &Plan, r: &InterpreterBench) {
    use std::fmt::Write as _;
    let _ = writeln!(md, "## 13. Interpreter walks\n");
    let _ = writeln!(
        md,
        "The agent whole machine at {} Hz on a {DEPTH}-deep recursion whose innermost frame \
         spins, in CPython ({}, one process per CPU) and in HotSpot's interpreter (Debian's \
         OpenJDK 17, `-Xint`, one thread per CPU), against the deep-stacks C program at depth \
         {DEPTH} (one thread per CPU); workloads alternated within each of {} repetitions, the \
         perf-event program's time per run over a {:.0} s window (idle CPUs' runs included), \
         and the interpreter's over the native one's in the same repetition.\n",
        plan.hz,
        if r.python.is_empty() {
            "python3"
        } else {
            &r.python
        },
        plan.reps,
        plan.window.as_secs_f64()
    );
    let show = |s: Option<Summary>, scale: f64, digits: usize, unit: &str| {
        s.map_or("-".to_string(), |s| s.show(scale, digits, unit))
    };
    let _ = writeln!(
        md,
        "| stack | BPF ns per run | / native | interpreter frames per sample | agent CPU (share of one core) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (name, times, frames, cpu) in [
        (
            "Python",
            &r.python_ns,
            &r.python_frames_per_sample,
            &r.agent_cpu_python,
        ),
        (
            "Java, interpreted",
            &r.java_ns,
            &r.java_frames_per_sample,
            &r.agent_cpu_java,
        ),
    ] {
        let _ = writeln!(
            md,
            "| {DEPTH} {name} frames | {} | {} | {} | {} |",
            show(Summary::of(times), 1.0, 0, " ns"),
            show(r.ratio(times), 1.0, 2, "x"),
            show(Summary::of(frames), 1.0, 1, ""),
            show(Summary::of(cpu), 100.0, 2, " %"),
        );
    }
    let _ = writeln!(
        md,
        "| {DEPTH} native frames | {} | 1 | - | - |\n",
        show(Summary::of(&r.native_ns), 1.0, 0, " ns"),
    );
}

/// The target lines.
pub fn verdicts(r: &InterpreterBench, verdict: &mut dyn FnMut(Option<bool>, String)) {
    for (name, times) in [("Python", &r.python_ns), ("interpreted Java", &r.java_ns)] {
        let ratio = r.ratio(times);
        verdict(
            ratio.as_ref().map(|s| s.median <= 2.0),
            format!(
                "BPF per sample with {DEPTH} {name} frames <= 2x a native sample of {DEPTH} \
                 frames: {}",
                ratio.map_or("-".to_string(), |s| format!("{:.2}x", s.median))
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_per_sample_from_the_report() {
        let report = "wrote /tmp/a.pb.gz (pprof): 1200 samples from 3 processes in 6.0s\n  \
                      Python: frames read in 2 processes (layout from ...), 2 threads; \
                      36000 Python frames written, 0 samples met a thread not yet registered, 0 cut\n";
        assert_eq!(frames_per_sample(report, "Python"), Some(30.0));
        assert_eq!(frames_per_sample(report, "Java"), None);
        let java = "wrote a (pprof): 100 samples from 1 processes in 6.0s\n  \
                    Java: frames read in 1 JVMs; 3100 Java frames written, 0 stacks cut\n";
        assert_eq!(frames_per_sample(java, "Java"), Some(31.0));
        assert_eq!(frames_per_sample("wrote x: 0 samples", "Python"), None);
    }
}

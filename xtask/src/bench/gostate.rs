//! The Go runtime's state read from outside: `profiler-agent heap` on a
//! heap of 100,000 allocation sites and `profiler-agent goroutines` on
//! 100,000 goroutines, each timed (and the agent's peak RSS taken) against
//! the program's own runtime/pprof writing the same view in the same run;
//! and the program's throughput while the agent reads it back to back,
//! against its throughput alone, paired within each repetition.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::mpsc::Receiver;

use anyhow::{Context, bail};

use super::process::{Managed, Usage};
use super::stats::{Summary, mib};
use super::{Env, Plan};

/// What is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Heap,
    Goroutines,
}

impl View {
    fn mode(self) -> &'static str {
        match self {
            View::Heap => "buckets",
            View::Goroutines => "goroutines",
        }
    }

    fn what(self) -> &'static str {
        match self {
            View::Heap => "heap profile",
            View::Goroutines => "goroutine dump",
        }
    }

    fn of(self, size: usize) -> String {
        match self {
            View::Heap => format!("{size} allocation sites"),
            View::Goroutines => format!("{size} goroutines"),
        }
    }

    fn own(self) -> &'static str {
        match self {
            View::Heap => "pprof.WriteHeapProfile",
            View::Goroutines => "pprof.Lookup(\"goroutine\").WriteTo(w, 2) (stops the world)",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub size: usize,
    /// The agent's read: seconds each, and its peak RSS.
    pub agent_seconds: Vec<f64>,
    pub agent_rss: u64,
    /// The program's own writer, median of five (reported by it).
    pub own_seconds: f64,
    /// Program throughput while read, over alone (paired per repetition).
    pub throughput_ratios: Vec<f64>,
}

#[derive(Debug, Default)]
pub struct GoState {
    pub heap: Option<Reading>,
    pub goroutines: Option<Reading>,
    pub errors: Vec<String>,
}

pub fn run(env: &Env, plan: &Plan) -> GoState {
    let mut results = GoState::default();
    for view in [View::Heap, View::Goroutines] {
        eprintln!("bench: Go state, the {}", view.what());
        match measure(env, plan, view) {
            Ok(reading) => match view {
                View::Heap => results.heap = Some(reading),
                View::Goroutines => results.goroutines = Some(reading),
            },
            Err(error) => results
                .errors
                .push(format!("Go state ({}): {error:#}", view.what())),
        }
    }
    results
}

/// The workload, set up: the process, its own writer's time, and the
/// rest of its output (its `ops` line when it ends).
fn start(
    env: &Env,
    view: View,
    size: usize,
    seconds: f64,
) -> anyhow::Result<(Managed, f64, Receiver<String>)> {
    let mut command = Command::new(env.bins.join("goheap"));
    command
        .args([view.mode(), &size.to_string(), &format!("{seconds}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut workload = Managed::spawn(&mut command, "goheap")?;
    let stdout = workload.take_stdout().context("the workload's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut own = None;
    for line in lines.by_ref() {
        let line = line?;
        if let Some(ns) = line.strip_prefix("self ") {
            own = ns.trim().parse::<f64>().ok().map(|ns| ns / 1e9);
        }
        if line == "ready" {
            let (send, receive) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    let _ = send.send(line);
                }
            });
            return Ok((workload, own.context("no `self` line")?, receive));
        }
    }
    bail!("the workload ended before it was ready")
}

/// One read by the agent: seconds and peak RSS.
fn read_once(env: &Env, view: View, pid: u32) -> anyhow::Result<(f64, Usage)> {
    let mut command = Command::new(&env.agent);
    match view {
        View::Heap => {
            command.args(["heap", "--pid", &pid.to_string(), "--top", "0", "-o"]);
            command.arg(env.out.join("gostate-heap.pb.gz"));
        }
        View::Goroutines => {
            command.args(["goroutines", "--pid", &pid.to_string(), "-o"]);
            command.arg(env.out.join("gostate-goroutines.pb.gz"));
        }
    }
    let log = env.out.join(format!("gostate-{}.log", view.mode()));
    let started = Instant::now();
    let mut agent = Managed::spawn_logged(&mut command, "profiler-agent", &log)?;
    agent.watch();
    let (status, usage) = agent.wait(Duration::from_secs(300))?;
    if !status.success() {
        bail!("{command:?} failed: {}", super::process::log_tail(&log));
    }
    Ok((started.elapsed().as_secs_f64(), usage))
}

/// Runs the workload for `seconds`, with the agent reading it back to
/// back when `read`; its throughput (ops per second). `seconds` is at
/// least four times a read, or the last read may outlive the process.
fn throughput(env: &Env, view: View, size: usize, seconds: f64, read: bool) -> anyhow::Result<f64> {
    let (workload, _, output) = start(env, view, size, seconds)?;
    // Reads stop a quarter before the end: one must not outlive the
    // process it reads.
    let until = Instant::now() + Duration::from_secs_f64(seconds * 0.75);
    while read && Instant::now() < until {
        read_once(env, view, workload.pid())?;
    }
    let line = output
        .recv_timeout(Duration::from_secs_f64(seconds + 120.0))
        .context("the workload printed no `ops` line")?;
    workload.wait(Duration::from_secs(30))?;
    let mut words = line.split_whitespace();
    let ops: f64 = words.nth(1).and_then(|w| w.parse().ok()).context("ops")?;
    let took: f64 = words
        .nth(1)
        .and_then(|w| w.parse().ok())
        .context("seconds")?;
    Ok(ops / took)
}

fn measure(env: &Env, plan: &Plan, view: View) -> anyhow::Result<Reading> {
    let size = if plan.quick { 10_000 } else { 100_000 };
    let reads = if plan.quick { 1 } else { 5 };
    let seconds: f64 = if plan.quick { 2.0 } else { 8.0 };
    let mut reading = Reading {
        size,
        ..Reading::default()
    };
    // Read times: one workload, `reads` reads.
    let (workload, own, _) = start(env, view, size, 3600.0)?;
    reading.own_seconds = own;
    for _ in 0..reads {
        let (took, usage) = read_once(env, view, workload.pid())?;
        reading.agent_seconds.push(took);
        reading.agent_rss = reading.agent_rss.max(usage.peak_rss_bytes);
    }
    drop(workload);
    // The throughput runs last long enough for a read begun at the last
    // moment (three quarters in) to end with room to spare: a debug
    // build's goroutine dump takes 1.6-1.8 s, and under a 2 s workload
    // one outlived the process it read ("No such process").
    let longest = reading.agent_seconds.iter().copied().fold(0.0, f64::max);
    let seconds = seconds.max(6.0 * longest);
    for rep in 0..plan.reps {
        let order = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut rates = [0.0; 2];
        for read in order {
            rates[read as usize] = throughput(env, view, size, seconds, read)?;
        }
        reading.throughput_ratios.push(rates[1] / rates[0]);
    }
    Ok(reading)
}

/// The report's section.
pub fn section(md: &mut String, plan: &Plan, r: &GoState) {
    use std::fmt::Write as _;
    let _ = writeln!(md, "## 10. Go heap and goroutines, read from outside\n");
    let _ = writeln!(
        md,
        "`profiler-agent heap --pid P` and `profiler-agent goroutines --pid P -o F.pb.gz` on \
         `tests/fixtures/bench/goheap` (Go 1.19), each read timed as a whole command (start, \
         open the binary, read, symbolize, encode, write), against the program's own \
         runtime/pprof writing the same view to io.Discard in the same run (median of five, \
         timed by the program). Throughput: the program's work (allocations and SHA-256 on \
         one goroutine per CPU but one, left to the agent, so that what is measured is the \
         read's interference, not two programs sharing a CPU) while the agent reads it back \
         to back, over the same work alone, paired within each of {} repetitions.\n",
        plan.reps
    );
    let _ = writeln!(
        md,
        "| view | agent read | the program's own | agent / own | agent peak RSS | program throughput while read / alone |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for (view, reading) in [(View::Heap, &r.heap), (View::Goroutines, &r.goroutines)] {
        let Some(reading) = reading else {
            let _ = writeln!(
                md,
                "| {} | not measured (see failed scenarios) | | | | |",
                view.what()
            );
            continue;
        };
        let agent = Summary::of(&reading.agent_seconds);
        let ratio = agent.map(|a| a.median / reading.own_seconds.max(1e-9));
        let _ = writeln!(
            md,
            "| {} of {} | {} | {:.3} s ({}) | {} | {:.1} MiB | {} |",
            view.what(),
            view.of(reading.size),
            agent.map_or("-".into(), |a| a.show(1.0, 3, " s")),
            reading.own_seconds,
            view.own(),
            ratio.map_or("-".into(), |r| format!("{r:.2}×")),
            mib(reading.agent_rss),
            Summary::of(&reading.throughput_ratios).map_or("-".into(), |s| s.show(1.0, 3, "")),
        );
    }
    let _ = writeln!(md);
}

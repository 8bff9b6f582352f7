//! How the agent's cost grows: with the number of processes, the number of
//! distinct stacks, and the number of busy CPUs. Per-sample cost should stay
//! flat and memory should follow distinct stacks, not samples.

use std::process::Command;
use std::time::Duration;

use super::process::Managed;
use super::profilers::{AgentReport, Running, WindowCost, start_agent};
use super::{Env, Plan};

/// One measured configuration.
#[derive(Debug, Clone)]
pub struct GrowthRow {
    pub label: String,
    /// The quantity varied (processes, distinct stacks, busy CPUs).
    pub x: u64,
    pub hz: u64,
    pub cost: WindowCost,
    pub peak_rss_bytes: u64,
    pub report: AgentReport,
    /// Distinct stacks of the generator in the profile (folded lines).
    pub stacks_in_profile: Option<u64>,
}

/// Runs the agent over `window` after `warm_up` while `load` runs; `load`
/// is started before the agent so the window sees it from the first
/// sample.
///
/// The warm-up keeps one-time work out of the window: the first sample
/// of each program on the machine (the agent itself, the shell, the
/// bench) builds that program's unwind table, tens of milliseconds for a
/// large binary, and whether it fell inside a 6 s window or just before
/// it moved a row by 2x from run to run (31.6 ms against 0.9 ms of the
/// table thread's CPU in two runs of the 100-process row). Processes first
/// sampled during the window still cost their maps read and registration
/// there: that part of the growth is the load's, and it stays in.
fn measure(
    env: &Env,
    hz: u64,
    window: Duration,
    warm_up: Duration,
    name: &str,
    load: Vec<Managed>,
) -> anyhow::Result<(WindowCost, u64, AgentReport, u64)> {
    let output = env.out.join(format!("growth-{name}.folded"));
    let log = env.out.join(format!("growth-{name}.log"));
    let running = start_agent(env, hz, &output, &log, None, &[])?;
    std::thread::sleep(warm_up);
    let start = running.snapshot()?;
    std::thread::sleep(window);
    let end = running.snapshot()?;
    drop(load);
    let stopped = running.stop()?;
    let folded = std::fs::read_to_string(&output).unwrap_or_default();
    // Only the generator's stacks: the profile is machine-wide.
    let stacks = folded.lines().filter(|l| l.starts_with("stacks;")).count() as u64;
    Ok((
        Running::cost(&start, &end),
        stopped.peak_rss_bytes,
        AgentReport::parse(&stopped.log),
        stacks,
    ))
}

/// How long a load must live: the agent start-up, the warm-up, the window
/// and slack.
fn lifetime(window: Duration, warm_up: Duration) -> f64 {
    (window + warm_up).as_secs_f64() + 30.0
}

/// 1, 100 and 1,000 processes: one busy (deep stacks, one thread); of the
/// rest, half `sleep` (never on a CPU) and half wake every 100 ms for a
/// short burst, sized so that together they use about half a CPU and each
/// is sampled a few times per window.
pub fn processes(env: &Env, plan: &Plan) -> anyhow::Result<Vec<GrowthRow>> {
    let mut rows = Vec::new();
    for &n in &plan.process_counts {
        eprintln!("bench: growth, {n} processes");
        let life = lifetime(plan.window, plan.growth_warmup);
        let mut load = Vec::new();
        load.push(Managed::spawn(
            Command::new(env.bins.join("deepstacks"))
                .args([format!("{life}"), "1".into()])
                .stdout(std::process::Stdio::null()),
            "deepstacks",
        )?);
        let others = n.saturating_sub(1);
        let bursty = others / 2;
        let burst_us = 50_000usize.checked_div(bursty).unwrap_or(0);
        for i in 0..others {
            let mut c = if i < bursty {
                let mut c = Command::new(env.bins.join("burst"));
                c.args([format!("{life}"), burst_us.to_string()]);
                c
            } else {
                let mut c = Command::new("sleep");
                c.arg(format!("{life}"));
                c
            };
            load.push(Managed::spawn(&mut c, "load")?);
        }
        let (cost, rss, report, _) = measure(
            env,
            plan.hz,
            plan.window,
            plan.growth_warmup,
            &format!("procs-{n}"),
            load,
        )?;
        rows.push(GrowthRow {
            label: format!(
                "{n} processes (1 busy, {bursty} bursty, {} sleeping)",
                others - bursty
            ),
            x: n as u64,
            hz: plan.hz,
            cost,
            peak_rss_bytes: rss,
            report,
            stacks_in_profile: None,
        });
    }
    Ok(rows)
}

/// 10, 1,000 and 100,000 distinct stacks (two threads of the generator).
/// Seeing 100,000 distinct stacks takes more than 100,000 samples, far more
/// than a 100 Hz window holds, so these runs sample faster; the last row
/// repeats 10 stacks over twice the window: more samples, same stacks.
pub fn stacks(env: &Env, plan: &Plan) -> anyhow::Result<Vec<GrowthRow>> {
    let mut rows = Vec::new();
    let mut configs: Vec<(u64, Duration)> = plan
        .stack_counts
        .iter()
        .map(|&d| (d, plan.stacks_window))
        .collect();
    configs.push((plan.stack_counts[0], plan.stacks_window * 2));
    for (distinct, window) in configs {
        eprintln!("bench: growth, {distinct} distinct stacks over {window:?}");
        let load = vec![Managed::spawn(
            Command::new(env.bins.join("stacks"))
                .args([
                    format!("{}", lifetime(window, Duration::ZERO)),
                    distinct.to_string(),
                    "2".into(),
                ])
                .stdout(std::process::Stdio::null()),
            "stacks",
        )?];
        let name = format!("stacks-{distinct}-{}s", window.as_secs());
        // No warm-up: these rows follow the generator's stacks from its start.
        let (cost, rss, report, stacks) =
            measure(env, plan.stacks_hz, window, Duration::ZERO, &name, load)?;
        rows.push(GrowthRow {
            label: format!(
                "{distinct} distinct stacks, {} s window",
                window.as_secs_f64()
            ),
            x: distinct,
            hz: plan.stacks_hz,
            cost,
            peak_rss_bytes: rss,
            report,
            stacks_in_profile: Some(stacks),
        });
    }
    Ok(rows)
}

/// The sample rate of a 64-CPU node at 100 Hz, measured directly: every
/// CPU of this machine busy, sampled at 6400 / CPUs Hz.
pub const NODE_SAMPLES_PER_SECOND: u64 = 6400;

/// 1 and 2 busy CPUs (deep-stack threads), then every CPU busy with a
/// mixed load (the Go service, deep C stacks, C without frame pointers)
/// at [`NODE_SAMPLES_PER_SECOND`].
pub fn cpus(env: &Env, plan: &Plan) -> anyhow::Result<Vec<GrowthRow>> {
    let mut rows = Vec::new();
    for busy in 1..=env.cpus {
        eprintln!("bench: growth, {busy} busy CPUs");
        let load = vec![Managed::spawn(
            Command::new(env.bins.join("deepstacks"))
                .args([
                    format!("{}", lifetime(plan.window, plan.growth_warmup)),
                    busy.to_string(),
                ])
                .stdout(std::process::Stdio::null()),
            "deepstacks",
        )?];
        let (cost, rss, report, _) = measure(
            env,
            plan.hz,
            plan.window,
            plan.growth_warmup,
            &format!("cpus-{busy}"),
            load,
        )?;
        rows.push(GrowthRow {
            label: format!("{busy} busy CPUs"),
            x: busy as u64,
            hz: plan.hz,
            cost,
            peak_rss_bytes: rss,
            report,
            stacks_in_profile: None,
        });
    }
    let hz = NODE_SAMPLES_PER_SECOND / env.cpus as u64;
    eprintln!(
        "bench: growth, {} busy CPUs at {hz} Hz, mixed load",
        env.cpus
    );
    let seconds = format!("{}", lifetime(plan.window, plan.growth_warmup));
    let quiet = |name: &str, args: &[&str]| {
        let mut command = Command::new(env.bins.join(name));
        command.args(args).stdout(std::process::Stdio::null());
        Managed::spawn(&mut command, name)
    };
    let load = vec![
        quiet("goservice", &[&seconds])?,
        quiet("deepstacks", &[&seconds, "1"])?,
        quiet("qsortchain-nofp", &[&seconds])?,
    ];
    let (cost, rss, report, _) =
        measure(env, hz, plan.window, plan.growth_warmup, "cpus-node", load)?;
    rows.push(GrowthRow {
        label: format!(
            "{} busy CPUs at {hz} Hz = {NODE_SAMPLES_PER_SECOND} samples/s (a 64-CPU node at \
             100 Hz): Go service, deep C stacks, C without frame pointers",
            env.cpus
        ),
        x: NODE_SAMPLES_PER_SECOND,
        hz,
        cost,
        peak_rss_bytes: rss,
        report,
        stacks_in_profile: None,
    });
    Ok(rows)
}

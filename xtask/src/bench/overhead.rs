//! Overhead on the profiled program: every workload under every profiler,
//! the conditions alternated within each repetition so that the machine's
//! background load hits them alike, and each profiled rate divided by the
//! unprofiled rate of the same repetition.

use super::profilers::{Tool, WindowCost};
use super::stats::Summary;
use super::workloads::Workload;
use super::{Env, Plan};

#[derive(Debug, Default)]
pub struct Overhead {
    /// (repetition, tool, workload, ops per second)
    pub rates: Vec<(usize, Tool, Workload, f64)>,
    /// The profiler's cost while each workload ran.
    pub windows: Vec<(Tool, Workload, WindowCost)>,
    /// (tool, peak RSS bytes, CPU seconds over the whole run) per start.
    pub runs: Vec<(Tool, u64, f64)>,
    pub errors: Vec<String>,
}

impl Overhead {
    /// Profiled rate / unprofiled rate, paired within each repetition.
    pub fn ratios(&self, tool: Tool, workload: Workload) -> Option<Summary> {
        let rate = |rep: usize, t: Tool| {
            self.rates
                .iter()
                .find(|r| r.0 == rep && r.1 == t && r.2 == workload)
                .map(|r| r.3)
        };
        let ratios: Vec<f64> = self
            .rates
            .iter()
            .filter(|r| r.1 == tool && r.2 == workload)
            .filter_map(|r| Some(r.3 / rate(r.0, Tool::None)?))
            .collect();
        Summary::of(&ratios)
    }

    pub fn rates_of(&self, tool: Tool, workload: Workload) -> Option<Summary> {
        let v: Vec<f64> = self
            .rates
            .iter()
            .filter(|r| r.1 == tool && r.2 == workload)
            .map(|r| r.3)
            .collect();
        Summary::of(&v)
    }

    pub fn window_costs(&self, tool: Tool) -> Vec<WindowCost> {
        self.windows
            .iter()
            .filter(|w| w.0 == tool)
            .map(|w| w.2)
            .collect()
    }
}

pub fn run(env: &Env, plan: &Plan) -> Overhead {
    let mut results = Overhead::default();
    let mut broken: Vec<Tool> = Vec::new();
    for rep in 0..plan.reps {
        // Rotate the order each repetition: no condition always runs first
        // (or right after the slow bcc start-up).
        let mut order = Tool::ALL.to_vec();
        order.rotate_left(rep % Tool::ALL.len());
        for tool in order {
            if broken.contains(&tool) {
                continue;
            }
            eprintln!(
                "bench: overhead, repetition {}/{}: {}",
                rep + 1,
                plan.reps,
                tool.name()
            );
            if let Err(error) = one_condition(env, plan, rep, tool, &mut results) {
                results
                    .errors
                    .push(format!("overhead under {}: {error:#}", tool.name()));
                broken.push(tool);
            }
        }
    }
    results
}

/// Starts `tool`, runs every workload under it, stops it.
fn one_condition(
    env: &Env,
    plan: &Plan,
    rep: usize,
    tool: Tool,
    results: &mut Overhead,
) -> anyhow::Result<()> {
    let running = tool.start(env, plan.hz, &format!("overhead-{rep}"))?;
    for &workload in tool.workloads() {
        let start = running.snapshot()?;
        let rate = workload.run(env, plan.window.as_secs_f64())?;
        let end = running.snapshot()?;
        results.rates.push((rep, tool, workload, rate));
        if tool != Tool::None {
            results.windows.push((
                tool,
                workload,
                super::profilers::Running::cost(&start, &end),
            ));
        }
    }
    let output = running.output.clone();
    let stopped = running.stop()?;
    if tool != Tool::None {
        results
            .runs
            .push((tool, stopped.peak_rss_bytes, stopped.cpu_seconds));
    }
    // perf.data and the agent's profile are not needed afterwards; keep the
    // scratch directory small over many repetitions.
    if let Some(path) = output.filter(|_| tool == Tool::Perf) {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

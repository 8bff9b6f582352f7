//! The continuous agent (`profiler-agent run`) in steady state: the whole
//! node at 100 Hz, windows exported to a directory, measured after a
//! warm-up over whole windows, with one busy process and with 200 idle
//! processes besides. perf and bpftrace, system-wide at the same rate under
//! the same load, are the same-run baseline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::process::{Managed, read_rss_bytes, read_usage, wait_until};
use super::profilers::{READY_TIMEOUT, Running, Tool, WindowCost};
use super::stats::Summary;
use super::{Env, Plan};

/// How often VmRSS is sampled (and, near the end, `/metrics` polled).
const POLL: Duration = Duration::from_millis(200);

/// What runs on the machine while the profilers are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// One busy process (C deep stacks, one thread).
    Busy,
    /// The same plus `Plan::idle_processes` sleeping processes.
    BusyAndIdle,
}

impl Setup {
    pub const ALL: [Setup; 2] = [Setup::Busy, Setup::BusyAndIdle];

    pub fn label(self, plan: &Plan) -> String {
        match self {
            Setup::Busy => "1 busy process".into(),
            Setup::BusyAndIdle => format!("1 busy + {} idle processes", plan.idle_processes),
        }
    }

    fn short(self) -> &'static str {
        match self {
            Setup::Busy => "busy",
            Setup::BusyAndIdle => "busy-idle",
        }
    }
}

/// One profiler's steady state under one setup.
#[derive(Debug, Clone)]
pub struct Steady {
    pub setup: Setup,
    pub tool: Tool,
    /// CPU per wall second and BPF counters over the measured period.
    pub cost: WindowCost,
    /// VmRSS samples (bytes) over the measured period.
    pub rss: Option<Summary>,
    /// RssAnon samples (bytes), taken with the VmRSS ones.
    pub anon: Option<Summary>,
    /// VmHWM at the end of the period (start-up and warm-up included).
    pub hwm_bytes: u64,
    /// The agent's own account of its windows (agent rows only).
    pub windows: Option<Windows>,
}

/// Deltas of the agent's `/metrics` over the measured period.
#[derive(Debug, Clone, Default)]
pub struct Windows {
    pub windows: u64,
    pub samples_received: u64,
    pub samples_dropped: u64,
    /// The agent process's CPU seconds over the period.
    pub cpu_seconds: f64,
    /// `profiler_agent_window_build_seconds_total` (symbolize, labels,
    /// encode), when the agent exports it.
    pub build_seconds: Option<f64>,
    /// Per exporter: (name, export attempts, seconds spent in them).
    pub exports: Vec<(String, u64, f64)>,
    /// Profiles built (one per service per window).
    pub profiles: u64,
    /// (service, files) of the export directory after the stop: every
    /// process on the node is profiled, other users' builds included.
    pub services: Vec<(String, usize)>,
}

impl Windows {
    pub fn cpu_per_window(&self) -> Option<f64> {
        (self.windows > 0).then(|| self.cpu_seconds / self.windows as f64)
    }

    pub fn per_window(&self, total: u64) -> Option<f64> {
        (self.windows > 0).then(|| total as f64 / self.windows as f64)
    }

    pub fn build_per_window(&self) -> Option<f64> {
        let build = self.build_seconds?;
        (self.windows > 0).then(|| build / self.windows as f64)
    }

    /// Mean seconds of one export attempt, per exporter.
    pub fn export_means(&self) -> Vec<(String, f64)> {
        self.exports
            .iter()
            .filter(|e| e.1 > 0)
            .map(|e| (e.0.clone(), e.2 / e.1 as f64))
            .collect()
    }
}

#[derive(Debug, Default)]
pub struct Continuous {
    pub rows: Vec<Steady>,
    pub errors: Vec<String>,
}

impl Continuous {
    pub fn row(&self, setup: Setup, tool: Tool) -> Option<&Steady> {
        self.rows
            .iter()
            .find(|r| r.setup == setup && r.tool == tool)
    }
}

pub fn run(env: &Env, plan: &Plan) -> Continuous {
    let mut results = Continuous::default();
    for setup in Setup::ALL {
        let label = setup.label(plan);
        let load = match start_load(env, plan, setup) {
            Ok(load) => load,
            Err(error) => {
                results
                    .errors
                    .push(format!("continuous, {label}: load: {error:#}"));
                continue;
            }
        };
        eprintln!("bench: continuous agent, {label}");
        match measure_agent(env, plan, setup) {
            Ok(row) => results.rows.push(row),
            Err(error) => results
                .errors
                .push(format!("continuous agent, {label}: {error:#}")),
        }
        for &tool in &plan.baselines {
            eprintln!("bench: continuous baseline, {label}: {}", tool.name());
            match measure_peer(env, plan, setup, tool) {
                Ok(row) => results.rows.push(row),
                Err(error) => results.errors.push(format!(
                    "continuous baseline {}, {label}: {error:#}",
                    tool.name()
                )),
            }
        }
        drop(load);
    }
    results
}

/// The busy process (and the idle ones), living long enough for the
/// agent's run and both baselines; killed when the returned vector drops.
fn start_load(env: &Env, plan: &Plan, setup: Setup) -> anyhow::Result<Vec<Managed>> {
    let agent = plan.continuous_warmup
        + plan.continuous_window * (plan.continuous_windows as u32 + 2)
        + READY_TIMEOUT;
    let peers =
        (plan.baseline_warmup + plan.baseline_steady + READY_TIMEOUT) * plan.baselines.len() as u32;
    let life = (agent + peers).as_secs();
    let mut load = vec![Managed::spawn(
        Command::new(env.bins.join("deepstacks"))
            .args([life.to_string(), "1".into()])
            .stdout(Stdio::null()),
        "deepstacks",
    )?];
    if setup == Setup::BusyAndIdle {
        for _ in 0..plan.idle_processes {
            load.push(Managed::spawn(
                Command::new("sleep").arg(life.to_string()),
                "sleep",
            )?);
        }
    }
    Ok(load)
}

/// The agent's command line, for the report.
pub fn command_line(plan: &Plan) -> String {
    format!(
        "profiler-agent run --frequency-hz {} --window {}s --listen 127.0.0.1:PORT \
         --directory-path DIR",
        plan.hz,
        plan.continuous_window.as_secs()
    )
}

fn measure_agent(env: &Env, plan: &Plan, setup: Setup) -> anyhow::Result<Steady> {
    let name = format!("continuous-{}", setup.short());
    let directory = env.out.join(&name);
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory)?;
    let log = env.out.join(format!("{name}.log"));
    let port = free_port()?;
    let mut command = Command::new(&env.agent);
    command
        .arg("run")
        .args(["--frequency-hz", &plan.hz.to_string()])
        .arg("--window")
        .arg(format!("{}s", plan.continuous_window.as_secs()))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--directory-path")
        .arg(&directory);
    // Only the flags configure it, whatever the caller's environment says.
    for (key, _) in std::env::vars() {
        if key.starts_with("PROFILER_AGENT_") {
            command.env_remove(key);
        }
    }
    command.env("PROFILER_AGENT_LOG", "info");
    let mut process = Managed::spawn_logged(&mut command, "profiler-agent run", &log)?;
    process.watch();
    wait_until(&mut process, &log, READY_TIMEOUT, || {
        http_get(port, "/readyz").is_some_and(|(status, _)| status == 200)
    })?;
    let running = Running::from_process(Tool::Agent, process, log, Some(directory.clone()));
    let pid = running.pid().context("the agent has no process")?;
    let result = steady_agent(plan, setup, port, pid, &running);
    // Stopped either way: SIGINT, the last window delivered, exit 0.
    let stopped = running.stop();
    let mut row = result?;
    stopped?;
    let services = services(&directory);
    // A smoke check that holds on any machine: the windows reached disk.
    if services.is_empty() {
        bail!("the agent wrote no profile to {}", directory.display());
    }
    if let Some(windows) = row.windows.as_mut() {
        windows.services = services;
    }
    Ok(row)
}

/// Waits out the warm-up, then measures from one window boundary to the
/// `continuous_windows`-th after it.
fn steady_agent(
    plan: &Plan,
    setup: Setup,
    port: u16,
    pid: u32,
    running: &Running,
) -> anyhow::Result<Steady> {
    let window = plan.continuous_window;
    // A window may be late on a loaded machine: allow plenty before
    // calling the agent broken.
    let slack = window * 2 + Duration::from_secs(30);
    std::thread::sleep(plan.continuous_warmup);
    let before = windows_total(&scrape(port)?)?;
    let (first, start_text) = wait_for_windows(port, before + 1, Instant::now() + window + slack)?;
    let start = running.snapshot()?;
    let target = first + plan.continuous_windows;
    let expected = window * plan.continuous_windows as u32;
    let deadline = Instant::now() + expected + slack;
    let (mut rss, mut anon) = (Vec::new(), Vec::new());
    let end_text = loop {
        match read_rss_bytes(pid) {
            Some((bytes, anonymous)) => {
                rss.push(bytes as f64);
                anon.push(anonymous as f64);
            }
            None => bail!("the agent exited during the steady period"),
        }
        // Near the expected end, watch for the last window boundary.
        if start.at.elapsed() + Duration::from_secs(1) >= expected {
            let text = scrape(port)?;
            if windows_total(&text)? >= target {
                break text;
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "the agent built fewer than {} windows in {:?}",
                plan.continuous_windows,
                expected + slack
            );
        }
        std::thread::sleep(POLL);
    };
    let end = running.snapshot()?;
    let hwm = read_usage(pid).map_or(0, |u| u.peak_rss_bytes);
    let cost = Running::cost(&start, &end);
    let delta = |series: &str| {
        let a = metric_value(&start_text, series);
        let b = metric_value(&end_text, series);
        a.zip(b).map(|(a, b)| (b - a).max(0.0))
    };
    let exports = exporters(&end_text)
        .into_iter()
        .map(|name| {
            let series = |suffix: &str| {
                format!("profiler_agent_export_duration_seconds_{suffix}{{exporter=\"{name}\"}}")
            };
            let count = delta(&series("count")).unwrap_or(0.0) as u64;
            let sum = delta(&series("sum")).unwrap_or(0.0);
            (name, count, sum)
        })
        .collect();
    Ok(Steady {
        setup,
        tool: Tool::Agent,
        cost,
        rss: Summary::of(&rss),
        anon: Summary::of(&anon),
        hwm_bytes: hwm,
        windows: Some(Windows {
            windows: delta("profiler_agent_windows_total").unwrap_or(0.0) as u64,
            samples_received: delta("profiler_agent_samples_received_total").unwrap_or(0.0) as u64,
            samples_dropped: delta("profiler_agent_kernel_samples_dropped_total").unwrap_or(0.0)
                as u64,
            cpu_seconds: (end.cpu_seconds - start.cpu_seconds).max(0.0),
            build_seconds: delta("profiler_agent_window_build_seconds_total"),
            exports,
            profiles: delta("profiler_agent_profiles_total").unwrap_or(0.0) as u64,
            services: Vec::new(),
        }),
    })
}

/// perf record or bpftrace, system-wide at the same rate, under the same
/// load: settle, then CPU and VmRSS over `baseline_steady`.
fn measure_peer(env: &Env, plan: &Plan, setup: Setup, tool: Tool) -> anyhow::Result<Steady> {
    let running = tool.start(env, plan.hz, &format!("continuous-{}", setup.short()))?;
    let pid = running.pid().context("the baseline has no process")?;
    std::thread::sleep(plan.baseline_warmup);
    let measured = (|| -> anyhow::Result<(WindowCost, Vec<f64>, Vec<f64>, u64)> {
        let start = running.snapshot()?;
        let (mut rss, mut anon) = (Vec::new(), Vec::new());
        while start.at.elapsed() < plan.baseline_steady {
            if let Some((bytes, anonymous)) = read_rss_bytes(pid) {
                rss.push(bytes as f64);
                anon.push(anonymous as f64);
            }
            std::thread::sleep(POLL);
        }
        let end = running.snapshot()?;
        let hwm = read_usage(pid).map_or(0, |u| u.peak_rss_bytes);
        Ok((Running::cost(&start, &end), rss, anon, hwm))
    })();
    let output = running.output.clone();
    let stopped = running.stop();
    // perf.data is not needed afterwards.
    if let Some(path) = output.filter(|_| tool == Tool::Perf) {
        let _ = std::fs::remove_file(path);
    }
    let (cost, rss, anon, hwm) = measured?;
    stopped?;
    Ok(Steady {
        setup,
        tool,
        cost,
        rss: Summary::of(&rss),
        anon: Summary::of(&anon),
        hwm_bytes: hwm,
        windows: None,
    })
}

/// Polls `/metrics` until `profiler_agent_windows_total` reaches `target`:
/// the count and the text it was seen in.
fn wait_for_windows(port: u16, target: u64, deadline: Instant) -> anyhow::Result<(u64, String)> {
    loop {
        let text = scrape(port)?;
        let windows = windows_total(&text)?;
        if windows >= target {
            return Ok((windows, text));
        }
        if Instant::now() >= deadline {
            bail!("the agent had built {windows} windows, not {target}, by the deadline");
        }
        std::thread::sleep(POLL);
    }
}

fn windows_total(text: &str) -> anyhow::Result<u64> {
    metric_value(text, "profiler_agent_windows_total")
        .map(|v| v as u64)
        .context("/metrics has no profiler_agent_windows_total")
}

fn scrape(port: u16) -> anyhow::Result<String> {
    match http_get(port, "/metrics") {
        Some((200, body)) => Ok(String::from_utf8_lossy(&body).into_owned()),
        Some((status, _)) => bail!("/metrics answered {status}"),
        None => bail!("/metrics did not answer on 127.0.0.1:{port}"),
    }
}

/// The value of one sample line (`name` or `name{labels}` exactly) of a
/// Prometheus text exposition.
fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The `exporter` labels of the export latency histogram.
fn exporters(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            line.strip_prefix("profiler_agent_export_duration_seconds_count{exporter=\"")?
                .split_once('"')
                .map(|(name, _)| name.to_string())
        })
        .collect()
}

/// Services of the pprof files `cpu-SERVICE-TIMESTAMP.pb.gz` in
/// `directory`, with their file counts, most files first.
fn services(directory: &std::path::Path) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for entry in std::fs::read_dir(directory).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(service) = service_of(&name) {
            *counts.entry(service.to_string()).or_default() += 1;
        }
    }
    let mut services: Vec<(String, usize)> = counts.into_iter().collect();
    services.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    services
}

fn service_of(file: &str) -> Option<&str> {
    let stem = file.strip_suffix(".pb.gz")?;
    let (rest, stamp) = stem.rsplit_once('-')?;
    if stamp.is_empty() || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(rest.strip_prefix("cpu-").unwrap_or(rest))
}

/// A loopback port nobody listens on right now.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// A plain HTTP/1.0 GET to 127.0.0.1:`port`: the status and the body, None
/// when nothing answers (no HTTP client dependency for one endpoint).
fn http_get(port: u16, path: &str) -> Option<(u16, Vec<u8>)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, response[split + 4..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE profiler_agent_windows_total counter
profiler_agent_windows_total 7
profiler_agent_window_build_seconds_total 0.25
profiler_agent_export_duration_seconds_bucket{exporter=\"directory\",le=\"+Inf\"} 6
profiler_agent_export_duration_seconds_sum{exporter=\"directory\"} 0.012
profiler_agent_export_duration_seconds_count{exporter=\"directory\"} 6
";

    #[test]
    fn reads_counters_and_exporters_from_metrics_text() {
        assert_eq!(windows_total(TEXT).unwrap(), 7);
        assert_eq!(
            metric_value(TEXT, "profiler_agent_window_build_seconds_total"),
            Some(0.25)
        );
        assert_eq!(
            metric_value(
                TEXT,
                "profiler_agent_export_duration_seconds_sum{exporter=\"directory\"}"
            ),
            Some(0.012)
        );
        assert_eq!(exporters(TEXT), vec!["directory".to_string()]);
        assert!(metric_value(TEXT, "profiler_agent_windows").is_none());
    }

    #[test]
    fn service_names_come_from_profile_file_names() {
        assert_eq!(
            service_of("cpu-deepstacks-0001795367353320.pb.gz"),
            Some("deepstacks")
        );
        assert_eq!(
            service_of("cpu-memfd_sealed-91173221a7ea-0001795367357373.pb.gz"),
            Some("memfd_sealed-91173221a7ea")
        );
        assert_eq!(service_of(".cpu-x-1.pb.gz.tmp"), None);
        assert_eq!(service_of("notes.txt"), None);
    }

    #[test]
    fn per_window_costs_divide_by_windows() {
        let w = Windows {
            windows: 4,
            cpu_seconds: 0.2,
            build_seconds: Some(0.04),
            exports: vec![("directory".into(), 4, 0.008), ("idle".into(), 0, 0.0)],
            ..Windows::default()
        };
        assert_eq!(w.cpu_per_window(), Some(0.05));
        assert_eq!(w.build_per_window(), Some(0.01));
        assert_eq!(w.export_means(), vec![("directory".to_string(), 0.002)]);
        assert_eq!(Windows::default().cpu_per_window(), None);
    }
}

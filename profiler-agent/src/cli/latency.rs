//! `profiler-agent latency START END | uprobe:PATH:F | --count PROBE`:
//! in-kernel latency histograms (or hit counts) printed like bpftrace.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use profiler_common::latency::LatencyCounter;

use profiler_latency::breaker::Breaker;
use profiler_latency::histogram::{Layout, Unit};
use profiler_latency::plan::{parse_linear, parse_unit};
use profiler_latency::render::{prometheus_report, text_report};
use profiler_latency::{KeyBy, LatencyOptions, Measure, Plan, Session, Snapshot, plan};
use profiler_probes::spec::ProbeSpec;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    profiler-agent latency usdt:./app:demo:op__start usdt:./app:demo:op__done --unit us\n  \
    profiler-agent latency uprobe:/usr/bin/python3.11:PyObject_GC_Collect\n  \
    profiler-agent latency --count usdt:/usr/bin/python3.11:python:gc__start --by arg0 --pid 1234\n  \
    profiler-agent latency uprobe:./server:handle_request --stacks slow.svg --min-latency 10ms")]
pub struct LatencyArgs {
    /// START END probe specs, or one uprobe:PATH:FUNCTION (entry to return),
    /// or with --count one probe. Specs: usdt:PATH:PROVIDER:NAME,
    /// uprobe:PATH:SYMBOL, uretprobe:PATH:SYMBOL (globs allowed).
    #[arg(value_name = "PROBE", required = true, num_args = 1..=2)]
    probes: Vec<String>,

    /// Count hits of one probe instead of timing.
    #[arg(long)]
    count: bool,

    /// Only this process. Without it, every process running the binary,
    /// including processes started after attaching.
    #[arg(short, long, value_name = "PID")]
    pid: Option<u32>,

    /// Stop after this long (500ms, 10s, 2m); without it, run until Ctrl-C.
    #[arg(short, long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,

    /// Also print a histogram of each interval of this length.
    #[arg(short, long, value_parser = humantime::parse_duration)]
    interval: Option<Duration>,

    /// Unit of the recorded durations.
    #[arg(long, default_value = "ns", value_parser = parse_unit)]
    unit: Unit,

    /// Linear buckets MIN,MAX,STEP (in --unit) instead of log2.
    #[arg(long, value_name = "MIN,MAX,STEP", value_parser = parse_linear)]
    linear: Option<Layout>,

    /// Key the histogram by argN (integer argument), str:argN (string it
    /// points to), pid or comm. Arguments are read at the start probe.
    #[arg(long, value_name = "KEY", value_parser = KeyBy::parse)]
    by: Option<KeyBy>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Circuit breaker: hits per second on any one CPU above which the
    /// probes are detached (each hit traps into the kernel, about 1-2 us;
    /// the default keeps them near 1% of a CPU); 0: no limit.
    #[arg(long, value_name = "HITS", default_value_t = profiler_latency::breaker::DEFAULT_BUDGET)]
    budget: u64,

    /// Also write where operations begin, as a profile (the format follows
    /// the extension: .pb.gz, .folded, .svg): the user stack at each start
    /// (with --count, each hit), walked as a CPU sample's is, each
    /// operation weighted by its latency (sample types count and
    /// latency/nanoseconds).
    #[arg(long, value_name = "FILE", value_parser = super::output_path)]
    stacks: Option<std::path::PathBuf>,

    /// With --stacks: only operations at least this long (e.g. 10ms).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          requires = "stacks")]
    min_latency: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Prometheus,
}

pub fn run(args: &LatencyArgs) -> anyhow::Result<()> {
    let specs: Vec<ProbeSpec> = args
        .probes
        .iter()
        .map(|s| ProbeSpec::parse(s))
        .collect::<Result<_, _>>()?;
    let measure = match (args.count, specs.as_slice()) {
        (true, [one]) => Measure::Count(one.clone()),
        (true, _) => bail!("--count takes one probe"),
        (false, [one]) => Measure::function(one.clone())?,
        (false, [start, end]) => Measure::Between {
            start: start.clone(),
            end: end.clone(),
        },
        (false, _) => bail!("give START and END probes, or one uprobe:PATH:FUNCTION"),
    };
    let options = LatencyOptions {
        measure,
        pid: args.pid,
        unit: args.unit,
        layout: args.linear.unwrap_or(Layout::Log2),
        key: args.by.unwrap_or_default(),
        trace: Default::default(),
        stacks: args.stacks.as_ref().map(|_| {
            args.min_latency
                .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
        }),
    };
    let stacks_format = match &args.stacks {
        Some(path) => {
            let format = profiler_profile::Format::from_path(path).with_context(|| {
                format!(
                    "--stacks {}: name the file .pb.gz, .folded or .svg",
                    path.display()
                )
            })?;
            super::record::check_output_writable(path)?;
            Some((path, format))
        }
        None => None,
    };
    let plan = plan(&options)?;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let mut session = Session::start(&plan)?;
    announce(&plan, &session, args);

    let started = Instant::now();
    let mut breaker = Breaker::new(args.budget);
    let mut tripped = None;
    let mut last = Snapshot::default();
    let mut next_interval = args.interval.map(|i| started + i);
    let mut stdout = std::io::stdout();
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        if args.duration.is_some_and(|d| now >= started + d) {
            break;
        }
        if let Some(stacks) = session.stacks_mut() {
            stacks.refresh();
        }
        if let Some(trip) = breaker.check(now, &session.hits_per_cpu(), session.cost_per_hit_ns()) {
            tripped = Some(trip);
            break;
        }
        if let (Some(at), Some(interval)) = (next_interval, args.interval)
            && now >= at
        {
            let snapshot = session.snapshot();
            let delta = snapshot.since(&last);
            writeln!(stdout, "# {:.1}s", (at - started).as_secs_f64())?;
            stdout.write_all(report(&plan, &delta, args.format)?.as_bytes())?;
            stdout.flush()?;
            last = snapshot;
            next_interval = Some(at + interval);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Detach first: every semaphore is lowered even if printing fails.
    session.detach();
    let total = session.snapshot();
    if args.interval.is_some() {
        writeln!(stdout, "# total, {:.1}s", started.elapsed().as_secs_f64())?;
    }
    stdout.write_all(report(&plan, &total, args.format)?.as_bytes())?;
    stdout.flush()?;
    eprintln!("{}", counters_line(&total));
    if let (Some((path, format)), Some(stacks)) = (stacks_format, session.stacks_mut()) {
        let profile = stacks.profile();
        let bytes = format
            .encode(&profile)
            .with_context(|| format!("encoding the {}", format.name()))?;
        super::record::write_output(path, &bytes)?;
        eprintln!(
            "wrote {} ({}): {} operations from {} stacks",
            path.display(),
            format.name(),
            profile.total_samples(),
            profile.samples.len()
        );
    }
    if let Some(trip) = tripped {
        bail!(
            "detached after {:.1}s by the circuit breaker: {trip}; the histogram above covers \
             the time before (raise --budget, or 0 for no limit, if the process can afford it)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn report(plan: &Plan, snapshot: &Snapshot, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Text => text_report(plan, snapshot)?,
        Format::Prometheus => {
            prometheus_report(plan, snapshot, "profiler_probe").map_err(anyhow::Error::msg)?
        }
    })
}

fn announce(plan: &Plan, session: &Session, args: &LatencyArgs) {
    let scope = match args.pid {
        Some(pid) => format!("pid {pid}"),
        None => "every process running the binary, also ones started later".to_string(),
    };
    let keyed = if plan.by_goroutine {
        ", starts keyed by goroutine"
    } else {
        ""
    };
    eprintln!(
        "attached {} uprobes for {}{keyed} (Ctrl-C to print and stop)",
        session.attached(),
        scope
    );
    for site in &plan.sites {
        tracing::info!(site = %site.label, role = ?site.role, offset = site.target.file_offset, "attached");
    }
}

/// What the kernel side counted, on one line: nothing is lost silently.
pub(super) fn counters_line(snapshot: &Snapshot) -> String {
    let parts: Vec<String> = snapshot
        .counters
        .iter()
        .filter(|(c, v)| {
            *v > 0
                || matches!(
                    c,
                    LatencyCounter::EndWithoutStart
                        | LatencyCounter::StartMapFull
                        | LatencyCounter::HistogramFull
                        | LatencyCounter::ArgReadFailed
                )
        })
        .map(|(c, v)| format!("{v} {}", c.name()))
        .collect();
    format!("kernel: {}", parts.join(", "))
}

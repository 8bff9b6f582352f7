//! `profiler-agent trace PROBE [--filter 'argN OP VALUE'] [--print LIST]`:
//! one line per hit of a probe, with the chosen arguments, through a ring
//! buffer; rate-limited in the kernel and counted when dropped, under the
//! circuit breaker.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use profiler_common::latency::{
    FILTER_EQ, FILTER_GE, FILTER_GT, FILTER_LE, FILTER_LT, FILTER_NE, TRACE_SLOTS, TraceEvent,
};

use profiler_latency::breaker::{Breaker, DEFAULT_BUDGET};
use profiler_latency::histogram::{Layout, Unit};
use profiler_latency::{
    KeyBy, LatencyOptions, Measure, Plan, Session, TraceFilter, TraceOptions, plan,
};
use profiler_probes::spec::ProbeSpec;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    profiler-agent trace usdt:./app:shop:order --print arg0,arg1,str:arg2\n  \
    profiler-agent trace usdt:./app:shop:order --filter 'arg1 > 5000' --print arg0,arg1\n  \
    profiler-agent trace 'uprobe:/usr/bin/python3.11:PyObject_GC_Collect' --pid 1234")]
pub struct TraceArgs {
    /// The probe: usdt:PATH:PROVIDER:NAME or uprobe:PATH:FUNCTION (globs and
    /// demangled names allowed). With END: each operation from PROBE to
    /// END on a thread, printed at its end with its latency (arguments are
    /// read at PROBE).
    #[arg(value_name = "PROBE")]
    probe: String,

    /// The probe that ends the operation (see PROBE).
    #[arg(value_name = "END")]
    end: Option<String>,

    /// Only operations at least this long (with END, or a uprobe alone:
    /// entry to return).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    min_latency: Option<Duration>,

    /// Only this process. Without it, every process running the binary.
    #[arg(short, long, value_name = "PID")]
    pid: Option<u32>,

    /// Only hits whose integer argument compares so: 'argN OP VALUE', OP
    /// one of == != < <= > >=, evaluated in the kernel.
    #[arg(long, value_name = "EXPR", value_parser = parse_filter)]
    filter: Option<(usize, u8, i64)>,

    /// Arguments to print, comma-separated: argN (an integer) or str:argN
    /// (the string it points to, one at most); 4 arguments at most,
    /// the filter's included.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    print: Vec<String>,

    /// Stop after this long (500ms, 10s, 2m); without it, until Ctrl-C.
    #[arg(short, long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,

    /// Lines per second on one CPU at most; hits beyond are counted as
    /// dropped (the kernel stops sending, not the probe firing).
    #[arg(long, value_name = "LINES", default_value_t = 1000)]
    max_rate: u64,

    /// Circuit breaker: hits per second on any one CPU above which the
    /// probe is detached (as for `latency`); 0: no limit.
    #[arg(long, value_name = "HITS", default_value_t = DEFAULT_BUDGET)]
    budget: u64,
}

/// What one printed item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PrintItem {
    argument: usize,
    string: bool,
}

fn parse_print(text: &str) -> Result<PrintItem, String> {
    let text = text.trim();
    let (string, rest) = match text.strip_prefix("str:") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let argument = rest
        .strip_prefix("arg")
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or_else(|| format!("--print {text:?}: expected argN or str:argN"))?;
    Ok(PrintItem { argument, string })
}

fn parse_filter(text: &str) -> Result<(usize, u8, i64), String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [arg, op, value] = fields.as_slice() else {
        return Err(format!(
            "{text:?}: expected 'argN OP VALUE', e.g. 'arg1 > 5000' (spaces around OP)"
        ));
    };
    let argument = arg
        .strip_prefix("arg")
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or_else(|| format!("{text:?}: {arg:?} is not argN"))?;
    let op = match *op {
        "==" => FILTER_EQ,
        "!=" => FILTER_NE,
        "<" => FILTER_LT,
        "<=" => FILTER_LE,
        ">" => FILTER_GT,
        ">=" => FILTER_GE,
        other => return Err(format!("{text:?}: {other:?} is not one of == != < <= > >=")),
    };
    let value = match value.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16).ok(),
        None => value.parse::<i64>().ok(),
    }
    .ok_or_else(|| format!("{text:?}: {value:?} is not an integer"))?;
    Ok((argument, op, value))
}

/// The trace slots: the printed arguments, then the filter's if it is not
/// printed. Returns the options and, per printed item, its slot.
fn trace_options(args: &TraceArgs) -> anyhow::Result<(TraceOptions, Vec<(PrintItem, usize)>)> {
    let items: Vec<PrintItem> = args
        .print
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| parse_print(p))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    if items.iter().filter(|i| i.string).count() > 1 {
        bail!("--print: one str:argN at most (each hit carries one string)");
    }
    let mut slots: Vec<usize> = Vec::new();
    let mut slot_of = |argument: usize| -> usize {
        match slots.iter().position(|&a| a == argument) {
            Some(slot) => slot,
            None => {
                slots.push(argument);
                slots.len() - 1
            }
        }
    };
    let printed: Vec<(PrintItem, usize)> = items
        .iter()
        .map(|&item| (item, slot_of(item.argument)))
        .collect();
    let filter = args.filter.map(|(argument, op, value)| TraceFilter {
        slot: slot_of(argument),
        op,
        value,
    });
    if slots.len() > TRACE_SLOTS {
        bail!(
            "--print and --filter name {} arguments: {TRACE_SLOTS} at most",
            slots.len()
        );
    }
    let text_slot = printed.iter().find(|(i, _)| i.string).map(|(_, s)| *s);
    Ok((
        TraceOptions {
            slots,
            text_slot,
            filter,
            max_per_second: args.max_rate,
            min_latency_ns: args
                .min_latency
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        },
        printed,
    ))
}

pub fn run(args: &TraceArgs) -> anyhow::Result<()> {
    let spec = ProbeSpec::parse(&args.probe)?;
    let (trace, printed) = trace_options(args)?;
    let measure = match (&args.end, args.min_latency) {
        (Some(end), _) => Measure::TracePair {
            start: spec,
            end: ProbeSpec::parse(end)?,
        },
        // A function alone with --min-latency: entry to return.
        (None, Some(_)) => match Measure::function(spec)? {
            Measure::Between { start, end } => Measure::TracePair { start, end },
            other => other,
        },
        (None, None) => Measure::Trace(spec),
    };
    let options = LatencyOptions {
        measure,
        pid: args.pid,
        unit: Unit::Nanoseconds,
        layout: Layout::Log2,
        key: KeyBy::None,
        trace,
        stacks: None,
    };
    let plan = plan(&options)?;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let mut session = Session::start(&plan)?;
    let started_ns = monotonic_ns();
    let started = Instant::now();
    let what = match &args.end {
        Some(end) => format!("{} .. {end}", args.probe),
        None => args.probe.clone(),
    };
    let columns = if plan.trace_pairs {
        "TIME(s) PID TID COMM LATENCY ARGUMENTS"
    } else {
        "TIME(s) PID TID COMM ARGUMENTS"
    };
    eprintln!(
        "tracing {} uprobes of {what} (Ctrl-C to stop): {columns}",
        session.attached(),
    );
    let mut breaker = Breaker::new(args.budget);
    let mut tripped = None;
    let mut stdout = std::io::stdout().lock();
    loop {
        let mut write_error = None;
        session.drain_trace(|event| {
            if write_error.is_none()
                && let Err(e) = writeln!(stdout, "{}", line(&plan, &printed, started_ns, event))
            {
                write_error = Some(e);
            }
        });
        if let Some(error) = write_error {
            // A closed pipe (`| head`) ends the trace quietly.
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                break;
            }
            return Err(error).context("writing the trace");
        }
        stdout.flush().ok();
        if stop.load(Ordering::Relaxed) || args.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if let Some(trip) = breaker.check(
            Instant::now(),
            &session.hits_per_cpu(),
            session.cost_per_hit_ns(),
        ) {
            tripped = Some(trip);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    session.detach();
    session.drain_trace(|event| {
        let _ = writeln!(stdout, "{}", line(&plan, &printed, started_ns, event));
    });
    stdout.flush().ok();
    eprintln!("{}", counters_line(&plan, &session.snapshot()));
    if let Some(trip) = tripped {
        bail!(
            "detached after {:.1}s by the circuit breaker: {trip} (raise --budget, or 0 for no \
             limit, if the process can afford it)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// What the kernel side counted: nothing dropped silently.
fn counters_line(plan: &Plan, snapshot: &profiler_latency::Snapshot) -> String {
    use profiler_common::latency::LatencyCounter as C;
    let hits: &[C] = if plan.trace_pairs {
        &[C::Starts, C::Ends, C::EndWithoutStart]
    } else {
        &[C::Traced]
    };
    let parts: Vec<String> = hits
        .iter()
        .chain(&[
            C::TraceFilteredOut,
            C::TraceRateLimited,
            C::TraceRingFull,
            C::ArgReadFailed,
            C::FilteredOut,
        ])
        .map(|&c| format!("{} {}", snapshot.counter(c), c.name()))
        .collect();
    format!("kernel: {}", parts.join(", "))
}

/// `TIME PID TID COMM arg0=.. str:arg2=".."`.
fn line(
    plan: &Plan,
    printed: &[(PrintItem, usize)],
    started_ns: u64,
    event: &TraceEvent,
) -> String {
    let seconds = event.time_ns.saturating_sub(started_ns) as f64 / 1e9;
    let comm = profiler_symbolize::nul_padded(&event.comm);
    let mut text = format!("{seconds:.6} {} {} {comm}", event.tgid, event.tid);
    if plan.trace_pairs {
        text.push_str(&format!(" latency={:.3}ms", event.latency_ns as f64 / 1e6));
    }
    for (item, slot) in printed {
        if event.read & (1 << slot) == 0 {
            text.push_str(&format!(" arg{}=?", item.argument));
            continue;
        }
        let value = event.args[*slot];
        if item.string {
            let string = profiler_symbolize::nul_padded(&event.text);
            text.push_str(&format!(" str:arg{}={string:?}", item.argument));
        } else if plan.trace_signed[*slot] {
            text.push_str(&format!(" arg{}={}", item.argument, value as i64));
        } else {
            text.push_str(&format!(" arg{}={value}", item.argument));
        }
    }
    text
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_print_lists_parse() {
        assert_eq!(parse_filter("arg1 > 5000"), Ok((1, FILTER_GT, 5000)));
        assert_eq!(parse_filter("arg0 == 0x10"), Ok((0, FILTER_EQ, 16)));
        assert_eq!(parse_filter("arg2 <= -3"), Ok((2, FILTER_LE, -3)));
        assert!(parse_filter("arg1>5000").unwrap_err().contains("spaces"));
        assert!(parse_filter("x1 > 5").unwrap_err().contains("argN"));
        assert!(parse_filter("arg1 ~ 5").unwrap_err().contains("not one of"));
        assert_eq!(
            parse_print("str:arg2"),
            Ok(PrintItem {
                argument: 2,
                string: true
            })
        );
        assert!(parse_print("arg").is_err());
    }
}

//! `profiler-agent [record]`: sample, symbolize, write, report.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use profiler_common::Counter;
use profiler_profile::{Format, Profile, ProfileKind};
use profiler_sampling::record::{Recorder, Recording, build_profile};
use profiler_sampling::sampler::{SamplingConfig, check_privileges};

use super::RecordArgs;

const POLL_INTERVAL: Duration = Duration::from_millis(100);
const STATUS_INTERVAL: Duration = Duration::from_millis(500);

pub fn run(args: &RecordArgs) -> anyhow::Result<()> {
    let format = Format::from_path(&args.output).context("output format")?;
    match args.event {
        super::EventArg::PageFaults if args.off_cpu || args.wall => bail!(
            "--event page-faults samples page faults, not time: it does not go with --off-cpu \
             or --wall (record them in a run of their own)"
        ),
        super::EventArg::CpuClock if args.count.is_some() => bail!(
            "--count is the page faults per sample of --event page-faults; the CPU clock is \
             sampled -F times a second"
        ),
        _ => {}
    }
    let mut pids = args.pids.clone();
    pids.sort_unstable();
    pids.dedup();
    for &pid in &pids {
        if !process_exists(pid) {
            bail!("no process with pid {pid} (check `ps -p {pid}`; it may have exited)");
        }
    }
    check_output_writable(&args.output)?;
    check_privileges()?;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }

    let config = SamplingConfig {
        frequency_hz: args.frequency,
        cpu_clock: args.event == super::EventArg::CpuClock,
        page_faults: args.page_fault_period(),
        pids: pids.clone(),
        unwind_tables: !args.frame_pointers_only,
        unwind_table_bytes: args.unwind_table_mib << 20,
        off_cpu: args.off_cpu_config(),
        runtimes: args.runtimes.clone(),
        go_labels: args.go_labels_config(),
    };
    args.debuginfod.configure();
    profiler_runtimes::cache::set_budget(args.runtime_cache_mib << 20);
    let mut recorder = Recorder::start(&config)?;
    let status = !args.quiet && std::io::stderr().is_terminal();
    let scope = if pids.is_empty() {
        "all processes".to_string()
    } else {
        format!("pid {}", join(&pids))
    };
    if !args.quiet {
        let what = match &config.off_cpu {
            None => String::new(),
            Some(off_cpu) => format!(
                " and off-CPU time (intervals from {}, sampled per {})",
                humantime::format_duration(off_cpu.min),
                humantime::format_duration(off_cpu.period)
            ),
        };
        eprintln!(
            "profiling {scope} at {} Hz{what} on {} CPUs for {} (Ctrl-C to stop early)",
            args.frequency,
            recorder_cpus(&recorder),
            humantime::format_duration(args.duration)
        );
    }

    let mut last_status = Instant::now();
    let mut all_exited = false;
    while recorder.elapsed() < args.duration && !stop.load(Ordering::Relaxed) {
        let left = args.duration.saturating_sub(recorder.elapsed());
        recorder.poll(POLL_INTERVAL.min(left));
        if status && last_status.elapsed() >= STATUS_INTERVAL {
            last_status = Instant::now();
            print_status(&recorder);
        }
        if !pids.is_empty() && pids.iter().all(|&pid| !process_exists(pid)) {
            all_exited = true;
            break;
        }
    }
    if status {
        eprint!("\r\x1b[K");
    }
    let mut recording = recorder.finish();
    if all_exited && !args.quiet {
        eprintln!("every profiled process exited; stopping early");
    }
    if recording.kind == profiler_profile::ProfileKind::Cpu {
        check_target_samples(&pids, &recording)?;
    }

    // Debug files asked for while sampling: wait a bounded time for the
    // ones still downloading.
    recording.symbolizer.fetch_deadline = Some(Instant::now() + args.debuginfod.debuginfod_wait);
    let mut profile = build_profile(&mut recording);
    profile.stack_labels = args.stack_labels.clone();
    let bytes = format
        .encode(&profile)
        .with_context(|| format!("encoding the {}", format.name()))?;
    write_output(&args.output, &bytes)?;
    report(&recording, &args.output, format, &profile);
    Ok(())
}

/// Whether `pid` is a live process: present in /proc and not a zombie
/// (an exited process its parent has not reaped yet).
fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised name, which may itself hold ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn recorder_cpus(recorder: &Recorder) -> usize {
    recorder.cpus().len()
}

fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_status(recorder: &Recorder) {
    let recording = recorder.recording();
    eprint!(
        "\r\x1b[K{:>6.1}s  {} samples  {} processes",
        recorder.elapsed().as_secs_f64(),
        recording.samples,
        recording.processes.len()
    );
    let _ = std::io::stderr().flush();
}

/// With --pid, a run that got no sample of any target is an error when a
/// target exited (there is nothing to show), and a warning when they are
/// alive but never ran on a CPU (an empty CPU profile is the right answer).
fn check_target_samples(pids: &[u32], recording: &Recording) -> anyhow::Result<()> {
    if pids.is_empty() || recording.samples > 0 {
        return Ok(());
    }
    let exited: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&p| !process_exists(p))
        .collect();
    if !exited.is_empty() {
        bail!(
            "process {} exited before the first sample; nothing was profiled",
            join(&exited)
        );
    }
    tracing::warn!(
        "no samples for pid {}: it did not run on a CPU during the profile \
         (a CPU profile does not see time spent sleeping or blocked)",
        join(pids)
    );
    Ok(())
}

/// "980 complete to their root, 20 cut short (12 no unwind table, ...)".
pub(crate) fn user_stack_summary(ends: &profiler_sampling::record::UserStackEnds) -> String {
    use profiler_common::unwind::UserStackEnd;
    let reasons = [
        (
            UserStackEnd::NoTable,
            "frame pointers ended in code without a table",
        ),
        (UserStackEnd::TableStop, "a frame the table cannot pass"),
        (UserStackEnd::ReadFault, "stack memory unreadable"),
        (UserStackEnd::Truncated, "the 1024-frame limit"),
    ];
    let cut: Vec<String> = reasons
        .iter()
        .filter(|(end, _)| ends.get(*end) > 0)
        .map(|(end, why)| format!("{} {why}", ends.get(*end)))
        .collect();
    let mut text = format!(
        "{} complete to their root, {} did not reach it",
        ends.get(UserStackEnd::Root),
        ends.incomplete()
    );
    if !cut.is_empty() {
        text.push_str(&format!(" ({})", cut.join(", ")));
    }
    let none = ends.get(UserStackEnd::None);
    if none > 0 {
        text.push_str(&format!(
            "; {none} samples without a user stack (kernel threads)"
        ));
    }
    text
}

/// Fails before profiling when the output cannot be written: a long run
/// into an unwritable path would otherwise be lost at its end, after the
/// samples were taken. Creates the directory, and opens the file (without
/// truncating it) or a scratch file beside it.
pub(super) fn check_output_writable(path: &Path) -> anyhow::Result<()> {
    let cannot = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot write the profile to {}: {e}; choose another --output",
            path.display()
        )
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(cannot)?;
    if path.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(cannot)?;
        return Ok(());
    }
    let scratch = dir.join(format!(".profiler-agent-check-{}", std::process::id()));
    std::fs::File::create(&scratch).map_err(cannot)?;
    let _ = std::fs::remove_file(&scratch);
    Ok(())
}

pub(super) fn write_output(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The kernel counters `report` puts in words.
const EXPLAINED: &[Counter] = &[
    Counter::Fired,
    Counter::Idle,
    Counter::FilteredOut,
    Counter::RingBufferFull,
    Counter::KernelStackFailed,
    Counter::Sent,
    Counter::OffCpuSwitches,
    Counter::OffCpuShort,
    Counter::OffCpuUnsampled,
    Counter::OffCpuLost,
    Counter::OffCpuRingBufferFull,
    Counter::OffCpuSent,
    Counter::OffCpuStacksSent,
    Counter::GoLabelsRead,
    Counter::GoLabelsCut,
    Counter::FramesFromTables,
    Counter::FramesFromFrameRecords,
    Counter::SignalFrames,
    Counter::FramesUnsupportedCfi,
];

fn report(recording: &Recording, output: &Path, format: Format, profile: &Profile) {
    let c = &recording.counters;
    let symbolizer = &recording.symbolizer;
    let s = &symbolizer.stats;
    let off_cpu = match recording.kind {
        // A recording is never of probe hits (see `latency --stacks`),
        // of a heap or of goroutines.
        ProfileKind::Cpu
        | ProfileKind::Latency
        | ProfileKind::Heap
        | ProfileKind::Goroutine
        | ProfileKind::PageFaults => String::new(),
        ProfileKind::OffCpu | ProfileKind::Wall => format!(
            " and {:.3}s off-CPU",
            profile.total_off_cpu_ns() as f64 / 1e9
        ),
    };
    let unit = match (recording.kind, format) {
        (ProfileKind::Cpu, _) | (_, Format::Pprof) => String::new(),
        (kind, _) => format!("; stacks count {}", kind.view_unit()),
    };
    eprintln!(
        "wrote {} ({}): {} samples{off_cpu} from {} processes in {:.1}s{unit}",
        output.display(),
        format.name(),
        profile.total_samples(),
        recording.processes.len(),
        recording.elapsed.as_secs_f64(),
    );
    eprintln!(
        "  kernel: {} samples taken, {} idle, {} outside --pid, {} lost (ring buffer full), \
         {} kernel stack walks failed",
        c[Counter::Fired],
        c[Counter::Idle],
        c[Counter::FilteredOut],
        c[Counter::RingBufferFull],
        c[Counter::KernelStackFailed]
    );
    if recording.queue_dropped > 0 {
        eprintln!(
            "  lost in the agent: {} samples (symbolization fell behind the sampler)",
            recording.queue_dropped
        );
    }
    if recording.samples + recording.queue_dropped != c[Counter::Sent] {
        eprintln!(
            "  note: {} samples sent by the kernel, {} received",
            c[Counter::Sent],
            recording.samples
        );
    }
    eprintln!(
        "  user stacks: {}",
        user_stack_summary(&recording.user_stack_ends)
    );
    if matches!(recording.kind, ProfileKind::OffCpu | ProfileKind::Wall) {
        let o = &recording.off_cpu;
        eprintln!(
            "  off-CPU: {} switches traced; {} intervals recorded ({:.3}s blocked, {:.3}s waiting \
             for a CPU), {} shorter than --off-cpu-min, {} left out by sampling (the recorded \
             ones stand for them), {} lost (the end not seen), {} lost (ring buffer full); {} user \
             stacks sent, {} intervals without theirs (lost on the way: kernel stack only)",
            c[Counter::OffCpuSwitches],
            o.intervals,
            o.blocked_ns as f64 / 1e9,
            o.runq_ns as f64 / 1e9,
            c[Counter::OffCpuShort],
            c[Counter::OffCpuUnsampled],
            c[Counter::OffCpuLost],
            c[Counter::OffCpuRingBufferFull],
            c[Counter::OffCpuStacksSent],
            o.stacks_missing,
        );
    }
    eprintln!(
        "  symbols: {} objects read, {} unreadable; addresses named {} user + {} kernel, \
         unnamed {} user + {} kernel",
        s.objects_parsed,
        s.objects_failed,
        s.user_resolved,
        s.kernel_resolved,
        s.user_unresolved,
        s.kernel_unresolved,
    );
    if let Some(client) = &symbolizer.debuginfod {
        let d = client.stats();
        eprintln!(
            "  debuginfod: {} debug files fetched, {} from the cache, {} no server had, {} \
             rejected (wrong build id), {} failed, {} not asked for (too many waiting); \
             {} still downloading when the profile was written",
            d.fetched,
            d.cached,
            d.missing,
            d.rejected,
            d.failed,
            d.dropped,
            client.pending()
        );
        for problem in client.problems().iter().take(5) {
            eprintln!("  {problem}");
        }
    }
    if s.jit_resolved > 0 {
        eprintln!(
            "  JIT: {} addresses named by the processes' perf maps (/tmp/perf-PID.map)",
            s.jit_resolved
        );
    }
    for line in &recording.runtime_report {
        eprintln!("  {line}");
    }
    let t = &recording.unwind_tables;
    if t.tables_loaded > 0 || c[Counter::FramesFromTables] > 0 {
        eprintln!(
            "  unwinding: tables for {} objects ({} rows, {:.1} MiB) in {} processes, built in \
             {} ms; {} frames unwound by tables, {} Go callers by their frame records, {} \
             through signal frames, {} by frame pointers where the CFI has no table rule",
            t.objects_with_tables,
            t.rows_loaded,
            t.rows_loaded as f64 * 4.0 / (1 << 20) as f64,
            t.processes_registered,
            t.build_time.as_millis(),
            c[Counter::FramesFromTables],
            c[Counter::FramesFromFrameRecords],
            c[Counter::SignalFrames],
            c[Counter::FramesUnsupportedCfi],
        );
    }
    let without = t.objects_no_unwind_info + t.objects_unreadable;
    if without + t.tables_dropped + t.tables_evicted > 0 {
        eprintln!(
            "  objects without unwind tables (frame pointers only): {} without CFI or pclntab, \
             {} unreadable, {} did not fit in --unwind-table-mib, {} evicted",
            t.objects_no_unwind_info, t.objects_unreadable, t.tables_dropped, t.tables_evicted
        );
    }
    // Every counter the lines above do not explain, so that a new one is
    // reported as soon as profiler-common declares it.
    let others: Vec<String> = c
        .iter()
        .filter(|(counter, value)| *value > 0 && !EXPLAINED.contains(counter))
        .map(|(counter, value)| format!("{} {value}", counter.name()))
        .collect();
    if !others.is_empty() {
        eprintln!("  other kernel counters: {}", others.join(", "));
    }
    for problem in symbolizer.problems.iter().take(10) {
        eprintln!("  unsymbolized: {problem}");
    }
    if symbolizer.problems.len() > 10 {
        eprintln!("  ... and {} more", symbolizer.problems.len() - 10);
    }
}

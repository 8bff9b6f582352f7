//! The results as Markdown (printed and written to BENCHMARKS.md), the
//! PASS/MISS verdicts on the project's targets, and SVG growth plots.

use std::fmt::Write;
use std::process::Command;
use std::time::Duration;

use super::codec::{EncodingRow, SymbolizeRow};
use super::continuous::{self, Continuous, Setup};
use super::growth::GrowthRow;
use super::overhead::Overhead;
use super::profilers::Tool;
use super::stats::{Summary, mib};
use super::workloads::Workload;
use super::{Env, Plan};

#[derive(Default)]
pub struct Results {
    pub overhead: Overhead,
    pub processes: Vec<GrowthRow>,
    pub stacks: Vec<GrowthRow>,
    pub cpus: Vec<GrowthRow>,
    pub symbolize: Vec<SymbolizeRow>,
    /// The Go symbolizer against `debug/gosym` (its baseline columns).
    pub go_symbolize: Option<SymbolizeRow>,
    pub encoding: Option<EncodingRow>,
    pub continuous: Continuous,
    pub unwinding: super::unwinding::Unwinding,
    pub listener: Option<super::listener::Listener>,
    pub off_cpu: super::offcpu::OffCpuBench,
    pub stripped: super::stripped::Stripped,
    pub probes: super::probes::ProbeBench,
    pub go_state: super::gostate::GoState,
    pub java: super::java::JavaBench,
    pub side_by_side: super::sidebyside::SideBySide,
    pub interpreters: super::interpreters::InterpreterBench,
    pub load_before: String,
    pub load_after: String,
    pub elapsed: Duration,
    pub errors: Vec<String>,
}

const RSS_LIMIT_MIB: f64 = 64.0;
/// "Flat": the per-sample cost at 1,000 processes within this factor of
/// the cost at 1 (the machine is shared; smaller factors are noise).
const FLAT_FACTOR: f64 = 2.0;

fn shell(command: &str, args: &[&str]) -> String {
    crate::shell::output(Command::new(command).args(args))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn opt(value: Option<f64>, digits: usize, unit: &str) -> String {
    value.map_or("–".into(), |v| format!("{v:.digits$}{unit}"))
}

pub fn markdown(env: &Env, plan: &Plan, r: &Results) -> String {
    let mut md = String::new();
    let o = &r.overhead;
    let _ = writeln!(md, "# Benchmarks\n");
    if plan.quick {
        let _ = writeln!(
            md,
            "**Quick smoke run** (`--quick`): one repetition of about a second per scenario. \
             It proves the harness works; its numbers mean nothing.\n"
        );
    }
    let _ = writeln!(
        md,
        "Measured in one run of `cargo xtask bench{}` on {}.\n\n\
         - kernel {}, {} CPUs ({}), {} GiB memory; no hardware PMU (software CPU clock)\n\
         - perf {}, bpftrace {}, bcc {}, agent `{}`\n\
         - load average before / after: {} / {}; the machine is shared with other builds and \
           tests, so absolute numbers are noisy: compare the ratios, taken pairwise in the \
           same repetition\n\
         - {} repetitions of {} s per workload and condition, conditions alternated (order \
           rotated each repetition); medians with (min–max); run took {:.0} min\n\
         - `kernel.bpf_stats_enabled=1` throughout (for every condition alike)\n",
        if plan.quick { " --quick" } else { "" },
        shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        shell("uname", &["-r"]),
        env.cpus,
        cpu_model(),
        memory_gib(),
        shell("perf", &["--version"]).trim_start_matches("perf version "),
        shell("bpftrace", &["--version"]).trim_start_matches("bpftrace "),
        shell("dpkg-query", &["-W", "-f", "${Version}", "bpfcc-tools"]),
        // Relative to the workspace: the report is committed, and a path
        // of the machine it ran on means nothing to its readers.
        env.agent
            .strip_prefix(crate::workspace_root())
            .unwrap_or(&env.agent)
            .display(),
        r.load_before,
        r.load_after,
        plan.reps,
        plan.window.as_secs_f64(),
        r.elapsed.as_secs_f64() / 60.0,
    );
    if env.bcc_kernel_source.is_some() {
        let _ = writeln!(
            md,
            "bcc compiles against Debian's newest `linux-headers-*-amd64` (this kernel has no \
             headers package); its `profile` program uses only UAPI structures.\n"
        );
    }

    // 1. Overhead.
    let _ = writeln!(md, "## 1. Overhead on the profiled program\n");
    let _ = writeln!(
        md,
        "Throughput under each profiler (system-wide, {} Hz) divided by the unprofiled \
         throughput of the same repetition; 1.000 = no loss.\n",
        plan.hz
    );
    let profilers = &Tool::ALL[1..];
    let _ = write!(md, "| workload | unprofiled ops/s |");
    for t in profilers {
        let _ = write!(md, " {} |", t.name());
    }
    let _ = writeln!(md, "\n|---|---|{}", "---|".repeat(profilers.len()));
    for w in Workload::ALL {
        let base = o
            .rates_of(Tool::None, w)
            .map_or("–".into(), |s| s.show(1.0, 0, ""));
        let _ = write!(md, "| {} | {base} |", w.name());
        for &t in profilers {
            let cell = o
                .ratios(t, w)
                .map_or("not measured".into(), |s| s.show(1.0, 3, ""));
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "\nCommands:\n");
    for t in profilers {
        let _ = writeln!(md, "- {}: `{}`", t.name(), t.command_line(plan.hz));
    }

    // 2. The profilers' own cost.
    let _ = writeln!(md, "\n## 2. The profiler's own cost\n");
    let _ = writeln!(
        md,
        "CPU: the profiler process's user+system CPU seconds per wall second while a workload \
         ran (from /proc/PID/stat). Whole run: its CPU seconds from start to exit (start-up, \
         bcc's compile, writing the output). Peak RSS: VmHWM while it runs, and its ru_maxrss \
         from wait4 as it exits (its last moments, writing the output, which a poll can miss). \
         BPF: run_time_ns / run_cnt of \
         its perf_event programs (the kernel's counters, as `bpftool prog show` prints them), per \
         sample, idle samples included; \
         that time is charged to the interrupted task, not the profiler.\n"
    );
    let _ = writeln!(
        md,
        "| tool | CPU s per wall s | CPU s, whole run | peak RSS MiB | BPF ns per sample | BPF CPU share of one core |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for &t in profilers {
        let windows = o.window_costs(t);
        let cpu = Summary::of(&windows.iter().map(|w| w.cpu_per_wall).collect::<Vec<_>>());
        let bpf = bpf_ns(o, t);
        let bpf_share = Summary::of(
            &windows
                .iter()
                .filter_map(|w| w.bpf.map(|b| b.run_time_ns as f64 / (w.wall_seconds * 1e9)))
                .collect::<Vec<_>>(),
        );
        let runs: Vec<_> = o.runs.iter().filter(|x| x.0 == t).collect();
        let rss = Summary::of(&runs.iter().map(|x| mib(x.1)).collect::<Vec<_>>());
        let whole = Summary::of(&runs.iter().map(|x| x.2).collect::<Vec<_>>());
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            t.name(),
            cpu.map_or("–".into(), |s| s.show(100.0, 2, " %")),
            whole.map_or("–".into(), |s| s.show(1.0, 2, "")),
            rss.map_or("–".into(), |s| s.show(1.0, 1, "")),
            if t.loads_bpf() {
                bpf.map_or("–".into(), |s| s.show(1.0, 0, ""))
            } else {
                "no BPF".into()
            },
            bpf_share.map_or("–".into(), |s| s.show(100.0, 3, " %")),
        );
    }

    // 3. Growth.
    let _ = writeln!(md, "\n## 3. How the agent's cost grows\n");
    let _ = writeln!(
        md,
        "Agent alone, system-wide. µs per sample: the agent process's CPU time divided by \
         its BPF program's runs in the window. Extra load from other users of the machine \
         is sampled too. The process and CPU rows measure after a {} s warm-up, so the \
         one-time table builds of the machine's programs (the agent's own among them) fall \
         before the window; processes first sampled during it are registered in it.\n",
        plan.growth_warmup.as_secs()
    );
    growth_table(&mut md, "Processes", &r.processes);
    growth_table(&mut md, "Distinct stacks", &r.stacks);
    growth_table(&mut md, "Busy CPUs", &r.cpus);
    // The last row is the node's rate measured directly; the rows before
    // it (deep stacks at the plan's rate) give the extrapolation beside it.
    let node = r
        .cpus
        .iter()
        .find(|row| row.x == super::growth::NODE_SAMPLES_PER_SECOND);
    if let Some(node) = node {
        let _ = writeln!(
            md,
            "Measured at {} samples/s (the last row, the agent's CPU between two snapshots \
             after start-up): {:.2} % of one core, {:.1} µs per sample, peak RSS {:.1} MiB.\n",
            super::growth::NODE_SAMPLES_PER_SECOND,
            node.cost.cpu_per_wall * 100.0,
            node.cost.user_us_per_sample().unwrap_or(0.0),
            node.peak_rss_bytes as f64 / (1 << 20) as f64,
        );
    }
    // 4. Symbolization and encoding.
    let _ = writeln!(md, "## 4. Symbolization and encoding\n");
    let _ = writeln!(
        md,
        "One invocation per tool with every address (`profiler-agent symbolize --binary BIN`, \
         `addr2line -f -C -i -e BIN` and, for Go, a program calling `debug/gosym`'s \
         `PCToLine`, all reading the addresses on stdin), addresses picked inside the \
         binary's function symbols. PCs/s = addresses / wall time, parsing included; start-up \
         = the same with one address.\n"
    );
    let _ = writeln!(
        md,
        "| binary | functions | addresses | agent PCs/s | addr2line PCs/s | agent start-up s | addr2line start-up s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    // One row per binary; the Go row's baseline columns are debug/gosym's.
    let row = |md: &mut String, s: &SymbolizeRow, note: &str| {
        let _ = writeln!(
            md,
            "| {}{note} | {} | {} | {:.0} | {:.0} | {:.3} | {:.3} |",
            s.binary,
            s.functions,
            s.addresses,
            s.addresses as f64 / s.agent_all,
            s.addresses as f64 / s.addr2line_all,
            s.agent_one,
            s.addr2line_one
        );
    };
    for s in &r.symbolize {
        row(&mut md, s, "");
    }
    match &r.go_symbolize {
        Some(s) => {
            row(
                &mut md,
                s,
                " (baseline columns: Go's `debug/gosym` `PCToLine`, which expands no inlined calls)",
            );
            let _ = writeln!(md);
        }
        None => {
            let _ = writeln!(
                md,
                "| Go binary vs `debug/gosym` | not measured (see failed scenarios) | | | | | |\n"
            );
        }
    }
    stripped_section(&mut md, &r.stripped);
    if let Some(e) = &r.encoding {
        let _ = writeln!(
            md,
            "A window of {} samples ({} Hz on both CPUs for {} s, one process with 1,000 \
             distinct stacks, `--pid` / `perf record -p`): the agent from SIGINT to exit (symbolize, build, encode, write; up to 0.1 s of it is the \
             agent's poll interval) against perf recording the same duration and rate \
             ({} samples) and `perf script` turning it into text.\n",
            e.agent_samples, e.hz, e.window_seconds, e.perf_samples
        );
        let _ = writeln!(md, "| output | size | time s |");
        let _ = writeln!(md, "|---|---|---|");
        let _ = writeln!(
            md,
            "| agent pprof (.pb.gz) | {:.1} KiB | {:.2} |",
            e.pprof_bytes as f64 / 1024.0,
            e.agent_finish_seconds
        );
        let _ = writeln!(md, "| perf.data | {:.1} MiB | – |", mib(e.perf_data_bytes));
        let _ = writeln!(
            md,
            "| `perf script` text | {:.1} MiB | {:.2} |\n",
            mib(e.perf_script_bytes),
            e.perf_script_seconds
        );
    }

    // 5. The continuous agent.
    continuous_section(&mut md, plan, &r.continuous);

    // 6. Unwinding.
    unwinding_section(&mut md, plan, r);

    // 7. The listener.
    let _ = writeln!(md, "## 7. The listener under load\n");
    match &r.listener {
        Some(l) => {
            let _ = writeln!(
                md,
                "`profiler-agent run --listen 127.0.0.1:PORT` (no exporters). With {} idle \
                 connections held open: VmRSS {:.1} → {:.1} MiB, threads {} → {} (the \
                 thread-per-connection listener it replaced: 4000 idle connections gave 3894 \
                 threads and took RSS from 24 to 111 MiB). {} clients on `/metrics` \
                 (keep-alive) for {:.0} s: {:.0} requests/s, p50 {:.2} ms, p99 {:.2} ms, {} \
                 failures.\n",
                l.idle_connections,
                mib(l.rss_before),
                mib(l.rss_idle),
                l.threads_before,
                l.threads_idle,
                l.clients,
                l.seconds,
                l.requests as f64 / l.seconds,
                l.p50_ms,
                l.p99_ms,
                l.failures
            );
        }
        None => {
            let _ = writeln!(md, "not measured (see failed scenarios)\n");
        }
    }

    // 8. Probes.
    let _ = writeln!(md, "## 8. Probes\n");
    probes_section(&mut md, &r.probes);

    off_cpu_section(&mut md, plan, &r.off_cpu);

    super::gostate::section(&mut md, plan, &r.go_state);
    super::java::section(&mut md, plan, &r.java);
    super::sidebyside::section(&mut md, plan, &r.side_by_side);
    super::interpreters::section(&mut md, plan, &r.interpreters);

    // Targets.
    let _ = writeln!(md, "## Targets\n");
    let _ = writeln!(md, "```");
    for line in verdicts(plan, r) {
        let _ = writeln!(md, "{line}");
    }
    let _ = writeln!(md, "```\n");
    if !r.errors.is_empty() {
        let _ = writeln!(md, "## Failed scenarios\n");
        for e in &r.errors {
            let _ = writeln!(md, "- {}", e.replace('\n', " / "));
        }
    }
    md
}

/// Section 6: complete stacks without frame pointers, and their tables.
fn unwinding_section(md: &mut String, plan: &Plan, r: &Results) {
    let o = &r.overhead;
    let _ = writeln!(md, "## 6. Unwinding code without frame pointers\n");
    let _ = writeln!(
        md,
        "BPF ns per sample (the kernel's `run_time_ns / run_cnt` of each tool's sampling \
         programs) while each workload ran, from the overhead runs above (same run, same \
         alternation). The agent walks `.eh_frame`/pclntab tables; with \
         `--frame-pointers-only`, bpftrace and bcc walk frame pointers and cut stacks of code \
         without them at the leaf (measured here: 0 % of the no-frame-pointer workload's \
         stacks reach `main` that way, 100 % with tables; see tests/e2e/native_unwind.rs). \
         The Go service runs its requests under pprof labels: `--runtimes cpython,hotspot` \
         (no `go`) shows what reading the running goroutine's labels adds to each Go sample.\n"
    );
    let tools = [
        Tool::Agent,
        Tool::AgentFramePointers,
        Tool::AgentNoGoLabels,
        Tool::Bpftrace,
        Tool::Bcc,
    ];
    let _ = write!(md, "| workload |");
    for t in tools {
        let _ = write!(md, " {} |", t.name());
    }
    let _ = writeln!(md, "\n|---|{}", "---|".repeat(tools.len()));
    for w in [
        Workload::NoFramePointers,
        Workload::FramePointers,
        Workload::GoService,
        Workload::DeepStacks,
    ] {
        let _ = write!(md, "| {} |", w.short());
        for t in tools {
            let cell = bpf_ns_of(o, t, w).map_or("–".into(), |s| s.show(1.0, 0, " ns"));
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
    let u = &r.unwinding;
    let _ = writeln!(
        md,
        "\nTable size and build time (`profiler-agent tables --format json`; 4 bytes a row, 8 a \
         64 KiB page; rules are shared node-wide):\n"
    );
    let _ = writeln!(md, "| object | file | source | rows | table | build |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for t in &u.tables {
        let _ = writeln!(
            md,
            "| `{}` | {:.1} MiB | {} | {} | {:.2} MiB | {:.0} ms |",
            t.path,
            mib(t.file_bytes),
            t.source,
            t.rows,
            mib(t.bytes),
            t.build_ms
        );
    }
    if let Some(m) = &u.many {
        let _ = writeln!(
            md,
            "\n{} distinct native binaries (copies of a no-frame-pointer C program with distinct \
             build ids, each waking every 100 ms), the agent system-wide at {} Hz for {:.0} s: \
             peak RSS {:.1} MiB, {:.2} CPU seconds. Its report:\n",
            m.processes,
            plan.hz,
            m.seconds,
            mib(m.peak_rss_bytes),
            m.cpu_seconds
        );
        let _ = writeln!(md, "```");
        for line in &m.report {
            let _ = writeln!(md, "{line}");
        }
        let _ = writeln!(md, "```\n");
    }
}

/// Section 9: what off-CPU profiling costs the profiled program.
fn off_cpu_section(md: &mut String, plan: &Plan, b: &super::offcpu::OffCpuBench) {
    use super::offcpu::{Condition, OffCpuWorkload};
    let _ = writeln!(md, "## 9. Off-CPU profiling\n");
    let _ = writeln!(
        md,
        "Throughput under each tracer, system-wide, divided by the unprofiled throughput of \
         the same repetition (1.000 = no loss); {} repetitions of {:.0} s, conditions rotated. \
         The agent's BPF time per context switch is the kernel's `run_time_ns` of all its \
         programs (CPU sampling included) over the machine's context switches.\n",
        plan.reps,
        plan.window.as_secs_f64()
    );
    let _ = write!(md, "| condition |");
    for w in OffCpuWorkload::ALL {
        let _ = write!(md, " {} |", w.name());
    }
    let _ = writeln!(
        md,
        " command |\n|---|{}---|",
        "---|".repeat(OffCpuWorkload::ALL.len())
    );
    for c in Condition::ALL.into_iter().skip(1) {
        let _ = write!(md, "| {} |", c.name());
        for w in OffCpuWorkload::ALL {
            let ratio = b.ratios(c, w).map_or("–".into(), |s| s.show(1.0, 3, ""));
            let bpf = b
                .bpf_ns_per_switch(c, w)
                .map_or(String::new(), |ns| format!("; BPF {ns:.0} ns/switch"));
            let _ = write!(md, " {ratio}{bpf} |");
        }
        let _ = writeln!(md, " `{}` |", c.command_line(plan.hz).replace('|', "\\|"));
    }
    for w in OffCpuWorkload::ALL {
        let switches: Vec<f64> = b
            .switches
            .iter()
            .filter(|s| s.0 == w)
            .map(|s| s.1)
            .collect();
        if let Some(s) = Summary::of(&switches) {
            let _ = writeln!(
                md,
                "\n{}: {} context switches per second unprofiled (the machine's `ctxt`).",
                w.name(),
                s.show(1.0, 0, "")
            );
        }
    }
    let _ = writeln!(
        md,
        "\nGoroutine-level blocking (what `go tool trace -pprof=sync|net` shows) needs a probe \
         where the Go runtime parks and readies goroutines; a uprobe costs every hit a trap \
         into the kernel. Hits per second while probed (the last row above is the throughput \
         that leaves):\n"
    );
    for w in OffCpuWorkload::ALL {
        let rates: Vec<f64> = b
            .gopark_rate
            .iter()
            .filter(|r| r.0 == w)
            .map(|r| r.1)
            .collect();
        if let Some(rate) = Summary::of(&rates) {
            let _ = writeln!(md, "- {}: {}", w.name(), rate.show(1.0, 0, " hits/s"));
        }
    }
    let _ = writeln!(
        md,
        "\nLeft out of the agent for that cost on a busy Go server: its thread-level off-CPU \
         profile shows the same waits in the runtime's idle threads (futex, epoll).\n"
    );
}

/// BPF ns per sample of `tool` while `workload` ran.
fn bpf_ns_of(o: &Overhead, tool: Tool, workload: Workload) -> Option<Summary> {
    Summary::of(
        &o.windows
            .iter()
            .filter(|w| w.0 == tool && w.1 == workload)
            .filter_map(|w| w.2.bpf?.ns_per_run())
            .collect::<Vec<_>>(),
    )
}

/// Section 5: `profiler-agent run` in steady state against perf and
/// bpftrace under the same load.
fn continuous_section(md: &mut String, plan: &Plan, c: &Continuous) {
    let _ = writeln!(md, "## 5. The continuous agent (`profiler-agent run`)\n");
    let _ = writeln!(
        md,
        "`{}`: the whole node (no `--pids`), windows written as pprof files. Two setups: one \
         busy process (C deep stacks, 1 thread) and the same plus {} idle `sleep` processes. \
         Steady state: after a {} s warm-up, from one window boundary \
         (`profiler_agent_windows_total` ticking on `/metrics`) over the next {} windows ({} s). \
         CPU: user+system CPU seconds per wall second (/proc/PID/stat); VmRSS sampled every \
         0.2 s over the period, median and max, and its anonymous part RssAnon (heap; the rest \
         is page cache of mapped files, e.g. binaries being symbolized, which the kernel can \
         reclaim); VmHWM at the period's end (start-up and warm-up included). Same-run baseline: {} system-wide under the same load, \
         {} s after a {} s settle; ratio = agent ÷ that tool (above 1: the agent costs more; \
         – where the tool's figure is 0 at /proc's 10 ms resolution). BPF: the time of the \
         tool's perf_event programs, charged to the interrupted tasks.\n",
        continuous::command_line(plan),
        plan.idle_processes,
        plan.continuous_warmup.as_secs_f64(),
        plan.continuous_windows,
        (plan.continuous_window * plan.continuous_windows as u32).as_secs_f64(),
        plan.baselines
            .iter()
            .map(|t| format!("`{}`", t.command_line(plan.hz)))
            .collect::<Vec<_>>()
            .join(" and "),
        plan.baseline_steady.as_secs_f64(),
        plan.baseline_warmup.as_secs_f64(),
    );
    if c.rows.is_empty() {
        let _ = writeln!(md, "not measured (see failed scenarios)\n");
        return;
    }
    let _ = writeln!(
        md,
        "| setup | tool | measured s | CPU % of a core | agent CPU ÷ tool's | VmRSS MiB median (max) | RssAnon MiB median (max) | VmHWM MiB | agent RSS ÷ tool's | BPF CPU share of a core |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    let ratio = |agent: Option<f64>, peer: Option<f64>| match (agent, peer) {
        (Some(a), Some(p)) if p > 0.0 => format!("{:.2}", a / p),
        _ => "–".into(),
    };
    for setup in Setup::ALL {
        let agent = c.row(setup, Tool::Agent);
        for &tool in std::iter::once(&Tool::Agent).chain(&plan.baselines) {
            let Some(row) = c.row(setup, tool) else {
                let _ = writeln!(
                    md,
                    "| {} | {} | not measured | | | | | | | |",
                    setup.label(plan),
                    tool.name()
                );
                continue;
            };
            let rss_median = |r: &continuous::Steady| r.rss.map(|s| s.median);
            let (cpu_ratio, rss_ratio) = if tool == Tool::Agent {
                ("–".into(), "–".into())
            } else {
                (
                    ratio(
                        agent.map(|a| a.cost.cpu_per_wall),
                        Some(row.cost.cpu_per_wall),
                    ),
                    ratio(agent.and_then(rss_median), rss_median(row)),
                )
            };
            let bpf_share = row
                .cost
                .bpf
                .map(|b| b.run_time_ns as f64 / (row.cost.wall_seconds * 1e9));
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} | {:.2} | {cpu_ratio} | {} | {} | {:.1} | {rss_ratio} | {} |",
                setup.label(plan),
                tool.name(),
                row.cost.wall_seconds,
                row.cost.cpu_per_wall * 100.0,
                median_max_mib(row.rss),
                median_max_mib(row.anon),
                mib(row.hwm_bytes),
                if tool.loads_bpf() {
                    opt(bpf_share.map(|v| v * 100.0), 3, " %")
                } else {
                    "no BPF".into()
                },
            );
        }
    }
    let _ = writeln!(md);

    let with_build = c
        .rows
        .iter()
        .filter_map(|r| r.windows.as_ref())
        .any(|w| w.build_seconds.is_some());
    let _ = writeln!(
        md,
        "One window's cost, from the agent's `/metrics` over the same periods. Agent CPU per \
         window: all of its CPU time (receiving and aggregating samples for {} s, then \
         symbolizing, encoding and exporting) divided by the windows. {} Export: \
         `profiler_agent_export_duration_seconds` _sum / _count, per exporter (on its own \
         thread, after the build).\n",
        plan.continuous_window.as_secs_f64(),
        if with_build {
            "Build: `profiler_agent_window_build_seconds_total` per window, the run loop's wall \
             time turning a window into profiles (symbolization, labels, encoding)."
        } else {
            "Build: not measured, this agent exports no \
             `profiler_agent_window_build_seconds_total`; the symbolize + encode + export cost \
             of a window is bounded by the agent CPU per window instead."
        }
    );
    let _ = writeln!(
        md,
        "| setup | windows | samples per window | profiles per window | dropped samples | agent CPU ms per window | build ms per window | export ms per window | build + export ms |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for setup in Setup::ALL {
        let Some(w) = c.row(setup, Tool::Agent).and_then(|r| r.windows.as_ref()) else {
            continue;
        };
        let exports = w.export_means();
        let export_total: Option<f64> =
            (!exports.is_empty()).then(|| exports.iter().map(|e| e.1).sum());
        let export_cell = if exports.is_empty() {
            "–".to_string()
        } else {
            exports
                .iter()
                .map(|(name, seconds)| format!("{name} {:.2}", seconds * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let build = w.build_per_window();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {export_cell} | {} |",
            setup.label(plan),
            w.windows,
            opt(w.per_window(w.samples_received), 0, ""),
            opt(w.per_window(w.profiles), 1, ""),
            w.samples_dropped,
            opt(w.cpu_per_window().map(|s| s * 1e3), 2, ""),
            opt(build.map(|s| s * 1e3), 2, ""),
            opt(build.zip(export_total).map(|(b, e)| (b + e) * 1e3), 2, ""),
        );
    }
    let _ = writeln!(md);
    for setup in Setup::ALL {
        let Some(w) = c.row(setup, Tool::Agent).and_then(|r| r.windows.as_ref()) else {
            continue;
        };
        let list: Vec<String> = w
            .services
            .iter()
            .map(|(name, files)| format!("{name} ({files})"))
            .collect();
        let _ = writeln!(
            md,
            "Services profiled, {} (pprof files of the whole run; the node's other processes \
             count toward the agent's cost): {}\n",
            setup.label(plan),
            list.join(", ")
        );
    }
}

/// "median (max)" of byte samples, in MiB.
fn median_max_mib(samples: Option<Summary>) -> String {
    samples.map_or("–".into(), |s| {
        format!(
            "{:.1} ({:.1})",
            s.median / (1024.0 * 1024.0),
            s.max / (1024.0 * 1024.0)
        )
    })
}

fn bpf_ns(o: &Overhead, tool: Tool) -> Option<Summary> {
    Summary::of(
        &o.window_costs(tool)
            .iter()
            .filter_map(|w| w.bpf?.ns_per_run())
            .collect::<Vec<_>>(),
    )
}

fn memory_gib() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("?".into(), |kib| format!("{:.0}", kib / 1024.0 / 1024.0))
}

fn growth_table(md: &mut String, title: &str, rows: &[GrowthRow]) {
    let _ = writeln!(md, "**{title}**\n");
    if rows.is_empty() {
        let _ = writeln!(md, "not measured (see failed scenarios)\n");
        return;
    }
    let _ = writeln!(
        md,
        "| configuration | Hz | samples (BPF runs) | agent CPU % of a core | agent µs per sample | BPF ns per sample | peak RSS MiB | processes in profile | stacks in profile | lost |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {} | {} | {:.1} | {} | {} | {} |",
            row.label,
            row.hz,
            row.cost.bpf.map_or(0, |b| b.run_cnt),
            row.cost.cpu_per_wall * 100.0,
            opt(row.cost.user_us_per_sample(), 1, ""),
            opt(row.cost.bpf.and_then(|b| b.ns_per_run()), 0, ""),
            mib(row.peak_rss_bytes),
            row.report.processes,
            row.stacks_in_profile.map_or("–".into(), |s| s.to_string()),
            row.report.lost,
        );
    }
    let _ = writeln!(md);
}

/// One PASS/MISS line per target (MISS when it could not be measured).
pub fn verdicts(plan: &Plan, r: &Results) -> Vec<String> {
    let o = &r.overhead;
    let mut lines = Vec::new();
    let mut verdict = |ok: Option<bool>, text: String| {
        let word = match ok {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "MISS (not measured)",
        };
        lines.push(format!("{word:<5} {text}"));
    };
    {
        use super::offcpu::{Condition, OffCpuWorkload};
        for w in OffCpuWorkload::ALL {
            let ours = r
                .off_cpu
                .ratios(Condition::AgentOffCpu, w)
                .map(|s| s.median);
            let peers = [Condition::Offcputime, Condition::Bpftrace]
                .map(|c| r.off_cpu.ratios(c, w).map(|s| s.median));
            let ok = ours
                .map(|a| peers.iter().all(|p| p.is_some_and(|p| a > p)))
                .filter(|_| peers.iter().all(Option::is_some));
            verdict(
                ok,
                format!(
                    "--off-cpu costs less than offcputime and bpftrace on {}: throughput ratio {} \
                     vs {} and {}",
                    w.name(),
                    opt(ours, 3, ""),
                    opt(peers[0], 3, ""),
                    opt(peers[1], 3, "")
                ),
            );
        }
    }
    for w in Workload::ALL {
        let ratio = o.ratios(Tool::Agent, w);
        verdict(
            ratio.map(|s| s.median >= 0.99),
            format!(
                "overhead at {} Hz <= 1% on {}: median throughput ratio {}",
                plan.hz,
                w.short(),
                ratio.map_or("–".into(), |s| format!("{:.3}", s.median))
            ),
        );
    }
    let one = r.processes.iter().find(|row| row.x == 1);
    verdict(
        one.map(|row| row.cost.cpu_per_wall <= 0.01),
        format!(
            "agent CPU <= 1% of one core with one busy process: {}",
            one.map_or("–".into(), |row| format!(
                "{:.2} %",
                row.cost.cpu_per_wall * 100.0
            ))
        ),
    );
    let node = r
        .cpus
        .iter()
        .find(|row| row.x == super::growth::NODE_SAMPLES_PER_SECOND);
    verdict(
        node.map(|row| row.cost.cpu_per_wall <= 0.01),
        format!(
            "agent CPU <= 1% of one core at {} samples/s (measured, mixed load, after start-up): {}",
            super::growth::NODE_SAMPLES_PER_SECOND,
            node.map_or("–".into(), |row| format!(
                "{:.2} %",
                row.cost.cpu_per_wall * 100.0
            ))
        ),
    );
    verdict(
        node.map(|row| row.peak_rss_bytes <= 64 << 20),
        format!(
            "agent peak RSS <= 64 MiB at {} samples/s (`record`, {} s warm-up + {} s window; \
             its memory follows the distinct stacks it holds): {}",
            super::growth::NODE_SAMPLES_PER_SECOND,
            plan.growth_warmup.as_secs(),
            plan.window.as_secs(),
            node.map_or("–".into(), |row| format!(
                "{:.1} MiB",
                row.peak_rss_bytes as f64 / (1 << 20) as f64
            ))
        ),
    );
    let go = r.go_symbolize.as_ref();
    verdict(
        go.map(|s| s.agent_all <= s.addr2line_all),
        format!(
            "Go symbolization at least as fast as Go's own debug/gosym (same addresses, parsing \
             included, inlined calls expanded): {}",
            go.map_or("–".into(), |s| format!(
                "{:.0} vs {:.0} PCs/s",
                s.addresses as f64 / s.agent_all,
                s.addresses as f64 / s.addr2line_all
            ))
        ),
    );
    let tables = bpf_ns_of(o, Tool::Agent, Workload::NoFramePointers).map(|s| s.median);
    let bpftrace = bpf_ns_of(o, Tool::Bpftrace, Workload::NoFramePointers).map(|s| s.median);
    verdict(
        tables.zip(bpftrace).map(|(a, b)| a <= b),
        format!(
            "complete stacks of code without frame pointers (tables) at or below bpftrace's \
             frame-pointer cost on the same workload: agent {}, bpftrace {} ns per sample",
            opt(tables, 0, ""),
            opt(bpftrace, 0, "")
        ),
    );
    let agent = bpf_ns(o, Tool::Agent).map(|s| s.median);
    let peers: Vec<Option<f64>> = [Tool::Bpftrace, Tool::Bcc]
        .iter()
        .map(|&t| bpf_ns(o, t).map(|s| s.median))
        .collect();
    verdict(
        match (agent, peers[0], peers[1]) {
            (Some(a), Some(b), Some(c)) => Some(a < b && a < c),
            _ => None,
        },
        format!(
            "BPF ns per sample below bpftrace's and bcc's: agent {}, bpftrace {}, bcc {}",
            opt(agent, 0, ""),
            opt(peers[0], 0, ""),
            opt(peers[1], 0, "")
        ),
    );
    let rss: Vec<u64> = o
        .runs
        .iter()
        .filter(|x| x.0 == Tool::Agent)
        .map(|x| x.1)
        .chain(
            r.processes
                .iter()
                .chain(&r.cpus)
                .map(|row| row.peak_rss_bytes),
        )
        .collect();
    let max_rss = rss.iter().max().copied();
    verdict(
        max_rss.map(|b| mib(b) <= RSS_LIMIT_MIB),
        format!(
            "agent peak RSS <= {RSS_LIMIT_MIB} MiB in the {} Hz runs: max {}",
            plan.hz,
            max_rss.map_or("–".into(), |b| format!("{:.1} MiB", mib(b)))
        ),
    );
    let c = &r.continuous;
    for setup in Setup::ALL {
        let cpu = c.row(setup, Tool::Agent).map(|row| row.cost.cpu_per_wall);
        verdict(
            cpu.map(|v| v <= 0.01),
            format!(
                "agent CPU <= 1% of one core in continuous mode (`run`, {} Hz, whole node), {}: {}",
                plan.hz,
                setup.label(plan),
                opt(cpu.map(|v| v * 100.0), 2, " %")
            ),
        );
    }
    let steady_rss: Vec<(Setup, f64)> = Setup::ALL
        .iter()
        .filter_map(|&setup| Some((setup, c.row(setup, Tool::Agent)?.rss?.max)))
        .collect();
    let max_steady = steady_rss
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1));
    verdict(
        (steady_rss.len() == Setup::ALL.len())
            .then(|| max_steady.is_some_and(|m| m.1 / (1024.0 * 1024.0) <= RSS_LIMIT_MIB)),
        format!(
            "agent steady-state VmRSS <= {RSS_LIMIT_MIB} MiB in continuous mode (both setups): max {}",
            max_steady.map_or("–".into(), |(setup, bytes)| format!(
                "{:.1} MiB ({})",
                bytes / (1024.0 * 1024.0),
                setup.label(plan)
            ))
        ),
    );
    let cost_at = |n: u64| {
        r.processes
            .iter()
            .find(|row| row.x == n)
            .and_then(|row| row.cost.user_us_per_sample())
    };
    let (first, last) = (cost_at(1), cost_at(1000));
    verdict(
        first.zip(last).map(|(a, b)| b <= a * FLAT_FACTOR),
        format!(
            "agent µs per sample flat (within {FLAT_FACTOR}x) from 1 to 1,000 processes: {} -> {}",
            opt(first, 1, " µs"),
            opt(last, 1, " µs")
        ),
    );
    super::sidebyside::verdicts(&r.side_by_side, &mut verdict);
    super::interpreters::verdicts(&r.interpreters, &mut verdict);
    lines
}

/// SVG line plots of the growth scenarios: (file name, SVG text).
pub fn plots(r: &Results) -> Vec<(String, String)> {
    let mut plots = Vec::new();
    for (name, title, rows) in [
        ("growth-processes.svg", "processes", &r.processes),
        ("growth-stacks.svg", "distinct stacks", &r.stacks),
    ] {
        if rows.len() < 2 {
            continue;
        }
        let points: Vec<(String, f64, f64)> = rows
            .iter()
            .map(|row| {
                (
                    row.x.to_string(),
                    row.cost.user_us_per_sample().unwrap_or(0.0),
                    mib(row.peak_rss_bytes),
                )
            })
            .collect();
        plots.push((name.to_string(), line_plot(title, &points)));
    }
    plots
}

/// Two series over the same categories: µs per sample (left) and peak
/// RSS (right), each scaled to its own maximum.
fn line_plot(x_title: &str, points: &[(String, f64, f64)]) -> String {
    let (w, h, left, right, top, bottom) = (520.0, 300.0, 60.0, 60.0, 30.0, 50.0);
    let max_us = points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1e-9);
    let max_rss = points.iter().map(|p| p.2).fold(0.0f64, f64::max).max(1e-9);
    let x = |i: usize| left + (w - left - right) * i as f64 / (points.len() - 1).max(1) as f64;
    let y = |v: f64, max: f64| top + (h - top - bottom) * (1.0 - v / (max * 1.1));
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"18\" text-anchor=\"middle\">profiler-agent cost vs {x_title}</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        w / 2.0,
        h - bottom,
        w - right,
        h - bottom
    );
    for (series, color, max, label, anchor_x) in [
        (
            1,
            "#d62728",
            max_us,
            format!("agent µs/sample (max {max_us:.1})"),
            left,
        ),
        (
            2,
            "#1f77b4",
            max_rss,
            format!("peak RSS MiB (max {max_rss:.1})"),
            w - right,
        ),
    ] {
        let path: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let v = if series == 1 { p.1 } else { p.2 };
                format!("{:.1},{:.1}", x(i), y(v, max))
            })
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        let anchor = if series == 1 { "start" } else { "end" };
        let _ = writeln!(
            svg,
            "<text x=\"{anchor_x}\" y=\"{}\" fill=\"{color}\" text-anchor=\"{anchor}\">{label}</text>",
            if series == 1 {
                top - 2.0 + 14.0
            } else {
                top + 26.0
            }
        );
    }
    for (i, p) in points.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(i),
            h - bottom + 16.0,
            p.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x_title} (categories, not to scale)</text>\n</svg>",
        w / 2.0,
        h - 10.0
    );
    svg
}

/// Names for stripped code: indexing stripped objects, and a debuginfod
/// fetch, against elfutils.
fn stripped_section(md: &mut String, s: &super::stripped::Stripped) {
    if let Some(i) = &s.index {
        let _ = writeln!(
            md,
            "**Stripped objects.** One address in the middle of `.text` of each of {} stripped \
             shared objects of `/usr/lib/x86_64-linux-gnu` ({:.0} MiB), one process per object: \
             `profiler-agent symbolize --binary` (ELF symbols, the debug-file and MiniDebugInfo \
             checks, and the FDE index that names an unnamed address by its function's start; \
             {} named by a symbol table, {} grouped by their FDE) against `eu-addr2line -f -e`. \
             Debian's objects carry no MiniDebugInfo: its cost here is the check.\n",
            i.objects,
            i.bytes as f64 / (1 << 20) as f64,
            i.named,
            i.grouped
        );
        let _ = writeln!(md, "| tool | total s | ms per object | peak RSS MiB |");
        let _ = writeln!(md, "|---|---|---|---|");
        for (tool, run) in [("profiler-agent", i.agent), ("eu-addr2line", i.elfutils)] {
            let _ = writeln!(
                md,
                "| {tool} | {:.2} | {:.1} | {:.1} |",
                run.seconds,
                run.seconds * 1e3 / i.objects.max(1) as f64,
                run.peak_kib as f64 / 1024.0
            );
        }
        let _ = writeln!(
            md,
            "\nAgent / elfutils: time {:.2}×, peak memory {:.2}×.\n",
            i.agent.seconds / i.elfutils.seconds.max(1e-9),
            i.agent.peak_kib as f64 / (i.elfutils.peak_kib.max(1)) as f64
        );
    }
    if let Some(f) = &s.fetch {
        let elfutils = f.find.seconds + f.addr2line.seconds;
        let _ = writeln!(
            md,
            "**A debuginfod fetch.** The debug file of a stripped binary ({:.0} MiB: this xtask \
             binary's DWARF, padded) served by elfutils' `debuginfod` on loopback, fetched into \
             an empty cache and used to name {} addresses: `profiler-agent symbolize` (fetch, \
             build-id check, cache, parse, name) against `debuginfod-find debuginfo ID` then \
             `eu-addr2line -f -i -C` on the file.\n",
            f.bytes as f64 / (1 << 20) as f64,
            f.addresses
        );
        let _ = writeln!(md, "| | s | peak RSS MiB |");
        let _ = writeln!(md, "|---|---|---|");
        for (what, run) in [
            ("profiler-agent symbolize", f.agent),
            ("debuginfod-find", f.find),
            ("eu-addr2line", f.addr2line),
        ] {
            let _ = writeln!(
                md,
                "| {what} | {:.2} | {:.1} |",
                run.seconds,
                run.peak_kib as f64 / 1024.0
            );
        }
        let _ = writeln!(
            md,
            "\nAgent / (debuginfod-find + eu-addr2line): {:.2}× the time.\n",
            f.agent.seconds / elfutils.max(1e-9)
        );
    }
}

/// The cost of a start/end probe pair: ours against bpftrace's.
fn probes_section(md: &mut String, p: &super::probes::ProbeBench) {
    use super::probes::Tracer;
    let _ = writeln!(
        md,
        "A loop of operations between two USDT probes without semaphores \
         (`tests/fixtures/bench/probeloop.c`), attached by path: `profiler-agent latency \
         --budget 0 START END` against the bpftrace script that does the same (`@s[tid] = \
         nsecs` at the start, `@h = hist(nsecs - @s[tid]); delete(@s[tid])` at the end). BPF ns \
         per operation: the kernel's run time of the tool's uprobe programs (bpf_stats) per \
         start+end pair. Throughput: the loop's operations per second over the unprobed loop's \
         in the same repetition (each probe also costs a trap into the kernel, the same for \
         both tools).\n"
    );
    let _ = writeln!(
        md,
        "| tool | BPF ns per operation | throughput vs unprobed |"
    );
    let _ = writeln!(md, "|---|---|---|");
    for tracer in [Tracer::Agent, Tracer::Bpftrace] {
        let bpf = p.bpf_ns_per_operation(tracer);
        let throughput = p.throughput(tracer);
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            tracer.name(),
            bpf.map_or("–".into(), |s| format!(
                "{:.0} ({:.0}–{:.0})",
                s.median, s.min, s.max
            )),
            throughput.map_or("–".into(), |s| format!("{:.4}", s.median)),
        );
    }
    if let (Some(ours), Some(theirs)) = (
        p.bpf_ns_per_operation(Tracer::Agent),
        p.bpf_ns_per_operation(Tracer::Bpftrace),
    ) {
        let _ = writeln!(
            md,
            "\nAgent / bpftrace, BPF time per operation: {:.2}×.\n",
            ours.median / theirs.median.max(1e-9)
        );
    }
}

//! The command line: parse, call the library, print. No profiling logic
//! lives here.

mod goroutines;
mod heap;
mod latency;
mod probes;
mod record;
mod run;
mod symbolize;
mod tables;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use profiler_profile::Format;

#[derive(Debug, Parser)]
#[command(
    name = "profiler-agent",
    version,
    about = "eBPF sampling profiler: CPU profiles of a process or the whole machine as pprof, folded stacks or flame graphs",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  \
        profiler-agent --pid 1234 --duration 30s --output cpu.pb.gz\n  \
        profiler-agent --output machine.svg            # whole machine, 10 s\n  \
        go tool pprof -top cpu.pb.gz"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    record: RecordArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sample CPU stacks and write a profile (what plain `profiler-agent` does).
    Record(RecordArgs),
    /// Print the functions, files and lines of addresses, inlined frames
    /// included: the profiler's own symbolizer, for checking a frame.
    Symbolize(symbolize::SymbolizeArgs),
    /// The unwind tables the profiler builds for binaries (.eh_frame CFI,
    /// Go pclntab): their size, and the rule at an address.
    Tables(tables::TablesArgs),
    /// USDT probes: list those of a binary or of a running process.
    Probes(probes::ProbesArgs),
    /// Latency histograms in the kernel between two probes (USDT or
    /// uprobes), of a function from entry to return, or probe hit counts.
    Latency(latency::LatencyArgs),
    /// One line per hit of a probe, with chosen arguments, optionally
    /// filtered in the kernel (rate-limited, under the circuit breaker).
    Trace(trace::TraceArgs),
    /// Profile continuously (DaemonSet / service mode): windows exported
    /// per service to a directory or Pyroscope, pulls on
    /// /debug/pprof/profile, health on /metrics.
    Run(Box<run::RunArgs>),
    /// A Go process's heap profile, read from its memory (no change to
    /// the program, no net/http/pprof needed), as its own
    /// pprof.WriteHeapProfile writes it.
    Heap(heap::HeapArgs),
    /// A Go process's goroutines, read from its memory: its debug=2 dump
    /// (state, wait reason and minutes, stack, creator), or the goroutine
    /// profile.
    Goroutines(goroutines::GoroutinesArgs),
}

#[derive(Debug, Clone, Args)]
#[command(group = clap::ArgGroup::new("off_cpu_mode").args(["off_cpu", "wall"]).multiple(true))]
pub struct RecordArgs {
    /// Profile only this process, all its threads (repeat for several).
    /// Without --pid, every process on the machine.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Samples per second on each CPU.
    #[arg(short = 'F', long, default_value_t = profiler_sampling::sampler::DEFAULT_FREQUENCY_HZ, value_name = "HZ",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,

    /// What fires a sample, as `perf record -e` names it: `cpu-clock`
    /// (the CPU clock, -F times a second: where CPU time goes) or
    /// `page-faults` (one in --count page faults: where processes first
    /// touch memory, which is where their resident memory grows)
    #[arg(
        short,
        long,
        value_enum,
        default_value = "cpu-clock",
        value_name = "EVENT"
    )]
    pub event: EventArg,

    /// With `--event page-faults`: sample one in this many page faults, as
    /// `perf record -c` [default: 64, one sample per 256 KiB first touched]
    #[arg(short = 'c', long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub count: Option<u64>,

    /// How long to profile (e.g. 500ms, 30s, 2m). Ctrl-C stops early and
    /// still writes the profile.
    #[arg(short, long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Where to write the profile; the format follows the extension:
    /// .pb.gz/.pprof (pprof), .folded/.txt (folded stacks), .svg (flame graph).
    #[arg(short, long, default_value = "profile.pb.gz", value_parser = output_path)]
    pub output: PathBuf,

    /// No live status line.
    #[arg(short, long)]
    pub quiet: bool,

    /// Walk user stacks by frame pointers only, as perf and bpftrace do,
    /// without the unwind tables (.eh_frame CFI, Go pclntab) that complete
    /// stacks of code built without frame pointers (for comparison).
    #[arg(long)]
    pub frame_pointers_only: bool,

    /// Kernel memory for unwind tables, in MiB (4 bytes a row, allocated at
    /// start); when full, the least recently sampled tables are evicted.
    #[arg(long, default_value_t = 64, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub unwind_table_mib: u64,

    /// Memory for what the runtimes keep of processes' memory (Python code
    /// objects and line tables, Java methods and their debug information),
    /// in MiB over every process: a process that forges its runtime's
    /// state evicts its own entries first and cannot grow the agent.
    #[arg(long, default_value_t = profiler_runtimes::cache::DEFAULT_BUDGET_BYTES >> 20,
          value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub runtime_cache_mib: u64,

    /// Also record where threads wait: time off the CPU (blocked on sleep,
    /// locks, network, disk, page faults; and runnable, waiting for a CPU)
    /// with its stacks, labelled `wait=<reason>`. pprof gets the sample
    /// type off_cpu/nanoseconds beside the CPU ones; folded stacks and SVG
    /// count microseconds off-CPU.
    #[arg(long)]
    pub off_cpu: bool,

    /// One wall-clock profile: CPU samples as time plus off-CPU time, so
    /// each thread's stacks add up to its lifetime in the profile (pprof
    /// sample type wall/nanoseconds; folded and SVG in microseconds).
    #[arg(long)]
    pub wall: bool,

    /// Off-CPU intervals shorter than this are not recorded.
    #[arg(long, default_value = "1us", value_name = "DURATION",
          value_parser = humantime::parse_duration, requires = "off_cpu_mode")]
    pub off_cpu_min: Duration,

    /// Sampling period of off-CPU time: shorter intervals are recorded with
    /// probability interval/period and then stand for one period, so records
    /// per second stay bounded (default: one CPU sampling period, 10ms at
    /// 100 Hz; 0 records every interval).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          requires = "off_cpu_mode")]
    pub off_cpu_period: Option<Duration>,

    /// The language runtimes read from processes' memory, comma-separated:
    /// `go` (goroutines' pprof labels become sample labels, as in the
    /// program's own runtime/pprof profiles: `go tool pprof
    /// -tagfocus=endpoint=/checkout`), `cpython` (Python functions with
    /// their files and lines, CPython 3.10 to 3.14), `hotspot` (Java
    /// methods, interpreted, compiled and inlined, OpenJDK 17 to 25), or
    /// `all` or `none`. Go's symbols and stacks are read either way.
    #[arg(long, default_value = "all", value_name = "LIST",
          value_parser = profiler_runtimes::selection)]
    pub runtimes: profiler_runtimes::Selection,

    /// Keep only these Go label keys (comma-separated, `*` globs).
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    pub go_label_keys: Vec<String>,

    /// Also label each Go sample with its goroutine's id (`goroutine`).
    #[arg(long)]
    pub goroutine_labels: bool,

    /// Folded stacks and SVG: put these labels' values in front of each
    /// stack as `key=value` frames (comma-separated; e.g. a Go label
    /// `endpoint`, or `pid`, `tid`, `thread`), so flame graphs split by
    /// them.
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    pub stack_labels: Vec<String>,

    #[command(flatten)]
    pub debuginfod: DebuginfodArgs,
}

/// `--event`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventArg {
    CpuClock,
    PageFaults,
}

impl RecordArgs {
    /// Page faults per sample, when page faults are sampled.
    pub fn page_fault_period(&self) -> Option<u64> {
        (self.event == EventArg::PageFaults).then(|| {
            self.count
                .unwrap_or(profiler_sampling::sampler::DEFAULT_PAGE_FAULT_PERIOD)
        })
    }

    /// What to do with Go labels (when `go` is among the runtimes).
    pub fn go_labels_config(&self) -> profiler_runtimes::go::labels::GoLabelsConfig {
        profiler_runtimes::go::labels::GoLabelsConfig {
            goroutine: self.goroutine_labels,
            keys: self.go_label_keys.clone(),
        }
    }
}

/// Where debug files of stripped binaries come from.
#[derive(Debug, Clone, Args)]
pub struct DebuginfodArgs {
    /// debuginfod servers to fetch the debug files of stripped binaries
    /// from, by build id (space-separated, tried in order; default:
    /// $DEBUGINFOD_URLS, as gdb and elfutils read it). Also read:
    /// DEBUGINFOD_CACHE_PATH, DEBUGINFOD_TIMEOUT, DEBUGINFOD_MAXSIZE.
    #[arg(long, value_name = "URLS")]
    pub debuginfod_urls: Option<String>,

    /// How long the profile waits, once sampling ends, for debug files
    /// still downloading (they are asked for while it samples); names
    /// that arrive later are left out.
    #[arg(long, default_value = "10s", value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub debuginfod_wait: Duration,
}

impl DebuginfodArgs {
    /// Sets up the process's debuginfod client from these flags over the
    /// environment.
    pub fn configure(&self) {
        profiler_symbolize::debuginfod::configure(
            &profiler_symbolize::debuginfod::DebuginfodSettings {
                urls: self.debuginfod_urls.iter().cloned().collect(),
                ..Default::default()
            },
        );
    }
}

impl RecordArgs {
    /// The off-CPU settings, when off-CPU time is recorded.
    pub fn off_cpu_config(&self) -> Option<profiler_sampling::sampler::OffCpuConfig> {
        (self.off_cpu || self.wall).then(|| profiler_sampling::sampler::OffCpuConfig {
            min: self.off_cpu_min,
            period: self
                .off_cpu_period
                .unwrap_or(profiler_sampling::sampler::sampling_period(self.frequency)),
            wall: self.wall,
        })
    }
}

pub(super) fn output_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match Format::from_path(&path) {
        Some(_) => Ok(path),
        None => Err(format!(
            "cannot tell the format of {text:?}: name it .pb.gz or .pprof (pprof), \
             .folded or .txt (folded stacks), or .svg (flame graph)"
        )),
    }
}

/// Entry point of the `profiler-agent` binary.
pub fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Record(args)) => record::run(&args),
        Some(Command::Probes(args)) => probes::run(&args),
        Some(Command::Latency(args)) => latency::run(&args),
        Some(Command::Trace(args)) => trace::run(&args),
        Some(Command::Symbolize(args)) => symbolize::run(&args),
        Some(Command::Tables(args)) => tables::run(&args),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Heap(args)) => heap::run(&args),
        Some(Command::Goroutines(args)) => goroutines::run(&args),
        None => record::run(&cli.record),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROFILER_AGENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

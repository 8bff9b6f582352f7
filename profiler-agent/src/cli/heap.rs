//! `profiler-agent heap --pid N`: a Go process's heap profile, read from
//! its memory, as its own `pprof.WriteHeapProfile` would write it.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;

use profiler_profile::{Format, Profile};
use profiler_runtimes::go::state::GoTarget;
use profiler_runtimes::go::state::heap::heap_profile;

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:\n  \
    profiler-agent heap --pid 1234 -o heap.pb.gz\n  \
    go tool pprof -top -sample_index=inuse_space heap.pb.gz\n  \
    go tool pprof -top -base heap-before.pb.gz heap-after.pb.gz   # what grew")]
pub struct HeapArgs {
    /// The Go process (stripped and PIE binaries too; Go 1.19 to 1.27).
    #[arg(short, long, value_name = "PID")]
    pub pid: u32,

    /// Where to write it: .pb.gz/.pprof (pprof, all four sample types),
    /// .folded/.txt or .svg (bytes in use).
    #[arg(short, long, default_value = "heap.pb.gz", value_parser = super::output_path)]
    pub output: PathBuf,

    /// Allocation sites printed, largest in use first.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,

    /// First write BYTES into the process's runtime.MemProfileRate: from
    /// then on its runtime records one allocation per BYTES allocated
    /// (Go's default: 524288), what it allocated before stays unrecorded.
    /// This changes the running program (a little CPU per recorded
    /// allocation); for binaries whose linker turned profiling off, or
    /// processes that set the rate to 0. 0 stops recording.
    #[arg(long, value_name = "BYTES")]
    pub set_mem_profile_rate: Option<u64>,
}

pub fn run(args: &HeapArgs) -> anyhow::Result<()> {
    let target = match GoTarget::open(args.pid) {
        Err(e @ profiler_runtimes::go::state::StateError::NotGo { .. }) => {
            return Err(anyhow::anyhow!(
                "{e}: `heap` reads the Go runtime's own heap profile; where any process's \
                 resident memory grows: `profiler-agent --pid {} --event page-faults`",
                args.pid
            ));
        }
        other => other?,
    };
    if let Some(rate) = args.set_mem_profile_rate {
        let previous = target.set_mem_profile_rate(rate)?;
        eprintln!(
            "set runtime.MemProfileRate of process {} from {previous} to {rate}: its runtime now \
             records one allocation per {rate} bytes allocated (allocations before now are not \
             in any profile: read its heap again later)",
            args.pid
        );
    }
    let snapshot = target.heap()?;
    if snapshot.rate == 0 {
        eprintln!(
            "note: process {} has runtime.MemProfileRate = 0 (set by the program or by \
             GODEBUG=memprofilerate=0): nothing new is sampled; the profile holds what was \
             before",
            args.pid
        );
    }
    let profile = heap_profile(&target, &snapshot, now_unix_ns());
    let format = Format::from_path(&args.output).expect("checked by the parser");
    let bytes = format
        .encode(&profile)
        .with_context(|| format!("encoding the {}", format.name()))?;
    super::record::write_output(&args.output, &bytes)?;
    report(args, &target, &profile, snapshot.skipped);
    Ok(())
}

fn report(
    args: &HeapArgs,
    target: &GoTarget,
    profile: &Profile,
    skipped: profiler_runtimes::go::state::heap::Skipped,
) {
    let total = |i: usize| -> i64 {
        profile
            .samples
            .iter()
            .map(|s| s.values.get(i).copied().unwrap_or(0))
            .sum()
    };
    eprintln!(
        "wrote {}: heap of process {} ({}, {}): {} in use in {} objects, {} allocated since start, \
         from {} allocation sites (sampled every {} allocated)",
        args.output.display(),
        target.pid,
        target.path,
        target.version,
        bytes(total(3)),
        total(2),
        bytes(total(1)),
        profile.samples.len(),
        bytes(profile.period_ns),
    );
    if skipped.malformed > 0 {
        eprintln!(
            "  {} records malformed: impossible values (a stack of 2^32 frames, not a heap \
             record), as a forged or corrupt runtime holds; left out",
            skipped.malformed
        );
    }
    if skipped.unreadable > 0 {
        eprintln!(
            "  {} records not in the process's memory; left out",
            skipped.unreadable
        );
    }
    let mut sites: Vec<(&str, i64)> = Vec::new();
    for sample in &profile.samples {
        let name = sample
            .locations
            .first()
            .and_then(|&l| profile.locations[l].lines.first())
            .map(|line| profile.functions[line.function].name.as_str())
            .unwrap_or("?");
        let inuse = sample.values.get(3).copied().unwrap_or(0);
        match sites.iter_mut().find(|(n, _)| *n == name) {
            Some(site) => site.1 += inuse,
            None => sites.push((name, inuse)),
        }
    }
    sites.sort_by_key(|&(name, inuse)| (std::cmp::Reverse(inuse), name));
    for (name, inuse) in sites.iter().take(args.top).filter(|(_, b)| *b > 0) {
        eprintln!("  {:>10} in use  {name}", bytes(*inuse));
    }
}

/// Bytes in the unit that reads best.
fn bytes(n: i64) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", n / (1024.0 * 1024.0 * 1024.0))
    } else if n >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", n / (1024.0 * 1024.0))
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n} B")
    }
}

pub(super) fn now_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

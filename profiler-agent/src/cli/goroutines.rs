//! `profiler-agent goroutines --pid N`: a Go process's goroutines, read
//! from its memory: printed as its own `debug=2` goroutine dump, or
//! written as its goroutine profile.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use profiler_profile::Format;
use profiler_runtimes::go::state::GoTarget;
use profiler_runtimes::go::state::freeze::Freeze;
use profiler_runtimes::go::state::goroutines::{goroutine_profile, text};

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:\n  \
    profiler-agent goroutines --pid 1234 | less\n  \
    profiler-agent goroutines --pid 1234 -o goroutines.pb.gz\n  \
    go tool pprof -top goroutines.pb.gz")]
pub struct GoroutinesArgs {
    /// The Go process (stripped and PIE binaries too; Go 1.19 and 1.21 to
    /// 1.27).
    #[arg(short, long, value_name = "PID")]
    pub pid: u32,

    /// Write the goroutine profile (goroutines counted by stack and
    /// labels) instead of printing the dump: .pb.gz/.pprof, .folded/.txt
    /// or .svg.
    #[arg(short, long, value_parser = super::output_path)]
    pub output: Option<PathBuf>,

    /// Stop the process while it is read (ptrace; no signal reaches it),
    /// for an exact dump: nothing moves meanwhile, and running goroutines
    /// get their stacks from their threads' registers. Without it the
    /// process never pauses.
    #[arg(long)]
    pub stop: bool,
}

pub fn run(args: &GoroutinesArgs) -> anyhow::Result<()> {
    let target = GoTarget::open(args.pid)?;
    let goroutines = if args.stop {
        let freeze = Freeze::new(args.pid)?;
        let started = std::time::Instant::now();
        let goroutines = target.goroutines_with(Some(&freeze));
        let threads = freeze.threads();
        let stopped = freeze.took + started.elapsed();
        drop(freeze);
        eprintln!(
            "stopped process {} ({threads} threads) for {:.1} ms to read it",
            args.pid,
            stopped.as_secs_f64() * 1e3
        );
        goroutines?
    } else {
        target.goroutines()?
    };
    match &args.output {
        None => {
            let dump = text(&target, &goroutines);
            std::io::stdout()
                .lock()
                .write_all(dump.as_bytes())
                .context("writing the dump")?;
        }
        Some(output) => {
            let profile = goroutine_profile(&target, &goroutines, super::heap::now_unix_ns());
            let format = Format::from_path(output).expect("checked by the parser");
            let bytes = format
                .encode(&profile)
                .with_context(|| format!("encoding the {}", format.name()))?;
            super::record::write_output(output, &bytes)?;
            eprintln!("wrote {}", output.display());
        }
    }
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for g in &goroutines.goroutines {
        let state = g.wait_reason.clone().unwrap_or_else(|| {
            profiler_runtimes::go::state::layout::STATUS_NAMES
                .get((g.status & !profiler_runtimes::go::state::layout::STATUS_SCAN) as usize)
                .copied()
                .unwrap_or("???")
                .to_string()
        });
        *states.entry(state).or_default() += 1;
    }
    let states: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    eprintln!(
        "process {} ({}, {}): {} goroutines ({}); {} of the runtime's own not shown{}",
        target.pid,
        target.path,
        target.version,
        goroutines.goroutines.len(),
        states.join(", "),
        goroutines.system,
        if goroutines.unreadable > 0 {
            format!("; {} unreadable", goroutines.unreadable)
        } else {
            String::new()
        } + &if goroutines.malformed > 0 {
            format!(
                "; {} malformed (impossible values, as a forged or corrupt runtime holds)",
                goroutines.malformed
            )
        } else {
            String::new()
        } + &if goroutines.torn > 0 {
            format!(
                "; {} changed while read (shown as last read)",
                goroutines.torn
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

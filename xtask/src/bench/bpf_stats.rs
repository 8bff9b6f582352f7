//! The kernel's own accounting of BPF programs: with
//! `kernel.bpf_stats_enabled=1` every program has a run count and total run
//! time, which the kernel reports for each program (`bpftool prog show`
//! prints them; the bench reads them with the bpf() system call). Divided, they are the exact
//! cost of one sample in the kernel, charged to whichever task the timer
//! interrupted (it never shows up as the profiler's own CPU time).

use anyhow::Context;

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Turns the statistics on and restores the previous setting when dropped.
pub struct StatsEnabled {
    previous: String,
}

impl StatsEnabled {
    pub fn enable() -> anyhow::Result<Self> {
        let previous = std::fs::read_to_string(SYSCTL)
            .with_context(|| format!("reading {SYSCTL} (needs Linux >= 5.1)"))?;
        std::fs::write(SYSCTL, "1").with_context(|| format!("writing {SYSCTL} (run as root)"))?;
        Ok(Self {
            previous: previous.trim().to_string(),
        })
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        let _ = std::fs::write(SYSCTL, &self.previous);
    }
}

/// Run count and total run time of a tool's sampling programs.
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfCounters {
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

impl BpfCounters {
    /// The counts accumulated since `earlier`.
    pub fn since(self, earlier: BpfCounters) -> BpfCounters {
        BpfCounters {
            run_time_ns: self.run_time_ns.saturating_sub(earlier.run_time_ns),
            run_cnt: self.run_cnt.saturating_sub(earlier.run_cnt),
        }
    }

    pub fn ns_per_run(self) -> Option<f64> {
        (self.run_cnt > 0).then(|| self.run_time_ns as f64 / self.run_cnt as f64)
    }
}

/// IDs of the BPF programs process `pid` holds open, from the `prog_id:`
/// lines of /proc/PID/fdinfo. Programs are matched by owner rather than by
/// name because other people on this machine may be profiling too (this
/// bpftool is built without the `pids` column).
pub fn program_ids(pid: u32) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut ids: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Summed counters of the `perf_event` programs `pid` holds (only those
/// named `name`, if given). None when it holds none yet.
pub fn perf_event_counters(pid: u32, name: Option<&str>) -> anyhow::Result<Option<BpfCounters>> {
    counters(pid, Some("perf_event"), name)
}

/// Summed counters of every program `pid` holds (of type `kind` only, if
/// given). None when it holds none yet.
pub fn program_counters(pid: u32, kind: Option<&str>) -> anyhow::Result<Option<BpfCounters>> {
    counters(pid, kind, None)
}

/// `bpf_prog_type` values (include/uapi/linux/bpf.h) of the kinds asked
/// for by name, as bpftool names them.
fn program_type(kind: &str) -> Option<u32> {
    match kind {
        "kprobe" => Some(2),
        "perf_event" => Some(7),
        _ => None,
    }
}

fn counters(
    pid: u32,
    kind_wanted: Option<&str>,
    name: Option<&str>,
) -> anyhow::Result<Option<BpfCounters>> {
    let ids = program_ids(pid);
    if ids.is_empty() {
        return Ok(None);
    }
    let type_wanted = match kind_wanted {
        Some(kind) => Some(program_type(kind).with_context(|| format!("program kind {kind:?}"))?),
        None => None,
    };
    // Read with the bpf() system call, not `bpftool prog show`: bpftool
    // is a new process the profiler under measurement may sample at each
    // snapshot, and the first time it does, it builds unwind tables for
    // bpftool and its libraries inside the window being measured.
    let mut total: Option<BpfCounters> = None;
    for program in aya::programs::loaded_programs() {
        // A program unloaded meanwhile is not one of `pid`'s.
        let Ok(program) = program else { continue };
        if !ids.contains(&u64::from(program.id()))
            || type_wanted.is_some_and(|t| program.program_type() as u32 != t)
            || name.is_some_and(|n| program.name_as_str() != Some(n))
        {
            continue;
        }
        let entry = total.get_or_insert_with(BpfCounters::default);
        entry.run_time_ns += program.run_time().as_nanos() as u64;
        entry.run_cnt += program.run_count();
    }
    Ok(total)
}

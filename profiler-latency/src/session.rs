//! Loading the latency BPF programs with a [`Plan`], attaching every site
//! (cookie = index of the site in `SITES`), and reading the in-kernel
//! histograms and counters back, summed over CPUs.

use std::collections::HashMap;
use std::os::fd::AsFd;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};
use profiler_common::latency::{
    GLOBAL_LATENCY_CONFIG, HIST_SLOTS, HistKey, HistValue, LatencyCounter, TraceEvent,
};

use super::errors::SessionError;
use super::plan::{Plan, Role};
use profiler_bpf::loading::{error_chain, raise_memlock_limit};
use profiler_bpf::maps;

/// A map's error in the session's words.
fn map_error(e: maps::MapTakeError) -> SessionError {
    SessionError::Map("map", e.to_string())
}
use profiler_probes::attach::{AttachedUprobe, UprobePmu, attach_uprobe};

/// The stack walker's arrays and the stack maps: sized down to one
/// element when no stacks are taken.
const STACK_MAPS: [&str; 9] = [
    "UNWIND_ROWS",
    "UNWIND_PAGES",
    "UNWIND_RULES",
    "UNWIND_MAPPINGS",
    "UNWIND_PROCESSES",
    "RUNTIME_REGIONS",
    "STACKS",
    "STACK_TOTALS",
    "PROBE_WALK",
];

/// The sampling programs' maps, which probes do not use: one element
/// each (the ring buffer, one page).
const SAMPLING_MAPS: [&str; 3] = ["PID_FILTER", "OFF_CPU_THREADS", "GO_PROCESSES"];

fn uprobe_program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut UProbe, SessionError> {
    ebpf.program_mut(name)
        .ok_or_else(|| SessionError::Program {
            program: name,
            reason: "missing from the object (a build problem)".into(),
        })?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| SessionError::Program {
            program: name,
            reason: error_chain(&e),
        })
}

/// Opens a uprobe for every site of `plan` with its role's (loaded)
/// program, the site's index as the cookie.
fn attach_sites(
    ebpf: &mut Ebpf,
    plan: &Plan,
    pmu: &UprobePmu,
) -> Result<Vec<AttachedUprobe>, SessionError> {
    let mut attached = Vec::with_capacity(plan.sites.len());
    for role in Role::ALL {
        if !plan.sites.iter().any(|s| s.role == role) {
            continue;
        }
        let name = role.program();
        let program = uprobe_program(ebpf, name)?;
        let fd = program.fd().map_err(|e| SessionError::Program {
            program: name,
            reason: error_chain(&e),
        })?;
        for (index, site) in plan.sites.iter().enumerate() {
            if site.role != role {
                continue;
            }
            let uprobe =
                attach_uprobe(pmu, fd.as_fd(), &site.target, index as u64).map_err(|source| {
                    SessionError::Attach {
                        site: site.label.clone(),
                        reason: source,
                    }
                })?;
            attached.push(uprobe);
        }
    }
    Ok(attached)
}

/// One key's histogram, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTotals {
    pub count: u64,
    pub sum: u64,
    pub buckets: Vec<u64>,
}

impl KeyTotals {
    /// `self - earlier`, for one interval (the maps only grow).
    pub fn since(&self, earlier: Option<&KeyTotals>) -> KeyTotals {
        let Some(earlier) = earlier else {
            return self.clone();
        };
        KeyTotals {
            count: self.count.saturating_sub(earlier.count),
            sum: self.sum.saturating_sub(earlier.sum),
            buckets: self
                .buckets
                .iter()
                .zip(&earlier.buckets)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
        }
    }
}

/// Everything the kernel side has counted so far.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub keys: HashMap<HistKey, KeyTotals>,
    pub counters: Vec<(LatencyCounter, u64)>,
}

impl Snapshot {
    pub fn counter(&self, counter: LatencyCounter) -> u64 {
        self.counters
            .iter()
            .find(|(c, _)| *c == counter)
            .map_or(0, |(_, v)| *v)
    }

    /// The change since `earlier`, key by key.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            keys: self
                .keys
                .iter()
                .map(|(k, v)| (*k, v.since(earlier.keys.get(k))))
                .filter(|(_, v)| v.count > 0)
                .collect(),
            counters: self
                .counters
                .iter()
                .map(|(c, v)| (*c, v.saturating_sub(earlier.counter(*c))))
                .collect(),
        }
    }
}

/// Loaded programs and attached uprobes. Dropping it detaches everything.
pub struct Session {
    // Field order is drop order: uprobes (links, perf events) first, so no
    // probe fires into a half-torn-down object; the maps are ours.
    attached: Vec<AttachedUprobe>,
    /// `--stacks`: the walker's tables and the stacks totalled.
    stacks: Option<super::stacks::ProbeStacks>,
    /// `trace`: the records of traced hits.
    trace: Option<RingBuf<MapData>>,
    histograms: PerCpuHashMap<MapData, HistKey, HistValue>,
    counters: PerCpuArray<MapData, u64>,
    ebpf: Ebpf,
    /// Where each site's arguments are (kept open while the programs run).
    _sites: aya::maps::Array<MapData, profiler_common::latency::SiteConfig>,
    /// Keeps the kernel's BPF run-time statistics on (for the programs'
    /// cost per hit); None when the kernel refused.
    stats: Option<std::os::fd::OwnedFd>,
    /// What to attach again after a detach (the circuit breaker's back-off).
    plan: Plan,
    pmu: UprobePmu,
}

/// The counters that count a probe firing (each one a trap into the
/// kernel, whatever the program then does with it).
const HIT_COUNTERS: [LatencyCounter; 6] = [
    LatencyCounter::Starts,
    LatencyCounter::Ends,
    LatencyCounter::Counts,
    LatencyCounter::Traced,
    LatencyCounter::FilteredOut,
    LatencyCounter::UnknownSite,
];

impl Session {
    /// Loads the object configured for `plan`, writes the sites, loads the
    /// programs the plan uses and attaches every site.
    pub fn start(plan: &Plan) -> Result<Session, SessionError> {
        profiler_sampling::sampler::check_privileges()
            .map_err(|e| SessionError::Privileges(e.to_string()))?;
        raise_memlock_limit();
        let pmu = UprobePmu::read().map_err(SessionError::Pmu)?;
        let mut loader = EbpfLoader::new();
        loader.override_global(GLOBAL_LATENCY_CONFIG, &plan.config, true);
        if !plan.tracing {
            // One page instead of the megabyte a trace needs (a ring
            // buffer is a whole number of pages: 64 KiB on some arm64
            // kernels).
            // SAFETY: sysconf reads a constant of the system.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            maps::TRACE_EVENTS.size(&mut loader, u32::try_from(page).unwrap_or(4096).max(4096));
        }
        if !plan.trace_pairs {
            loader.map_max_entries(maps::TRACE_STARTS, 1);
        }
        let row_blocks = (super::stacks::PROBE_UNWIND_TABLE_BYTES
            / (profiler_common::unwind::UNWIND_ROWS_PER_BLOCK as u64 * 4))
            as u32;
        let stacks = plan.config.stacks != 0;
        if !stacks {
            // The walker's arrays are allocated when the object loads:
            // without stacks, one element each.
            for name in STACK_MAPS {
                loader.map_max_entries(name, 1);
            }
            for name in profiler_runtimes::maps() {
                loader.map_max_entries(name, 1);
            }
        } else {
            loader.map_max_entries(maps::UNWIND_ROWS, row_blocks);
        }
        for name in SAMPLING_MAPS {
            loader.map_max_entries(name, 1);
        }
        maps::SAMPLES.size(&mut loader, profiler_bpf::loading::page_size());
        // The probes' walkers read every runtime with a walker; Go's labels
        // are the CPU samples'.
        let selection = profiler_runtimes::walker_runtimes();
        let globals = profiler_runtimes::globals(&selection, stacks);
        globals.apply(&mut loader);
        let mut ebpf = loader
            .load(profiler_bpf::OBJECT)
            .map_err(|e| SessionError::Load(error_chain(&e)))?;

        // Kept open while the programs load (they are relocated with its
        // descriptor) and run.
        let mut sites = maps::SITES.take(&mut ebpf).map_err(map_error)?;
        for (index, site) in plan.sites.iter().enumerate() {
            sites
                .set(index as u32, site.site, 0)
                .map_err(|e| SessionError::Map("SITES", e.to_string()))?;
        }

        for role in Role::ALL {
            if !plan.sites.iter().any(|s| s.role == role) {
                continue;
            }
            let name = role.program();
            uprobe_program(&mut ebpf, name)?
                .load()
                .map_err(|e| SessionError::Program {
                    program: name,
                    reason: error_chain(&e),
                })?;
        }
        // Before attaching: the first starts already walk with tables.
        let stacks = if stacks {
            Some(super::stacks::ProbeStacks::take(
                &mut ebpf, plan, &selection,
            )?)
        } else {
            None
        };
        let attached = attach_sites(&mut ebpf, plan, &pmu)?;

        let histograms = maps::HISTOGRAMS.take(&mut ebpf).map_err(map_error)?;
        let counters = maps::LATENCY_COUNTERS.take(&mut ebpf).map_err(map_error)?;
        let trace = if plan.tracing {
            Some(maps::TRACE_EVENTS.take(&mut ebpf).map_err(map_error)?)
        } else {
            None
        };
        // Costs each BPF program run on the machine two clock reads while
        // on; it is how a probe's cost is measured rather than assumed.
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        Ok(Session {
            stats,
            attached,
            stacks,
            trace,
            histograms,
            counters,
            ebpf,
            _sites: sites,
            plan: plan.clone(),
            pmu,
        })
    }

    /// The stacks side, with `--stacks`.
    pub fn stacks_mut(&mut self) -> Option<&mut super::stacks::ProbeStacks> {
        self.stacks.as_mut()
    }

    pub fn stacks(&self) -> Option<&super::stacks::ProbeStacks> {
        self.stacks.as_ref()
    }

    /// Attaches every site again after `detach` (the maps kept counting
    /// what came before).
    pub fn reattach(&mut self) -> Result<(), SessionError> {
        if self.attached.is_empty() {
            self.attached = attach_sites(&mut self.ebpf, &self.plan, &self.pmu)?;
        }
        Ok(())
    }

    /// Hands every traced hit waiting in the ring buffer to `each`; returns
    /// how many there were.
    pub fn drain_trace(&mut self, mut each: impl FnMut(&TraceEvent)) -> usize {
        let Some(ring) = self.trace.as_mut() else {
            return 0;
        };
        let mut count = 0;
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<TraceEvent>() {
                // SAFETY: the BPF side writes whole `TraceEvent`s (plain
                // integers and byte arrays: any bit pattern is valid); the
                // read is unaligned-safe.
                let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<TraceEvent>()) };
                each(&event);
                count += 1;
            }
        }
        count
    }

    /// Hits of every site so far, per CPU (for the circuit breaker).
    pub fn hits_per_cpu(&self) -> Vec<u64> {
        let mut hits: Vec<u64> = Vec::new();
        for counter in HIT_COUNTERS {
            let Ok(per_cpu) = self.counters.get(&(counter as u32), 0) else {
                continue;
            };
            if hits.len() < per_cpu.len() {
                hits.resize(per_cpu.len(), 0);
            }
            for (total, value) in hits.iter_mut().zip(per_cpu.iter()) {
                *total += value;
            }
        }
        hits
    }

    /// What one hit costs its CPU, in nanoseconds: the trap into the
    /// kernel (`breaker::TRAP_NS`) plus the programs' measured time per
    /// run (the kernel's BPF run-time statistics, switched on while the
    /// session lives); the reference cost while nothing was measured.
    pub fn cost_per_hit_ns(&self) -> f64 {
        let (mut time_ns, mut runs) = (0u128, 0u64);
        for (_, program) in self.ebpf.programs() {
            if let Ok(info) = program.info() {
                time_ns += info.run_time().as_nanos();
                runs += info.run_count();
            }
        }
        if self.stats.is_none() || runs == 0 {
            return super::breaker::REFERENCE_COST_NS;
        }
        super::breaker::TRAP_NS + time_ns as f64 / runs as f64
    }

    /// How many uprobes are attached.
    pub fn attached(&self) -> usize {
        self.attached.len()
    }

    /// Closes every uprobe (the kernel lowers USDT semaphores). The maps
    /// stay readable.
    pub fn detach(&mut self) {
        self.attached.clear();
    }

    /// Reads the histograms and counters, summed over CPUs.
    pub fn snapshot(&self) -> Snapshot {
        let mut keys = HashMap::new();
        for entry in self.histograms.iter() {
            let Ok((key, per_cpu)) = entry else { continue };
            let mut totals = KeyTotals {
                count: 0,
                sum: 0,
                buckets: vec![0; HIST_SLOTS],
            };
            for value in per_cpu.iter() {
                totals.count += value.count;
                totals.sum += value.sum;
                for (total, bucket) in totals.buckets.iter_mut().zip(value.buckets.iter()) {
                    *total += bucket;
                }
            }
            keys.insert(key, totals);
        }
        let counters = LatencyCounter::ALL
            .iter()
            .map(|&c| {
                let value = self
                    .counters
                    .get(&(c as u32), 0)
                    .map(|per_cpu| per_cpu.iter().sum())
                    .unwrap_or(0);
                (c, value)
            })
            .collect();
        Snapshot { keys, counters }
    }
}

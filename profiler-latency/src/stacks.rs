//! Stacks at probe hits (`latency --stacks`): where operations begin,
//! weighted by how long they took.
//!
//! The probes' programs walk the user stack at each start with the walk's
//! chain (the native walker and the runtimes' walkers, loaded here as
//! uprobe programs, with unwind tables and runtimes' registrations of
//! their own for the processes that map a probed binary), keep each
//! distinct stack once (`STACKS`) and total the operations per stack in
//! the kernel (`STACK_TOTALS`). At the end the stacks become a profile with two
//! sample types, `count` (operations) and `latency/nanoseconds`.
//!
//! The continuous agent (`[[probes]]` with `stacks = true`) takes a
//! profile per export window instead: what the totals grew by since the
//! last window. Stacks that saw no operation for `IDLE_WINDOWS` windows
//! are deleted from the kernel's maps (a long run would otherwise fill
//! `STACKS` and lose every new stack), as are exited processes' tables.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant, SystemTime};

use aya::Ebpf;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap};
use profiler_common::latency::{ProbeStack, StackId, StackTotals};

use super::errors::SessionError;
use super::plan::Plan;
use profiler_bpf::chain::{Chain, Context};
use profiler_profile::{Profile, ProfileKind};
use profiler_runtimes::{RuntimeFrames, RuntimeRegistry, Selection};
use profiler_sampling::record::{ProfileWindow, StackCounts, StackKey, Stacks, build_profile_of};
use profiler_sampling::tables::{TableStore, UnwindArrays, UnwindTables};
use profiler_symbolize::Symbolizer;
use profiler_symbolize::process::ProcessTable;

/// Kernel memory for the probe walker's unwind-table rows (a few large
/// binaries' tables; the sampling agent's default is 64 MiB).
pub const PROBE_UNWIND_TABLE_BYTES: u64 = 32 << 20;

/// How often `/proc` is scanned for new processes mapping a probed file
/// (each scan reads every process's maps), by default: `latency` runs
/// for a while on purpose; the continuous agent scans less often
/// (`set_scan_interval`).
const SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// Windows without an operation after which a stack leaves the kernel's
/// maps (`take_window`).
const IDLE_WINDOWS: u32 = 3;

/// A stack's totals as last reported, and the windows since they grew.
#[derive(Clone, Copy, Default)]
struct Reported {
    count: u64,
    sum_ns: u64,
    idle_windows: u32,
}

/// The stacks side of a session.
pub struct ProbeStacks {
    tables: UnwindTables,
    /// The runtimes whose frames the walkers read, and their names.
    runtimes: RuntimeRegistry,
    runtime_frames: RuntimeFrames,
    /// The chain's program array (kept open while the probes run).
    _chain: Chain,
    processes: ProcessTable,
    stacks: BpfHashMap<MapData, StackId, ProbeStack>,
    totals: PerCpuHashMap<MapData, StackId, StackTotals>,
    /// Only this process, or every process mapping one of `files`.
    pid: Option<u32>,
    /// The probed files, by (device, inode).
    files: HashSet<(u64, u64)>,
    registered: HashSet<u32>,
    scanned_at: Option<Instant>,
    scan_interval: Duration,
    started: SystemTime,
    /// `take_window`: the totals already reported, by stack.
    reported: HashMap<StackId, Reported>,
    /// Stacks left in the kernel's map after the last `take_window`.
    stored: usize,
    /// Reused across windows; forgets the objects of exited processes.
    symbolizer: Symbolizer,
}

impl ProbeStacks {
    /// Takes the stack and unwind maps of the loaded object and loads the
    /// tables of the processes already running the probed binaries.
    pub fn take(
        ebpf: &mut Ebpf,
        plan: &Plan,
        selection: &Selection,
    ) -> Result<ProbeStacks, SessionError> {
        let arrays =
            UnwindArrays::take(ebpf).map_err(|e| SessionError::Map("UNWIND_*", e.to_string()))?;
        let runtimes = profiler_runtimes::start(ebpf, selection, true)
            .map_err(|e| SessionError::Map("runtimes", e.to_string()))?;
        let chain = profiler_bpf::chain::fill(
            ebpf,
            Context::Probe,
            &profiler_runtimes::walkers(selection, true),
            None,
        )
        .map_err(|e| SessionError::Program {
            program: "walk_*_probe",
            reason: e.to_string(),
        })?;
        let tables = UnwindTables::spawn(TableStore::new(
            arrays,
            profiler_common::unwind::MAX_UNWIND_PROCESSES,
        ))
        .map_err(|e| SessionError::Map("UNWIND_*", format!("starting its thread: {e}")))?;
        let stacks = profiler_bpf::maps::STACKS
            .take(ebpf)
            .map_err(|e| SessionError::Map("STACKS", e.to_string()))?;
        let totals = profiler_bpf::maps::STACK_TOTALS
            .take(ebpf)
            .map_err(|e| SessionError::Map("STACK_TOTALS", e.to_string()))?;
        let files = plan
            .sites
            .iter()
            .filter_map(|site| std::fs::metadata(&site.target.path).ok())
            .map(|m| (m.dev(), m.ino()))
            .collect();
        let pid = (plan.config.tgid != 0).then_some(plan.config.tgid);
        let runtime_frames = runtimes.frames();
        let mut stacks = ProbeStacks {
            tables,
            runtimes,
            runtime_frames,
            _chain: chain,
            processes: ProcessTable::default(),
            stacks,
            totals,
            pid,
            files,
            registered: HashSet::new(),
            scanned_at: None,
            scan_interval: SCAN_INTERVAL,
            started: SystemTime::now(),
            reported: HashMap::new(),
            stored: 0,
            symbolizer: profiler_runtimes::symbolizer(),
        };
        stacks.refresh();
        // The first hits already walk with tables and runtimes.
        stacks.tables.flush();
        stacks.runtimes.flush();
        Ok(stacks)
    }

    /// How often `refresh` scans `/proc`.
    pub fn set_scan_interval(&mut self, interval: Duration) {
        self.scan_interval = interval;
    }

    /// Loads the tables of processes that started running a probed binary
    /// since the last scan (at most once per scan interval).
    pub fn refresh(&mut self) {
        if self
            .scanned_at
            .is_some_and(|at| at.elapsed() < self.scan_interval)
        {
            return;
        }
        self.scanned_at = Some(Instant::now());
        let pids: Vec<u32> = match self.pid {
            Some(pid) => vec![pid],
            None => processes_mapping(&self.files),
        };
        for pid in pids {
            if !self.registered.insert(pid) {
                continue;
            }
            self.processes.observe(pid, &[]);
            if let Some(process) = self.processes.get(pid) {
                self.tables.register(process);
                self.runtimes.register(process);
            }
        }
    }

    /// The stacks totalled so far, as a profile: one sample per (process,
    /// stack), its count the operations that began there and its value
    /// their total latency.
    pub fn profile(&mut self) -> Profile {
        let totals = self.per_stack_totals();
        let mut stacks = Stacks::default();
        for (id, user) in self.frames() {
            if let Some(&(count, sum_ns)) = totals.get(&id).filter(|t| t.0 > 0) {
                // Seen only now (it exited before a scan found it): named
                // from what is left of it, if anything.
                self.processes.observe(id.tgid, &[]);
                add(&mut stacks, id, user, count, sum_ns);
            }
        }
        let window = ProfileWindow {
            started: self.started,
            elapsed: self.started.elapsed().unwrap_or_default(),
            frequency_hz: 1,
            page_fault_period: 0,
            kind: ProfileKind::Latency,
        };
        self.build(&stacks, &window)
    }

    /// The operations since the previous call (the continuous agent's
    /// window), by stack. Then deletes from the kernel the stacks without
    /// an operation for `IDLE_WINDOWS` windows (an operation still running
    /// on such a stack is lost when it ends) and totals whose stack is
    /// gone. Call `forget_exited` once the window's profiles are built.
    pub fn take_window(&mut self) -> Stacks {
        let totals = self.per_stack_totals();
        let frames = self.frames();
        let mut stacks = Stacks::default();
        for (&id, user) in &frames {
            let (count, sum_ns) = totals.get(&id).copied().unwrap_or((0, 0));
            let before = self.reported.entry(id).or_default();
            let (new_count, new_ns) = (
                count.saturating_sub(before.count),
                sum_ns.saturating_sub(before.sum_ns),
            );
            *before = Reported {
                count,
                sum_ns,
                idle_windows: if new_count == 0 {
                    before.idle_windows + 1
                } else {
                    0
                },
            };
            if before.idle_windows >= IDLE_WINDOWS {
                let _ = self.stacks.remove(&id);
                let _ = self.totals.remove(&id);
                self.reported.remove(&id);
            }
            if new_count > 0 {
                self.processes.observe(id.tgid, &[]);
                add(&mut stacks, id, user.clone(), new_count, new_ns);
            }
        }
        for id in totals.keys().filter(|id| !frames.contains_key(id)) {
            let _ = self.totals.remove(id);
        }
        self.reported.retain(|id, _| frames.contains_key(id));
        self.stored = self.reported.len();
        stacks
    }

    /// Stacks in the kernel's map after the last window (`take_window`).
    pub fn stored(&self) -> usize {
        self.stored
    }

    /// A profile of (some of) a window's stacks.
    pub fn build(&mut self, stacks: &Stacks, window: &ProfileWindow) -> Profile {
        let mut profile = build_profile_of(
            stacks.iter(),
            &self.processes,
            &mut self.symbolizer,
            &mut self.runtime_frames,
            window,
        );
        without_thread_labels(&mut profile);
        profile
    }

    /// Every stored stack's user frames.
    fn frames(&self) -> HashMap<StackId, Box<[u64]>> {
        self.stacks
            .iter()
            .filter_map(Result::ok)
            .map(|(id, stack)| {
                let len = (stack.len as usize).min(stack.frames.len());
                (id, stack.frames[..len].into())
            })
            .collect()
    }

    /// Operations and their total latency per stack, over the CPUs.
    fn per_stack_totals(&self) -> HashMap<StackId, (u64, u64)> {
        self.totals
            .iter()
            .filter_map(Result::ok)
            .map(|(id, per_cpu)| {
                let totals = per_cpu
                    .iter()
                    .fold((0, 0), |(c, s), t| (c + t.count, s + t.sum_ns));
                (id, totals)
            })
            .collect()
    }

    /// Drops exited processes, their tables and the objects only they
    /// mapped.
    pub fn forget_exited(&mut self) {
        let mut gone = Vec::new();
        self.processes.retain(|pid| {
            let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
            if !alive {
                gone.push(pid);
            }
            alive
        });
        for &pid in &gone {
            self.registered.remove(&pid);
            self.tables.unregister(pid);
            self.runtimes.unregister(pid);
        }
        self.runtime_frames.retain(|pid| !gone.contains(&pid));
        let mapped = self.processes.object_ids();
        self.tables.retain_objects(mapped.clone());
        self.symbolizer.retain_objects(|id| mapped.contains(id));
    }
}

/// Operations are totalled in the kernel per process and stack, over its
/// threads (`StackId`: tgid and stack hash), so a sample stands for no one
/// thread: the `tid` and `thread` labels every sample gets would be the
/// placeholders `add` puts in its key (thread 0, no name). They go, as
/// does a `comm` left empty by a process that exited before it was read.
fn without_thread_labels(profile: &mut Profile) {
    for sample in &mut profile.samples {
        sample
            .retain_labels(|(key, value)| !matches!(&**key, "tid" | "thread") && !value.is_empty());
    }
}

fn add(stacks: &mut Stacks, id: StackId, user: Box<[u64]>, count: u64, sum_ns: u64) {
    // No thread: see `without_thread_labels`.
    let key = StackKey {
        pid: id.tgid,
        tid: 0,
        thread: [0; 16],
        user,
        kernel: Box::default(),
        labels: Default::default(),
    };
    *stacks.entry(key).or_default() += StackCounts {
        samples: count,
        blocked_ns: sum_ns,
        ..StackCounts::default()
    };
}

/// Processes with a mapping of one of `files` ((device, inode) pairs).
fn processes_mapping(files: &HashSet<(u64, u64)>) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
                maps.lines().any(|line| {
                    let mut fields = line.split_ascii_whitespace().skip(3);
                    let (Some(dev), Some(inode)) = (fields.next(), fields.next()) else {
                        return false;
                    };
                    let Some((major, minor)) = dev.split_once(':') else {
                        return false;
                    };
                    let (Ok(major), Ok(minor), Ok(inode)) = (
                        u64::from_str_radix(major, 16),
                        u64::from_str_radix(minor, 16),
                        inode.parse::<u64>(),
                    ) else {
                        return false;
                    };
                    inode != 0 && files.contains(&(makedev(major, minor), inode))
                })
            })
        })
        .collect()
}

/// `st_dev` of a (major, minor) pair, as glibc's `makedev` builds it.
fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32)
        | ((major & 0x0000_0fff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0x0000_00ff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_samples_carry_no_thread() {
        let mut profile = Profile {
            samples: vec![profiler_profile::Sample {
                labels: vec![
                    ("pid".into(), "42".into()),
                    ("tid".into(), "0".into()),
                    ("comm".into(), "".into()),
                    ("thread".into(), "".into()),
                ]
                .into(),
                ..Default::default()
            }],
            ..Profile::default()
        };
        without_thread_labels(&mut profile);
        assert_eq!(*profile.samples[0].labels, [("pid".into(), "42".into())]);
    }

    #[test]
    fn device_numbers_are_built_like_glibc() {
        // /dev/sda1 (8:1), and a major and minor past 8 bits.
        assert_eq!(makedev(8, 1), 0x801);
        assert_eq!(makedev(0x103, 0x12345), 0x1231_0345);
        // This test's own executable is mapped by this process.
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        let files: HashSet<(u64, u64)> = [(exe.dev(), exe.ino())].into();
        assert!(processes_mapping(&files).contains(&std::process::id()));
    }
}

//! A recording: samples drained from the kernel, aggregated per distinct
//! stack, with every process captured as it is first seen.
//!
//! Memory follows the number of distinct stacks, not the number of
//! samples. Symbolization happens after the run (`to_profile`), from the
//! process captures, so processes that exited mid-run are still named.

mod to_profile;

pub use to_profile::{ProfileWindow, build_profile, build_profile_of};

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use profiler_common::Sample;
use profiler_common::unwind::UserStackEnd;

use crate::process::ProcessTable;
use crate::profile::Profile;
use crate::sampling::{KernelCounters, Sampler, SamplingConfig, SamplingError};
use crate::symbolize::Symbolizer;
use crate::unwind::{UnwindTableStats, UnwindTables};

/// One distinct stack of one thread.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub pid: u32,
    pub tid: u32,
    /// Thread name (`comm`) at the sample, NUL-padded.
    pub thread: [u8; 16],
    /// Leaf first.
    pub user: Box<[u64]>,
    /// Leaf first.
    pub kernel: Box<[u64]>,
}

impl StackKey {
    pub fn thread_name(&self) -> String {
        let end = self.thread.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.thread[..end]).into_owned()
    }
}

/// Everything a run collected.
pub struct Recording {
    pub stacks: HashMap<StackKey, u64>,
    pub processes: ProcessTable,
    /// Objects parsed during the run (for unwind tables) stay parsed for
    /// symbolization.
    pub symbolizer: Symbolizer,
    pub unwind_tables: UnwindTableStats,
    pub counters: KernelCounters,
    pub started: SystemTime,
    pub elapsed: Duration,
    pub frequency_hz: u64,
    /// Samples received from the kernel.
    pub samples: u64,
    /// Samples read from the ring buffer but dropped in user space because
    /// aggregation fell too far behind (the queue's byte bound).
    pub queue_dropped: u64,
    /// How each sample's user stack walk ended, indexed by
    /// `UserStackEnd` (root, no table, table stop, read fault, the
    /// `MAX_USER_FRAMES` limit).
    pub user_stack_ends: UserStackEnds,
}

/// Samples by how their user stack walk ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserStackEnds {
    counts: [u64; UserStackEnd::ALL.len()],
}

impl UserStackEnds {
    pub fn add(&mut self, end: UserStackEnd, count: u64) {
        self.counts[end as usize] += count;
    }

    pub fn get(&self, end: UserStackEnd) -> u64 {
        self.counts[end as usize]
    }

    /// Samples with a user stack that did not reach a root.
    pub fn incomplete(&self) -> u64 {
        UserStackEnd::ALL
            .iter()
            .filter(|&&e| e != UserStackEnd::None && e != UserStackEnd::Root)
            .map(|&e| self.get(e))
            .sum()
    }
}

impl std::ops::AddAssign for UserStackEnds {
    fn add_assign(&mut self, other: UserStackEnds) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
    }
}

impl Recording {
    /// Samples received per process.
    pub fn samples_by_pid(&self) -> HashMap<u32, u64> {
        let mut by_pid = HashMap::new();
        for (key, count) in &self.stacks {
            *by_pid.entry(key.pid).or_default() += count;
        }
        by_pid
    }
}

/// The stacks of one window of a continuous run.
pub struct Window {
    pub stacks: HashMap<StackKey, u64>,
    pub profile: ProfileWindow,
}

/// Drives a sampler and aggregates what it delivers.
pub struct Recorder {
    window_started: SystemTime,
    sampler: Sampler,
    /// None when unwind tables are switched off.
    tables: Option<UnwindTables>,
    recording: Recording,
    started: Instant,
    /// Processes sampled since the table loader was last told (it evicts
    /// the tables of the least recently sampled first).
    sampled: std::collections::HashSet<u32>,
}

impl Recorder {
    /// Starts sampling. The `--pid` targets get their unwind tables before
    /// the first sample; system-wide, running Go processes have theirs
    /// queued first (their stacks need tables most), and every other
    /// process gets its tables built when first sampled, on the loader's
    /// thread.
    pub fn start(config: &SamplingConfig) -> Result<Self, SamplingError> {
        let mut processes = ProcessTable::default();
        let symbolizer = Symbolizer::default();
        let (sampler, tables) = Sampler::start(config, |tables| {
            if !config.unwind_tables {
                return;
            }
            let pids = if config.pids.is_empty() {
                crate::process::go_processes()
            } else {
                config.pids.clone()
            };
            for pid in pids {
                processes.observe(pid, &[]);
                if let Some(process) = processes.get(pid) {
                    tables.register(process);
                }
            }
            if !config.pids.is_empty() {
                tables.flush();
            }
        })?;
        Ok(Recorder {
            window_started: SystemTime::now(),
            sampler,
            tables: config.unwind_tables.then_some(tables),
            recording: Recording {
                stacks: HashMap::new(),
                processes,
                symbolizer,
                unwind_tables: UnwindTableStats::default(),
                counters: KernelCounters::default(),
                started: SystemTime::now(),
                elapsed: Duration::ZERO,
                frequency_hz: config.frequency_hz,
                samples: 0,
                queue_dropped: 0,
                user_stack_ends: UserStackEnds::default(),
            },
            started: Instant::now(),
            sampled: Default::default(),
        })
    }

    /// Waits up to `timeout` for samples and aggregates them.
    pub fn poll(&mut self, timeout: Duration) -> usize {
        let recording = &mut self.recording;
        let tables = &self.tables;
        let sampled = &mut self.sampled;
        let count = self.sampler.drain(timeout, |sample| {
            sampled.insert(sample.pid);
            aggregate(recording, tables, sample)
        });
        if let Some(tables) = &self.tables
            && !self.sampled.is_empty()
        {
            tables.sampled(self.sampled.drain().collect());
        }
        count
    }

    /// CPUs being sampled.
    pub fn cpus(&self) -> &[u32] {
        self.sampler.cpus()
    }

    pub fn recording(&self) -> &Recording {
        &self.recording
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Ends the current window of a continuous run: drains the ring buffer,
    /// then hands over the stacks counted since the previous window (the
    /// processes and parsed objects stay, for the next windows). No sample
    /// is lost at the boundary: each one lands in exactly one window.
    pub fn take_window(&mut self) -> Window {
        while self.poll(Duration::ZERO) > 0 {}
        let now = SystemTime::now();
        let stacks = std::mem::take(&mut self.recording.stacks);
        let window = Window {
            stacks,
            profile: ProfileWindow {
                started: self.window_started,
                elapsed: now.duration_since(self.window_started).unwrap_or_default(),
                frequency_hz: self.recording.frequency_hz,
            },
        };
        self.window_started = now;
        window
    }

    /// Builds the profile of a window's stacks that `keep` selects (one
    /// service's processes, say), symbolized with the run's caches.
    pub fn profile_of(&mut self, window: &Window, keep: impl Fn(&StackKey) -> bool) -> Profile {
        let recording = &mut self.recording;
        build_profile_of(
            window.stacks.iter().filter(|(key, _)| keep(key)),
            &recording.processes,
            &mut recording.symbolizer,
            &window.profile,
        )
    }

    /// How full the unwinder's BPF maps are; None without unwind tables.
    pub fn unwind_occupancy(&self) -> Option<crate::unwind::UnwindOccupancy> {
        self.tables.as_ref().map(|t| t.occupancy())
    }

    /// Unwind-table loading so far (a continuous run reports it live).
    pub fn unwind_stats(&self) -> Option<crate::unwind::UnwindTableStats> {
        self.tables.as_ref().map(|t| t.stats())
    }

    /// Waits until the unwind tables of every process seen so far are
    /// loaded (tests; a run never needs to).
    pub fn flush_unwind_tables(&self) {
        if let Some(tables) = &self.tables {
            tables.flush();
        }
    }

    /// Hands the resident pages of mapped binaries back (see
    /// `Symbolizer::release_mapped_pages`); a continuous run calls it after
    /// each window.
    pub fn release_mapped_pages(&mut self) -> usize {
        self.recording.symbolizer.release_mapped_pages()
    }

    /// Samples the ring-buffer thread had to drop so far because
    /// aggregation fell too far behind.
    pub fn queue_dropped(&self) -> u64 {
        self.sampler.queue_dropped()
    }

    /// The in-kernel counters so far (a continuous run reports them live).
    pub fn counters(&self) -> KernelCounters {
        self.sampler.counters()
    }

    /// Forgets processes that have exited — call it once their last window
    /// is built — with their unwind-table registration, and the parsed
    /// objects no remaining process maps. Keeps a long continuous run's
    /// memory following the live processes, not every process ever seen.
    /// Processes for which `still_needed` is true stay (a pull still open
    /// holds their stacks). Returns how many processes were forgotten.
    pub fn evict_exited(&mut self, still_needed: impl Fn(u32) -> bool) -> usize {
        let mut gone = Vec::new();
        let forgotten = self.recording.processes.retain(|pid| {
            let alive = still_needed(pid) || std::path::Path::new(&format!("/proc/{pid}")).exists();
            if !alive {
                gone.push(pid);
            }
            alive
        });
        let mapped = self.recording.processes.object_ids();
        if let Some(tables) = &self.tables {
            for pid in gone {
                tables.unregister(pid);
            }
            tables.retain_objects(mapped.clone());
        }
        self.recording
            .symbolizer
            .retain_objects(|id| mapped.contains(id));
        forgotten
    }

    /// Detaches from every CPU, then drains what is still in flight, so no
    /// sample taken before the stop is lost.
    pub fn finish(mut self) -> Recording {
        self.recording.elapsed = self.started.elapsed();
        self.sampler.detach();
        while self.poll(Duration::ZERO) > 0 {}
        self.recording.counters = self.sampler.counters();
        self.recording.queue_dropped = self.sampler.queue_dropped();
        if let Some(tables) = &self.tables {
            tables.flush();
            self.recording.unwind_tables = tables.stats();
        }
        self.recording
    }
}

fn aggregate(recording: &mut Recording, tables: &Option<UnwindTables>, sample: &Sample) {
    let user = sample.user_stack();
    recording.samples += 1;
    if let Some(end) = UserStackEnd::from_u8(sample.user_end) {
        recording.user_stack_ends.add(end, 1);
    }
    if recording.processes.observe(sample.pid, user)
        && let Some(tables) = tables
        && let Some(process) = recording.processes.get(sample.pid)
    {
        tables.register(process);
    }
    let key = StackKey {
        pid: sample.pid,
        tid: sample.tid,
        thread: sample.comm,
        user: user.into(),
        kernel: sample.kernel_stack().into(),
    };
    *recording.stacks.entry(key).or_default() += 1;
}

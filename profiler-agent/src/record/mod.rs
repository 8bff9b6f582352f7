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

use profiler_common::{
    MAX_STACK_DEPTH, MAX_USER_FRAMES, SAMPLE_FLAG_USER_STACK_AT_ROOT,
    SAMPLE_FLAG_USER_STACK_TRUNCATED, Sample,
};

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
    /// Samples whose user stack walk stopped at `MAX_USER_FRAMES`.
    pub user_stack_truncated: u64,
    /// Samples whose user stack walk ended at a root an unwind table marks
    /// (Go's runtime.goexit, runtime.mstart, ...).
    pub user_stack_at_root: u64,
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
}

impl Recorder {
    /// Starts sampling. Processes to profile that are already running (the
    /// `--pid` targets, or every Go process system-wide) get their unwind
    /// tables before the first sample; others when first sampled.
    pub fn start(config: &SamplingConfig) -> Result<Self, SamplingError> {
        let mut processes = ProcessTable::default();
        let mut symbolizer = Symbolizer::default();
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
                    tables.register(process, &mut symbolizer);
                }
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
                user_stack_truncated: 0,
                user_stack_at_root: 0,
            },
            started: Instant::now(),
        })
    }

    /// Waits up to `timeout` for samples and aggregates them.
    pub fn poll(&mut self, timeout: Duration) -> usize {
        let recording = &mut self.recording;
        let tables = &mut self.tables;
        self.sampler
            .drain(timeout, |sample| aggregate(recording, tables, sample))
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
        self.tables.as_ref().map(|t| t.stats)
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
        if let Some(tables) = &mut self.tables {
            for pid in gone {
                tables.unregister(pid);
            }
            tables.retain_objects(|id| mapped.contains(id));
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
            self.recording.unwind_tables = tables.stats;
        }
        self.recording
    }
}

fn aggregate(recording: &mut Recording, tables: &mut Option<UnwindTables>, sample: &Sample) {
    let user_len = (sample.user_frames as usize).min(MAX_USER_FRAMES);
    let kernel_len = (sample.kernel_frames as usize).min(MAX_STACK_DEPTH);
    let user = &sample.user_stack[..user_len];
    recording.samples += 1;
    if sample.flags & SAMPLE_FLAG_USER_STACK_TRUNCATED != 0 {
        recording.user_stack_truncated += 1;
    }
    if sample.flags & SAMPLE_FLAG_USER_STACK_AT_ROOT != 0 {
        recording.user_stack_at_root += 1;
    }
    if recording.processes.observe(sample.pid, user)
        && let Some(tables) = tables
        && let Some(process) = recording.processes.get(sample.pid)
    {
        tables.register(process, &mut recording.symbolizer);
    }
    let key = StackKey {
        pid: sample.pid,
        tid: sample.tid,
        thread: sample.comm,
        user: user.into(),
        kernel: sample.kernel_stack[..kernel_len].into(),
    };
    *recording.stacks.entry(key).or_default() += 1;
}

//! A recording: samples drained from the kernel, aggregated per distinct
//! stack, with every process captured as it is first seen.
//!
//! Memory follows the number of distinct stacks, not the number of
//! samples. Symbolization happens after the run (`to_profile`), from the
//! process captures, so processes that exited mid-run are still named.
//! Off-CPU intervals are counted per stack the same way, as nanoseconds
//! blocked and waiting for a CPU.

mod to_profile;
pub mod wait;

pub use to_profile::{ProfileWindow, build_profile, build_profile_of};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use profiler_common::unwind::UserStackEnd;
use profiler_common::{SAMPLE_KIND_OFF_CPU, SAMPLE_KIND_PAGE_FAULT, Sample};

use crate::sampler::{KernelCounters, Sampler, SamplingConfig, SamplingError};
use crate::tables::{UnwindTableStats, UnwindTables};
use profiler_common::SAMPLE_FLAG_RUNTIME_THREAD_UNKNOWN;
use profiler_profile::{Profile, ProfileKind};
use profiler_runtimes::go::labels::{GoLabelsConfig, LabelCache};
use profiler_runtimes::{RuntimeFrames, RuntimeRegistry};
use profiler_symbolize::Symbolizer;
use profiler_symbolize::process::ProcessTable;

/// The distinct stacks of a recording or window, with what each counted.
/// A hashbrown map with foldhash rather than std's SipHash map: at
/// thousands of samples a second the table is the agent's hottest code,
/// and a sample of a stack seen before is looked up by a borrowed view of
/// its record ([`StackRef`]), without allocating a key.
pub type Stacks = hashbrown::HashMap<StackKey, StackCounts>;

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
    /// The goroutine's pprof labels (and id, when asked for), sorted by
    /// key; empty outside Go. Shared by every stack of the window with the
    /// same labels (`LabelSets`).
    pub labels: Arc<[(String, String)]>,
}

/// The distinct label sets of a window's stacks, each held once. A Go
/// service's samples carry a few label sets over tens of thousands of
/// distinct stacks (60 s of the bench's Go service at 6400 samples/s:
/// 51,574 distinct stacks, 2 label sets); owned by each stack, two labels
/// were four strings and a slice allocated per stack. Shared, the agent's
/// anonymous memory after 39 s of that load (with deep C stacks and C
/// without frame pointers) fell from 40.5-40.9 MiB to 18.7-19.5 MiB.
/// Cleared with the stacks they serve (`Recording::take_stacks`), so a
/// label of unbounded values costs no more than the stacks do.
#[derive(Debug, Default)]
pub struct LabelSets(hashbrown::HashSet<Arc<[(String, String)]>>);

impl LabelSets {
    /// The shared copy of `labels`.
    fn intern(&mut self, labels: &[(String, String)]) -> Arc<[(String, String)]> {
        if let Some(set) = self.0.get(labels) {
            return set.clone();
        }
        let set: Arc<[(String, String)]> = labels.into();
        self.0.insert(set.clone());
        set
    }
}

/// A [`StackKey`] borrowed from a sample's record. Its fields are the
/// key's, in the key's order and with the same `Hash` (a boxed slice
/// hashes as the slice), so both hash alike and a lookup finds the key.
#[derive(Hash)]
struct StackRef<'a> {
    pid: u32,
    tid: u32,
    thread: [u8; 16],
    user: &'a [u64],
    kernel: &'a [u64],
    labels: &'a [(String, String)],
}

impl hashbrown::Equivalent<StackKey> for StackRef<'_> {
    fn equivalent(&self, key: &StackKey) -> bool {
        self.pid == key.pid
            && self.tid == key.tid
            && self.thread == key.thread
            && self.user == &*key.user
            && self.kernel == &*key.kernel
            && self.labels == &*key.labels
    }
}

impl StackRef<'_> {
    fn to_key(&self, label_sets: &mut LabelSets) -> StackKey {
        StackKey {
            pid: self.pid,
            tid: self.tid,
            thread: self.thread,
            user: self.user.into(),
            kernel: self.kernel.into(),
            labels: label_sets.intern(self.labels),
        }
    }
}

impl StackKey {
    pub fn thread_name(&self) -> String {
        profiler_symbolize::nul_padded(&self.thread).into_owned()
    }
}

/// What was counted for one stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackCounts {
    /// CPU samples.
    pub samples: u64,
    /// Page-fault samples (each one in `page_fault_period` faults).
    pub page_faults: u64,
    /// Off-CPU nanoseconds blocked (sleeping, waiting for a lock or I/O).
    pub blocked_ns: u64,
    /// Off-CPU nanoseconds runnable, waiting for a CPU.
    pub runq_ns: u64,
}

impl StackCounts {
    pub fn samples(samples: u64) -> StackCounts {
        StackCounts {
            samples,
            ..StackCounts::default()
        }
    }

    pub fn off_cpu_ns(&self) -> u64 {
        self.blocked_ns + self.runq_ns
    }
}

impl std::ops::AddAssign for StackCounts {
    fn add_assign(&mut self, other: StackCounts) {
        self.samples += other.samples;
        self.page_faults += other.page_faults;
        self.blocked_ns += other.blocked_ns;
        self.runq_ns += other.runq_ns;
    }
}

/// The counts one off-CPU record stands for: its weight (see
/// `Sample::weight_ns`) split between blocked and run-queue time in the
/// proportion the interval had.
pub fn off_cpu_counts(sample: &Sample) -> StackCounts {
    let off = sample.off_cpu_ns.max(1) as u128;
    let runq = (sample.runq_ns as u128).min(off);
    let weight = sample.weight_ns as u128;
    let runq_ns = (runq * weight / off) as u64;
    StackCounts {
        blocked_ns: sample.weight_ns - runq_ns,
        runq_ns,
        ..StackCounts::default()
    }
}

/// Off-CPU totals of a run, for its report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuTotals {
    /// Records received (each one interval of a thread).
    pub records: u64,
    /// Intervals they hold.
    pub intervals: u64,
    /// Nanoseconds they stand for (weighted), blocked and in the run queue.
    pub blocked_ns: u64,
    pub runq_ns: u64,
    /// Intervals whose user stack was lost on the way (kept with their
    /// kernel stack alone).
    pub stacks_missing: u64,
}

impl std::ops::Add for OffCpuTotals {
    type Output = OffCpuTotals;
    fn add(self, b: OffCpuTotals) -> OffCpuTotals {
        OffCpuTotals {
            records: self.records + b.records,
            intervals: self.intervals + b.intervals,
            blocked_ns: self.blocked_ns + b.blocked_ns,
            runq_ns: self.runq_ns + b.runq_ns,
            stacks_missing: self.stacks_missing + b.stacks_missing,
        }
    }
}

/// Everything a run collected.
pub struct Recording {
    pub stacks: Stacks,
    /// The label sets `stacks` share.
    pub label_sets: LabelSets,
    /// What the profile built from it shows.
    pub kind: ProfileKind,
    pub off_cpu: OffCpuTotals,
    pub processes: ProcessTable,
    /// Objects parsed during the run (for unwind tables) stay parsed for
    /// symbolization.
    pub symbolizer: Symbolizer,
    pub unwind_tables: UnwindTableStats,
    pub counters: KernelCounters,
    pub started: SystemTime,
    pub elapsed: Duration,
    pub frequency_hz: u64,
    /// Page faults per page-fault sample (0: none sampled).
    pub page_fault_period: u64,
    /// Samples received from the kernel.
    pub samples: u64,
    /// Samples read from the ring buffer but dropped in user space because
    /// aggregation fell too far behind (the queue's byte bound).
    pub queue_dropped: u64,
    /// How each sample's user stack walk ended, indexed by
    /// `UserStackEnd` (root, no table, table stop, read fault, the
    /// `MAX_USER_FRAMES` limit).
    pub user_stack_ends: UserStackEnds,
    /// Which Go labels samples keep; None when they are not read.
    pub go_labels: Option<GoLabelsConfig>,
    /// Samples' label sets, decoded once per distinct raw block.
    pub label_cache: LabelCache,
    /// The runtime frames of the stacks, named as they were first seen.
    pub runtime_frames: RuntimeFrames,
    /// What each runtime's registry and walker did, in words (the report's
    /// lines); filled by `finish`.
    pub runtime_report: Vec<String>,
    /// The runtimes' walkers' counters, by `RuntimeCounter::slot`; filled
    /// by `finish`.
    pub runtime_counters: Vec<u64>,
}

impl Recording {
    /// The stacks so far, leaving none (and forgetting the label sets they
    /// shared: the taken keys keep theirs).
    pub fn take_stacks(&mut self) -> Stacks {
        self.label_sets = LabelSets::default();
        std::mem::take(&mut self.stacks)
    }
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
    /// CPU samples received per process.
    pub fn samples_by_pid(&self) -> HashMap<u32, u64> {
        let mut by_pid = HashMap::new();
        for (key, counts) in &self.stacks {
            *by_pid.entry(key.pid).or_default() += counts.samples;
        }
        by_pid
    }
}

/// The stacks of one window of a continuous run.
pub struct Window {
    pub stacks: Stacks,
    pub profile: ProfileWindow,
}

/// Drives a sampler and aggregates what it delivers.
pub struct Recorder {
    window_started: SystemTime,
    sampler: Sampler,
    /// None when unwind tables are switched off.
    tables: Option<UnwindTables>,
    /// The runtimes' registries (Go labels, CPython).
    runtimes: RuntimeRegistry,
    /// When each process last asked for its Python threads to be read
    /// again (at most once a second each).
    thread_refreshes: HashMap<u32, Instant>,
    recording: Recording,
    started: Instant,
    /// Processes sampled since the table loader was last told (it evicts
    /// the tables of the least recently sampled first).
    sampled: std::collections::HashSet<u32>,
    /// Processes seen for the first time since `take_new_pids`, and every
    /// process seen (forgotten with the exited ones).
    new_pids: Vec<u32>,
    seen: std::collections::HashSet<u32>,
}

impl Recorder {
    /// Starts sampling. The `--pid` targets get their unwind tables and
    /// Go label layouts before the first sample; system-wide, running Go
    /// processes have theirs queued first (their stacks need tables most),
    /// and every other process gets its tables built when first sampled,
    /// on the loader's thread.
    pub fn start(config: &SamplingConfig) -> Result<Self, SamplingError> {
        let mut processes = ProcessTable::default();
        let symbolizer = profiler_runtimes::symbolizer();
        let (mut sampler, tables) = Sampler::start(config, |tables, runtimes| {
            if !config.unwind_tables && config.go_labels().is_none() {
                return;
            }
            let pids = if config.pids.is_empty() {
                profiler_runtimes::go::go_processes()
            } else {
                config.pids.clone()
            };
            for &pid in &pids {
                processes.observe(pid, &[]);
            }
            // Before the perf events are attached: the first samples of
            // these processes already unwind with tables and carry labels
            // and Python frames (a Go binary's layout takes a while to
            // read, seconds in a slow emulated guest).
            if config.unwind_tables {
                for process in processes.iter() {
                    tables.register(process);
                }
            }
            for process in processes.iter() {
                runtimes.register(process);
            }
            if !config.pids.is_empty() {
                if config.unwind_tables {
                    tables.flush();
                }
                runtimes.flush();
            }
        })?;
        let runtimes = sampler.take_runtimes();
        let runtime_frames = runtimes.frames();
        Ok(Recorder {
            window_started: SystemTime::now(),
            sampler,
            tables: config.unwind_tables.then_some(tables),
            runtimes,
            thread_refreshes: HashMap::new(),
            recording: Recording {
                stacks: Stacks::default(),
                label_sets: LabelSets::default(),
                kind: ProfileWindow::kind_for(config),
                off_cpu: OffCpuTotals::default(),
                processes,
                symbolizer,
                unwind_tables: UnwindTableStats::default(),
                counters: KernelCounters::default(),
                started: SystemTime::now(),
                elapsed: Duration::ZERO,
                frequency_hz: config.frequency_hz,
                page_fault_period: config.page_faults.unwrap_or(0),
                samples: 0,
                queue_dropped: 0,
                user_stack_ends: UserStackEnds::default(),
                go_labels: config.go_labels().cloned(),
                label_cache: LabelCache::default(),
                runtime_frames,
                runtime_report: Vec::new(),
                runtime_counters: Vec::new(),
            },
            started: Instant::now(),
            sampled: Default::default(),
            new_pids: Vec::new(),
            seen: Default::default(),
        })
    }

    /// Waits up to `timeout` for samples and aggregates them.
    pub fn poll(&mut self, timeout: Duration) -> usize {
        let recording = &mut self.recording;
        let tables = &self.tables;
        let runtimes = &self.runtimes;
        let refreshes = &mut self.thread_refreshes;
        let sampled = &mut self.sampled;
        let new_pids = &mut self.new_pids;
        let seen = &mut self.seen;
        let already_new = new_pids.len();
        let mut clock = BatchClock::default();
        let count = self.sampler.drain(timeout, |sample| {
            sampled.insert(sample.pid);
            if seen.insert(sample.pid) {
                new_pids.push(sample.pid);
            }
            if sample.flags & SAMPLE_FLAG_RUNTIME_THREAD_UNKNOWN != 0 {
                let due = refreshes
                    .get(&sample.pid)
                    .is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
                if due {
                    refreshes.insert(sample.pid, Instant::now());
                    runtimes.refresh_threads(sample.pid);
                }
            }
            aggregate(recording, tables, runtimes, sample, clock.now())
        });
        self.recording.off_cpu.stacks_missing = self.sampler.off_cpu_stacks_missing();
        // Debug files of new processes' stripped objects download while
        // sampling goes on.
        for pid in &self.new_pids[already_new..] {
            if let Some(process) = self.recording.processes.get(*pid) {
                self.recording.symbolizer.prefetch(process);
            }
        }
        if let Some(tables) = &self.tables
            && !self.sampled.is_empty()
        {
            tables.sampled(self.sampled.drain().collect());
        }
        count
    }

    /// Forgets parsed objects whose debuginfod download has finished, so
    /// they are read again with their debug file.
    pub fn refresh_fetched(&mut self) -> usize {
        self.recording.symbolizer.refresh_fetched()
    }

    /// Processes whose first samples arrived since the last call.
    pub fn take_new_pids(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.new_pids)
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
        let stacks = self.recording.take_stacks();
        let window = Window {
            stacks,
            profile: ProfileWindow {
                started: self.window_started,
                elapsed: now.duration_since(self.window_started).unwrap_or_default(),
                frequency_hz: self.recording.frequency_hz,
                page_fault_period: self.recording.page_fault_period,
                kind: self.recording.kind,
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
            &mut recording.runtime_frames,
            &window.profile,
        )
    }

    /// How full the unwinder's BPF maps are; None without unwind tables.
    pub fn unwind_occupancy(&self) -> Option<crate::tables::UnwindOccupancy> {
        self.tables.as_ref().map(|t| t.occupancy())
    }

    /// Unwind-table loading so far (a continuous run reports it live).
    pub fn unwind_stats(&self) -> Option<crate::tables::UnwindTableStats> {
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

    /// The runtimes' walkers' counters so far, by
    /// `RuntimeCounter::slot`.
    pub fn runtime_counters(&self) -> Vec<u64> {
        self.sampler.runtime_counters()
    }

    /// The started runtimes' ids and names.
    pub fn runtime_names(&self) -> Vec<(u8, &'static str)> {
        self.runtimes.ids()
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
        self.seen.retain(|pid| !gone.contains(pid));
        let mapped = self.recording.processes.object_ids();
        for &pid in &gone {
            self.runtimes.unregister(pid);
            self.thread_refreshes.remove(&pid);
        }
        if !gone.is_empty() {
            self.runtimes.retain_objects(&mapped);
        }
        self.recording
            .runtime_frames
            .retain(|pid| !gone.contains(&pid));
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
        self.recording.runtime_counters = self.sampler.runtime_counters();
        self.recording.runtime_report = self.runtimes.report(
            self.recording.counters.as_slice(),
            &self.recording.runtime_counters,
        );
        self.recording
    }
}

/// The time for a drain's samples: the clock is read at its first sample
/// and every `EVERY` samples after (a drain handles samples already
/// queued, microseconds each, so the time is that late at most).
#[derive(Default)]
struct BatchClock {
    now: Option<Instant>,
    left: u32,
}

impl BatchClock {
    const EVERY: u32 = 64;

    fn now(&mut self) -> Instant {
        match self.now {
            Some(now) if self.left > 0 => {
                self.left -= 1;
                now
            }
            _ => {
                let now = Instant::now();
                self.now = Some(now);
                self.left = Self::EVERY - 1;
                now
            }
        }
    }
}

/// The Go binaries of registered processes, to read the label strings
/// the sampling program sent by address.
fn go_strings(runtimes: &RuntimeRegistry) -> Option<&profiler_runtimes::go::labels::GoStrings> {
    runtimes
        .get::<profiler_runtimes::go::labels::GoLabelRegistry>()
        .map(|registry| registry.strings())
}

fn aggregate(
    recording: &mut Recording,
    tables: &Option<UnwindTables>,
    runtimes: &RuntimeRegistry,
    sample: &Sample,
    now: Instant,
) {
    let user = sample.user_stack();
    let counts = if sample.kind == SAMPLE_KIND_OFF_CPU {
        let counts = off_cpu_counts(sample);
        let totals = &mut recording.off_cpu;
        totals.records += 1;
        totals.intervals += u64::from(sample.intervals);
        totals.blocked_ns += counts.blocked_ns;
        totals.runq_ns += counts.runq_ns;
        counts
    } else {
        recording.samples += 1;
        if let Some(end) = UserStackEnd::from_u8(sample.user_end) {
            recording.user_stack_ends.add(end, 1);
        }
        if sample.kind == SAMPLE_KIND_PAGE_FAULT {
            StackCounts {
                page_faults: 1,
                ..StackCounts::default()
            }
        } else {
            StackCounts::samples(1)
        }
    };
    let labels = match &recording.go_labels {
        Some(config) => recording
            .label_cache
            .labels(sample, config, go_strings(runtimes)),
        None => recording.label_cache.none(),
    };
    let key = StackRef {
        pid: sample.pid,
        tid: sample.tid,
        thread: sample.comm,
        user,
        kernel: sample.kernel_stack(),
        labels: &labels,
    };
    let counted = recording.stacks.get_mut(&key);
    let new = counted.is_none();
    match counted {
        Some(counted) => *counted += counts,
        None => {
            // A new stack: name its runtime frames while the process
            // lives (a profile may be built after it exited).
            recording.runtime_frames.observe(sample.pid, user);
            let key = key.to_key(&mut recording.label_sets);
            recording.stacks.insert(key, counts);
        }
    }
    if recording.processes.observe_stack(
        sample.pid,
        user,
        new,
        now,
        (sample.tid == sample.pid).then_some(&sample.comm[..]),
    ) && let Some(process) = recording.processes.get(sample.pid)
    {
        if let Some(tables) = tables {
            tables.register(process);
        }
        runtimes.register(process);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A borrowed stack finds the key it was stored as: the two hash alike
    /// (otherwise every sample would be a new stack), and a stack that
    /// differs in any field is another.
    #[test]
    fn a_borrowed_stack_finds_its_key() {
        let labels = vec![("endpoint".to_string(), "/a".to_string())];
        let view = StackRef {
            pid: 7,
            tid: 8,
            thread: *b"worker\0\0\0\0\0\0\0\0\0\0",
            user: &[0x401000, 0x402000],
            kernel: &[0xffff_ffff_8100_0000],
            labels: &labels,
        };
        let mut stacks = Stacks::default();
        let mut label_sets = LabelSets::default();
        stacks.insert(view.to_key(&mut label_sets), StackCounts::samples(1));
        *stacks.get_mut(&view).expect("found by its view") += StackCounts::samples(1);
        assert_eq!(stacks.len(), 1);
        let again = view.to_key(&mut label_sets);
        assert_eq!(stacks[&again].samples, 2);
        // The second key shares the first one's labels.
        let first = stacks.keys().next().unwrap();
        assert!(Arc::ptr_eq(&first.labels, &again.labels));
        assert_eq!(label_sets.0.len(), 1);
        let other_leaf = StackRef {
            user: &[0x401001, 0x402000],
            ..view
        };
        let no_labels = StackRef {
            labels: &[],
            ..view
        };
        let other_thread = StackRef { tid: 9, ..view };
        for other in [other_leaf, no_labels, other_thread] {
            assert!(stacks.get(&other).is_none());
        }
    }

    fn off_cpu_record(off: u64, runq: u64, weight: u64) -> Box<Sample> {
        // SAFETY: Sample is plain integers (aya::Pod): zero is valid.
        let mut sample: Box<Sample> = Box::new(unsafe { std::mem::zeroed() });
        sample.kind = SAMPLE_KIND_OFF_CPU;
        sample.off_cpu_ns = off;
        sample.runq_ns = runq;
        sample.weight_ns = weight;
        sample.intervals = 1;
        sample
    }

    #[test]
    fn an_off_cpu_record_splits_its_weight_like_its_interval() {
        // Recorded whole: 7 ms blocked then 1 ms in the run queue.
        let whole = off_cpu_counts(&off_cpu_record(8_000_000, 1_000_000, 8_000_000));
        assert_eq!((whole.blocked_ns, whole.runq_ns), (7_000_000, 1_000_000));
        // A 100 µs interval drawn for a 10 ms period stands for 10 ms,
        // in the same proportion.
        let drawn = off_cpu_counts(&off_cpu_record(100_000, 25_000, 10_000_000));
        assert_eq!((drawn.blocked_ns, drawn.runq_ns), (7_500_000, 2_500_000));
        // Preempted: all of it in the run queue; a runq above the
        // interval (clock skew between CPUs) is capped.
        let preempted = off_cpu_counts(&off_cpu_record(5_000, 6_000, 5_000));
        assert_eq!((preempted.blocked_ns, preempted.runq_ns), (0, 5_000));
    }
}

//! Sampling: load the BPF program, attach it to a CPU-clock perf event on
//! every online CPU, and hand each sample to the caller.
//!
//! One code path serves `--pid` and system-wide profiling: the pid filter is
//! a BPF hash map consulted before any stack work, so other processes cost
//! the kernel one map lookup per sample.

mod errors;
mod offcpu;
mod privileges;
mod reader;
mod user_stacks;

pub use errors::SamplingError;
pub use offcpu::{DEFAULT_OFF_CPU_MIN, OffCpuConfig, TaskOffsets};
pub use privileges::check_privileges;

use std::time::Duration;

use aya::maps::{MapData, PerCpuArray};
use aya::programs::PerfEvent;
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::{Ebpf, EbpfLoader};
use profiler_common::{
    COUNTER_SLOTS, Counter, GLOBAL_FILTER_PIDS, MAX_PID_FILTER, SAMPLE_KIND_OFF_CPU,
    SAMPLE_KIND_OFF_CPU_STACK, Sample,
};

use self::reader::RecordReader;
use self::user_stacks::UserStacks;
use crate::tables::{TableStore, UnwindArrays, UnwindTables};
use profiler_bpf::chain::{Chain, Context};
use profiler_bpf::loading::raise_memlock_limit;
use profiler_bpf::maps;
use profiler_common::runtimes::RUNTIME_COUNTER_SLOTS;
use profiler_runtimes::{RuntimeRegistry, Selection};

/// Records waiting between the ring-buffer thread and the aggregation
/// above this many bytes are dropped oldest first (see `reader`): at
/// 100 Hz on 2 CPUs that is minutes of samples, on 64 CPUs seconds.
const QUEUE_MAX_BYTES: usize = 16 << 20;

/// What to sample.
#[derive(Debug, Clone)]
pub struct SamplingConfig {
    /// Samples per second per CPU (of the CPU clock).
    pub frequency_hz: u64,
    /// Sample the CPU clock, `frequency_hz` times a second: where CPU time
    /// goes. False when only page faults are sampled (`record --event
    /// page-faults`).
    pub cpu_clock: bool,
    /// Also sample one in this many page faults (the `page-faults` software
    /// event, records `SAMPLE_KIND_PAGE_FAULT`): where processes first
    /// touch memory, which is where their resident memory grows.
    pub page_faults: Option<u64>,
    /// Processes to sample; empty means every process on the machine.
    pub pids: Vec<u32>,
    /// Load unwind tables (`.eh_frame` CFI, Go pcsp) to walk stacks
    /// without frame pointers; false walks frame pointers only, as perf
    /// and bpftrace do.
    pub unwind_tables: bool,
    /// Bytes of kernel memory for unwind-table rows (4 bytes a row).
    pub unwind_table_bytes: u64,
    /// Also record where threads wait (off-CPU intervals); None for CPU
    /// samples only.
    pub off_cpu: Option<OffCpuConfig>,
    /// The language runtimes whose frames (and Go's labels) the walkers
    /// read (`--runtimes`; those that need unwind tables only with them).
    pub runtimes: Selection,
    /// Which of Go's labels samples keep, when Go is among `runtimes`.
    pub go_labels: profiler_runtimes::go::labels::GoLabelsConfig,
}

/// Page faults per sample when none is given: one sample per 256 KiB first
/// touched in 4 KiB pages.
pub const DEFAULT_PAGE_FAULT_PERIOD: u64 = 64;

impl SamplingConfig {
    /// Go's label settings, when Go labels are read.
    pub fn go_labels(&self) -> Option<&profiler_runtimes::go::labels::GoLabelsConfig> {
        self.runtimes
            .includes(&profiler_runtimes::go::GO)
            .then_some(&self.go_labels)
    }
}

/// The maps of the probes' programs, which sampling does not use
/// (allocated when the object loads: one element each).
const PROBE_MAPS: [&str; 7] = [
    "THREADS",
    "STARTS",
    "HISTOGRAMS",
    "STACKS",
    "STACK_TOTALS",
    "TRACE_STARTS",
    "SITES",
];

/// Samples per second per CPU unless told otherwise: Go's own profiler's
/// rate. `record`'s `-F` and `run`'s `frequency_hz` default to it.
pub const DEFAULT_FREQUENCY_HZ: u64 = 100;

/// The CPU time one sample stands for at `frequency_hz`: the period of
/// the CPU clock's samples (10 ms at 100 Hz), and the default period of
/// off-CPU sampling, so that a blocked thread is sampled as often as a
/// running one.
pub fn sampling_period(frequency_hz: u64) -> std::time::Duration {
    std::time::Duration::from_nanos(1_000_000_000 / frequency_hz.max(1))
}

/// Default bound on unwind-table rows: 64 MiB holds 16 M rows, the tables
/// of hundreds of typical objects (libc: 0.2 MiB; see BENCHMARKS.md).
pub const DEFAULT_UNWIND_TABLE_BYTES: u64 = 64 << 20;

/// Totals of the in-kernel counters, summed over CPUs, by `Counter`
/// (`kernel[Counter::Sent]`): every counter profiler-common declares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters([u64; COUNTER_SLOTS as usize]);

impl std::ops::Index<Counter> for KernelCounters {
    type Output = u64;
    fn index(&self, counter: Counter) -> &u64 {
        &self.0[counter as usize]
    }
}

impl std::ops::IndexMut<Counter> for KernelCounters {
    fn index_mut(&mut self, counter: Counter) -> &mut u64 {
        &mut self.0[counter as usize]
    }
}

/// Slot by slot: totals carried over sampler restarts.
impl std::ops::Add for KernelCounters {
    type Output = KernelCounters;
    fn add(mut self, b: KernelCounters) -> KernelCounters {
        for (a, b) in self.0.iter_mut().zip(b.0) {
            *a += b;
        }
        self
    }
}

impl KernelCounters {
    /// The totals by slot.
    pub fn as_slice(&self) -> &[u64] {
        &self.0
    }

    /// Every counter with its total, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL.iter().map(|&c| (c, self[c]))
    }
}

/// A loaded and attached sampler. Dropping it detaches every perf event.
pub struct Sampler {
    /// The thread emptying the ring buffer, and its queue.
    reader: RecordReader,
    counters: PerCpuArray<MapData, u64>,
    /// The loaded programs and their perf-event links; `None` once detached.
    ebpf: Option<Ebpf>,
    /// Where each variable-length ring-buffer record is copied to be read
    /// as a `Sample` (allocated once: a full sample is 9 KiB).
    buffer: Box<Sample>,
    /// Off-CPU threads' user stacks, for the intervals that name them.
    user_stacks: UserStacks,
    cpus: Vec<u32>,
    /// Until the recorder takes it (`take_runtimes`).
    runtimes: Option<RuntimeRegistry>,
    /// Per-CPU counters of the runtimes' walkers.
    runtime_counters: PerCpuArray<MapData, u64>,
    /// The walk's chains: their program arrays stay open while sampling.
    _chains: Vec<Chain>,
    _pid_filter: aya::maps::HashMap<MapData, u32, u8>,
}

impl Sampler {
    /// Loads the program, fills the pid filter, lets `before_attach` load
    /// unwind tables and register Go processes' label layouts (so the
    /// first samples already use them), then attaches to every CPU. The
    /// tables stay with the caller for processes seen later.
    pub fn start(
        config: &SamplingConfig,
        before_attach: impl FnOnce(&UnwindTables, &RuntimeRegistry),
    ) -> Result<(Self, UnwindTables), SamplingError> {
        if config.frequency_hz == 0 {
            return Err(SamplingError::BadFrequency(config.frequency_hz));
        }
        if config.pids.len() > MAX_PID_FILTER as usize {
            return Err(SamplingError::TooManyPids {
                given: config.pids.len(),
                max: MAX_PID_FILTER as usize,
            });
        }
        raise_memlock_limit();

        let filter: u8 = u8::from(!config.pids.is_empty());
        let row_blocks = unwind_row_blocks(config);
        let cpus =
            aya::util::online_cpus().map_err(|(path, e)| SamplingError::OnlineCpus(path, e))?;
        // Off-CPU programs need the kernel's task_struct layout; asking
        // first gives a clear error before anything is loaded.
        let off_cpu = match &config.off_cpu {
            Some(off_cpu) => Some(offcpu::Globals::new(off_cpu)?),
            None => None,
        };
        let runtime_globals = profiler_runtimes::globals(&config.runtimes, config.unwind_tables);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(GLOBAL_FILTER_PIDS, &filter, true)
            .map_max_entries(maps::UNWIND_ROWS, row_blocks);
        if let Some(globals) = &off_cpu {
            globals.apply(&mut loader);
        }
        runtime_globals.apply(&mut loader);
        // The probes' maps are not this product's: one element each (a
        // ring buffer, one page).
        for name in PROBE_MAPS {
            loader.map_max_entries(name, 1);
        }
        maps::TRACE_EVENTS.size(&mut loader, profiler_bpf::loading::page_size());
        let mut ebpf = loader
            .load(profiler_bpf::OBJECT)
            .map_err(SamplingError::load)?;
        // The walkers first: a program is loaded with the descriptors of
        // the maps it uses, which must still be open (the unwind arrays,
        // without tables, are dropped below).
        let walkers = profiler_runtimes::walkers(&config.runtimes, config.unwind_tables);
        let mut chains = vec![
            profiler_bpf::chain::fill(&mut ebpf, Context::Cpu, &walkers, None)
                .map_err(SamplingError::Chain)?,
        ];
        if off_cpu.is_some() {
            let btf = aya::Btf::from_sys_fs()
                .map_err(|e| SamplingError::OffCpuBtf(profiler_bpf::loading::error_chain(&e)))?;
            chains.push(
                profiler_bpf::chain::fill(&mut ebpf, Context::Sched, &walkers, Some(&btf))
                    .map_err(SamplingError::Chain)?,
            );
        }
        // The entries too (each walks natively in place), before any map
        // is dropped.
        for (name, on) in [
            ("sample_stack", config.cpu_clock),
            ("sample_page_fault", config.page_faults.is_some()),
        ] {
            if !on {
                continue;
            }
            let entry: &mut PerfEvent = ebpf
                .program_mut(name)
                .ok_or(SamplingError::MissingProgram(name))?
                .try_into()
                .map_err(SamplingError::program)?;
            entry.load().map_err(SamplingError::program)?;
        }
        if off_cpu.is_some() {
            offcpu::load(&mut ebpf)?;
        }

        // Kept open while the entry program loads (it is relocated with
        // the descriptor) and runs.
        let mut pid_filter = maps::PID_FILTER.take(&mut ebpf)?;
        for &pid in &config.pids {
            pid_filter
                .insert(pid, 1, 0)
                .map_err(|e| SamplingError::Map("PID_FILTER", e))?;
        }

        let arrays = UnwindArrays::take(&mut ebpf)?;
        let runtimes = profiler_runtimes::start(&mut ebpf, &config.runtimes, config.unwind_tables)
            .map_err(SamplingError::Runtimes)?;

        let tables = UnwindTables::spawn(TableStore::new(
            arrays,
            profiler_common::unwind::MAX_UNWIND_PROCESSES,
        ))
        .map_err(SamplingError::UnwindThread)?;
        before_attach(&tables, &runtimes);

        // The CPU clock, and page faults (one in N), each on every CPU.
        let events = [
            config.cpu_clock.then_some((
                "sample_stack",
                SoftwareEvent::CpuClock,
                SamplePolicy::Frequency(config.frequency_hz),
            )),
            config.page_faults.map(|every| {
                (
                    "sample_page_fault",
                    SoftwareEvent::PageFaults,
                    SamplePolicy::Period(every.max(1)),
                )
            }),
        ];
        for (name, event, policy) in events.into_iter().flatten() {
            let program: &mut PerfEvent = ebpf
                .program_mut(name)
                .ok_or(SamplingError::MissingProgram(name))?
                .try_into()
                .map_err(SamplingError::program)?;
            for &cpu in &cpus {
                program
                    .attach(
                        PerfEventConfig::Software(event),
                        PerfEventScope::AllProcessesOneCpu { cpu },
                        policy,
                        false,
                    )
                    .map_err(|e| SamplingError::Attach { cpu, source: e })?;
            }
        }
        if off_cpu.is_some() {
            offcpu::attach(&mut ebpf)?;
        }

        let samples = maps::SAMPLES.take(&mut ebpf)?;
        let counters = maps::COUNTERS.take(&mut ebpf)?;
        let runtime_counters = maps::RUNTIME_COUNTERS.take(&mut ebpf)?;
        // Loading parsed the kernel's BTF (megabytes of type data) and
        // freed it; hand that memory back instead of keeping it resident.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe {
            libc::malloc_trim(0);
        }
        let reader =
            RecordReader::spawn(samples, QUEUE_MAX_BYTES).map_err(SamplingError::Reader)?;
        let sampler = Sampler {
            reader,
            counters,
            ebpf: Some(ebpf),
            buffer: Box::new(zeroed_sample()),
            user_stacks: UserStacks::default(),
            cpus,
            runtimes: Some(runtimes),
            runtime_counters,
            _pid_filter: pid_filter,
            _chains: chains,
        };
        Ok((sampler, tables))
    }

    /// The runtimes' registries, which tell the program about Go and
    /// Python processes (once: the caller keeps them).
    pub fn take_runtimes(&mut self) -> RuntimeRegistry {
        self.runtimes.take().unwrap_or_else(RuntimeRegistry::none)
    }

    /// CPUs with an attached perf event.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Waits up to `timeout` for samples, then passes every sample read
    /// from the ring buffer so far to `on_sample`. Returns how many.
    pub fn drain(&mut self, timeout: Duration, mut on_sample: impl FnMut(&Sample)) -> usize {
        let buffer = &mut self.buffer;
        let user_stacks = &mut self.user_stacks;
        let mut count = 0;
        self.reader.drain(timeout, |record| {
            if !copy_record(record, buffer) {
                return;
            }
            match buffer.kind {
                SAMPLE_KIND_OFF_CPU_STACK => {
                    user_stacks.keep(buffer);
                    return;
                }
                SAMPLE_KIND_OFF_CPU => user_stacks.join(buffer),
                _ => {}
            }
            on_sample(buffer);
            count += 1;
        });
        count
    }

    /// Off-CPU intervals whose user stack was lost on the way (they kept
    /// their kernel stack alone).
    pub fn off_cpu_stacks_missing(&self) -> u64 {
        self.user_stacks.missing()
    }

    /// Samples the ring-buffer thread dropped because aggregation was
    /// too far behind.
    pub fn queue_dropped(&self) -> u64 {
        self.reader.dropped()
    }

    /// Detaches the program from every CPU (closing the perf events). The
    /// ring buffer and counters stay readable, so samples already in flight
    /// can still be drained.
    pub fn detach(&mut self) {
        self.ebpf = None;
        // One last read of the ring buffer, then its thread ends.
        self.reader.finish();
    }

    /// Reads the runtimes' walkers' counters, summed over CPUs, by
    /// `RuntimeCounter::slot`.
    pub fn runtime_counters(&self) -> Vec<u64> {
        (0..RUNTIME_COUNTER_SLOTS)
            .map(|slot| {
                self.runtime_counters
                    .get(&slot, 0)
                    .map(|per_cpu| per_cpu.iter().sum())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Reads the in-kernel counters, summed over CPUs.
    pub fn counters(&self) -> KernelCounters {
        let mut totals = KernelCounters::default();
        for &counter in Counter::ALL {
            totals[counter] = self
                .counters
                .get(&(counter as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0);
        }
        totals
    }
}

/// Row blocks for the configured table memory (at least one block; none
/// are needed when tables are off).
fn unwind_row_blocks(config: &SamplingConfig) -> u32 {
    let row_bytes = (profiler_common::unwind::UNWIND_ROWS_PER_BLOCK * 4) as u64;
    if !config.unwind_tables {
        return 1;
    }
    (config.unwind_table_bytes / row_bytes).clamp(1, u64::from(u32::MAX / 16)) as u32
}

fn zeroed_sample() -> Sample {
    // SAFETY: Sample is plain integers and arrays of integers (aya::Pod):
    // all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// Copies one ring-buffer record into `sample`. Records end after their
/// last user frame; one shorter than its header says is rejected.
fn copy_record(record: &[u8], sample: &mut Sample) -> bool {
    if record.len() < Sample::HEADER_LEN || record.len() > std::mem::size_of::<Sample>() {
        return false;
    }
    // SAFETY: `sample` is a valid, exclusively borrowed Sample of at least
    // record.len() bytes, and any bytes are a valid Sample (aya::Pod).
    unsafe {
        std::ptr::copy_nonoverlapping(
            record.as_ptr(),
            (sample as *mut Sample).cast::<u8>(),
            record.len(),
        );
    }
    sample.kernel_frames as usize <= profiler_common::MAX_STACK_DEPTH
        && sample.user_frames as usize <= profiler_common::MAX_USER_WORDS
        && Sample::record_len(sample.kernel_frames as usize + sample.user_frames as usize)
            <= record.len()
        && (sample.flags & profiler_common::SAMPLE_FLAG_GO_LABELS == 0
            || sample.go_labels().is_some())
        && sample.wire_len() <= record.len()
}

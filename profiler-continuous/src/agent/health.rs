//! The agent's own health on `/metrics`: the sampler's totals (carried
//! over restarts) and every cache's size, copied into the `Metrics`
//! atomics once a second.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use profiler_common::Counter;
use profiler_common::runtimes::RUNTIME_COUNTER_SLOTS;
use profiler_export::Metrics;
use profiler_sampling::record::{Recorder, Recording};
use profiler_sampling::sampler::KernelCounters;

use crate::kubernetes::Watcher;
use crate::metadata::MetadataCache;
use crate::probes::ProbeHistograms;

/// Live totals of one sampler, added to what earlier samplers counted.
#[derive(Default, Clone, Copy)]
pub(super) struct Totals {
    pub(super) kernel: KernelCounters,
    pub(super) samples: u64,
    pub(super) objects_failed: u64,
    pub(super) user_unresolved: u64,
    pub(super) kernel_unresolved: u64,
    pub(super) tables_dropped: u64,
    pub(super) queue_dropped: u64,
    pub(super) user_stack_ends: profiler_sampling::record::UserStackEnds,
    pub(super) off_cpu: profiler_sampling::record::OffCpuTotals,
    /// The runtimes' walkers' counters, by `RuntimeCounter::slot`.
    pub(super) runtime: [u64; RUNTIME_COUNTER_SLOTS as usize],
}

impl Totals {
    pub(super) fn of(recording: &Recording, kernel: KernelCounters) -> Totals {
        let s = &recording.symbolizer.stats;
        Totals {
            kernel,
            samples: recording.samples,
            objects_failed: s.objects_failed,
            user_unresolved: s.user_unresolved,
            kernel_unresolved: s.kernel_unresolved,
            tables_dropped: recording.unwind_tables.tables_dropped,
            queue_dropped: recording.queue_dropped,
            user_stack_ends: recording.user_stack_ends,
            off_cpu: recording.off_cpu,
            runtime: slots(&recording.runtime_counters),
        }
    }

    pub(super) fn plus(self, other: Totals) -> Totals {
        Totals {
            kernel: self.kernel + other.kernel,
            samples: self.samples + other.samples,
            objects_failed: self.objects_failed + other.objects_failed,
            user_unresolved: self.user_unresolved + other.user_unresolved,
            kernel_unresolved: self.kernel_unresolved + other.kernel_unresolved,
            tables_dropped: self.tables_dropped + other.tables_dropped,
            queue_dropped: self.queue_dropped + other.queue_dropped,
            user_stack_ends: {
                let mut ends = self.user_stack_ends;
                ends += other.user_stack_ends;
                ends
            },
            off_cpu: self.off_cpu + other.off_cpu,
            runtime: std::array::from_fn(|i| self.runtime[i] + other.runtime[i]),
        }
    }
}

/// A recording's runtime counters as a fixed array.
pub(super) fn slots(values: &[u64]) -> [u64; RUNTIME_COUNTER_SLOTS as usize] {
    std::array::from_fn(|i| values.get(i).copied().unwrap_or(0))
}

/// Copies the totals and every cache's size into `m`.
pub(super) fn update(
    m: &Metrics,
    t: &Totals,
    recorder: Option<&Recorder>,
    meta: &MetadataCache,
    probes: &ProbeHistograms,
    pods: Option<&Watcher>,
) {
    for (counter, value) in t.kernel.iter() {
        m.kernel[counter as usize].store(value, Relaxed);
    }
    for (slot, value) in m.runtime.iter().zip(t.runtime) {
        slot.store(value, Relaxed);
    }
    if let Some(recorder) = recorder {
        m.set_runtime_names(&recorder.runtime_names());
    }
    m.samples_received.store(t.samples, Relaxed);
    let k = &t.kernel;
    let lost = k[Counter::OffCpuLost] + k[Counter::OffCpuRingBufferFull];
    for (slot, value) in m.off_cpu_intervals.iter().zip([
        t.off_cpu.intervals,
        k[Counter::OffCpuShort],
        k[Counter::OffCpuUnsampled],
        lost,
    ]) {
        slot.store(value, Relaxed);
    }
    m.off_cpu_blocked_ns.store(t.off_cpu.blocked_ns, Relaxed);
    if let Some(client) = profiler_symbolize::debuginfod::global() {
        let d = client.stats();
        let values = [
            d.fetched, d.cached, d.missing, d.rejected, d.failed, d.dropped,
        ];
        for (slot, value) in m.debuginfod.iter().zip(values) {
            slot.store(value, Relaxed);
        }
        m.debuginfod_pending.store(client.pending() as u64, Relaxed);
    }
    m.off_cpu_runqueue_ns.store(t.off_cpu.runq_ns, Relaxed);
    m.symbolize_objects_failed.store(t.objects_failed, Relaxed);
    m.symbolize_user_unresolved
        .store(t.user_unresolved, Relaxed);
    m.symbolize_kernel_unresolved
        .store(t.kernel_unresolved, Relaxed);
    if let Some(recorder) = recorder {
        let processes = &recorder.recording().processes;
        m.processes_tracked.store(processes.len() as u64, Relaxed);
        m.objects_open
            .store(processes.object_count() as u64, Relaxed);
        if let Some(o) = recorder.unwind_occupancy() {
            m.bpf_unwind_rows_used.store(o.rows_used.into(), Relaxed);
            m.bpf_unwind_rows_capacity
                .store(o.rows_capacity.into(), Relaxed);
            m.bpf_unwind_processes.store(o.processes.into(), Relaxed);
            m.bpf_unwind_processes_capacity
                .store(o.processes_capacity.into(), Relaxed);
            m.bpf_unwind_bytes_used.store(o.bytes_used, Relaxed);
            m.bpf_unwind_bytes_capacity.store(o.bytes_capacity, Relaxed);
        }
        if let Some(u) = recorder.unwind_stats() {
            m.unwind_tables_evicted.store(u.tables_evicted, Relaxed);
            m.unwind_objects_no_unwind_info
                .store(u.objects_no_unwind_info, Relaxed);
            m.unwind_objects_unreadable
                .store(u.objects_unreadable, Relaxed);
        }
    }
    m.unwind_tables_dropped.store(t.tables_dropped, Relaxed);
    m.files_refused.store(
        profiler_symbolize::process::contained::REFUSED.load(Relaxed),
        Relaxed,
    );
    for (end, slot) in profiler_common::unwind::UserStackEnd::ALL
        .iter()
        .zip(&m.user_stack_ends)
    {
        slot.store(t.user_stack_ends.get(*end), Relaxed);
    }
    m.samples_queue_dropped.store(t.queue_dropped, Relaxed);
    if probes.attached() > 0 {
        *m.probe_text.lock().unwrap_or_else(|e| e.into_inner()) = probes.render();
    }
    *m.cache_text.lock().unwrap_or_else(|e| e.into_inner()) = runtime_caches();
    m.metadata_cache_entries.store(meta.len() as u64, Relaxed);
    if let Some(watcher) = pods {
        let stats = &watcher.stats;
        m.kubernetes_pods.store(watcher.index.len() as u64, Relaxed);
        m.kubernetes_watch_events
            .store(stats.events.load(Relaxed), Relaxed);
        m.kubernetes_watch_errors
            .store(stats.errors.load(Relaxed), Relaxed);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    m.heartbeat_unix.store(now, Relaxed);
}

/// The runtime caches' families: what each keeps against the budget
/// (`runtime_cache_mib`), and what it gave up.
fn runtime_caches() -> String {
    use profiler_runtimes::cache;
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP profiler_agent_runtime_cache_budget_bytes What the runtimes' caches may keep in all (runtime_cache_mib).\n\
         # TYPE profiler_agent_runtime_cache_budget_bytes gauge\n\
         profiler_agent_runtime_cache_budget_bytes {}",
        cache::budget()
    );
    type Family = (
        &'static str,
        &'static str,
        &'static str,
        fn(&cache::CacheStats) -> u64,
    );
    let families: [Family; 4] = [
        (
            "profiler_agent_runtime_cache_bytes",
            "gauge",
            "Bytes a runtime's cache keeps of what it read from processes.",
            cache::CacheStats::used,
        ),
        (
            "profiler_agent_runtime_cache_entries",
            "gauge",
            "Entries a runtime's cache keeps.",
            cache::CacheStats::entries,
        ),
        (
            "profiler_agent_runtime_cache_evictions_total",
            "counter",
            "Entries evicted to keep a cache within its share of the budget.",
            cache::CacheStats::evicted,
        ),
        (
            "profiler_agent_runtime_cache_refused_total",
            "counter",
            "Values used once and not kept: larger than a process may hold, or the budget full.",
            cache::CacheStats::refused,
        ),
    ];
    let all = cache::stats();
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in &all {
            let _ = writeln!(
                out,
                "{name}{{runtime=\"{}\",cache=\"{}\"}} {}",
                s.runtime,
                s.name,
                value(s)
            );
        }
    }
    out
}

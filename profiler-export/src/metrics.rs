//! The agent's own health, rendered as Prometheus text (format 0.0.4) on
//! `/metrics`. The run loop and the exporter threads update atomics; a
//! scrape only reads them.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use profiler_common::runtimes::{RUNTIME_COUNTER_SLOTS, RuntimeCounter};
use profiler_common::{COUNTER_SLOTS, Counter};

/// Upper bounds (seconds) of the export latency histogram.
const LATENCY_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// The `result` labels of `profiler_agent_debuginfod_lookups_total`, in
/// the order of `Metrics::debuginfod`.
pub const DEBUGINFOD_RESULTS: [&str; 6] = [
    "fetched", "cached", "missing", "rejected", "failed", "dropped",
];

/// Counters and gauges of the run loop. Kernel counters are totals since
/// the agent started (carried over sampler restarts).
#[derive(Debug, Default)]
pub struct Metrics {
    /// The BPF programs' counters, by `profiler_common::Counter` slot: each
    /// row of that table is a metric here.
    pub kernel: [AtomicU64; COUNTER_SLOTS as usize],
    /// The runtimes' walkers' counters, by `RuntimeCounter::slot`.
    pub runtime: [AtomicU64; RUNTIME_COUNTER_SLOTS as usize],
    /// The started runtimes' ids and names (the `runtime` label).
    runtime_names: Mutex<Vec<(u8, &'static str)>>,
    /// Samples read from the ring buffer, then dropped because the agent
    /// fell too far behind.
    pub samples_queue_dropped: AtomicU64,
    /// Samples user space received and aggregated.
    pub samples_received: AtomicU64,
    /// Stacks (distinct per window) unwound into profiles.
    pub stacks_unwound: AtomicU64,
    pub windows: AtomicU64,
    pub profiles_built: AtomicU64,
    pub symbolize_objects_failed: AtomicU64,
    pub symbolize_user_unresolved: AtomicU64,
    pub symbolize_kernel_unresolved: AtomicU64,
    pub processes_tracked: AtomicU64,
    pub objects_open: AtomicU64,
    pub metadata_cache_entries: AtomicU64,
    /// Pods of this node known from the Kubernetes API (0 outside a cluster).
    pub kubernetes_pods: AtomicU64,
    pub bpf_unwind_rows_used: AtomicU64,
    pub bpf_unwind_rows_capacity: AtomicU64,
    pub bpf_unwind_processes: AtomicU64,
    pub bpf_unwind_processes_capacity: AtomicU64,
    pub unwind_tables_dropped: AtomicU64,
    pub unwind_tables_evicted: AtomicU64,
    pub bpf_unwind_bytes_used: AtomicU64,
    pub bpf_unwind_bytes_capacity: AtomicU64,
    /// Objects without an unwind table: no CFI or pclntab in them.
    pub unwind_objects_no_unwind_info: AtomicU64,
    /// Objects without an unwind table: unreadable or not ELF.
    pub unwind_objects_unreadable: AtomicU64,
    /// Samples by how their user stack walk ended (`UserStackEnd` order:
    /// none, root, no_table, table_stop, read_fault, truncated).
    pub user_stack_ends: [AtomicU64; 6],
    /// Samples of processes outside the cgroup/namespace selection.
    pub samples_unselected: AtomicU64,
    pub probes_attached: AtomicU64,
    pub probes_failed: AtomicU64,
    /// The configured probes' families, rendered by the run loop.
    pub probe_text: std::sync::Mutex<String>,
    /// The runtime caches' families (bytes against the budget,
    /// evictions), rendered by the run loop.
    pub cache_text: std::sync::Mutex<String>,
    /// Microseconds spent building windows (symbolize, label, encode).
    pub window_build_micros: AtomicU64,
    pub kubernetes_watch_events: AtomicU64,
    pub kubernetes_watch_errors: AtomicU64,
    pub sampler_restarts: AtomicU64,
    pub pulls_served: AtomicU64,
    pub pulls_rejected: AtomicU64,
    /// Go heaps read for `memory` profiles, and reads that failed.
    pub go_heaps_read: AtomicU64,
    pub go_heaps_failed: AtomicU64,
    /// Connections closed at once because `MAX_CONNECTIONS` were open.
    pub connections_refused: AtomicU64,
    pub connections_open: AtomicU64,
    pub requests_unauthenticated: AtomicU64,
    pub requests_forbidden: AtomicU64,
    /// Files refused for a process (not regular, too large, out of root).
    pub files_refused: AtomicU64,
    /// Off-CPU: switches of traced threads, and what became of the
    /// intervals (recorded, shorter than the minimum, left out by
    /// sampling, lost), and the time the recorded ones stand for.
    pub off_cpu_intervals: [AtomicU64; 4],
    /// debuginfod lookups by result (see `DEBUGINFOD_RESULTS`), and the
    /// downloads under way.
    pub debuginfod: [AtomicU64; 6],
    pub debuginfod_pending: AtomicU64,
    pub off_cpu_blocked_ns: AtomicU64,
    pub off_cpu_runqueue_ns: AtomicU64,
    /// Unix seconds of the run loop's last turn (liveness).
    pub heartbeat_unix: AtomicU64,
    pub ready: AtomicBool,
    pub shutting_down: AtomicBool,
    exporters: Mutex<Vec<Arc<ExporterStats>>>,
}

/// One exporter's counters.
#[derive(Debug, Default)]
pub struct ExporterStats {
    pub name: String,
    pub successes: AtomicU64,
    pub failures: AtomicU64,
    /// Windows dropped: queue full (oldest dropped) or out of attempts.
    pub dropped: AtomicU64,
    pub queued: AtomicU64,
    pub up: AtomicBool,
    /// Whether the exporter keeps a connection across windows (OTLP over
    /// gRPC): only those have a reconnect count.
    pub keeps_connection: AtomicBool,
    /// Connections it opened after its first.
    pub reconnects: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
}

impl ExporterStats {
    pub fn new(name: &str) -> Self {
        ExporterStats {
            name: name.to_string(),
            up: AtomicBool::new(true),
            ..ExporterStats::default()
        }
    }

    /// Records the duration of one export attempt.
    pub fn observe_latency(&self, seconds: f64) {
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_micros
            .fetch_add((seconds * 1e6) as u64, Relaxed);
    }
}

impl Metrics {
    pub fn register_exporter(&self, stats: Arc<ExporterStats>) {
        self.exporters.lock().unwrap().push(stats);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_scalars(&mut out);
        self.render_families(&mut out);
        self.render_runtimes(&mut out);
        out.push_str(&self.cache_text.lock().unwrap_or_else(|e| e.into_inner()));
        self.render_gauges(&mut out);
        self.render_exporters(&mut out);
        out.push_str(&self.probe_text.lock().unwrap_or_else(|e| e.into_inner()));
        out
    }

    /// The started runtimes, for the `runtime` label of their counters.
    pub fn set_runtime_names(&self, names: &[(u8, &'static str)]) {
        let mut known = self.runtime_names.lock().unwrap_or_else(|e| e.into_inner());
        if known.as_slice() != names {
            *known = names.to_vec();
        }
    }

    /// The user-space counters and gauges without labels.
    fn scalars(&self) -> Vec<(&'static str, &'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Relaxed);
        vec![
            (
                "profiler_agent_samples_queue_dropped_total",
                "Samples read from the ring buffer but dropped because aggregation fell behind.",
                l(&self.samples_queue_dropped),
            ),
            (
                "profiler_agent_samples_received_total",
                "Samples received and aggregated by user space.",
                l(&self.samples_received),
            ),
            (
                "profiler_agent_stacks_unwound_total",
                "Distinct stacks (per window) unwound and symbolized into profiles.",
                l(&self.stacks_unwound),
            ),
            (
                "profiler_agent_windows_total",
                "Windows completed.",
                l(&self.windows),
            ),
            (
                "profiler_agent_profiles_total",
                "Profiles built (one per service per window).",
                l(&self.profiles_built),
            ),
            (
                "profiler_agent_symbolize_objects_failed_total",
                "Object files that could not be read or parsed.",
                l(&self.symbolize_objects_failed),
            ),
            (
                "profiler_agent_symbolize_user_unresolved_total",
                "User addresses left unnamed.",
                l(&self.symbolize_user_unresolved),
            ),
            (
                "profiler_agent_symbolize_kernel_unresolved_total",
                "Kernel addresses left unnamed.",
                l(&self.symbolize_kernel_unresolved),
            ),
            (
                "profiler_agent_sampler_restarts_total",
                "Sampler restarts to bound memory (max_processes, max_objects).",
                l(&self.sampler_restarts),
            ),
            (
                "profiler_agent_pulls_total",
                "Profiles served on /debug/pprof/profile and /debug/pprof/heap.",
                l(&self.pulls_served),
            ),
            (
                "profiler_agent_go_heaps_read_total",
                "Go heaps read from processes' memory for memory profiles.",
                l(&self.go_heaps_read),
            ),
            (
                "profiler_agent_go_heaps_failed_total",
                "Go heap reads that failed (the process changed or refused; see the log).",
                l(&self.go_heaps_failed),
            ),
            (
                "profiler_agent_pulls_rejected_total",
                "Pulls refused (bad parameters, too many at once, shutting down).",
                l(&self.pulls_rejected),
            ),
            (
                "profiler_agent_http_connections_refused_total",
                "Connections closed as they arrived because the listener's connection limit was reached.",
                l(&self.connections_refused),
            ),
            (
                "profiler_agent_http_connections_open",
                "Open connections to the listener.",
                l(&self.connections_open),
            ),
            (
                "profiler_agent_http_unauthenticated_total",
                "Requests answered 401 (no or unknown credentials).",
                l(&self.requests_unauthenticated),
            ),
            (
                "profiler_agent_http_forbidden_total",
                "Requests answered 403 (authenticated, not authorized for the path).",
                l(&self.requests_forbidden),
            ),
            (
                "profiler_agent_files_refused_total",
                "Files a process maps (or names as debug files) the agent refused to read: not a regular file, too large, or a link leading out of the process's root.",
                l(&self.files_refused),
            ),
            (
                "profiler_agent_process_cache_entries",
                "Processes tracked by the sampler (maps and open objects).",
                l(&self.processes_tracked),
            ),
            (
                "profiler_agent_object_cache_entries",
                "Object files held open for symbolization.",
                l(&self.objects_open),
            ),
            (
                "profiler_agent_metadata_cache_entries",
                "Processes with cached service and container metadata.",
                l(&self.metadata_cache_entries),
            ),
            (
                "profiler_agent_bpf_unwind_rows_used",
                "Rows of the BPF unwind-row array holding loaded tables.",
                l(&self.bpf_unwind_rows_used),
            ),
            (
                "profiler_agent_bpf_unwind_rows_capacity",
                "Size of the BPF unwind-row array.",
                l(&self.bpf_unwind_rows_capacity),
            ),
            (
                "profiler_agent_bpf_unwind_processes",
                "Processes registered in the BPF unwinder's process map.",
                l(&self.bpf_unwind_processes),
            ),
            (
                "profiler_agent_bpf_unwind_processes_capacity",
                "Size of the BPF unwinder's process map.",
                l(&self.bpf_unwind_processes_capacity),
            ),
            (
                "profiler_agent_unwind_tables_dropped_total",
                "Unwind tables that did not fit in the row array (those binaries unwind by frame pointers).",
                l(&self.unwind_tables_dropped),
            ),
            (
                "profiler_agent_unwind_tables_evicted_total",
                "Unwind tables evicted to make room, least recently sampled first (their objects then unwind by frame pointers).",
                l(&self.unwind_tables_evicted),
            ),
            (
                "profiler_agent_bpf_unwind_bytes_used",
                "Bytes of the unwinder's BPF arrays (rows, pages, rules, mappings) holding loaded tables.",
                l(&self.bpf_unwind_bytes_used),
            ),
            (
                "profiler_agent_bpf_unwind_bytes_capacity",
                "Bytes of kernel memory the unwinder's BPF arrays hold (allocated at start).",
                l(&self.bpf_unwind_bytes_capacity),
            ),
            (
                "profiler_agent_samples_unselected_total",
                "Samples of processes outside the configured cgroups/namespaces (dropped).",
                l(&self.samples_unselected),
            ),
            (
                "profiler_agent_probes_attached",
                "Configured probes whose histograms are exported here.",
                l(&self.probes_attached),
            ),
            (
                "profiler_agent_probes_failed",
                "Configured probes that could not be attached (see the log).",
                l(&self.probes_failed),
            ),
            (
                "profiler_agent_kubernetes_pods",
                "Pods of this node known from the Kubernetes API.",
                l(&self.kubernetes_pods),
            ),
            (
                "profiler_agent_kubernetes_watch_events_total",
                "Pod watch events received from the Kubernetes API.",
                l(&self.kubernetes_watch_events),
            ),
            (
                "profiler_agent_kubernetes_watch_errors_total",
                "Failed pod lists and watches (each followed by a backoff).",
                l(&self.kubernetes_watch_errors),
            ),
        ]
    }

    /// The kernel's counters and the user-space scalars, one metric each.
    fn render_scalars(&self, out: &mut String) {
        let kernel = Counter::ALL.iter().map(|&c| {
            (
                c.metric(),
                c.help().trim(),
                self.kernel[c as usize].load(Relaxed),
            )
        });
        for (name, help, value) in kernel.chain(self.scalars()) {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }

    /// Metrics with a label: stack ends, objects without tables, off-CPU
    /// intervals, debuginfod lookups, off-CPU time.
    fn render_families(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let _ = writeln!(
            out,
            "# HELP profiler_agent_user_stacks_total Samples by how their user stack walk ended: \
             root (complete), no_table (frame pointers ran out in code without an unwind table), \
             table_stop (a table said the frame cannot be passed), read_fault, truncated (1024 \
             frames), none (no user stack).\n\
             # TYPE profiler_agent_user_stacks_total counter"
        );
        for (end, value) in profiler_common::unwind::UserStackEnd::ALL
            .iter()
            .zip(&self.user_stack_ends)
        {
            let _ = writeln!(
                out,
                "profiler_agent_user_stacks_total{{end=\"{}\"}} {}",
                end.name(),
                l(value)
            );
        }
        let _ = writeln!(
            out,
            "# HELP profiler_agent_unwind_objects_without_table Mapped objects that got no unwind \
             table (their code walks frame pointers), by reason.\n\
             # TYPE profiler_agent_unwind_objects_without_table gauge\n\
             profiler_agent_unwind_objects_without_table{{reason=\"no_unwind_info\"}} {}\n\
             profiler_agent_unwind_objects_without_table{{reason=\"unreadable\"}} {}",
            l(&self.unwind_objects_no_unwind_info),
            l(&self.unwind_objects_unreadable),
        );
        let _ = writeln!(
            out,
            "# HELP profiler_agent_off_cpu_intervals_total Off-CPU intervals by what became of \
             them: recorded, short (below off_cpu_min), unsampled (left out by the weighted draw; \
             the recorded ones stand for them), lost (no room for the stack, or ring buffer full).\n\
             # TYPE profiler_agent_off_cpu_intervals_total counter"
        );
        for (result, value) in ["recorded", "short", "unsampled", "lost"]
            .iter()
            .zip(&self.off_cpu_intervals)
        {
            let _ = writeln!(
                out,
                "profiler_agent_off_cpu_intervals_total{{result=\"{result}\"}} {}",
                l(value)
            );
        }
        let _ = writeln!(
            out,
            "# HELP profiler_agent_debuginfod_lookups_total Debug files of stripped binaries \
             looked up by build id, by result: fetched (downloaded and checked), cached, missing \
             (no server had it), rejected (another build id), failed (server down, timeout, HTTP \
             error, over the size cap), dropped (too many downloads waiting).\n\
             # TYPE profiler_agent_debuginfod_lookups_total counter"
        );
        for (result, value) in DEBUGINFOD_RESULTS.iter().zip(&self.debuginfod) {
            let _ = writeln!(
                out,
                "profiler_agent_debuginfod_lookups_total{{result=\"{result}\"}} {}",
                l(value)
            );
        }
        let _ = writeln!(
            out,
            "# HELP profiler_agent_debuginfod_downloads_pending Debug files being downloaded.\n\
             # TYPE profiler_agent_debuginfod_downloads_pending gauge\n\
             profiler_agent_debuginfod_downloads_pending {}",
            l(&self.debuginfod_pending)
        );
        let _ = writeln!(
            out,
            "# HELP profiler_agent_off_cpu_seconds_total Off-CPU time recorded, by state: \
             blocked (sleep, locks, I/O) or runqueue (runnable, waiting for a CPU).\n\
             # TYPE profiler_agent_off_cpu_seconds_total counter\n\
             profiler_agent_off_cpu_seconds_total{{state=\"blocked\"}} {}\n\
             profiler_agent_off_cpu_seconds_total{{state=\"runqueue\"}} {}",
            l(&self.off_cpu_blocked_ns) as f64 / 1e9,
            l(&self.off_cpu_runqueue_ns) as f64 / 1e9,
        );
    }

    /// The agent's own gauges: memory, build time, readiness.
    fn render_gauges(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let _ = writeln!(
            out,
            "# HELP profiler_agent_resident_memory_bytes Resident set size of the agent.\n\
             # TYPE profiler_agent_resident_memory_bytes gauge\n\
             profiler_agent_resident_memory_bytes {}",
            resident_bytes().unwrap_or(0)
        );
        let _ = writeln!(
            out,
            "# HELP profiler_agent_window_build_seconds_total Time spent turning windows into \
             profiles (symbolization, labels, encoding; exports run on their own threads).\n\
             # TYPE profiler_agent_window_build_seconds_total counter\n\
             profiler_agent_window_build_seconds_total {}",
            l(&self.window_build_micros) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "# HELP profiler_agent_ready Whether sampling runs (1) or not yet / no longer (0).\n\
             # TYPE profiler_agent_ready gauge\nprofiler_agent_ready {}",
            u8::from(self.ready.load(Relaxed))
        );
    }

    /// Each runtime walker's counters, labelled by runtime.
    fn render_runtimes(&self, out: &mut String) {
        let names = self
            .runtime_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for counter in RuntimeCounter::ALL {
            let name = format!("profiler_agent_kernel_runtime_{}_total", counter.name());
            let help = match counter {
                RuntimeCounter::Frames => "Frames the runtimes' walkers wrote into stacks.",
                RuntimeCounter::Cut => {
                    "Samples whose runtime frames were cut (unreadable, unfollowable or too deep)."
                }
                RuntimeCounter::ThreadUnknown => {
                    "Samples that met a runtime's thread not registered yet (its frames stayed native)."
                }
                RuntimeCounter::Fallback => {
                    "Frames in a runtime's code where it found none of its own, walked by frame pointer."
                }
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for &(id, runtime) in &names {
                let value = self
                    .runtime
                    .get(counter.slot(id) as usize)
                    .map_or(0, |v| v.load(Relaxed));
                let _ = writeln!(out, "{name}{{runtime=\"{runtime}\"}} {value}");
            }
        }
    }

    fn render_exporters(&self, out: &mut String) {
        let exporters = self.exporters.lock().unwrap();
        type Family = (&'static str, &'static str, fn(&ExporterStats) -> u64);
        let families: [Family; 5] = [
            (
                "profiler_agent_export_success_total",
                "Windows delivered.",
                |s| s.successes.load(Relaxed),
            ),
            (
                "profiler_agent_export_failures_total",
                "Failed export attempts (each retry counts).",
                |s| s.failures.load(Relaxed),
            ),
            (
                "profiler_agent_export_dropped_total",
                "Windows dropped: queue full (oldest first) or out of attempts.",
                |s| s.dropped.load(Relaxed),
            ),
            (
                "profiler_agent_export_queue_length",
                "Windows waiting in the exporter's queue.",
                |s| s.queued.load(Relaxed),
            ),
            (
                "profiler_agent_export_up",
                "1 while the last attempt succeeded.",
                |s| u64::from(s.up.load(Relaxed)),
            ),
        ];
        for (name, help, value) in families {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for stats in exporters.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{exporter=\"{}\"}} {}",
                    stats.name,
                    value(stats)
                );
            }
        }
        let name = "profiler_agent_export_reconnects_total";
        let _ = writeln!(
            out,
            "# HELP {name} Connections opened after the first, by exporters that keep one \
             across windows (OTLP over gRPC).\n# TYPE {name} counter"
        );
        for stats in exporters
            .iter()
            .filter(|s| s.keeps_connection.load(Relaxed))
        {
            let _ = writeln!(
                out,
                "{name}{{exporter=\"{}\"}} {}",
                stats.name,
                stats.reconnects.load(Relaxed)
            );
        }
        let name = "profiler_agent_export_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Duration of export attempts.\n# TYPE {name} histogram"
        );
        for stats in exporters.iter() {
            let exporter = &stats.name;
            for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&stats.latency_buckets) {
                let _ = writeln!(
                    out,
                    "{name}_bucket{{exporter=\"{exporter}\",le=\"{bound}\"}} {}",
                    bucket.load(Relaxed)
                );
            }
            let count = stats.latency_count.load(Relaxed);
            let sum = stats.latency_sum_micros.load(Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "{name}_bucket{{exporter=\"{exporter}\",le=\"+Inf\"}} {count}\n\
                 {name}_sum{{exporter=\"{exporter}\"}} {sum}\n\
                 {name}_count{{exporter=\"{exporter}\"}} {count}"
            );
        }
    }
}

/// Resident set size from `/proc/self/statm` (pages × page size).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_a_cumulative_histogram() {
        let metrics = Metrics::default();
        metrics.kernel[Counter::Fired as usize].store(42, Relaxed);
        metrics.kernel[Counter::RingBufferFull as usize].store(3, Relaxed);
        let stats = Arc::new(ExporterStats::new("pyroscope"));
        stats.observe_latency(0.02);
        stats.observe_latency(3.0);
        stats.dropped.store(2, Relaxed);
        metrics.register_exporter(stats);
        let grpc = Arc::new(ExporterStats::new("otlp"));
        grpc.keeps_connection.store(true, Relaxed);
        grpc.reconnects.store(1, Relaxed);
        metrics.register_exporter(grpc);
        let text = metrics.render();
        // Reconnects only of the exporter that keeps a connection.
        assert!(text.contains("\nprofiler_agent_export_reconnects_total{exporter=\"otlp\"} 1\n"));
        assert!(!text.contains("profiler_agent_export_reconnects_total{exporter=\"pyroscope\"}"));
        assert!(
            text.contains("\nprofiler_agent_kernel_samples_total 42\n"),
            "{text}"
        );
        assert!(text.contains("\nprofiler_agent_kernel_samples_dropped_total 3\n"));
        assert!(text.contains("profiler_agent_export_dropped_total{exporter=\"pyroscope\"} 2"));
        // Cumulative: 0.02 is in le=0.025 and above, 3.0 only in 10 and +Inf.
        assert!(text.contains("_bucket{exporter=\"pyroscope\",le=\"0.01\"} 0"));
        assert!(text.contains("_bucket{exporter=\"pyroscope\",le=\"0.025\"} 1"));
        assert!(text.contains("_bucket{exporter=\"pyroscope\",le=\"10\"} 2"));
        assert!(text.contains("_bucket{exporter=\"pyroscope\",le=\"+Inf\"} 2"));
        assert!(text.contains("profiler_agent_resident_memory_bytes "));
        // Every sample line belongs to a declared family.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                text.contains(&format!("# TYPE {family} "))
                    || text.contains(&format!("# TYPE {name} ")),
                "{line}"
            );
        }
    }
}

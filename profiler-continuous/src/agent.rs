//! The run loop of `profiler-agent run`: sample continuously, cut windows,
//! turn each window into one labelled pprof per service, hand them to the
//! exporters, serve pulls, and shut down cleanly on SIGTERM.
//!
//! Samples are moved out of the recorder (`take_window`) whenever anything
//! needs them — a window ends, a pull starts or ends — and merged into
//! every open accumulator (the export window and each pull), so a pull of
//! N seconds covers the next N seconds to within one poll (100 ms), not
//! the export window's boundaries.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profiler_common::Counter;
use profiler_export::directory::DirectoryExporter;
use profiler_export::otlp::OtlpExporter;
use profiler_export::pyroscope::PyroscopeExporter;
use profiler_export::server::{PullKind, PullRequest, Server};

use crate::heaps::GoHeaps;
use profiler_export::{Batch, ExporterHandle, Metrics, ServiceProfile};
use profiler_profile::{Profile, ProfileKind};
use profiler_sampling::record::{
    ProfileWindow, Recorder, Recording, Stacks, Window, build_profile_of,
};
use profiler_sampling::sampler::{KernelCounters, SamplingConfig, SamplingError};
use profiler_symbolize::process::ProcessTable;

use super::config::Config;
use super::kubernetes::{self, Watcher};
use super::metadata::MetadataCache;
use super::probes::ProbeHistograms;

const POLL: Duration = Duration::from_millis(100);
const METRICS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Listen(#[from] profiler_export::server::ListenError),
    #[error("starting the {name} exporter: {message}")]
    Exporter { name: &'static str, message: String },
    #[error("kubernetes metadata: {0}")]
    Kubernetes(#[from] kubernetes::WatcherError),
    #[error("[auth]: {0}")]
    Auth(#[from] profiler_export::access::AuthError),
}

/// What a run did, for the final log line.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunSummary {
    pub windows: u64,
    pub profiles: u64,
    /// Exporters that had not delivered everything when the grace period
    /// ended.
    pub exporters_unfinished: usize,
}

/// Counted stacks since `started`.
struct Accumulator {
    started: SystemTime,
    stacks: Stacks,
}

impl Accumulator {
    fn new() -> Self {
        Accumulator {
            started: SystemTime::now(),
            stacks: Stacks::default(),
        }
    }
}

struct Pull {
    deadline: Instant,
    /// The CPU profile's kind, or `Wall` (`/debug/pprof/wall`).
    kind: ProfileKind,
    pid: Option<u32>,
    service: Option<String>,
    accumulator: Accumulator,
    reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// Where symbols come from: the live recorder, or a recording finished
/// at shutdown or before a restart.
enum Symbols<'a> {
    Live(&'a mut Recorder),
    Finished(&'a mut Recording),
}

impl Symbols<'_> {
    fn poll(&mut self) {
        if let Symbols::Live(recorder) = self {
            recorder.poll(Duration::ZERO);
        }
    }

    fn profile(&mut self, window: &Window) -> Profile {
        match self {
            Symbols::Live(recorder) => recorder.profile_of(window, |_| true),
            Symbols::Finished(recording) => build_profile_of(
                window.stacks.iter(),
                &recording.processes,
                &mut recording.symbolizer,
                &mut recording.runtime_frames,
                &window.profile,
            ),
        }
    }
}

/// Live totals of one sampler, added to what earlier samplers counted.
#[derive(Default, Clone, Copy)]
struct Totals {
    kernel: KernelCounters,
    samples: u64,
    objects_failed: u64,
    user_unresolved: u64,
    kernel_unresolved: u64,
    tables_dropped: u64,
    queue_dropped: u64,
    user_stack_ends: profiler_sampling::record::UserStackEnds,
    off_cpu: profiler_sampling::record::OffCpuTotals,
}

impl Totals {
    fn of(recording: &Recording, kernel: KernelCounters) -> Totals {
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
        }
    }

    fn plus(self, other: Totals) -> Totals {
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
        }
    }
}

pub struct Agent {
    config: Config,
    sampling: SamplingConfig,
    node: String,
    metrics: Arc<Metrics>,
    recorder: Option<Recorder>,
    /// Pod metadata from the API server, when in a cluster.
    pods: Option<Watcher>,
    /// Histograms of the configured probes, for `/metrics`.
    probes: ProbeHistograms,
    /// The cgroup / namespace selection applied to samples.
    selection: super::metadata::Selection,
    /// Totals of samplers that were restarted.
    carried: Totals,
    meta: MetadataCache,
    window: Accumulator,
    window_deadline: Instant,
    pulls: Vec<Pull>,
    exporters: Vec<ExporterHandle>,
    server: Option<Server>,
    pull_requests: Receiver<PullRequest>,
    /// Go heap profiles, unless `go_heap = false`.
    heaps: Option<GoHeaps>,
    summary: RunSummary,
}

impl Agent {
    /// Starts the exporters, the sampler and the listener.
    pub fn start(config: Config, metrics: Arc<Metrics>) -> Result<Agent, RunError> {
        let exporters = start_exporters(&config, &metrics)?;
        let sampling = SamplingConfig {
            frequency_hz: config.frequency_hz,
            pids: config.pids.clone(),
            unwind_tables: !config.frame_pointers_only,
            unwind_table_bytes: config.unwind_table_mib << 20,
            off_cpu: config
                .records_off_cpu()
                .then_some(profiler_sampling::sampler::OffCpuConfig {
                    min: config.off_cpu_min,
                    period: config.off_cpu_period,
                    wall: false,
                }),
            // Checked when the config was read.
            runtimes: config.runtime_selection().unwrap_or_default(),
            go_labels: config.go_labels.config(),
        };
        let recorder = Recorder::start(&sampling)?;
        let (pull_tx, pull_requests) = std::sync::mpsc::channel();
        let server = match config.listen_addr() {
            Ok(Some(addr)) => {
                let auth = profiler_export::auth::Auth::new(&config.auth, &config.kubernetes)?;
                if !auth.enabled() && !addr.ip().is_loopback() {
                    tracing::warn!(
                        "the listener on {addr} has no authentication: any client that can reach \
                         it can pull profiles (set [auth], see docs/security.md)"
                    );
                }
                Some(Server::start(
                    addr,
                    metrics.clone(),
                    pull_tx,
                    config.max_pull_seconds,
                    std::sync::Arc::new(auth),
                )?)
            }
            _ => None,
        };
        // Alive from now on: /healthz must not fail before the run loop's
        // first turn.
        metrics.heartbeat_unix.store(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            Relaxed,
        );
        metrics.ready.store(true, Relaxed);
        let node = config.node_name();
        // Not fatal unless asked for explicitly (`enabled = "on"`): outside
        // a cluster this is None and labels come from /proc alone.
        let pods = kubernetes::start(&config.kubernetes, &node, Arc::new(AtomicBool::new(false)))?;
        let probes = ProbeHistograms::start(&config.probes);
        let selection = config.selection();
        metrics
            .probes_attached
            .store(probes.attached() as u64, Relaxed);
        metrics.probes_failed.store(probes.failed as u64, Relaxed);
        tracing::info!(
            node = %node,
            cpus = recorder.cpus().len(),
            frequency_hz = config.frequency_hz,
            window = %humantime::format_duration(config.window),
            scope = %scope_text(&config),
            exporters = %exporters.iter().map(|e| e.stats().name.clone()).collect::<Vec<_>>().join(","),
            listen = %server.as_ref().map_or("off".to_string(), |s| s.addr.to_string()),
            "profiling"
        );
        let heaps = config.go_heap.then(GoHeaps::default);
        Ok(Agent {
            window_deadline: Instant::now() + config.window,
            config,
            sampling,
            node,
            metrics,
            recorder: Some(recorder),
            meta: MetadataCache::new("/proc", pods.as_ref().map(|w| w.index.clone())),
            pods,
            probes,
            selection,
            carried: Totals::default(),
            window: Accumulator::new(),
            pulls: Vec::new(),
            exporters,
            server,
            pull_requests,
            heaps,
            summary: RunSummary::default(),
        })
    }

    /// The address the pull endpoints listen on, if any.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(|s| s.addr)
    }

    /// Runs until `stop` is set, then delivers the last window within the
    /// grace period.
    pub fn run(mut self, stop: &AtomicBool) -> Result<RunSummary, RunError> {
        let mut last_metrics = Instant::now() - METRICS_EVERY;
        while !stop.load(Relaxed) {
            let recorder = self.recorder.as_mut().expect("a recorder while running");
            recorder.poll(POLL);
            // A process's service, container and pod are read when its
            // first samples arrive, while it surely exists: one that exits
            // before its window ends is still named.
            for pid in recorder.take_new_pids() {
                self.meta.get(pid);
            }
            while let Ok(request) = self.pull_requests.try_recv() {
                self.start_pull(request);
            }
            let now = Instant::now();
            // The circuit breaker of the configured probes.
            self.probes.check(now);
            let pull_due = self.pulls.iter().any(|p| p.deadline <= now);
            if now >= self.window_deadline {
                self.end_window()?;
            } else if pull_due {
                self.flush();
                self.finish_due_pulls(now);
            }
            if last_metrics.elapsed() >= METRICS_EVERY {
                last_metrics = Instant::now();
                self.update_metrics();
            }
        }
        self.shutdown()
    }

    fn start_pull(&mut self, request: PullRequest) {
        if request.kind == PullKind::Heap {
            let answer = match &mut self.heaps {
                Some(heaps) => heaps
                    .now(request.pid, request.service.as_deref(), &mut self.meta)
                    .and_then(|mut profile| {
                        self.meta.label(&mut profile, &self.node);
                        profiler_profile::pprof::encode_gzip(&profile)
                            .map_err(|e| format!("encoding the profile: {e}"))
                    }),
                None => Err("Go heap profiles are off in this run (go_heap = false)".into()),
            };
            let _ = request.reply.send(answer);
            return;
        }
        let kind = match request.kind {
            PullKind::Wall if !self.config.wall => {
                let _ = request.reply.send(Err(
                    "wall-clock profiles are off in this run (wall = false)".into(),
                ));
                return;
            }
            PullKind::Wall => ProfileKind::Wall,
            _ => self.config.profile_kind(),
        };
        // Samples so far belong to the open windows, not to this pull.
        self.flush();
        self.pulls.push(Pull {
            deadline: Instant::now() + Duration::from_secs(request.seconds),
            kind,
            pid: request.pid,
            service: request.service,
            accumulator: Accumulator::new(),
            reply: request.reply,
        });
    }

    /// Moves the recorder's stacks into every open accumulator.
    fn flush(&mut self) {
        let Some(recorder) = self.recorder.as_mut() else {
            return;
        };
        let window = recorder.take_window();
        self.merge(window.stacks);
    }

    fn merge(&mut self, stacks: Stacks) {
        for (key, count) in stacks {
            if !self.meta.selected(key.pid, &self.selection) {
                self.metrics
                    .samples_unselected
                    .fetch_add(count.samples, Relaxed);
                continue;
            }
            for pull in &mut self.pulls {
                let wanted = pull.pid.is_none_or(|pid| pid == key.pid)
                    && pull
                        .service
                        .as_ref()
                        .is_none_or(|s| *s == self.meta.get(key.pid).service);
                if wanted {
                    *pull.accumulator.stacks.entry(key.clone()).or_default() += count;
                }
            }
            *self.window.stacks.entry(key).or_default() += count;
        }
    }

    fn finish_due_pulls(&mut self, now: Instant) {
        let (due, open): (Vec<Pull>, Vec<Pull>) = std::mem::take(&mut self.pulls)
            .into_iter()
            .partition(|p| p.deadline <= now);
        self.pulls = open;
        let Some(recorder) = self.recorder.as_mut() else {
            return;
        };
        let mut symbols = Symbols::Live(recorder);
        for pull in due {
            let bytes = pull_profile(
                &mut symbols,
                &mut self.meta,
                &self.node,
                pull.accumulator,
                self.config.frequency_hz,
                pull.kind,
            );
            let _ = pull.reply.send(bytes);
        }
    }

    /// Ends the export window: profiles per service to every exporter;
    /// restarts the sampler first when its caches outgrew their bounds.
    fn end_window(&mut self) -> Result<(), RunError> {
        self.flush();
        let recorder = self.recorder.as_ref().expect("a recorder while running");
        let processes: &ProcessTable = &recorder.recording().processes;
        let restart = processes.len() > self.config.max_processes
            || processes.object_count() > self.config.max_objects;
        if restart {
            tracing::info!(
                processes = processes.len(),
                objects = processes.object_count(),
                "restarting the sampler to bound memory (max_processes / max_objects)"
            );
            let mut recording = self.finish_recorder();
            self.merge(recording.take_stacks());
            self.export_window(&mut Symbols::Finished(&mut recording));
            self.finish_due_pulls_with(&mut Symbols::Finished(&mut recording), Instant::now());
            drop(recording);
            self.recorder = Some(Recorder::start(&self.sampling)?);
            self.metrics.sampler_restarts.fetch_add(1, Relaxed);
        } else {
            // Out of `self` while it symbolizes, so the method can borrow the rest.
            let mut recorder = self.recorder.take().expect("a recorder while running");
            // Objects whose debug files arrived since they were read are
            // read again: this window gets the names.
            recorder.refresh_fetched();
            self.export_window(&mut Symbols::Live(&mut recorder));
            self.recorder = Some(recorder);
            self.finish_due_pulls(Instant::now());
            // The window is exported: processes that exited are no longer
            // needed, nor objects only they mapped.
            let in_pulls = self.pids_in_open_pulls();
            let recorder = self.recorder.as_mut().expect("a recorder while running");
            let forgotten = recorder.evict_exited(|pid| in_pulls.contains(&pid));
            if forgotten > 0 {
                tracing::debug!(forgotten, "evicted exited processes from the sampler");
            }
        }
        self.window_deadline += self.config.window;
        // A long stall (a huge first symbolization) must not make windows
        // pile up back to back.
        if self.window_deadline < Instant::now() {
            self.window_deadline = Instant::now() + self.config.window;
        }
        let in_pulls = self.pids_in_open_pulls();
        let evicted = self.meta.evict_exited(|pid| in_pulls.contains(&pid));
        if evicted > 0 {
            tracing::debug!(evicted, "forgot exited processes");
        }
        if let Some(recorder) = &mut self.recorder {
            recorder.release_mapped_pages();
        }
        release_free_memory();
        Ok(())
    }

    /// Pulls still open hold stacks of their own: their processes stay
    /// known until those pulls are answered.
    fn pids_in_open_pulls(&self) -> std::collections::HashSet<u32> {
        self.pulls
            .iter()
            .flat_map(|p| p.accumulator.stacks.keys().map(|k| k.pid))
            .collect()
    }

    fn export_window(&mut self, symbols: &mut Symbols<'_>) {
        export_window(
            symbols,
            &mut self.meta,
            &mut self.window,
            &self.node,
            &self.config,
            &self.exporters,
            &self.metrics,
            &mut self.summary,
            &mut self.probes,
            self.heaps.as_mut(),
        );
    }

    fn finish_due_pulls_with(&mut self, symbols: &mut Symbols<'_>, now: Instant) {
        let (due, open): (Vec<Pull>, Vec<Pull>) = std::mem::take(&mut self.pulls)
            .into_iter()
            .partition(|p| p.deadline <= now);
        self.pulls = open;
        for pull in due {
            let bytes = pull_profile(
                symbols,
                &mut self.meta,
                &self.node,
                pull.accumulator,
                self.config.frequency_hz,
                pull.kind,
            );
            let _ = pull.reply.send(bytes);
        }
    }

    /// Stops the sampler (draining what is in flight) and carries its
    /// totals over.
    fn finish_recorder(&mut self) -> Recording {
        let recorder = self.recorder.take().expect("a recorder while running");
        let kernel = recorder.counters();
        let recording = recorder.finish();
        // finish() read the final counters itself.
        let kernel = if recording.counters == KernelCounters::default() {
            kernel
        } else {
            recording.counters
        };
        self.carried = self.carried.plus(Totals::of(&recording, kernel));
        recording
    }

    fn update_metrics(&self) {
        let m = &self.metrics;
        let live = match &self.recorder {
            Some(recorder) => Totals {
                // Set in the recording only when it finishes.
                tables_dropped: recorder.unwind_stats().map_or(0, |s| s.tables_dropped),
                queue_dropped: recorder.queue_dropped(),
                ..Totals::of(recorder.recording(), recorder.counters())
            },
            None => Totals::default(),
        };
        let t = self.carried.plus(live);
        for (counter, value) in t.kernel.iter() {
            m.kernel[counter as usize].store(value, Relaxed);
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
        if let Some(recorder) = &self.recorder {
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
        if self.probes.attached() > 0 {
            *m.probe_text.lock().unwrap_or_else(|e| e.into_inner()) = self.probes.render();
        }
        m.metadata_cache_entries
            .store(self.meta.len() as u64, Relaxed);
        if let Some(watcher) = &self.pods {
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

    /// SIGTERM: stop sampling, deliver the last (partial) window to every
    /// exporter within the grace period.
    fn shutdown(mut self) -> Result<RunSummary, RunError> {
        let deadline = Instant::now() + self.config.grace_period;
        self.metrics.shutting_down.store(true, Relaxed);
        tracing::info!(
            grace_period = %humantime::format_duration(self.config.grace_period),
            "stopping: delivering the last window"
        );
        let mut recording = self.finish_recorder();
        self.update_metrics();
        self.merge(recording.take_stacks());
        self.export_window(&mut Symbols::Finished(&mut recording));
        for pull in self.pulls.drain(..) {
            let _ = pull
                .reply
                .send(Err("the agent is shutting down".to_string()));
        }
        self.metrics.ready.store(false, Relaxed);
        for exporter in &self.exporters {
            exporter.close(deadline);
        }
        for exporter in std::mem::take(&mut self.exporters) {
            let name = exporter.stats().name.clone();
            if !exporter.wait(deadline) {
                tracing::warn!(exporter = %name, "grace period over before the last window was delivered");
                self.summary.exporters_unfinished += 1;
            }
        }
        self.server.take();
        self.probes.detach();
        if let Some(watcher) = &self.pods {
            watcher.stop();
        }
        Ok(self.summary)
    }
}

#[allow(clippy::too_many_arguments)]
fn export_window(
    symbols: &mut Symbols<'_>,
    meta: &mut MetadataCache,
    window: &mut Accumulator,
    node: &str,
    config: &Config,
    exporters: &[ExporterHandle],
    metrics: &Metrics,
    summary: &mut RunSummary,
    probes: &mut ProbeHistograms,
    heaps: Option<&mut GoHeaps>,
) {
    let build_started = Instant::now();
    let accumulator = std::mem::replace(window, Accumulator::new());
    let ended = SystemTime::now();
    let profile_window = ProfileWindow {
        started: accumulator.started,
        elapsed: ended
            .duration_since(accumulator.started)
            .unwrap_or_default(),
        frequency_hz: config.frequency_hz,
        kind: config.profile_kind(),
    };
    let sampled: std::collections::HashSet<u32> =
        accumulator.stacks.keys().map(|k| k.pid).collect();
    let mut groups: HashMap<String, Stacks> = HashMap::new();
    for (key, count) in accumulator.stacks {
        let service = meta.service(key.pid);
        groups.entry(service).or_default().insert(key, count);
    }
    let mut services: Vec<String> = groups.keys().cloned().collect();
    services.sort();
    let mut profiles = Vec::with_capacity(services.len());
    for service in services {
        let stacks = groups.remove(&service).unwrap_or_default();
        let pids: Vec<u32> = stacks.keys().map(|k| k.pid).collect();
        metrics
            .stacks_unwound
            .fetch_add(stacks.len() as u64, Relaxed);
        let labels = series_labels(meta, &service, &pids, node);
        // The wall-clock view of the same stacks, before the CPU profile
        // takes them.
        let wall = config.wall.then(|| {
            let stacks = crate::wall::stacks_for(
                ProfileKind::Wall,
                stacks.clone(),
                profile_window.elapsed,
                config.frequency_hz,
            );
            (profiler_export::WALL_PROFILE, stacks, ProfileKind::Wall)
        });
        let cpu = crate::wall::stacks_for(
            profile_window.kind,
            stacks,
            profile_window.elapsed,
            config.frequency_hz,
        );
        let views = std::iter::once((profiler_export::CPU_PROFILE, cpu, profile_window.kind));
        for (name, stacks, kind) in views.chain(wall) {
            // A service that only waited (off-CPU time recorded for the
            // wall-clock view alone) has no CPU profile.
            if stacks.is_empty() {
                continue;
            }
            let window = Window {
                stacks,
                profile: ProfileWindow {
                    kind,
                    ..profile_window
                },
            };
            let started = Instant::now();
            let mut profile = symbols.profile(&window);
            // Symbolizing a service seen for the first time can take a
            // while: keep draining the ring buffer between profiles so it
            // does not overflow meanwhile (those samples go to the next
            // window).
            symbols.poll();
            tracing::debug!(service = %service, profile = name, stacks = window.stacks.len(), elapsed_ms = started.elapsed().as_millis() as u64, "profile built");
            meta.label(&mut profile, node);
            let pprof = match profiler_profile::pprof::encode_gzip(&profile) {
                Ok(bytes) => bytes,
                Err(error) => {
                    tracing::warn!(service = %service, profile = name, "encoding a profile failed: {error}");
                    continue;
                }
            };
            profiles.push(ServiceProfile {
                name: name.into(),
                service: service.clone(),
                labels: labels.clone(),
                pprof: Arc::new(pprof),
                profile: Arc::new(profile),
            });
        }
    }
    profiles.extend(probe_profiles(probes, meta, node, &profile_window));
    if let Some(heaps) = heaps {
        profiles.extend(heap_profiles(heaps, &sampled, meta, node, &profile_window));
        metrics.go_heaps_read.store(heaps.read, Relaxed);
        metrics.go_heaps_failed.store(heaps.failed, Relaxed);
    }
    metrics.windows.fetch_add(1, Relaxed);
    metrics
        .window_build_micros
        .fetch_add(build_started.elapsed().as_micros() as u64, Relaxed);
    metrics
        .profiles_built
        .fetch_add(profiles.len() as u64, Relaxed);
    summary.windows += 1;
    summary.profiles += profiles.len() as u64;
    tracing::debug!(profiles = profiles.len(), "window done");
    let batch = Arc::new(Batch {
        started: accumulator.started,
        ended,
        profiles,
    });
    for exporter in exporters {
        exporter.push(batch.clone());
    }
}

/// A profile's series labels: service and node; the container (and its
/// pod) when the service is exactly one container, or the namespace when
/// its pods share one.
fn series_labels(
    meta: &mut MetadataCache,
    service: &str,
    pids: &[u32],
    node: &str,
) -> Vec<(String, String)> {
    let mut labels = vec![
        ("service_name".to_string(), service.to_string()),
        ("node".to_string(), node.to_string()),
    ];
    // A service that is exactly one container gets it (and its pod) as
    // series labels; one that spans pods of one namespace gets that.
    let containers: Vec<_> = pids
        .iter()
        .map(|&pid| meta.get(pid).container.clone())
        .collect();
    if let Some(Some(first)) = containers.first()
        && containers.iter().all(|c| c.as_ref() == Some(first))
    {
        labels.push(("container_id".into(), first.id.clone()));
        if let Some(uid) = &first.pod_uid {
            labels.push(("pod_uid".into(), uid.clone()));
        }
        if let Some(pod) = meta.pod(pids[0]) {
            labels.push(("namespace".into(), pod.namespace));
            labels.push(("pod".into(), pod.pod));
            if !pod.container.is_empty() {
                labels.push(("container".into(), pod.container));
            }
        }
    } else {
        let namespaces: Vec<Option<String>> = pids
            .iter()
            .map(|&pid| meta.pod(pid).map(|p| p.namespace))
            .collect();
        if let Some(Some(first)) = namespaces.first()
            && namespaces.iter().all(|n| n.as_ref() == Some(first))
        {
            labels.push(("namespace".into(), first.clone()));
        }
    }
    labels
}

/// Each probe with `stacks`: its operations of the window by start stack,
/// one profile per service (`probe_<name>`, labelled `probe=<name>`).
fn probe_profiles(
    probes: &mut ProbeHistograms,
    meta: &mut MetadataCache,
    node: &str,
    window: &ProfileWindow,
) -> Vec<ServiceProfile> {
    let window = ProfileWindow {
        frequency_hz: 1,
        kind: ProfileKind::Latency,
        ..*window
    };
    let mut profiles = Vec::new();
    for (index, probe, stacks) in probes.take_stack_windows() {
        let mut groups: HashMap<String, Stacks> = HashMap::new();
        for (key, count) in stacks {
            groups
                .entry(meta.service(key.pid))
                .or_default()
                .insert(key, count);
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for (service, stacks) in groups {
            let Some(mut profile) = probes.build_stack_profile(index, &stacks, &window) else {
                continue;
            };
            meta.label(&mut profile, node);
            let pprof = match profiler_profile::pprof::encode_gzip(&profile) {
                Ok(bytes) => bytes,
                Err(error) => {
                    tracing::warn!(probe = %probe, service = %service, "encoding a profile failed: {error}");
                    continue;
                }
            };
            let pids: Vec<u32> = stacks.keys().map(|k| k.pid).collect();
            let mut labels = series_labels(meta, &service, &pids, node);
            labels.push(("probe".into(), probe.clone()));
            profiles.push(ServiceProfile {
                name: profiler_export::probe_profile_name(&probe),
                service,
                labels,
                pprof: Arc::new(pprof),
                profile: Arc::new(profile),
            });
        }
    }
    probes.end_stack_window();
    profiles
}

/// Each Go service's heap over the window (`memory`).
fn heap_profiles(
    heaps: &mut GoHeaps,
    sampled: &std::collections::HashSet<u32>,
    meta: &mut MetadataCache,
    node: &str,
    window: &ProfileWindow,
) -> Vec<ServiceProfile> {
    let mut profiles = Vec::new();
    for mut heap in heaps.window(sampled, meta, window.started, window.elapsed) {
        meta.label(&mut heap.profile, node);
        let pprof = match profiler_profile::pprof::encode_gzip(&heap.profile) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(service = %heap.service, "encoding a heap profile failed: {error}");
                continue;
            }
        };
        let labels = series_labels(meta, &heap.service, &heap.pids, node);
        profiles.push(ServiceProfile {
            name: profiler_export::MEMORY_PROFILE.into(),
            service: heap.service,
            labels,
            pprof: Arc::new(pprof),
            profile: Arc::new(heap.profile),
        });
    }
    profiles
}

/// What the run profiles, for the start line.
fn scope_text(config: &Config) -> String {
    let mut parts = Vec::new();
    if !config.pids.is_empty() {
        parts.push(format!("pids {:?}", config.pids));
    }
    if !config.cgroups.is_empty() {
        parts.push(format!("cgroups {:?}", config.cgroups));
    }
    if !config.namespaces.is_empty() {
        parts.push(format!("namespaces {:?}", config.namespaces));
    }
    if parts.is_empty() {
        "node".into()
    } else {
        parts.join(", ")
    }
}

/// Hands freed heap pages back to the kernel. A window's symbolization
/// and encoding leave megabytes of freed but still resident memory (file
/// reads, inflated debug sections, protobuf buffers) that glibc keeps for
/// reuse; trimming once per window keeps the steady-state RSS at what is
/// live. Costs well under a millisecond.
fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// One pull's profile, every service together (filters applied on merge).
fn pull_profile(
    symbols: &mut Symbols<'_>,
    meta: &mut MetadataCache,
    node: &str,
    accumulator: Accumulator,
    frequency_hz: u64,
    kind: ProfileKind,
) -> Result<Vec<u8>, String> {
    let elapsed = SystemTime::now()
        .duration_since(accumulator.started)
        .unwrap_or_default();
    let window = Window {
        profile: ProfileWindow {
            started: accumulator.started,
            elapsed,
            frequency_hz,
            kind,
        },
        stacks: crate::wall::stacks_for(kind, accumulator.stacks, elapsed, frequency_hz),
    };
    let mut profile = symbols.profile(&window);
    meta.label(&mut profile, node);
    profiler_profile::pprof::encode_gzip(&profile).map_err(|e| format!("encoding the profile: {e}"))
}

fn start_exporters(config: &Config, metrics: &Metrics) -> Result<Vec<ExporterHandle>, RunError> {
    let mut exporters = Vec::new();
    let spawn_error = |name: &'static str| {
        move |e: std::io::Error| RunError::Exporter {
            name,
            message: e.to_string(),
        }
    };
    let d = &config.directory;
    if !d.path.as_os_str().is_empty() {
        let exporter = DirectoryExporter::new(&d.path, d.max_files, d.max_bytes)
            .map_err(spawn_error("directory"))?;
        // A local disk either works or needs a human: one attempt.
        exporters.push(
            ExporterHandle::spawn(exporter, d.queue_size, 1, metrics)
                .map_err(spawn_error("directory"))?,
        );
    }
    let p = &config.pyroscope;
    if !p.url.is_empty() {
        let exporter = PyroscopeExporter::new(p).map_err(|e| RunError::Exporter {
            name: "pyroscope",
            message: e.to_string(),
        })?;
        exporters.push(
            ExporterHandle::spawn(exporter, p.queue_size, p.max_attempts, metrics)
                .map_err(spawn_error("pyroscope"))?,
        );
    }
    let o = &config.otlp;
    if !o.url.is_empty() {
        let exporter = OtlpExporter::new(o).map_err(|e| RunError::Exporter {
            name: "otlp",
            message: e.to_string(),
        })?;
        exporters.push(
            ExporterHandle::spawn(exporter, o.queue_size, o.max_attempts, metrics)
                .map_err(spawn_error("otlp"))?,
        );
    }
    Ok(exporters)
}

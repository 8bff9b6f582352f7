//! The run loop of `profiler-agent run`: sample continuously, cut windows,
//! turn each window into one labelled pprof per service, hand them to the
//! exporters, serve pulls, and shut down cleanly on SIGTERM.
//!
//! Samples are moved out of the recorder (`take_window`) whenever anything
//! needs them — a window ends, a pull starts or ends — and merged into
//! every open accumulator (the export window and each pull), so a pull of
//! N seconds covers the next N seconds to within one poll (100 ms), not
//! the export window's boundaries.

mod health;
mod outcome;
mod pulls;
mod stacks;
mod window;

use health::Totals;
pub use outcome::{RunError, RunSummary};
use pulls::{Pull, pull_profile};
use stacks::{Accumulator, Symbols};
use window::{export_window, start_exporters};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profiler_export::server::{PullKind, PullRequest, Server};

use crate::heaps::GoHeaps;
use profiler_export::{ExporterHandle, Metrics};
use profiler_profile::ProfileKind;
use profiler_sampling::record::{Recorder, Recording, Stacks};
use profiler_sampling::sampler::{KernelCounters, SamplingConfig};
use profiler_symbolize::process::ProcessTable;

use super::config::Config;
use super::kubernetes::{self, Watcher};
use super::metadata::MetadataCache;
use super::probes::ProbeHistograms;

const POLL: Duration = Duration::from_millis(100);
const METRICS_EVERY: Duration = Duration::from_secs(1);

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
        profiler_runtimes::cache::set_budget(config.runtime_cache_mib << 20);
        let sampling = SamplingConfig {
            frequency_hz: config.frequency_hz,
            cpu_clock: true,
            page_faults: config.page_faults.then_some(config.page_fault_period),
            pids: config.pids.clone(),
            unwind_tables: !config.frame_pointers_only,
            unwind_table_bytes: config.unwind_table_mib << 20,
            off_cpu: config
                .records_off_cpu()
                .then_some(profiler_sampling::sampler::OffCpuConfig {
                    min: config.off_cpu_min,
                    period: config.off_cpu_period(),
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

    /// The pulls whose time is up, out of the open ones.
    fn take_due_pulls(&mut self, now: Instant) -> Vec<Pull> {
        let (due, open): (Vec<Pull>, Vec<Pull>) = std::mem::take(&mut self.pulls)
            .into_iter()
            .partition(|p| p.deadline <= now);
        self.pulls = open;
        due
    }

    fn finish_due_pulls(&mut self, now: Instant) {
        let due = self.take_due_pulls(now);
        let Some(recorder) = self.recorder.as_mut() else {
            return;
        };
        let mut symbols = Symbols::Live(recorder);
        answer_pulls(
            due,
            &mut symbols,
            &mut self.meta,
            &self.node,
            self.config.frequency_hz,
        );
    }

    fn finish_due_pulls_with(&mut self, symbols: &mut Symbols<'_>, now: Instant) {
        let due = self.take_due_pulls(now);
        answer_pulls(
            due,
            symbols,
            &mut self.meta,
            &self.node,
            self.config.frequency_hz,
        );
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
        let live = match &self.recorder {
            Some(recorder) => Totals {
                // Set in the recording only when it finishes.
                tables_dropped: recorder.unwind_stats().map_or(0, |s| s.tables_dropped),
                queue_dropped: recorder.queue_dropped(),
                runtime: health::slots(&recorder.runtime_counters()),
                ..Totals::of(recorder.recording(), recorder.counters())
            },
            None => Totals::default(),
        };
        health::update(
            &self.metrics,
            &self.carried.plus(live),
            self.recorder.as_ref(),
            &self.meta,
            &self.probes,
            self.pods.as_ref(),
        );
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

/// Builds each pull's profile and sends it to the client waiting for it.
fn answer_pulls(
    due: Vec<Pull>,
    symbols: &mut Symbols<'_>,
    meta: &mut MetadataCache,
    node: &str,
    frequency_hz: u64,
) {
    for pull in due {
        let bytes = pull_profile(
            symbols,
            meta,
            node,
            pull.accumulator,
            frequency_hz,
            pull.kind,
        );
        let _ = pull.reply.send(bytes);
    }
}

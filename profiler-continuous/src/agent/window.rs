//! The export window: its stacks become one labelled profile per service
//! (CPU, wall, probes' stacks, Go heaps), handed to every exporter.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Instant, SystemTime};

use profiler_export::directory::DirectoryExporter;
use profiler_export::otlp::OtlpExporter;
use profiler_export::pyroscope::PyroscopeExporter;
use profiler_export::{Batch, ExporterHandle, Metrics, ServiceProfile};
use profiler_profile::ProfileKind;
use profiler_sampling::record::{ProfileWindow, Stacks, Window};

use super::outcome::{RunError, RunSummary};
use super::stacks::{Accumulator, Symbols};
use crate::config::Config;
use crate::heaps::GoHeaps;
use crate::metadata::MetadataCache;
use crate::probes::ProbeHistograms;

#[allow(clippy::too_many_arguments)]
pub(super) fn export_window(
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
        page_fault_period: config.page_fault_period,
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
        // Where memory was first touched (`page_faults`), before the CPU
        // profile takes the stacks.
        let page_faults = config.page_faults.then(|| {
            let stacks = crate::wall::stacks_for(
                ProfileKind::PageFaults,
                stacks.clone(),
                profile_window.elapsed,
                config.frequency_hz,
            );
            (
                profiler_export::PAGE_FAULTS_PROFILE,
                stacks,
                ProfileKind::PageFaults,
            )
        });
        let cpu = crate::wall::stacks_for(
            profile_window.kind,
            stacks,
            profile_window.elapsed,
            config.frequency_hz,
        );
        let views = std::iter::once((profiler_export::CPU_PROFILE, cpu, profile_window.kind));
        for (name, stacks, kind) in views.chain(wall).chain(page_faults) {
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
        page_fault_period: 0,
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

pub(super) fn start_exporters(
    config: &Config,
    metrics: &Metrics,
) -> Result<Vec<ExporterHandle>, RunError> {
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

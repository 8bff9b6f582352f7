//! Go heap profiles in a continuous run: each window, every Go process
//! the run has seen is read (its runtime's own allocation records, see
//! `profiler_runtimes::go::state::heap`), and each service gets a
//! `memory` profile: what was allocated during the window, and what is in
//! use at its end. Pulls of `/debug/pprof/heap` get the heap as the
//! program's own endpoint gives it (allocations since it started).
//!
//! A process is opened once (its binary's pclntab and runtime variables)
//! and remembered until it exits; one that is not Go, or whose heap
//! cannot be read (memory profiling linked out), is remembered as such
//! and not tried again.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use profiler_profile::Profile;
use profiler_runtimes::go::state::heap::{HeapHistory, HeapProfileBuilder};
use profiler_runtimes::go::state::{GoTarget, StateError};

use crate::metadata::MetadataCache;

/// What the run knows of a process.
enum Known {
    Go {
        target: Box<GoTarget>,
        history: HeapHistory,
    },
    /// Not Go, or no heap to read: not tried again.
    Without,
}

/// The Go processes of a run and their heaps' last looks.
#[derive(Default)]
pub struct GoHeaps {
    processes: HashMap<u32, Known>,
    /// Heaps read and failed, for the run's metrics.
    pub read: u64,
    pub failed: u64,
}

/// One service's heap over a window.
pub struct ServiceHeap {
    pub service: String,
    pub pids: Vec<u32>,
    pub profile: Profile,
}

impl GoHeaps {
    /// The services' heap profiles of the window that started at
    /// `started`: the processes in `pids` (those sampled in it) and every
    /// Go process seen before that still runs.
    pub fn window(
        &mut self,
        pids: &HashSet<u32>,
        meta: &mut MetadataCache,
        started: SystemTime,
        elapsed: Duration,
    ) -> Vec<ServiceHeap> {
        self.forget_exited();
        for &pid in pids {
            self.processes.entry(pid).or_insert_with(|| open(pid));
        }
        let mut by_service: HashMap<String, (Vec<u32>, HeapProfileBuilder)> = HashMap::new();
        let start_ns = started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let Some(Known::Go { target, history }) = self.processes.get_mut(&pid) else {
                continue;
            };
            let snapshot = match target.heap() {
                Ok(snapshot) => snapshot,
                Err(error) => {
                    self.failed += 1;
                    tracing::debug!(pid, "no heap profile this window: {error}");
                    if !matches!(error, StateError::Read { .. }) {
                        self.processes.insert(pid, Known::Without);
                    }
                    continue;
                }
            };
            self.read += 1;
            let counts = history.advance(&snapshot);
            let service = meta.service(pid);
            let (service_pids, builder) = by_service.entry(service).or_insert_with(|| {
                (
                    Vec::new(),
                    HeapProfileBuilder::new(start_ns, elapsed.as_nanos() as i64, snapshot.rate),
                )
            });
            service_pids.push(pid);
            for (record, counts) in snapshot.records.iter().zip(counts) {
                builder.add(target, snapshot.rate, record, counts);
            }
        }
        let mut heaps: Vec<ServiceHeap> = by_service
            .into_iter()
            .map(|(service, (pids, builder))| ServiceHeap {
                service,
                pids,
                profile: builder.finish(),
            })
            .collect();
        heaps.sort_by(|a, b| a.service.cmp(&b.service));
        heaps
    }

    /// A pull: the heaps of the Go processes matching `pid` and
    /// `service` now, allocations since each started.
    pub fn now(
        &mut self,
        pid: Option<u32>,
        service: Option<&str>,
        meta: &mut MetadataCache,
    ) -> Result<Profile, String> {
        if let Some(pid) = pid {
            self.processes.entry(pid).or_insert_with(|| open(pid));
        }
        let start_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let mut builder: Option<HeapProfileBuilder> = None;
        let mut errors = Vec::new();
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for candidate in pids {
            if pid.is_some_and(|p| p != candidate)
                || service.is_some_and(|s| meta.service(candidate) != s)
            {
                continue;
            }
            let Some(Known::Go { target, .. }) = self.processes.get(&candidate) else {
                continue;
            };
            match target.heap() {
                Ok(snapshot) => {
                    let builder = builder
                        .get_or_insert_with(|| HeapProfileBuilder::new(start_ns, 0, snapshot.rate));
                    for record in &snapshot.records {
                        builder.add(target, snapshot.rate, record, record.counts());
                    }
                }
                Err(error) => errors.push(error.to_string()),
            }
        }
        match builder {
            Some(builder) => Ok(builder.finish()),
            None if !errors.is_empty() => Err(errors.join("; ")),
            None => Err(match (pid, service) {
                (Some(pid), _) => format!(
                    "process {pid} has no Go heap to read (not Go, not running, or memory \
                     profiling linked out)"
                ),
                (None, Some(service)) => format!(
                    "no Go process of service {service:?} has been seen with a heap to read"
                ),
                (None, None) => "no Go process with a heap to read has been seen".into(),
            }),
        }
    }

    /// Forgets processes that exited.
    fn forget_exited(&mut self) {
        self.processes
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}

/// A process as first seen: Go with a heap, or not.
fn open(pid: u32) -> Known {
    match GoTarget::open(pid) {
        Ok(target) => Known::Go {
            target: Box::new(target),
            history: HeapHistory::default(),
        },
        Err(StateError::NotGo { .. }) => Known::Without,
        Err(error) => {
            tracing::info!(pid, "no Go heap profiles for this process: {error}");
            Known::Without
        }
    }
}

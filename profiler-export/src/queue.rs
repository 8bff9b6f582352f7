//! One thread and one bounded queue per exporter, so a backend that is down
//! or slow costs memory bounded by the queue, never a stalled sampler.
//!
//! A full queue drops its oldest window (the newest data is the most
//! useful); a failed delivery is retried with exponential backoff and
//! jitter up to the exporter's attempt limit; a state change (failing,
//! delivering again) is logged once, everything else is counted in
//! `/metrics`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::{Batch, ExportError, ExporterStats, Metrics};

/// A destination for windows. Runs on its exporter's own thread.
pub trait Exporter: Send + 'static {
    fn name(&self) -> &str;
    fn export(&mut self, batch: &Batch) -> Result<(), ExportError>;

    /// For an exporter that keeps a connection across windows: the
    /// connections it opened after its first (`/metrics`). None for the
    /// others.
    fn reconnects(&self) -> Option<u64> {
        None
    }
}

const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

struct State {
    queue: VecDeque<Arc<Batch>>,
    /// Set by `close`: deliver what is queued until then, then stop.
    deadline: Option<Instant>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    capacity: usize,
    max_attempts: u32,
    stats: Arc<ExporterStats>,
}

/// The run loop's end of an exporter.
pub struct ExporterHandle {
    shared: Arc<Shared>,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ExporterHandle {
    /// Starts `exporter` on its own thread behind a queue of `capacity`
    /// windows; each window gets `max_attempts` tries.
    pub fn spawn(
        exporter: impl Exporter,
        capacity: usize,
        max_attempts: u32,
        metrics: &Metrics,
    ) -> std::io::Result<ExporterHandle> {
        let stats = Arc::new(ExporterStats::new(exporter.name()));
        stats
            .keeps_connection
            .store(exporter.reconnects().is_some(), Relaxed);
        metrics.register_exporter(stats.clone());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                deadline: None,
            }),
            wake: Condvar::new(),
            capacity: capacity.max(1),
            max_attempts: max_attempts.max(1),
            stats,
        });
        let (done_tx, done) = std::sync::mpsc::channel();
        let worker = shared.clone();
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let thread = std::thread::Builder::new()
            .name(format!("export-{}", exporter.name()))
            .spawn(move || {
                let _log = tracing::dispatcher::set_default(&dispatch);
                work(exporter, &worker);
                let _ = done_tx.send(());
            })?;
        Ok(ExporterHandle {
            shared,
            done,
            thread: Some(thread),
        })
    }

    pub fn stats(&self) -> &ExporterStats {
        &self.shared.stats
    }

    /// Queues a window; never blocks on the backend.
    pub fn push(&self, batch: Arc<Batch>) {
        let mut state = self.shared.state.lock().unwrap();
        if state.queue.len() >= self.shared.capacity {
            state.queue.pop_front();
            self.shared.stats.dropped.fetch_add(1, Relaxed);
        }
        state.queue.push_back(batch);
        self.shared
            .stats
            .queued
            .store(state.queue.len() as u64, Relaxed);
        self.shared.wake.notify_one();
    }

    /// Asks the exporter to deliver what is queued by `deadline` and stop.
    pub fn close(&self, deadline: Instant) {
        self.shared.state.lock().unwrap().deadline = Some(deadline);
        self.shared.wake.notify_one();
    }

    /// Waits for the thread until `deadline`; true if it finished. A
    /// request stuck past the deadline is abandoned (the process exits).
    pub fn wait(mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        let finished = self.done.recv_timeout(left).is_ok();
        if finished && let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        finished
    }
}

fn work(mut exporter: impl Exporter, shared: &Shared) {
    let stats = &shared.stats;
    let mut failing_since: Option<u64> = None;
    let mut consecutive_failures: u32 = 0;
    loop {
        // Next window, or the end.
        let (batch, deadline) = {
            let mut state = shared.state.lock().unwrap();
            loop {
                if let Some(batch) = state.queue.pop_front() {
                    stats.queued.store(state.queue.len() as u64, Relaxed);
                    break (batch, state.deadline);
                }
                if state.deadline.is_some() {
                    return;
                }
                state = shared.wake.wait(state).unwrap();
            }
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let result = exporter.export(&batch);
            stats.observe_latency(started.elapsed().as_secs_f64());
            if let Some(reconnects) = exporter.reconnects() {
                stats.reconnects.store(reconnects, Relaxed);
            }
            match result {
                Ok(()) => {
                    stats.successes.fetch_add(1, Relaxed);
                    stats.up.store(true, Relaxed);
                    if let Some(failures) = failing_since.take() {
                        tracing::info!(
                            exporter = exporter.name(),
                            "delivering again after {failures} failed attempts"
                        );
                    }
                    consecutive_failures = 0;
                    break;
                }
                Err(error) => {
                    stats.failures.fetch_add(1, Relaxed);
                    stats.up.store(false, Relaxed);
                    consecutive_failures += 1;
                    match &mut failing_since {
                        Some(count) => *count += 1,
                        None => {
                            failing_since = Some(1);
                            tracing::warn!(
                                exporter = exporter.name(),
                                "export failed: {error}; retrying with backoff (further failures \
                                 are counted in /metrics, profiler_agent_export_failures_total)"
                            );
                        }
                    }
                    let give_up = attempt >= shared.max_attempts;
                    let wait = backoff(consecutive_failures);
                    let closing_deadline = shared.state.lock().unwrap().deadline.or(deadline);
                    let past_deadline =
                        closing_deadline.is_some_and(|d| Instant::now() + wait >= d);
                    if give_up || past_deadline {
                        stats.dropped.fetch_add(1, Relaxed);
                        tracing::debug!(exporter = exporter.name(), "dropping a window: {error}");
                        break;
                    }
                    sleep_unless_closed(shared, wait);
                }
            }
        }
    }
}

/// Sleeps `wait`, waking early when `close` is called (the deadline check
/// after it decides whether to go on retrying).
fn sleep_unless_closed(shared: &Shared, wait: Duration) {
    let end = Instant::now() + wait;
    let mut state = shared.state.lock().unwrap();
    while state.deadline.is_none() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        state = shared.wake.wait_timeout(state, left).unwrap().0;
    }
}

/// Exponential backoff with jitter: base × 2^(failures-1), capped, then a
/// random point in its upper half, so agents on many nodes that lost the
/// same backend do not retry in lockstep.
pub fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    let full = BACKOFF_BASE.saturating_mul(1 << exponent).min(BACKOFF_MAX);
    let half = full / 2;
    half + half.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::time::SystemTime;

    use super::*;

    struct Flaky {
        up: Arc<AtomicBool>,
        delivered: Arc<AtomicUsize>,
        delay: Duration,
    }

    impl Exporter for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn export(&mut self, _: &Batch) -> Result<(), ExportError> {
            std::thread::sleep(self.delay);
            if self.up.load(Relaxed) {
                self.delivered.fetch_add(1, Relaxed);
                Ok(())
            } else {
                Err(ExportError::Http {
                    url: "test".into(),
                    message: "down".into(),
                })
            }
        }
    }

    fn batch() -> Arc<Batch> {
        Arc::new(Batch {
            started: SystemTime::now(),
            ended: SystemTime::now(),
            profiles: Vec::new(),
        })
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        for failures in 1..20 {
            let d = backoff(failures);
            let full = BACKOFF_BASE
                .saturating_mul(1 << (failures - 1).min(16))
                .min(BACKOFF_MAX);
            assert!(d >= full / 2 && d <= full, "{failures}: {d:?}");
        }
    }

    #[test]
    fn a_slow_backend_never_blocks_push_and_the_oldest_is_dropped() {
        let metrics = Metrics::default();
        let up = Arc::new(AtomicBool::new(true));
        let delivered = Arc::new(AtomicUsize::new(0));
        let handle = ExporterHandle::spawn(
            Flaky {
                up: up.clone(),
                delivered: delivered.clone(),
                delay: Duration::from_millis(200),
            },
            2,
            3,
            &metrics,
        )
        .unwrap();
        let started = Instant::now();
        for _ in 0..10 {
            handle.push(batch());
        }
        assert!(started.elapsed() < Duration::from_millis(100));
        // One in flight, two queued, seven dropped.
        let dropped = handle.stats().dropped.load(Relaxed);
        assert!((7..=8).contains(&dropped), "{dropped}");
        handle.close(Instant::now() + Duration::from_secs(5));
        assert!(handle.wait(Instant::now() + Duration::from_secs(5)));
        assert_eq!(delivered.load(Relaxed) as u64 + dropped, 10);
    }

    #[test]
    fn a_down_backend_is_retried_then_recovers() {
        let metrics = Metrics::default();
        let up = Arc::new(AtomicBool::new(false));
        let delivered = Arc::new(AtomicUsize::new(0));
        let handle = ExporterHandle::spawn(
            Flaky {
                up: up.clone(),
                delivered: delivered.clone(),
                delay: Duration::ZERO,
            },
            4,
            2,
            &metrics,
        )
        .unwrap();
        handle.push(batch());
        // Two attempts 0.25-0.5 s apart, then dropped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while handle.stats().dropped.load(Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(handle.stats().dropped.load(Relaxed), 1);
        assert_eq!(handle.stats().failures.load(Relaxed), 2);
        up.store(true, Relaxed);
        handle.push(batch());
        handle.close(Instant::now() + Duration::from_secs(10));
        assert!(handle.wait(Instant::now() + Duration::from_secs(10)));
        assert_eq!(delivered.load(Relaxed), 1);
        assert!(
            metrics
                .render()
                .contains("profiler_agent_export_success_total{exporter=\"flaky\"} 1")
        );
    }
}

//! The circuit breaker of attached probes: a probe on a hot function
//! costs its process a trap into the kernel per hit (about 1–2 µs here,
//! measured with `tests/fixtures/usdt/storm.c`: 200 million operations a
//! second unattached, about one million attached), so tracing too much can
//! take the traced service down. Every attached probe has a budget of hits
//! per second on any one CPU; above it the probe is detached (the kernel
//! lowers its USDT semaphores) and the caller says so with the measured
//! rate.
//!
//! The default, 5,000 hits a second per CPU, keeps a probe at about 0.5–1%
//! of a CPU at the measured 1–2 µs per hit.

use std::time::{Duration, Instant};

/// Hits per second on one CPU a probe may cost by default.
pub const DEFAULT_BUDGET: u64 = 5_000;

/// Rates are taken over at least this long, so a short burst (a batch of
/// operations, a cache warming) does not trip the breaker.
pub const WINDOW: Duration = Duration::from_millis(200);

/// The hot CPU when the breaker tripped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trip {
    pub cpu: usize,
    /// Hits per second on that CPU over the last window.
    pub rate: f64,
    pub budget: u64,
}

impl std::fmt::Display for Trip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} hits/s on CPU {}, over the budget of {} hits/s per CPU (each hit traps \
             into the kernel, about 1-2 us: at this rate the probe costs that CPU about {:.0}%)",
            self.rate,
            self.cpu,
            self.budget,
            (self.rate * 1.5e-6 * 100.0).min(100.0)
        )
    }
}

/// Watches one probe's per-CPU hit counts.
#[derive(Debug, Clone)]
pub struct Breaker {
    budget: u64,
    /// When the current window began, and the counts then.
    base: Option<(Instant, Vec<u64>)>,
}

impl Breaker {
    /// A breaker for `budget` hits per second per CPU; 0 never trips.
    pub fn new(budget: u64) -> Breaker {
        Breaker { budget, base: None }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Feeds the per-CPU hit totals (they only grow) read at `now`. Trips
    /// when, over a window of at least `WINDOW`, one CPU's rate was above
    /// the budget.
    pub fn check(&mut self, now: Instant, hits: &[u64]) -> Option<Trip> {
        if self.budget == 0 {
            return None;
        }
        let Some((at, base)) = &self.base else {
            self.base = Some((now, hits.to_vec()));
            return None;
        };
        let elapsed = now.saturating_duration_since(*at);
        if elapsed < WINDOW {
            return None;
        }
        let worst = hits
            .iter()
            .enumerate()
            .map(|(cpu, &h)| (cpu, h.saturating_sub(base.get(cpu).copied().unwrap_or(0))))
            .max_by_key(|&(_, n)| n);
        self.base = Some((now, hits.to_vec()));
        let (cpu, count) = worst?;
        let rate = count as f64 / elapsed.as_secs_f64();
        (rate > self.budget as f64).then_some(Trip {
            cpu,
            rate,
            budget: self.budget,
        })
    }

    /// Starts over (after re-attaching).
    pub fn reset(&mut self) {
        self.base = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_on_one_hot_cpu_over_a_window_not_on_a_short_burst() {
        let t0 = Instant::now();
        let mut breaker = Breaker::new(1000);
        assert_eq!(breaker.check(t0, &[0, 0]), None);
        // 150 hits in 50 ms is 3000/s, but the window is not over yet.
        assert_eq!(
            breaker.check(t0 + Duration::from_millis(50), &[150, 0]),
            None
        );
        // Over 250 ms: CPU 0 did 150 (600/s), CPU 1 did 100 (400/s).
        assert_eq!(
            breaker.check(t0 + Duration::from_millis(250), &[150, 100]),
            None
        );
        // The next 250 ms: CPU 1 did 400 (1600/s).
        let trip = breaker
            .check(t0 + Duration::from_millis(500), &[160, 500])
            .expect("CPU 1 over budget");
        assert_eq!(trip.cpu, 1);
        assert!((trip.rate - 1600.0).abs() < 1.0, "{trip:?}");
        assert!(trip.to_string().contains("1600 hits/s on CPU 1"), "{trip}");
    }

    #[test]
    fn a_zero_budget_never_trips() {
        let t0 = Instant::now();
        let mut breaker = Breaker::new(0);
        assert_eq!(breaker.check(t0, &[0]), None);
        assert_eq!(
            breaker.check(t0 + Duration::from_secs(1), &[u64::MAX]),
            None
        );
    }
}

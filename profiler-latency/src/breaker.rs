//! The circuit breaker of attached probes: a probe on a hot function
//! costs its process a trap into the kernel per hit (about 1–2 µs here,
//! measured with `tests/fixtures/usdt/storm.c`: 200 million operations a
//! second unattached, about one million attached), so tracing too much can
//! take the traced service down. Every attached probe has a budget of hits
//! per second on any one CPU; above it the probe is detached (the kernel
//! lowers its USDT semaphores) and the caller says so with the measured
//! rate.
//!
//! The default, 5,000 hits a second per CPU, keeps a probe at about 1% of
//! a CPU at `REFERENCE_COST_NS` per hit. What a hit costs is measured while
//! the probes run (the trap, plus the BPF program's own time from the
//! kernel's run-time statistics): a probe whose program does more (a stack
//! walk per hit with `--stacks`) trips at proportionally fewer hits, so
//! the budget is one of CPU time, expressed in reference hits.

use std::time::{Duration, Instant};

/// Hits per second on one CPU a probe may cost by default.
pub const DEFAULT_BUDGET: u64 = 5_000;

/// What one hit is taken to cost when the budget is set: the trap into
/// the kernel and a small program (about 1-2 µs measured here).
pub const REFERENCE_COST_NS: f64 = 2_000.0;

/// The trap alone, added to the program's measured time.
pub const TRAP_NS: f64 = 1_000.0;

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
    /// Estimated nanoseconds of CPU per hit.
    pub cost_ns: f64,
}

impl std::fmt::Display for Trip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} hits/s on CPU {} at about {:.1} us each (the trap into the kernel and the BPF \
             program), {:.2}% of that CPU: over the budget of {} hits/s per CPU at {:.0} us each \
             ({:.2}%)",
            self.rate,
            self.cpu,
            self.cost_ns / 1e3,
            (self.rate * self.cost_ns / 1e7).min(100.0),
            self.budget,
            REFERENCE_COST_NS / 1e3,
            self.budget as f64 * REFERENCE_COST_NS / 1e7,
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

    /// Feeds the per-CPU hit totals (they only grow) read at `now`, and
    /// what a hit costs (nanoseconds; see `Session::cost_per_hit_ns`).
    /// Trips when, over a window of at least `WINDOW`, one CPU spent more
    /// on hits than the budget allows: more hits than the budget, or fewer
    /// but dearer ones.
    pub fn check(&mut self, now: Instant, hits: &[u64], cost_ns: f64) -> Option<Trip> {
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
        let over =
            rate > self.budget as f64 || rate * cost_ns > self.budget as f64 * REFERENCE_COST_NS;
        over.then_some(Trip {
            cpu,
            rate,
            budget: self.budget,
            cost_ns,
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
        let cost = REFERENCE_COST_NS;
        assert_eq!(breaker.check(t0, &[0, 0], cost), None);
        // 150 hits in 50 ms is 3000/s, but the window is not over yet.
        assert_eq!(
            breaker.check(t0 + Duration::from_millis(50), &[150, 0], cost),
            None
        );
        // Over 250 ms: CPU 0 did 150 (600/s), CPU 1 did 100 (400/s).
        assert_eq!(
            breaker.check(t0 + Duration::from_millis(250), &[150, 100], cost),
            None
        );
        // The next 250 ms: CPU 1 did 400 (1600/s).
        let trip = breaker
            .check(t0 + Duration::from_millis(500), &[160, 500], cost)
            .expect("CPU 1 over budget");
        assert_eq!(trip.cpu, 1);
        assert!((trip.rate - 1600.0).abs() < 1.0, "{trip:?}");
        assert!(trip.to_string().contains("1600 hits/s on CPU 1"), "{trip}");
    }

    #[test]
    fn dear_hits_trip_at_a_lower_rate() {
        let t0 = Instant::now();
        let mut breaker = Breaker::new(1000);
        // 600 hits/s at the reference cost: within the budget.
        assert_eq!(breaker.check(t0, &[0], REFERENCE_COST_NS), None);
        let second = t0 + Duration::from_secs(1);
        assert_eq!(breaker.check(second, &[600], REFERENCE_COST_NS), None);
        // The same rate at five times the cost (a stack walk per hit):
        // 3x the CPU the budget allows.
        let trip = breaker
            .check(
                second + Duration::from_secs(1),
                &[1200],
                5.0 * REFERENCE_COST_NS,
            )
            .expect("over the CPU budget");
        assert!(trip.to_string().contains("at about 10.0 us each"), "{trip}");
    }

    #[test]
    fn a_zero_budget_never_trips() {
        let t0 = Instant::now();
        let mut breaker = Breaker::new(0);
        assert_eq!(breaker.check(t0, &[0], 1e9), None);
        assert_eq!(
            breaker.check(t0 + Duration::from_secs(1), &[u64::MAX], 1e9),
            None
        );
    }
}

//! Latency and value histograms: bpftrace's bucket layouts, so the BPF side
//! can compute the same bucket index, plus count, sum and percentile
//! estimates; rendered as bpftrace's text ([`text`]) and as Prometheus
//! text exposition ([`prometheus`]).
//!
//! Log2 (bpftrace `hist()`): bucket 0 holds v < 0, bucket 1 holds v = 0,
//! v >= 1 goes to `floor(log2 v) + 2`, so bucket i >= 2 covers
//! `[2^(i-2), 2^(i-1))`.
//! Linear (bpftrace `lhist(v, min, max, step)`): bucket 0 holds v < min,
//! bucket i in 1..=n covers `[min + (i-1)*step, min + i*step)`, bucket n+1
//! holds v >= max, with n = (max - min) / step.

pub mod prometheus;
pub mod text;

use std::fmt;

/// Buckets of a log2 histogram: v < 0, 0, then one per power of two up
/// to `[2^62, 2^63)` for the largest i64.
pub const LOG2_BUCKETS: usize = 65;

/// The unit recorded values are in. Text output names it; Prometheus
/// output converts time units to seconds (Prometheus' base unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    /// Plain numbers (sizes, counts).
    #[default]
    None,
    Nanoseconds,
    Microseconds,
    Milliseconds,
}

impl Unit {
    /// The suffix printed after values: `ns`, `us`, `ms` or nothing.
    pub fn suffix(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Nanoseconds => "ns",
            Unit::Microseconds => "us",
            Unit::Milliseconds => "ms",
        }
    }

    /// Seconds per unit, for time units.
    pub fn seconds(self) -> Option<f64> {
        match self {
            Unit::None => None,
            Unit::Nanoseconds => Some(1e-9),
            Unit::Microseconds => Some(1e-6),
            Unit::Milliseconds => Some(1e-3),
        }
    }

    pub fn parse(text: &str) -> Option<Unit> {
        match text {
            "ns" => Some(Unit::Nanoseconds),
            "us" | "µs" => Some(Unit::Microseconds),
            "ms" => Some(Unit::Milliseconds),
            "" | "none" => Some(Unit::None),
            _ => None,
        }
    }
}

/// The bucket layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Log2,
    Linear { min: i64, max: i64, step: i64 },
}

impl Layout {
    /// A linear layout; `max - min` must be a positive multiple of `step`.
    /// (bpftrace 0.17 accepts other ranges but then labels its last bucket
    /// `[max, ...)` while it also holds values below max; refusing them
    /// keeps every label true.)
    pub fn linear(min: i64, max: i64, step: i64) -> Result<Layout, HistogramError> {
        let span = max.checked_sub(min);
        match span {
            _ if step <= 0 => Err(HistogramError::Layout(format!(
                "step {step} must be positive"
            ))),
            Some(span) if span > 0 && span % step == 0 && span / step <= 10_000 => {
                Ok(Layout::Linear { min, max, step })
            }
            Some(span) if span > 0 && span % step == 0 => Err(HistogramError::Layout(format!(
                "[{min}, {max}) in steps of {step} is {} buckets; at most 10000",
                span / step
            ))),
            _ => Err(HistogramError::Layout(format!(
                "max {max} - min {min} must be a positive multiple of step {step}"
            ))),
        }
    }

    /// How many buckets this layout has.
    pub fn len(&self) -> usize {
        match *self {
            Layout::Log2 => LOG2_BUCKETS,
            Layout::Linear { min, max, step } => ((max - min) / step) as usize + 2,
        }
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bucket a value falls in: the same arithmetic the BPF side does.
    pub fn bucket(&self, value: i64) -> usize {
        match *self {
            Layout::Log2 => log2_bucket(value),
            Layout::Linear { min, max, step } => {
                if value < min {
                    0
                } else if value >= max {
                    self.len() - 1
                } else {
                    // value - min < max - min, which fits: no overflow.
                    1 + ((value - min) / step) as usize
                }
            }
        }
    }

    /// What bucket `index` holds.
    pub fn range(&self, index: usize) -> BucketRange {
        match *self {
            Layout::Log2 => match index {
                0 => BucketRange::Below(0),
                1 => BucketRange::Exact(0),
                i => {
                    // Indexes past the last bucket read as the last one.
                    let low = 1i128 << (i.min(LOG2_BUCKETS - 1) - 2);
                    BucketRange::Between(low, low * 2)
                }
            },
            Layout::Linear { min, step, .. } => {
                let last = self.len() - 1;
                let at = |i: usize| i128::from(min) + (i as i128) * i128::from(step);
                match index {
                    0 => BucketRange::Below(i128::from(min)),
                    i if i >= last => BucketRange::AtLeast(at(last - 1)),
                    i => BucketRange::Between(at(i - 1), at(i)),
                }
            }
        }
    }
}

/// bpftrace's log2 bucket: 0 for v < 0, 1 for 0, `floor(log2 v) + 2`.
pub fn log2_bucket(value: i64) -> usize {
    match value {
        v if v < 0 => 0,
        0 => 1,
        v => (63 - v.leading_zeros()) as usize + 2,
    }
}

/// The values one bucket holds (integers; bounds as i128 so `2^63` and
/// `min + n*step` never overflow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketRange {
    /// `v < bound`.
    Below(i128),
    /// `v == value`.
    Exact(i128),
    /// `low <= v < high`.
    Between(i128, i128),
    /// `v >= bound`.
    AtLeast(i128),
}

impl BucketRange {
    /// The smallest bound every value of the bucket is `<=` to, as a
    /// Prometheus `le` needs; `None` for an open-ended top bucket.
    /// `[2^(i-2), 2^(i-1))` has upper bound `2^(i-1)`.
    pub fn upper_bound(&self) -> Option<i128> {
        match *self {
            BucketRange::Below(bound) | BucketRange::Between(_, bound) => Some(bound),
            BucketRange::Exact(value) => Some(value),
            BucketRange::AtLeast(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistogramError {
    #[error("histogram layout: {0}")]
    Layout(String),
    #[error("histogram has {expected} buckets, got {got} counts")]
    Counts { expected: usize, got: usize },
    #[error("cannot merge histograms with different layouts or units")]
    Mismatch,
}

/// Counts per bucket, with the exact count and sum of what was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    layout: Layout,
    unit: Unit,
    counts: Vec<u64>,
    sum: i128,
}

impl Histogram {
    pub fn new(layout: Layout, unit: Unit) -> Histogram {
        Histogram {
            counts: vec![0; layout.len()],
            layout,
            unit,
            sum: 0,
        }
    }

    pub fn log2(unit: Unit) -> Histogram {
        Histogram::new(Layout::Log2, unit)
    }

    /// Builds a histogram from per-bucket counts read from a BPF map, and
    /// the sum the BPF side kept. Fewer counts than buckets are padded with
    /// zeros (a BPF array may stop at the largest bucket it can reach).
    pub fn from_counts(
        layout: Layout,
        unit: Unit,
        counts: &[u64],
        sum: i128,
    ) -> Result<Histogram, HistogramError> {
        if counts.len() > layout.len() {
            return Err(HistogramError::Counts {
                expected: layout.len(),
                got: counts.len(),
            });
        }
        let mut histogram = Histogram::new(layout, unit);
        histogram.counts[..counts.len()].copy_from_slice(counts);
        histogram.sum = sum;
        Ok(histogram)
    }

    pub fn record(&mut self, value: i64) {
        self.record_n(value, 1);
    }

    pub fn record_n(&mut self, value: i64, times: u64) {
        let bucket = self.layout.bucket(value);
        self.counts[bucket] = self.counts[bucket].saturating_add(times);
        self.sum += i128::from(value) * i128::from(times);
    }

    /// Adds another histogram of the same layout and unit (per-CPU maps).
    pub fn merge(&mut self, other: &Histogram) -> Result<(), HistogramError> {
        if self.layout != other.layout || self.unit != other.unit {
            return Err(HistogramError::Mismatch);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
        self.sum += other.sum;
        Ok(())
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    pub fn sum(&self) -> i128 {
        self.sum
    }

    /// Estimates the `q` quantile (0 < q <= 1) from the buckets: find the
    /// bucket holding the value of rank `q * count`, then interpolate
    /// linearly between the bucket's bounds by the rank's position among
    /// the bucket's values (Prometheus' `histogram_quantile` does the same).
    /// An open-ended bucket has no second bound: a rank there is reported
    /// as its one known bound (`max` for `[max, ...)`, `0` for v < 0, `min`
    /// for v < min), an underestimate or overestimate said plainly here.
    /// `None` when the histogram is empty or q is outside (0, 1].
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 || !(q > 0.0 && q <= 1.0) {
            return None;
        }
        let rank = q * total as f64;
        let mut below = 0u64;
        for (index, &count) in self.counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            if (below + count) as f64 >= rank {
                let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
                return Some(match self.layout.range(index) {
                    BucketRange::Below(bound) | BucketRange::AtLeast(bound) => bound as f64,
                    BucketRange::Exact(value) => value as f64,
                    BucketRange::Between(low, high) => low as f64 + (high - low) as f64 * within,
                });
            }
            below += count;
        }
        None
    }

    /// `count 12, sum 3.4ms, p50 120us, p90 ..., p99 ...` (percentiles
    /// estimated as [`Histogram::quantile`] says).
    pub fn summary(&self) -> String {
        let unit = self.unit.suffix();
        let mut out = format!("count {}, sum {}{unit}", self.count(), self.sum);
        for (label, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            match self.quantile(q) {
                Some(v) => out.push_str(&format!(", {label} {}{unit}", Approx(v))),
                None => out.push_str(&format!(", {label} -")),
            }
        }
        out
    }
}

/// Prints an estimate with at most 3 decimals and no trailing zeros.
struct Approx(f64);

impl fmt::Display for Approx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{:.3}", self.0);
        let text = text.trim_end_matches('0').trim_end_matches('.');
        f.write_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_buckets_at_and_around_powers_of_two() {
        assert_eq!(log2_bucket(i64::MIN), 0);
        assert_eq!(log2_bucket(-1), 0);
        assert_eq!(log2_bucket(0), 1);
        assert_eq!(log2_bucket(1), 2);
        assert_eq!(log2_bucket(2), 3);
        assert_eq!(log2_bucket(3), 3);
        assert_eq!(log2_bucket(4), 4);
        assert_eq!(log2_bucket(1023), 11);
        assert_eq!(log2_bucket(1024), 12);
        assert_eq!(log2_bucket(1025), 12);
        assert_eq!(log2_bucket(i64::MAX), 64);
        for n in 0..63 {
            let p = 1i64 << n;
            let bucket = log2_bucket(p);
            assert_eq!(bucket, n as usize + 2, "2^{n}");
            // Exactly 2^n opens its bucket: it is the lower bound.
            assert_eq!(
                Layout::Log2.range(bucket),
                BucketRange::Between(p as i128, 2 * p as i128)
            );
            if n > 0 {
                assert_eq!(log2_bucket(p - 1), bucket - 1, "2^{n} - 1");
            }
        }
        // Every value lies inside the range of its bucket.
        for v in [-5i64, 0, 1, 2, 3, 7, 8, 100, 4096, 5_000_000, i64::MAX] {
            let range = Layout::Log2.range(log2_bucket(v));
            let v = v as i128;
            let inside = match range {
                BucketRange::Below(b) => v < b,
                BucketRange::Exact(x) => v == x,
                BucketRange::Between(l, h) => l <= v && v < h,
                BucketRange::AtLeast(b) => v >= b,
            };
            assert!(inside, "{v} in {range:?}");
        }
    }

    #[test]
    fn linear_buckets() {
        let layout = Layout::linear(0, 1000, 100).unwrap();
        assert_eq!(layout.len(), 12);
        assert_eq!(layout.bucket(-1), 0);
        assert_eq!(layout.bucket(0), 1);
        assert_eq!(layout.bucket(99), 1);
        assert_eq!(layout.bucket(100), 2);
        assert_eq!(layout.bucket(999), 10);
        assert_eq!(layout.bucket(1000), 11);
        assert_eq!(layout.bucket(i64::MAX), 11);
        assert_eq!(layout.range(0), BucketRange::Below(0));
        assert_eq!(layout.range(1), BucketRange::Between(0, 100));
        assert_eq!(layout.range(10), BucketRange::Between(900, 1000));
        assert_eq!(layout.range(11), BucketRange::AtLeast(1000));
        let shifted = Layout::linear(-50, 50, 25).unwrap();
        assert_eq!(shifted.bucket(-51), 0);
        assert_eq!(shifted.bucket(-50), 1);
        assert_eq!(shifted.bucket(-26), 1);
        assert_eq!(shifted.bucket(-25), 2);
        assert_eq!(shifted.bucket(49), 4);
        assert_eq!(shifted.bucket(50), 5);
        // Extreme ranges do not overflow.
        let wide = Layout::linear(i64::MIN, i64::MIN + 10, 5).unwrap();
        assert_eq!(wide.bucket(i64::MAX), 3);
        assert_eq!(wide.bucket(i64::MIN), 1);
    }

    #[test]
    fn bad_linear_layouts_are_refused() {
        for (min, max, step) in [
            (0, 100, 0),
            (0, 100, -10),
            (100, 0, 10),
            (10, 20, 3),
            (0, 0, 1),
        ] {
            assert!(
                Layout::linear(min, max, step).is_err(),
                "{min} {max} {step}"
            );
        }
        assert!(Layout::linear(i64::MIN, i64::MAX, 1).is_err());
        assert!(
            Layout::linear(0, 1_000_000, 1)
                .unwrap_err()
                .to_string()
                .contains("at most")
        );
    }

    #[test]
    fn count_sum_and_merge() {
        let mut a = Histogram::log2(Unit::Nanoseconds);
        for v in [1, 2, 3, 4, 100] {
            a.record(v);
        }
        a.record_n(-7, 2);
        assert_eq!(a.count(), 7);
        assert_eq!(a.sum(), 110 - 14);
        let mut b = Histogram::log2(Unit::Nanoseconds);
        b.record(4);
        a.merge(&b).unwrap();
        assert_eq!(a.counts()[4], 2);
        assert_eq!(a.count(), 8);
        assert!(a.merge(&Histogram::log2(Unit::Microseconds)).is_err());
        let from_map = Histogram::from_counts(Layout::Log2, Unit::None, &[0, 1, 2], 2).unwrap();
        assert_eq!(from_map.count(), 3);
        assert_eq!(from_map.counts().len(), LOG2_BUCKETS);
        assert!(Histogram::from_counts(Layout::Log2, Unit::None, &[0; 66], 0).is_err());
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let mut h = Histogram::log2(Unit::None);
        // 100 values in [64, 128).
        h.record_n(100, 100);
        assert_eq!(h.quantile(0.5), Some(96.0));
        assert_eq!(h.quantile(1.0), Some(128.0));
        assert_eq!(h.quantile(0.01), Some(64.64));
        // 90 fast values in [8, 16), 10 slow ones in [1024, 2048).
        let mut h = Histogram::log2(Unit::Microseconds);
        h.record_n(10, 90);
        h.record_n(1500, 10);
        assert_eq!(h.quantile(0.5), Some(8.0 + 8.0 * 50.0 / 90.0));
        assert_eq!(h.quantile(0.9), Some(16.0));
        assert_eq!(h.quantile(0.99), Some(1024.0 + 1024.0 * 0.9));
        assert_eq!(h.quantile(0.0), None);
        assert_eq!(Histogram::log2(Unit::None).quantile(0.5), None);
        // Zeros are exact; the open top bucket reports its lower bound.
        let mut h = Histogram::new(Layout::linear(0, 100, 10).unwrap(), Unit::None);
        h.record_n(0, 1);
        h.record_n(500, 3);
        assert_eq!(h.quantile(0.99), Some(100.0));
        let mut z = Histogram::log2(Unit::None);
        z.record_n(0, 5);
        assert_eq!(z.quantile(0.5), Some(0.0));
    }

    #[test]
    fn summary_line() {
        let mut h = Histogram::log2(Unit::Microseconds);
        h.record_n(10, 90);
        h.record_n(1500, 10);
        assert_eq!(
            h.summary(),
            "count 100, sum 15900us, p50 12.444us, p90 16us, p99 1945.6us"
        );
        assert_eq!(
            Histogram::log2(Unit::None).summary(),
            "count 0, sum 0, p50 -, p90 -, p99 -"
        );
    }
}

//! Medians and ranges: on a shared, noisy machine one number means little.

/// Median, minimum and maximum of a set of measurements.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub count: usize,
}

impl Summary {
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            count: n,
        })
    }

    /// "median (min–max)" with `digits` decimals after scaling by `scale`.
    pub fn show(&self, scale: f64, digits: usize, unit: &str) -> String {
        if self.count == 1 {
            return format!("{:.*}{unit}", digits, self.median * scale);
        }
        format!(
            "{:.*}{unit} ({:.*}–{:.*})",
            digits,
            self.median * scale,
            digits,
            self.min * scale,
            digits,
            self.max * scale
        )
    }
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

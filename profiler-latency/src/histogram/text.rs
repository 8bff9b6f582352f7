//! bpftrace's text form of `hist()` and `lhist()` maps, byte for byte.
//!
//! Checked against bpftrace 0.17 output (the `histogram_text_matches_bpftrace`
//! end-to-end test runs it): a header line `@name: ` (with the trailing
//! space), then rows `printf("%-16s%8lu |%-52s|")` for the buckets from the
//! first to the last non-empty one, then an empty line. The bar is
//! `count / max_count * 52` computed in single precision and truncated, as
//! bpftrace does. Labels: log2 `(..., 0)`, `[0]`, `[1]`, `[2, 4)`, ...,
//! `[1K, 2K)` (K, M, G, T, P, E = powers of 1024); lhist `(..., min)`,
//! `[a, b)`, `[max, ...)`, numbers that are multiples of 1024 written as K
//! or M.

use std::fmt::Write;

use super::{BucketRange, Histogram, Layout};

const BAR_WIDTH: usize = 52;

/// The block bpftrace prints for one histogram: `header` is the map as
/// bpftrace names it, e.g. `@usecs` or `@usecs[python]`.
pub fn bpftrace_block(header: &str, histogram: &Histogram) -> String {
    let mut out = format!("{header}: \n");
    out.push_str(&bpftrace_rows(histogram));
    out.push('\n');
    out
}

/// Several histograms keyed by a value (pid, comm, an argument), in
/// bpftrace's order: by total count, smallest first; equal totals keep the
/// order given (bpftrace leaves ties unspecified).
pub fn bpftrace_keyed(map: &str, histograms: &[(String, Histogram)]) -> String {
    let mut order: Vec<&(String, Histogram)> = histograms.iter().collect();
    order.sort_by_key(|(_, h)| h.count());
    order
        .into_iter()
        .map(|(key, h)| bpftrace_block(&format!("{map}[{key}]"), h))
        .collect()
}

/// The rows alone: from the first to the last non-empty bucket.
pub fn bpftrace_rows(histogram: &Histogram) -> String {
    let counts = histogram.counts();
    let (Some(first), Some(last)) = (
        counts.iter().position(|&c| c > 0),
        counts.iter().rposition(|&c| c > 0),
    ) else {
        return String::new();
    };
    let max = counts.iter().copied().max().unwrap_or(0);
    let mut out = String::new();
    for (index, &count) in counts.iter().enumerate().take(last + 1).skip(first) {
        let bar_len = ((count as f32 / max as f32) * BAR_WIDTH as f32) as usize;
        let bar = "@".repeat(bar_len.min(BAR_WIDTH));
        let label = label(histogram.layout(), index);
        let _ = writeln!(out, "{label:<16}{count:>8} |{bar:<BAR_WIDTH$}|");
    }
    out
}

fn label(layout: Layout, index: usize) -> String {
    let range = layout.range(index);
    match layout {
        Layout::Log2 => match range {
            BucketRange::Below(_) => "(..., 0)".to_string(),
            BucketRange::Exact(v) => format!("[{v}]"),
            // [1, 2) holds only 1: bpftrace writes it as [1].
            BucketRange::Between(1, _) => "[1]".to_string(),
            BucketRange::Between(low, high) => {
                format!("[{}, {})", power_label(low), power_label(high))
            }
            BucketRange::AtLeast(low) => format!("[{}, ...)", power_label(low)),
        },
        Layout::Linear { .. } => match range {
            BucketRange::Below(min) => format!("(..., {})", linear_label(min)),
            BucketRange::Exact(v) => format!("[{}]", linear_label(v)),
            BucketRange::Between(low, high) => {
                format!("[{}, {})", linear_label(low), linear_label(high))
            }
            BucketRange::AtLeast(max) => format!("[{}, ...)", linear_label(max)),
        },
    }
}

/// A power of two as bpftrace writes it: 512, 1K, 2M, 4G.
fn power_label(value: i128) -> String {
    const SUFFIXES: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let power = value.trailing_zeros() as usize;
    let tier = (power / 10).min(SUFFIXES.len() - 1);
    format!("{}{}", value >> (tier * 10), SUFFIXES[tier])
}

/// An lhist bound: multiples of 1M as `nM`, of 1K as `nK`, else plain
/// (0 stays 0).
fn linear_label(value: i128) -> String {
    const MEGA: i128 = 1 << 20;
    const KILO: i128 = 1 << 10;
    if value != 0 && value % MEGA == 0 {
        format!("{}M", value / MEGA)
    } else if value != 0 && value % KILO == 0 {
        format!("{}K", value / KILO)
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Unit;
    use super::*;

    fn log2_of(values: &[i64]) -> Histogram {
        let mut h = Histogram::log2(Unit::None);
        for &v in values {
            h.record(v);
        }
        h
    }

    #[test]
    fn bpftrace_hist_block() {
        // The output bpftrace 0.17 printed for
        // `@h = hist(5); @h = hist(100);` (one 4-8 and one 64-128 value).
        let expected = "@h: \n\
[4, 8)                 1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|\n\
[8, 16)                0 |                                                    |\n\
[16, 32)               0 |                                                    |\n\
[32, 64)               0 |                                                    |\n\
[64, 128)              1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|\n\n";
        assert_eq!(bpftrace_block("@h", &log2_of(&[5, 100])), expected);
    }

    #[test]
    fn bars_are_truncated_not_rounded() {
        // 1, 3 and 2 of 7 give 7.43, 22.29 and 14.86 '@'.
        let mut values = vec![-5, 1, 1, 1, 2, 2, 4];
        values.extend([16; 7]);
        let rows = bpftrace_rows(&log2_of(&values));
        let lines: Vec<&str> = rows.lines().collect();
        assert_eq!(
            lines[0],
            format!("{:<16}{:>8} |{:<52}|", "(..., 0)", 1, "@".repeat(7))
        );
        assert_eq!(lines[1], format!("{:<16}{:>8} |{:<52}|", "[0]", 0, ""));
        assert_eq!(
            lines[2],
            format!("{:<16}{:>8} |{:<52}|", "[1]", 3, "@".repeat(22))
        );
        assert_eq!(
            lines[3],
            format!("{:<16}{:>8} |{:<52}|", "[2, 4)", 2, "@".repeat(14))
        );
        assert_eq!(lines[6].len(), 16 + 8 + 2 + 52 + 1);
    }

    #[test]
    fn log2_labels() {
        let layout = Layout::Log2;
        let labels: Vec<String> = (0..5).map(|i| label(layout, i)).collect();
        assert_eq!(&labels[..5], ["(..., 0)", "[0]", "[1]", "[2, 4)", "[4, 8)"]);
        assert_eq!(label(layout, 11), "[512, 1K)");
        assert_eq!(label(layout, 12), "[1K, 2K)");
        assert_eq!(label(layout, 21), "[512K, 1M)");
        assert_eq!(label(layout, 32), "[1G, 2G)");
        assert_eq!(label(layout, 33), "[2G, 4G)");
        assert_eq!(label(layout, 42), "[1T, 2T)");
        assert_eq!(label(layout, 64), "[4E, 8E)");
    }

    #[test]
    fn lhist_labels_and_block() {
        let layout = Layout::linear(0, 1000, 100).unwrap();
        let mut h = Histogram::new(layout, Unit::None);
        for v in [-5, 50, 2000] {
            h.record(v);
        }
        let block = bpftrace_block("@l", &h);
        let lines: Vec<&str> = block.lines().collect();
        assert_eq!(lines[0], "@l: ");
        assert!(lines[1].starts_with("(..., 0)               1 |@"));
        assert!(lines[2].starts_with("[0, 100)               1 |@"));
        assert!(lines[3].starts_with("[100, 200)             0 |  "));
        assert!(lines[11].starts_with("[900, 1000)            0 |"));
        assert!(lines[12].starts_with("[1000, ...)            1 |@"));
        assert_eq!(lines.len(), 14);
        assert_eq!(lines[13], "");
        let k = Layout::linear(0, 10240, 1024).unwrap();
        assert_eq!(label(k, 3), "[2K, 3K)");
        let m = Layout::linear(0, 2 << 20, 1 << 20).unwrap();
        assert_eq!(label(m, 2), "[1M, 2M)");
        let odd = Layout::linear(10, 19, 3).unwrap();
        assert_eq!(label(odd, 0), "(..., 10)");
        assert_eq!(label(odd, 2), "[13, 16)");
        assert_eq!(label(odd, 4), "[19, ...)");
    }

    #[test]
    fn empty_histograms_and_keyed_order() {
        assert_eq!(
            bpftrace_block("@e", &Histogram::log2(Unit::None)),
            "@e: \n\n"
        );
        let blocks = bpftrace_keyed(
            "@k",
            &[("1".into(), log2_of(&[8, 9])), ("3".into(), log2_of(&[7]))],
        );
        assert!(blocks.starts_with("@k[3]: \n[4, 8) "), "{blocks}");
        assert!(blocks.contains("\n\n@k[1]: \n[8, 16) "), "{blocks}");
    }
}

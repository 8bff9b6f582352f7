//! Prometheus text exposition (format 0.0.4) of histograms.
//!
//! A Prometheus bucket `le="X"` counts every observation `<= X`,
//! cumulatively. Each of our buckets is exported at its exclusive upper
//! bound: log2 bucket i (`[2^(i-2), 2^(i-1))`) as `le = 2^(i-1)`, linear
//! `[a, b)` as `le = b`, and the v < 0 and v = 0 log2 buckets together as
//! `le = 0`. So no `le` ever counts a value above it, the mistake of
//! ebpf_exporter issue #488 (its floor-log2 buckets were exported at their
//! lower bound). The cost of round bounds: an observation of exactly 2^n is
//! counted from `le = 2^(n+1)` on, not already at `le = 2^n` (its bucket
//! also holds values up to 2^(n+1) - 1, so it cannot be split out).
//!
//! Time units are converted to seconds, Prometheus' base unit: name time
//! metrics `..._seconds`.

use std::fmt::Write;

use super::{Histogram, Layout, Unit};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrometheusError {
    #[error("{0:?} is not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")]
    MetricName(String),
    #[error("{0:?} is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not \"le\")")]
    LabelName(String),
    #[error("metric {name}: series have different bucket layouts or units")]
    MixedLayouts { name: String },
}

/// One histogram series: its labels (e.g. `pid`, `comm`, an argument's
/// value) and its histogram.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    pub labels: Vec<(String, String)>,
    pub histogram: &'a Histogram,
}

/// Renders one metric family: `# HELP`, `# TYPE ... histogram`, then for
/// each series its cumulative `_bucket` lines, `+Inf`, `_sum` and
/// `_count`. Log2 buckets above `max_log2_bucket` (if given) are not
/// exported separately; their counts reach `+Inf` only. Every series
/// gets the same `le` set, as Prometheus' quantile functions expect.
pub fn render(
    name: &str,
    help: &str,
    series: &[Series<'_>],
    max_log2_bucket: Option<usize>,
) -> Result<String, PrometheusError> {
    if !valid_name(name, true) {
        return Err(PrometheusError::MetricName(name.to_string()));
    }
    if let Some(first) = series.first()
        && series.iter().any(|s| {
            s.histogram.layout() != first.histogram.layout()
                || s.histogram.unit() != first.histogram.unit()
        })
    {
        return Err(PrometheusError::MixedLayouts {
            name: name.to_string(),
        });
    }
    let mut out = String::new();
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for s in series {
        let mut labels = String::new();
        for (key, value) in &s.labels {
            if !valid_name(key, false) || key == "le" {
                return Err(PrometheusError::LabelName(key.clone()));
            }
            let _ = write!(labels, "{key}=\"{}\",", escape_label(value));
        }
        let histogram = s.histogram;
        let scale = histogram.unit().seconds();
        let counts = histogram.counts();
        let mut cumulative = 0u64;
        let last_exported = match (histogram.layout(), max_log2_bucket) {
            (Layout::Log2, Some(max)) => max.min(counts.len() - 1),
            _ => counts.len() - 1,
        };
        for (index, &count) in counts.iter().enumerate().take(last_exported + 1) {
            let Some(le) = histogram.layout().range(index).upper_bound() else {
                break; // The open top bucket: only +Inf holds it.
            };
            cumulative = cumulative.saturating_add(count);
            // Log2's v < 0 bucket shares le = 0 with the zero bucket:
            // write the line once, after both.
            let next_le = counts
                .get(index + 1)
                .and_then(|_| histogram.layout().range(index + 1).upper_bound());
            if next_le == Some(le) {
                continue;
            }
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}le=\"{}\"}} {cumulative}",
                number(le, scale)
            );
        }
        let total = histogram.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {total}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", labels.trim_end_matches(','))
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", number(histogram.sum(), scale));
        let _ = writeln!(out, "{name}_count{braces} {total}");
    }
    Ok(out)
}

/// An integer in the histogram's unit, as seconds for time units.
fn number(value: i128, seconds_per_unit: Option<f64>) -> String {
    match seconds_per_unit {
        None => value.to_string(),
        // Dividing by the exact reciprocal (1e9, 1e6, 1e3) keeps decimal
        // bounds clean: 1024 ns is 0.000001024, not 1.0240000000000001e-6.
        Some(scale) => format_float(value as f64 / (1.0 / scale).round()),
    }
}

fn format_float(value: f64) -> String {
    // Rust's shortest round-trip form; Prometheus parses it (Go's
    // ParseFloat), exponents included.
    format!("{value}")
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn valid_name(name: &str, metric: bool) -> bool {
    let mut chars = name.chars();
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (metric && c == ':');
    matches!(chars.next(), Some(c) if first_ok(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (metric && c == ':'))
}

/// Convenience for the common unlabelled case.
pub fn render_one(
    name: &str,
    help: &str,
    histogram: &Histogram,
) -> Result<String, PrometheusError> {
    render(
        name,
        help,
        &[Series {
            labels: Vec::new(),
            histogram,
        }],
        None,
    )
}

impl Unit {
    /// The conventional metric-name suffix for this unit in Prometheus.
    pub fn prometheus_suffix(self) -> &'static str {
        match self {
            Unit::None => "",
            _ => "_seconds",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket_lines(text: &str) -> Vec<(String, u64)> {
        text.lines()
            .filter(|l| l.contains("_bucket{"))
            .map(|l| {
                let le = l
                    .split("le=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .to_string();
                let count = l.rsplit(' ').next().unwrap().parse().unwrap();
                (le, count)
            })
            .collect()
    }

    #[test]
    fn log2_buckets_are_cumulative_at_their_upper_bounds() {
        let mut h = Histogram::log2(Unit::None);
        for v in [-3, 0, 1, 2, 3, 4, 7, 8] {
            h.record(v);
        }
        let text = render(
            "x",
            "values",
            &[Series {
                labels: vec![],
                histogram: &h,
            }],
            Some(5),
        )
        .unwrap();
        let expected: Vec<(String, u64)> = [
            ("0", 2),  // -3 and 0
            ("2", 3),  // + 1
            ("4", 5),  // + 2, 3
            ("8", 7),  // + 4, 7
            ("16", 8), // + 8
            ("+Inf", 8),
        ]
        .iter()
        .map(|&(le, n)| (le.to_string(), n))
        .collect();
        assert_eq!(bucket_lines(&text), expected);
        assert!(text.starts_with("# HELP x values\n# TYPE x histogram\n"));
        assert!(text.contains("\nx_sum 22\nx_count 8\n"), "{text}");
    }

    #[test]
    fn no_le_counts_a_value_above_it() {
        // The ebpf_exporter #488 check: every value counted at le=X is <= X.
        let values: Vec<i64> = (0..=64).chain([127, 128, 129, 1023, 1024, 1025]).collect();
        let mut h = Histogram::log2(Unit::None);
        for &v in &values {
            h.record(v);
        }
        let text = render_one("v", "v", &h).unwrap();
        for (le, count) in bucket_lines(&text) {
            let at_most = match le.as_str() {
                "+Inf" => values.len(),
                le => {
                    let le: f64 = le.parse().unwrap();
                    values.iter().filter(|&&v| v as f64 <= le).count()
                }
            };
            // Never more than the true count; exact powers of two are the
            // only values counted one bucket late.
            assert!(count as usize <= at_most, "le={le}: {count} > {at_most}");
            if le != "+Inf" {
                // Exactly: the values below le (at le=0, the zero bucket's
                // own bound is inclusive).
                let le: i128 = le.parse().unwrap();
                let expected = values
                    .iter()
                    .filter(|&&v| i128::from(v) < le || v == 0)
                    .count();
                assert_eq!(count as usize, expected, "le={le}");
            }
        }
    }

    #[test]
    fn buckets_above_the_limit_only_reach_inf() {
        let mut h = Histogram::log2(Unit::None);
        h.record(1000);
        let text = render(
            "x",
            "h",
            &[Series {
                labels: vec![],
                histogram: &h,
            }],
            Some(5),
        )
        .unwrap();
        let lines = bucket_lines(&text);
        assert_eq!(lines.last().unwrap(), &("+Inf".to_string(), 1));
        assert_eq!(lines[lines.len() - 2], ("16".to_string(), 0));
        // Without a limit every finite bucket is written: le=0 then 2^1..2^63.
        let all = bucket_lines(&render_one("x", "h", &h).unwrap());
        assert_eq!(all.len(), 1 + 63 + 1);
        assert_eq!(all[63].0, "9223372036854775808");
    }

    #[test]
    fn linear_buckets_and_time_units_in_seconds() {
        let layout = Layout::linear(0, 300, 100).unwrap();
        let mut h = Histogram::new(layout, Unit::Microseconds);
        for v in [-1, 0, 99, 100, 250, 300, 5000] {
            h.record(v);
        }
        let text = render_one("lat_seconds", "latency", &h).unwrap();
        assert_eq!(
            bucket_lines(&text),
            vec![
                ("0".to_string(), 1),
                ("0.0001".to_string(), 3),
                ("0.0002".to_string(), 4),
                ("0.0003".to_string(), 5),
                ("+Inf".to_string(), 7),
            ]
        );
        assert!(text.contains("lat_seconds_sum 0.005748\n"), "{text}");
        let mut ns = Histogram::log2(Unit::Nanoseconds);
        ns.record(1500);
        let text = render(
            "t_seconds",
            "t",
            &[Series {
                labels: vec![],
                histogram: &ns,
            }],
            Some(12),
        )
        .unwrap();
        assert!(
            text.contains("t_seconds_bucket{le=\"0.000002048\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("t_seconds_bucket{le=\"0.000001024\"} 0\n"),
            "{text}"
        );
        assert_eq!(Unit::Nanoseconds.prometheus_suffix(), "_seconds");
    }

    #[test]
    fn labelled_series_share_one_family() {
        let mut a = Histogram::log2(Unit::None);
        a.record(3);
        let mut b = Histogram::log2(Unit::None);
        b.record(5);
        let series = [
            Series {
                labels: vec![
                    ("pid".into(), "42".into()),
                    ("comm".into(), "py\"th\\on\n".into()),
                ],
                histogram: &a,
            },
            Series {
                labels: vec![("pid".into(), "43".into())],
                histogram: &b,
            },
        ];
        let text = render("gc_seconds", "GC", &series, Some(4)).unwrap();
        assert_eq!(text.matches("# TYPE").count(), 1);
        assert!(
            text.contains("gc_seconds_bucket{pid=\"42\",comm=\"py\\\"th\\\\on\\n\",le=\"4\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("gc_seconds_sum{pid=\"42\",comm=\"py\\\"th\\\\on\\n\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("gc_seconds_bucket{pid=\"43\",le=\"4\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("gc_seconds_count{pid=\"43\"} 1\n"), "{text}");
    }

    #[test]
    fn bad_names_are_refused() {
        let h = Histogram::log2(Unit::None);
        assert!(render_one("1abc", "x", &h).is_err());
        assert!(render_one("a-b", "x", &h).is_err());
        let series = |key: &str| {
            vec![Series {
                labels: vec![(key.to_string(), "v".to_string())],
                histogram: &h,
            }]
        };
        assert!(render("m", "x", &series("le"), None).is_err());
        assert!(render("m", "x", &series("a:b"), None).is_err());
        let other = Histogram::log2(Unit::Nanoseconds);
        let mixed = [
            Series {
                labels: vec![],
                histogram: &h,
            },
            Series {
                labels: vec![],
                histogram: &other,
            },
        ];
        assert!(matches!(
            render("m", "x", &mixed, None),
            Err(PrometheusError::MixedLayouts { .. })
        ));
    }
}

//! Snapshots as text: bpftrace's histogram blocks followed by a
//! `count, sum, p50, p90, p99` line, `@count` lines for `--count`, or
//! Prometheus exposition.

use profiler_common::latency::HistKey;

use super::plan::{KeyBy, Plan};
use super::session::{KeyTotals, Snapshot};
use crate::histogram::prometheus::{self, Series};
use crate::histogram::{Histogram, HistogramError, Unit, text};

/// The histogram of one key.
pub fn histogram(plan: &Plan, totals: &KeyTotals) -> Result<Histogram, HistogramError> {
    let len = plan.layout.len().min(totals.buckets.len());
    Histogram::from_counts(
        plan.layout,
        plan.unit,
        &totals.buckets[..len],
        i128::from(totals.sum),
    )
}

/// How a key is printed: `2`, `-1`, `python3.11`, or empty without `--by`.
pub fn key_label(plan: &Plan, key: &HistKey) -> String {
    match plan.key {
        KeyBy::None => String::new(),
        KeyBy::Arg(_) if plan.key_signed => (key.value as i64).to_string(),
        KeyBy::Arg(_) | KeyBy::Pid => key.value.to_string(),
        KeyBy::StringArg(_) | KeyBy::Comm => profiler_symbolize::nul_padded(&key.text).into_owned(),
    }
}

/// bpftrace's map name for the unit: `@ns`, `@us`, `@ms`, or `@count`.
pub fn map_name(plan: &Plan) -> String {
    if plan.counting {
        return "@count".to_string();
    }
    match plan.unit {
        Unit::Microseconds => "@us".into(),
        Unit::Milliseconds => "@ms".into(),
        _ => "@ns".into(),
    }
}

/// Keys in bpftrace's order: by count, smallest first, then by label.
fn ordered<'a>(plan: &Plan, snapshot: &'a Snapshot) -> Vec<(String, &'a KeyTotals)> {
    let mut keys: Vec<(String, &KeyTotals)> = snapshot
        .keys
        .iter()
        .map(|(k, v)| (key_label(plan, k), v))
        .collect();
    keys.sort_by(|a, b| a.1.count.cmp(&b.1.count).then_with(|| a.0.cmp(&b.0)));
    keys
}

/// The text report: per key, bpftrace's block then the summary line.
pub fn text_report(plan: &Plan, snapshot: &Snapshot) -> Result<String, HistogramError> {
    let name = map_name(plan);
    let mut out = String::new();
    for (label, totals) in ordered(plan, snapshot) {
        let header = if plan.key == KeyBy::None {
            name.clone()
        } else {
            format!("{name}[{label}]")
        };
        if plan.counting {
            out.push_str(&format!("{header}: {}\n", totals.count));
            continue;
        }
        let histogram = histogram(plan, totals)?;
        out.push_str(&text::bpftrace_block(&header, &histogram));
        out.push_str(&histogram.summary());
        out.push_str("\n\n");
    }
    if snapshot.keys.is_empty() {
        if plan.counting {
            out.push_str(&format!("{name}: 0\n"));
        } else {
            out.push_str(&format!("{name}: (no complete operations)\n"));
        }
    }
    Ok(out)
}

/// Prometheus text: one histogram family `{family}_latency_seconds` (or a
/// counter `{family}_hits_total` for `--count`), labelled by key.
pub fn prometheus_report(plan: &Plan, snapshot: &Snapshot, family: &str) -> Result<String, String> {
    let label_name = match plan.key {
        KeyBy::None => None,
        KeyBy::Arg(n) | KeyBy::StringArg(n) => Some(format!("arg{n}")),
        KeyBy::Pid => Some("pid".into()),
        KeyBy::Comm => Some("comm".into()),
    };
    let keys = ordered(plan, snapshot);
    if plan.counting {
        let mut out =
            format!("# HELP {family}_hits_total Probe hits.\n# TYPE {family}_hits_total counter\n");
        for (label, totals) in keys {
            let labels = match &label_name {
                Some(name) => format!("{{{name}=\"{}\"}}", escape(&label)),
                None => String::new(),
            };
            out.push_str(&format!("{family}_hits_total{labels} {}\n", totals.count));
        }
        return Ok(out);
    }
    let histograms: Vec<(String, Histogram)> = keys
        .into_iter()
        .map(|(label, totals)| Ok((label, histogram(plan, totals)?)))
        .collect::<Result<_, HistogramError>>()
        .map_err(|e| e.to_string())?;
    let series: Vec<Series<'_>> = histograms
        .iter()
        .map(|(label, h)| Series {
            labels: label_name
                .iter()
                .map(|name| (name.clone(), label.clone()))
                .collect(),
            histogram: h,
        })
        .collect();
    let name = format!("{family}_latency{}", plan.unit.prometheus_suffix());
    prometheus::render(
        &name,
        "Time between the start and end probes.",
        &series,
        None,
    )
    .map_err(|e| e.to_string())
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::Layout;
    use profiler_common::latency::{HIST_SLOTS, LatencyConfig};

    fn plan(key: KeyBy, counting: bool) -> Plan {
        Plan {
            sites: Vec::new(),
            config: LatencyConfig::DEFAULT,
            layout: Layout::Log2,
            unit: Unit::Nanoseconds,
            key,
            key_signed: true,
            counting,
            by_goroutine: false,
            tracing: false,
            trace_pairs: false,
            trace_signed: [false; profiler_common::latency::TRACE_SLOTS],
        }
    }

    fn totals(buckets: &[(usize, u64)], sum: u64) -> KeyTotals {
        let mut b = vec![0; HIST_SLOTS];
        for &(i, c) in buckets {
            b[i] = c;
        }
        KeyTotals {
            count: buckets.iter().map(|(_, c)| c).sum(),
            sum,
            buckets: b,
        }
    }

    #[test]
    fn text_is_bpftrace_block_then_summary() {
        let p = plan(KeyBy::None, false);
        let mut snapshot = Snapshot::default();
        // 1 ms sleeps land in [1M, 2M) ns: bucket 22.
        snapshot.keys.insert(
            HistKey::ZERO,
            totals(&[(22, 3), (24, 1)], 3_300_000 + 4_100_000),
        );
        let text = text_report(&p, &snapshot).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "@ns: ");
        assert!(
            lines[1].starts_with("[1M, 2M)               3 |@@@"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("[4M, 8M)               1 |@"),
            "{text}"
        );
        assert!(
            lines[5].starts_with("count 4, sum 7400000ns, p50 "),
            "{text}"
        );
    }

    #[test]
    fn keyed_counts_and_labels() {
        let p = plan(KeyBy::Arg(0), true);
        let mut snapshot = Snapshot::default();
        let key = |v: i64| HistKey {
            value: v as u64,
            ..HistKey::ZERO
        };
        snapshot.keys.insert(key(-1), totals(&[], 0));
        snapshot.keys.get_mut(&key(-1)).unwrap().count = 5;
        snapshot.keys.insert(key(4), totals(&[], 0));
        snapshot.keys.get_mut(&key(4)).unwrap().count = 2;
        assert_eq!(
            text_report(&p, &snapshot).unwrap(),
            "@count[4]: 2\n@count[-1]: 5\n"
        );
        let prom = prometheus_report(&p, &snapshot, "profiler_probe").unwrap();
        assert!(
            prom.contains("profiler_probe_hits_total{arg0=\"-1\"} 5"),
            "{prom}"
        );
        let mut text = HistKey::ZERO;
        text.text[..6].copy_from_slice(b"python");
        assert_eq!(key_label(&plan(KeyBy::Comm, true), &text), "python");
    }

    #[test]
    fn interval_deltas() {
        let earlier = totals(&[(22, 3)], 300);
        let now = totals(&[(22, 5), (23, 1)], 900);
        let delta = now.since(Some(&earlier));
        assert_eq!((delta.count, delta.sum), (3, 600));
        assert_eq!((delta.buckets[22], delta.buckets[23]), (2, 1));
    }
}

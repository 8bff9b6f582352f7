//! The window files `profiler-agent run`'s directory exporter writes
//! (`<profile>-<service>-<unix ms>.pb.gz`), read with `go tool pprof`:
//! when each window started (its name), how long it lasted (the duration
//! `-top` prints: `-raw` cuts it to four characters, which leaves 205 ms
//! and 205 s, or 2.05 ms and 2.05 s, apart only by guessing) and what its
//! samples hold (`-raw`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pprof_raw::RawProfile;
use crate::profiles::go_pprof;

/// One window's file of one profile and service.
#[derive(Debug)]
pub struct WindowFile {
    pub path: PathBuf,
    /// Unix nanoseconds (to the millisecond of the file's name).
    pub start_ns: i64,
    pub duration: Duration,
    pub profile: RawProfile,
}

impl WindowFile {
    pub fn end_ns(&self) -> i64 {
        self.start_ns + self.duration.as_nanos() as i64
    }

    /// The total of sample type `sample_type` (e.g. `wall/nanoseconds`)
    /// per value of label `key` (e.g. `tid`); samples without the label
    /// are left out.
    pub fn totals_by(&self, sample_type: &str, key: &str) -> HashMap<String, i64> {
        totals_by(&self.profile, sample_type, key)
    }
}

/// The files of `profile` (`cpu`, `wall`, ...) for `service` in `dir`,
/// oldest first.
pub fn window_files(dir: &Path, profile: &str, service: &str) -> Vec<WindowFile> {
    let prefix = format!("{profile}-{service}-");
    let mut files: Vec<(i64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?;
            let ms: i64 = name
                .strip_prefix(&prefix)?
                .strip_suffix(".pb.gz")?
                .parse()
                .ok()?;
            Some((ms, path))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|(ms, path)| {
            let profile = RawProfile::read(&path);
            WindowFile {
                start_ns: ms * 1_000_000,
                duration: top_duration(&path),
                profile,
                path,
            }
        })
        .collect()
}

/// The total of sample type `sample_type` per value of label `key`.
pub fn totals_by(profile: &RawProfile, sample_type: &str, key: &str) -> HashMap<String, i64> {
    let index = profile
        .sample_types
        .iter()
        .position(|t| t == sample_type)
        .unwrap_or_else(|| {
            panic!(
                "no sample type {sample_type} among {:?}",
                profile.sample_types
            )
        });
    let mut totals = HashMap::new();
    for sample in &profile.samples {
        if let Some(value) = sample.labels.get(key) {
            *totals.entry(value.clone()).or_default() += sample.values[index];
        }
    }
    totals
}

/// The duration in `go tool pprof -top`'s header ("Duration: 3.01s, Total
/// samples = ..."; pprof's own units, two decimals).
pub fn top_duration(file: &Path) -> Duration {
    let top = go_pprof(&["-top", "-nodecount=1"], file);
    let text = top
        .lines()
        .find_map(|line| line.strip_prefix("Duration: "))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| {
            panic!(
                "no duration in go tool pprof -top of {}:\n{top}",
                file.display()
            )
        });
    pprof_duration(text)
        .unwrap_or_else(|| panic!("{}: unreadable duration {text:?}", file.display()))
}

/// A duration as pprof's measurement labels print it: "3.01s", "205.12ms",
/// "1.50hrs".
fn pprof_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let value: f64 = text[..split].parse().ok()?;
    let scale = match &text[split..] {
        "ns" => 1e-9,
        "us" | "μs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "hrs" => 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(value * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_pprof_prints_them() {
        assert_eq!(pprof_duration("3.01s"), Some(Duration::from_millis(3010)));
        assert_eq!(
            pprof_duration("205.12ms"),
            Some(Duration::from_micros(205_120))
        );
        assert_eq!(pprof_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(pprof_duration("soon"), None);
    }
}

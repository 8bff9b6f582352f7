//! A pprof file as `go tool pprof -raw` prints it: the reading of a tool we
//! did not write, turned into the same [`Stack`]s the other helpers give.
//!
//! `-raw` prints the profile's own tables (pprof's `Profile.String()`):
//! a header (`PeriodType:`, `Period:`, `Duration:`), then `Samples:` (a
//! line of sample types, then per sample `VALUES: LOCATION IDS` and an
//! indented line of `key:[value]` labels), `Locations` (`ID: 0xADDR M=N
//! function file:line[:column] s=START`, inlined callers on indented lines
//! below, innermost first) and `Mappings` (`ID: 0xSTART/0xLIMIT/0xOFFSET
//! FILE BUILDID [flags]`).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::profiles::{Stack, go_pprof};

/// What `go tool pprof -raw` shows of a profile.
#[derive(Debug, Default)]
pub struct RawProfile {
    /// `type/unit` of each sample value, in order.
    pub sample_types: Vec<String>,
    pub period: i64,
    pub duration: Duration,
    pub samples: Vec<RawSample>,
    /// Location id → its lines (innermost first) and its mapping id.
    pub locations: HashMap<u64, (Vec<RawLine>, u64)>,
    /// Mapping id → file.
    pub mappings: HashMap<u64, String>,
}

/// One line of a location: a function, its file and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawLine {
    pub function: String,
    pub file: String,
    pub line: u32,
}

/// A sample's frames with their files and lines, leaf first.
#[derive(Debug, Clone)]
pub struct LinedStack {
    /// (line, is kernel), leaf first, inlined frames expanded.
    pub frames: Vec<(RawLine, bool)>,
    pub count: i64,
    pub labels: HashMap<String, String>,
}

#[derive(Debug, Default, Clone)]
pub struct RawSample {
    pub values: Vec<i64>,
    /// Leaf first.
    pub locations: Vec<u64>,
    pub labels: HashMap<String, String>,
}

impl RawProfile {
    /// Runs `go tool pprof -raw` on `file` (the test fails if it cannot
    /// read it) and parses what it prints.
    pub fn read(file: &Path) -> RawProfile {
        parse(&go_pprof(&["-raw"], file))
    }

    /// The same for a profile's bytes (a pull's body, a push's payload).
    pub fn of_bytes(bytes: &[u8]) -> RawProfile {
        let file = tempfile::Builder::new()
            .suffix(".pb.gz")
            .tempfile()
            .expect("a temporary file");
        std::fs::write(file.path(), bytes).unwrap();
        RawProfile::read(file.path())
    }

    /// Every sample with its frames named, leaf first, inlined frames
    /// expanded; `count` is the first sample value.
    pub fn stacks(&self) -> Vec<Stack> {
        self.lined_stacks()
            .into_iter()
            .map(|stack| Stack {
                frames: stack
                    .frames
                    .into_iter()
                    .map(|(line, kernel)| (line.function, kernel))
                    .collect(),
                count: stack.count,
                labels: stack.labels,
            })
            .collect()
    }

    /// Every sample with its frames' files and lines, leaf first.
    pub fn lined_stacks(&self) -> Vec<LinedStack> {
        self.samples
            .iter()
            .map(|sample| {
                let mut frames = Vec::new();
                for id in &sample.locations {
                    let Some((lines, mapping)) = self.locations.get(id) else {
                        panic!("sample names location {id}, which -raw did not list");
                    };
                    let kernel = self
                        .mappings
                        .get(mapping)
                        .is_some_and(|file| file == "[kernel.kallsyms]");
                    for line in lines {
                        frames.push((line.clone(), kernel));
                    }
                }
                LinedStack {
                    frames,
                    count: sample.values.first().copied().unwrap_or(0),
                    labels: sample.labels.clone(),
                }
            })
            .collect()
    }
}

/// Stacks of a pprof file, as `go tool pprof -raw` reads it.
pub fn raw_stacks(file: &Path) -> Vec<Stack> {
    RawProfile::read(file).stacks()
}

/// Stacks of a pprof body, as `go tool pprof -raw` reads it.
pub fn raw_stacks_of(bytes: &[u8]) -> Vec<Stack> {
    RawProfile::of_bytes(bytes).stacks()
}

#[derive(PartialEq)]
enum Section {
    Header,
    Samples,
    Locations,
    Mappings,
}

/// Parses `-raw` text.
pub fn parse(text: &str) -> RawProfile {
    let mut profile = RawProfile::default();
    let mut section = Section::Header;
    let mut location: Option<u64> = None;
    for line in text.lines() {
        match line.trim_end() {
            "Samples:" => {
                section = Section::Samples;
                continue;
            }
            "Locations" => {
                section = Section::Locations;
                continue;
            }
            "Mappings" => {
                section = Section::Mappings;
                continue;
            }
            _ => {}
        }
        match section {
            Section::Header => {
                if let Some(period) = line.strip_prefix("Period: ") {
                    profile.period = period.trim().parse().unwrap_or(0);
                } else if let Some(duration) = line.strip_prefix("Duration: ") {
                    profile.duration = raw_duration(duration.trim()).unwrap_or_default();
                }
            }
            Section::Samples => sample_line(&mut profile, line),
            Section::Locations => location_line(&mut profile, &mut location, line),
            Section::Mappings => {
                // "1: 0x400000/0x500000/0x0 /path/file buildid [FN]"
                let Some((id, rest)) = line.trim().split_once(": ") else {
                    continue;
                };
                let Ok(id) = id.parse::<u64>() else {
                    continue;
                };
                let file = rest.split_whitespace().nth(1).unwrap_or_default();
                profile.mappings.insert(id, file.to_string());
            }
        }
    }
    profile
}

fn sample_line(profile: &mut RawProfile, line: &str) {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return;
    }
    if !line.starts_with(' ') {
        // The sample types: "samples/count cpu/nanoseconds", the default
        // one (when the profile names one) marked "[dflt]".
        profile.sample_types = trimmed
            .split_whitespace()
            .map(|t| t.trim_end_matches("[dflt]").to_string())
            .collect();
        return;
    }
    if let Some((values, locations)) = trimmed.split_once(':')
        && !values.is_empty()
        && values.split_whitespace().all(|v| v.parse::<i64>().is_ok())
    {
        profile.samples.push(RawSample {
            values: values
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect(),
            locations: locations
                .split_whitespace()
                .filter_map(|id| id.parse().ok())
                .collect(),
            labels: HashMap::new(),
        });
        return;
    }
    // Labels of the sample above: "key:[value] key:[value]".
    let Some(sample) = profile.samples.last_mut() else {
        return;
    };
    for pair in trimmed.split("] ") {
        if let Some((key, value)) = pair.trim_end_matches(']').split_once(":[") {
            sample.labels.insert(key.to_string(), value.to_string());
        }
    }
}

fn location_line(profile: &mut RawProfile, current: &mut Option<u64>, line: &str) {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return;
    }
    // "     7: 0x4011d6 M=1 hot_a /src/hot.c:12:0 s=0" starts a location;
    // an indented line without "ID:" adds the next (outer) inline frame.
    let starts = trimmed
        .split_once(": 0x")
        .is_some_and(|(id, _)| id.parse::<u64>().is_ok());
    let rest = if starts {
        let (id, rest) = trimmed.split_once(": ").unwrap();
        let id: u64 = id.parse().unwrap();
        *current = Some(id);
        let mut words = rest.splitn(2, ' ');
        let _address = words.next();
        let mut rest = words.next().unwrap_or_default();
        let mut mapping = 0;
        if let Some(after) = rest.strip_prefix("M=") {
            let (m, tail) = after.split_once(' ').unwrap_or((after, ""));
            mapping = m.parse().unwrap_or(0);
            rest = tail;
        }
        let rest = rest.strip_prefix("[F] ").unwrap_or(rest);
        profile.locations.insert(id, (Vec::new(), mapping));
        rest.to_string()
    } else {
        trimmed.to_string()
    };
    let Some(id) = *current else {
        return;
    };
    if rest.is_empty() || rest == "??" {
        return;
    }
    if let Some(line) = raw_line(&rest) {
        profile.locations.get_mut(&id).unwrap().0.push(line);
    }
}

/// "NAME FILE:LINE[:COLUMN] s=START[(SYSTEM NAME)]": names may hold
/// spaces (C++), so the file and line are cut from the right.
fn raw_line(text: &str) -> Option<RawLine> {
    let before_start = &text[..text.rfind(" s=")?];
    let (name, file_line) = before_start.rsplit_once(' ')?;
    // FILE:LINE or FILE:LINE:COLUMN (go tool pprof since Go 1.21).
    let mut parts = file_line.rsplitn(3, ':').collect::<Vec<_>>();
    parts.reverse();
    let (file, line) = match parts.as_slice() {
        [file, line, column] if column.parse::<u32>().is_ok() && line.parse::<u32>().is_ok() => {
            (file.to_string(), line.parse().unwrap_or(0))
        }
        [file, line, column] => (format!("{file}:{line}"), column.parse().unwrap_or(0)),
        [file, line] => (file.to_string(), line.parse().unwrap_or(0)),
        _ => (file_line.to_string(), 0),
    };
    Some(RawLine {
        function: name.to_string(),
        file,
        line,
    })
}

/// The header's duration: pprof prints it with `%.4v`, the first four
/// characters of Go's `time.Duration` text, so "3.012345s" reads "3.01"
/// (seconds, its unit cut off) while "3m0s" and "50ms" keep theirs. A
/// number of 60 or more without its unit is milliseconds ("205.123ms"
/// reads "205."; a minute or more prints as "1m2.5s"). Below that the cut
/// is ambiguous ("2.051234ms" also reads "2.05"): read as seconds, the
/// profiles' usual length; `windows::top_duration` reads it exactly.
fn raw_duration(text: &str) -> Option<Duration> {
    go_duration(text).or_else(|| {
        let value: f64 = text.trim_end_matches('.').parse().ok()?;
        let seconds = if value >= 60.0 { value / 1e3 } else { value };
        Some(Duration::from_secs_f64(seconds))
    })
}

/// A Go `time.Duration` as `%v` prints it: "3.012s", "1m2.5s", "500ms".
fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_go_tool_pprof_prints() {
        let text = "PeriodType: cpu nanoseconds\nPeriod: 10000000\nTime: 2026-11-26 10:00:00 +0000 UTC\nDuration: 3.01\nSamples:\nsamples/count cpu/nanoseconds\n          2   20000000: 1 2 \n                pid:[12] comm:[hot worker]\nLocations\n     1: 0xffffffff81000010 M=2 do_syscall_64 :0:0 s=0\n     2: 0x4011d6 M=1 inner /src/a.c:3:0 s=0\n             outer(int, char) /src/a.c:9:0 s=0\nMappings\n1: 0x400000/0x500000/0x0 /src/a 0badcafe [FN]\n2: 0x0/0x0/0x0 [kernel.kallsyms]  [FN]\n";
        let profile = parse(text);
        assert_eq!(profile.period, 10_000_000);
        assert_eq!(profile.duration, Duration::from_millis(3010));
        assert_eq!(raw_duration("3m0s"), Some(Duration::from_secs(180)));
        assert_eq!(raw_duration("50ms"), Some(Duration::from_millis(50)));
        assert_eq!(raw_duration("205."), Some(Duration::from_millis(205)));
        assert_eq!(profile.sample_types, ["samples/count", "cpu/nanoseconds"]);
        let stacks = profile.stacks();
        assert_eq!(stacks.len(), 1);
        assert_eq!(stacks[0].count, 2);
        assert_eq!(stacks[0].labels["comm"], "hot worker");
        assert_eq!(
            stacks[0].frames,
            [
                ("do_syscall_64".to_string(), true),
                ("inner".to_string(), false),
                ("outer(int, char)".to_string(), false),
            ]
        );
        let lined = profile.lined_stacks();
        assert_eq!(lined[0].frames[1].0.file, "/src/a.c");
        assert_eq!(lined[0].frames[1].0.line, 3);
        assert_eq!(lined[0].frames[2].0.line, 9);
    }
}

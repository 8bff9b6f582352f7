//! Reading what the agent wrote: pprof files (as samples with names),
//! `go tool pprof`, the symbolize command's JSON, histogram text.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use profiler_profile::pprof::proto;

/// A decoded sample: frame names leaf first, kernel flags, labels.
#[derive(Debug, Clone)]
pub struct Stack {
    /// (function name, is kernel) leaf first, inlined frames expanded.
    pub frames: Vec<(String, bool)>,
    pub count: i64,
    pub labels: HashMap<String, String>,
}

impl Stack {
    pub fn has(&self, function: &str) -> bool {
        self.frames.iter().any(|(name, _)| name == function)
    }

    /// The user frames from the root (`_start`, `clone3`, a Go root) down
    /// to the leaf, kernel frames left out.
    pub fn user_chain(&self) -> Vec<&str> {
        self.frames
            .iter()
            .rev()
            .filter(|(_, kernel)| !kernel)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Position (leaf = 0) of a function, if present.
    pub fn depth_of(&self, function: &str) -> Option<usize> {
        self.frames.iter().position(|(name, _)| name == function)
    }
}

/// Reads a gzip pprof file written by the agent.
pub fn read_pprof(path: &Path) -> proto::Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    profiler_profile::pprof::decode(&bytes).expect("valid pprof")
}

/// Every sample of a pprof profile with its names resolved.
pub fn stacks(profile: &proto::Profile) -> Vec<Stack> {
    let s = |i: i64| profile.string_table[i as usize].clone();
    let functions: HashMap<u64, String> =
        profile.function.iter().map(|f| (f.id, s(f.name))).collect();
    let locations: HashMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| s(m.filename) == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    profile
        .sample
        .iter()
        .map(|sample| {
            let mut frames = Vec::new();
            for id in &sample.location_id {
                let location = locations[id];
                let kernel = kernel_mappings.contains(&location.mapping_id);
                for line in &location.line {
                    frames.push((functions[&line.function_id].clone(), kernel));
                }
            }
            Stack {
                frames,
                count: sample.value[0],
                labels: sample.label.iter().map(|l| (s(l.key), s(l.str))).collect(),
            }
        })
        .collect()
}

/// Runs `go tool pprof ARGS FILE` and returns stdout, failing the test if
/// pprof cannot read the file.
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("running `go tool pprof` (Debian's golang-go; `cargo xtask setup` installs it)");
    assert!(
        output.status.success(),
        "go tool pprof {args:?} {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// One frame of `profiler-agent symbolize --format json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SymbolizedFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
    /// Where the name came from (symtab, dynsym, dwarf, debuginfod, ...).
    #[serde(default)]
    pub source: String,
}

#[derive(serde::Deserialize)]
struct SymbolizedAddress {
    address: String,
    frames: Vec<SymbolizedFrame>,
}

/// Parses `symbolize --format json` output into (address, frames).
pub fn parse_symbolize_json(json: &str) -> Vec<(u64, Vec<SymbolizedFrame>)> {
    let parsed: Vec<SymbolizedAddress> = serde_json::from_str(json).expect("symbolize JSON");
    parsed
        .into_iter()
        .map(|a| {
            let address = u64::from_str_radix(a.address.trim_start_matches("0x"), 16).unwrap();
            (address, a.frames)
        })
        .collect()
}

/// The rows of the histogram block headed `header` (e.g. `@ns` or
/// `@ns[4]`) in bpftrace's text: (bucket label, count).
pub fn histogram_rows(text: &str, header: &str) -> Vec<(String, u64)> {
    let start = format!("{header}: ");
    let mut lines = text.lines().skip_while(|l| *l != start);
    assert!(lines.next().is_some(), "no block {header:?} in:\n{text}");
    lines
        .take_while(|l| !l.is_empty())
        .map(|line| {
            let (label, rest) = line.split_at(16.min(line.len()));
            let count = rest
                .split('|')
                .next()
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or_else(|| panic!("not a histogram row: {line:?}"));
            (label.trim().to_string(), count)
        })
        .collect()
}

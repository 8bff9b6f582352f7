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

/// Go's own stack from a fixture that wrote `runtime.Callers` frames one
/// per line, `FUNCTION FILE:LINE`, leaf first, then `end` (the go-unwind
/// fixture's `faults` workload); None until the `end` line is there.
pub fn go_own_stack(text: &str) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for line in text.lines() {
        if line == "end" {
            return Some(names);
        }
        names.push(line.split(' ').next()?.to_string());
    }
    None
}

/// Compares every sample through `from` (a function of Go's own stack
/// `own`, leaf first) with it: the sample's frames from `from` outward
/// must be exactly `own`'s from `from` outward, but for the frames named
/// in `elided`, which Go's traceback leaves out of its own (as it does
/// wrappers). Samples that caught the kernel delivering a signal are left
/// out: it rewrites the user registers one by one, and no unwinder can
/// tell half of them from the other. Returns the samples that agree, all
/// of them, and up to ten that do not, described.
pub fn agree_from(
    stacks: &[Stack],
    from: &str,
    own: &[String],
    elided: &[&str],
) -> (i64, i64, Vec<String>) {
    let expected = match own.iter().position(|name| name == from) {
        Some(at) => &own[at..],
        None => panic!("{from} is not in Go's own stack {own:?}"),
    };
    let (mut agree, mut total, mut disagree) = (0, 0, Vec::new());
    for stack in stacks {
        let Some(at) = stack.depth_of(from) else {
            continue;
        };
        if delivering_signal(stack) {
            continue;
        }
        total += stack.count;
        let ours: Vec<&str> = stack.frames[at..]
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !elided.contains(n))
            .collect();
        if ours == expected {
            agree += stack.count;
        } else if disagree.len() < 10 {
            let all: Vec<&str> = stack.frames.iter().map(|(n, _)| n.as_str()).collect();
            disagree.push(format!("{} {}", stack.count, all.join(";")));
        }
    }
    (agree, total, disagree)
}

/// The sample caught the kernel setting up a signal's frame: it rewrites
/// the user registers one by one (arm64's setup_return: SP, FP, PC, then
/// the link register), so they may be half the handler's and half the
/// interrupted code's.
pub fn delivering_signal(stack: &Stack) -> bool {
    const DELIVERY: &[&str] = &[
        "do_notify_resume",
        "do_signal",
        "handle_signal",
        "setup_rt_frame",
        "signal_setup_done",
        "arch_do_signal_or_restart",
        "x64_setup_rt_frame",
    ];
    stack
        .frames
        .iter()
        .any(|(name, kernel)| *kernel && DELIVERY.contains(&name.as_str()))
}

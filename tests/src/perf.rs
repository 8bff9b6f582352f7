//! perf as the ground truth for user stacks: `perf record --call-graph
//! dwarf` copies the user stack at every sample and unwinds it afterwards
//! with elfutils, independently of our tables and our BPF walker. Both
//! profile the same process at the same time; their stacks are compared
//! address by address.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use object::{Object, ObjectSegment};

use profiler_profile::pprof::proto;

/// One user frame: the object's path and an ELF virtual address in it.
/// Callers are given as their return address minus one, as `perf script`
/// prints them.
pub type Frame = (String, u64);

/// A running `perf record` of one process.
pub struct PerfRecording {
    child: Child,
    data: PathBuf,
    pid: u32,
}

impl PerfRecording {
    /// Records `pid` for `seconds` at 999 Hz on the CPU clock (ten times the
    /// agent's rate, so that a path the agent sampled once or twice perf has
    /// seen too), with 32 KiB of user stack copied per sample.
    pub fn start(pid: u32, seconds: u32, dir: &Path) -> PerfRecording {
        let data = dir.join(format!("perf-{pid}.data"));
        let child = Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                "999",
                "--call-graph",
                "dwarf,32768",
            ])
            .arg("-p")
            .arg(pid.to_string())
            .arg("-o")
            .arg(&data)
            .args(["--", "sleep", &seconds.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running perf record (Debian's linux-perf: `cargo xtask setup --tests`)");
        PerfRecording { child, data, pid }
    }

    /// Waits for the recording to end and returns its user stacks, leaf
    /// first.
    pub fn finish(self) -> Vec<Vec<Frame>> {
        let output = self
            .child
            .wait_with_output()
            .expect("waiting for perf record");
        assert!(
            output.status.success(),
            "perf record failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let script = Command::new("perf")
            .args(["script", "--no-inline", "-F", "pid,ip,dso", "-i"])
            .arg(&self.data)
            .output()
            .expect("running perf script");
        assert!(
            script.status.success(),
            "perf script failed: {}",
            String::from_utf8_lossy(&script.stderr)
        );
        parse_script(&String::from_utf8_lossy(&script.stdout), self.pid)
    }
}

/// Stacks of `pid` in `perf script -F pid,ip,dso` output: a line with the
/// pid, then one line per frame (`ip (dso)`), then a blank line.
fn parse_script(text: &str, pid: u32) -> Vec<Vec<Frame>> {
    let mut stacks = Vec::new();
    let mut current: Option<Vec<Frame>> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            if let Some(stack) = current.take() {
                stacks.push(stack);
            }
            continue;
        }
        if !line.starts_with(char::is_whitespace) || current.is_none() {
            if let Some(stack) = current.take() {
                stacks.push(stack);
            }
            let ours = line
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                == Some(pid);
            current = ours.then(Vec::new);
            continue;
        }
        let Some(stack) = current.as_mut() else {
            continue;
        };
        let line = line.trim();
        let Some((ip, rest)) = line.split_once(' ') else {
            continue;
        };
        let dso = rest.trim().trim_start_matches('(').trim_end_matches(')');
        let Ok(ip) = u64::from_str_radix(ip, 16) else {
            continue;
        };
        if dso.starts_with('[') || ip >= 0xffff_0000_0000_0000 {
            continue; // kernel
        }
        stack.push((dso.to_string(), ip));
    }
    if let Some(stack) = current {
        stacks.push(stack);
    }
    stacks.retain(|s| !s.is_empty());
    stacks
}

/// The user stacks of the agent's pprof profile (of `pid`), in perf's
/// terms: ELF virtual addresses per object, callers one byte back.
pub fn agent_stacks(profile: &proto::Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    let s = |i: i64| profile.string_table[i as usize].clone();
    let mappings: HashMap<u64, &proto::Mapping> =
        profile.mapping.iter().map(|m| (m.id, m)).collect();
    let locations: HashMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let mut segments = Segments::default();
    let pid_label = pid.to_string();
    profile
        .sample
        .iter()
        .filter(|sample| {
            sample
                .label
                .iter()
                .any(|l| s(l.key) == "pid" && s(l.str) == pid_label)
        })
        .map(|sample| {
            let mut frames = Vec::new();
            for id in &sample.location_id {
                let location = locations[id];
                let Some(mapping) = mappings.get(&location.mapping_id) else {
                    continue;
                };
                let path = s(mapping.filename);
                if path.starts_with('[') {
                    continue; // kernel, vdso
                }
                let offset = location.address - mapping.memory_start + mapping.file_offset;
                let vaddr = segments.vaddr(&path, offset).unwrap_or(offset);
                let caller = !frames.is_empty();
                frames.push((path, if caller { vaddr - 1 } else { vaddr }));
            }
            (frames, sample.value[0])
        })
        .filter(|(frames, _)| !frames.is_empty())
        .collect()
}

/// ELF segments of the objects seen, to turn file offsets into addresses.
#[derive(Default)]
struct Segments {
    by_path: HashMap<String, Vec<(u64, u64, u64)>>,
}

impl Segments {
    fn vaddr(&mut self, path: &str, offset: u64) -> Option<u64> {
        let segments = self.by_path.entry(path.to_string()).or_insert_with(|| {
            let Ok(data) = std::fs::read(path) else {
                return Vec::new();
            };
            let Ok(file) = object::File::parse(&*data) else {
                return Vec::new();
            };
            file.segments()
                .map(|s| {
                    let (file_offset, size) = s.file_range();
                    (file_offset, size, s.address())
                })
                .collect()
        });
        segments.iter().find_map(|&(file_offset, size, address)| {
            (offset >= file_offset && offset < file_offset + size)
                .then(|| offset - file_offset + address)
        })
    }
}

/// Where two sets of stacks disagree.
#[derive(Debug, Default)]
pub struct Disagreement {
    /// Caller frames the agent reported that perf never did, with the
    /// number of the agent's samples that have them.
    pub unknown_callers: BTreeMap<Frame, i64>,
    /// Caller-to-caller steps the agent took that perf never did, with the
    /// number of the agent's samples that take them.
    pub unknown_steps: BTreeMap<(Frame, Frame), i64>,
    /// Steps in at least 80 of perf's samples (about 8 expected in the
    /// agent's, at a tenth of the rate) that the agent never took.
    pub missing_steps: BTreeMap<(Frame, Frame), usize>,
    pub agent_steps: usize,
    pub perf_steps: usize,
    pub agent_samples: i64,
    /// The agent's samples with anything perf never reported.
    pub samples_with_unknowns: i64,
    /// Up to ten of the agent's stacks (leaf first) with anything perf
    /// never reported, to read when the check fails.
    pub stacks_with_unknowns: Vec<(Vec<Frame>, i64)>,
}

impl Disagreement {
    /// Whether the stacks agree: nothing perf took often is missing, and
    /// what only the agent saw is in one or two samples each (a rare path
    /// perf, sampling at other instants, did not happen to catch: a dlopen,
    /// an allocation) adding up to at most 2% of the samples. A wrong
    /// unwinding rule shows in every sample that passes through its code.
    pub fn agrees(&self) -> bool {
        self.missing_steps.is_empty()
            && self.unknown_steps.values().all(|&n| n <= 2)
            && self.unknown_callers.values().all(|&n| n <= 2)
            && self.samples_with_unknowns * 50 <= self.agent_samples
    }
}

/// Compares the agent's stacks with perf's: every caller (return address)
/// and every step from a caller to its caller the agent reports must be one
/// perf reports too, and every step in at least 80 of perf's samples must
/// be in the agent's (see `Disagreement::agrees`). Leaves are left out: two
/// samplers never interrupt the same instructions.
pub fn compare(agent: &[(Vec<Frame>, i64)], perf: &[Vec<Frame>]) -> Disagreement {
    fn steps(stack: &[Frame]) -> BTreeSet<(Frame, Frame)> {
        stack
            .windows(2)
            .skip(1)
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect()
    }
    let perf_callers: BTreeSet<Frame> = perf
        .iter()
        .flat_map(|s| s.iter().skip(1).cloned())
        .collect();
    let mut perf_steps: BTreeMap<(Frame, Frame), usize> = BTreeMap::new();
    for stack in perf {
        for step in steps(stack) {
            *perf_steps.entry(step).or_default() += 1;
        }
    }
    let mut result = Disagreement {
        perf_steps: perf_steps.len(),
        ..Default::default()
    };
    let mut agent_steps: BTreeSet<(Frame, Frame)> = BTreeSet::new();
    for (stack, count) in agent {
        result.agent_samples += count;
        let mut unknown = false;
        let callers: BTreeSet<&Frame> = stack.iter().skip(1).collect();
        for caller in callers {
            if !perf_callers.contains(caller) {
                *result.unknown_callers.entry(caller.clone()).or_default() += count;
                unknown = true;
            }
        }
        for step in steps(stack) {
            if !perf_steps.contains_key(&step) {
                *result.unknown_steps.entry(step.clone()).or_default() += count;
                unknown = true;
            }
            agent_steps.insert(step);
        }
        if unknown {
            result.samples_with_unknowns += count;
            if result.stacks_with_unknowns.len() < 10 {
                result.stacks_with_unknowns.push((stack.clone(), *count));
            }
        }
    }
    result.agent_steps = agent_steps.len();
    result.missing_steps = perf_steps
        .into_iter()
        .filter(|(step, count)| *count >= 80 && !agent_steps.contains(step))
        .collect();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_script_output_is_parsed() {
        let text = "15462 \n\t            1363 (/tmp/nofp)\n\t            1389 (/tmp/nofp)\n\
                    \t ffffffff81000000 ([kernel.kallsyms])\n\n999 \n\t  10 (/bin/x)\n\n\
                    15462 \n\t  1237 (/tmp/nofp)\n\t  27249 (/usr/lib/libc.so.6)\n";
        let stacks = parse_script(text, 15462);
        assert_eq!(
            stacks,
            vec![
                vec![("/tmp/nofp".into(), 0x1363), ("/tmp/nofp".into(), 0x1389)],
                vec![
                    ("/tmp/nofp".into(), 0x1237),
                    ("/usr/lib/libc.so.6".into(), 0x27249)
                ],
            ]
        );
    }

    #[test]
    fn a_wrong_caller_is_found() {
        let f = |a: u64| ("/x".to_string(), a);
        let perf = vec![vec![f(1), f(10), f(20), f(30)]; 80];
        let good = vec![(vec![f(2), f(10), f(20), f(30)], 100)];
        assert!(compare(&good, &perf).agrees());
        // A wrong step in many samples.
        let bad = vec![(vec![f(2), f(10), f(30)], 100)];
        let d = compare(&bad, &perf);
        assert_eq!(d.unknown_steps.len(), 1);
        assert_eq!(d.missing_steps.len(), 2);
        assert!(!d.agrees());
        // One sample on a path perf did not catch.
        let rare = vec![
            (vec![f(2), f(10), f(20), f(30)], 100),
            (vec![f(2), f(11), f(20), f(30)], 1),
        ];
        assert!(compare(&rare, &perf).agrees());
    }
}

//! From a recording to a symbolized `Profile`.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use profiler_profile::{
    FrameType, Function, LabelText, Labels, Location, Mapping, Profile, ProfileBuilder,
    ProfileKind, Sample,
};
use profiler_runtimes::RuntimeFrames;
use profiler_symbolize::NameSource;
use profiler_symbolize::process::{Process, ProcessTable};
use profiler_symbolize::{Symbolized, Symbolizer};
use profiler_unwind::UserFrame;

use super::{Recording, StackCounts, StackKey, wait};

/// Label keys and values, each allocated once per profile and shared by
/// every sample that carries it; so are whole label lists.
#[derive(Default)]
struct Texts {
    /// Looked up by `&str` (an `Arc<str>` borrows as one): one allocation
    /// per distinct text.
    strings: HashSet<LabelText>,
    numbers: HashMap<u32, LabelText>,
    /// Looked up by slice: one list per thread and label set, not per
    /// stack.
    lists: HashSet<Labels>,
}

impl Texts {
    fn get(&mut self, text: &str) -> LabelText {
        intern(&mut self.strings, text)
    }

    fn list(&mut self, labels: &[(LabelText, LabelText)]) -> Labels {
        intern(&mut self.lists, labels)
    }

    fn number(&mut self, n: u32) -> LabelText {
        self.numbers
            .entry(n)
            .or_insert_with(|| n.to_string().into())
            .clone()
    }
}

/// The one shared copy of `value` in `set`, made on first use.
fn intern<T: ?Sized + Eq + std::hash::Hash>(
    set: &mut HashSet<std::sync::Arc<T>>,
    value: &T,
) -> std::sync::Arc<T>
where
    std::sync::Arc<T>: for<'a> From<&'a T>,
{
    if let Some(shared) = set.get(value) {
        return shared.clone();
    }
    let shared = std::sync::Arc::from(value);
    set.insert(shared.clone());
    shared
}

/// Symbolized addresses between two releases of the mapped pages read
/// for them (`Symbolizer::release_mapped_pages`), in `build_profile`.
const RELEASE_PAGES_EVERY: usize = 16;

/// Locations are per process and address (and whether the address is a
/// return address, which changes what it is looked up as).
#[derive(Hash, PartialEq, Eq)]
enum LocationKey {
    User {
        pid: u32,
        pc: u64,
        lookup_pc: u64,
    },
    Kernel {
        lookup_pc: u64,
    },
    /// A runtime's frame (an interpreter's): its two words.
    Runtime {
        pid: u32,
        first: u64,
        second: u64,
    },
}

/// Mappings are per process and runtime range; the kernel has one.
#[derive(Hash, PartialEq, Eq)]
enum MappingKey {
    User { pid: u32, start: u64 },
    Kernel,
}

/// Symbolizes every distinct address once and builds the profile: one
/// sample per distinct (thread, stack), leaf first, kernel frames before
/// the user frames that entered the kernel.
pub fn build_profile(recording: &mut Recording) -> Profile {
    // The stacks are consumed as they become samples: each one's frames go
    // as soon as its sample holds their locations, so a long recording's
    // stacks and its profile are not both whole in memory at the end (the
    // top of `record`'s peak memory at a high rate).
    let stacks = recording.take_stacks();
    let Recording {
        processes,
        symbolizer,
        runtime_frames,
        started,
        elapsed,
        frequency_hz,
        page_fault_period,
        kind,
        ..
    } = recording;
    let window = ProfileWindow {
        started: *started,
        elapsed: *elapsed,
        frequency_hz: *frequency_hz,
        page_fault_period: *page_fault_period,
        kind: *kind,
    };
    build(
        stacks,
        processes,
        symbolizer,
        runtime_frames,
        &window,
        Some(RELEASE_PAGES_EVERY),
    )
}

/// When and how fast the stacks of a profile were sampled, and what the
/// profile shows.
#[derive(Debug, Clone, Copy)]
pub struct ProfileWindow {
    pub started: SystemTime,
    pub elapsed: Duration,
    pub frequency_hz: u64,
    /// Page faults per page-fault sample (0: none sampled).
    pub page_fault_period: u64,
    pub kind: ProfileKind,
}

impl ProfileWindow {
    /// The profile a sampling configuration records: CPU, or CPU and
    /// off-CPU, or their sum as wall-clock time.
    pub fn kind_for(config: &crate::sampler::SamplingConfig) -> ProfileKind {
        if !config.cpu_clock && config.page_faults.is_some() {
            return ProfileKind::PageFaults;
        }
        match &config.off_cpu {
            None => ProfileKind::Cpu,
            Some(off_cpu) if off_cpu.wall => ProfileKind::Wall,
            Some(_) => ProfileKind::OffCpu,
        }
    }
}

/// Builds a profile of any set of counted stacks (a whole recording, one
/// window of a continuous run, one service's share of it). Stacks given by
/// value are dropped one by one as their samples are made.
pub fn build_profile_of<K: Borrow<StackKey>, C: Borrow<StackCounts>>(
    stacks: impl IntoIterator<Item = (K, C)>,
    processes: &ProcessTable,
    symbolizer: &mut Symbolizer,
    runtime_frames: &mut RuntimeFrames,
    window: &ProfileWindow,
) -> Profile {
    build(stacks, processes, symbolizer, runtime_frames, window, None)
}

/// `release_pages_every`: how many addresses to symbolize between two
/// releases of the pages read for them (None: once, after the last).
fn build<K: Borrow<StackKey>, C: Borrow<StackCounts>>(
    stacks: impl IntoIterator<Item = (K, C)>,
    processes: &ProcessTable,
    symbolizer: &mut Symbolizer,
    runtime_frames: &mut RuntimeFrames,
    window: &ProfileWindow,
    release_pages_every: Option<usize>,
) -> Profile {
    let start_unix_ns = window
        .started
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    // The profile's period: the CPU time one sample stands for, or the
    // page faults.
    let period_ns = if window.kind == ProfileKind::PageFaults {
        window.page_fault_period as i64
    } else {
        crate::sampler::sampling_period(window.frequency_hz).as_nanos() as i64
    };
    let mut builder: ProfileBuilder<LocationKey, MappingKey> =
        ProfileBuilder::new(start_unix_ns, window.elapsed.as_nanos() as i64, period_ns);
    builder.kind(window.kind);

    // Deterministic output: visit stacks in a stable order.
    // Every field of the key is compared, so no two stacks are equal and
    // an unstable sort (which needs no copy of the list, a stable one
    // does) gives one order.
    let mut stacks: Vec<(K, C)> = stacks.into_iter().collect();
    stacks.sort_unstable_by(|(a, _), (b, _)| {
        let (a, b) = (a.borrow(), b.borrow());
        (a.pid, a.tid, &a.user, &a.kernel, &a.labels, a.thread)
            .cmp(&(b.pid, b.tid, &b.user, &b.kernel, &b.labels, b.thread))
    });
    builder.reserve_samples(stacks.len());

    // Resolve every distinct user frame in address order first: frames of
    // one compilation unit then come together, and the DWARF resolver
    // parses each unit once instead of once per visit (its unit cache is
    // small on purpose).
    // (Distinct frames only: every stack's frames at once would be
    // megabytes of repeats.)
    let distinct: HashSet<(u32, u64, u64)> = stacks
        .iter()
        .flat_map(|(key, _)| {
            let key = key.borrow();
            profiler_unwind::frames(&key.user).map(move |f| (key.pid, f.lookup_pc, f.pc))
        })
        .collect();
    let mut frames: Vec<(u32, u64, u64)> = distinct.into_iter().collect();
    frames.sort_unstable();
    let mut resolved: HashMap<(u32, u64, u64), Symbolized> = HashMap::with_capacity(frames.len());
    for (n, (pid, lookup_pc, pc)) in frames.into_iter().enumerate() {
        let symbolized = symbolizer.user(processes.get(pid), pc, lookup_pc);
        resolved.insert((pid, pc, lookup_pc), symbolized);
        // `record`: the pages of debug sections read for the last few
        // addresses go back as we go, not only at the end. The units a
        // large binary's addresses fall in (a debug build's DWARF is tens
        // of MB) counted in the agent's RSS until then, 21 MB at the
        // bench's 6400 samples/s. Re-reading a page is a minor fault from
        // the page cache. Not for `run`'s windows: each release advises
        // every mapping the symbolizer holds, and a long-running agent on
        // a node holds hundreds, every window.
        if release_pages_every.is_some_and(|every| n % every == every - 1) {
            symbolizer.release_mapped_pages();
        }
    }
    // Every user frame is named: the pages of the binaries and debug files
    // read for them go back (they stay in the page cache), so they do not
    // add to the memory the samples and the encoding take next.
    symbolizer.release_mapped_pages();

    let mut texts = Texts::default();
    let own_keys = ["pid", "tid", "comm", "thread"].map(|k| texts.get(k));
    for (key, counts) in stacks {
        let (key, counts) = (key.borrow(), counts.borrow());
        let process = processes.get(key.pid);
        let thread = key.thread_name();
        let comm = process
            .map(|p| p.name.as_str())
            .filter(|name| !name.is_empty())
            .unwrap_or(&thread);
        let [pid, tid, comm_key, thread_key] = own_keys.clone();
        let mut labels = vec![
            (pid, texts.number(key.pid)),
            (tid, texts.number(key.tid)),
            (comm_key, texts.get(comm)),
            (thread_key, texts.get(&thread)),
        ];
        // A Go label never hides the agent's own (pid, comm, ...).
        for (k, v) in key.labels.iter() {
            if !labels.iter().any(|(own, _)| **own == **k) {
                labels.push((texts.get(k), texts.get(v)));
            }
        }
        let kernel: Vec<profiler_unwind::RawFrame> =
            profiler_unwind::kernel_frames(&key.kernel).collect();
        let mut user = Vec::with_capacity(key.user.len());
        for frame in profiler_unwind::user_frames(&key.user) {
            user.push(match frame {
                UserFrame::Native(frame) => user_location(
                    &mut builder,
                    symbolizer,
                    &mut resolved,
                    key.pid,
                    process,
                    frame,
                ),
                UserFrame::Runtime { first, second } => {
                    runtime_location(&mut builder, runtime_frames, key.pid, first, second)
                }
            });
        }
        if window.kind == ProfileKind::Latency {
            // Operations at probe hits: their count and total latency.
            let locations = locations_of(&mut builder, symbolizer, &kernel, &user);
            builder.sample(Sample {
                locations,
                count: counts.samples,
                off_cpu_ns: counts.blocked_ns,
                labels: texts.list(&labels),
                ..Sample::default()
            });
            continue;
        }
        // The page-fault profile counts the page-fault samples; the others
        // the CPU ones.
        let count = if window.kind == ProfileKind::PageFaults {
            counts.page_faults
        } else {
            counts.samples
        };
        if count > 0 {
            let locations = locations_of(&mut builder, symbolizer, &kernel, &user);
            builder.sample(Sample {
                locations,
                count,
                off_cpu_ns: 0,
                labels: texts.list(&labels),
                ..Sample::default()
            });
        }
        if counts.off_cpu_ns() == 0 {
            continue;
        }
        // Off-CPU: tracing frames at the leaf, and the scheduler's own
        // functions, say nothing about why the thread waited. They go (the
        // kernel's stack of a sleeping task, which an interval's kernel
        // stack is, already leaves the latter out).
        let names: Vec<String> = kernel
            .iter()
            .map(|f| {
                symbolizer
                    .kernel_function(f.lookup_pc)
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let tracing = wait::tracing_frames(&names);
        let (mut kept, mut kept_names) = (Vec::new(), Vec::new());
        for (frame, name) in kernel.iter().zip(&names).skip(tracing) {
            if !symbolizer.kernel_in_scheduler(frame.lookup_pc) {
                kept.push(*frame);
                kept_names.push(name.as_str());
            }
        }
        let reason = wait::classify(&kept_names);
        let locations = locations_of(&mut builder, symbolizer, &kept, &user);
        for (ns, reason) in [
            (counts.blocked_ns, reason),
            (counts.runq_ns, wait::WaitReason::RunQueue),
        ] {
            if ns == 0 {
                continue;
            }
            let mut labels = labels.clone();
            labels.push((texts.get("wait"), texts.get(reason.label())));
            builder.sample(Sample {
                locations: locations.clone(),
                count: 0,
                off_cpu_ns: ns,
                labels: texts.list(&labels),
                ..Sample::default()
            });
        }
    }
    builder.finish()
}

/// A stack's locations: its kernel frames' (leaf first), then the user
/// frames' already made.
fn locations_of(
    builder: &mut ProfileBuilder<LocationKey, MappingKey>,
    symbolizer: &mut Symbolizer,
    kernel: &[profiler_unwind::RawFrame],
    user: &[usize],
) -> Vec<usize> {
    let mut locations = Vec::with_capacity(kernel.len() + user.len());
    for &frame in kernel {
        locations.push(kernel_location(builder, symbolizer, frame));
    }
    locations.extend_from_slice(user);
    locations
}

fn kernel_location(
    builder: &mut ProfileBuilder<LocationKey, MappingKey>,
    symbolizer: &mut Symbolizer,
    frame: profiler_unwind::RawFrame,
) -> usize {
    let mapping = builder.mapping(MappingKey::Kernel, || Mapping {
        file: "[kernel.kallsyms]".into(),
        ..Mapping::default()
    });
    builder.widen_mapping(mapping, frame.pc);
    let key = LocationKey::Kernel {
        lookup_pc: frame.lookup_pc,
    };
    builder.location(key, |builder| {
        let symbolized = symbolizer.kernel(frame.lookup_pc);
        if symbolized.resolved {
            builder.mapping_has_functions(mapping);
        }
        location(
            builder,
            symbolized,
            frame.pc,
            Some(mapping),
            FrameType::Kernel,
        )
    })
}

fn user_location(
    builder: &mut ProfileBuilder<LocationKey, MappingKey>,
    symbolizer: &mut Symbolizer,
    resolved: &mut HashMap<(u32, u64, u64), Symbolized>,
    pid: u32,
    process: Option<&Process>,
    frame: profiler_unwind::RawFrame,
) -> usize {
    let key = LocationKey::User {
        pid,
        pc: frame.pc,
        lookup_pc: frame.lookup_pc,
    };
    builder.location(key, |builder| {
        let symbolized = resolved
            .remove(&(pid, frame.pc, frame.lookup_pc))
            .unwrap_or_else(|| symbolizer.user(process, frame.pc, frame.lookup_pc));
        let mapping = process.and_then(|p| p.mapping_for(frame.pc)).map(|m| {
            let index = builder.mapping(
                MappingKey::User {
                    pid,
                    start: m.start,
                },
                || Mapping {
                    start: m.start,
                    limit: m.end,
                    file_offset: m.offset,
                    file: m
                        .path
                        .as_ref()
                        .map_or_else(|| m.name.clone(), |p| p.display().to_string()),
                    build_id: m
                        .object
                        .as_ref()
                        .and_then(|o| symbolizer.build_id(&o.id))
                        .unwrap_or_default(),
                    has_functions: false,
                },
            );
            if symbolized.resolved {
                builder.mapping_has_functions(index);
            }
            index
        });
        // Go code is named by its pclntab: typed as Go's.
        let frame_type = if symbolized
            .frames
            .iter()
            .any(|f| f.source == NameSource::GoPclntab)
        {
            FrameType::Go
        } else {
            FrameType::Native
        };
        location(builder, symbolized, frame.pc, mapping, frame_type)
    })
}

/// The location of a runtime's frame: a function with its file and line,
/// no address, no mapping.
fn runtime_location(
    builder: &mut ProfileBuilder<LocationKey, MappingKey>,
    runtime_frames: &mut RuntimeFrames,
    pid: u32,
    first: u64,
    second: u64,
) -> usize {
    let key = LocationKey::Runtime { pid, first, second };
    builder.location(key, |builder| {
        let frames = runtime_frames.frames(pid, first, second);
        let frame_type = match frames.first().map(|f| f.source) {
            Some(NameSource::Runtime(kind)) => FrameType::Runtime(kind),
            _ => FrameType::Native,
        };
        let symbolized = Symbolized {
            frames,
            resolved: true,
        };
        location(builder, symbolized, 0, None, frame_type)
    })
}

fn location(
    builder: &mut ProfileBuilder<LocationKey, MappingKey>,
    symbolized: Symbolized,
    address: u64,
    mapping: Option<usize>,
    frame_type: FrameType,
) -> Location {
    let lines = symbolized
        .frames
        .into_iter()
        .map(|frame| {
            builder.line(
                Function {
                    name: frame.function,
                    system_name: frame.system_name.unwrap_or_default(),
                    file: frame.file.unwrap_or_default(),
                },
                frame.line.unwrap_or(0),
            )
        })
        .collect();
    Location {
        address,
        mapping,
        lines,
        frame_type,
    }
}

//! The in-memory profile and its encoders.
//!
//! The model is close to pprof's (samples → locations → lines →
//! functions, plus mappings) because pprof is the richest of the formats we
//! write; folded stacks and SVG are views of the same model.

mod builder;
pub mod flamegraph;
pub mod folded;
pub mod otlp;
pub mod pprof;

pub use builder::ProfileBuilder;

/// A sample label's key or value.
pub type LabelText = std::sync::Arc<str>;

/// A sample's string labels, shared: the samples of one thread (pid, tid,
/// comm, thread, its Go labels) hold one list between them instead of
/// a copy each, which at tens of thousands of stacks was megabytes of
/// `record`'s peak memory.
pub type Labels = std::sync::Arc<[(LabelText, LabelText)]>;

use std::path::Path;

/// What a profile's samples measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProfileKind {
    /// CPU samples only: `count` samples of `period_ns` each.
    #[default]
    Cpu,
    /// CPU samples and off-CPU time (`off_cpu_ns`) side by side, as
    /// separate sample types; the off-CPU time is what views show.
    OffCpu,
    /// One wall-clock time per sample: CPU samples converted to time
    /// (`count` × `period_ns`) plus off-CPU time.
    Wall,
    /// Operations at probe hits (`latency --stacks`): `count` operations
    /// began at the stack, and `off_cpu_ns` holds their total latency.
    Latency,
    /// A heap profile, as Go's `runtime/pprof` writes one: each sample's
    /// `values` are allocated objects and bytes, then objects and bytes in
    /// use; `period_ns` holds the sampling rate in bytes.
    Heap,
    /// Goroutines by stack: each sample's `values` is one count.
    Goroutine,
    /// Page faults sampled one in `period_ns` (a count of faults, not
    /// time): where memory is first touched, as `perf record -e
    /// page-faults` samples it. Each sample's `count` samples stand for
    /// `count × period_ns` faults.
    PageFaults,
}

impl ProfileKind {
    /// What views of the profile (folded stacks, SVG) count, and its unit.
    pub fn view_unit(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "samples",
            ProfileKind::OffCpu => "microseconds off-CPU",
            ProfileKind::Wall => "microseconds of wall-clock time",
            ProfileKind::Latency => "microseconds of latency",
            ProfileKind::Heap => "bytes in use",
            ProfileKind::Goroutine => "goroutines",
            ProfileKind::PageFaults => "page faults",
        }
    }
}

/// A profile: counted stacks with their symbols.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub kind: ProfileKind,
    /// Wall-clock start, nanoseconds since the Unix epoch.
    pub start_unix_ns: i64,
    pub duration_ns: i64,
    /// CPU time one sample stands for: 1e9 / frequency. (A heap profile's
    /// period: its sampling rate in bytes; a goroutine profile's: 1.)
    pub period_ns: i64,
    pub mappings: Vec<Mapping>,
    pub functions: Vec<Function>,
    pub locations: Vec<Location>,
    pub samples: Vec<Sample>,
    /// Free-form notes carried into pprof comments.
    pub comments: Vec<String>,
    /// Labels whose values views (folded stacks, SVG) put in front of
    /// each stack as `key=value` frames; pprof keeps every label anyway.
    pub stack_labels: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub limit: u64,
    pub file_offset: u64,
    pub file: String,
    pub build_id: String,
    /// Whether any location in it was symbolized (pprof's has_functions).
    pub has_functions: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: String,
    pub system_name: String,
    pub file: String,
}

/// One physical program counter (or one frame of an interpreter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    pub address: u64,
    /// Index into `Profile::mappings`.
    pub mapping: Option<usize>,
    /// Innermost first: inlined frames, then the function holding the code.
    pub lines: Vec<Line>,
    /// What the frame is: kernel code is drawn with a `_[k]` suffix in
    /// folded stacks; OTLP says it in `profile.frame.type`.
    pub frame_type: FrameType,
}

/// What kind of frame a location is, by what named it: the values of the
/// OpenTelemetry semantic conventions' `profile.frame.type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FrameType {
    #[default]
    Native,
    Kernel,
    /// Go code, named by its pclntab.
    Go,
    /// A frame an interpreter or a JIT's runtime wrote (a Python code
    /// object, a Java method): the runtime's own frame type ("cpython",
    /// "jvm", "v8js").
    Runtime(&'static str),
}

impl FrameType {
    /// Its `profile.frame.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameType::Native => "native",
            FrameType::Kernel => "kernel",
            FrameType::Go => "go",
            FrameType::Runtime(kind) => kind,
        }
    }

    pub fn is_kernel(self) -> bool {
        self == FrameType::Kernel
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Line {
    /// Index into `Profile::functions`.
    pub function: usize,
    /// 0 when unknown.
    pub line: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// Indices into `Profile::locations`, leaf first.
    pub locations: Vec<usize>,
    /// CPU samples.
    pub count: u64,
    /// Nanoseconds off-CPU (blocked or waiting for a CPU); 0 for CPU
    /// samples.
    pub off_cpu_ns: u64,
    /// String labels, e.g. ("pid", "1234"), ("comm", "nginx"). Shared
    /// strings in a shared list: a profile of tens of thousands of stacks
    /// repeats the same few keys and values in every sample, and one
    /// allocation per string, then one list per sample, were most of
    /// `record`'s peak memory.
    pub labels: Labels,
    /// The sample's values for the kinds that have their own (`Heap`,
    /// `Goroutine`); empty for the others, whose values are `count` and
    /// `off_cpu_ns`.
    pub values: Vec<i64>,
    /// Numeric labels: (key, value, unit), e.g. ("bytes", 64, "bytes"), the
    /// object size of a heap sample.
    pub numeric_labels: Vec<(String, i64, String)>,
}

impl Sample {
    /// Adds labels to this sample alone (its list is copied once, not
    /// changed for the samples that share it).
    pub fn add_labels(&mut self, more: impl IntoIterator<Item = (LabelText, LabelText)>) {
        let mut labels = self.labels.to_vec();
        labels.extend(more);
        self.labels = labels.into();
    }

    /// Keeps this sample's labels that `keep` accepts (a copy of its
    /// list, as `add_labels`).
    pub fn retain_labels(&mut self, mut keep: impl FnMut(&(LabelText, LabelText)) -> bool) {
        self.labels = self.labels.iter().filter(|l| keep(l)).cloned().collect();
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }
}

impl Profile {
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// Total off-CPU nanoseconds.
    pub fn total_off_cpu_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.off_cpu_ns).sum()
    }

    /// Wall-clock nanoseconds a sample stands for: its CPU samples as
    /// time, plus its off-CPU time.
    pub fn wall_ns(&self, sample: &Sample) -> u64 {
        sample.count * self.period_ns.max(0) as u64 + sample.off_cpu_ns
    }

    /// What views (folded stacks, SVG) count for a sample, in
    /// `kind.view_unit()`, before rounding: samples, or nanoseconds.
    pub fn view_value(&self, sample: &Sample) -> u64 {
        match self.kind {
            ProfileKind::Cpu => sample.count,
            ProfileKind::OffCpu | ProfileKind::Latency => sample.off_cpu_ns,
            ProfileKind::Wall => self.wall_ns(sample),
            ProfileKind::Heap => sample.values.get(3).copied().unwrap_or(0).max(0) as u64,
            ProfileKind::Goroutine => sample.values.first().copied().unwrap_or(0).max(0) as u64,
            ProfileKind::PageFaults => sample.count * self.period_ns.max(0) as u64,
        }
    }

    /// Turns a sum of `view_value`s into the view's unit (nanoseconds to
    /// microseconds, rounded).
    pub fn view_units(&self, total: u64) -> u64 {
        match self.kind {
            ProfileKind::Cpu
            | ProfileKind::Heap
            | ProfileKind::Goroutine
            | ProfileKind::PageFaults => total,
            ProfileKind::OffCpu | ProfileKind::Wall | ProfileKind::Latency => (total + 500) / 1000,
        }
    }

    /// Frame names of a sample from the root to the leaf, inlined frames
    /// expanded (outermost first within a location).
    pub fn stack_names(&self, sample: &Sample) -> Vec<(&str, bool)> {
        let mut names = Vec::new();
        for &index in sample.locations.iter().rev() {
            let location = &self.locations[index];
            for line in location.lines.iter().rev() {
                names.push((
                    self.functions[line.function].name.as_str(),
                    location.frame_type.is_kernel(),
                ));
            }
        }
        names
    }
}

/// Output formats, chosen from the output file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// gzip-compressed pprof protobuf (`.pb.gz`, `.pprof`).
    Pprof,
    /// Folded stacks, one `comm;root;...;leaf count` line each (`.folded`, `.txt`).
    Folded,
    /// Interactive SVG flame graph (`.svg`).
    FlameGraph,
}

impl Format {
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".pb.gz") || name.ends_with(".pprof") || name.ends_with(".pb") {
            Some(Format::Pprof)
        } else if name.ends_with(".folded") || name.ends_with(".txt") {
            Some(Format::Folded)
        } else if name.ends_with(".svg") {
            Some(Format::FlameGraph)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Folded => "folded stacks",
            Format::FlameGraph => "SVG flame graph",
        }
    }

    /// Encodes `profile` in this format.
    pub fn encode(self, profile: &Profile) -> std::io::Result<Vec<u8>> {
        match self {
            Format::Pprof => pprof::encode_gzip(profile),
            Format::Folded => Ok(folded::encode(profile).into_bytes()),
            Format::FlameGraph => flamegraph::encode(profile),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_follows_the_extension() {
        assert_eq!(
            Format::from_path(Path::new("cpu.pb.gz")),
            Some(Format::Pprof)
        );
        assert_eq!(
            Format::from_path(Path::new("/x/cpu.pprof")),
            Some(Format::Pprof)
        );
        assert_eq!(
            Format::from_path(Path::new("out.folded")),
            Some(Format::Folded)
        );
        assert_eq!(
            Format::from_path(Path::new("out.TXT")),
            Some(Format::Folded)
        );
        assert_eq!(
            Format::from_path(Path::new("flame.svg")),
            Some(Format::FlameGraph)
        );
        assert_eq!(Format::from_path(Path::new("profile.json")), None);
    }
}

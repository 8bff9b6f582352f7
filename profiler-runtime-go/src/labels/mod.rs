//! Go pprof labels on samples: `pprof.Do(ctx, pprof.Labels("endpoint",
//! "/checkout"), ...)` tags the goroutine, and every CPU sample taken while
//! it runs carries the tags, as Go's own `runtime/pprof` profile does.
//!
//! `layout` reads where a binary's runtime keeps goroutines and labels
//! (DWARF, or `versions` for stripped binaries); the `GoLabelRegistry`
//! thread reads it for each Go process the sampler meets and hands it to
//! the BPF program (`GO_PROCESSES`), which copies the running goroutine's
//! labels into the sample; `labels_of` turns them into profile labels,
//! reading the strings the program left in the binary from its file
//! (`strings`), once per distinct block (`cache`).

mod cache;
mod layout;
mod strings;
mod versions;

pub use cache::{LabelCache, LabelSet};
pub use layout::{LabelStorage, LayoutError, LayoutSource, Offsets, RuntimeLayout, read_layout};
pub use strings::{GoStrings, LoadedBinary, Segment, segments_of};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::Sample;
use profiler_common::runtimes::go::{
    GO_LABEL_KEY_BYTES, GO_LABEL_VALUE_BYTES, GoProcess, GoString,
};

use profiler_symbolize::process::{ObjectFile, ObjectId, Process};

use profiler_runtime::worker::{Handler, Worker};

/// What to do with Go labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoLabelsConfig {
    /// Also label each sample with its goroutine's id (`goroutine`):
    /// a value per goroutine, so only on request.
    pub goroutine: bool,
    /// Label keys kept (`*` globs); empty keeps every key. A backend's
    /// cost grows with the distinct values of its labels: continuous
    /// runs name the keys worth keeping.
    pub keys: Vec<String>,
}

impl GoLabelsConfig {
    /// Whether label `key` is kept.
    pub fn keeps(&self, key: &str) -> bool {
        self.keys.is_empty() || self.keys.iter().any(|pattern| glob_match(pattern, key))
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &text[first.len()..];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The label of a goroutine id.
pub const GOROUTINE_LABEL: &str = "goroutine";

/// Appended to a key or value the sampling program cut.
const CUT_MARK: &str = "…";

/// A sample's Go labels as profile labels, sorted by key: the kept ones,
/// and the goroutine id when asked for. Strings the sampling program sent
/// by address are read from the binary (`strings`); a label whose strings
/// cannot be is left out.
pub fn labels_of(
    sample: &Sample,
    config: &GoLabelsConfig,
    strings: Option<&GoStrings>,
) -> Vec<(String, String)> {
    let Some(block) = sample.go_labels() else {
        return Vec::new();
    };
    let mut labels: Vec<(String, String)> = block
        .labels()
        .filter_map(|label| {
            // A string the program copied, or one it sent by address.
            let string = |string: GoString<'_>, len: u32, kept: usize| match string {
                GoString::Copied(bytes) => Some(text((bytes, len as usize > kept))),
                GoString::InBinary(address) => from_binary(strings, sample.pid, address, len, kept),
            };
            let key = string(label.key, label.key_len, GO_LABEL_KEY_BYTES)?;
            let value = string(label.value, label.value_len, GO_LABEL_VALUE_BYTES)?;
            Some((key, value))
        })
        .filter(|(key, _)| !key.is_empty() && config.keeps(key))
        .collect();
    if config.goroutine && block.goid != 0 {
        labels.push((GOROUTINE_LABEL.into(), block.goid.to_string()));
    }
    labels.sort();
    labels.dedup_by(|a, b| a.0 == b.0);
    labels
}

/// A string of `len` bytes at `address` in `pid`'s binary, cut to
/// `kept` bytes as the sampling program cuts the strings it copies.
fn from_binary(
    strings: Option<&GoStrings>,
    pid: u32,
    address: u64,
    len: u32,
    kept: usize,
) -> Option<String> {
    let cut = len as usize > kept;
    let bytes = strings?.read(pid, address, len.min(kept as u32))?;
    Some(text((&bytes, cut)))
}

fn text((bytes, cut): (&[u8], bool)) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if cut {
        text.push_str(CUT_MARK);
    }
    text
}

/// Whether the version table agrees with `layout` (read from DWARF):
/// None when the table has no row for its version.
pub fn table_agrees(layout: &RuntimeLayout) -> Option<bool> {
    let minor = layout.version.as_deref().and_then(layout::minor_of)?;
    versions::offsets(minor).map(|offsets| offsets == layout.offsets)
}

/// What the registry did, for the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoLabelStats {
    /// Go processes whose labels the sampling program reads.
    pub processes: u64,
    /// Layouts read from DWARF / from the version table.
    pub from_dwarf: u64,
    pub from_versions: u64,
    /// Go binaries whose layout is unknown, with why (one line each).
    pub unknown: Vec<String>,
}

enum Command {
    /// A process, its Go binary, and where its executable mapping of it
    /// starts and from which file offset (for the load bias).
    Register(u32, Arc<ObjectFile>, u64, u64),
    Unregister(u32),
    /// Forget the binaries not in the set (no live process maps them).
    Retain(std::collections::HashSet<ObjectId>),
}

/// The thread that reads Go binaries' layouts (DWARF of a large binary
/// takes tens of milliseconds: never on the thread that drains samples)
/// and writes them into the sampling program's `GO_PROCESSES` map.
pub struct GoLabelRegistry {
    worker: Worker<Command>,
    stats: Arc<Mutex<GoLabelStats>>,
    strings: GoStrings,
}

impl GoLabelRegistry {
    pub fn spawn(map: BpfHashMap<MapData, u32, GoProcess>) -> std::io::Result<Self> {
        let stats = Arc::new(Mutex::new(GoLabelStats::default()));
        let strings = GoStrings::default();
        let state = LabelState {
            map,
            layouts: HashMap::new(),
            registered: Default::default(),
            stats: stats.clone(),
            strings: strings.clone(),
        };
        Ok(GoLabelRegistry {
            worker: Worker::spawn("go-labels", state)?,
            stats,
            strings,
        })
    }

    /// The registered processes' binaries, to read the label strings the
    /// sampling program sent by address.
    pub fn strings(&self) -> &GoStrings {
        &self.strings
    }

    /// Reads the labels of `process` from now on, if it runs Go code.
    /// Returns at once.
    pub fn register(&self, process: &Process) {
        let go = process.mappings.iter().find_map(|m| {
            let object = m.object.as_ref()?;
            is_go_object(object).then(|| (object.clone(), m.start, m.offset))
        });
        if let Some((object, start, offset)) = go {
            self.worker
                .send(Command::Register(process.pid, object, start, offset));
        }
    }

    /// Forgets `pid` (it exited).
    pub fn unregister(&self, pid: u32) {
        self.worker.send(Command::Unregister(pid));
    }

    /// Forgets the layouts of the binaries not in `keep`.
    pub fn retain_objects(&self, keep: &std::collections::HashSet<ObjectId>) {
        self.worker.send(Command::Retain(keep.clone()));
    }

    /// Waits until every registration sent so far is done.
    pub fn flush(&self) {
        self.worker.flush();
    }

    pub fn stats(&self) -> GoLabelStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// A test on the file's section names (see `go::is_go_binary`), made
/// once per file: it maps and parses the ELF, on the thread that drains
/// samples, and a node's processes map the same few files (each new
/// process asked it again of its program, libc and the loader).
fn is_go_object(object: &ObjectFile) -> bool {
    *object
        .go_binary
        .get_or_init(|| object.file.as_ref().is_ok_and(super::is_go_binary))
}

/// What the registry reads of a Go binary: its runtime's layout, and
/// its segments.
type BinaryLayout = (GoProcess, Arc<[Segment]>);

/// The registry thread's state: each Go binary's layout and segments,
/// read once.
struct LabelState {
    map: BpfHashMap<MapData, u32, GoProcess>,
    layouts: HashMap<ObjectId, Option<BinaryLayout>>,
    registered: std::collections::HashSet<u32>,
    stats: Arc<Mutex<GoLabelStats>>,
    strings: GoStrings,
}

impl Handler for LabelState {
    type Command = Command;

    fn handle(&mut self, command: Command) {
        match command {
            Command::Register(pid, object, start, offset) => {
                let stats = &self.stats;
                let Some((layout, segments)) = self
                    .layouts
                    .entry(object.id)
                    .or_insert_with(|| read_object(&object, stats))
                else {
                    return;
                };
                let mut process = *layout;
                // Without the binary's read-only range every string is
                // copied, as before there was one.
                if let Some(binary) = LoadedBinary::new(object, segments.clone(), start, offset)
                    && let Some((strings_start, strings_end)) = binary.read_only_range()
                {
                    process.strings_start = strings_start;
                    process.strings_end = strings_end;
                    self.strings.insert(pid, binary);
                }
                if self.map.insert(pid, process, 0).is_ok()
                    && self.registered.insert(pid)
                    && let Ok(mut stats) = self.stats.lock()
                {
                    stats.processes += 1;
                }
            }
            Command::Unregister(pid) => {
                if self.registered.remove(&pid) {
                    let _ = self.map.remove(&pid);
                }
                self.strings.remove(pid);
            }
            Command::Retain(keep) => self.layouts.retain(|id, _| keep.contains(id)),
        }
    }
}

fn read_object(object: &ObjectFile, stats: &Mutex<GoLabelStats>) -> Option<BinaryLayout> {
    let path = object.path.display().to_string();
    let result = match &object.file {
        // SAFETY: a read-only mapping of a file we only read; the parsers
        // bound every length they follow (see symbolize).
        Ok(file) => match unsafe { memmap2::Mmap::map(file) } {
            Ok(data) => read_layout(&data)
                .map(|layout| (layout, read_segments(&data)))
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("mapping it: {e}")),
        },
        Err(e) => Err(e.clone()),
    };
    let mut stats = stats.lock().ok()?;
    match result {
        Ok((layout, segments)) => {
            match layout.source {
                LayoutSource::Dwarf => stats.from_dwarf += 1,
                LayoutSource::VersionTable => stats.from_versions += 1,
            }
            tracing::debug!(
                %path,
                version = layout.version.as_deref().unwrap_or("?"),
                ?layout.offsets,
                ?layout.storage,
                ?layout.source,
                tls = ?layout.tls_g_offset,
                "Go labels layout"
            );
            Some((layout.for_bpf(), segments))
        }
        Err(why) => {
            tracing::info!(%path, "no Go labels for this binary: {why}");
            if stats.unknown.len() < 16 {
                stats.unknown.push(format!("{path}: {why}"));
            }
            None
        }
    }
}

/// The binary's `PT_LOAD` segments (none when it cannot be parsed: its
/// label strings are then all copied).
fn read_segments(data: &[u8]) -> Arc<[Segment]> {
    profiler_symbolize::elf::guard(|| {
        Ok(object::File::parse(data)
            .map(|file| segments_of(&file))
            .unwrap_or_default())
    })
    .unwrap_or_default()
    .into()
}

/// Samples and binaries for the label tests (here and in `cache`).
#[cfg(test)]
pub(super) mod fixtures {
    use super::*;
    use profiler_common::SAMPLE_FLAG_GO_LABELS;
    use profiler_common::runtimes::go::GoLabels;

    /// A labelled sample of `pid` with no frames and an empty block.
    pub fn labelled_sample(pid: u32) -> Box<Sample> {
        // SAFETY: a Sample is plain data; all zeroes is a valid one.
        let mut sample: Box<Sample> = unsafe { Box::new_zeroed().assume_init() };
        sample.pid = pid;
        sample.flags = SAMPLE_FLAG_GO_LABELS;
        sample
    }

    /// The label block of a sample without frames.
    pub fn block(sample: &mut Sample) -> &mut GoLabels {
        // SAFETY: with no frames the block starts at `frames`, inside the
        // sample, 8-byte aligned, and `tail` holds the rest.
        unsafe {
            &mut *(sample as *mut Sample)
                .cast::<u8>()
                .add(Sample::record_len(0))
                .cast::<GoLabels>()
        }
    }

    /// `GoStrings` knowing `pid`'s binary: a file of `bytes` (under
    /// `dir`), one read-only segment loaded at 0x400000.
    pub fn strings_of(dir: &std::path::Path, pid: u32, bytes: &[u8]) -> GoStrings {
        let path = dir.join("service");
        std::fs::write(&path, bytes).unwrap();
        let strings = GoStrings::default();
        register(&strings, &path, pid, bytes.len() as u64);
        strings
    }

    /// Registers the binary at `path` (`size` bytes) for `pid`.
    pub fn register(strings: &GoStrings, path: &std::path::Path, pid: u32, size: u64) {
        let object = Arc::new(ObjectFile::open_path(path).unwrap());
        let segments: Arc<[Segment]> = vec![Segment {
            address: 0x400000,
            file_offset: 0,
            file_size: size,
            writable: false,
        }]
        .into();
        strings.insert(
            pid,
            LoadedBinary::new(object, segments, 0x400000, 0).unwrap(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{block, labelled_sample, strings_of};
    use super::*;

    /// A record with labels some of whose strings were copied and some
    /// sent by address: both read, cut alike, and a label whose address
    /// the binary does not hold left out.
    #[test]
    fn labels_sent_by_address_are_read_from_the_binary() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = vec![0u8; 0x2000];
        bytes[0x1100..0x1104].copy_from_slice(b"gold");
        bytes[0x1200..0x1208].copy_from_slice(b"endpoint");
        bytes[0x1300..0x1300 + 120].fill(b'y');
        let strings = strings_of(dir.path(), 42, &bytes);

        let mut sample = labelled_sample(42);
        let block = block(&mut sample);
        block.push(
            GoString::Copied(b"tier"),
            4,
            GoString::InBinary(0x401100),
            4,
        );
        block.push(
            GoString::InBinary(0x401200),
            8,
            GoString::InBinary(0x401300),
            120,
        );
        block.push(GoString::InBinary(0x900000), 4, GoString::Copied(b"odd"), 3);

        let config = GoLabelsConfig::default();
        assert_eq!(
            labels_of(&sample, &config, Some(&strings)),
            vec![
                ("endpoint".to_string(), format!("{}…", "y".repeat(96))),
                ("tier".to_string(), "gold".to_string()),
            ]
        );
        // Without the binaries, only labels copied whole are left.
        assert_eq!(labels_of(&sample, &config, None), vec![]);
    }

    #[test]
    fn globs_select_keys() {
        let config = GoLabelsConfig {
            goroutine: false,
            keys: vec!["endpoint".into(), "tenant_*".into(), "*_id".into()],
        };
        assert!(config.keeps("endpoint"));
        assert!(config.keeps("tenant_name"));
        assert!(config.keeps("request_id"));
        assert!(!config.keeps("endpoints"));
        assert!(!config.keeps("user"));
        assert!(GoLabelsConfig::default().keeps("anything"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXcYYb"));
        assert!(!glob_match("ab*ba", "aba"));
    }
}

impl profiler_runtime::Registry for GoLabelRegistry {
    fn register(&self, process: &Process) {
        GoLabelRegistry::register(self, process);
    }

    fn unregister(&self, pid: u32) {
        GoLabelRegistry::unregister(self, pid);
    }

    fn retain_objects(&self, keep: &std::collections::HashSet<ObjectId>) {
        GoLabelRegistry::retain_objects(self, keep);
    }

    fn flush(&self) {
        GoLabelRegistry::flush(self);
    }

    fn report(&self, counts: &profiler_runtime::Counts) -> Vec<String> {
        use profiler_common::Counter;
        use profiler_common::runtimes::go::{
            GO_LABEL_KEY_BYTES, GO_LABEL_VALUE_BYTES, MAX_GO_LABELS,
        };
        let g = self.stats();
        if g.processes == 0 && g.unknown.is_empty() {
            return Vec::new();
        }
        let mut lines = vec![format!(
            "Go labels: read in {} processes (layout from DWARF for {} binaries, from the Go \
             version for {}); {} samples caught a goroutine, {} of them with labels cut \
             (over {MAX_GO_LABELS} labels, or a key over {GO_LABEL_KEY_BYTES} / a value over \
             {GO_LABEL_VALUE_BYTES} bytes)",
            g.processes,
            g.from_dwarf,
            g.from_versions,
            counts.kernel(Counter::GoLabelsRead),
            counts.kernel(Counter::GoLabelsCut),
        )];
        lines.extend(
            g.unknown
                .iter()
                .map(|why| format!("no Go labels for {why}")),
        );
        lines
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

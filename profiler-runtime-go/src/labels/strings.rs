//! Label strings read from the Go binary's file rather than copied at
//! each sample.
//!
//! Most label keys, and many values (`"/api/v1/records"`, the numbers
//! `strconv.Itoa` returns below 100), are string constants in the
//! binary's read-only data. The sampling program copies none of those: it
//! writes their address (`GoLabels::in_binary`), and this module reads
//! their bytes from the binary's file, once per string per binary. The
//! four string copies of a two-label sample were about 0.75 µs of a
//! 6.6 µs sample in the kernel (docs/architecture.md, "Measured inside one
//! program").
//!
//! The file is what the process mapped: the bytes of a read-only mapping
//! are the file's. A process that lies (a forged label pointer, a binary
//! rewritten under it) gets wrong labels on its own samples, no more:
//! every read here is bounded by the segment that holds it and by the
//! label's kept length.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use object::{Object, ObjectSegment, SegmentFlags};
use profiler_symbolize::process::{ObjectFile, ObjectId};

/// `PF_W`: a segment the process may write (its data, not constants).
const PF_W: u32 = 2;

/// Page size the loader maps segments at (a mapping's file offset is a
/// multiple of it; 4 KiB on every target we run on).
const PAGE: u64 = 4096;

/// Strings kept before the cache is emptied and starts again: a forged
/// process sending a new address every sample must not grow it without
/// bound.
const MAX_CACHED: usize = 16 * 1024;

/// A `PT_LOAD` segment of a Go binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub address: u64,
    pub file_offset: u64,
    pub file_size: u64,
    pub writable: bool,
}

/// The `PT_LOAD` segments of a parsed ELF file.
pub fn segments_of(file: &object::File<'_>) -> Vec<Segment> {
    file.segments()
        .map(|segment| {
            let (file_offset, file_size) = segment.file_range();
            let writable = match segment.flags() {
                SegmentFlags::Elf { p_flags } => p_flags & PF_W != 0,
                _ => true,
            };
            Segment {
                address: segment.address(),
                file_offset,
                file_size,
                writable,
            }
        })
        .collect()
}

/// One process's Go binary: its segments and where the process loaded
/// them.
#[derive(Clone)]
pub struct LoadedBinary {
    pub object: Arc<ObjectFile>,
    pub segments: Arc<[Segment]>,
    /// Runtime address minus ELF address (0 for Go's default non-PIE
    /// executables).
    pub bias: u64,
}

impl LoadedBinary {
    /// The binary mapped at `mapping_start` from file offset
    /// `mapping_offset` (a page multiple); None when no segment holds that
    /// offset.
    pub fn new(
        object: Arc<ObjectFile>,
        segments: Arc<[Segment]>,
        mapping_start: u64,
        mapping_offset: u64,
    ) -> Option<Self> {
        let address = segments.iter().find_map(|s| {
            // Segments need not start on a page: the mapping holding one
            // starts at the page below, in the file and in memory alike.
            let lead = s.file_offset % PAGE;
            let within = mapping_offset.checked_sub(s.file_offset - lead)?;
            (within < s.file_size.saturating_add(lead))
                .then(|| s.address.wrapping_sub(lead).wrapping_add(within))
        })?;
        Some(LoadedBinary {
            object,
            segments,
            bias: mapping_start.wrapping_sub(address),
        })
    }

    /// The runtime addresses of the read-only data the sampling program
    /// may send by address, `[start, end)`: the hull of the segments the
    /// process cannot write, unless a writable one lies inside it (then
    /// none: every label string is copied).
    pub fn read_only_range(&self) -> Option<(u64, u64)> {
        let read_only = self.segments.iter().filter(|s| !s.writable);
        let start = read_only.clone().map(|s| s.address).min()?;
        let end = read_only
            .map(|s| s.address.saturating_add(s.file_size))
            .max()?;
        let overlaps = self
            .segments
            .iter()
            .filter(|s| s.writable)
            .any(|s| s.address < end && start < s.address.saturating_add(s.file_size.max(1)));
        if overlaps || start >= end {
            return None;
        }
        let (start, end) = (start.wrapping_add(self.bias), end.wrapping_add(self.bias));
        (start < end).then_some((start, end))
    }

    /// The file offset of the `len` bytes at runtime `address`, when one
    /// read-only segment holds them all.
    fn file_offset(&self, address: u64, len: u64) -> Option<u64> {
        let address = address.wrapping_sub(self.bias);
        self.segments.iter().filter(|s| !s.writable).find_map(|s| {
            let within = address.checked_sub(s.address)?;
            (within.checked_add(len)? <= s.file_size).then(|| s.file_offset + within)
        })
    }
}

/// Every registered Go process's binary, and the strings read so far:
/// written by the label registry's thread, read where samples are
/// aggregated.
#[derive(Clone, Default)]
pub struct GoStrings {
    inner: Arc<Mutex<Inner>>,
    /// Bumped after each binary registered or forgotten: what a label
    /// cache decoded before may read differently now (`LabelCache`).
    generation: Arc<AtomicU64>,
}

#[derive(Default)]
struct Inner {
    processes: HashMap<u32, LoadedBinary>,
    /// By (binary, ELF address, bytes kept): what the file holds there.
    cache: HashMap<StringAt, Option<Arc<[u8]>>>,
}

/// A string's place: its binary, ELF address and bytes kept.
type StringAt = (ObjectId, u64, u32);

impl GoStrings {
    pub(super) fn insert(&self, pid: u32, binary: LoadedBinary) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.processes.insert(pid, binary);
        }
        // After the change: a reader that sees the new generation finds
        // the new binary.
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(super) fn remove(&self, pid: u32) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.processes.remove(&pid);
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// How many times the registered binaries changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The first `kept` bytes of the string at `address` of `pid`'s
    /// binary; None when the process is not known or its binary does not
    /// hold them.
    pub fn read(&self, pid: u32, address: u64, kept: u32) -> Option<Arc<[u8]>> {
        let mut inner = self.inner.lock().ok()?;
        let binary = inner.processes.get(&pid)?;
        let id = binary.object.id;
        let key = (id, address.wrapping_sub(binary.bias), kept);
        if let Some(found) = inner.cache.get(&key) {
            return found.clone();
        }
        let read = read_from(binary, address, kept);
        if inner.cache.len() >= MAX_CACHED {
            inner.cache.clear();
        }
        inner.cache.insert(key, read.clone());
        read
    }
}

fn read_from(binary: &LoadedBinary, address: u64, kept: u32) -> Option<Arc<[u8]>> {
    let offset = binary.file_offset(address, u64::from(kept))?;
    let file = binary.object.file.as_ref().ok()?;
    let mut bytes = vec![0u8; kept as usize];
    file.read_exact_at(&mut bytes, offset).ok()?;
    Some(bytes.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(address: u64, file_offset: u64, file_size: u64, writable: bool) -> Segment {
        Segment {
            address,
            file_offset,
            file_size,
            writable,
        }
    }

    /// Segments of a Go 1.19 amd64 executable (`readelf -l`): text, rodata,
    /// data.
    fn go_segments() -> Arc<[Segment]> {
        vec![
            segment(0x400000, 0, 0x9c000, false),
            segment(0x49c000, 0x9c000, 0xa5000, false),
            segment(0x541000, 0x141000, 0x15000, true),
        ]
        .into()
    }

    fn object(path: &std::path::Path) -> Arc<ObjectFile> {
        Arc::new(ObjectFile::open_path(path).unwrap())
    }

    #[test]
    fn the_range_is_the_read_only_segments_where_the_process_loaded_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bin");
        std::fs::write(&path, b"x").unwrap();
        let exec = LoadedBinary::new(object(&path), go_segments(), 0x400000, 0).unwrap();
        assert_eq!(exec.bias, 0);
        assert_eq!(exec.read_only_range(), Some((0x400000, 0x541000)));
        // A position-independent build loaded higher: the text mapping
        // at 0x7f0000401000 holds file offset 0x1000.
        let pie =
            LoadedBinary::new(object(&path), go_segments(), 0x7f00_0040_1000, 0x1000).unwrap();
        assert_eq!(pie.bias, 0x7f00_0000_0000);
        assert_eq!(
            pie.read_only_range(),
            Some((0x7f00_0040_0000, 0x7f00_0054_1000))
        );
        // Data between two read-only segments: no range at all.
        let odd: Arc<[Segment]> = vec![
            segment(0x400000, 0, 0x1000, false),
            segment(0x401000, 0x1000, 0x1000, true),
            segment(0x402000, 0x2000, 0x1000, false),
        ]
        .into();
        let odd = LoadedBinary::new(object(&path), odd, 0x400000, 0).unwrap();
        assert_eq!(odd.read_only_range(), None);
        // An offset no segment holds.
        assert!(LoadedBinary::new(object(&path), go_segments(), 0x400000, 0x900000).is_none());
    }

    #[test]
    fn strings_are_read_from_the_file_within_their_segment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bin");
        let mut bytes = vec![0u8; 0x3000];
        bytes[0x1010..0x1018].copy_from_slice(b"endpoint");
        bytes[0x2ffc..0x3000].copy_from_slice(b"tail");
        std::fs::write(&path, &bytes).unwrap();
        let segments: Arc<[Segment]> = vec![
            segment(0x400000, 0, 0x1000, false),
            segment(0x401000, 0x1000, 0x2000, false),
            segment(0x403000, 0x3000, 0, true),
        ]
        .into();
        // Loaded 0x10000 higher than linked.
        let binary = LoadedBinary::new(object(&path), segments, 0x410000, 0).unwrap();
        let strings = GoStrings::default();
        strings.insert(7, binary);
        assert_eq!(
            strings.read(7, 0x411010, 8).as_deref(),
            Some(&b"endpoint"[..])
        );
        // Cached, and the same answer again.
        assert_eq!(
            strings.read(7, 0x411010, 8).as_deref(),
            Some(&b"endpoint"[..])
        );
        assert_eq!(strings.read(7, 0x412ffc, 4).as_deref(), Some(&b"tail"[..]));
        // Past the segment's end, outside every segment, another pid.
        assert_eq!(strings.read(7, 0x412ffc, 5), None);
        assert_eq!(strings.read(7, 0x500000, 1), None);
        assert_eq!(strings.read(8, 0x411010, 8), None);
        strings.remove(7);
        assert_eq!(strings.read(7, 0x411010, 8), None);
    }
}

//! A Go process's heap profile, read from its memory: the records the
//! runtime keeps for its sampled allocations (`runtime.mbuckets`), turned
//! into the profile `pprof.WriteHeapProfile` would write at that instant.
//!
//! The runtime keeps, per allocation stack and object size, a bucket: a
//! fixed header, the stack (return addresses), then the counts of
//! allocations and frees: `active` (published at the end of a GC) and
//! three `future` cycles (allocations and frees not yet published). What
//! the program's own profile reports for a bucket is `active +
//! future[C % 3]` (C = `mProfCycle >> 1`), or, before any GC published
//! anything, the sum of all four (runtime/mprof.go, `memProfileInternal`).
//! Details and the proof in docs/design/go-runtime-state.md.

use std::collections::{HashMap, HashSet};

use profiler_profile::{Profile, ProfileBuilder, ProfileKind, Sample};

use super::frames::{self, Frame};
use super::layout::{
    BUCKET_ALLNEXT, BUCKET_NSTK, BUCKET_SIZE, BUCKET_STACK, BUCKET_TYPE, MEM_PROFILE,
};
use super::{GoTarget, StateError, globals};
use profiler_runtime::memory::Memory;

/// Most buckets read: a program's distinct allocation sites times sizes
/// are thousands; a list longer than this is forged or corrupt.
pub const MAX_BUCKETS: usize = 1 << 20;

/// Most return addresses kept over all buckets (64 MiB): real heaps
/// have a few million at most; a forged one of a million buckets each
/// of the deepest stack would hold a billion.
pub const MAX_TOTAL_PCS: usize = 1 << 23;

/// Deepest stack a bucket holds: `profstackdepth` is at most 1024, plus
/// the two frames Go 1.26 adds for `mallocgc`.
pub const MAX_STACK: u64 = 1026;

/// One allocation site: its stack and what the program's profile says of
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapRecord {
    /// The bucket's address: a key for the site as long as the process
    /// lives (the runtime never frees or moves a bucket).
    pub address: u64,
    /// Return addresses as the runtime stored them (process addresses),
    /// innermost first; inlined calls have their own (see `stack`).
    pub pcs: Vec<u64>,
    /// The object size the bucket is for.
    pub size: u64,
    pub allocs: u64,
    pub frees: u64,
    pub alloc_bytes: u64,
    pub free_bytes: u64,
}

/// The heap records of one process at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeapSnapshot {
    /// `runtime.MemProfileRate` when read: one sample per this many bytes
    /// allocated, on average (0: profiling off).
    pub rate: i64,
    pub records: Vec<HeapRecord>,
    /// Buckets left out, and why.
    pub skipped: Skipped,
}

/// Buckets left out of a snapshot. Go never frees a bucket, so neither is
/// a race with the program: a malformed one holds an impossible value
/// (a stack of 2^32 frames, a type that is not the memory profile's), as
/// a forged or corrupt runtime would; an unreadable one is not in the
/// process's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    pub malformed: usize,
    pub unreadable: usize,
}

impl Skipped {
    pub fn total(&self) -> usize {
        self.malformed + self.unreadable
    }
}

/// The cycle counts, as read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cycle {
    allocs: u64,
    frees: u64,
    alloc_bytes: u64,
    free_bytes: u64,
}

impl Cycle {
    fn add(self, other: Cycle) -> Cycle {
        Cycle {
            allocs: self.allocs.wrapping_add(other.allocs),
            frees: self.frees.wrapping_add(other.frees),
            alloc_bytes: self.alloc_bytes.wrapping_add(other.alloc_bytes),
            free_bytes: self.free_bytes.wrapping_add(other.free_bytes),
        }
    }

    fn is_zero(self) -> bool {
        self.allocs == 0 && self.frees == 0
    }
}

/// A bucket, read whole.
struct Bucket {
    address: u64,
    pcs: Vec<u64>,
    size: u64,
    /// active, future[0], future[1], future[2].
    cycles: [Cycle; 4],
}

/// Why a bucket list cannot be believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    #[error("bucket {0:#x}: not a memory-profile bucket (type {1})")]
    Type(u64, u64),
    #[error("bucket {0:#x}: a stack of {1} frames (at most {MAX_STACK})")]
    Depth(u64, u64),
    #[error("bucket {0:#x}: unreadable: {1}")]
    Unreadable(u64, String),
    #[error("the bucket list loops back to {0:#x}")]
    Loop(u64),
    #[error("more than {MAX_BUCKETS} buckets")]
    TooMany,
    #[error("more than {MAX_TOTAL_PCS} stack frames over all buckets")]
    TooDeep,
}

/// Reads the memory-profile buckets from the list head `head`: the
/// records `memProfileInternal` would report at cycle `cycle` (the value
/// of `mProfCycle`), each cycle record being `cycle_bytes` long (32, or 16
/// from Go 1.27). The first bucket must read and be of the memory profile
/// (else the head was not `mbuckets`); a later one that does not read is
/// skipped, as the rest of the list is then unreachable.
pub fn read_buckets(
    memory: &impl Memory,
    head: u64,
    cycle: u32,
    cycle_bytes: u64,
) -> Result<(Vec<HeapRecord>, Skipped), BucketError> {
    let mut seen = HashSet::new();
    let mut buckets = Vec::new();
    let mut skipped = Skipped::default();
    let mut frames = 0;
    let mut at = head;
    while at != 0 {
        if !seen.insert(at) {
            return Err(BucketError::Loop(at));
        }
        if buckets.len() >= MAX_BUCKETS {
            return Err(BucketError::TooMany);
        }
        match read_bucket(memory, at, cycle_bytes) {
            Ok((bucket, next)) => {
                frames += bucket.pcs.len();
                if frames > MAX_TOTAL_PCS {
                    return Err(BucketError::TooDeep);
                }
                buckets.push(bucket);
                at = next;
            }
            // The head is what we were told mbuckets is: a wrong address
            // must be an error, not an empty profile.
            Err(e) if buckets.is_empty() => return Err(e),
            Err(BucketError::Unreadable(..)) => {
                skipped.unreadable += 1;
                break;
            }
            Err(_) => {
                skipped.malformed += 1;
                break;
            }
        }
    }
    let index = 1 + (cycle >> 1) as usize % 3;
    let mut records: Vec<Cycle> = buckets
        .iter()
        .map(|b| b.cycles[0].add(b.cycles[index]))
        .collect();
    // No GC has published anything yet: everything counted so far.
    if records.iter().all(|c| c.is_zero()) {
        records = buckets
            .iter()
            .map(|b| b.cycles.iter().fold(Cycle::default(), |sum, &c| sum.add(c)))
            .collect();
    }
    let records = buckets
        .into_iter()
        .zip(records)
        .map(|(bucket, c)| HeapRecord {
            address: bucket.address,
            pcs: bucket.pcs,
            size: bucket.size,
            allocs: c.allocs,
            frees: c.frees,
            alloc_bytes: c.alloc_bytes,
            free_bytes: c.free_bytes,
        })
        .collect();
    Ok((records, skipped))
}

/// Stack depth read with the header in one system call: most buckets
/// hold fewer frames, deeper ones take a second read.
const FIRST_READ_DEPTH: u64 = 32;

/// One bucket and the next one's address.
fn read_bucket(
    memory: &impl Memory,
    at: u64,
    cycle_bytes: u64,
) -> Result<(Bucket, u64), BucketError> {
    let unreadable = |e: std::io::Error| BucketError::Unreadable(at, e.to_string());
    // The header and (usually) all the rest at once; near the end of a
    // mapping, the header alone.
    let first = BUCKET_STACK + FIRST_READ_DEPTH * 8 + 4 * cycle_bytes;
    let mut bytes = match memory.bytes(at, first as usize) {
        Ok(bytes) => bytes,
        Err(_) => memory
            .bytes(at, BUCKET_STACK as usize)
            .map_err(unreadable)?,
    };
    let word = |bytes: &[u8], offset: u64| {
        let o = offset as usize;
        u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
    };
    let kind = word(&bytes, BUCKET_TYPE);
    if kind != MEM_PROFILE {
        return Err(BucketError::Type(at, kind));
    }
    let depth = word(&bytes, BUCKET_NSTK);
    if depth > MAX_STACK {
        return Err(BucketError::Depth(at, depth));
    }
    let size = word(&bytes, BUCKET_SIZE);
    let next = word(&bytes, BUCKET_ALLNEXT);
    // The stack and the four cycle records follow the header.
    let whole = (BUCKET_STACK + depth * 8 + 4 * cycle_bytes) as usize;
    if bytes.len() < whole {
        let rest = memory
            .bytes(at.wrapping_add(bytes.len() as u64), whole - bytes.len())
            .map_err(unreadable)?;
        bytes.extend_from_slice(&rest);
    }
    let body = &bytes[BUCKET_STACK as usize..whole];
    let words: Vec<u64> = body
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect();
    let (pcs, counts) = words.split_at(depth as usize);
    let per = (cycle_bytes / 8) as usize;
    let mut cycles = [Cycle::default(); 4];
    for (i, cycle) in cycles.iter_mut().enumerate() {
        let c = &counts[i * per..(i + 1) * per];
        *cycle = if per >= 4 {
            Cycle {
                allocs: c[0],
                frees: c[1],
                alloc_bytes: c[2],
                free_bytes: c[3],
            }
        } else {
            // Go 1.27 keeps counts only: the bytes are counts times the
            // bucket's object size.
            Cycle {
                allocs: c[0],
                frees: c[1],
                alloc_bytes: c[0].wrapping_mul(size),
                free_bytes: c[1].wrapping_mul(size),
            }
        };
    }
    Ok((
        Bucket {
            address: at,
            pcs: pcs.to_vec(),
            size,
            cycles,
        },
        next,
    ))
}

impl GoTarget {
    /// The process's heap records now, as its own `WriteHeapProfile` would
    /// report them.
    pub fn heap(&self) -> Result<HeapSnapshot, StateError> {
        let rate_at = self.address(globals::MEM_PROFILE_RATE)?;
        // Linked out, and not turned on since (`set_mem_profile_rate`).
        if !self.memory_profiling && self.u64(rate_at, "runtime.MemProfileRate")? == 0 {
            return Err(StateError::ProfilingDisabled {
                pid: self.pid,
                path: self.path.clone(),
            });
        }
        let cycle_bytes =
            super::layout::RuntimeLayout::mem_cycle_bytes_of(self.minor).ok_or_else(|| {
                StateError::UnknownVersion {
                    pid: self.pid,
                    version: self.version.clone(),
                    what: "its heap records' layout is not known",
                }
            })?;
        let head_at = self.address(globals::MBUCKETS)?;
        let cycle_at = self.address(globals::MPROF_CYCLE)?;
        // A GC publishing counts while we read moves the cycle: read again.
        let mut last = None;
        for _ in 0..3 {
            let cycle = self.u32(cycle_at, "runtime.mProfCycle")?;
            let head = self.u64(head_at, "runtime.mbuckets")?;
            let (records, skipped) = read_buckets(&self.memory, head, cycle, cycle_bytes)
                .map_err(|e| self.read_error("the heap profile's buckets (runtime.mbuckets)", e))?;
            let rate = self.u64(rate_at, "runtime.MemProfileRate")? as i64;
            let snapshot = HeapSnapshot {
                rate,
                records,
                skipped,
            };
            if self.u32(cycle_at, "runtime.mProfCycle")? == cycle {
                return Ok(snapshot);
            }
            last = Some(snapshot);
        }
        Ok(last.expect("three reads"))
    }

    /// Sets the process's `runtime.MemProfileRate` to `rate` (bytes
    /// between sampled allocations; 0 stops sampling) and returns the
    /// previous value. This changes the program: from now on its runtime
    /// records one allocation per `rate` bytes; what it allocated before
    /// stays unrecorded.
    pub fn set_mem_profile_rate(&self, rate: u64) -> Result<u64, StateError> {
        let at = self.address(globals::MEM_PROFILE_RATE)?;
        let previous = self.u64(at, "runtime.MemProfileRate")?;
        self.memory
            .write(at, &rate.to_le_bytes())
            .map_err(|e| self.read_error("writing runtime.MemProfileRate", e))?;
        Ok(previous)
    }

    fn u32(&self, address: u64, what: &str) -> Result<u32, StateError> {
        self.memory
            .u32(address)
            .map_err(|e| self.read_error(what, format!("{address:#x}: {e}")))
    }
}

/// `scaleHeapSample` (runtime/pprof/protomem.go): a sampled count and its
/// bytes, scaled to estimate all allocations — each object of `size`
/// bytes was sampled with probability 1 − e^(−size/rate).
pub fn scale(count: u64, bytes: u64, rate: i64) -> (i64, i64) {
    if count == 0 || bytes == 0 {
        return (0, 0);
    }
    if rate <= 1 {
        return (count as i64, bytes as i64);
    }
    let average = bytes as f64 / count as f64;
    let s = 1.0 / (1.0 - (-average / rate as f64).exp());
    ((count as f64 * s) as i64, (bytes as f64 * s) as i64)
}

/// What a heap sample counts, before scaling: objects and bytes
/// allocated (since the process started, or in a window), and in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapCounts {
    pub alloc_objects: u64,
    pub alloc_bytes: u64,
    pub inuse_objects: u64,
    pub inuse_bytes: u64,
}

impl HeapRecord {
    /// Everything since the process started, in use now.
    pub fn counts(&self) -> HeapCounts {
        HeapCounts {
            alloc_objects: self.allocs,
            alloc_bytes: self.alloc_bytes,
            inuse_objects: self.allocs.saturating_sub(self.frees),
            inuse_bytes: self.alloc_bytes.saturating_sub(self.free_bytes),
        }
    }
}

/// The profile `pprof.WriteHeapProfile` would write: per record, the
/// allocated and in-use objects and bytes (scaled), the object size as the
/// numeric label `bytes`, and the stack without the allocator's frames.
pub fn heap_profile(target: &GoTarget, snapshot: &HeapSnapshot, start_unix_ns: i64) -> Profile {
    let mut builder = HeapProfileBuilder::new(start_unix_ns, 0, snapshot.rate);
    for record in &snapshot.records {
        builder.add(target, snapshot.rate, record, record.counts());
    }
    builder.comment(format!(
        "heap profile of process {} ({}, {}) read from its memory by profiler-agent",
        target.pid, target.path, target.version
    ));
    if snapshot.skipped.total() > 0 {
        builder.comment(format!(
            "{} heap records malformed (impossible values) and {} unreadable: missing",
            snapshot.skipped.malformed, snapshot.skipped.unreadable
        ));
    }
    builder.finish()
}

/// One heap profile from the records of one process or several (a
/// service's), each sample labelled with its `pid`.
pub struct HeapProfileBuilder {
    builder: ProfileBuilder<(u32, u64), u32>,
    names: HashMap<(u32, u64), Named>,
}

impl HeapProfileBuilder {
    /// `rate`: the period the profile states (the processes' sampling
    /// rate; each sample is scaled by its own process's).
    pub fn new(start_unix_ns: i64, duration_ns: i64, rate: i64) -> Self {
        let mut builder = ProfileBuilder::new(start_unix_ns, duration_ns, rate);
        builder.kind(ProfileKind::Heap);
        HeapProfileBuilder {
            builder,
            names: HashMap::new(),
        }
    }

    /// A sample of `record`'s site with `counts`, scaled at `rate`.
    pub fn add(&mut self, target: &GoTarget, rate: i64, record: &HeapRecord, counts: HeapCounts) {
        let (alloc_objects, alloc_space) = scale(counts.alloc_objects, counts.alloc_bytes, rate);
        let (inuse_objects, inuse_space) = scale(counts.inuse_objects, counts.inuse_bytes, rate);
        let mapping = self
            .builder
            .mapping(target.pid, || super::executable_mapping(target));
        let locations = stack(
            target,
            &mut self.builder,
            &mut self.names,
            mapping,
            &record.pcs,
        );
        self.builder.sample(Sample {
            locations,
            values: vec![alloc_objects, alloc_space, inuse_objects, inuse_space],
            numeric_labels: vec![("bytes".into(), record.size as i64, "bytes".into())],
            labels: vec![("pid".into(), target.pid.to_string().into())].into(),
            ..Sample::default()
        });
    }

    pub fn comment(&mut self, comment: impl Into<String>) {
        self.builder.comment(comment);
    }

    pub fn finish(self) -> Profile {
        self.builder.finish()
    }
}

/// A process's heap over time: what each site had allocated at the last
/// look, so that the next look reports the allocations in between (as
/// continuous profilers show `alloc_*`), and what is in use now.
#[derive(Debug, Default)]
pub struct HeapHistory {
    /// Bucket address → (objects, bytes) allocated, cumulative.
    previous: HashMap<u64, (u64, u64)>,
    looked: bool,
}

impl HeapHistory {
    /// The counts of `snapshot`'s records for the window since the last
    /// call: allocations in between (none on the first call, which has
    /// nothing to compare with), in use now.
    pub fn advance(&mut self, snapshot: &HeapSnapshot) -> Vec<HeapCounts> {
        let first = !self.looked;
        self.looked = true;
        let mut next = HashMap::with_capacity(snapshot.records.len());
        let counts = snapshot
            .records
            .iter()
            .map(|record| {
                let mut counts = record.counts();
                let before = self.previous.get(&record.address).copied();
                next.insert(record.address, (record.allocs, record.alloc_bytes));
                match (first, before) {
                    (true, _) => {
                        counts.alloc_objects = 0;
                        counts.alloc_bytes = 0;
                    }
                    // A site seen before: what it allocated since.
                    (false, Some((objects, bytes))) => {
                        counts.alloc_objects = record.allocs.saturating_sub(objects);
                        counts.alloc_bytes = record.alloc_bytes.saturating_sub(bytes);
                    }
                    // A new site: all of it is new.
                    (false, None) => {}
                }
                counts
            })
            .collect();
        self.previous = next;
        counts
    }
}

/// A bucket's stack as locations, leaf first. Each stored PC is one
/// logical frame: a return address, or for a call inlined there the
/// address just past its inline mark. The allocator's own frames at the
/// top are left out as `runtime/pprof` does (unless nothing else is
/// left), and `runtime.goexit` always; then the PCs of one physical frame
/// become one location with a line per inlined call, as in the program's
/// own profile.
fn stack(
    target: &GoTarget,
    builder: &mut ProfileBuilder<(u32, u64), u32>,
    names: &mut HashMap<(u32, u64), Named>,
    mapping: usize,
    pcs: &[u64],
) -> Vec<usize> {
    // Heaps repeat their PCs (a hundred thousand stacks through a few
    // hundred call sites): each is named once per profile.
    let named: Vec<(u64, Named)> = pcs
        .iter()
        .map(|&pc| {
            let named = names
                .entry((target.pid, pc))
                .or_insert_with(|| Named {
                    frames: frames::at_return_address(target, pc).into(),
                    entry: target
                        .symbols
                        .function(target.link_address(pc).wrapping_sub(1))
                        .map(|f| f.entry()),
                })
                .clone();
            (pc, named)
        })
        .filter(|(_, named)| {
            named
                .frames
                .first()
                .is_none_or(|f| f.function != "runtime.goexit")
        })
        .collect();
    let is_runtime = |frames: &[Frame]| {
        frames.first().is_some_and(|f| {
            let name = f.system_name.as_deref().unwrap_or(&f.function);
            name.starts_with("runtime.") || name.starts_with("internal/runtime/")
        })
    };
    let first_user = named
        .iter()
        .position(|(_, n)| !is_runtime(&n.frames))
        .unwrap_or(0);
    let mut locations = Vec::new();
    let mut i = first_user;
    while i < named.len() {
        let (pc, this) = &named[i];
        let address = pc.wrapping_sub(1);
        locations.push(frames::location(
            builder,
            (target.pid, address),
            mapping,
            address,
            &this.frames,
        ));
        // The next PCs (in the same function) name the callers this one
        // was inlined into: they are lines of this location already.
        let mut next = i + 1;
        while next < named.len()
            && next < i + this.frames.len()
            && this.entry.is_some()
            && named[next].1.entry == this.entry
        {
            next += 1;
        }
        i = next;
    }
    locations
}

/// A return address's frames and its function's entry, looked up once.
#[derive(Clone)]
struct Named {
    frames: std::sync::Arc<[Frame]>,
    entry: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_runtime::memory::ImageMemory;

    /// A bucket at `at` with `pcs` and cycles, as Go 1.21 lays it out.
    fn bucket(at: u64, next: u64, pcs: &[u64], size: u64, cycles: [[u64; 4]; 4]) -> (u64, Vec<u8>) {
        let mut bytes = Vec::new();
        for word in [0, next, MEM_PROFILE, 0xabc, size, pcs.len() as u64] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        for pc in pcs {
            bytes.extend_from_slice(&pc.to_le_bytes());
        }
        for cycle in cycles {
            for word in cycle {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
        }
        (at, bytes)
    }

    fn image(parts: &[(u64, Vec<u8>)]) -> ImageMemory {
        let base = 0x1000;
        let mut bytes = vec![0u8; 0x1000];
        for (at, part) in parts {
            let o = (at - base) as usize;
            bytes[o..o + part.len()].copy_from_slice(part);
        }
        ImageMemory { base, bytes }
    }

    #[test]
    fn records_are_active_plus_the_current_future_cycle() {
        let memory = image(&[
            bucket(
                0x1000,
                0x1200,
                &[0x401001, 0x402002],
                64,
                [
                    [10, 4, 640, 256],
                    [1, 0, 64, 0],
                    [0, 0, 0, 0],
                    [2, 0, 128, 0],
                ],
            ),
            bucket(
                0x1200,
                0,
                &[0x403003],
                16,
                [[5, 5, 80, 80], [0; 4], [0; 4], [0; 4]],
            ),
        ]);
        // Cycle 2 (flag bit clear): future[2 % 3] is added.
        let (records, skipped) = read_buckets(&memory, 0x1000, 2 << 1, 32).unwrap();
        assert_eq!(skipped.total(), 0);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].pcs, vec![0x401001, 0x402002]);
        assert_eq!((records[0].allocs, records[0].alloc_bytes), (12, 768));
        assert_eq!((records[1].allocs, records[1].frees), (5, 5));
    }

    #[test]
    fn before_any_gc_every_cycle_counts() {
        let memory = image(&[bucket(
            0x1000,
            0,
            &[0x401001],
            32,
            [[0; 4], [0; 4], [2, 0, 64, 0], [3, 1, 96, 32]],
        )]);
        // Cycle 0: active + future[0] is zero for every bucket.
        let (records, _) = read_buckets(&memory, 0x1000, 0, 32).unwrap();
        assert_eq!((records[0].allocs, records[0].frees), (5, 1));
        assert_eq!(records[0].alloc_bytes, 160);
    }

    #[test]
    fn go_1_27_counts_make_bytes_from_the_size() {
        let mut bytes = Vec::new();
        for word in [
            0u64,
            0,
            MEM_PROFILE,
            0,
            48,
            1,
            0x401001,
            7,
            2,
            0,
            0,
            0,
            0,
            0,
            0,
        ] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        let memory = image(&[(0x1000, bytes)]);
        let (records, _) = read_buckets(&memory, 0x1000, 1, 16).unwrap();
        assert_eq!((records[0].alloc_bytes, records[0].free_bytes), (336, 96));
    }

    #[test]
    fn forged_lists_are_refused() {
        // A loop.
        let memory = image(&[bucket(0x1000, 0x1000, &[1], 8, [[1, 0, 8, 0]; 4])]);
        assert_eq!(
            read_buckets(&memory, 0x1000, 0, 32),
            Err(BucketError::Loop(0x1000))
        );
        // Not a bucket of the memory profile: a wrong mbuckets.
        let (at, mut bytes) = bucket(0x1000, 0, &[1], 8, [[0; 4]; 4]);
        bytes[16] = 2;
        assert!(matches!(
            read_buckets(&image(&[(at, bytes)]), 0x1000, 0, 32),
            Err(BucketError::Type(0x1000, 2))
        ));
        // A depth past the bound.
        let (at, mut bytes) = bucket(0x1000, 0, &[1], 8, [[0; 4]; 4]);
        bytes[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            read_buckets(&image(&[(at, bytes)]), 0x1000, 0, 32),
            Err(BucketError::Depth(..))
        ));
        // A later bucket out of memory: skipped as unreadable, the rest
        // kept.
        let memory = image(&[bucket(0x1000, 0xdead_0000, &[1], 8, [[1, 0, 8, 0]; 4])]);
        let (records, skipped) = read_buckets(&memory, 0x1000, 0, 32).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(
            skipped,
            Skipped {
                malformed: 0,
                unreadable: 1
            }
        );
        // A later bucket claiming 2^32 frames: malformed, not a race.
        let (first, first_bytes) = bucket(0x1000, 0x1400, &[1], 8, [[1, 0, 8, 0]; 4]);
        let (second, mut second_bytes) = bucket(0x1400, 0, &[1], 8, [[1, 0, 8, 0]; 4]);
        second_bytes[40..48].copy_from_slice(&(1u64 << 32).to_le_bytes());
        let memory = image(&[(first, first_bytes), (second, second_bytes)]);
        let (records, skipped) = read_buckets(&memory, 0x1000, 0, 32).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(
            skipped,
            Skipped {
                malformed: 1,
                unreadable: 0
            }
        );
    }

    fn record(address: u64, allocs: u64, frees: u64) -> HeapRecord {
        HeapRecord {
            address,
            pcs: vec![0x401001],
            size: 16,
            allocs,
            frees,
            alloc_bytes: allocs * 16,
            free_bytes: frees * 16,
        }
    }

    #[test]
    fn windows_report_what_was_allocated_in_them_and_what_is_in_use() {
        let mut history = HeapHistory::default();
        let snapshot = |records| HeapSnapshot {
            rate: 1,
            records,
            skipped: Skipped::default(),
        };
        // The first look has nothing to compare with: in use only.
        let first = history.advance(&snapshot(vec![record(0x10, 100, 40)]));
        assert_eq!((first[0].alloc_objects, first[0].inuse_objects), (0, 60));
        // Then: the allocations since, a new site whole.
        let second = history.advance(&snapshot(vec![record(0x20, 5, 0), record(0x10, 130, 100)]));
        assert_eq!(second[0].alloc_objects, 5);
        assert_eq!((second[1].alloc_objects, second[1].alloc_bytes), (30, 480));
        assert_eq!(second[1].inuse_bytes, 30 * 16);
    }

    #[test]
    fn scaling_matches_the_runtime() {
        assert_eq!(scale(0, 0, 512 * 1024), (0, 0));
        assert_eq!(scale(3, 96, 1), (3, 96));
        // 1 object of 512 KiB at rate 512 KiB: s = 1/(1-e^-1) = 1.58197...
        assert_eq!(scale(1, 524288, 524288), (1, 829411));
    }
}

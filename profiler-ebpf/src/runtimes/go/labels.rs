//! The running goroutine's pprof labels and id, at a CPU sample of a Go
//! process (see `profiler_common::runtimes::go`).
//!
//! The goroutine is the thread's `m.curg`: reached from the g register
//! when it holds a g of this thread (Go code: R14 on amd64, X28 on arm64;
//! checked by asking that g's m whether it is its current or its g0), and
//! otherwise from thread-local storage (amd64 keeps g there in every
//! program: it is right in C code called through cgo, in the vDSO and in
//! system calls too). On the scheduler's own stack with no goroutine to
//! run, `curg` is nil and the sample has no labels.

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_probe_read_user as read_user_raw},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    Counter,
    runtimes::go::{
        GO_LABEL_KEY_BYTES, GO_LABEL_VALUE_BYTES, GO_LABELS_CUT, GO_LABELS_LAST_ENTRY,
        GO_LABELS_MAP, GO_LABELS_OFFSET_MASK, GO_LABELS_ROOM, GO_LABELS_SLICE, GO_PROCESS_TLS,
        GoLabels, GoProcess, MAX_GO_LABELS, MAX_GO_PROCESSES, key_in_binary, value_in_binary,
    },
};

use crate::{bump, machine};

/// Set by the loader: non-zero reads Go labels. A read-only global, so
/// the verifier drops the whole path when it is off.
#[unsafe(no_mangle)]
static GO_LABELS: u8 = 0;

/// Go processes and where their runtime keeps goroutines and labels,
/// written by user space when it finds a process's Go binary.
#[map]
static GO_PROCESSES: HashMap<u32, GoProcess> = HashMap::with_max_entries(MAX_GO_PROCESSES, 0);

/// `map[string]string` buckets (runtime/map.go, Go 1.19 to 1.23): eight
/// tophash bytes, eight 16-byte keys, eight 16-byte values, the overflow
/// pointer. A slot is in use when its tophash is at least minTopHash (5).
const BUCKET_SLOTS: u64 = 8;
const BUCKET_KEYS: u64 = 8;
const BUCKET_VALUES: u64 = BUCKET_KEYS + BUCKET_SLOTS * 16;
const BUCKET_BYTES: u64 = BUCKET_VALUES + BUCKET_SLOTS * 16 + 8;
const MIN_TOP_HASH: u8 = 5;
/// Buckets read: maps of up to 13 labels (B = 1). Growing from one
/// bucket to two finishes within the insert that starts it; larger maps
/// may be left half grown (they are never written again), and whatever
/// was not reached is marked cut.
const MAX_BUCKETS: u64 = 2;
/// Bytes of one label in a Go 1.24 list: two strings.
const LIST_ENTRY_BYTES: u64 = 32;

/// Words of `LABEL_READS`: room for the run of g from the first field read
/// to the last (320 bytes in every Go version from 1.19 to 1.27), a map
/// bucket (272 bytes) or a whole label list (`MAX_GO_LABELS` entries).
const READ_WORDS: usize = 64;
const READ_BYTES: u64 = (READ_WORDS * 8) as u64;
const _: () = assert!(BUCKET_BYTES < READ_BYTES);
const _: () = assert!(MAX_GO_LABELS as u64 * LIST_ENTRY_BYTES < READ_BYTES);
const _: () = assert!(MAX_GO_LABELS.is_power_of_two());

/// Where a run of user memory (a run of g, a bucket, a label list) is
/// copied with one helper call instead of one per field: 9 calls instead
/// of 15 for a Go 1.19 goroutine with two labels, 0.86-0.89x the reader's
/// time (docs/architecture.md, "Measured inside one program"). One slot
/// per kind of program that reads labels: a CPU sample can interrupt an
/// off-CPU program on the same CPU.
#[map]
static LABEL_READS: PerCpuArray<[u64; READ_WORDS]> = PerCpuArray::with_max_entries(2, 0);

/// `read`'s slot of `LABEL_READS`: the CPU sampling program's.
pub const READS_SAMPLING: u32 = 0;
/// `read`'s slot of `LABEL_READS`: the off-CPU programs'.
pub const READS_OFF_CPU: u32 = 1;

/// Whether labels are read at all.
#[inline(always)]
pub fn enabled() -> bool {
    // SAFETY: reading a read-only global the loader initialised.
    unsafe { core::ptr::read_volatile(&GO_LABELS) != 0 }
}

/// Writes the labels of the goroutine running on this thread of `pid`
/// into `block`, right after the record's last frame: their length, or
/// None (not a Go process, or no goroutine running), and then `block` was
/// not written. `slot` is the caller's `READS_*` slot of `LABEL_READS`.
/// Straight into the record: gathering them in a scratch
/// block first and copying it after cost a few more cold cache lines and
/// a copy per sample.
///
/// # Safety
/// `block` must point to a writable `GoLabels` (the record's `tail`
/// leaves room for one after any number of frames) that no other program
/// writes while this one runs (each program context has its own record).
#[inline(always)]
pub unsafe fn read(pid: u32, g: u64, block: *mut GoLabels, slot: u32) -> Option<usize> {
    let len = profiler_go_labels(pid, g, block, slot);
    // SAFETY: a local; the volatile read keeps the compiler, which sees
    // the function's body, from folding the bounds check away: the
    // verifier knows nothing of a global function's result.
    let len = unsafe { core::ptr::read_volatile(&len) };
    if len < 0 || len as usize > core::mem::size_of::<GoLabels>() {
        return None;
    }
    Some(len as usize)
}

/// `read` as a global function (exported to bpf-linker by profiler-bpf's
/// build, so its BTF linkage stays global): the length written, or -1.
/// The kernel verifies it once, on its own, so its branches (each
/// label's strings, each in the binary or copied) do not multiply the
/// states of the program that calls it, and its locals are off the
/// program's stack: inline, they took the sampling program to 352 bytes,
/// which with the walk's loop callback and step came to 544 of the 512
/// bytes arm64's 6.1 kernel allows (`profiler_bpf::stack_budget`).
#[inline(never)]
#[unsafe(no_mangle)]
pub(crate) extern "C" fn profiler_go_labels(
    pid: u32,
    g: u64,
    block: *mut GoLabels,
    slot: u32,
) -> i64 {
    if block.is_null() {
        return -1;
    }
    // SAFETY: the caller's promise (`read`), checked for null above.
    match unsafe { read_labels(pid, g, block, slot) } {
        Some(len) => len as i64,
        None => -1,
    }
}

/// `read`'s body.
///
/// # Safety
/// As `read`.
#[inline(always)]
unsafe fn read_labels(pid: u32, g: u64, block: *mut GoLabels, slot: u32) -> Option<usize> {
    // SAFETY: read in place: a copy cost the off-CPU program stack it does
    // not have. The values are offsets for checked reads of user memory:
    // an entry user space rewrites meanwhile misdirects only those.
    let process = unsafe { GO_PROCESSES.get(&pid) }?;
    // SAFETY: this CPU's slot for the caller's kind of program, which
    // does not nest in itself on one CPU.
    let words = unsafe { &mut *LABEL_READS.get_ptr_mut(slot)? };
    let curg = current_goroutine(process, g, words)?;
    // SAFETY: the caller's promise.
    let labels = unsafe { &mut *block };
    labels.goid = curg.goid;
    labels.count = 0;
    labels.flags = 0;
    labels.entries_len = 0;
    labels.in_binary = 0;
    let strings = Strings {
        start: process.strings_start,
        end: process.strings_end,
    };
    if plausible(curg.labels) {
        match process.kind {
            GO_LABELS_MAP => copy_map(labels, &strings, curg.labels, words),
            GO_LABELS_SLICE => copy_slice(labels, &strings, curg.labels, words),
            _ => {}
        }
    }
    bump(Counter::GoLabelsRead);
    if labels.flags & GO_LABELS_CUT != 0 {
        bump(Counter::GoLabelsCut);
    }
    Some(GoLabels::HEADER_LEN + (labels.entries_len as usize).min(GO_LABELS_ROOM))
}

/// The fields of a g the labels need.
struct GFields {
    m: u64,
    goid: u64,
    labels: u64,
}

/// `g.m`, `g.goid` and `g.labels` of `g`: one copy of the run of g that
/// holds all three (into `words`), or three reads where the offsets are
/// not a short aligned run (a layout read from a hostile binary's DWARF).
/// None when `g.m` cannot be read; a goid or labels pointer that cannot
/// be is 0.
#[inline(always)]
fn g_fields(process: &GoProcess, words: &mut [u64; READ_WORDS], g: u64) -> Option<GFields> {
    let (m, goid, labels) = (
        process.g_m as u64,
        process.g_goid as u64,
        process.g_labels as u64,
    );
    let low = m.min(goid).min(labels);
    let span = m.max(goid).max(labels) + 8 - low;
    if (m | goid | labels) & 7 != 0 || span >= READ_BYTES {
        return Some(GFields {
            m: read_word(g + m)?,
            goid: read_word(g + goid).unwrap_or(0),
            labels: read_word(g + labels).unwrap_or(0),
        });
    }
    // Masked: the verifier sees the bound of the size it is given.
    if !read_run(words, span & (READ_BYTES - 1), g + low) {
        return None;
    }
    let at = |offset: u64| {
        words
            .get(((offset - low) >> 3) as usize & (READ_WORDS - 1))
            .copied()
            .unwrap_or(0)
    };
    Some(GFields {
        m: at(m),
        goid: at(goid),
        labels: at(labels),
    })
}

/// The fields of the thread's current goroutine (its m's `curg`):
/// through the g register when it holds one of this thread's gs, else
/// through thread-local storage.
///
/// A g is a heap object, or m0's g0 (a global): 8-byte aligned. Assembly
/// that uses the g register for data (amd64's SHA-256 keeps hash words in
/// R14) leaves values there that are not, and reading one as a g mostly
/// faults: 2.6 µs a time, against 0.45 µs for finding a real g (timed
/// inside the program on the Go service, where 6.5% of labelled samples
/// met such a value and two thirds of those were misaligned). So a
/// misaligned register is not tried.
#[inline(always)]
fn current_goroutine(
    process: &GoProcess,
    g: u64,
    words: &mut [u64; READ_WORDS],
) -> Option<GFields> {
    if g & 7 == 0
        && let Some(found) = curg_of(process, words, g)
    {
        return Some(found);
    }
    if process.flags & GO_PROCESS_TLS == 0 {
        return None;
    }
    let thread_pointer = machine::thread_pointer()?;
    if !plausible(thread_pointer) {
        return None;
    }
    let g = read_word(thread_pointer.wrapping_add(process.tls_g_offset as u64))?;
    curg_of(process, words, g)
}

/// The fields of `g.m.curg`, if `g` is a g running on that m: its
/// current goroutine (most samples of Go code: checked first, and then
/// the fields already read are curg's), its g0, or another g whose m's
/// current goroutine runs on the same m (its signal goroutine `gsignal`,
/// which the g register and TLS hold while a signal handler runs; the
/// samples there are the interrupted goroutine's, as in Go's own
/// profiles). A register that holds anything else fails this, and so
/// does an m with no current goroutine (the scheduler's own stack).
#[inline(always)]
fn curg_of(process: &GoProcess, words: &mut [u64; READ_WORDS], g: u64) -> Option<GFields> {
    if !plausible(g) {
        return None;
    }
    let fields = g_fields(process, words, g)?;
    let m = fields.m;
    if !plausible(m) {
        return None;
    }
    let curg = read_word(m + process.m_curg as u64)?;
    if curg == g {
        return Some(fields);
    }
    if !plausible(curg) {
        return None;
    }
    let g0 = read_word(m)?;
    let current = g_fields(process, words, curg)?;
    (g0 == g || current.m == m).then_some(current)
}

/// Go 1.24 on: `labelMap{LabelSet{list []label}}`, label = {key, value}:
/// the list is read whole.
#[inline(always)]
fn copy_slice(
    labels: &mut GoLabels,
    strings: &Strings,
    pointer: u64,
    words: &mut [u64; READ_WORDS],
) {
    let Some([list, len]) = read_pair(pointer) else {
        return;
    };
    if len > MAX_GO_LABELS as u64 {
        labels.flags |= GO_LABELS_CUT;
    }
    let count = len.min(MAX_GO_LABELS as u64);
    if count == 0 {
        return;
    }
    if !read_run(words, (count * LIST_ENTRY_BYTES) & (READ_BYTES - 1), list) {
        labels.flags |= GO_LABELS_CUT;
        return;
    }
    for i in 0..MAX_GO_LABELS {
        if i as u64 >= count {
            break;
        }
        let word = |n: usize| words.get(i * 4 + n).copied().unwrap_or(0);
        push(labels, strings, [word(0), word(1), word(2), word(3)]);
    }
}

/// Go 1.19 to 1.23: a pointer to a `map[string]string` (an hmap: count,
/// flags/B/noverflow/hash0, buckets, oldbuckets, ...). Each bucket is
/// read whole.
#[inline(always)]
fn copy_map(labels: &mut GoLabels, strings: &Strings, pointer: u64, words: &mut [u64; READ_WORDS]) {
    let Some(hmap) = read_word(pointer) else {
        return;
    };
    if !plausible(hmap) {
        return;
    }
    let Some(header) = read_user::<[u64; 4]>(hmap) else {
        return;
    };
    let (count, b, buckets, old) = (header[0], (header[1] >> 8) & 0xff, header[2], header[3]);
    if count > MAX_GO_LABELS as u64 || old != 0 || b > 1 {
        labels.flags |= GO_LABELS_CUT;
    }
    for bucket in 0..MAX_BUCKETS {
        if bucket >= 1 << b.min(1) {
            break;
        }
        if !read_run(words, BUCKET_BYTES, buckets + bucket * BUCKET_BYTES) {
            break;
        }
        // The eight tophash bytes, in memory order (both targets are
        // little-endian).
        let tophash = words[0].to_le_bytes();
        for slot in 0..BUCKET_SLOTS as usize {
            if tophash[slot] < MIN_TOP_HASH {
                continue;
            }
            let word = |byte: u64| {
                words
                    .get((byte / 8) as usize + slot * 2)
                    .copied()
                    .unwrap_or(0)
            };
            push(
                labels,
                strings,
                [
                    word(BUCKET_KEYS),
                    word(BUCKET_KEYS + 8),
                    word(BUCKET_VALUES),
                    word(BUCKET_VALUES + 8),
                ],
            );
        }
    }
    // Entries in overflow buckets or in the old buckets of a growth left
    // half done (a map is never written again once built) were not read.
    if (labels.count as u64) < count.min(MAX_GO_LABELS as u64) {
        labels.flags |= GO_LABELS_CUT;
    }
}

/// Copies `bytes` bytes of user memory at `from` into `words` (at most
/// `READ_BYTES`, whole words); false on a fault.
#[inline(always)]
fn read_run(words: &mut [u64; READ_WORDS], bytes: u64, from: u64) -> bool {
    if bytes == 0 || bytes > READ_BYTES {
        return false;
    }
    // SAFETY: `words` holds READ_BYTES bytes and `bytes` is at most that;
    // the helper checks the user address.
    unsafe { read_user_raw(words.as_mut_ptr().cast(), bytes as u32, from as *const _) == 0 }
}

/// The process's Go binary's read-only data (`GoProcess::strings_start`).
struct Strings {
    start: u64,
    end: u64,
}

impl Strings {
    /// Whether the string at `address` starts there: then it is a
    /// constant user space reads from the binary's file.
    #[inline(always)]
    fn holds(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }
}

/// Appends one label (key pointer, key length, value pointer, value
/// length) to the block's entries (`GoLabels::entries`); a string in the
/// binary's read-only data by its address only.
#[inline(always)]
fn push(labels: &mut GoLabels, strings: &Strings, [key, key_len, value, value_len]: [u64; 4]) {
    if labels.count as usize >= MAX_GO_LABELS {
        labels.flags |= GO_LABELS_CUT;
        return;
    }
    // The index and the offset from second, volatile loads, masked
    // before anything else: with the values compared instead, the
    // compiler kept copies spilled before the comparison and computed
    // addresses from them, which arm64's 6.1 verifier does not bound (it
    // refused the program); a masked value is bounded wherever it goes.
    // SAFETY: fields of the caller's block.
    let (count, at) = unsafe {
        (
            core::ptr::read_volatile(&raw const labels.count),
            core::ptr::read_volatile(&raw const labels.entries_len),
        )
    };
    let index = count as usize & (MAX_GO_LABELS - 1);
    let at = at as usize & GO_LABELS_OFFSET_MASK;
    if at > GO_LABELS_LAST_ENTRY {
        labels.flags |= GO_LABELS_CUT;
        return;
    }
    let entry = labels.entries.as_mut_ptr().wrapping_add(at);
    // SAFETY: `at` leaves room for a whole entry (GO_LABELS_ROOM),
    // 8-byte aligned: the entries start aligned and each is whole words.
    unsafe {
        entry.cast::<u64>().write(
            u64::from(key_len.min(u32::MAX as u64) as u32)
                | u64::from(value_len.min(u32::MAX as u64) as u32) << 32,
        );
    }
    let key = put_string::<GO_LABEL_KEY_BYTES>(entry.wrapping_add(8), strings, key, key_len);
    // Masked: what the verifier is told of the key's area (at most 32
    // bytes; GO_LABELS_ROOM allows for 63).
    let key_area = key.area & 63;
    let value = put_string::<GO_LABEL_VALUE_BYTES>(
        entry.wrapping_add(8 + key_area),
        strings,
        value,
        value_len,
    );
    if key.in_binary {
        labels.in_binary |= key_in_binary(index);
    }
    if value.in_binary {
        labels.in_binary |= value_in_binary(index);
    }
    if key.cut || value.cut {
        labels.flags |= GO_LABELS_CUT;
    }
    labels.entries_len = (at + 8 + key_area + (value.area & 127)) as u16;
    labels.count += 1;
}

/// What `put_string` wrote.
struct Area {
    /// Bytes of the area (`profiler_common::runtimes::go::area_len`).
    area: usize,
    /// The string lies in the binary: the area is its address.
    in_binary: bool,
    /// The string is longer than what was kept (user space cuts a string
    /// it reads from the binary alike).
    cut: bool,
}

/// Writes a Go string's area at `dst` (`GoLabels::entries`): its address
/// when it lies in the binary's read-only data, else at most `N` of its
/// bytes, zero-padded to whole words.
#[inline(always)]
fn put_string<const N: usize>(dst: *mut u8, strings: &Strings, src: u64, len: u64) -> Area {
    let cut = len > N as u64;
    if strings.holds(src) {
        // SAFETY: `dst` has room for `N` >= 8 bytes (the caller's bound).
        unsafe { dst.cast::<u64>().write(src) };
        return Area {
            area: 8,
            in_binary: true,
            cut,
        };
    }
    let n = if cut { N } else { len as usize };
    if n == 0 || n > N {
        return Area {
            area: 0,
            in_binary: false,
            cut,
        };
    }
    // The word holding the string's last byte, zeroed first so that the
    // padding after the string is zeroes (the off-CPU program hashes the
    // block's words). Masked: the verifier does not carry `n`'s checks
    // over to it (`n - 1` may be -1 for all it knows).
    let last_word = (n - 1) & (N.next_power_of_two() - 8);
    // SAFETY: `dst` has room for `N.next_power_of_two()` bytes (the
    // caller's bound, GO_LABELS_ROOM) and `n` is at most `N`; the helper
    // checks `src` and leaves zeroes on a fault.
    unsafe {
        dst.wrapping_add(last_word).cast::<u64>().write(0);
        read_user_raw(dst.cast(), n as u32, src as *const _);
    }
    Area {
        area: (n + 7) & !7,
        in_binary: false,
        cut,
    }
}

/// A user address that may point at Go heap or stack (not null, in the
/// user half).
#[inline(always)]
fn plausible(address: u64) -> bool {
    address >= 4096 && address < machine::USER_LIMIT
}

#[inline(always)]
fn read_word(address: u64) -> Option<u64> {
    read_user::<u64>(address)
}

#[inline(always)]
fn read_pair(address: u64) -> Option<[u64; 2]> {
    read_user::<[u64; 2]>(address)
}

#[inline(always)]
fn read_user<T>(address: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is None.
    unsafe { bpf_probe_read_user(address as *const T) }.ok()
}

// Blocks start 8-byte aligned after the frames, and entries are whole
// words.
const _: () = assert!(GoLabels::HEADER_LEN.is_multiple_of(8));

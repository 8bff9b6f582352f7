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
    maps::HashMap,
};
use profiler_common::{
    Counter, UserRegs,
    runtimes::go::{
        GO_LABELS_CUT, GO_LABELS_MAP, GO_LABELS_SLICE, GO_PROCESS_TLS, GoLabel, GoLabels,
        GoProcess, MAX_GO_LABELS, MAX_GO_PROCESSES,
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

/// Whether labels are read at all.
#[inline(always)]
pub fn enabled() -> bool {
    // SAFETY: reading a read-only global the loader initialised.
    unsafe { core::ptr::read_volatile(&GO_LABELS) != 0 }
}

/// Writes the labels of the goroutine running on this thread of `pid`
/// into `block`, right after the record's last frame: their length, or
/// None (not a Go process, or no goroutine running), and then `block` was
/// not written. Straight into the record: gathering them in a scratch
/// block first and copying it after cost a few more cold cache lines and
/// a copy per sample.
///
/// # Safety
/// `block` must point to a writable `GoLabels` (the record's `tail`
/// leaves room for one after any number of frames) that no other program
/// writes while this one runs (each program context has its own record).
#[inline(always)]
pub unsafe fn read(pid: u32, regs: &UserRegs, block: *mut GoLabels) -> Option<usize> {
    // SAFETY: the value is copied out of the map.
    let process = *unsafe { GO_PROCESSES.get(&pid) }?;
    let curg = current_goroutine(&process, regs)?;
    if !plausible(curg) {
        return None;
    }
    // SAFETY: the caller's promise.
    let labels = unsafe { &mut *block };
    labels.goid = read_word(curg + process.g_goid as u64).unwrap_or(0);
    labels.count = 0;
    labels.flags = 0;
    let pointer = read_word(curg + process.g_labels as u64).unwrap_or(0);
    if plausible(pointer) {
        match process.kind {
            GO_LABELS_MAP => copy_map(labels, pointer),
            GO_LABELS_SLICE => copy_slice(labels, pointer),
            _ => {}
        }
    }
    bump(Counter::GoLabelsRead);
    if labels.flags & GO_LABELS_CUT != 0 {
        bump(Counter::GoLabelsCut);
    }
    let count = (labels.count as usize).min(MAX_GO_LABELS);
    Some(GoLabels::block_len(count))
}

/// The thread's current goroutine (its m's `curg`): through the g
/// register when it holds one of this thread's gs, else through
/// thread-local storage.
#[inline(always)]
fn current_goroutine(process: &GoProcess, regs: &UserRegs) -> Option<u64> {
    if let Some(found) = curg_of(process, regs.go_g) {
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
    curg_of(process, g)
}

/// `g.m.curg`, if `g` is a g running on that m: its current
/// goroutine (most samples of Go code: checked first), its g0, or another
/// g whose m's current goroutine runs on the same m (its signal goroutine
/// `gsignal`, which the g register and TLS hold while a signal handler
/// runs; the samples there are the interrupted goroutine's, as in Go's own
/// profiles). A register that holds anything else fails this.
#[inline(always)]
fn curg_of(process: &GoProcess, g: u64) -> Option<u64> {
    if !plausible(g) {
        return None;
    }
    let m = read_word(g + process.g_m as u64)?;
    if !plausible(m) {
        return None;
    }
    let curg = read_word(m + process.m_curg as u64)?;
    if curg == g {
        return Some(curg);
    }
    let g0 = read_word(m)?;
    if g0 == g || (plausible(curg) && read_word(curg + process.g_m as u64)? == m) {
        Some(curg)
    } else {
        None
    }
}

/// Go 1.24 on: `labelMap{LabelSet{list []label}}`, label = {key, value}.
#[inline(always)]
fn copy_slice(labels: &mut GoLabels, pointer: u64) {
    let Some([list, len]) = read_pair(pointer) else {
        return;
    };
    if len > MAX_GO_LABELS as u64 {
        labels.flags |= GO_LABELS_CUT;
    }
    for i in 0..MAX_GO_LABELS as u64 {
        if i >= len {
            break;
        }
        let Some(entry) = read_user::<[u64; 4]>(list + i * 32) else {
            break;
        };
        push(labels, entry);
    }
}

/// Go 1.19 to 1.23: a pointer to a `map[string]string` (an hmap: count,
/// flags/B/noverflow/hash0, buckets, oldbuckets, ...).
#[inline(always)]
fn copy_map(labels: &mut GoLabels, pointer: u64) {
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
        let base = buckets + bucket * BUCKET_BYTES;
        let Some(tophash) = read_user::<[u8; 8]>(base) else {
            break;
        };
        for slot in 0..BUCKET_SLOTS {
            if tophash[slot as usize] < MIN_TOP_HASH {
                continue;
            }
            let Some(key) = read_pair(base + BUCKET_KEYS + slot * 16) else {
                continue;
            };
            let Some(value) = read_pair(base + BUCKET_VALUES + slot * 16) else {
                continue;
            };
            push(labels, [key[0], key[1], value[0], value[1]]);
        }
    }
    // Entries in overflow buckets or in the old buckets of a growth left
    // half done (a map is never written again once built) were not read.
    if (labels.count as u64) < count.min(MAX_GO_LABELS as u64) {
        labels.flags |= GO_LABELS_CUT;
    }
}

/// Copies one label (key pointer, key length, value pointer, value
/// length) into the next entry.
#[inline(always)]
fn push(labels: &mut GoLabels, [key, key_len, value, value_len]: [u64; 4]) {
    let index = labels.count as usize;
    let Some(entry) = labels.labels.get_mut(index) else {
        labels.flags |= GO_LABELS_CUT;
        return;
    };
    let cut =
        copy_string(&mut entry.key, key, key_len) | copy_string(&mut entry.value, value, value_len);
    entry.key_len = key_len.min(u32::MAX as u64) as u32;
    entry.value_len = value_len.min(u32::MAX as u64) as u32;
    if cut {
        labels.flags |= GO_LABELS_CUT;
    }
    labels.count += 1;
}

/// Copies at most `N` bytes of a Go string; true when it was longer.
#[inline(always)]
fn copy_string<const N: usize>(dst: &mut [u8; N], src: u64, len: u64) -> bool {
    let n = if len > N as u64 { N as u32 } else { len as u32 };
    if n > 0 && n <= N as u32 {
        // SAFETY: `n` is at most `dst`'s length; the helper checks `src`
        // and leaves zeroes on a fault.
        unsafe {
            read_user_raw(dst.as_mut_ptr().cast(), n, src as *const _);
        }
    }
    len > N as u64
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

// Blocks start 8-byte aligned after the frames, and each entry keeps them so.
const _: () = assert!(core::mem::size_of::<GoLabel>() % 8 == 0);

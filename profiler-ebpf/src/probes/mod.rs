//! BPF side of `profiler-agent latency`: uprobe programs that time an
//! operation between a start probe and an end probe and add the duration
//! to an in-kernel histogram, or count hits of one probe.
//!
//! - `latency_start`: remembers `bpf_ktime_get_ns()` (and the histogram
//!   key, read from the start site's arguments) per thread, or per
//!   goroutine for Go, in an LRU map, so starts whose end never fires are
//!   evicted instead of filling the map. The entry stays when the
//!   operation ends: the thread's next start writes it in place (one
//!   lookup, where an insert would allocate and a delete free an element).
//!   Nested starts of one thread (recursion, re-entrancy) are kept apart
//!   by depth and matched last in, first out.
//! - `latency_end`: reads the innermost start, adds `(now - start) /
//!   divisor` to the key's per-CPU histogram (bpftrace's log2 buckets, or
//!   linear), count and sum.
//! - `latency_count`: adds one to the key's count.
//! - `latency_trace`: sends one record per hit (time, thread, the chosen
//!   arguments and one string) through a ring buffer, after an optional
//!   filter on an argument and under a per-CPU rate limit.
//! - `latency_trace_start` / `latency_trace_end`: the same record, read at
//!   the start of an operation and sent at its end with its latency, when
//!   it took at least `trace_min_ns`.
//!
//! - With stacks on (`latency --stacks`), each start (or counted hit) also
//!   walks the user stack with the walk's chain (`chain::PROBE`: the same
//!   native and runtime walkers as CPU samples, and the unwind tables user
//!   space loaded for the probed processes), and `finish_probe`, the
//!   chain's last program, stores it; each end adds the operation to its
//!   start's stack in `STACK_TOTALS`.
//!
//! Every perf event carries a BPF cookie: the index of its site in
//! `SITES`, where user space wrote how to read that site's key argument
//! (each USDT site has its own argument locations). Errors are counted in
//! `LATENCY_COUNTERS`, never logged: aya-log costs hundreds of
//! instructions per call.
mod args;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_COMMON_LRU, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_user_str_bytes,
        generated::{bpf_get_attach_cookie, bpf_probe_read_kernel},
    },
    macros::{map, uprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::ProbeContext,
};
use profiler_common::latency::{
    FILTER_EQ, FILTER_GE, FILTER_GT, FILTER_LE, FILTER_LT, FILTER_NE, FILTER_NONE, HIST_SLOTS,
    HistKey, HistValue, KEY_ARG, KEY_COMM, KEY_NONE, KEY_PID, KEY_STRING_ARG,
    LATENCY_COUNTER_SLOTS, LatencyConfig, LatencyCounter, MAX_IN_FLIGHT, MAX_KEYS,
    MAX_NESTED_STARTS, MAX_PROBE_STACK_FRAMES, MAX_PROBE_STACKS, MAX_SITES, NO_REGISTER,
    PendingStarts, ProbeStack, SiteConfig, StackId, StackTotals, StartKey, StartValue, TRACE_SLOTS,
    TRACE_TEXT_LEN, TraceEvent,
};
use profiler_common::runtimes::CHAIN_FINISH;
use profiler_common::unwind::UserStackEnd;

use crate::chain::{self, PROBE};
use crate::{machine, native, walk, words};

/// Set by the loader (`profiler_common::latency::GLOBAL_LATENCY_CONFIG`).
/// A read-only global: the verifier sees its fields as constants and drops
/// the branches this run does not use.
#[unsafe(no_mangle)]
static LATENCY_CONFIG: LatencyConfig = LatencyConfig::DEFAULT;

/// Per-site settings, indexed by the perf event's BPF cookie.
#[map]
static SITES: Array<SiteConfig> = Array::with_max_entries(MAX_SITES, 0);

/// Each thread's or goroutine's pending starts (key depth 0): the
/// innermost inline, the count. BPF_F_NO_COMMON_LRU: one LRU list per CPU,
/// so inserts on many CPUs do not contend for one list lock (on this
/// 2-CPU machine it made no measurable difference).
#[map]
static THREADS: LruHashMap<StartKey, PendingStarts> =
    LruHashMap::with_max_entries(MAX_IN_FLIGHT, BPF_F_NO_COMMON_LRU);

/// The outer starts of nested ones (recursion, re-entrancy), by level:
/// matched last in, first out, instead of the inner one replacing the
/// outer. Only nesting pays for these inserts and deletes.
#[map]
static STARTS: LruHashMap<StartKey, StartValue> =
    LruHashMap::with_max_entries(MAX_IN_FLIGHT, BPF_F_NO_COMMON_LRU);

/// An empty `PendingStarts` to create a thread's entry from (building one
/// on the stack costs a byte-wise memset). Never written.
#[map]
static EMPTY_PENDING: PerCpuArray<PendingStarts> = PerCpuArray::with_max_entries(1, 0);

/// `--count`'s key, assembled per CPU (not on the stack: see
/// `EMPTY_PENDING`). Zero unless `--by` sets a kind, which rewrites it
/// whole at each hit.
#[map]
static COUNT_KEY: PerCpuArray<HistKey> = PerCpuArray::with_max_entries(1, 0);

/// Histograms by key, per CPU (no atomics on the hot path). Not
/// preallocated: a value is 1 KiB per CPU and most runs use one key.
#[map]
static HISTOGRAMS: PerCpuHashMap<HistKey, HistValue> =
    PerCpuHashMap::with_max_entries(MAX_KEYS, BPF_F_NO_PREALLOC);

/// An all-zero `HistValue` to insert new keys from (1 KiB does not fit on
/// the 512-byte BPF stack). Never written.
#[map]
static ZERO: PerCpuArray<HistValue> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU counters, indexed by `LatencyCounter`.
#[map]
static LATENCY_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LATENCY_COUNTER_SLOTS, 0);

/// Traced hits for user space (`trace`). The loader shrinks it to a page
/// when the run does not trace.
#[map]
static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Start/end tracing: the record read at each pending start. The loader
/// shrinks it to one entry when the run does not trace pairs.
#[map]
static TRACE_STARTS: LruHashMap<StartKey, TraceEvent> =
    LruHashMap::with_max_entries(16384, BPF_F_NO_COMMON_LRU);

/// Per CPU: the start of the current one-second window of the trace rate
/// limit, and the records sent in it.
#[map]
static TRACE_RATE: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

const EEXIST: i32 = 17;

/// What a hit that walks its stack leaves for `finish_probe`: whose start
/// it was, or that it was a counted hit. Per CPU (the chain runs on the
/// hit's CPU).
#[repr(C)]
#[derive(Clone, Copy)]
struct ProbeWalk {
    key: StartKey,
    /// `WALK_START` or `WALK_COUNT`.
    kind: u32,
    _pad: u32,
}

const WALK_START: u32 = 1;
const WALK_COUNT: u32 = 2;

#[map]
static PROBE_WALK: PerCpuArray<ProbeWalk> = PerCpuArray::with_max_entries(1, 0);

/// Where a new stack is assembled before it is stored.
#[map]
static STACK_VALUE: PerCpuArray<ProbeStack> = PerCpuArray::with_max_entries(1, 0);

/// The frames of every stack seen at a start, by process and hash.
#[map]
static STACKS: HashMap<StackId, ProbeStack> =
    HashMap::with_max_entries(MAX_PROBE_STACKS, BPF_F_NO_PREALLOC);

/// Operations per start stack: count and total latency.
#[map]
static STACK_TOTALS: PerCpuHashMap<StackId, StackTotals> =
    PerCpuHashMap::with_max_entries(MAX_PROBE_STACKS, BPF_F_NO_PREALLOC);

#[uprobe]
pub fn latency_start(ctx: ProbeContext) -> u32 {
    on_start(&ctx);
    0
}

#[uprobe]
pub fn latency_end(ctx: ProbeContext) -> u32 {
    on_end(&ctx);
    0
}

#[uprobe]
pub fn latency_count(ctx: ProbeContext) -> u32 {
    on_count(&ctx);
    0
}

#[uprobe]
pub fn latency_trace(ctx: ProbeContext) -> u32 {
    on_trace(&ctx);
    0
}

#[uprobe]
pub fn latency_trace_start(ctx: ProbeContext) -> u32 {
    on_trace_start(&ctx);
    0
}

#[uprobe]
pub fn latency_trace_end(ctx: ProbeContext) -> u32 {
    on_trace_end(&ctx);
    0
}

#[inline(always)]
fn count(counter: LatencyCounter) {
    if let Some(slot) = LATENCY_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot; uprobe programs do not nest on one CPU
        // (they run with preemption and migration disabled).
        unsafe { *slot += 1 };
    }
}

/// The run's settings. Read through a pointer the compiler cannot see
/// through, so it neither folds the defaults in nor copies the whole
/// struct (as a volatile read of the value did); each field is then a
/// load from the frozen global, a constant to the verifier.
#[inline(always)]
fn config() -> &'static LatencyConfig {
    let global: *const LatencyConfig = &raw const LATENCY_CONFIG;
    // SAFETY: a volatile read of a local pointer to a read-only global the
    // loader initialised.
    unsafe { &*core::ptr::read_volatile(&global) }
}

/// Zeroes a key word by word (`words`: a struct literal compiles to a
/// byte-wise memset loop of hundreds of instructions).
#[inline(always)]
fn zero_key(key: *mut HistKey) {
    const { assert!(core::mem::size_of::<HistKey>() % 8 == 0) };
    let key = key.cast::<u64>();
    for i in 0..core::mem::size_of::<HistKey>() / 8 {
        // SAFETY: `key` points at a whole HistKey, 8-byte aligned (its
        // first field is a u64).
        words::set(unsafe { key.add(i) }, 0);
    }
}

/// Who a start belongs to, or `None` when the hit is filtered out or the
/// goroutine register cannot be read.
#[inline(always)]
fn start_key(ctx: &ProbeContext, config: &LatencyConfig) -> Option<StartKey> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if config.tgid != 0 && tgid != config.tgid {
        count(LatencyCounter::FilteredOut);
        return None;
    }
    let id = if config.goroutine_register != NO_REGISTER {
        // Go keeps the current g in a register at every function boundary
        // (ABIInternal): the same goroutine may run on another thread by
        // the time the function returns.
        match args::register(ctx, config.goroutine_register) {
            Some(g) => g,
            None => {
                count(LatencyCounter::ArgReadFailed);
                return None;
            }
        }
    } else {
        pid_tgid
    };
    Some(StartKey { tgid, depth: 0, id })
}

/// Fills `key` per `--by` (left as it is without `--by`: zero).
#[inline(always)]
fn histogram_key(ctx: &ProbeContext, config: &LatencyConfig, tgid: u32, key: &mut HistKey) {
    if config.key_kind != KEY_NONE {
        zero_key(key);
    }
    match config.key_kind {
        KEY_PID => key.value = u64::from(tgid),
        KEY_COMM => {
            if let Ok(comm) = bpf_get_current_comm() {
                key.text[..comm.len()].copy_from_slice(&comm);
            }
        }
        KEY_ARG | KEY_STRING_ARG => {
            // SAFETY: the helper only reads the run context's cookie.
            let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
            let Some(site) = SITES.get(cookie as u32) else {
                count(LatencyCounter::UnknownSite);
                return;
            };
            let Some(value) = args::read(ctx, &site.key_arg, site.site_address, config.ip_register)
            else {
                count(LatencyCounter::ArgReadFailed);
                return;
            };
            if config.key_kind == KEY_ARG {
                key.value = value;
            } else {
                // SAFETY: the helper checks the user address and writes at
                // most text.len() bytes, NUL-terminated.
                if unsafe { bpf_probe_read_user_str_bytes(value as *const u8, &mut key.text) }
                    .is_err()
                {
                    count(LatencyCounter::ArgReadFailed);
                }
            }
        }
        _ => {}
    }
}

#[inline(always)]
fn on_start(ctx: &ProbeContext) {
    count(LatencyCounter::Starts);
    let config = config();
    let Some(key) = start_key(ctx, config) else {
        return;
    };
    let Some(pending) = pending_of(&key) else {
        count(LatencyCounter::StartMapFull);
        return;
    };
    // SAFETY: the thread's own entry (a thread runs one probe at a time;
    // a goroutine runs on one thread at a time); `pending` stays valid for
    // the program's run.
    unsafe {
        let depth = (*pending).depth;
        if depth >= MAX_NESTED_STARTS {
            count(LatencyCounter::StartReplaced);
        } else {
            if depth > 0 {
                // The innermost start so far moves out to its level.
                let at = StartKey {
                    depth: depth - 1,
                    ..key
                };
                if STARTS.insert(&at, &(*pending).top, 0).is_err() {
                    count(LatencyCounter::StartMapFull);
                }
            }
            (*pending).depth = depth + 1;
        }
        let top = &mut (*pending).top;
        histogram_key(ctx, config, key.tgid, &mut top.key);
        top.stack = 0;
        if config.stacks != 0 {
            // The stack's walk; `finish_probe` sets the start's time.
            walk_stack(ctx, key, WALK_START);
        }
        // Last, so the time spent reading arguments is not measured.
        top.time_ns = bpf_ktime_get_ns();
    }
}

/// Starts the walk of the current thread's user stack (the chain, ending
/// in `finish_probe`), after which `kind` of hit `key` is completed there.
/// Returns only when there is no walk.
#[inline(always)]
fn walk_stack(ctx: &ProbeContext, key: StartKey, kind: u32) {
    let (Some(walk_of), Some(state)) = (PROBE_WALK.get_ptr_mut(0), walk::state(PROBE)) else {
        return;
    };
    // SAFETY: this CPU's values, ours for the chain's run.
    unsafe {
        (*walk_of).key = key;
        (*walk_of).kind = kind;
        let state = &mut *state;
        let regs = machine::saved_user(&mut state.regs_block).regs;
        // At a probe: the task is at the probed instruction, not in a call.
        if walk::begin(state, key.tgid, &regs, false, 0)
            && native::walk_here::<_, PROBE>(ctx, state)
        {
            chain::call::<_, PROBE>(ctx, state, CHAIN_FINISH);
        }
    }
}

/// The chain's last program at a probe hit: the walked stack stored, and
/// the hit completed (a start's stack and time, a counted hit's stack).
#[uprobe]
pub fn finish_probe(_ctx: ProbeContext) -> u32 {
    let (Some(walk_of), Some(state)) = (PROBE_WALK.get(0), walk::state(PROBE)) else {
        return 0;
    };
    let walk_of = *walk_of;
    // SAFETY: this CPU's walk state, ours for the chain's run.
    let hash = store_stack(walk_of.key.tgid, unsafe { &*state });
    match walk_of.kind {
        WALK_START => {
            if let Some(pending) = THREADS.get_ptr_mut(&walk_of.key) {
                // SAFETY: the thread's own entry, as in on_start.
                unsafe {
                    (*pending).top.stack = hash;
                    // Last, so the walk is not measured.
                    (*pending).top.time_ns = bpf_ktime_get_ns();
                }
            }
        }
        WALK_COUNT if hash != 0 => add_to_stack(walk_of.key.tgid, hash, 0),
        _ => {}
    }
    0
}

/// The thread's entry in `THREADS`, created empty on its first start.
#[inline(always)]
fn pending_of(key: &StartKey) -> Option<*mut PendingStarts> {
    if let Some(pending) = THREADS.get_ptr_mut(key) {
        return Some(pending);
    }
    let empty = EMPTY_PENDING.get(0)?;
    THREADS.insert(key, empty, 0).ok()?;
    THREADS.get_ptr_mut(key)
}

#[inline(always)]
fn on_end(ctx: &ProbeContext) {
    // First, so our own work is not measured.
    // SAFETY: as in on_start.
    let now = unsafe { bpf_ktime_get_ns() };
    count(LatencyCounter::Ends);
    let config = config();
    let Some(key) = start_key(ctx, config) else {
        return;
    };
    let Some(pending) = THREADS.get_ptr_mut(&key) else {
        count(LatencyCounter::EndWithoutStart);
        return;
    };
    // SAFETY: the thread's own entry, as in on_start.
    unsafe {
        let depth = (*pending).depth;
        if depth == 0 {
            count(LatencyCounter::EndWithoutStart);
            return;
        }
        let start = &(*pending).top;
        if start.time_ns == 0 {
            count(LatencyCounter::EndWithoutStart);
        } else {
            record_end(config, key.tgid, start, now);
        }
        // The next outer start, if any, becomes the innermost.
        if depth > 1 {
            let at = StartKey {
                depth: depth - 2,
                ..key
            };
            match STARTS.get_ptr(&at) {
                Some(outer) => {
                    words::copy(&mut (*pending).top, outer);
                    let _ = STARTS.remove(&at);
                }
                // Evicted: the end that would match it is counted as
                // without a start.
                None => (*pending).top.time_ns = 0,
            }
        }
        (*pending).depth = depth - 1;
    }
}

/// Adds the operation that began at `start` and ended at `now` to its
/// key's histogram (and its stack's totals).
#[inline(always)]
fn record_end(config: &LatencyConfig, tgid: u32, start: &StartValue, now: u64) {
    let elapsed = now.saturating_sub(start.time_ns);
    if config.stacks != 0 && start.stack != 0 && elapsed >= config.stack_min_ns {
        add_to_stack(tgid, start.stack, elapsed);
    }
    // checked_div: a division that may panic would leave an unreachable
    // trap the verifier refuses (user space never passes 0).
    let duration = elapsed.checked_div(config.divisor).unwrap_or(elapsed);
    let Some(histogram) = histogram_of(&start.key) else {
        return;
    };
    let bucket = bucket(duration, config);
    // SAFETY: this CPU's copy of the key's value; programs do not nest on
    // one CPU. `bucket` is checked against the array length.
    unsafe {
        (*histogram).count += 1;
        (*histogram).sum += duration;
        if bucket < HIST_SLOTS {
            (*histogram).buckets[bucket] += 1;
        }
    }
}

/// Stores the walked stack's frames when the stack is new, and returns
/// its hash (0: nothing walked, or no room).
#[inline(always)]
fn store_stack(tgid: u32, state: &walk::WalkState) -> u64 {
    let Some(sample) = crate::scratch(PROBE) else {
        return 0;
    };
    let end = walk::end_of(state);
    if matches!(end, UserStackEnd::ReadFault | UserStackEnd::Truncated) {
        count(LatencyCounter::StackCut);
    }
    let frames = (state.frames as usize).min(MAX_PROBE_STACK_FRAMES);
    if frames == 0 {
        return 0;
    }
    if state.frames as usize > MAX_PROBE_STACK_FRAMES {
        count(LatencyCounter::StackCut);
    }
    // FNV-1a over the frames kept, then their number.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_PROBE_STACK_FRAMES {
        if i >= frames {
            break;
        }
        // SAFETY: this CPU's scratch sample; `i` is below its frame count.
        let frame = unsafe { (*sample).frames.get(i).copied().unwrap_or(0) };
        hash = (hash ^ frame).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ frames as u64).wrapping_mul(0x0000_0100_0000_01b3);
    let hash = hash.max(1);
    let id = StackId {
        tgid,
        _pad: 0,
        hash,
    };
    // SAFETY: only tested for presence.
    if unsafe { STACKS.get(&id) }.is_some() {
        return hash;
    }
    let Some(value) = STACK_VALUE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch values; the copy is at most the whole
    // frame array of both (`frames` <= MAX_PROBE_STACK_FRAMES).
    unsafe {
        (*value).len = frames as u32;
        (*value).end = end as u32;
        let bytes = (frames * 8) as u32;
        if bytes > (MAX_PROBE_STACK_FRAMES * 8) as u32
            || bpf_probe_read_kernel(
                (*value).frames.as_mut_ptr().cast(),
                bytes,
                (*sample).frames.as_ptr().cast(),
            ) != 0
        {
            return 0;
        }
        if STACKS.insert(&id, &*value, BPF_NOEXIST as u64).is_err() && STACKS.get(&id).is_none() {
            count(LatencyCounter::StacksFull);
            return 0;
        }
    }
    hash
}

/// Adds one operation of `elapsed_ns` to the totals of its start stack.
#[inline(always)]
fn add_to_stack(tgid: u32, hash: u64, elapsed_ns: u64) {
    let id = StackId {
        tgid,
        _pad: 0,
        hash,
    };
    let totals = match STACK_TOTALS.get_ptr_mut(&id) {
        Some(totals) => totals,
        None => {
            let zero = StackTotals {
                count: 0,
                sum_ns: 0,
            };
            if STACK_TOTALS.insert(&id, &zero, BPF_NOEXIST as u64).is_err()
                && STACK_TOTALS.get_ptr_mut(&id).is_none()
            {
                count(LatencyCounter::StacksFull);
                return;
            }
            match STACK_TOTALS.get_ptr_mut(&id) {
                Some(totals) => totals,
                None => return,
            }
        }
    };
    // SAFETY: this CPU's copy of the entry; programs do not nest on one
    // CPU.
    unsafe {
        (*totals).count += 1;
        (*totals).sum_ns += elapsed_ns;
    }
}

#[inline(always)]
fn on_count(ctx: &ProbeContext) {
    count(LatencyCounter::Counts);
    let config = config();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if config.tgid != 0 && tgid != config.tgid {
        count(LatencyCounter::FilteredOut);
        return;
    }
    let Some(key) = COUNT_KEY.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch key; programs do not nest on one CPU.
    let key = unsafe { &mut *key };
    histogram_key(ctx, config, tgid, key);
    if let Some(histogram) = histogram_of(key) {
        // SAFETY: as in on_end.
        unsafe { (*histogram).count += 1 };
    }
    if config.stacks != 0 {
        let start = StartKey {
            tgid,
            depth: 0,
            id: pid_tgid,
        };
        walk_stack(ctx, start, WALK_COUNT);
    }
}

#[inline(always)]
fn on_trace(ctx: &ProbeContext) {
    count(LatencyCounter::Traced);
    let config = config();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if config.tgid != 0 && tgid != config.tgid {
        count(LatencyCounter::FilteredOut);
        return;
    }
    let Some(mut event) = trace_record(ctx, config, pid_tgid) else {
        return;
    };
    // SAFETY: reads the monotonic clock.
    event.time_ns = unsafe { bpf_ktime_get_ns() };
    send_trace(&event, config);
}

#[inline(always)]
fn on_trace_start(ctx: &ProbeContext) {
    count(LatencyCounter::Starts);
    let config = config();
    let Some(key) = start_key(ctx, config) else {
        return;
    };
    let Some(mut event) = trace_record(ctx, config, bpf_get_current_pid_tgid()) else {
        return;
    };
    // Last, so reading the arguments is not measured.
    // SAFETY: reads the monotonic clock.
    event.time_ns = unsafe { bpf_ktime_get_ns() };
    if TRACE_STARTS.insert(&key, &event, 0).is_err() {
        count(LatencyCounter::StartMapFull);
    }
}

#[inline(always)]
fn on_trace_end(ctx: &ProbeContext) {
    // SAFETY: reads the monotonic clock; first, so our work is not measured.
    let now = unsafe { bpf_ktime_get_ns() };
    count(LatencyCounter::Ends);
    let config = config();
    let Some(key) = start_key(ctx, config) else {
        return;
    };
    // SAFETY: the value is copied out before the entry is deleted.
    let Some(mut event) = (unsafe { TRACE_STARTS.get(&key) }).copied() else {
        count(LatencyCounter::EndWithoutStart);
        return;
    };
    let _ = TRACE_STARTS.remove(&key);
    event.latency_ns = now.saturating_sub(event.time_ns);
    if event.latency_ns < config.trace_min_ns {
        count(LatencyCounter::TraceFilteredOut);
        return;
    }
    send_trace(&event, config);
}

/// Sends one record under the per-CPU rate limit.
#[inline(always)]
fn send_trace(event: &TraceEvent, config: &LatencyConfig) {
    if config.trace_max_per_second != 0
        && let Some(rate) = TRACE_RATE.get_ptr_mut(0)
    {
        // SAFETY: reads the monotonic clock.
        let now = unsafe { bpf_ktime_get_ns() };
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        unsafe {
            if now.saturating_sub((*rate)[0]) >= 1_000_000_000 {
                (*rate)[0] = now;
                (*rate)[1] = 0;
            }
            if (*rate)[1] >= config.trace_max_per_second {
                count(LatencyCounter::TraceRateLimited);
                return;
            }
            (*rate)[1] += 1;
        }
    }
    if TRACE_EVENTS.output::<TraceEvent>(event, 0).is_err() {
        count(LatencyCounter::TraceRingFull);
    }
}

/// The record of a hit: thread, the site's arguments in their slots, the
/// string, the thread name; None when the filter leaves it out (counted).
#[inline(always)]
fn trace_record(ctx: &ProbeContext, config: &LatencyConfig, pid_tgid: u64) -> Option<TraceEvent> {
    // SAFETY: the helper only reads the run context's cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let Some(site) = SITES.get(cookie as u32) else {
        count(LatencyCounter::UnknownSite);
        return None;
    };
    let mut event = TraceEvent {
        time_ns: 0,
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        site: cookie as u32,
        read: 0,
        latency_ns: 0,
        args: [0; TRACE_SLOTS],
        comm: [0; 16],
        text: [0; TRACE_TEXT_LEN],
    };
    for slot in 0..TRACE_SLOTS {
        if slot >= config.trace_slots as usize {
            break;
        }
        match args::read(
            ctx,
            &site.trace_args[slot],
            site.site_address,
            config.ip_register,
        ) {
            Some(value) => {
                event.args[slot] = value;
                event.read |= 1 << slot;
            }
            None => count(LatencyCounter::ArgReadFailed),
        }
    }
    if config.filter_op != FILTER_NONE {
        let slot = config.filter_slot as usize;
        if slot >= TRACE_SLOTS || !passes(event.args[slot], config) {
            count(LatencyCounter::TraceFilteredOut);
            return None;
        }
    }
    if let Ok(comm) = bpf_get_current_comm() {
        event.comm = comm;
    }
    let text = config.trace_text_slot as usize;
    if text < TRACE_SLOTS && event.read & (1 << text) != 0 {
        // SAFETY: the helper checks the user address and writes at most
        // text.len() bytes, NUL-terminated.
        if unsafe { bpf_probe_read_user_str_bytes(event.args[text] as *const u8, &mut event.text) }
            .is_err()
        {
            count(LatencyCounter::ArgReadFailed);
        }
    }
    Some(event)
}

/// `--filter`: the slot's value compared with the constant.
#[inline(always)]
fn passes(value: u64, config: &LatencyConfig) -> bool {
    let ordering = if config.filter_signed != 0 {
        (value as i64).cmp(&config.filter_value)
    } else {
        value.cmp(&(config.filter_value as u64))
    };
    match config.filter_op {
        FILTER_EQ => ordering.is_eq(),
        FILTER_NE => ordering.is_ne(),
        FILTER_LT => ordering.is_lt(),
        FILTER_LE => ordering.is_le(),
        FILTER_GT => ordering.is_gt(),
        FILTER_GE => ordering.is_ge(),
        _ => true,
    }
}

/// This CPU's histogram of `key`, created empty on first use.
#[inline(always)]
fn histogram_of(key: &HistKey) -> Option<*mut HistValue> {
    if let Some(value) = HISTOGRAMS.get_ptr_mut(key) {
        return Some(value);
    }
    let zero = ZERO.get(0)?;
    // Another CPU may insert the same key at once: EEXIST is fine.
    match HISTOGRAMS.insert(key, zero, BPF_NOEXIST as u64) {
        Ok(()) => {}
        Err(error) if error == -EEXIST => {}
        Err(_) => {
            count(LatencyCounter::HistogramFull);
            return None;
        }
    }
    let value = HISTOGRAMS.get_ptr_mut(key);
    if value.is_none() {
        count(LatencyCounter::HistogramFull);
    }
    value
}

/// bpftrace's buckets: log2 (`hist()`: 0 for v < 0, 1 for 0, else
/// floor(log2 v) + 2) or linear (`lhist()`: 0 below min, 1 + (v - min) /
/// step inside, n + 1 at or above max).
#[inline(always)]
fn bucket(value: u64, config: &LatencyConfig) -> usize {
    let signed = value as i64;
    if config.linear_buckets == 0 {
        if signed < 0 {
            0
        } else if signed == 0 {
            1
        } else {
            (65 - value.leading_zeros()) as usize
        }
    } else {
        let n = u64::from(config.linear_buckets);
        if signed < config.linear_min {
            0
        } else {
            let offset = (signed.wrapping_sub(config.linear_min) as u64)
                .checked_div(config.linear_step as u64)
                .unwrap_or(0);
            if offset >= n {
                n as usize + 1
            } else {
                offset as usize + 1
            }
        }
    }
}

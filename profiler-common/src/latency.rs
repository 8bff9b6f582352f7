//! Types shared by the latency BPF programs (`profiler-ebpf/src/latency`)
//! and the agent's `latency` command.
//!
//! The programs are arch-neutral: every register they read (an argument, a
//! Go goroutine pointer, the instruction pointer) is named by its byte
//! offset in `struct pt_regs`, which user space computes from the target's
//! architecture and passes in [`LatencyConfig`] and [`SiteConfig`].

/// Slots of one histogram value: log2 needs 65 (bpftrace's `hist()`:
/// v < 0, 0, then one per power of two); a linear layout may use up to
/// `HIST_SLOTS - 2` buckets between min and max.
pub const HIST_SLOTS: usize = 128;

/// Bytes of a string key (`--by str:argN`, `--by comm`). bpftrace's
/// default `strlen` is 64 too.
pub const KEY_TEXT_LEN: usize = 64;

/// Most probe sites one run attaches (entries of the `SITES` array; the
/// attach cookie of each perf event is its index here).
pub const MAX_SITES: u32 = 4096;

/// Most distinct histogram keys (`--by`); further keys are counted as
/// `HistogramFull` errors.
pub const MAX_KEYS: u32 = 4096;

/// Starts waiting for their end (threads or goroutines inside the measured
/// operation at once). An LRU map: a start whose end never comes (thread
/// killed, Go panic) is evicted instead of leaking a slot forever.
pub const MAX_IN_FLIGHT: u32 = 65536;

/// `pt_regs` offset meaning "no register".
pub const NO_REGISTER: u16 = u16::MAX;

/// Where an argument value lives, as [`ArgReader::kind`].
pub const ARG_NONE: u8 = 0;
/// In a register: the `pt_regs` slot at `base`.
pub const ARG_REGISTER: u8 = 1;
/// In user memory at `reg(base) + reg(index) * scale + value`.
pub const ARG_MEMORY: u8 = 2;
/// The constant `value`.
pub const ARG_IMMEDIATE: u8 = 3;
/// In user memory at the link-time address `value` plus the object's load
/// bias, computed in BPF as `ip - SiteConfig::site_address` (the
/// `sym(%rip)` form neither libbpf nor bpftrace 0.17 reads correctly).
pub const ARG_ABSOLUTE: u8 = 4;

/// How to read one USDT argument at a probe site (from its `ArgSpec`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArgReader {
    /// One of `ARG_*`.
    pub kind: u8,
    /// Bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// Non-zero: sign-extend to 64 bits.
    pub signed: u8,
    /// Scale of the index register (1, 2, 4, 8).
    pub scale: u8,
    /// `pt_regs` offset of the register or base register, or `NO_REGISTER`.
    pub base: u16,
    /// `pt_regs` offset of the index register, or `NO_REGISTER`.
    pub index: u16,
    /// Displacement, immediate or link-time address.
    pub value: i64,
}

/// Arguments one traced hit carries (`trace --print`, `--filter`).
pub const TRACE_SLOTS: usize = 4;
/// Bytes of the one string a traced hit carries (`--print str:argN`).
pub const TRACE_TEXT_LEN: usize = 64;
/// "No slot" in the trace fields of [`LatencyConfig`].
pub const TRACE_NO_SLOT: u8 = u8::MAX;

/// `trace --filter 'argN OP VALUE'` operators, as [`LatencyConfig::filter_op`].
pub const FILTER_NONE: u8 = 0;
pub const FILTER_EQ: u8 = 1;
pub const FILTER_NE: u8 = 2;
pub const FILTER_LT: u8 = 3;
pub const FILTER_LE: u8 = 4;
pub const FILTER_GT: u8 = 5;
pub const FILTER_GE: u8 = 6;

/// Per probe site: what the site's key argument is, and where the site is.
/// Indexed by the perf event's BPF cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteConfig {
    /// The argument `--by argN` / `--by str:argN` reads at this site.
    pub key_arg: ArgReader,
    /// Link-time virtual address of the site (for `ARG_ABSOLUTE`).
    pub site_address: u64,
    /// The arguments a traced hit carries, by slot (`trace`); slot i holds
    /// the argument `LatencyConfig::trace_args` names at this site.
    pub trace_args: [ArgReader; TRACE_SLOTS],
}

/// One traced hit, through the `TRACE_EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TraceEvent {
    /// `bpf_ktime_get_ns()` at the hit.
    pub time_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// Index of the site in `SITES`.
    pub site: u32,
    /// Bit i set: slot i was read.
    pub read: u32,
    /// Start/end pairs: nanoseconds from the start (0 for single hits).
    pub latency_ns: u64,
    pub args: [u64; TRACE_SLOTS],
    pub comm: [u8; 16],
    /// The string of `LatencyConfig::trace_text_slot`, NUL-padded.
    pub text: [u8; TRACE_TEXT_LEN],
}

/// What the histogram is keyed by, as [`LatencyConfig::key_kind`].
pub const KEY_NONE: u32 = 0;
/// An integer argument (`--by argN`).
pub const KEY_ARG: u32 = 1;
/// A string in user memory an argument points to (`--by str:argN`).
pub const KEY_STRING_ARG: u32 = 2;
/// The process id.
pub const KEY_PID: u32 = 3;
/// The thread name.
pub const KEY_COMM: u32 = 4;

/// The run's settings: a read-only global (`LATENCY_CONFIG`) the loader
/// sets before loading, so the verifier sees constants and prunes the
/// branches a run does not use.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyConfig {
    /// Nanoseconds per unit (1, 1000, 1000000); durations are divided
    /// before bucketing, as bpftrace's `hist((nsecs - @s[tid]) / 1000)`.
    pub divisor: u64,
    /// Linear layout: the low bound and bucket width; `linear_buckets`
    /// (buckets between min and max) is 0 for log2.
    pub linear_min: i64,
    pub linear_step: i64,
    pub linear_buckets: u32,
    /// One of `KEY_*`.
    pub key_kind: u32,
    /// Only this process (tgid); 0 = every process. The perf events are
    /// already per-process with `--pid`; this is a cheap second guard.
    pub tgid: u32,
    /// `pt_regs` offset of the goroutine pointer (Go: R14 on amd64, X28 on
    /// arm64) to key starts by goroutine; `NO_REGISTER` keys by thread.
    pub goroutine_register: u16,
    /// `pt_regs` offset of the instruction pointer.
    pub ip_register: u16,
    /// `trace`: slots of `SiteConfig::trace_args` in use (0 when not
    /// tracing), the slot whose value points to the string to copy (or
    /// `TRACE_NO_SLOT`), the slot compared by the filter and how
    /// (`FILTER_*`, signed when `filter_signed` is 1).
    pub trace_slots: u8,
    pub trace_text_slot: u8,
    pub filter_slot: u8,
    pub filter_op: u8,
    pub filter_signed: u8,
    /// 1: walk the user stack at each start (or counted hit) and total the
    /// operations per stack (`STACK_TOTALS`).
    pub stacks: u8,
    pub _pad: [u8; 2],
    pub filter_value: i64,
    /// Traced hits per second on one CPU sent to user space at most; more
    /// are counted as `TraceRateLimited`.
    pub trace_max_per_second: u64,
    /// Start/end pairs: only operations at least this long are sent (more
    /// are counted as `TraceFilteredOut`).
    pub trace_min_ns: u64,
    /// Stacks: only operations at least this long are totalled per stack.
    pub stack_min_ns: u64,
}

impl LatencyConfig {
    pub const DEFAULT: LatencyConfig = LatencyConfig {
        divisor: 1,
        linear_min: 0,
        linear_step: 1,
        linear_buckets: 0,
        key_kind: KEY_NONE,
        tgid: 0,
        goroutine_register: NO_REGISTER,
        ip_register: NO_REGISTER,
        trace_slots: 0,
        trace_text_slot: TRACE_NO_SLOT,
        filter_slot: TRACE_NO_SLOT,
        filter_op: FILTER_NONE,
        filter_signed: 0,
        stacks: 0,
        _pad: [0; 2],
        filter_value: 0,
        trace_max_per_second: 0,
        trace_min_ns: 0,
        stack_min_ns: 0,
    };
}

/// Name of the read-only global holding the [`LatencyConfig`].
pub const GLOBAL_LATENCY_CONFIG: &str = "LATENCY_CONFIG";

/// A histogram key: an integer, or a NUL-padded string, or neither.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HistKey {
    pub value: u64,
    pub text: [u8; KEY_TEXT_LEN],
}

impl HistKey {
    pub const ZERO: HistKey = HistKey {
        value: 0,
        text: [0; KEY_TEXT_LEN],
    };
}

/// One key's histogram: hits, the sum of their values, and bucket counts
/// (per CPU; user space adds the CPUs up).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HistValue {
    pub count: u64,
    pub sum: u64,
    pub buckets: [u64; HIST_SLOTS],
}

/// Who a start belongs to: the process and its thread (`pid_tgid`) or its
/// goroutine (the g pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartKey {
    pub tgid: u32,
    /// Nesting level of a start kept in `STARTS` (recursion,
    /// re-entrancy): 0 outermost. Always 0 in `THREADS`' keys.
    pub depth: u32,
    pub id: u64,
}

/// Starts nested on one thread (or goroutine) that are kept apart; a start
/// deeper than this replaces the innermost (counted as `StartReplaced`).
pub const MAX_NESTED_STARTS: u32 = 32;

/// A pending start: when, and the key read at the start probe (arguments
/// are read where the operation begins; at a function's return they are
/// gone).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StartValue {
    pub time_ns: u64,
    pub key: HistKey,
    /// The start's stack (`StackId::hash`), 0 when stacks are off or the
    /// walk found nothing.
    pub stack: u64,
}

/// A thread's (or goroutine's) pending starts: how many, and the innermost
/// one inline, so an operation that does not nest costs one map lookup at
/// its start and one at its end (no insert, no delete once the thread has
/// its entry). The outer ones of nested starts wait in `STARTS` under
/// their level. `top.time_ns` 0: the innermost start was lost (its outer
/// copy was evicted).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PendingStarts {
    pub depth: u32,
    pub _pad: u32,
    pub top: StartValue,
}

/// User frames kept per probe stack (deeper stacks keep their leaf end,
/// counted as `StackCut`).
pub const MAX_PROBE_STACK_FRAMES: usize = 128;

/// Distinct (process, stack) pairs kept; more are counted as
/// `StacksFull` and their operations left out of the stacks profile.
pub const MAX_PROBE_STACKS: u32 = 16384;

/// A stack of one process: a hash of its frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackId {
    pub tgid: u32,
    pub _pad: u32,
    pub hash: u64,
}

/// The frames of a stack, leaf first (`profiler_common::unwind`'s frame
/// encoding: `FRAME_EXACT_PC` marks an exact PC).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProbeStack {
    pub len: u32,
    /// `unwind::UserStackEnd` as a number.
    pub end: u32,
    pub frames: [u64; MAX_PROBE_STACK_FRAMES],
}

/// Operations that began at one stack: how many, and their total latency
/// in nanoseconds (0 for counted hits). Per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackTotals {
    pub count: u64,
    pub sum_ns: u64,
}

/// Indices into the per-CPU `LATENCY_COUNTERS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyCounter {
    /// Start probe hits.
    Starts = 0,
    /// End probe hits.
    Ends = 1,
    /// Count probe hits (`--count`).
    Counts = 2,
    /// An end with no start (the operation began before attaching, or its
    /// start was evicted from the LRU map).
    EndWithoutStart = 3,
    /// The start map refused an insert.
    StartMapFull = 4,
    /// A new key did not fit in the histogram map (`MAX_KEYS`).
    HistogramFull = 5,
    /// Reading an argument (register or user memory) failed; the hit was
    /// recorded under key 0 / the empty string.
    ArgReadFailed = 6,
    /// A perf event's cookie named no configured site.
    UnknownSite = 7,
    /// A hit from another process than `--pid`.
    FilteredOut = 8,
    /// A start nested deeper than `MAX_NESTED_STARTS` on one thread or
    /// goroutine replaced the innermost pending one.
    StartReplaced = 9,
    /// `trace`: hits of the traced probe.
    Traced = 10,
    /// `trace`: hits the filter left out.
    TraceFilteredOut = 11,
    /// `trace`: hits over `trace_max_per_second`, not sent.
    TraceRateLimited = 12,
    /// `trace`: hits the ring buffer had no room for.
    TraceRingFull = 13,
    /// Stacks: a new stack did not fit in the stack maps.
    StacksFull = 14,
    /// Stacks: a walk was cut (a read failed, or deeper than kept).
    StackCut = 15,
}

/// Slots of the counter array.
pub const LATENCY_COUNTER_SLOTS: u32 = 16;

impl LatencyCounter {
    pub const ALL: [LatencyCounter; 16] = [
        LatencyCounter::Starts,
        LatencyCounter::Ends,
        LatencyCounter::Counts,
        LatencyCounter::EndWithoutStart,
        LatencyCounter::StartMapFull,
        LatencyCounter::HistogramFull,
        LatencyCounter::ArgReadFailed,
        LatencyCounter::UnknownSite,
        LatencyCounter::FilteredOut,
        LatencyCounter::StartReplaced,
        LatencyCounter::Traced,
        LatencyCounter::TraceFilteredOut,
        LatencyCounter::TraceRateLimited,
        LatencyCounter::TraceRingFull,
        LatencyCounter::StacksFull,
        LatencyCounter::StackCut,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            LatencyCounter::Starts => "starts",
            LatencyCounter::Ends => "ends",
            LatencyCounter::Counts => "counted",
            LatencyCounter::EndWithoutStart => "ends without a start",
            LatencyCounter::StartMapFull => "start map full",
            LatencyCounter::HistogramFull => "histogram map full",
            LatencyCounter::ArgReadFailed => "argument reads failed",
            LatencyCounter::UnknownSite => "unknown sites",
            LatencyCounter::FilteredOut => "other processes",
            LatencyCounter::StartReplaced => "starts nested too deep (replaced)",
            LatencyCounter::Traced => "hits",
            LatencyCounter::TraceFilteredOut => "left out by the filter",
            LatencyCounter::TraceRateLimited => "dropped over the rate limit",
            LatencyCounter::TraceRingFull => "dropped (ring buffer full)",
            LatencyCounter::StacksFull => "stacks left out (stack map full)",
            LatencyCounter::StackCut => "stacks cut",
        }
    }
}

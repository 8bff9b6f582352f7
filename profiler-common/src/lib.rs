//! Types shared by the BPF programs (`profiler-ebpf`) and the agent.
//!
//! Everything here is `#[repr(C)]` plain data: the BPF side writes it into
//! maps and the ring buffer, the agent reads the same bytes back. With the
//! `user` feature the types implement `aya::Pod` so aya's typed maps accept
//! them.
#![no_std]

pub mod latency;
pub mod offcpu;
pub mod runtimes;
pub mod unwind;

/// Deepest kernel stack for one sample. It matches the kernel's default
/// `kernel.perf_event_max_stack` (127): asking `bpf_get_stack` for more
/// fails with -EFAULT on kernels that keep the default.
pub const MAX_STACK_DEPTH: usize = 127;

/// Deepest user stack our own unwinder walks (the kernel's walk stops at
/// 127; deep recursion needs more). Each frame costs two user-memory
/// reads, so the bound is also a cost bound.
pub const MAX_USER_FRAMES: usize = 1024;

/// Size of the sample ring buffer. Records are variable-length (an 80-byte
/// header and 8 bytes a frame: 30 user and 10 kernel frames take 400
/// bytes): 4 MiB holds over 10,000 of them, 1.6 s of 64 busy CPUs at
/// 100 Hz, for a reader thread that empties it every 100 ms at the latest
/// and is woken when it is a quarter full. The kernel maps the data pages
/// twice into the reader (so a record never wraps), and both count in the
/// agent's RSS: 8 MiB counted 16 MiB there.
pub const RING_BUFFER_BYTES: u32 = 4 << 20;

/// Most pids `--pid` may name at once (entries of the in-kernel filter).
pub const MAX_PID_FILTER: u32 = 1024;

/// Words an interpreter's sections may add after the native part of a
/// user stack (`runtimes`: its frames, two words each, come after the
/// native walk): the interpreters have a room of their own, so a deep
/// native stack never leaves them none.
pub const MAX_SECTION_WORDS: usize = 1024;

/// Words of a user stack: its native part (native frames, runtime frames
/// on the machine stack, activation marks) and its interpreters' sections.
pub const MAX_USER_WORDS: usize = MAX_USER_FRAMES + MAX_SECTION_WORDS;

/// Frames of both stacks of one sample together.
pub const MAX_SAMPLE_FRAMES: usize = MAX_STACK_DEPTH + MAX_USER_WORDS;

/// One stack sample, written by the BPF programs into the ring buffer: a
/// CPU sample (`kind` is `SAMPLE_KIND_CPU`) or one off-CPU interval of a
/// thread (`SAMPLE_KIND_OFF_CPU`, see `offcpu`).
///
/// `frames` holds the kernel stack (`kernel_frames` entries, leaf first),
/// then the user stack (`user_frames` entries, leaf first). The ring-buffer
/// record is cut after the last frame (`Sample::record_len`): a sample
/// carries only what user space reads.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sample {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub time_ns: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// Thread name (`task->comm`), NUL-padded.
    pub comm: [u8; 16],
    pub kernel_frames: u16,
    pub user_frames: u16,
    /// Bit set of `SAMPLE_FLAG_*`.
    pub flags: u16,
    /// How the user stack walk ended: `unwind::UserStackEnd` as a byte.
    pub user_end: u8,
    /// `SAMPLE_KIND_*`.
    pub kind: u8,
    /// Off-CPU: nanoseconds from the switch-out to the switch-in (summed
    /// over `intervals`). 0 for CPU samples.
    pub off_cpu_ns: u64,
    /// Off-CPU: the part of `off_cpu_ns` the thread spent runnable, waiting
    /// for a CPU (from its wakeup, or all of it when it was preempted).
    pub runq_ns: u64,
    /// Off-CPU: the off-CPU time this record stands for. Intervals shorter
    /// than the sampling period are recorded with probability
    /// interval / period and then stand for one period; longer ones stand
    /// for themselves (see `offcpu`).
    pub weight_ns: u64,
    /// Off-CPU: the task state at the switch-out (`offcpu::TASK_*`; 0 when
    /// it was preempted, runnable).
    pub task_state: u32,
    /// Off-CPU: intervals in this record (1).
    pub intervals: u32,
    /// Off-CPU: the user stack this interval's thread left its CPU with,
    /// sent before in a `SAMPLE_KIND_OFF_CPU_STACK` record of the same
    /// thread with this id (0: none; the record's own frames are all it
    /// has). See `offcpu`.
    pub stack_id: u32,
    pub _reserved: u32,
    pub frames: [u64; MAX_SAMPLE_FRAMES],
    /// Room for a `runtimes::go::GoLabels` block after the last frame (the
    /// block goes right after `frames[kernel_frames + user_frames - 1]`,
    /// so with fewer frames it starts inside `frames`).
    pub tail: [u8; core::mem::size_of::<runtimes::go::GoLabels>()],
}

impl Sample {
    /// Bytes before `frames`.
    pub const HEADER_LEN: usize = core::mem::offset_of!(Sample, frames);

    /// Length of a record holding `frames` frames of both stacks.
    pub const fn record_len(frames: usize) -> usize {
        Self::HEADER_LEN + 8 * frames
    }

    /// Length of the record: its frames, then its Go labels when it has
    /// them (`SAMPLE_FLAG_GO_LABELS`).
    pub fn wire_len(&self) -> usize {
        let frames = self.kernel_frames as usize + self.user_frames as usize;
        let labels = match self.go_labels() {
            Some(labels) => labels.len(),
            None => 0,
        };
        Self::record_len(frames) + labels
    }

    /// The Go labels block of a record that carries one
    /// (`SAMPLE_FLAG_GO_LABELS`), after its last frame; `count` is at most
    /// `runtimes::go::MAX_GO_LABELS`.
    pub fn go_labels(&self) -> Option<&runtimes::go::GoLabels> {
        if self.flags & SAMPLE_FLAG_GO_LABELS == 0 {
            return None;
        }
        let frames = self.kernel_frames as usize + self.user_frames as usize;
        if frames > MAX_SAMPLE_FRAMES {
            return None;
        }
        // SAFETY: the block starts 8-byte aligned (after whole frames)
        // within the sample, `tail` leaves room for a whole block after
        // any number of frames, and any bytes are a valid GoLabels.
        let labels = unsafe {
            &*(self as *const Sample)
                .cast::<u8>()
                .add(Self::record_len(frames))
                .cast::<runtimes::go::GoLabels>()
        };
        (labels.count as usize <= runtimes::go::MAX_GO_LABELS
            && labels.entries_len as usize <= runtimes::go::GO_LABELS_ROOM)
            .then_some(labels)
    }

    /// The kernel stack, leaf first.
    pub fn kernel_stack(&self) -> &[u64] {
        let k = (self.kernel_frames as usize).min(MAX_STACK_DEPTH);
        &self.frames[..k]
    }

    /// The user stack, leaf first.
    pub fn user_stack(&self) -> &[u64] {
        let k = (self.kernel_frames as usize).min(MAX_STACK_DEPTH);
        let u = (self.user_frames as usize).min(MAX_USER_WORDS);
        &self.frames[k..k + u]
    }
}

/// `Sample::kind` of a CPU-clock sample.
pub const SAMPLE_KIND_CPU: u8 = 0;
/// `Sample::kind` of an off-CPU interval.
pub const SAMPLE_KIND_OFF_CPU: u8 = 1;
/// `Sample::kind` of the user stack (and Go labels) a thread left its CPU
/// with, named by `stack_id`: not a sample, but the user half of that
/// thread's next off-CPU intervals (see `offcpu`).
pub const SAMPLE_KIND_OFF_CPU_STACK: u8 = 2;
/// `Sample::kind` of a sampled page fault (one in N of the `page-faults`
/// software event): the stack that first touched a page.
pub const SAMPLE_KIND_PAGE_FAULT: u8 = 3;

/// The sample interrupted kernel code (the kernel stack is non-empty).
pub const SAMPLE_FLAG_IN_KERNEL: u16 = 1 << 0;
/// `bpf_get_stack` failed for the kernel stack.
pub const SAMPLE_FLAG_KERNEL_STACK_FAILED: u16 = 1 << 2;
/// The leaf PC is in no mapping the agent registered for the process (code
/// mapped since it last read the process's maps): the sample woke the
/// agent at once.
pub const SAMPLE_FLAG_UNKNOWN_MAPPING: u16 = 1 << 3;
/// A runtime's walker met a thread user space has not told it about (a
/// thread started since it last looked): its frames stayed native, and
/// user space should look again.
pub const SAMPLE_FLAG_RUNTIME_THREAD_UNKNOWN: u16 = 1 << 5;
/// The sample caught a goroutine of a Go process: a `runtimes::go::GoLabels`
/// block follows the frames (`Sample::go_labels`).
pub const SAMPLE_FLAG_GO_LABELS: u16 = 1 << 4;

/// User-space registers an unwinder starts from. On x86_64 `fp` is RBP and
/// `lr` is 0; on arm64 `fp` is X29 and `lr` is X30. `callee` holds the
/// callee-saved registers runtimes keep their state in while their code
/// runs (x86_64: R12, R13, R14, R15; arm64: X22, X26, X27, X28): Go's g
/// (R14, X28), HotSpot's bytecode pointer (R13, X22). They mean that only
/// when the interrupted code was the runtime's, so each runtime checks
/// what it reads.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct UserRegs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
    pub callee: [u64; CALLEE_REGS],
}

/// Callee-saved registers kept in `UserRegs::callee`.
pub const CALLEE_REGS: usize = 4;

/// Declares the kernel counters, one row each: the variant (its slot in
/// the per-CPU `COUNTERS` array), its doc comment (the metric's help), its
/// name in the end-of-run report, and its Prometheus metric. The BPF
/// programs bump a variant; the agent sums the slots over CPUs
/// (`KernelCounters`), `/metrics` and the report read every row. Adding a
/// counter is adding a row here and a `bump` where it happens.
macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $variant:ident = $slot:literal, $name:literal, $metric:literal; )*) => {
        /// Indices into the per-CPU `COUNTERS` array: what happened to
        /// every sample the perf event delivered (see `counters!`).
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $( $(#[doc = $doc])* $variant = $slot, )*
        }

        impl Counter {
            pub const ALL: &'static [Counter] = &[$( Counter::$variant, )*];

            /// The counter's name in the end-of-run report.
            pub const fn name(self) -> &'static str {
                match self { $( Counter::$variant => $name, )* }
            }

            /// Its Prometheus metric (a counter: `..._total`).
            pub const fn metric(self) -> &'static str {
                match self { $( Counter::$variant => $metric, )* }
            }

            /// What it counts: its doc comment.
            pub const fn help(self) -> &'static str {
                match self { $( Counter::$variant => concat!($($doc),*), )* }
            }
        }
    };
}

counters! {
    /// The perf event fired and the program ran.
    Fired = 0, "fired", "profiler_agent_kernel_samples_total";
    /// The sample hit the idle task (pid 0) and was not recorded.
    Idle = 1, "idle", "profiler_agent_kernel_samples_idle_total";
    /// The sample belonged to a process outside the `--pid` filter.
    FilteredOut = 2, "filtered_out", "profiler_agent_kernel_samples_filtered_out_total";
    /// The sample was written to the ring buffer.
    Sent = 3, "sent", "profiler_agent_kernel_samples_sent_total";
    /// The ring buffer was full: the sample was lost.
    RingBufferFull = 4, "ring_buffer_full", "profiler_agent_kernel_samples_dropped_total";
    /// A user-memory read failed during the user stack walk (sample still
    /// sent with the frames found so far).
    UserStackFailed = 5, "user_stack_failed", "profiler_agent_kernel_user_stack_failed_total";
    /// `bpf_get_stack` failed for the kernel stack (sample still sent).
    KernelStackFailed = 6, "kernel_stack_failed", "profiler_agent_kernel_kernel_stack_failed_total";
    /// The user stack walk hit `MAX_USER_FRAMES`.
    UserStackTruncated = 7, "user_stack_truncated", "profiler_agent_stacks_truncated_total";
    /// User frames unwound with a table row (not frame pointers).
    FramesFromTables = 8, "frames_from_tables", "profiler_agent_kernel_frames_from_tables_total";
    /// Frames where the table's CFI had a rule the walker does not model
    /// (a CFA kept in another register or computed by an expression), so
    /// the frame pointer was used instead.
    FramesUnsupportedCfi = 9, "frames_unsupported_cfi", "profiler_agent_kernel_frames_unsupported_cfi_total";
    /// User frames unwound through a signal frame (registers from the
    /// signal's ucontext).
    SignalFrames = 10, "signal_frames", "profiler_agent_kernel_signal_frames_total";
    /// Off-CPU: a traced thread left its CPU (blocked or preempted).
    OffCpuSwitches = 11, "off_cpu_switches", "profiler_agent_off_cpu_switches_total";
    /// Off-CPU: intervals shorter than the minimum, not recorded.
    OffCpuShort = 12, "off_cpu_short", "profiler_agent_kernel_off_cpu_short_total";
    /// Off-CPU: intervals shorter than the sampling period left out by
    /// the weighted draw (the recorded ones stand for them).
    OffCpuUnsampled = 13, "off_cpu_unsampled", "profiler_agent_kernel_off_cpu_unsampled_total";
    /// Off-CPU: interval records written to the ring buffer.
    OffCpuSent = 14, "off_cpu_sent", "profiler_agent_kernel_off_cpu_sent_total";
    /// Off-CPU: intervals lost because the thread was switched out twice
    /// with no switch-in seen between.
    OffCpuLost = 15, "off_cpu_lost", "profiler_agent_kernel_off_cpu_lost_total";
    /// Off-CPU: records lost to a full ring buffer.
    OffCpuRingBufferFull = 16, "off_cpu_ring_buffer_full", "profiler_agent_kernel_off_cpu_dropped_total";
    /// Samples of a Go process that found the running goroutine (and
    /// copied its labels).
    GoLabelsRead = 17, "go_labels_read", "profiler_agent_kernel_go_labels_read_total";
    /// Of those, samples whose labels were cut: more than
    /// `runtimes::go::MAX_GO_LABELS`, or a key or value longer than kept.
    GoLabelsCut = 18, "go_labels_cut", "profiler_agent_kernel_go_labels_cut_total";
    /// Walks cut because they switched between the native walker and a
    /// runtime's more often than one program run may tail-call
    /// (`runtimes::MAX_CHAIN_CALLS`): their outer frames are missing.
    ChainCut = 19, "chain_cut", "profiler_agent_kernel_chain_cut_total";
    /// Tail calls into a walker that failed (its program not loaded: a
    /// runtime switched off); the walk went on without it.
    ChainMissing = 20, "chain_missing", "profiler_agent_kernel_chain_missing_total";
    /// Off-CPU: user stacks written to the ring buffer (a thread's stack
    /// at a switch-out, when it differs from the last one sent for it).
    OffCpuStacksSent = 24, "off_cpu_stacks_sent", "profiler_agent_kernel_off_cpu_stacks_sent_total";
    /// User frames of Go code unwound by their frame record without a
    /// table lookup: callers inside `UnwindMapping::frame_record_callers`
    /// (the tables say the same there; the record is one read fewer).
    FramesFromFrameRecords = 25, "frames_from_frame_records", "profiler_agent_kernel_frames_from_frame_records_total";
}

/// Number of `Counter` slots.
pub const COUNTER_SLOTS: u32 = 32;

/// Name of the read-only global that switches the in-kernel pid filter on.
/// The loader sets it (`EbpfLoader::set_global`) before loading, so the
/// verifier sees a constant and prunes the filter when it is off.
pub const GLOBAL_FILTER_PIDS: &str = "FILTER_PIDS";

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data with no padding-sensitive invariants;
    // any bit pattern is a valid value.
    unsafe impl aya::Pod for super::Sample {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UserRegs {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::offcpu::OffCpuThread {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::unwind::UnwindRowBlock {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::unwind::UnwindPage {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::unwind::UnwindRule {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::unwind::UnwindMapping {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::unwind::ProcessUnwind {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::runtimes::go::GoProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::runtimes::ProcessRegions {}
    // SAFETY: as above (latency types: integers and byte arrays).
    unsafe impl aya::Pod for super::latency::LatencyConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::SiteConfig {}
    // SAFETY: as above; read from the ring buffer by copying its bytes.
    unsafe impl aya::Pod for super::latency::TraceEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::HistKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::HistValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::StackId {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::ProbeStack {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::StackTotals {}
}

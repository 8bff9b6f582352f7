//! Unwind tables as the BPF stack walker reads them.
//!
//! User space turns what it knows about an object's code (Go's pcsp tables,
//! `.eh_frame`/`.debug_frame` CFI) into *rows*: from an address on, one
//! *rule* says how to find the caller's frame. The walker finds the row for
//! a PC in four array lookups and no hash lookup:
//!
//! 1. the process's mapping (`UnwindMapping`): a binary search over the
//!    process's sorted mappings (a per-pid hash lookup once per sample gives
//!    their range);
//! 2. the mapping's *page* (`UnwindPage`): the object's rows are indexed by
//!    4 KiB page of its address space, so a search never spans more than
//!    one page's rows (libc: 60 rows a page on average, 6 halvings);
//! 3. the row (`UnwindRow`, 4 bytes): the last one in the page whose
//!    `pc_low` is at or below the PC;
//! 4. the rule (`UnwindRule`): rules are deduplicated node-wide (libc's
//!    thousands of rows use a few hundred distinct rules), so a row only
//!    names one.
//!
//! Rows, pages and rules of an object are loaded once per node and shared by
//! every process that maps it. The walker keeps the rules it found, per CPU,
//! for the next samples (`RULE_CACHE_SLOTS`): most lookups end there.

/// log2 of the bytes of object address space one page of rows covers.
/// 4 KiB pages: 8 bytes of page index per 4 KiB of code (0.2%), and few
/// rows to search in each.
pub const UNWIND_PAGE_SHIFT: u32 = 12;

/// Rows in one element of the row array. Array elements are rounded up to
/// 8 bytes by the kernel; blocks of 4-byte rows keep that padding away.
pub const UNWIND_ROWS_PER_BLOCK: u32 = 16;

/// One row: from `pc_low` (an offset inside its page) up to the next row,
/// the caller is found by rule `rule`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc_low: u16,
    pub rule: u16,
}

/// The element type of the row array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRowBlock {
    pub rows: [UnwindRow; UNWIND_ROWS_PER_BLOCK as usize],
}

/// The rows of one page of an object: `row_count` rows from
/// `first_row` on (row indices, not blocks). A page with rows always has one
/// at `pc_low` 0 (carried over from the page before), so every PC of the
/// page finds one. `row_count == 0`: no table here (walk frame pointers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindPage {
    pub first_row: u32,
    pub row_count: u32,
}

/// How to find the caller's registers (pc, sp, fp) from a frame's.
///
/// The canonical frame address (CFA) is the caller's SP after the call
/// returns. The return address is at `CFA + ra_offset` (x86_64: always
/// -8), or still in the link register when `ra_offset == 0` (arm64 leaf
/// code and prologues). The caller's frame pointer is at
/// `CFA + fp_offset` (or `FP + fp_offset` with `RULE_FLAG_FP_FROM_FP`), or
/// unchanged when `fp_offset == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnwindRule {
    /// `RULE_*`.
    pub kind: u8,
    /// `RULE_FLAG_*`.
    pub flags: u8,
    /// `RULE_PLT`: the PC's offset in its 16-byte entry from which the CFA
    /// is 8 bytes further (the entry's `jmp` pushed nothing, its `push` did).
    /// `RULE_GO_CGOCALL`: where g is kept.
    /// `RULE_RUNTIME` and `RULE_FLAG_INTERPRETER`: the runtime's id.
    pub param: i16,
    /// 32-bit offsets: big frames save registers tens of KiB below the CFA
    /// (arm64 glibc has `c-33392`). 16 bytes in all, which is also the
    /// array's element stride (the kernel rounds array elements up to 8
    /// bytes; user space writes them through a mapping of the array).
    pub fp_offset: i32,
    pub ra_offset: i32,
    pub cfa_offset: i32,
}

/// No table rule for this code: walk the frame-pointer chain. Rule index 0
/// is always this rule.
pub const RULE_FRAME_POINTER: u8 = 0;
/// CFA = SP + cfa_offset.
pub const RULE_CFA_SP: u8 = 1;
/// CFA = FP + cfa_offset.
pub const RULE_CFA_FP: u8 = 2;
/// CFA = *(FP + cfa_offset): a frame that realigned its stack and kept the
/// CFA in a slot below its frame pointer (GCC's DRAP: `DW_CFA_def_cfa_expression:
/// DW_OP_breg6 (rbp): -8; DW_OP_deref`).
pub const RULE_CFA_DEREF_FP: u8 = 3;
/// A PLT entry: CFA = SP + cfa_offset, plus 8 once the PC is `param` or more
/// bytes into its 16-byte entry.
pub const RULE_PLT: u8 = 4;
/// A signal trampoline (x86_64 `__restore_rt`, arm64 `__kernel_rt_sigreturn`,
/// Go's `runtime.sigreturn__sigaction`): the interrupted registers are in the
/// `ucontext` of the signal frame at SP.
pub const RULE_SIGNAL: u8 = 5;
/// A frame the walker cannot pass (a stack switch it does not know).
pub const RULE_STOP: u8 = 6;
/// The outermost frame of a stack (`_start`, `clone`, Go's `runtime.goexit`).
pub const RULE_ROOT: u8 = 7;
/// Go's `runtime.asmcgocall` on amd64, as a caller: C code runs on the
/// system stack, where asmcgocall keeps the goroutine's stack depth at
/// SP + cfa_offset and its g at SP + param (runtime/asm_amd64.s: 0 and 8
/// since Go 1.23, 40 and 48 before). The SP it saved is
/// `g.stack.hi - depth` (g = 0: the depth slot holds that SP itself), and
/// its return address is `ra_offset` bytes above that SP (8 when it pushed
/// a frame pointer, saved at CFA + fp_offset).
pub const RULE_GO_CGOCALL: u8 = 8;

/// Go's `runtime.cgocallback` on the goroutine's stack, as a caller (Go code
/// called from C): the frame Go built there returns into Go as if C had not
/// run, but the C frames that called back are on the system stack, where
/// cgocallback's own frame has the same size at `g0.sched.sp` (g.m at 48,
/// m.g0 at 0, g.sched.sp at 56 in every Go version since 1.17). CFA =
/// that SP + cfa_offset, as RULE_CFA_SP. Without a valid g (the g register
/// at the sample, checked against the goroutine's stack bounds), the rule
/// is RULE_CFA_SP on the goroutine's stack (Go's own traceback).
pub const RULE_GO_CGOCALLBACK: u8 = 9;

/// A runtime's code in an object (its id in `param`): the runtime's walker
/// steps these frames (see `runtimes`), and the native walker hands the
/// walk over when the PC enters it.
pub const RULE_RUNTIME: u8 = 10;

/// The caller's frame pointer cannot be recovered (saved in a register or
/// by an expression): it becomes 0.
pub const RULE_FLAG_FP_LOST: u8 = 1 << 0;
/// `fp_offset` is relative to the frame pointer, not the CFA.
pub const RULE_FLAG_FP_FROM_FP: u8 = 1 << 1;
/// With `RULE_FRAME_POINTER`: the CFI had a rule the walker does not model
/// (a CFA in another register or an expression); the frame pointer is the
/// fallback, and the walker counts it.
pub const RULE_FLAG_UNSUPPORTED: u8 = 1 << 2;
/// The code is an interpreter's eval loop (CPython's
/// `_PyEval_EvalFrameDefault`), the interpreter's id in `param`: the
/// walker writes an activation mark in place of its native frame (the
/// interpreter's frames take its place later, see `runtimes`), then
/// unwinds it by the rest of the rule. Never on a `RULE_PLT` or
/// `RULE_GO_CGOCALL` row, whose `param` is theirs.
pub const RULE_FLAG_INTERPRETER: u8 = 1 << 3;
/// Go code entered by a call its signal handler faked (`runtime.asyncPreempt`
/// for asynchronous preemption, `runtime.sigpanic` for a fault): the
/// caller's PC is the one the signal interrupted, exact, not a return
/// address; on arm64 the handler also moved SP 16 bytes down to save the
/// interrupted LR there, so the caller's SP is 16 above the CFA and its LR,
/// if it has not saved it yet, is that word (runtime/traceback.go,
/// `injectedCall`; runtime/signal_arm64.go, `pushCall`).
pub const RULE_FLAG_GO_INJECTED_CALL: u8 = 1 << 4;
/// Bytes Go's arm64 signal handler takes below the interrupted SP to save
/// the interrupted LR before it fakes a call (16 for the stack's
/// alignment; runtime/signal_arm64.go, `pushCall` and `preparePanic`).
/// The walker and the goroutine dump both step over them.
pub const GO_ARM64_INJECTED_CALL_SLOT: u64 = 16;

/// A mapping of a process whose object has a table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    /// Runtime address range of the mapping.
    pub start: u64,
    pub end: u64,
    /// Runtime address of the start of the table's page 0.
    pub base: u64,
    /// The object's pages in the page array.
    pub first_page: u32,
    pub page_count: u32,
    /// Where a caller's frame is its frame record: in these ranges of the
    /// object (offsets from `base`; `len` 0 for none), a frame that is
    /// not the leaf and whose PC is a return address unwinds exactly as a
    /// frame-pointer step does, and the walker takes that step without
    /// looking its rule up. User space sets them for Go code on x86-64
    /// built by Go 1.21 or later, whose compiler gives every function
    /// that calls a frame record with BP pointing at it, leaving out the
    /// functions whose step is special or that may call without one
    /// (assembly without a frame; see `profiler-runtimes`' go::unwind).
    pub frame_record_callers: [CodeRange; FRAME_RECORD_RANGES],
}

/// Ranges of `UnwindMapping::frame_record_callers` per mapping: the largest
/// stretches between the functions left out (a Go 1.27 binary's eight
/// largest cover 95% of its text).
pub const FRAME_RECORD_RANGES: usize = 8;

/// A range of an object's code, as offsets from its table's base.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CodeRange {
    pub start: u32,
    pub len: u32,
}

/// Where one process's mappings are in the mapping array: sorted by start,
/// disjoint.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessUnwind {
    pub first_mapping: u32,
    pub mapping_count: u32,
    /// Unique to this registration of the process's mappings (never 0):
    /// user space takes a new one each time it writes the entry, so a rule
    /// the walker cached under it (`RULE_CACHE_SLOTS`) is still the rule
    /// of the tables this entry points at. A table is only evicted or its
    /// rows reused after every process using it was registered again.
    pub generation: u32,
}

/// Rules the walker keeps in its per-CPU walk state, across samples, by
/// (code granule, process generation): a service's stacks return to the
/// same few hundred addresses sample after sample, and its leaves run in a
/// few hot loops. A kept rule is one read next to the walk's own state,
/// where the table search is four reads across arrays of megabytes, each
/// on a page whose address translation the last 10 ms evicted (see
/// docs/architecture.md, "Measured inside one program"). A power of two.
pub const RULE_CACHE_SLOTS: u32 = 512;

/// log2 of the bytes of code one slot of the rule cache covers: the slot
/// keeps the part of its granule one row covers, so PCs anywhere in a hot
/// loop (a leaf's) share one slot.
pub const RULE_CACHE_GRANULE_SHIFT: u32 = 6;

/// Set on a user frame whose address is exact, not a return address: the
/// trampoline of a signal frame (the kernel made it the handler's return
/// address; no call precedes it) and the PC the signal interrupted. User
/// space looks such a frame up as is instead of one byte back. User
/// addresses never reach bit 63.
pub const FRAME_EXACT_PC: u64 = 1 << 63;

/// Default sizes of the unwinder's arrays. The agent sets the row array's
/// size from its configured memory bound at load time.
pub const DEFAULT_UNWIND_ROW_BLOCKS: u32 = 1 << 18;
/// Pages of all tables (8 bytes each; 2^19 pages cover 2 GiB of code, the
/// text of hundreds of distinct large binaries).
pub const MAX_UNWIND_PAGES: u32 = 1 << 19;
/// Distinct rules node-wide (rows name them with a u16).
pub const MAX_UNWIND_RULES: u32 = 1 << 16;
/// Mappings with tables of all processes together.
pub const MAX_UNWIND_MAPPINGS: u32 = 1 << 16;
/// Mappings with tables of one process (a binary search of at most 12 steps).
pub const MAX_PROCESS_UNWIND_MAPPINGS: u32 = 4096;
/// Processes with tables at once.
pub const MAX_UNWIND_PROCESSES: u32 = 16384;

/// How a user stack walk ended (`Sample::user_end`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UserStackEnd {
    /// No user stack (a kernel thread, or no user registers).
    None = 0,
    /// At the outermost frame: a table row said so (return address
    /// undefined: `_start`, `clone3`, Go's `runtime.goexit`), or a return
    /// address of 0.
    Root = 1,
    /// The frame-pointer chain ended in code no table covers: the stack
    /// may be cut there (an object without a table).
    NoTable = 2,
    /// A table row said the frame cannot be passed (a stack switch), or
    /// gave a frame that cannot be right (CFA below SP).
    TableStop = 3,
    /// Reading the user stack failed (paged out or not mapped).
    ReadFault = 4,
    /// `MAX_USER_FRAMES` reached.
    Truncated = 5,
}

impl UnwindRule {
    /// This rule, marking an eval loop of interpreter `runtime`.
    pub const fn interpreter(mut self, runtime: u8) -> UnwindRule {
        self.flags |= RULE_FLAG_INTERPRETER;
        self.param = runtime as i16;
        self
    }
}

impl UserStackEnd {
    pub const ALL: [UserStackEnd; 6] = [
        UserStackEnd::None,
        UserStackEnd::Root,
        UserStackEnd::NoTable,
        UserStackEnd::TableStop,
        UserStackEnd::ReadFault,
        UserStackEnd::Truncated,
    ];

    pub fn from_u8(value: u8) -> Option<Self> {
        Self::ALL.get(value as usize).copied()
    }

    pub const fn name(self) -> &'static str {
        match self {
            UserStackEnd::None => "none",
            UserStackEnd::Root => "root",
            UserStackEnd::NoTable => "no_table",
            UserStackEnd::TableStop => "table_stop",
            UserStackEnd::ReadFault => "read_fault",
            UserStackEnd::Truncated => "truncated",
        }
    }
}

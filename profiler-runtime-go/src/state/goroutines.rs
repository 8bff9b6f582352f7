//! A Go process's goroutines, read from its memory: every goroutine's
//! state, wait reason, thread and stack, printed as the program's own
//! `pprof.Lookup("goroutine").WriteTo(w, 2)` prints them, and counted by
//! stack as its goroutine profile.
//!
//! The runtime lists every goroutine it ever made in `allgs` (read as
//! `forEachGRace` does: `allglen` entries at `allgptr`); dead ones are
//! kept for reuse and left out, as are the runtime's own. A parked
//! goroutine's stack is walked by frame pointers from where it parked
//! (`g.sched`), within its stack's bounds. A running goroutine's state is
//! in its thread's registers, not in memory: it is shown as Go shows a
//! goroutine running on another thread, with that thread's id.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use profiler_profile::{Profile, ProfileBuilder, ProfileKind, Sample};

use super::frames::{self, Frame};
use super::freeze::Freeze;
use super::layout::{
    RuntimeLayout, STATUS_DEAD, STATUS_DEAD_EXTRA, STATUS_LEAKED, STATUS_NAMES, STATUS_RUNNING,
    STATUS_SCAN, STATUS_SYSCALL, STATUS_WAITING,
};
use super::{GoTarget, StateError, globals};
use crate::unwind::INJECTED_CALLS;
use profiler_common::unwind::GO_ARM64_INJECTED_CALL_SLOT;
use profiler_runtime::memory::Memory;

/// Most goroutines read: a million parked goroutines is a program in
/// trouble already; a longer list is forged.
pub const MAX_GOROUTINES: u64 = 1 << 20;
/// Deepest stack walked (physical frames).
pub const MAX_FRAMES: usize = 1024;
/// Most frames kept over all goroutines (64 MiB): past it, stacks are
/// not walked (a forged million goroutines of the deepest stacks would
/// hold a billion).
pub const MAX_TOTAL_FRAMES: usize = 1 << 23;
/// Most labels read per goroutine, and longest label text.
const MAX_LABELS: u64 = 64;
const MAX_TEXT: u64 = 4096;
/// `g` bytes read: every field used lies before this, in every version.
const G_BYTES: usize = 368;
/// The largest goroutine stack Go allows (`maxstacksize`, 1 GB on 64-bit
/// systems): a larger one was forged.
const MAX_STACK_BYTES: u64 = 1 << 30;

/// One goroutine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Goroutine {
    pub goid: u64,
    /// `atomicstatus`, the scan bit included.
    pub status: u32,
    /// The wait reason's text, when waiting for one.
    pub wait_reason: Option<String>,
    /// Whole minutes blocked, as the runtime counts them (from the last GC
    /// that saw the goroutine blocked).
    pub minutes: u64,
    pub locked_to_thread: bool,
    /// The thread running it (running goroutines, and those in a system
    /// call).
    pub thread: Option<u32>,
    /// Return addresses, innermost first (empty while running, unless
    /// read from its stopped thread's registers). The PC a call faked by
    /// the signal handler returns to (a preempted goroutine's, under
    /// `runtime.asyncPreempt`) is given + 1, as the runtime gives it.
    pub pcs: Vec<u64>,
    /// `pcs[0]` is the PC its thread was stopped at, not a return
    /// address.
    pub from_registers: bool,
    /// The stack walk stopped at the frame limit or at a bad frame.
    pub truncated: bool,
    /// Where it was started: the `go` statement's address, and the
    /// goroutine that ran it (Go 1.21 on).
    pub created_at: u64,
    pub parent: Option<u64>,
    /// pprof labels, sorted by key.
    pub labels: Vec<(String, String)>,
}

impl Goroutine {
    fn base_status(&self) -> u32 {
        self.status & !STATUS_SCAN
    }

    pub fn is_running(&self) -> bool {
        self.base_status() == STATUS_RUNNING
    }
}

/// A goroutine's stack read in large pieces: a walk reads a word per
/// frame, and a read per word would cost a system call each.
struct StackWindow {
    hi: u64,
    start: u64,
    bytes: Vec<u8>,
}

/// Largest piece of a stack read at once.
const STACK_PIECE: u64 = 64 << 10;

impl StackWindow {
    fn new(hi: u64) -> Self {
        StackWindow {
            hi,
            start: 0,
            bytes: Vec::new(),
        }
    }

    /// The word at `at`: from the piece read, else from a new piece that
    /// starts there and runs to the stack's top (or `STACK_PIECE`).
    fn u64(&mut self, memory: &impl Memory, at: u64) -> Option<u64> {
        let inside = at >= self.start
            && at.saturating_add(8) <= self.start.saturating_add(self.bytes.len() as u64);
        if !inside {
            let len = self.hi.saturating_sub(at).clamp(8, STACK_PIECE);
            self.bytes = memory
                .bytes(at, len as usize)
                .or_else(|_| memory.bytes(at, 8))
                .ok()?;
            self.start = at;
        }
        let o = (at - self.start) as usize;
        Some(u64::from_le_bytes(
            self.bytes.get(o..o + 8)?.try_into().ok()?,
        ))
    }
}

/// What an entry of `allgs` holds.
enum Entry {
    /// Exited, kept for reuse.
    Dead,
    /// One of the runtime's own.
    System,
    /// Impossible values (a status Go does not have, a stack past Go's
    /// 1 GB limit): a forged or corrupt runtime, not a race.
    Malformed,
    User(Goroutine),
}

/// Every user goroutine of one process at one instant.
#[derive(Debug, Clone, Default)]
pub struct Goroutines {
    pub goroutines: Vec<Goroutine>,
    /// The runtime's own goroutines, left out (as Go's dump does).
    pub system: usize,
    /// Entries that could not be read.
    pub unreadable: usize,
    /// Entries with impossible values (a status Go does not have, a stack
    /// past Go's 1 GB limit): forged or corrupt, left out.
    pub malformed: usize,
    /// Goroutines still changing after three reads: shown as last read.
    pub torn: usize,
    /// The process was stopped while read (`Freeze`).
    pub frozen: bool,
}

impl GoTarget {
    /// The process's goroutines now, read while it runs.
    pub fn goroutines(&self) -> Result<Goroutines, StateError> {
        self.goroutines_with(None)
    }

    /// The process's goroutines; with `freeze` (the process stopped), the
    /// running ones' stacks from their threads' registers.
    pub fn goroutines_with(&self, freeze: Option<&Freeze>) -> Result<Goroutines, StateError> {
        let layout = RuntimeLayout::of(self.minor).ok_or_else(|| StateError::UnknownVersion {
            pid: self.pid,
            version: self.version.clone(),
            what: "the layout of its goroutines is not known",
        })?;
        let count = self.u64(self.address(globals::ALLGLEN)?, "runtime.allglen")?;
        let array = self.u64(self.address(globals::ALLGPTR)?, "runtime.allgptr")?;
        if count > MAX_GOROUTINES {
            return Err(self.read_error(
                "runtime.allglen",
                format!("{count} goroutines (at most {MAX_GOROUTINES} are read)"),
            ));
        }
        let wait_reasons = self.wait_reasons();
        let now = monotonic_ns();
        let mut result = Goroutines {
            frozen: freeze.is_some(),
            ..Goroutines::default()
        };
        let mut seen = HashSet::new();
        let mut frames = 0;
        // The array in chunks: one read per 512 goroutines.
        for chunk_start in (0..count).step_by(512) {
            let n = (count - chunk_start).min(512);
            let bytes = self
                .memory
                .bytes(array.wrapping_add(chunk_start * 8), (n * 8) as usize)
                .map_err(|e| self.read_error("runtime.allgs", e))?;
            for (i, word) in bytes.chunks_exact(8).enumerate() {
                let g = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                if g == 0 || !seen.insert(g) {
                    result.unreadable += 1;
                    continue;
                }
                let walk = frames < MAX_TOTAL_FRAMES;
                // A goroutine may move on while read (the process runs):
                // read again while its state or saved PC changed.
                let mut entry = self.goroutine(g, &layout, &wait_reasons, now, walk, freeze);
                for attempt in 0..3 {
                    match &entry {
                        Ok(Entry::User(goroutine)) if !self.settled(g, &layout, goroutine) => {
                            if attempt == 2 {
                                result.torn += 1;
                                break;
                            }
                            entry = self.goroutine(g, &layout, &wait_reasons, now, walk, freeze);
                        }
                        _ => break,
                    }
                }
                match entry {
                    Ok(Entry::User(goroutine)) => {
                        frames += goroutine.pcs.len();
                        result.goroutines.push(goroutine);
                    }
                    Ok(Entry::System) => result.system += 1,
                    Ok(Entry::Malformed) => result.malformed += 1,
                    Ok(Entry::Dead) => {}
                    Err(_) if chunk_start + (i as u64) > 0 => result.unreadable += 1,
                    Err(e) => return Err(e),
                }
                if chunk_start == 0 && i == 0 {
                    // allgs[0] is the main goroutine, alive as long as the
                    // process: goid 1, or the offsets are not this
                    // runtime's.
                    let goid =
                        self.u64(g.wrapping_add(layout.g_goid), "the main goroutine's goid")?;
                    if goid != 1 {
                        return Err(self.read_error(
                            "runtime.allgs",
                            format!(
                                "its first goroutine has id {goid}, not 1: the runtime's layout \
                                 is not that of {}",
                                self.version
                            ),
                        ));
                    }
                }
            }
        }
        Ok(result)
    }

    /// One entry of `allgs`.
    fn goroutine(
        &self,
        g: u64,
        layout: &RuntimeLayout,
        wait_reasons: &[String],
        now: u64,
        walk: bool,
        freeze: Option<&Freeze>,
    ) -> Result<Entry, StateError> {
        let bytes = self
            .memory
            .bytes(g, G_BYTES)
            .map_err(|e| self.read_error(format!("goroutine at {g:#x}"), e))?;
        let u64_at = |o: u64| {
            let o = o as usize;
            u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
        };
        let status = u64_at(layout.g_status) as u32;
        let base = status & !STATUS_SCAN;
        if base == STATUS_DEAD || (self.minor >= 26 && base == STATUS_DEAD_EXTRA) {
            return Ok(Entry::Dead);
        }
        let (lo, hi) = (u64_at(layout.g_stack_lo), u64_at(layout.g_stack_hi));
        if base as usize >= super::layout::STATUS_NAMES.len()
            || lo > hi
            || hi - lo > MAX_STACK_BYTES
        {
            return Ok(Entry::Malformed);
        }
        let start = u64_at(layout.g_startpc);
        if self.is_system(start) {
            return Ok(Entry::System);
        }
        let goid = u64_at(layout.g_goid);
        let waiting = base == STATUS_WAITING || (self.minor >= 26 && base == STATUS_LEAKED);
        let reason_index = bytes[layout.g_waitreason as usize] as usize;
        let wait_reason = (waiting && reason_index != 0).then(|| {
            wait_reasons
                .get(reason_index)
                .cloned()
                .unwrap_or_else(|| "unknown wait reason".to_string())
        });
        let since = u64_at(layout.g_waitsince) as i64;
        let minutes = if (waiting || base == STATUS_SYSCALL) && since > 0 {
            (now as i64).saturating_sub(since).max(0) as u64 / 60_000_000_000
        } else {
            0
        };
        let m = u64_at(layout.g_m);
        let thread = if m != 0 {
            self.memory
                .u64(m.wrapping_add(layout.m_procid))
                .ok()
                .and_then(|t| u32::try_from(t).ok())
        } else {
            None
        };
        // A running goroutine's PC and SP are its thread's registers; the
        // thread may be on its own system stack (runtime or C code), then
        // the goroutine's stack is not where it is.
        let registers = freeze
            .zip(thread)
            .and_then(|(freeze, tid)| freeze.registers(tid))
            .filter(|r| base == STATUS_RUNNING && lo <= r.sp && r.sp < hi);
        let from_registers = registers.is_some();
        let (pcs, truncated) = if !walk {
            (Vec::new(), true)
        } else if let Some(r) = registers {
            self.walk(r.pc, r.sp, lo, hi, r.lr)
        } else if base == STATUS_RUNNING {
            (Vec::new(), false)
        } else {
            self.walk(
                u64_at(layout.g_sched_pc),
                u64_at(layout.g_sched_sp),
                lo,
                hi,
                None,
            )
        };
        Ok(Entry::User(Goroutine {
            goid,
            status,
            wait_reason,
            minutes,
            locked_to_thread: u64_at(layout.g_lockedm) != 0,
            thread,
            pcs,
            from_registers,
            truncated,
            created_at: u64_at(layout.g_gopc),
            parent: layout.g_parent_goid.map(u64_at).filter(|&p| p != 0),
            labels: label_set(&self.memory, u64_at(layout.g_labels), layout.labels_in_map),
        }))
    }

    /// Whether the goroutine at `g` is still as read: the same status and,
    /// parked, the same saved PC (one read covers both).
    fn settled(&self, g: u64, layout: &RuntimeLayout, goroutine: &Goroutine) -> bool {
        let from = layout.g_sched_pc;
        let Ok(bytes) = self
            .memory
            .bytes(g.wrapping_add(from), (layout.g_status + 4 - from) as usize)
        else {
            return false;
        };
        let at = |offset: u64, len: usize| {
            let o = (offset - from) as usize;
            bytes.get(o..o + len)
        };
        let status = at(layout.g_status, 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")));
        let pc = at(layout.g_sched_pc, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
        status == Some(goroutine.status)
            && (goroutine.is_running()
                || goroutine.pcs.is_empty()
                || pc == goroutine.pcs.first().copied())
    }

    /// Whether a goroutine started at `start` is the runtime's own
    /// (`isSystemGoroutine`): a `runtime.` function other than
    /// `runtime.main`. The finalizer and cleanup goroutines count as the
    /// runtime's here even while they run user code (Go counts them as
    /// user code then), as which of the two they are doing is not in
    /// memory we read.
    fn is_system(&self, start: u64) -> bool {
        let Some(function) = self.symbols.function(self.link_address(start)) else {
            return false;
        };
        let name = function.name();
        name.starts_with("runtime.")
            && !matches!(
                &*name,
                "runtime.main" | "runtime.handleAsyncEvent" | "runtime.corostart"
            )
    }

    /// Return addresses from a parked goroutine's saved PC and stack
    /// pointer, by the functions' pcsp tables as the runtime's own
    /// traceback walks (frame pointers would do for most frames, but a
    /// goroutine in a system call before Go 1.23 saved no frame pointer):
    /// a function's SP delta at a PC gives its frame; the return address
    /// is at its top (amd64) or at SP, where the prologue saved LR
    /// (arm64). Stops at the outermost function (`goexit`), at a PC
    /// outside the pclntab, or when the stack pointer leaves the stack.
    ///
    /// A goroutine preempted asynchronously is parked under
    /// `runtime.asyncPreempt`, which its signal handler entered by faking a
    /// call from the interrupted PC (`sigpanic` the same way): that PC is
    /// exact, and is given as PC + 1, the runtime's own convention for a
    /// frame no call made (runtime/traceback.go, `tracebackPCs`); on arm64
    /// the handler saved the interrupted LR in 16 bytes below the
    /// interrupted SP.
    fn walk(
        &self,
        mut pc: u64,
        mut sp: u64,
        lo: u64,
        hi: u64,
        mut lr: Option<u64>,
    ) -> (Vec<u64>, bool) {
        let arm64 = self.symbols.pc_quantum() == 4;
        let mut stack = StackWindow::new(hi);
        let mut pcs = vec![pc];
        // `pc` is where its function is, not a return address: the first
        // frame, and the frame a faked call returns to.
        let mut exact = true;
        while pcs.len() < MAX_FRAMES {
            if sp < lo || sp >= hi {
                return (pcs, true);
            }
            // A return address can be the end of its function (a call
            // that never returns): look the function up at the call.
            let link = self.link_address(pc);
            let at = if exact { link } else { link.wrapping_sub(1) };
            let Some(function) = self.symbols.function(at) else {
                return (pcs, true);
            };
            if function.flag().is_topframe() {
                return (pcs, false);
            }
            let Some(delta) = function
                .pcsp(link.min(function.end() - 1))
                .and_then(|d| u64::try_from(d).ok())
            else {
                return (pcs, true);
            };
            let (ret, mut caller_sp) = if arm64 && delta == 0 {
                // A leaf without a frame: its return address is in LR, a
                // register (known for the innermost frame of a stopped
                // thread, and after a faked call).
                match lr {
                    Some(lr) => (lr, sp),
                    None => return (pcs, true),
                }
            } else {
                let (return_at, caller_sp) = if arm64 {
                    (sp, sp.wrapping_add(delta))
                } else {
                    (sp.wrapping_add(delta), sp.wrapping_add(delta + 8))
                };
                if caller_sp > hi {
                    return (pcs, true);
                }
                let Some(ret) = stack.u64(&self.memory, return_at) else {
                    return (pcs, true);
                };
                (ret, caller_sp)
            };
            if ret == 0 {
                return (pcs, false);
            }
            lr = None;
            exact = INJECTED_CALLS.contains(&&*function.name());
            if exact && arm64 {
                let Some(saved) = stack.u64(&self.memory, caller_sp) else {
                    return (pcs, true);
                };
                lr = Some(saved);
                caller_sp = caller_sp.wrapping_add(GO_ARM64_INJECTED_CALL_SLOT);
            }
            pcs.push(if exact { ret.wrapping_add(1) } else { ret });
            pc = ret;
            sp = caller_sp;
        }
        (pcs, true)
    }

    /// `waitReasonStrings`, as the binary has them (their order changed in
    /// Go 1.26): empty when not found.
    fn wait_reasons(&self) -> Vec<String> {
        let (Ok(table), Some(count)) = (
            self.address(globals::WAIT_REASON_STRINGS),
            self.wait_reason_count,
        ) else {
            return Vec::new();
        };
        (0..count.min(256) as u64)
            .map(|i| go_string(&self.memory, table.wrapping_add(16 * i), 128).unwrap_or_default())
            .collect()
    }
}

/// A Go string header's text at `at` (at most `max` bytes).
pub fn go_string(memory: &impl Memory, at: u64, max: u64) -> Option<String> {
    let header = memory.array::<16>(at).ok()?;
    let data = u64::from_le_bytes(header[..8].try_into().ok()?);
    let len = u64::from_le_bytes(header[8..].try_into().ok()?);
    if len > max {
        return None;
    }
    let bytes = memory.bytes(data, len as usize).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A goroutine's pprof labels, from `g.labels`: a pointer to a
/// `map[string]string` (Go 1.19 to 1.23), or to a sorted slice of
/// {key, value} (1.24 on).
pub fn label_set(memory: &impl Memory, at: u64, in_map: bool) -> Vec<(String, String)> {
    if at == 0 {
        return Vec::new();
    }
    let mut labels = if in_map {
        map_labels(memory, at).unwrap_or_default()
    } else {
        slice_labels(memory, at).unwrap_or_default()
    };
    labels.sort();
    labels
}

fn slice_labels(memory: &impl Memory, at: u64) -> Option<Vec<(String, String)>> {
    let header = memory.array::<24>(at).ok()?;
    let data = u64::from_le_bytes(header[..8].try_into().ok()?);
    let len = u64::from_le_bytes(header[8..16].try_into().ok()?);
    Some(
        (0..len.min(MAX_LABELS))
            .filter_map(|i| {
                let entry = data.wrapping_add(32 * i);
                Some((
                    go_string(memory, entry, MAX_TEXT)?,
                    go_string(memory, entry.wrapping_add(16), MAX_TEXT)?,
                ))
            })
            .collect(),
    )
}

/// A classic (pre-1.24) `map[string]string`: `*hmap`, then 2^B
/// buckets of 8 slots (tophash[8], keys[8], values[8], overflow),
/// each followed through its overflow chain; a slot is in use when
/// its tophash is at least `minTopHash` (5).
fn map_labels(memory: &impl Memory, at: u64) -> Option<Vec<(String, String)>> {
    const SLOT_KEYS: u64 = 8;
    const SLOT_VALUES: u64 = 8 + 8 * 16;
    const OVERFLOW: u64 = 8 + 16 * 16;
    const BUCKET: u64 = OVERFLOW + 8;
    let hmap = memory.u64(at).ok()?;
    if hmap == 0 {
        return Some(Vec::new());
    }
    let header = memory.array::<24>(hmap).ok()?;
    let count = u64::from_le_bytes(header[..8].try_into().ok()?);
    let b = header[9].min(8);
    let buckets = u64::from_le_bytes(header[16..24].try_into().ok()?);
    let mut labels = Vec::new();
    let mut visited = HashSet::new();
    for i in 0..(1u64 << b) {
        let mut bucket = buckets.wrapping_add(i * BUCKET);
        while bucket != 0 && visited.insert(bucket) && (labels.len() as u64) < count.min(MAX_LABELS)
        {
            let tophash = memory.array::<8>(bucket).ok()?;
            for (slot, &top) in tophash.iter().enumerate() {
                if top >= 5 {
                    let slot = slot as u64;
                    labels.push((
                        go_string(memory, bucket.wrapping_add(SLOT_KEYS + 16 * slot), MAX_TEXT)?,
                        go_string(
                            memory,
                            bucket.wrapping_add(SLOT_VALUES + 16 * slot),
                            MAX_TEXT,
                        )?,
                    ));
                }
            }
            bucket = memory.u64(bucket.wrapping_add(OVERFLOW)).ok()?;
        }
    }
    labels.truncate(MAX_LABELS as usize);
    Some(labels)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the runtime's `nanotime`.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The goroutines as `WriteTo(w, 2)` prints them (`debug=2`): a header per
/// goroutine, its frames (runtime internals hidden), where it was
/// created. Arguments are not read and print as `(...)`, as Go prints
/// them for inlined calls.
pub fn text(target: &GoTarget, goroutines: &Goroutines) -> String {
    let mut out = String::new();
    for (i, g) in goroutines.goroutines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "goroutine {} [{}]:", g.goid, header(g));
        if g.is_running() && g.pcs.is_empty() {
            let thread = g
                .thread
                .map(|t| format!(" (thread {t})"))
                .unwrap_or_default();
            if goroutines.frozen {
                let _ = writeln!(
                    out,
                    "\tstack unavailable: its thread{thread} runs runtime or C code on its own stack"
                );
            } else {
                let _ = writeln!(
                    out,
                    "\tgoroutine running on other thread; stack unavailable{thread}"
                );
            }
        } else {
            if g.is_running()
                && let Some(tid) = g.thread
            {
                let _ = writeln!(out, "\t(running on thread {tid}, stopped)");
            }
            print_frames(target, g, &mut out);
        }
        if g.goid != 1 && g.created_at != 0 {
            print_created_by(target, g, &mut out);
        }
    }
    out
}

/// What goes between the brackets: the status or wait reason, `(scan)`,
/// the minutes blocked, `locked to thread`.
fn header(g: &Goroutine) -> String {
    let base = g.base_status() as usize;
    let mut status = g
        .wait_reason
        .clone()
        .unwrap_or_else(|| STATUS_NAMES.get(base).copied().unwrap_or("???").to_string());
    if g.base_status() == STATUS_LEAKED {
        status.push_str(" (leaked)");
    }
    if g.status & STATUS_SCAN != 0 {
        status.push_str(" (scan)");
    }
    if g.minutes >= 1 {
        let _ = write!(status, ", {} minutes", g.minutes);
    }
    if g.locked_to_thread {
        status.push_str(", locked to thread");
    }
    status
}

/// One frame to print: a logical frame with what its line needs.
struct Printed {
    name: String,
    file: String,
    line: u32,
    /// `+0x…` from the function's entry, for the physical frame.
    offset: Option<u64>,
}

fn print_frames(target: &GoTarget, g: &Goroutine, out: &mut String) {
    let mut all: Vec<(Printed, bool)> = Vec::new();
    // The PC a faked call returns to is given + 1 (see `walk`); Go prints
    // it as it is.
    let mut after_faked_call = false;
    for (i, &pc) in g.pcs.iter().enumerate() {
        let frames = if after_faked_call {
            logical_frames(target, pc.wrapping_sub(1), true)
        } else {
            logical_frames(target, pc, i == 0 && g.from_registers)
        };
        after_faked_call = frames
            .last()
            .is_some_and(|(physical, _)| INJECTED_CALLS.contains(&physical.name.as_str()));
        all.extend(frames);
    }
    let mut shown: Vec<&Printed> = all
        .iter()
        .filter(|(_, show)| *show)
        .map(|(p, _)| p)
        .collect();
    if shown.is_empty() {
        // Go prints the runtime's frames when nothing else is left.
        shown = all.iter().map(|(p, _)| p).collect();
    }
    let (head, tail, elided) = if target.minor <= 19 {
        (shown.len().min(100), 0, shown.len() > 100)
    } else if shown.len() > 100 {
        (50, 50, true)
    } else {
        (shown.len(), 0, false)
    };
    for frame in &shown[..head] {
        print_frame(frame, out);
    }
    if elided {
        if target.minor <= 19 {
            out.push_str("...additional frames elided...\n");
        } else {
            let _ = writeln!(out, "...{} frames elided...", shown.len() - 100);
            for frame in &shown[shown.len() - tail..] {
                print_frame(frame, out);
            }
        }
    }
    if g.truncated && !elided {
        out.push_str("...additional frames elided...\n");
    }
}

fn print_frame(frame: &Printed, out: &mut String) {
    let _ = write!(out, "{}(...)\n\t{}:{}", frame.name, frame.file, frame.line);
    if let Some(offset) = frame.offset {
        let _ = write!(out, " +{offset:#x}");
    }
    out.push('\n');
}

/// The logical frames at one return address, innermost first, each with
/// whether Go's traceback shows it (`showfuncinfo` at level 1: not the
/// runtime's unexported functions, not names without a package, not
/// compiler-made wrappers).
fn logical_frames(target: &GoTarget, pc: u64, exact: bool) -> Vec<(Printed, bool)> {
    let link = target.link_address(pc);
    let function = target
        .symbols
        .function(if exact { link } else { link.wrapping_sub(1) });
    let Some(function) = function else {
        return vec![(
            Printed {
                name: "?".into(),
                file: "?".into(),
                line: 0,
                offset: Some(0),
            },
            true,
        )];
    };
    let wrapper =
        RuntimeLayout::of(target.minor).is_some_and(|l| function.func_id() == l.func_id_wrapper);
    let entry = function.entry();
    let frames = if exact {
        frames::at(target, pc)
    } else {
        frames::at_return_address(target, pc)
    };
    let count = frames.len();
    frames
        .into_iter()
        .enumerate()
        .map(|(i, frame)| {
            let physical = i + 1 == count;
            let raw = frame
                .system_name
                .clone()
                .unwrap_or_else(|| frame.function.clone());
            let show = !(physical && wrapper) && shows(&raw);
            let name = if raw == "runtime.gopanic" {
                "panic".to_string()
            } else {
                frame.function.clone()
            };
            (
                Printed {
                    name,
                    file: frame.file.clone().unwrap_or_else(|| "?".into()),
                    line: frame.line.unwrap_or(0),
                    // Go prints none at the entry itself (a fault on a
                    // function's first instruction).
                    offset: physical
                        .then(|| link.wrapping_sub(entry))
                        .filter(|&o| o > 0),
                },
                show,
            )
        })
        .collect()
}

/// `showfuncinfo`'s name test.
fn shows(name: &str) -> bool {
    if name == "runtime.gopanic" {
        return true;
    }
    if !name.contains('.') {
        return false;
    }
    match name.strip_prefix("runtime.") {
        Some(rest) => rest.starts_with(|c: char| c.is_ascii_uppercase()),
        None => true,
    }
}

/// `created by F in goroutine N` and the `go` statement's position: the
/// function physically holding it, its line at the call (`gopc` minus one
/// instruction).
fn print_created_by(target: &GoTarget, g: &Goroutine, out: &mut String) {
    let link = target.link_address(g.created_at);
    let quantum = u64::from(target.symbols.pc_quantum().max(1));
    let Some(function) = target.symbols.function(link.wrapping_sub(quantum)) else {
        return;
    };
    let frames = target
        .symbols
        .frames(link.wrapping_sub(quantum))
        .unwrap_or_default();
    let physical = frames.last();
    let name = physical
        .map(|f| f.function.clone())
        .unwrap_or_else(|| function.name().into_owned());
    let _ = write!(out, "created by {name}");
    if let Some(parent) = g.parent {
        let _ = write!(out, " in goroutine {parent}");
    }
    let (file, line) = frames
        .first()
        .map(|f| {
            (
                f.file.clone().unwrap_or_else(|| "?".into()),
                f.line.unwrap_or(0),
            )
        })
        .unwrap_or_else(|| ("?".into(), 0));
    let _ = write!(out, "\n\t{file}:{line}");
    if link > function.entry() {
        let _ = write!(out, " +{:#x}", link - function.entry());
    }
    out.push('\n');
}

/// Goroutines alike: their stack (locations) and labels.
type Group = (Vec<usize>, Vec<(String, String)>);

/// The goroutine profile (`debug=0`): one sample per distinct stack and
/// label set, valued by how many goroutines share it, runtime frames
/// included, as Go's own. Running goroutines, whose stacks are in their
/// threads' registers, have no locations and carry their thread.
pub fn goroutine_profile(
    target: &GoTarget,
    goroutines: &Goroutines,
    start_unix_ns: i64,
) -> Profile {
    let mut builder = ProfileBuilder::<u64, ()>::new(start_unix_ns, 0, 1);
    builder.kind(ProfileKind::Goroutine);
    let mapping = builder.mapping((), || super::executable_mapping(target));
    let mut groups: BTreeMap<Group, i64> = BTreeMap::new();
    for g in &goroutines.goroutines {
        let locations: Vec<usize> = g
            .pcs
            .iter()
            .enumerate()
            .filter_map(|(i, &pc)| {
                let exact = i == 0 && g.from_registers;
                let frames: Vec<Frame> = if exact {
                    frames::at(target, pc)
                } else {
                    frames::at_return_address(target, pc)
                };
                if frames
                    .first()
                    .is_some_and(|f| f.function == "runtime.goexit")
                {
                    return None;
                }
                let address = if exact { pc } else { pc.wrapping_sub(1) };
                Some(frames::location(
                    &mut builder,
                    address,
                    mapping,
                    address,
                    &frames,
                ))
            })
            .collect();
        let mut labels = g.labels.clone();
        if g.is_running()
            && let Some(tid) = g.thread
        {
            labels.push(("thread".into(), tid.to_string()));
        }
        *groups.entry((locations, labels)).or_default() += 1;
    }
    let mut samples: Vec<_> = groups.into_iter().collect();
    // Most frequent first, as Go's debug=1 groups.
    samples.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    for ((locations, mut labels), count) in samples {
        labels.push(("pid".into(), target.pid.to_string()));
        builder.sample(Sample {
            locations,
            values: vec![count],
            labels: labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            ..Sample::default()
        });
    }
    builder.comment(format!(
        "goroutines of process {} ({}, {}) read from its memory by profiler-agent",
        target.pid, target.path, target.version
    ));
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_internals_are_hidden() {
        assert!(shows("main.main"));
        assert!(shows("runtime.Gosched"));
        assert!(shows("internal/poll.(*FD).Read"));
        assert!(shows("runtime.gopanic"));
        assert!(!shows("runtime.gopark"));
        assert!(!shows("runtime.chanrecv1"));
        assert!(!shows("main"));
    }

    fn goroutine(status: u32) -> Goroutine {
        Goroutine {
            goid: 7,
            status,
            wait_reason: None,
            minutes: 0,
            locked_to_thread: false,
            thread: None,
            pcs: Vec::new(),
            from_registers: false,
            truncated: false,
            created_at: 0,
            parent: None,
            labels: Vec::new(),
        }
    }

    /// Memory at 0x1000 with `words` (8 bytes each) and `text` after them.
    fn image(words: &[u64], text: &[u8]) -> profiler_runtime::memory::ImageMemory {
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend_from_slice(text);
        profiler_runtime::memory::ImageMemory {
            base: 0x1000,
            bytes,
        }
    }

    #[test]
    fn label_sets_are_read_in_both_forms() {
        // Go 1.24 on: a pointer to a slice of {key, value} strings.
        // 0x1000: {data 0x1018, len 1, cap 1}; 0x1018: key, value headers;
        // text at 0x1038.
        let text_at = 0x1000 + 7 * 8;
        let slice = image(&[0x1018, 1, 1, text_at, 8, text_at + 8, 3], b"endpoint/ok");
        assert_eq!(
            label_set(&slice, 0x1000, false),
            [("endpoint".to_string(), "/ok".to_string())]
        );
        // Until 1.23: a pointer to a map[string]string: *hmap, one bucket
        // (B = 0) with one slot in use (tophash >= 5).
        let hmap = 0x1008u64;
        let bucket = 0x1030u64;
        let text = bucket + 8 + 16 * 16 + 8;
        let mut words = vec![hmap, 1, 0, bucket, 0, 0];
        words.push(u64::from_le_bytes([7, 0, 0, 0, 0, 0, 0, 0]));
        words.extend([text, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        words.extend([text + 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        words.push(0);
        let map = image(&words, b"kvv");
        assert_eq!(
            label_set(&map, 0x1000, true),
            [("k".to_string(), "vv".to_string())]
        );
        // A forged length is cut, a string past memory is left out.
        let forged = image(&[0x1018, u64::MAX, 1, 0xdead_0000, 8, 0, 0], b"");
        assert!(label_set(&forged, 0x1000, false).is_empty());
    }

    #[test]
    fn headers_read_as_go_prints_them() {
        let mut g = goroutine(STATUS_WAITING);
        g.wait_reason = Some("chan receive".into());
        g.minutes = 3;
        assert_eq!(header(&g), "chan receive, 3 minutes");
        let mut g = goroutine(STATUS_SYSCALL | STATUS_SCAN);
        g.locked_to_thread = true;
        assert_eq!(header(&g), "syscall (scan), locked to thread");
        assert_eq!(header(&goroutine(99)), "???");
        assert_eq!(header(&goroutine(1)), "runnable");
    }
}

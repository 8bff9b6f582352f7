//! Unwind rows from Go's pcsp tables (amd64 and arm64).
//!
//! Go's own traceback (runtime/traceback.go) finds a caller from the SP
//! delta at a PC.
//!
//! amd64: CFA = SP + pcsp(pc) + 8, return address at CFA - 8. A function
//! that has a frame saved the caller's BP just below the return address
//! (cmd/internal/obj/x86/obj6.go inserts `PUSHQ BP` / the BP save for every
//! function with a frame), so the caller's BP is at CFA - 16 whenever the
//! SP delta is non-zero; a frameless function leaves BP alone. This holds
//! inside assembly that uses BP as a general register
//! (crypto/sha256.block): its prologue saved BP before clobbering it.
//!
//! arm64: a function with a frame stores LR at 0(SP) as it allocates the
//! frame (`MOVD.W R30, -size(RSP)`, or `STP (R29, R30), -8(R20)` then
//! `MOVD R20, RSP` for big frames) and the caller's FP at -8(SP)
//! (cmd/internal/obj/arm64/obj7.go). So with SP delta d > 0: CFA = SP + d,
//! return address at CFA - d, caller's FP at CFA - d - 8; with d = 0 the
//! return address is still in LR.

use profiler_common::unwind::{
    FRAME_RECORD_RANGES, RULE_CFA_SP, RULE_FLAG_GO_INJECTED_CALL, RULE_GO_CGOCALL,
    RULE_GO_CGOCALLBACK, RULE_ROOT, RULE_SIGNAL, RULE_STOP, UnwindRule,
};

use profiler_unwind::cfi::Arch;
use profiler_unwind::table::{ObjectTable, TableRow};

use super::pclntab::GoSymbols;

/// What the unwinder needs of one Go function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFunctionUnwind {
    pub entry: u64,
    pub end: u64,
    pub name: String,
    /// `_func.flag` (Go 1.17+): TOPFRAME=1, SPWRITE=2, ASM=4.
    pub flag: u8,
    /// pcsp runs: [start, end) has SP delta `delta` (bytes below the CFA
    /// minus the return address on amd64).
    pub pcsp: Vec<(u64, u64, i32)>,
}

const FUNC_FLAG_TOPFRAME: u8 = 1;
const FUNC_FLAG_SPWRITE: u8 = 2;
const FUNC_FLAG_ASM: u8 = 4;

/// Outermost frames of Go stacks (Go ≤ 1.16 has no TOPFRAME flag, so
/// they are matched by name too).
const ROOT_FUNCTIONS: &[&str] = &["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];

/// Functions that switch stacks: their SP is not their frame's (Go matches
/// them by name as well, runtime/traceback.go). `runtime.systemstack` is
/// passed by its frame pointer where it pushed one (see `rows`).
const STACK_SWITCHERS: &[&str] = &[
    "runtime.systemstack",
    "runtime.mcall",
    "runtime.morestack",
    "runtime.morestack_noctxt",
    "runtime.gogo",
    "runtime.asmcgocall",
];

/// Go's signal handlers, marked TOPFRAME so Go's own traceback stops in
/// them, but ordinary frames for us: the kernel entered them with the
/// restorer as return address, and the signal frame lies above them.
const SIGNAL_HANDLERS: &[&str] = &["runtime.sigtramp", "runtime.cgoSigtramp"];

/// The restorers Go installs as `sa_restorer` (amd64): the signal frame's
/// trampoline (`runtime.sigreturn` before Go 1.20).
const SIGNAL_RESTORERS: &[&str] = &["runtime.sigreturn__sigaction", "runtime.sigreturn"];

/// Functions Go's signal handler enters by faking a call from the
/// interrupted PC (runtime/traceback.go's `injectedCall`; `sigpanic0` is
/// the assembly stub some ports push, which jumps to `sigpanic`).
pub const INJECTED_CALLS: &[&str] = &[
    "runtime.asyncPreempt",
    "runtime.sigpanic",
    "runtime.sigpanic0",
    // A call a debugger injects (Delve's function calls).
    "runtime.debugCallV2",
];

/// `runtime.cgocallback` runs Go code called from C on the goroutine's
/// stack, in a frame it built so that the goroutine's saved PC looks like
/// its return address (runtime/asm_amd64.s): Go's traceback walks it as an
/// ordinary frame, back to the Go code that called into C; we go back to
/// the C code that called it where the g register allows
/// (RULE_GO_CGOCALLBACK).
const CGOCALLBACK: &str = "runtime.cgocallback";

/// Rows for every function of a Go binary's pclntab, the text they cover,
/// and where callers may be stepped by their frame record
/// ([`frame_record_callers`]); None for an architecture whose rules are
/// not written (32-bit).
/// `text` is the code (its address and bytes) when the file's `.text`
/// could be read.
#[allow(clippy::type_complexity)]
pub fn rows_for(
    symbols: &GoSymbols,
    text: Option<Code<'_>>,
) -> Option<(ObjectTable, u64, u64, Vec<(u64, u64)>)> {
    let arch = match (symbols.pc_quantum(), symbols.pointer_size()) {
        (1, 8) => Arch::X86_64,
        (4, 8) => Arch::Aarch64,
        _ => return None,
    };
    let mut functions: Vec<GoFunctionUnwind> = symbols
        .functions()
        .map(|f| GoFunctionUnwind {
            entry: f.entry(),
            end: f.end(),
            name: f.name().into_owned(),
            flag: f.flag().0,
            pcsp: f
                .pcsp_runs()
                .map(|run| (run.pc_start, run.pc_end, run.sp_delta))
                .collect(),
        })
        .collect();
    functions.sort_by_key(|f| f.entry);
    let start = functions.first()?.entry;
    let end = functions.iter().map(|f| f.end).max()?;
    let minor = symbols.version().and_then(super::pclntab::go_minor);
    let callers = frame_record_callers(&functions, arch, minor, text);
    Some((rows(&functions, arch), start, end, callers))
}

/// Where a caller (a frame above the leaf whose PC is a return address)
/// unwinds exactly as its frame record says, so the walker may step it by
/// frame pointer without its rule: up to `FRAME_RECORD_RANGES` stretches
/// of `functions` (sorted by entry), the largest between the functions
/// left out.
///
/// Only on x86-64, Go 1.19 or later. Since 1.21 the compiler gives every
/// function that calls a frame, saves BP at CFA - 16 and points BP at it
/// (cmd/internal/obj/x86/obj6.go). Before 1.21 the same file left out a
/// frameless `nosplit` function even when it calls ("scary runtime
/// internals": in a Go 1.19 binary, ABI wrappers such as
/// `runtime.osyield` and a dozen assembly functions): such a caller has
/// no record, and stepping it by the callee's would skip its own caller.
/// Nosplit is not marked in the binary, so there every frameless Go
/// function whose code may call ([`may_call`]) is left out too; a
/// frameless function that does not call is a leaf, never a caller.
/// Go 1.17 and 1.18 (the first with `_func.flag`) are not trusted: no
/// toolchain of theirs was at hand to check against.
/// Left out: functions whose step is special (roots, stack switchers,
/// signal handlers and restorers, cgo's crossings, faked calls, anything
/// marked TOPFRAME or SPWRITE, and the byte before a function whose rule
/// starts there), and assembly whose code does not begin its frame with
/// the assembler's `PUSHQ BP; MOVQ SP, BP`: NOFRAME assembly may call
/// with its caller's BP (Go 1.21's `crosscall2` pushes the flags and
/// registers and calls cgocallback with the C caller's BP). arm64's
/// frame record lies below the frame, so a record does not give the
/// caller's SP there: tables on every frame.
pub fn frame_record_callers(
    functions: &[GoFunctionUnwind],
    arch: Arch,
    go_minor: Option<u32>,
    text: Option<Code<'_>>,
) -> Vec<(u64, u64)> {
    let Some(minor) = go_minor else {
        return Vec::new();
    };
    if arch != Arch::X86_64 || minor < 19 || !frame_record_callers_wanted() {
        return Vec::new();
    }
    let frameless_may_call = minor < 21;
    let (Some(first), Some(end)) = (functions.first(), functions.iter().map(|f| f.end).max())
    else {
        return Vec::new();
    };
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    let mut from = first.entry;
    for function in functions
        .iter()
        .filter(|f| !steps_by_frame_record(f, text, frameless_may_call))
    {
        // A restorer's rule, and systemstack_switch's, also covers the
        // byte before it (see `rows`): a return address there is looked
        // up in the function before.
        let name = function.name.as_str();
        let start = if SIGNAL_RESTORERS.contains(&name) || name == "runtime.systemstack_switch" {
            function.entry.saturating_sub(1)
        } else {
            function.entry
        };
        if start > from {
            gaps.push((from, start));
        }
        from = from.max(function.end);
    }
    if end > from {
        gaps.push((from, end));
    }
    gaps.sort_by_key(|&(start, end)| std::cmp::Reverse(end - start));
    gaps.truncate(FRAME_RECORD_RANGES);
    gaps.sort();
    gaps
}

/// `PROFILER_AGENT_FRAME_RECORD_CALLERS=0` looks every Go caller's rule up,
/// as before Go callers were stepped by their records: for measuring the
/// two against each other (`cargo xtask bench`) and for ruling the step
/// out when a Go stack looks wrong.
fn frame_record_callers_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| {
        std::env::var_os("PROFILER_AGENT_FRAME_RECORD_CALLERS").is_none_or(|v| v != "0")
    })
}

/// A binary's code: the address of its first byte, and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Code<'a> {
    pub address: u64,
    pub bytes: &'a [u8],
}

impl<'a> Code<'a> {
    /// The bytes at `address`, `len` of them, when the code holds them.
    fn at(self, address: u64, len: usize) -> Option<&'a [u8]> {
        let start = usize::try_from(address.checked_sub(self.address)?).ok()?;
        self.bytes.get(start..start.checked_add(len)?)
    }
}

/// Whether an assembly function's frame begins with the frame record the
/// assembler inserts. Since Go 1.21: `PUSHQ BP` (55) ending where its SP
/// delta first becomes 8, then `MOVQ SP, BP` (48 89 e5). Before: `SUBQ
/// $n, SP` ending where the delta first becomes n, then `MOVQ BP,
/// n-8(SP)` and `LEAQ n-8(SP), BP` (48 89 6c 24 / 48 8d 6c 24 and an
/// 8-bit offset; ac 24 and 32 bits from 128), the same record at CFA - 16.
fn pushes_frame_record(function: &GoFunctionUnwind, text: Option<Code<'_>>) -> bool {
    let Some(code) = text else {
        return false;
    };
    let pushed = function
        .pcsp
        .iter()
        .find(|&&(_, _, delta)| delta == 8)
        .and_then(|&(pushed, _, _)| code.at(pushed.checked_sub(1)?, 4))
        .is_some_and(|bytes| bytes == [0x55, 0x48, 0x89, 0xe5]);
    pushed || saves_frame_record_after_subq(function, code)
}

/// The frame record of Go's assembler before 1.21 (see
/// [`pushes_frame_record`]).
fn saves_frame_record_after_subq(function: &GoFunctionUnwind, code: Code<'_>) -> bool {
    let Some(&(framed, _, delta)) = function.pcsp.iter().find(|&&(_, _, delta)| delta > 0) else {
        return false;
    };
    let slot = delta - 8;
    let expected: Vec<u8> = match u8::try_from(slot) {
        Ok(slot) if slot < 0x80 => {
            [0x48, 0x89, 0x6c, 0x24, slot, 0x48, 0x8d, 0x6c, 0x24, slot].into()
        }
        _ if slot > 0 => {
            let slot = slot.to_le_bytes();
            [
                [0x48, 0x89, 0xac, 0x24],
                slot,
                [0x48, 0x8d, 0xac, 0x24],
                slot,
            ]
            .concat()
        }
        _ => return false,
    };
    code.at(framed, expected.len())
        .is_some_and(|bytes| bytes == expected.as_slice())
}

/// Whether `function`, as a caller on x86-64, unwinds by its frame record
/// (see [`frame_record_callers`]). `frameless_may_call`: before Go 1.21,
/// where a frameless Go function may call.
fn steps_by_frame_record(
    function: &GoFunctionUnwind,
    text: Option<Code<'_>>,
    frameless_may_call: bool,
) -> bool {
    let name = function.name.as_str();
    let special = [
        ROOT_FUNCTIONS,
        STACK_SWITCHERS,
        SIGNAL_HANDLERS,
        SIGNAL_RESTORERS,
        INJECTED_CALLS,
        &[CGOCALLBACK, "runtime.systemstack_switch"],
    ]
    .iter()
    .any(|names| names.contains(&name));
    let framed = function.pcsp.iter().any(|&(_, _, delta)| delta > 0);
    !special
        && function.flag & (FUNC_FLAG_TOPFRAME | FUNC_FLAG_SPWRITE) == 0
        && !function.pcsp.is_empty()
        && function.pcsp.iter().all(|&(_, _, delta)| delta >= 0)
        && if function.flag & FUNC_FLAG_ASM != 0 {
            framed && pushes_frame_record(function, text)
        } else {
            framed || !frameless_may_call || !may_call(function, text)
        }
}

/// Whether `function`'s code may hold a call: a `CALL rel32` (e8) whose
/// target lies in the code, or a `CALL r/m64` (ff /2) — any byte that
/// could begin one, so data or an instruction's tail that looks like a
/// call only leaves a function out. True when the code is not at hand.
fn may_call(function: &GoFunctionUnwind, text: Option<Code<'_>>) -> bool {
    let Some(code) = text else {
        return true;
    };
    let Some(bytes) = function
        .end
        .checked_sub(function.entry)
        .and_then(|len| code.at(function.entry, usize::try_from(len).ok()?))
    else {
        return true;
    };
    let code_end = code.address.saturating_add(code.bytes.len() as u64);
    let direct = bytes.windows(5).enumerate().any(|(at, call)| {
        let rel = i32::from_le_bytes([call[1], call[2], call[3], call[4]]);
        let target = (function.entry + at as u64 + 5).wrapping_add_signed(i64::from(rel));
        call[0] == 0xe8 && (code.address..code_end).contains(&target)
    });
    let indirect = bytes
        .windows(2)
        .any(|pair| pair[0] == 0xff && (pair[1] >> 3) & 7 == 2);
    direct || indirect
}

/// Where asmcgocall keeps the goroutine's stack depth and g on the system
/// stack (`RULE_GO_CGOCALL`): Go 1.23 and later call C through
/// `asmcgocall_landingpad` and keep them at 0(SP) and 8(SP); before, at
/// 40(SP) and 48(SP) (runtime/asm_amd64.s of each version).
fn cgocall_slots(functions: &[GoFunctionUnwind]) -> (i32, i16) {
    if functions
        .iter()
        .any(|f| f.name == "runtime.asmcgocall_landingpad")
    {
        (0, 8)
    } else {
        (40, 48)
    }
}

/// Rows for all `functions` (sorted by entry). Gaps between functions (and
/// after the last) walk frame pointers.
pub fn rows(functions: &[GoFunctionUnwind], arch: Arch) -> ObjectTable {
    let mut rows: Vec<TableRow> = Vec::new();
    let gap = UnwindRule::default();
    let (depth_slot, g_slot) = cgocall_slots(functions);
    // Go 1.17+ flags hand-written assembly; then the ABI wrappers that
    // share a stack switcher's name (`runtime.systemstack <autogenerated>`)
    // are told apart from it by that flag. Before, every function has flag
    // 0 and there are no wrappers.
    let flags_known = functions.iter().any(|f| f.flag & FUNC_FLAG_ASM != 0);
    for function in functions {
        if function.end <= function.entry {
            continue;
        }
        let name = function.name.as_str();
        let is_root = (function.flag & FUNC_FLAG_TOPFRAME != 0 || ROOT_FUNCTIONS.contains(&name))
            && !SIGNAL_HANDLERS.contains(&name);
        let is_asm = function.flag & FUNC_FLAG_ASM != 0 || !flags_known;
        let switches_stack = (function.flag & FUNC_FLAG_SPWRITE != 0
            || (STACK_SWITCHERS.contains(&name) && is_asm))
            && name != CGOCALLBACK;
        // Since Go 1.21 systemstack pushes a frame pointer before it
        // switches to the system stack and keeps BP pointing at that frame
        // record on the goroutine's stack (runtime/asm_amd64.s: "The
        // original frame pointer is stored in BP, which is useful for stack
        // unwinders"): the frame-pointer step from there is the goroutine's
        // caller, as Go's own traceback finds it through curg.sched.
        let pushed_frame = function.pcsp.iter().any(|&(_, _, d)| d == 8);
        let by_frame_pointer = arch == Arch::X86_64
            && name == "runtime.systemstack"
            && function.flag & FUNC_FLAG_ASM != 0
            && pushed_frame;
        let special = if is_root {
            Some(UnwindRule {
                kind: RULE_ROOT,
                ..Default::default()
            })
        } else if arch == Arch::X86_64 && SIGNAL_RESTORERS.contains(&name) {
            Some(UnwindRule {
                kind: RULE_SIGNAL,
                ..Default::default()
            })
        } else if arch == Arch::X86_64
            && name == "runtime.asmcgocall"
            && function.flag & FUNC_FLAG_ASM != 0
        {
            // The assembly itself (its ABIInternal wrapper has the same
            // name and is an ordinary Go function). Since Go 1.21 the
            // assembler gives it a frame-pointer prologue (PUSHQ BP), so the
            // SP it saves is 8 below its entry SP: its pcsp shows a run of
            // exactly 8 then (1.19: none).
            let prologue: i32 = if function.pcsp.iter().any(|&(_, _, d)| d == 8) {
                8
            } else {
                0
            };
            Some(UnwindRule {
                kind: RULE_GO_CGOCALL,
                cfa_offset: depth_slot,
                param: g_slot,
                ra_offset: prologue,
                fp_offset: if prologue > 0 { -16 } else { 0 },
                ..Default::default()
            })
        } else if by_frame_pointer {
            Some(gap)
        } else if switches_stack {
            Some(UnwindRule {
                kind: RULE_STOP,
                ..Default::default()
            })
        } else if function.pcsp.is_empty() {
            Some(gap)
        } else {
            None
        };
        match special {
            Some(rule) => {
                rows.push(TableRow {
                    address: function.entry,
                    rule,
                });
                // The handler returns to the restorer's entry, and the
                // walker looks a return address up one byte back: in the
                // function before, whose INT3 padding that byte is. glibc
                // covers the byte before `__restore_rt` with its FDE for
                // the same reason; Go's pclntab has nothing there.
                if rule.kind == RULE_SIGNAL {
                    rows.push(TableRow {
                        address: function.entry - 1,
                        rule,
                    });
                }
            }
            None => {
                for &(start, end, delta) in &function.pcsp {
                    if end <= start || start < function.entry {
                        continue;
                    }
                    // SP above the CFA: the last instruction of arm64's
                    // asyncPreempt, which has popped the handler's 16
                    // bytes too. No rule describes it: stop there, not
                    // under the row before.
                    if delta < 0 {
                        rows.push(TableRow {
                            address: start,
                            rule: UnwindRule {
                                kind: RULE_STOP,
                                ..Default::default()
                            },
                        });
                        continue;
                    }
                    let mut rule = pcsp_rule(delta, arch);
                    if name == CGOCALLBACK && arch == Arch::X86_64 {
                        rule.kind = RULE_GO_CGOCALLBACK;
                    }
                    if INJECTED_CALLS.contains(&name) {
                        rule.flags |= RULE_FLAG_GO_INJECTED_CALL;
                    }
                    rows.push(TableRow {
                        address: start,
                        rule,
                    });
                }
                // Before Go 1.21, asmcgocall saved `systemstack_switch`'s
                // entry itself as the goroutine's PC, which cgocallback then
                // presents as a return address: looked up one byte back it
                // falls in the function before (runtime.mcall, a stop). Go's
                // traceback does not step back at a function entry; the
                // byte before is alignment padding, so give it this rule.
                if name == "runtime.systemstack_switch"
                    && let Some(&(_, _, delta)) = function.pcsp.first()
                {
                    rows.push(TableRow {
                        address: function.entry - 1,
                        rule: pcsp_rule(delta, arch),
                    });
                }
            }
        }
        rows.push(TableRow {
            address: function.end,
            rule: gap,
        });
    }
    // Stable: at one address, a later row (a function's first rule)
    // replaces an earlier one (the previous function's end).
    rows.sort_by_key(|r| r.address);
    ObjectTable::from_sorted(rows)
}

/// The rule for SP delta `delta` (see the module comment).
fn pcsp_rule(delta: i32, arch: Arch) -> UnwindRule {
    match arch {
        Arch::X86_64 => UnwindRule {
            kind: RULE_CFA_SP,
            cfa_offset: delta + 8,
            ra_offset: -8,
            fp_offset: if delta > 0 { -16 } else { 0 },
            ..Default::default()
        },
        Arch::Aarch64 => UnwindRule {
            kind: RULE_CFA_SP,
            cfa_offset: delta,
            ra_offset: -delta,
            fp_offset: if delta > 0 { -delta - 8 } else { 0 },
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::unwind::RULE_FRAME_POINTER;

    fn function(
        name: &str,
        entry: u64,
        end: u64,
        flag: u8,
        pcsp: &[(u64, u64, i32)],
    ) -> GoFunctionUnwind {
        GoFunctionUnwind {
            entry,
            end,
            name: name.to_string(),
            flag,
            pcsp: pcsp.to_vec(),
        }
    }

    fn kind(kind: u8) -> UnwindRule {
        UnwindRule {
            kind,
            ..Default::default()
        }
    }

    #[test]
    fn pcsp_runs_become_cfa_rules() {
        let table = rows(
            &[
                function(
                    "runtime.goexit",
                    0x1000,
                    0x1010,
                    FUNC_FLAG_TOPFRAME,
                    &[(0x1000, 0x1010, 0)],
                ),
                // Prologue: 0 until the frame is set up, then 0x28, back to 0 at RET.
                function(
                    "main.work",
                    0x1020,
                    0x1080,
                    0,
                    &[
                        (0x1020, 0x1025, 0),
                        (0x1025, 0x1078, 0x28),
                        (0x1078, 0x1080, 0),
                    ],
                ),
                function(
                    "runtime.systemstack",
                    0x1080,
                    0x10a0,
                    FUNC_FLAG_SPWRITE,
                    &[],
                ),
                function(
                    "runtime.sigtramp",
                    0x10a0,
                    0x10b0,
                    FUNC_FLAG_TOPFRAME,
                    &[(0x10a0, 0x10b0, 0x10)],
                ),
                function("runtime.sigreturn__sigaction", 0x10b0, 0x10c0, 0, &[]),
                function(
                    "runtime.asmcgocall",
                    0x10c0,
                    0x10d0,
                    FUNC_FLAG_SPWRITE | FUNC_FLAG_ASM,
                    &[(0x10c0, 0x10c8, 0), (0x10c8, 0x10d0, 64)],
                ),
            ],
            Arch::X86_64,
        );
        let at = |address| table.rule_at(address).unwrap();
        assert_eq!(at(0x1000), kind(RULE_ROOT));
        // Gap between goexit's end and main.work.
        assert_eq!(at(0x1010), kind(RULE_FRAME_POINTER));
        let sp = |cfa_offset, fp_offset| UnwindRule {
            kind: RULE_CFA_SP,
            cfa_offset,
            fp_offset,
            ra_offset: -8,
            ..Default::default()
        };
        assert_eq!(at(0x1020), sp(8, 0));
        assert_eq!(at(0x1025), sp(0x30, -16));
        assert_eq!(at(0x1078), sp(8, 0));
        // main.work ends where systemstack starts: the stop rule wins.
        assert_eq!(at(0x1080), kind(RULE_STOP));
        // The signal handler is a frame, not a root; its restorer is the
        // signal frame.
        assert_eq!(at(0x10a0), sp(0x18, -16));
        assert_eq!(at(0x10b0), kind(RULE_SIGNAL));
        // ...also where the handler's return address is looked up, one
        // byte back; the handler's last bytes before it are its own.
        assert_eq!(at(0x10af), kind(RULE_SIGNAL));
        assert_eq!(at(0x10ae), sp(0x18, -16));
        // Go before 1.23: depth and g at 40(SP) and 48(SP); Go 1.19 has
        // no frame-pointer prologue.
        assert_eq!(
            at(0x10c0),
            UnwindRule {
                kind: RULE_GO_CGOCALL,
                cfa_offset: 40,
                param: 48,
                ..Default::default()
            }
        );
        assert_eq!(at(0x10d0), kind(RULE_FRAME_POINTER));
        assert!(table.rows.windows(2).all(|w| w[0].address < w[1].address));
    }

    #[test]
    fn arm64_keeps_the_return_address_in_lr_until_the_frame_exists() {
        let table = rows(
            &[function(
                "main.work",
                0x1000,
                0x1040,
                0,
                &[
                    (0x1000, 0x1004, 0),
                    (0x1004, 0x103c, 0x30),
                    (0x103c, 0x1040, 0),
                ],
            )],
            Arch::Aarch64,
        );
        let entry = table.rule_at(0x1000).unwrap();
        assert_eq!(
            (entry.cfa_offset, entry.ra_offset, entry.fp_offset),
            (0, 0, 0)
        );
        let body = table.rule_at(0x1010).unwrap();
        assert_eq!(
            (body.kind, body.cfa_offset, body.ra_offset, body.fp_offset),
            (RULE_CFA_SP, 0x30, -0x30, -0x38)
        );
    }

    #[test]
    fn calls_the_signal_handler_faked_are_marked() {
        let functions = [
            function(
                "runtime.asyncPreempt",
                0x1000,
                0x1100,
                FUNC_FLAG_ASM,
                &[
                    (0x1000, 0x1008, 0),
                    (0x1008, 0x10fc, 496),
                    (0x10fc, 0x1100, -16),
                ],
            ),
            function(
                "runtime.sigpanic",
                0x1100,
                0x1180,
                0,
                &[(0x1100, 0x1180, 0x20)],
            ),
            function(
                "runtime.asyncPreempt2",
                0x1180,
                0x1200,
                0,
                &[(0x1180, 0x1200, 0x20)],
            ),
        ];
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let table = rows(&functions, arch);
            let marked =
                |address| table.rule_at(address).unwrap().flags & RULE_FLAG_GO_INJECTED_CALL != 0;
            assert!(
                marked(0x1000) && marked(0x1010) && marked(0x1110),
                "{arch:?}"
            );
            // An ordinary call, whatever its name looks like.
            assert!(!marked(0x1190), "{arch:?}");
            // Past the handler's slot (the JMP back): no rule.
            assert_eq!(table.rule_at(0x10fc), Some(kind(RULE_STOP)), "{arch:?}");
            // The rest of the rule is the pcsp rule.
            assert_eq!(
                table.rule_at(0x1010).unwrap().cfa_offset,
                pcsp_rule(496, arch).cfa_offset
            );
        }
    }

    #[test]
    fn roots_are_known_by_name_before_go_1_17() {
        let table = rows(
            &[function(
                "runtime.goexit",
                0x2000,
                0x2010,
                0,
                &[(0x2000, 0x2010, 0)],
            )],
            Arch::X86_64,
        );
        assert_eq!(table.rule_at(0x2000), Some(kind(RULE_ROOT)));
    }

    #[test]
    fn go_1_23_keeps_the_cgo_depth_at_the_stack_pointer() {
        let table = rows(
            &[
                function("runtime.asmcgocall_landingpad", 0x3000, 0x3010, 0, &[]),
                function(
                    "runtime.asmcgocall",
                    0x3010,
                    0x3040,
                    FUNC_FLAG_SPWRITE | FUNC_FLAG_ASM,
                    &[
                        (0x3010, 0x3011, 0),
                        (0x3011, 0x3030, 8),
                        (0x3030, 0x3040, 24),
                    ],
                ),
                // The ABIInternal wrapper of the same name: an ordinary frame.
                function(
                    "runtime.asmcgocall",
                    0x3040,
                    0x3060,
                    0,
                    &[(0x3040, 0x3060, 0x18)],
                ),
            ],
            Arch::X86_64,
        );
        let rule = table.rule_at(0x3020).unwrap();
        assert_eq!(
            (
                rule.kind,
                rule.cfa_offset,
                rule.param,
                rule.ra_offset,
                rule.fp_offset
            ),
            (RULE_GO_CGOCALL, 0, 8, 8, -16)
        );
        assert_eq!(table.rule_at(0x3050).unwrap().kind, RULE_CFA_SP);
    }

    /// A Go function with a frame: SP delta 0 for its first 4 bytes, 24
    /// after.
    fn framed(name: &str, entry: u64, end: u64, flag: u8) -> GoFunctionUnwind {
        function(
            name,
            entry,
            end,
            flag,
            &[(entry, entry + 4, 0), (entry + 4, end, 24)],
        )
    }

    /// Assembly with a frame whose first instruction is `push_byte` and
    /// then `MOVQ SP, BP`'s bytes; its code is written into `code`.
    fn framed_asm(
        name: &str,
        entry: u64,
        end: u64,
        push_byte: u8,
        code: &mut [u8],
    ) -> GoFunctionUnwind {
        let at = (entry - 0x1000) as usize;
        code[at..at + 4].copy_from_slice(&[push_byte, 0x48, 0x89, 0xe5]);
        function(
            name,
            entry,
            end,
            FUNC_FLAG_ASM,
            &[
                (entry, entry + 1, 0),
                (entry + 1, entry + 4, 8),
                (entry + 4, end, 24),
            ],
        )
    }

    #[test]
    fn callers_step_by_frame_record_between_the_functions_that_may_not() {
        let mut code = vec![0xccu8; 0x700];
        let functions = [
            framed("main.a", 0x1000, 0x1100, 0),
            // A frameless Go function: a leaf (the compiler gives every
            // function that calls a frame since 1.21).
            function("main.leaf", 0x1100, 0x1120, 0, &[(0x1100, 0x1120, 0)]),
            framed("main.b", 0x1120, 0x1200, 0),
            // Frameless assembly may call (NOFRAME): left out.
            function(
                "runtime.memmove",
                0x1200,
                0x1300,
                FUNC_FLAG_ASM,
                &[(0x1200, 0x1300, 0)],
            ),
            // Assembly whose frame begins with the assembler's record.
            framed_asm("crypto/sha256.block", 0x1300, 0x1400, 0x55, &mut code),
            // Special steps: by name and by flag.
            framed("runtime.sigpanic", 0x1400, 0x1480, 0),
            framed(
                "runtime.mcall",
                0x1480,
                0x1500,
                FUNC_FLAG_ASM | FUNC_FLAG_SPWRITE,
            ),
            framed("main.c", 0x1500, 0x1600, 0),
            framed(
                "runtime.goexit",
                0x1600,
                0x1610,
                FUNC_FLAG_ASM | FUNC_FLAG_TOPFRAME,
            ),
            framed("main.d", 0x1610, 0x1640, 0),
            // Go 1.21's crosscall2: NOFRAME, its first push the flags
            // (PUSHFQ, 9c), then a call with the C caller's BP.
            framed_asm("crosscall2", 0x1640, 0x1680, 0x9c, &mut code),
            framed("main.e", 0x1680, 0x16c0, 0),
            // A restorer's rule covers the byte before it too.
            function(
                "runtime.sigreturn__sigaction",
                0x16c0,
                0x16d0,
                FUNC_FLAG_ASM,
                &[],
            ),
            framed("main.f", 0x16d0, 0x1700, 0),
        ];
        let text = Some(Code {
            address: 0x1000,
            bytes: &code,
        });
        let ranges = frame_record_callers(&functions, Arch::X86_64, Some(27), text);
        assert_eq!(
            ranges,
            vec![
                (0x1000, 0x1200),
                (0x1300, 0x1400),
                (0x1500, 0x1600),
                (0x1610, 0x1640),
                (0x1680, 0x16bf),
                (0x16d0, 0x1700)
            ]
        );
        // Without the code, no assembly is trusted.
        let blind = frame_record_callers(&functions, Arch::X86_64, Some(27), None);
        assert!(!blind.contains(&(0x1300, 0x1400)), "{blind:x?}");
        // Before Go 1.19, no promise (1.17 and 1.18 unchecked); arm64's
        // record does not give the caller's SP; without a version, none.
        assert!(frame_record_callers(&functions, Arch::X86_64, Some(18), text).is_empty());
        assert!(frame_record_callers(&functions, Arch::X86_64, None, text).is_empty());
        assert!(frame_record_callers(&functions, Arch::Aarch64, Some(27), text).is_empty());
    }

    #[test]
    fn before_go_1_21_a_frameless_function_that_calls_is_left_out() {
        let mut code = vec![0xccu8; 0x300];
        // runtime.osyield (an ABI wrapper, frameless and nosplit in Go
        // 1.19): CALL main.a.
        let rel = (0x1000i64 - (0x1100 + 5)) as i32;
        code[0x100] = 0xe8;
        code[0x101..0x105].copy_from_slice(&rel.to_le_bytes());
        // An indirect call: CALL DX.
        code[0x180..0x182].copy_from_slice(&[0xff, 0xd2]);
        // Assembly framed by Go 1.19's assembler: SUBQ $0x78, SP (4
        // bytes), MOVQ BP, 0x70(SP), LEAQ 0x70(SP), BP; and the same
        // with a 0x1000-byte frame (SUBQ $0x1000, SP is 7 bytes).
        code[0x200..0x20e].copy_from_slice(&[
            0x48, 0x83, 0xec, 0x78, 0x48, 0x89, 0x6c, 0x24, 0x70, 0x48, 0x8d, 0x6c, 0x24, 0x70,
        ]);
        code[0x240..0x247].copy_from_slice(&[0x48, 0x81, 0xec, 0x00, 0x10, 0x00, 0x00]);
        code[0x247..0x24f].copy_from_slice(&[0x48, 0x89, 0xac, 0x24, 0xf8, 0x0f, 0x00, 0x00]);
        code[0x24f..0x257].copy_from_slice(&[0x48, 0x8d, 0xac, 0x24, 0xf8, 0x0f, 0x00, 0x00]);
        // The same SUBQ without the save: left out.
        code[0x280..0x284].copy_from_slice(&[0x48, 0x83, 0xec, 0x78]);
        let functions = [
            framed("main.a", 0x1000, 0x1100, 0),
            function("runtime.osyield", 0x1100, 0x1110, 0, &[(0x1100, 0x1110, 0)]),
            framed("main.b", 0x1110, 0x1180, 0),
            function("main.indirect", 0x1180, 0x1190, 0, &[(0x1180, 0x1190, 0)]),
            function("main.leaf", 0x1190, 0x11a0, 0, &[(0x1190, 0x11a0, 0)]),
            framed("main.c", 0x11a0, 0x1200, 0),
            function(
                "runtime.gcWriteBarrier",
                0x1200,
                0x1240,
                FUNC_FLAG_ASM,
                &[(0x1200, 0x1204, 0), (0x1204, 0x1240, 0x78)],
            ),
            function(
                "main.bigFrame",
                0x1240,
                0x1280,
                FUNC_FLAG_ASM,
                &[(0x1240, 0x1247, 0), (0x1247, 0x1280, 0x1000)],
            ),
            function(
                "main.unsaved",
                0x1280,
                0x12c0,
                FUNC_FLAG_ASM,
                &[(0x1280, 0x1284, 0), (0x1284, 0x12c0, 0x78)],
            ),
            framed("main.d", 0x12c0, 0x1300, 0),
        ];
        let text = Some(Code {
            address: 0x1000,
            bytes: &code,
        });
        assert_eq!(
            frame_record_callers(&functions, Arch::X86_64, Some(19), text),
            vec![
                (0x1000, 0x1100),
                (0x1110, 0x1180),
                (0x1190, 0x1280),
                (0x12c0, 0x1300)
            ]
        );
        // Since 1.21 a frameless function does not call.
        assert_eq!(
            frame_record_callers(&functions, Arch::X86_64, Some(21), text),
            vec![(0x1000, 0x1280), (0x12c0, 0x1300)]
        );
        // Without the code, every frameless Go function and all assembly
        // is left out.
        assert_eq!(
            frame_record_callers(&functions, Arch::X86_64, Some(20), None),
            vec![
                (0x1000, 0x1100),
                (0x1110, 0x1180),
                (0x11a0, 0x1200),
                (0x12c0, 0x1300)
            ]
        );
    }

    #[test]
    fn only_the_largest_stretches_are_kept() {
        // Stretches of 0x100, 0x200, ... 0xa00 bytes, each followed by a
        // frameless assembly function.
        let mut functions = Vec::new();
        let mut at = 0x10000;
        for i in 1..=10u64 {
            functions.push(framed("main.f", at, at + i * 0x100, 0));
            at += i * 0x100;
            functions.push(function(
                "main.asm",
                at,
                at + 0x10,
                FUNC_FLAG_ASM,
                &[(at, at + 0x10, 0)],
            ));
            at += 0x10;
        }
        let ranges = frame_record_callers(&functions, Arch::X86_64, Some(21), None);
        assert_eq!(ranges.len(), FRAME_RECORD_RANGES);
        // Sorted by address, the two smallest (first) left out.
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
        let lengths: Vec<u64> = ranges.iter().map(|(s, e)| e - s).collect();
        assert_eq!(lengths, (3..=10).map(|i| i * 0x100).collect::<Vec<_>>());
    }
}

//! Unwind rows from Go's pcsp tables (amd64).
//!
//! Go's own traceback (runtime/traceback.go) finds a caller from the SP
//! delta at a PC: CFA = SP + pcsp(pc) + 8, return address at CFA - 8. A
//! function that has a frame saved the caller's BP just below the return
//! address (cmd/internal/obj/x86/obj6.go inserts `PUSHQ BP` / the BP save
//! for every function with a frame), so the caller's BP is at CFA - 16
//! whenever the SP delta is non-zero; a frameless function leaves BP alone.
//! This holds inside assembly that uses BP as a general register
//! (crypto/sha256.block): its prologue saved BP before clobbering it.

use profiler_common::{UNWIND_FRAME_POINTER, UNWIND_ROOT, UNWIND_STOP, UnwindRow};

use super::TableRows;

/// What the unwinder needs of one Go function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFunctionUnwind {
    pub entry: u64,
    pub end: u64,
    pub name: String,
    /// `_func.flag` (Go 1.17+): TOPFRAME=1, SPWRITE=2, ASM=4.
    pub flag: u8,
    /// pcsp runs: [start, end) has SP delta `delta` (bytes below the CFA
    /// minus the return address).
    pub pcsp: Vec<(u64, u64, i32)>,
}

const FUNC_FLAG_TOPFRAME: u8 = 1;
const FUNC_FLAG_SPWRITE: u8 = 2;

/// Outermost frames of Go stacks (Go ≤ 1.16 has no TOPFRAME flag, so
/// they are matched by name too).
const ROOT_FUNCTIONS: &[&str] = &["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];

/// Functions that switch stacks: their SP is not their frame's (Go matches
/// them by name as well, runtime/traceback.go).
const STACK_SWITCHERS: &[&str] = &[
    "runtime.systemstack",
    "runtime.mcall",
    "runtime.morestack",
    "runtime.morestack_noctxt",
    "runtime.gogo",
    "runtime.asmcgocall",
    "runtime.asmcgocall_landingpad",
    "runtime.cgocallback",
    "runtime.sigreturn__sigaction",
    "runtime.sigtramp",
];

/// Rows for every function of a Go binary's pclntab, or None when the
/// binary is not amd64 (arm64 keeps return addresses in LR until a frame
/// saves them: its rules are not written yet).
pub fn rows_for(symbols: &crate::symbolize::go::GoSymbols) -> Option<TableRows> {
    if symbols.pc_quantum() != 1 || symbols.pointer_size() != 8 {
        return None;
    }
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
    rows(&functions)
}

/// Rows for all `functions` (sorted by entry), relative to the first
/// entry. Gaps between functions (and after the last) walk frame pointers.
pub fn rows(functions: &[GoFunctionUnwind]) -> Option<TableRows> {
    let base = functions.first()?.entry;
    let mut rows: Vec<UnwindRow> = Vec::new();
    let push = |rows: &mut Vec<UnwindRow>, pc: u64, row: UnwindRow| {
        let Ok(pc) = u32::try_from(pc - base) else {
            return;
        };
        let row = UnwindRow { pc, ..row };
        match rows.last_mut() {
            // A later rule at the same pc replaces a gap marker.
            Some(last) if last.pc == pc => *last = row,
            Some(last) if last.pc > pc => {}
            _ => rows.push(row),
        }
    };
    for function in functions {
        if function.end <= function.entry || function.entry < base {
            continue;
        }
        let is_root = function.flag & FUNC_FLAG_TOPFRAME != 0
            || ROOT_FUNCTIONS.contains(&function.name.as_str());
        let switches_stack = function.flag & FUNC_FLAG_SPWRITE != 0
            || STACK_SWITCHERS.contains(&function.name.as_str());
        if is_root || switches_stack {
            let flags = if is_root {
                UNWIND_STOP | UNWIND_ROOT
            } else {
                UNWIND_STOP
            };
            push(
                &mut rows,
                function.entry,
                UnwindRow {
                    flags,
                    ..UnwindRow::default()
                },
            );
        } else if function.pcsp.is_empty() {
            push(
                &mut rows,
                function.entry,
                UnwindRow {
                    flags: UNWIND_FRAME_POINTER,
                    ..UnwindRow::default()
                },
            );
        } else {
            for &(start, end, delta) in &function.pcsp {
                if end <= start || start < function.entry || delta < 0 {
                    continue;
                }
                push(
                    &mut rows,
                    start,
                    UnwindRow {
                        pc: 0,
                        cfa_offset: delta + 8,
                        fp_offset: if delta > 0 { -16 } else { 0 },
                        flags: 0,
                    },
                );
            }
        }
        push(
            &mut rows,
            function.end,
            UnwindRow {
                flags: UNWIND_FRAME_POINTER,
                ..UnwindRow::default()
            },
        );
    }
    Some(TableRows { base, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn pcsp_runs_become_cfa_rules() {
        let table = rows(&[
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
        ])
        .unwrap();
        assert_eq!(table.base, 0x1000);
        let rows = table.rows;
        assert_eq!(
            rows[0],
            UnwindRow {
                pc: 0,
                cfa_offset: 0,
                fp_offset: 0,
                flags: UNWIND_STOP | UNWIND_ROOT
            }
        );
        // Gap between goexit's end and main.work.
        assert_eq!(
            rows[1],
            UnwindRow {
                pc: 0x10,
                flags: UNWIND_FRAME_POINTER,
                ..Default::default()
            }
        );
        assert_eq!(
            rows[2],
            UnwindRow {
                pc: 0x20,
                cfa_offset: 8,
                fp_offset: 0,
                flags: 0
            }
        );
        assert_eq!(
            rows[3],
            UnwindRow {
                pc: 0x25,
                cfa_offset: 0x30,
                fp_offset: -16,
                flags: 0
            }
        );
        assert_eq!(
            rows[4],
            UnwindRow {
                pc: 0x78,
                cfa_offset: 8,
                fp_offset: 0,
                flags: 0
            }
        );
        // main.work ends where systemstack starts: the stop rule wins.
        assert_eq!(
            rows[5],
            UnwindRow {
                pc: 0x80,
                flags: UNWIND_STOP,
                ..Default::default()
            }
        );
        assert_eq!(
            rows[6],
            UnwindRow {
                pc: 0xa0,
                flags: UNWIND_FRAME_POINTER,
                ..Default::default()
            }
        );
        assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc));
    }

    #[test]
    fn roots_are_known_by_name_before_go_1_17() {
        let table = rows(&[function(
            "runtime.goexit",
            0x2000,
            0x2010,
            0,
            &[(0x2000, 0x2010, 0)],
        )])
        .unwrap();
        assert_eq!(table.rows[0].flags, UNWIND_STOP | UNWIND_ROOT);
    }
}

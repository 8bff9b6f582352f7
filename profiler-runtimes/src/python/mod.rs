//! CPython: Python frames in every stack of a Python process, interleaved
//! with the native frames, read from outside (nothing changes in the
//! target). The BPF side is `profiler-ebpf/src/runtimes/python.rs`, the
//! types both sides share `profiler-common/src/runtimes/python.rs`.
//!
//! - [`interpreter`]: the interpreter in an object file (`_PyRuntime`,
//!   the eval loop and its cold part, the version), found by what it
//!   exports, stripped or not;
//! - [`layout`]: where it keeps threads, frames and code objects (its
//!   `_Py_DebugOffsets` on 3.13+, a checked table per minor version
//!   before);
//! - [`threads`]: its thread states, read from its own thread list;
//! - [`registry`]: the thread that tells the BPF walker about each
//!   CPython process and its threads;
//! - [`code`] and [`linetable`]: code objects read from the process, and
//!   the line being executed.
//!
//! [`PYTHON`] marks the eval loop in the unwind tables
//! (`RULE_FLAG_INTERPRETER`): where the native walker meets it, the BPF
//! walker writes the activation's Python frames in its place.

pub mod code;
pub mod interpreter;
pub mod layout;
pub mod linetable;
pub mod registry;
pub mod threads;

use std::sync::Arc;

use profiler_common::unwind::RULE_FLAG_INTERPRETER;
use profiler_unwind::build::{RuntimeRows, RuntimeTable, TableSource};
use profiler_unwind::table::{ObjectTable, TableRow};

/// CPython, as the table builder asks it.
pub struct Python;

/// The one instance the runtime lists name.
pub static PYTHON: Python = Python;

impl RuntimeRows for Python {
    fn name(&self) -> &'static str {
        "cpython"
    }

    /// The CFI rows of the eval loop (hot and cold parts), marked.
    fn rows(
        &self,
        file: &object::File<'_>,
        _map: Option<&Arc<memmap2::Mmap>>,
        cfi: Option<&ObjectTable>,
    ) -> Option<RuntimeTable> {
        let interpreter = interpreter::find(file)?.ok()?;
        let cfi = cfi?;
        let mut rows = Vec::new();
        for &(start, end) in &interpreter.eval_ranges {
            let mut first = cfi.rule_at(start).unwrap_or_default();
            first.flags |= RULE_FLAG_INTERPRETER;
            rows.push(TableRow {
                address: start,
                rule: first,
            });
            for row in cfi
                .rows
                .iter()
                .filter(|r| start < r.address && r.address < end)
            {
                let mut rule = row.rule;
                rule.flags |= RULE_FLAG_INTERPRETER;
                rows.push(TableRow {
                    address: row.address,
                    rule,
                });
            }
        }
        rows.sort_by_key(|r| r.address);
        Some(RuntimeTable {
            table: ObjectTable::from_sorted(rows),
            ranges: interpreter.eval_ranges,
            source: TableSource::CfiWithInterpreter,
        })
    }
}

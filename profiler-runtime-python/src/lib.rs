//! CPython: Python frames in every stack of a Python process, interleaved
//! with the native frames, read from outside (nothing changes in the
//! target). The BPF side is `profiler-ebpf/src/runtimes/python.rs`, the
//! types both sides share `profiler-common/src/runtimes/python.rs`;
//! [`CPYTHON`] is the runtime as the products see it
//! (`profiler_runtime::Runtime`).
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
//! (`RULE_FLAG_INTERPRETER` with the runtime's id): where the native
//! walker meets it, it writes an activation mark, and the CPython walker
//! writes the activation's Python frames for it.

pub mod code;
pub mod interpreter;
pub mod layout;
pub mod linetable;
pub mod registry;
pub mod threads;

use std::sync::Arc;

use aya::Ebpf;
use profiler_common::runtimes::RUNTIME_CPYTHON;
use profiler_runtime::{Registry, Runtime, RuntimeError, Shared};
use profiler_unwind::build::{RuntimeRows, RuntimeTable, TableSource};
use profiler_unwind::table::{ObjectTable, TableRow};

use registry::PythonRegistry;

/// CPython, as the products see it.
pub struct CPython;

/// CPython processes and where they keep what the walker reads.
const PY_PROCESSES: profiler_runtime::ProcessMap<profiler_common::runtimes::python::PyProcess> =
    profiler_runtime::ProcessMap::new("PY_PROCESSES");
/// Thread states by thread id (3.10: by thread pointer).
const PY_THREADS: profiler_bpf::maps::Handle<
    aya::maps::HashMap<aya::maps::MapData, u64, profiler_common::runtimes::python::PyThread>,
> = profiler_bpf::maps::Handle::new("PY_THREADS");

/// The one instance the runtime list names.
pub static CPYTHON: CPython = CPython;

impl Runtime for CPython {
    fn name(&self) -> &'static str {
        "cpython"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["python"]
    }

    fn about(&self) -> &'static str {
        "Python functions with their files and lines (CPython 3.10 to 3.14)"
    }

    fn id(&self) -> u8 {
        RUNTIME_CPYTHON
    }

    fn maps(&self) -> &'static [&'static str] {
        &["PY_PROCESSES", "PY_THREADS", "PY_WALK"]
    }

    fn frame_type(&self) -> &'static str {
        "cpython"
    }

    fn unwind_rows(&self) -> Option<&'static dyn RuntimeRows> {
        Some(&PYTHON)
    }

    fn walker(&self) -> Option<&'static str> {
        Some("walk_cpython")
    }

    /// The eval loop is found by its rows.
    fn needs_tables(&self) -> bool {
        true
    }

    fn start(&self, ebpf: &mut Ebpf, _shared: &Shared) -> Result<Box<dyn Registry>, RuntimeError> {
        let registry = PythonRegistry::spawn(PY_PROCESSES.take(ebpf)?, PY_THREADS.take(ebpf)?)
            .map_err(|e| RuntimeError::Thread("python", e))?;
        Ok(Box::new(registry))
    }
}

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
            let first = cfi
                .rule_at(start)
                .unwrap_or_default()
                .interpreter(RUNTIME_CPYTHON);
            rows.push(TableRow {
                address: start,
                rule: first,
            });
            for row in cfi
                .rows
                .iter()
                .filter(|r| start < r.address && r.address < end)
            {
                rows.push(TableRow {
                    address: row.address,
                    rule: row.rule.interpreter(RUNTIME_CPYTHON),
                });
            }
        }
        rows.sort_by_key(|r| r.address);
        Some(RuntimeTable {
            table: ObjectTable::from_sorted(rows),
            ranges: interpreter.eval_ranges,
            source: TableSource::CfiWithInterpreter,
            frame_record_callers: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::code::{CodeObject, Interpreter, MAX_NAME};
    use super::layout::Layout;
    use super::threads;
    use profiler_runtime::memory::ImageMemory;

    const BASE: u64 = 0x10_0000;

    /// A 3.12 code object in an image: `PyCode_Type` at BASE, the code at
    /// BASE + 0x100, its name a compact ASCII str claiming `name_length`
    /// characters, its file "app.py", its line table `table`.
    fn image(name_length: u64, table: &[u8]) -> ImageMemory {
        let mut bytes = vec![0u8; 0x4000];
        let put = |bytes: &mut Vec<u8>, at: u64, value: u64| {
            let at = (at - BASE) as usize;
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        let (code, name, file, lines) = (BASE + 0x100, BASE + 0x400, BASE + 0x800, BASE + 0xc00);
        let layout = Layout::table(12).unwrap();
        put(&mut bytes, code + 8, BASE); // ob_type
        put(&mut bytes, code + layout.code_qualname.unwrap(), name);
        put(&mut bytes, code + layout.code_filename, file);
        put(&mut bytes, code + layout.code_firstlineno, 7);
        put(&mut bytes, code + layout.code_linetable, lines);
        // Compact ASCII: kind 1, compact, ascii.
        let state = (1 << 2) | (1 << 5) | (1 << 6);
        for (at, text, length) in [
            (name, &b"Handler.get"[..], name_length),
            (file, b"app.py", 6),
        ] {
            put(&mut bytes, at + 16, length);
            put(&mut bytes, at + 32, state);
            let data = (at + layout.unicode_ascii_data - BASE) as usize;
            bytes[data..data + text.len()].copy_from_slice(text);
            for byte in &mut bytes[data + text.len()..data + 0x200] {
                *byte = b'x';
            }
        }
        put(&mut bytes, lines + 16, table.len() as u64);
        let data = (lines + 32 - BASE) as usize;
        bytes[data..data + table.len()].copy_from_slice(table);
        ImageMemory { base: BASE, bytes }
    }

    fn interpreter() -> Interpreter {
        Interpreter {
            pid: 0,
            layout: Layout::table(12).unwrap(),
            code_type: Some(BASE),
        }
    }

    #[test]
    fn a_code_object_is_read_with_its_name_file_and_lines() {
        // The 3.12 table of `def f()` at line 2 (see linetable's tests).
        let table = [
            128, 0, 216, 8, 9, 128, 65, 216, 8, 9, 128, 65, 216, 11, 12, 136, 113, 137, 53, 128, 76,
        ];
        let memory = image(11, &table);
        let interpreter = interpreter();
        let code = interpreter.code_in(&memory, BASE + 0x100).unwrap();
        assert_eq!(
            code,
            CodeObject {
                name: "Handler.get".into(),
                file: "app.py".into(),
                first_line: 7,
                line_table: table.to_vec(),
            }
        );
        // prev_instr at code unit 3 of the bytecode (which starts at
        // co_code_adaptive, 192 in 3.12): first line + 2, as
        // co_positions() gives it.
        let instruction = BASE + 0x100 + 192 + 3 * 2;
        assert_eq!(interpreter.line(BASE + 0x100, &code, instruction), Some(9));
    }

    #[test]
    fn forged_names_are_cut_and_forged_objects_refused() {
        // A name claiming 100 million characters is cut, marked.
        let memory = image(100_000_000, &[]);
        let code = interpreter().code_in(&memory, BASE + 0x100);
        // The image ends before 100 MB: cut at MAX_NAME, which it holds.
        let code = code.unwrap();
        assert_eq!(code.name.chars().count(), MAX_NAME + 1);
        assert!(code.name.ends_with('…'));
        // What it runs into past its 'x's (NULs, the file's header) is
        // cut from the name's text as '?': a forged newline or NUL would
        // split the lines of folded and `go tool pprof -raw` output.
        assert!(code.name.starts_with("Handler.getxxx"));
        assert!(code.name.contains("x?"), "{:?}", &code.name[..600]);
        assert!(!code.name.chars().any(char::is_control));
        // Not a code object: its type is not PyCode_Type.
        let mut other = interpreter();
        other.code_type = Some(BASE + 8);
        assert!(other.code_in(&memory, BASE + 0x100).is_err());
        // Garbage everywhere: answers or errors, never a panic, and every
        // loop in the thread walk ends.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for round in 0..300u64 {
            let mut garbage = image(11, &[0xff; 16]);
            for _ in 0..64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed as usize) % garbage.bytes.len();
                garbage.bytes[at] = (seed >> 24) as u8;
            }
            let at = BASE + (seed % 0x4000);
            for minor in 10..=14 {
                let layout = Layout::table(minor).unwrap();
                let interpreter = Interpreter {
                    pid: 0,
                    layout: layout.clone(),
                    code_type: None,
                };
                if let Ok(code) = interpreter.code_in(&garbage, at) {
                    let _ = interpreter.line(at, &code, seed ^ round);
                }
                let _ = threads::thread_states(&garbage, &layout, at, &HashMap::new());
                let _ = Layout::from_debug_offsets(&garbage, at);
            }
        }
    }
}

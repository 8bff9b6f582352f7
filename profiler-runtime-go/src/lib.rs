//! Go: everything the profiler knows of Go binaries and the Go runtime,
//! in user space. (The BPF side is `profiler-ebpf/src/runtimes/go.rs`, the
//! types both sides share `profiler-common/src/runtimes/go.rs`.)
//!
//! - [`pclntab`]: the runtime's own symbol table (functions, files, lines,
//!   inlined calls), read from the binary, stripped or not; it names Go
//!   frames and gives the pcsp tables;
//! - [`unwind`]: unwind rows from the pcsp tables, and the runtime's stack
//!   switches (cgo calls and callbacks, signal handlers, the scheduler);
//! - [`labels`]: where the runtime keeps goroutines and their pprof
//!   labels, and the thread that tells the BPF program for each Go
//!   process, which copies the running goroutine's labels into samples;
//! - [`state`]: the runtime's heap profile and goroutines, read from a
//!   process's memory.
//!
//! [`GO`] is the runtime as the products see it
//! (`profiler_runtime::Runtime`): its symbols and rows always, its labels
//! when it is selected.

pub mod labels;
pub mod pclntab;
pub mod state;
pub mod unwind;

use std::sync::Arc;

use aya::Ebpf;
use profiler_runtime::{Globals, Registry, Runtime, RuntimeError, Shared};
use profiler_symbolize::{RuntimeObjects, RuntimeSymbols};
use profiler_unwind::build::{RuntimeRows, RuntimeTable, TableSource};
use profiler_unwind::table::ObjectTable;

use pclntab::GoSymbols;

/// The Go runtime, as the symbolizer and the table builder ask it.
pub struct Go;

/// Go processes and where their runtime keeps goroutines and labels.
const GO_PROCESSES: profiler_runtime::ProcessMap<profiler_common::runtimes::go::GoProcess> =
    profiler_runtime::ProcessMap::new("GO_PROCESSES");

/// The one instance the runtime list names.
pub static GO: Go = Go;

/// The sampling program's global that switches label reading on
/// (profiler-ebpf/src/runtimes/go/labels.rs).
const GLOBAL_GO_LABELS: &str = "GO_LABELS";

impl Runtime for Go {
    fn name(&self) -> &'static str {
        "go"
    }

    fn about(&self) -> &'static str {
        "goroutines' pprof labels on Go samples (Go's symbols and stacks are always read)"
    }

    fn frame_type(&self) -> &'static str {
        "go"
    }

    fn symbols(&self) -> Option<&'static dyn RuntimeObjects> {
        Some(&GO)
    }

    fn unwind_rows(&self) -> Option<&'static dyn RuntimeRows> {
        Some(&GO)
    }

    fn globals(&self, on: bool, globals: &mut Globals) {
        globals.set(GLOBAL_GO_LABELS, &[u8::from(on)]);
    }

    fn start(&self, ebpf: &mut Ebpf, _shared: &Shared) -> Result<Box<dyn Registry>, RuntimeError> {
        let registry = labels::GoLabelRegistry::spawn(GO_PROCESSES.take(ebpf)?)
            .map_err(|e| RuntimeError::Thread("go-labels", e))?;
        Ok(Box::new(registry))
    }
}

/// Whether `file` was built by Go: it has Go's build-id note or build-info
/// section, or names the pclntab. (A stripped file that lost its section
/// headers still has a readable pclntab, but scanning every non-Go
/// object's data for one would cost time on every library.)
pub fn looks_like_go(file: &object::File<'_>) -> bool {
    use object::{Object, ObjectSection};
    [
        ".note.go.buildid",
        ".go.buildinfo",
        ".gopclntab",
        ".data.rel.ro.gopclntab",
    ]
    .iter()
    .any(|name| file.section_by_name(name).is_some_and(|s| s.size() > 0))
}

/// Whether `file` is a Go binary, from its section names alone (cheap: no
/// symbol or debug table is read). Externally linked and stripped Go
/// binaries keep `.go.buildinfo` and `.note.go.buildid`.
pub fn is_go_binary(file: &std::fs::File) -> bool {
    // SAFETY: read-only mapping of a file we only read (see symbolize).
    let Ok(data) = (unsafe { memmap2::Mmap::map(file) }) else {
        return false;
    };
    object::File::parse(&*data).is_ok_and(|elf| looks_like_go(&elf))
}

/// Pids of running processes whose executable is a Go binary: the ones
/// whose stacks need unwind tables from the first sample on. Only section
/// headers are read.
pub fn go_processes() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::File::open(format!("/proc/{pid}/exe")).is_ok_and(|file| is_go_binary(&file))
        })
        .collect()
}

/// Reads the pclntab of a Go object (in place in `map` when given).
fn symbols_of(file: &object::File<'_>, map: Option<&Arc<memmap2::Mmap>>) -> Option<GoSymbols> {
    if !looks_like_go(file) {
        return None;
    }
    let symbols = match map {
        Some(map) => GoSymbols::from_mapped(file, map),
        None => GoSymbols::from_file(file),
    };
    symbols
        .map_err(|e| tracing::debug!("Go symbols unreadable: {e}"))
        .ok()
}

impl RuntimeObjects for Go {
    fn name(&self) -> &'static str {
        "go"
    }

    fn symbols(
        &self,
        file: &object::File<'_>,
        map: Option<&Arc<memmap2::Mmap>>,
    ) -> Option<Arc<dyn RuntimeSymbols>> {
        symbols_of(file, map).map(|s| Arc::new(s) as Arc<dyn RuntimeSymbols>)
    }
}

impl RuntimeSymbols for GoSymbols {
    fn function_entry(&self, address: u64) -> Option<u64> {
        self.function(address).map(|f| f.entry())
    }

    fn build_id(&self) -> Option<String> {
        GoSymbols::build_id(self).map(str::to_string)
    }
}

impl RuntimeRows for Go {
    fn name(&self) -> &'static str {
        "go"
    }

    fn rows(
        &self,
        file: &object::File<'_>,
        map: Option<&Arc<memmap2::Mmap>>,
        _cfi: Option<&ObjectTable>,
    ) -> Option<RuntimeTable> {
        let symbols = symbols_of(file, map)?;
        use object::{Object, ObjectSection};
        let text = file
            .section_by_name(".text")
            .and_then(|section| Some((section.address(), section.data().ok()?)));
        let code = text.map(|(address, bytes)| unwind::Code { address, bytes });
        let (table, start, end, frame_record_callers) = unwind::rows_for(&symbols, code)?;
        Some(RuntimeTable {
            table,
            ranges: vec![(start, end)],
            source: TableSource::GoPcsp,
            frame_record_callers,
        })
    }
}

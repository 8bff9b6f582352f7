//! Language runtimes, one folder each.
//!
//! A runtime is code the native view of a process does not explain: Go's
//! own symbol table and stack switches, and next the interpreters and
//! JITs whose frames are data, not code (CPython, HotSpot). Everything the
//! profiler knows of one runtime in user space lives in its folder here;
//! its BPF walker is `profiler-ebpf/src/runtimes/<name>.rs`, and the types
//! the two sides share are `profiler-common/src/runtimes/<name>.rs`. Three
//! places per runtime, no more.
//!
//! A runtime plugs into the stages of the data flow through small traits
//! that the lower crates define (so that they depend on no runtime):
//!
//! - `profiler_symbolize::RuntimeObjects`: its own symbol table of an
//!   object (Go's pclntab), tried before the ELF symbols;
//! - `profiler_unwind::build::RuntimeRows`: unwind rows over its code
//!   (Go's pcsp), which replace the CFI's there.
//!
//! [`SYMBOLS`] and [`UNWIND_ROWS`] list the runtimes for the symbolizer and
//! the table builder. How to add a runtime is in `docs/runtimes.md`.

pub mod go;

/// The runtimes the symbolizer asks for their own tables of each object.
pub static SYMBOLS: profiler_symbolize::Runtimes = &[&go::GO];

/// The runtimes the unwind-table builder asks for rows of each object.
pub static UNWIND_ROWS: profiler_unwind::build::Runtimes = &[&go::GO];

/// A symbolizer that knows every runtime's own tables: the one the
/// products use.
pub fn symbolizer() -> profiler_symbolize::Symbolizer {
    profiler_symbolize::Symbolizer::default().with_runtimes(SYMBOLS)
}

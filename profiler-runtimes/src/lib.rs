//! The language runtimes, one line each: the products take every runtime
//! from [`ALL`] and name none. Adding a runtime is its homes (its
//! `profiler-runtime-<name>` crate, its BPF walker in
//! `profiler-ebpf/src/runtimes/`, its shared types in
//! `profiler_common::runtimes`) and one line in each list (docs/runtimes.md,
//! "How to add a runtime").

use std::sync::OnceLock;

pub use profiler_runtime::*;
/// Go's own API (heap profiles, goroutines, pclntab) for the products
/// that offer it.
pub use profiler_runtime_go as go;

/// Every runtime, in the order their registries are asked.
pub static ALL: &[&dyn Runtime] = &[
    &profiler_runtime_go::GO,
    &profiler_runtime_python::CPYTHON,
    &profiler_runtime_hotspot::HOTSPOT,
];

/// The runtimes' own symbol tables of objects, for the symbolizer.
pub fn symbol_tables() -> profiler_symbolize::Runtimes {
    static TABLES: OnceLock<Vec<&'static dyn profiler_symbolize::RuntimeObjects>> = OnceLock::new();
    TABLES.get_or_init(|| ALL.iter().filter_map(|r| r.symbols()).collect())
}

/// The runtimes' unwind rows, for the table builder.
pub fn unwind_rows() -> profiler_unwind::build::Runtimes {
    static ROWS: OnceLock<Vec<&'static dyn profiler_unwind::build::RuntimeRows>> = OnceLock::new();
    ROWS.get_or_init(|| ALL.iter().filter_map(|r| r.unwind_rows()).collect())
}

/// A symbolizer that knows every runtime's own tables: the one the
/// products use.
pub fn symbolizer() -> profiler_symbolize::Symbolizer {
    profiler_symbolize::Symbolizer::default().with_runtimes(symbol_tables())
}

/// Parses a `--runtimes` list against [`ALL`].
pub fn selection(text: &str) -> Result<Selection, String> {
    Selection::parse(text, ALL)
}

/// The walkers to put in each context's chain for `selection` (with
/// unwind tables when `tables`): the native walker, then each selected
/// runtime's.
pub fn walkers(selection: &Selection, tables: bool) -> Vec<profiler_bpf::chain::Walker> {
    let mut walkers = vec![profiler_bpf::chain::NATIVE];
    for runtime in ALL {
        if let Some(program) = runtime.walker()
            && on(*runtime, selection, tables)
        {
            walkers.push(profiler_bpf::chain::Walker {
                program,
                slot: profiler_common::runtimes::chain_slot(runtime.id()),
            });
        }
    }
    walkers
}

/// The globals of the BPF object for `selection`.
pub fn globals(selection: &Selection, tables: bool) -> Globals {
    Globals::for_runtimes(ALL, selection, tables)
}

/// Starts the selected runtimes' registries on the loaded object.
pub fn start(
    ebpf: &mut aya::Ebpf,
    selection: &Selection,
    tables: bool,
) -> Result<RuntimeRegistry, RuntimeError> {
    RuntimeRegistry::start(ebpf, ALL, selection, tables)
}

/// The frame type of runtime `id`'s frames.
pub fn frame_type(id: u8) -> Option<&'static str> {
    ALL.iter().find(|r| r.id() == id).map(|r| r.frame_type())
}

/// The runtimes with a walker, all on: the probes' stacks read every
/// runtime's frames (Go's labels are CPU samples').
pub fn walker_runtimes() -> Selection {
    Selection::Only(
        ALL.iter()
            .filter(|r| r.walker().is_some())
            .map(|r| r.name().to_string())
            .collect(),
    )
}

/// Every runtime's BPF maps, which a product without stacks sizes down
/// to one entry each.
pub fn maps() -> Vec<&'static str> {
    ALL.iter().flat_map(|r| r.maps().iter().copied()).collect()
}

//! What a language runtime adds to the symbolization of its own objects.
//!
//! The runtimes themselves live in the profiler-runtimes crate (one folder
//! each); this crate only knows the two small traits they implement, so
//! that native symbolization does not depend on any runtime. Go's pclntab
//! is one: it names every function of a Go binary, stripped or not, and
//! knows which addresses are function entries.

use std::sync::Arc;

use super::frame::Resolver;

/// A runtime's own symbol table of one object (Go's pclntab), tried
/// before the ELF symbols.
pub trait RuntimeSymbols: Resolver {
    /// The entry of the function holding `address`, where the runtime
    /// knows its functions: a return address equal to an entry is not
    /// stepped back from (see `Symbolizer::user`).
    fn function_entry(&self, address: u64) -> Option<u64>;

    /// The object's build id in the runtime's own form, for objects with
    /// no GNU build id (Go's linker writes its own).
    fn build_id(&self) -> Option<String>;
}

/// Finds a runtime's symbol table in object files.
pub trait RuntimeObjects: Send + Sync {
    /// Short name for logs ("go").
    fn name(&self) -> &'static str;

    /// The runtime's symbols in `file` (whose bytes are `map` when it was
    /// memory-mapped, so tables can be read in place), or None when the
    /// object is not this runtime's or its tables are unreadable.
    fn symbols(
        &self,
        file: &object::File<'_>,
        map: Option<&Arc<memmap2::Mmap>>,
    ) -> Option<Arc<dyn RuntimeSymbols>>;
}

/// The runtimes a symbolizer asks about each object it parses.
pub type Runtimes = &'static [&'static dyn RuntimeObjects];

//! ELF object files: load segments (to turn file offsets into virtual
//! addresses), the build id, and the resolvers that name addresses.

pub mod fde;
pub mod minidebuginfo;
mod symbols;

pub use symbols::ElfSymbols;

use object::{Object, ObjectSegment};

use super::frame::{Frame, Resolver};
use super::runtime::{RuntimeSymbols, Runtimes};

/// Runs a parser over untrusted bytes, turning a panic inside a parsing
/// crate into an error so one malformed binary cannot take the profile down.
pub fn guard<T>(parse: impl FnOnce() -> Result<T, ElfError>) -> Result<T, ElfError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse)).unwrap_or(Err(ElfError::Panicked))
}

/// A `PT_LOAD` segment: where file bytes land in the object's address space.
#[derive(Debug, Clone, Copy)]
struct LoadSegment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

/// A parsed object file, ready to answer lookups. Parsed once per object
/// per run and shared by every process that maps it.
pub struct ElfObject {
    segments: Vec<LoadSegment>,
    /// GNU build id, as raw bytes.
    pub build_id: Option<Vec<u8>>,
    resolvers: Vec<Box<dyn Resolver>>,
    /// A runtime's own table of this object (Go's pclntab).
    runtime: Option<std::sync::Arc<dyn RuntimeSymbols>>,
    /// Function bounds from CFI, for a stripped native object (no
    /// `.symtab`): its unnamed addresses are grouped by function.
    fde: Option<fde::FdeBounds>,
}

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not a readable ELF file: {0}")]
    Parse(#[from] object::Error),
    #[error("the ELF parser panicked on this file (malformed input)")]
    Panicked,
}

impl ElfObject {
    /// Parses an object from its bytes. Malformed input is an error, never
    /// a panic of the agent.
    pub fn parse(data: &[u8]) -> Result<Self, ElfError> {
        let data: super::FileBytes = std::sync::Arc::new(data.to_vec());
        guard(|| {
            Ok(Self::from_file(
                &object::File::parse((*data).as_ref())?,
                &data,
                None,
                &[],
            ))
        })
    }

    /// Builds the lookup tables of an already parsed file whose bytes are
    /// `data` (kept: symbol names are read from it when looked up), asking
    /// each of `runtimes` for its own table of the object. With `map`, the
    /// memory map `file` was parsed over, such tables are read in place in
    /// it rather than copied.
    pub fn from_file(
        file: &object::File<'_>,
        data: &super::FileBytes,
        map: Option<&std::sync::Arc<memmap2::Mmap>>,
        runtimes: Runtimes,
    ) -> Self {
        let segments = file
            .segments()
            .map(|segment| {
                let (file_offset, file_size) = segment.file_range();
                LoadSegment {
                    file_offset,
                    file_size,
                    address: segment.address(),
                }
            })
            .collect();
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let symbols = ElfSymbols::from_object(file, data);
        let mut resolvers: Vec<Box<dyn Resolver>> = Vec::new();
        // A runtime's own table (Go's pclntab knows files, lines and
        // inline frames, and survives stripping): before the ELF symbols.
        let runtime = runtimes.iter().find_map(|r| r.symbols(file, map));
        if let Some(runtime) = &runtime {
            resolvers.push(Box::new(runtime.clone()));
        }
        if !symbols.is_empty() {
            resolvers.push(Box::new(symbols));
        }
        let fde = (runtime.is_none() && file.symbol_table().is_none())
            .then(|| fde::FdeBounds::of(file))
            .filter(|bounds| !bounds.is_empty());
        ElfObject {
            segments,
            build_id,
            resolvers,
            runtime,
            fde,
        }
    }

    /// A runtime's own symbol table of this object (Go's pclntab).
    pub fn runtime_symbols(&self) -> Option<&std::sync::Arc<dyn RuntimeSymbols>> {
        self.runtime.as_ref()
    }

    /// The virtual address that file offset `offset` is loaded at, through
    /// the `PT_LOAD` segment holding it. This is the load-bias step: a
    /// runtime address minus its mapping's start plus the mapping's file
    /// offset gives `offset`, whatever address the loader chose.
    pub fn offset_to_address(&self, offset: u64) -> Option<u64> {
        // Checked: segment fields come from the file and may be anything
        // (found by the elf_object fuzz target).
        self.segments.iter().find_map(|s| {
            let within = offset.checked_sub(s.file_offset)?;
            (within < s.file_size).then(|| s.address.wrapping_add(within))
        })
    }

    /// Frames for an ELF virtual address, from the first resolver that
    /// knows it.
    pub fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        self.resolvers.iter().find_map(|r| r.resolve(address))
    }

    /// Adds a resolver to try before the ELF symbol table (DWARF knows
    /// lines and inline frames; the symbol table only names functions).
    pub fn insert_before_symbols(&mut self, resolver: Box<dyn Resolver>) {
        let at = self
            .resolvers
            .iter()
            .position(|r| r.kind() == ElfSymbols::KIND)
            .unwrap_or(self.resolvers.len());
        self.resolvers.insert(at, resolver);
    }

    /// Adds a resolver to try last.
    pub fn push_resolver(&mut self, resolver: Box<dyn Resolver>) {
        self.resolvers.push(resolver);
    }

    /// For an address no resolver names: the start of its function by
    /// the CFI (stripped objects only), so its samples group under one
    /// `object+0xSTART` name.
    pub fn function_start(&self, address: u64) -> Option<u64> {
        self.fde.as_ref()?.start_of(address)
    }

    /// Whether any resolver can name functions in this object.
    pub fn has_symbols(&self) -> bool {
        !self.resolvers.is_empty()
    }
}

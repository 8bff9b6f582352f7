//! What a resolver answers for one address.

/// One frame of a symbolized address. A physical address may expand into
/// several frames when code was inlined: resolvers return them innermost
/// first, the last one being the function that physically holds the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name.
    pub function: String,
    /// The name as stored in the binary (mangled), when it differs.
    pub system_name: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// True for frames inlined into their caller (every frame but the last).
    pub inlined: bool,
}

impl Frame {
    pub fn named(function: impl Into<String>) -> Self {
        Frame {
            function: function.into(),
            system_name: None,
            file: None,
            line: None,
            inlined: false,
        }
    }
}

/// A source of symbols for one object file: ELF symbol tables, DWARF, Go's
/// pclntab. Resolvers are tried in order; the first that knows an address
/// answers.
pub trait Resolver: Send + Sync {
    /// Short name for diagnostics ("elf-symtab", "go-pclntab", ...).
    fn kind(&self) -> &'static str;

    /// Frames for `address`, an ELF virtual address of the object,
    /// innermost first; `None` when this resolver does not know it.
    fn resolve(&self, address: u64) -> Option<Vec<Frame>>;
}

/// A shared resolver (the object keeps the Go table for its own queries too).
impl<T: Resolver + ?Sized> Resolver for std::sync::Arc<T> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        (**self).resolve(address)
    }
}

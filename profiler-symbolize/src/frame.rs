//! What a resolver answers for one address.

use std::borrow::Cow;

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
    /// Where the name came from (`profiler-agent symbolize` prints it).
    pub source: NameSource,
}

/// Where a frame's name came from. A stripped binary's names can come from
/// several places, and a user deciding whether to install a debug package
/// or point the agent at a debuginfod server needs to know which.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NameSource {
    /// Not named: an address (`libfoo.so+0x1234`).
    #[default]
    None,
    /// The object's `.symtab`.
    Symtab,
    /// The object's `.dynsym` (what a stripped object still exports).
    Dynsym,
    /// DWARF of the object or of its local debug file.
    Dwarf,
    /// A debug file fetched from a debuginfod server (its DWARF or symbols).
    Debuginfod,
    /// The xz-compressed symbol table in `.gnu_debugdata`.
    MiniDebugInfo,
    /// No name anywhere: the start of the function from the FDE covering
    /// the address (`libfoo.so+0xSTART`).
    CfiGrouped,
    /// Go's pclntab.
    GoPclntab,
    /// `/proc/kallsyms`.
    Kallsyms,
    /// A JIT's `/tmp/perf-PID.map`.
    PerfMap,
    /// The vDSO image's own symbols.
    Vdso,
    /// A language runtime's frame, read from the process (a Python code
    /// object, a Java method): the runtime's frame type ("cpython",
    /// "jvm").
    Runtime(&'static str),
}

impl NameSource {
    pub fn as_str(self) -> &'static str {
        match self {
            NameSource::None => "none",
            NameSource::Symtab => "symtab",
            NameSource::Dynsym => "dynsym",
            NameSource::Dwarf => "dwarf",
            NameSource::Debuginfod => "debuginfod",
            NameSource::MiniDebugInfo => "minidebuginfo",
            NameSource::CfiGrouped => "cfi-grouped",
            NameSource::GoPclntab => "go-pclntab",
            NameSource::Kallsyms => "kallsyms",
            NameSource::PerfMap => "perf-map",
            NameSource::Vdso => "vdso",
            NameSource::Runtime(kind) => kind,
        }
    }
}

impl Frame {
    pub fn named(function: impl Into<String>) -> Self {
        Frame {
            function: function.into(),
            system_name: None,
            file: None,
            line: None,
            inlined: false,
            source: NameSource::None,
        }
    }

    /// The same frame, marked as named by `source`.
    pub fn from_source(mut self, source: NameSource) -> Self {
        self.source = source;
        self
    }
}

/// The text of a NUL-padded kernel string (`task->comm`, a string a probe
/// copied): the bytes up to the first NUL, or all of them, decoded
/// lossily.
pub fn nul_padded(bytes: &[u8]) -> Cow<'_, str> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
}

/// `name` with each control character (a newline, a NUL, C1 codes) as
/// `?`. Names read from a process's memory or a JIT's map are the target's
/// to forge: a newline in one would split a line of folded output, of
/// `go tool pprof -raw` or of a terminal, and a NUL is not allowed in the
/// SVG. Borrowed when there is nothing to replace (the usual case).
pub fn printable(name: &str) -> Cow<'_, str> {
    // Printable ASCII, the usual name, without decoding a character.
    if name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Cow::Borrowed(name);
    }
    if name.chars().any(char::is_control) {
        Cow::Owned(
            name.chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect(),
        )
    } else {
        Cow::Borrowed(name)
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

//! Go symbolization through the pclntab, with inline frames.
//!
//! Every Go binary carries `pclntab`, the table the Go runtime itself uses
//! for tracebacks: function entries and names, and per-function pc-value
//! tables for the stack-pointer delta (pcsp), file (pcfile), line (pcln)
//! and which inlined call a PC belongs to (PCDATA 2 with the inline tree
//! in FUNCDATA 3). It survives `-ldflags=-s -w`, unlike DWARF and the ELF
//! symbol table, so it is the primary source for Go code.
//!
//! [`GoSymbols`] finds the table however the binary was linked (see
//! [`PclntabSource`]), validates the function table, and then answers
//! lookups by binary search, decoding records and tables only when asked.
//! It expands a PC into its inline chain innermost first, the same frames
//! Go's `runtime.CallersFrames` reports.
//!
//! The table (and the inline trees) are read in place in the memory-mapped
//! binary ([`GoSymbols::from_mapped`], [`GoSymbols::open`]): a large Go
//! binary's table is tens of megabytes, which then cost page cache rather
//! than heap. The other constructors copy them out of the file.
//!
//! For the stack unwinder it also exposes every function's entry, end,
//! flags and pcsp runs ([`GoSymbols::functions`], [`GoFunction`]).
//!
//! Layouts: Go 1.2–1.15, 1.16–1.17, 1.18–1.19 and 1.20+ ([`TableFormat`]).
//! Facts cite the Go source of the version they come from.

mod buildinfo;
mod error;
mod image;
mod locate;
mod reader;
mod table;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use profiler_symbolize::shared_bytes::SharedBytes;
use profiler_symbolize::{Frame, NameSource, Resolver};

pub use error::GoError;
pub(crate) use locate::go_minor;
pub use locate::{PclntabSource, Strategy};
pub use table::TableFormat;

use image::Image;
use table::{FUNCDATA_INL_TREE, FuncRecord, PCDATA_INL_TREE_INDEX, Table};

/// The Go version `file` was built with ("go1.21.13"), from its build-info
/// blob (kept by stripped binaries too).
pub fn version_of(file: &object::File<'_>) -> Option<String> {
    buildinfo::go_version(file, &Image::new(file))
}

/// Guard against cyclic inline trees in corrupted data; real chains are a
/// handful of frames deep.
const MAX_INLINE_DEPTH: usize = 256;

/// Where the bytes of the file being read live, so the table can keep
/// the ones it needs in place rather than copy them.
#[derive(Clone, Copy)]
pub(crate) enum Backing<'a> {
    /// The file's bytes do not outlive the call: copy.
    Copy,
    Mapped(&'a Arc<memmap2::Mmap>),
}

impl Backing<'_> {
    /// `bytes` (borrowed from the file) as the table keeps them.
    pub(crate) fn share(self, bytes: &[u8]) -> SharedBytes {
        match self {
            Backing::Copy => SharedBytes::copied(bytes),
            Backing::Mapped(map) => SharedBytes::within(map, bytes),
        }
    }
}

/// The symbols of one Go binary. Cheap to query from several threads.
pub struct GoSymbols {
    table: Table,
    source: PclntabSource,
    version: Option<String>,
    build_id: Option<String>,
}

/// `abi.FuncFlag` bits of a function (runtime/abi/symtab.go, Go 1.17+;
/// always empty for older tables).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuncFlag(pub u8);

impl FuncFlag {
    /// The function is the outermost frame of a stack (`runtime.goexit`,
    /// `runtime.mstart`, `runtime.rt0_go`): unwinding stops here.
    pub const TOPFRAME: u8 = 1;
    /// The function writes SP other than by adjusting it by a constant
    /// (stack switches: `gogo`, `mcall`, `systemstack`, `morestack`...):
    /// its pcsp cannot be trusted to find the caller.
    pub const SPWRITE: u8 = 2;
    /// Hand-written assembly.
    pub const ASM: u8 = 4;

    pub fn is_topframe(self) -> bool {
        self.0 & Self::TOPFRAME != 0
    }
    pub fn is_spwrite(self) -> bool {
        self.0 & Self::SPWRITE != 0
    }
    pub fn is_asm(self) -> bool {
        self.0 & Self::ASM != 0
    }
}

/// One run of a function's pcsp table: for PCs in `[pc_start, pc_end)`
/// the stack pointer is `sp_delta` bytes below its value at the entry
/// (not counting the return address the call pushed on amd64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpRun {
    pub pc_start: u64,
    pub pc_end: u64,
    pub sp_delta: i32,
}

/// One function of the table, borrowed from its [`GoSymbols`].
#[derive(Clone, Copy)]
pub struct GoFunction<'a> {
    symbols: &'a GoSymbols,
    record: FuncRecord,
}

impl std::fmt::Debug for GoFunction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoFunction")
            .field("entry", &format_args!("{:#x}", self.entry()))
            .field("end", &format_args!("{:#x}", self.end()))
            .field("name", &self.name())
            .field("func_id", &self.func_id())
            .field("flag", &self.flag())
            .finish()
    }
}

impl<'a> GoFunction<'a> {
    /// Virtual address of the first instruction.
    pub fn entry(&self) -> u64 {
        self.record.entry
    }

    /// Where the function's code ends (the next table entry): its PCs are
    /// `[entry, end)`.
    pub fn end(&self) -> u64 {
        self.record.end
    }

    /// The name as stored (`main.(*T).M`, `pkg.F[go.shape.int]`).
    pub fn name(&self) -> Cow<'a, str> {
        self.symbols.name(self.record.name_off)
    }

    /// `abi.FuncID`: nonzero for special runtime functions. Its numbering
    /// changes between Go versions: match special functions by name.
    pub fn func_id(&self) -> u8 {
        self.record.func_id
    }

    pub fn flag(&self) -> FuncFlag {
        FuncFlag(self.record.flag)
    }

    /// The function's pcsp table as runs in PC order. Empty when the
    /// function has none; stops early at malformed data.
    pub fn pcsp_runs(&self) -> impl Iterator<Item = SpRun> + 'a {
        let end = self.record.end;
        self.symbols
            .table
            .runs(self.record.pcsp, self.record.entry)
            .into_iter()
            .flatten()
            .take_while(move |run| run.start < end)
            .map(|run| SpRun {
                pc_start: run.start,
                pc_end: run.end,
                sp_delta: run.value,
            })
    }

    /// The pcsp value at `pc` (which should be in `[entry, end)`).
    pub fn pcsp(&self, pc: u64) -> Option<i32> {
        self.symbols
            .table
            .pcvalue(self.record.pcsp, self.record.entry, pc)
    }
}

impl GoSymbols {
    /// Reads the Go symbols of the ELF file at `path`, in place in a
    /// memory map of it (read into memory if it cannot be mapped).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GoError> {
        let path = path.as_ref();
        let in_file = |source: GoError| GoError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        let handle = std::fs::File::open(path).map_err(|e| in_file(e.into()))?;
        // SAFETY: a read-only private mapping of a file we only read; if
        // the file is truncated underneath us, reads fault (as for the
        // symbolizer's own maps, see `symbolize::map_file`).
        let Ok(map) = (unsafe { memmap2::Mmap::map(&handle) }) else {
            // Not mappable (a directory, a pipe): `read` says why, or
            // reads it.
            let data = std::fs::read(path).map_err(|e| in_file(e.into()))?;
            return Self::parse(&data).map_err(in_file);
        };
        let map = Arc::new(map);
        let file = object::File::parse(&**map).map_err(|e| in_file(e.into()))?;
        Self::from_mapped(&file, &map).map_err(in_file)
    }

    /// Reads the Go symbols of an ELF file given as bytes (copying what
    /// it keeps).
    pub fn parse(data: &[u8]) -> Result<Self, GoError> {
        Self::from_file(&object::File::parse(data)?)
    }

    /// Reads the Go symbols of a parsed ELF file, looking for the table
    /// everywhere. Copies the table out of the file: for a file that stays
    /// mapped, [`GoSymbols::from_mapped`] reads it in place.
    pub fn from_file(file: &object::File<'_>) -> Result<Self, GoError> {
        Self::from_file_with(file, Strategy::All)
    }

    /// Like [`GoSymbols::from_file`], choosing how to find the table.
    pub fn from_file_with(file: &object::File<'_>, strategy: Strategy) -> Result<Self, GoError> {
        Self::read(file, strategy, Backing::Copy)
    }

    /// Like [`GoSymbols::from_file`] for a file parsed over `map`: the
    /// table and inline trees stay in the map (bytes of `file` that do not
    /// lie in it are copied).
    pub fn from_mapped(file: &object::File<'_>, map: &Arc<memmap2::Mmap>) -> Result<Self, GoError> {
        Self::read(file, Strategy::All, Backing::Mapped(map))
    }

    fn read(
        file: &object::File<'_>,
        strategy: Strategy,
        backing: Backing<'_>,
    ) -> Result<Self, GoError> {
        let image = Image::new(file);
        let (mut table, source) = locate::find_pclntab(file, &image, strategy, backing)?;
        let version = buildinfo::go_version(file, &image);
        let build_id = buildinfo::go_build_id(file);
        if table.format >= TableFormat::Go118 {
            let module = locate::moduledata(file, &image, &table);
            // Not `.text`: externally linked binaries put C code first, and
            // Go 1.26+ writes 0 in the header's textStart.
            let text = locate::symbol_address(file, &["runtime.text"])
                .or(module.text)
                .or(Some(table.header_text_start).filter(|&t| t != 0))
                .ok_or(GoError::NoTextStart {
                    address: table.address,
                })?;
            table.text_start = text;
            let gofunc = locate::gofunc(
                file,
                &image,
                &mut table,
                &module,
                version.as_deref(),
                backing,
            );
            table.gofunc = gofunc;
            if let Some(gofunc) = gofunc
                && !table.covers(gofunc, 1)
                && let Some(region) = image.from(gofunc)
            {
                // Stop at the table if it follows in the same segment (Go
                // 1.18–1.19 put go.func.* in .rodata just before it).
                let len = table
                    .address
                    .checked_sub(gofunc)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n <= region.len())
                    .unwrap_or(region.len());
                table.set_extra(gofunc, backing.share(&region[..len]));
            }
        } else if let Some(segment) = image.segment_of(table.address) {
            // Before 1.18 FUNCDATA holds absolute pointers into go.func.*,
            // in the read-only data before the table.
            let len = (table.address - segment.address) as usize;
            table.set_extra(segment.address, backing.share(&segment.bytes[..len]));
        }
        Ok(GoSymbols {
            table,
            source,
            version,
            build_id,
        })
    }

    /// The Go version that built the binary ("go1.21.13"), when the build
    /// information is readable.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The Go build id (from `.note.go.buildid`), when present.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }

    pub fn format(&self) -> TableFormat {
        self.table.format
    }

    pub fn source(&self) -> PclntabSource {
        self.source
    }

    /// How many bytes of the table and inline trees were copied onto the
    /// heap: 0 when they are read in place in the mapped file.
    pub fn heap_bytes(&self) -> usize {
        self.table.heap_bytes()
    }

    /// Virtual address of the pclntab header.
    pub fn pclntab_address(&self) -> u64 {
        self.table.address
    }

    /// The address function-table offsets count from (Go 1.18+).
    pub fn text_start(&self) -> u64 {
        self.table.text_start
    }

    /// Instruction alignment: 1 on amd64, 4 on arm64.
    pub fn pc_quantum(&self) -> u8 {
        self.table.quantum
    }

    pub fn pointer_size(&self) -> u8 {
        self.table.ptr_size
    }

    /// Whether inline trees can be read (the FUNCDATA base was found).
    pub fn has_inline_info(&self) -> bool {
        self.table.format < TableFormat::Go118 || self.table.gofunc.is_some()
    }

    /// Every function, in address order (holes in the table skipped).
    pub fn functions(&self) -> impl Iterator<Item = GoFunction<'_>> {
        (0..self.table.len()).filter_map(move |i| {
            Some(GoFunction {
                symbols: self,
                record: self.table.func(i)?,
            })
        })
    }

    /// The function whose code holds `pc`.
    pub fn function(&self, pc: u64) -> Option<GoFunction<'_>> {
        let record = self.table.func(self.table.find(pc)?)?;
        Some(GoFunction {
            symbols: self,
            record,
        })
    }

    /// The pcsp value (stack-pointer delta from the entry) at `pc`.
    pub fn pcsp(&self, pc: u64) -> Option<i32> {
        self.function(pc)?.pcsp(pc)
    }

    /// The frames at `pc`, innermost first: the inlined calls the
    /// instruction belongs to, then the function that physically holds it
    /// (the only one with `inlined == false`). Each frame has the file and
    /// line of its position: for the inlined callee the instruction's own,
    /// for each caller the call site. `pc` is looked up as given (callers
    /// pass a return address minus one).
    pub fn frames(&self, pc: u64) -> Option<Vec<Frame>> {
        let function = self.function(pc)?;
        let f = function.record;
        let table = &self.table;
        let tree = table
            .pcdata(&f, PCDATA_INL_TREE_INDEX)
            .and_then(|index_table| Some((index_table, table.funcdata(&f, FUNCDATA_INL_TREE)?)));
        let mut frames = Vec::new();
        let mut at = pc;
        loop {
            let file = table
                .pcvalue(f.pcfile, f.entry, at)
                .and_then(|v| table.file(&f, v))
                .map(|name| String::from_utf8_lossy(name).into_owned());
            let line = table
                .pcvalue(f.pcln, f.entry, at)
                .and_then(|l| u32::try_from(l).ok());
            // runtime/symtabinl.go inlineUnwinder: the inline-tree index at
            // the PC names the innermost inlined call; its parentPc is an
            // instruction in the caller whose position is the call site.
            let call =
                tree.filter(|_| frames.len() < MAX_INLINE_DEPTH)
                    .and_then(|(index_table, tree)| {
                        let index = table.pcvalue(index_table, f.entry, at)?;
                        let call = table.inlined_call(tree, index)?;
                        let parent = f.entry.checked_add(u64::try_from(call.parent_pc).ok()?)?;
                        (parent < f.end).then_some((call, parent))
                    });
            match call {
                Some((call, parent)) => {
                    frames.push(make_frame(self.name(call.name_off), file, line, true));
                    at = parent;
                }
                None => {
                    frames.push(make_frame(function.name(), file, line, false));
                    return Some(frames);
                }
            }
        }
    }

    fn name(&self, name_off: i32) -> Cow<'_, str> {
        match self.table.name(name_off) {
            // A hostile binary's names may hold control characters.
            Some(bytes) => match String::from_utf8_lossy(bytes) {
                Cow::Borrowed(text) => profiler_symbolize::printable(text),
                Cow::Owned(text) => Cow::Owned(profiler_symbolize::printable(&text).into_owned()),
            },
            None => Cow::Borrowed("?"),
        }
    }
}

fn make_frame(name: Cow<'_, str>, file: Option<String>, line: Option<u32>, inlined: bool) -> Frame {
    let printed = name_for_print(&name);
    let system_name = (printed != name).then(|| name.clone().into_owned());
    Frame {
        function: printed.into_owned(),
        system_name,
        file,
        line,
        inlined,
        source: NameSource::GoPclntab,
    }
}

/// Go's `funcNameForPrint` (runtime/symtab.go, Go 1.18+): the type
/// arguments of a generic instantiation, from the first '[' to the last
/// ']', print as "[...]" (`pkg.F[go.shape.int]` → `pkg.F[...]`).
pub fn name_for_print(name: &str) -> Cow<'_, str> {
    let Some(open) = name.find('[') else {
        return Cow::Borrowed(name);
    };
    match name.rfind(']') {
        Some(close) if close > open => {
            Cow::Owned(format!("{}[...]{}", &name[..open], &name[close + 1..]))
        }
        _ => Cow::Borrowed(name),
    }
}

impl Resolver for GoSymbols {
    fn kind(&self) -> &'static str {
        "go-pclntab"
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        self.frames(address)
    }
}

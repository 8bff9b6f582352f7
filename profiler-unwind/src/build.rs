//! One object's unwind table: Go's pcsp rows over its Go code, CFI rows
//! over everything else.

use std::sync::Arc;

use object::Object;

use crate::cfi::{self, Arch, CfiSource, CfiStats};
use crate::table::ObjectTable;

/// What a language runtime adds to an object's table: rows of its own
/// over the range of its code (Go's pcsp over the Go text), which replace
/// the CFI's there. The runtimes live in the profiler-runtimes crate; this
/// crate knows only this trait.
pub trait RuntimeRows: Send + Sync {
    /// Short name for logs ("go").
    fn name(&self) -> &'static str;

    /// Rows for the runtime's code in `file` (read in place in `map` when
    /// the file was memory-mapped), with the ranges of object addresses
    /// they cover; None when the object is not this runtime's. `cfi` is
    /// the object's CFI table, when it has one (a runtime may mark its
    /// rows rather than replace them: CPython's eval loop).
    fn rows(
        &self,
        file: &object::File<'_>,
        map: Option<&Arc<memmap2::Mmap>>,
        cfi: Option<&ObjectTable>,
    ) -> Option<RuntimeTable>;
}

/// A runtime's rows, and the object addresses they cover: each range
/// [start, end) takes the table's rows instead of the CFI's.
#[derive(Debug, Clone)]
pub struct RuntimeTable {
    pub table: ObjectTable,
    pub ranges: Vec<(u64, u64)>,
    /// What the table says it came from (`TableSource::GoPcsp`).
    pub source: TableSource,
    /// Object addresses where a caller's frame record is its unwind (see
    /// `UnwindMapping::frame_record_callers`); empty for most runtimes.
    pub frame_record_callers: Vec<(u64, u64)>,
}

/// The runtimes asked for rows of every object.
pub type Runtimes = &'static [&'static dyn RuntimeRows];

/// Where an object's rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSource {
    EhFrame,
    DebugFrame,
    /// `.debug_frame` of the separate debug file.
    DebugFileFrame,
    GoPcsp,
    /// A runtime's rows over its code, CFI over the rest (cgo binaries).
    GoPcspAndCfi,
    /// CFI, with CPython's eval loop marked (`RULE_FLAG_INTERPRETER`).
    CfiWithInterpreter,
}

/// A built table and what went into it.
#[derive(Debug, Clone)]
pub struct BuiltTable {
    pub table: ObjectTable,
    pub source: TableSource,
    pub cfi: CfiStats,
    /// GNU build id: objects with the same id share one loaded table.
    pub build_id: Option<Vec<u8>>,
    /// The runtime's `RuntimeTable::frame_record_callers`.
    pub frame_record_callers: Vec<(u64, u64)>,
}

/// Why an object has no table (its code walks frame pointers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoTable {
    #[error("unreadable: {0}")]
    Unreadable(String),
    #[error("not an ELF file: {0}")]
    NotElf(String),
    #[error("built for another architecture")]
    OtherArchitecture,
    #[error("no .eh_frame, .debug_frame or Go pclntab")]
    NoUnwindInfo,
    #[error("the unwind-table builder panicked on this file (malformed input)")]
    Panicked,
}

/// Where a separate debug file may be looked for: beside the object, in
/// its process's root.
pub struct DebugSearch<'a> {
    pub object: &'a profiler_symbolize::process::ObjectFile,
}

/// Builds the table of the object in `map` (the file mapped read-only).
/// Malformed input gives `NoTable`, never a panic of the agent.
pub fn build(
    map: &Arc<memmap2::Mmap>,
    debug: Option<DebugSearch<'_>>,
    runtimes: Runtimes,
) -> Result<BuiltTable, NoTable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build_unguarded(map, Some(map), debug, Arch::native(), runtimes)
    }))
    .unwrap_or(Err(NoTable::Panicked))
}

/// Builds the table of an object given as bytes, for its own architecture
/// (tests, tools and the fuzz targets).
pub fn build_bytes(data: &[u8], runtimes: Runtimes) -> Result<BuiltTable, NoTable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let arch = object::File::parse(data)
            .ok()
            .and_then(|f| Arch::of(&f))
            .ok_or(NoTable::OtherArchitecture)?;
        build_unguarded(data, None, None, arch, runtimes)
    }))
    .unwrap_or(Err(NoTable::Panicked))
}

fn build_unguarded(
    data: &[u8],
    map: Option<&Arc<memmap2::Mmap>>,
    debug: Option<DebugSearch<'_>>,
    arch: Arch,
    runtimes: Runtimes,
) -> Result<BuiltTable, NoTable> {
    let file = object::File::parse(data).map_err(|e| NoTable::NotElf(e.to_string()))?;
    if Arch::of(&file) != Some(arch) {
        return Err(NoTable::OtherArchitecture);
    }
    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let mut cfi = cfi::rows_of(&file).map(|(table, stats, source)| {
        let source = match source {
            CfiSource::EhFrame => TableSource::EhFrame,
            CfiSource::DebugFrame => TableSource::DebugFrame,
        };
        (table, stats, source)
    });
    let mut runtime = runtimes
        .iter()
        .find_map(|r| r.rows(&file, map, cfi.as_ref().map(|(table, _, _)| table)));
    if cfi.is_none()
        && runtime.is_none()
        && let Some(search) = debug
    {
        cfi = debug_file_rows(&file, &search);
    }
    let frame_record_callers = runtime
        .as_mut()
        .map(|r| std::mem::take(&mut r.frame_record_callers))
        .unwrap_or_default();
    let (table, source, stats) = match (runtime, cfi) {
        (Some(runtime), Some((cfi, stats, _))) => (
            runtime.ranges.iter().fold(cfi, |table, &(start, end)| {
                table.overlay(&runtime.table, start, end)
            }),
            match runtime.source {
                TableSource::GoPcsp => TableSource::GoPcspAndCfi,
                other => other,
            },
            stats,
        ),
        (Some(runtime), None) => (runtime.table, runtime.source, CfiStats::default()),
        (None, Some((cfi, stats, source))) => (cfi, source, stats),
        (None, None) => return Err(NoTable::NoUnwindInfo),
    };
    if table.is_empty() {
        return Err(NoTable::NoUnwindInfo);
    }
    Ok(BuiltTable {
        table,
        source,
        cfi: stats,
        build_id,
        frame_record_callers,
    })
}

/// `.debug_frame` of the object's separate debug file (by build id or
/// `.gnu_debuglink`), for objects that carry no CFI of their own.
fn debug_file_rows(
    file: &object::File<'_>,
    search: &DebugSearch<'_>,
) -> Option<(ObjectTable, CfiStats, TableSource)> {
    let (_, handle) = profiler_symbolize::dwarf::find_debug_file(file, search.object)?;
    // SAFETY: a read-only private mapping of a file we only read (see
    // symbolize::map_file for the truncation caveat).
    let map = unsafe { memmap2::Mmap::map(&handle) }.ok()?;
    let debug = object::File::parse(&*map).ok()?;
    let (table, stats, _) = cfi::rows_of(&debug)?;
    Some((table, stats, TableSource::DebugFileFrame))
}

/// The vDSO's table, from its in-memory image. Its CFI when it has some,
/// and in any case a signal rule over the arm64 sigreturn trampoline:
/// arm64 kernels since 5.8 build the vDSO without `.eh_frame` (Debian's
/// 6.1 among them), and glibc and Go on arm64 leave `sa_restorer` unset,
/// so every signal handler returns through `__kernel_rt_sigreturn`.
/// Without the rule, a walk out of a handler takes the frame record the
/// kernel left for the interrupted code and loses the interrupted
/// function itself (libgcc and gdb recognize the trampoline by its
/// instructions for the same reason).
pub fn build_vdso(image: &[u8]) -> Result<BuiltTable, NoTable> {
    std::panic::catch_unwind(|| {
        let file = object::File::parse(image).map_err(|e| NoTable::NotElf(e.to_string()))?;
        let trampoline = sigreturn_trampoline(&file);
        let (table, stats) = match (cfi::rows_of(&file), trampoline) {
            (Some((table, stats, _)), Some((start, end))) if stats.signal_fdes == 0 => {
                (table.overlay(&signal_rows(start, end), start, end), stats)
            }
            (Some((table, stats, _)), _) => (table, stats),
            (None, Some((start, end))) => (signal_rows(start, end), CfiStats::default()),
            (None, None) => return Err(NoTable::NoUnwindInfo),
        };
        Ok(BuiltTable {
            table,
            source: TableSource::EhFrame,
            cfi: stats,
            build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
            frame_record_callers: Vec::new(),
        })
    })
    .unwrap_or(Err(NoTable::Panicked))
}

/// `mov x8, #139` (`__NR_rt_sigreturn`); `svc #0`: the arm64 vDSO's
/// `__kernel_rt_sigreturn` (arch/arm64/kernel/vdso/sigreturn.S), the
/// sequence libgcc's aarch64 unwinder matches.
const AARCH64_SIGRETURN: [u32; 2] = [0xd280_1168, 0xd400_0001];

/// [start, end) of an arm64 vDSO's `__kernel_rt_sigreturn`, when the
/// symbol is there and holds the sigreturn instructions. The range starts
/// one byte early: the walker looks a return address up one byte back,
/// and the handler's return address is the trampoline's first instruction
/// (the kernel's own FDE, where there is one, likewise covers the NOP
/// before it). No instruction starts in that byte on arm64. (A sample
/// inside the rt_sigreturn call has its PC after the `svc`; the walker
/// looks a leaf in a system call up one byte back too.)
fn sigreturn_trampoline(file: &object::File<'_>) -> Option<(u64, u64)> {
    use object::{ObjectSection, ObjectSymbol};
    if Arch::of(file) != Some(Arch::Aarch64) {
        return None;
    }
    let symbol = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok("__kernel_rt_sigreturn"))?;
    let address = symbol.address();
    let section = file.section_by_name(".text")?;
    let offset = address.checked_sub(section.address())?;
    let code = section.data().ok()?;
    let start = usize::try_from(offset).ok()?;
    let words = code.get(start..start.checked_add(8)?)?;
    let matches = AARCH64_SIGRETURN
        .iter()
        .zip(words.chunks_exact(4))
        .all(|(&want, bytes)| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) == want);
    (matches && address > 0).then_some((address - 1, address + 8))
}

/// A table of one signal rule over [start, end), frame pointers elsewhere.
fn signal_rows(start: u64, end: u64) -> ObjectTable {
    use profiler_common::unwind::{RULE_SIGNAL, UnwindRule};
    ObjectTable::from_sorted([
        crate::table::TableRow {
            address: start,
            rule: UnwindRule {
                kind: RULE_SIGNAL,
                ..Default::default()
            },
        },
        crate::table::TableRow {
            address: end,
            rule: UnwindRule::default(),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::write::{Object, Symbol, SymbolSection};
    use object::{Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind};
    use profiler_common::unwind::{RULE_FRAME_POINTER, RULE_SIGNAL};

    const NOP: u32 = 0xd503_201f;

    /// An arm64 object with no CFI whose `.text` holds `code`, with
    /// `__kernel_rt_sigreturn` at byte `at`.
    fn vdso_like(code: &[u32], at: u64) -> Vec<u8> {
        let mut object = Object::new(BinaryFormat::Elf, Architecture::Aarch64, Endianness::Little);
        let text = object.section_id(object::write::StandardSection::Text);
        let bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
        object.append_section_data(text, &bytes, 4);
        object.add_symbol(Symbol {
            name: b"__kernel_rt_sigreturn".to_vec(),
            value: at,
            size: 8,
            kind: SymbolKind::Text,
            scope: object::SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        object.write().unwrap()
    }

    #[test]
    fn the_arm64_sigreturn_trampoline_is_a_signal_frame_without_cfi() {
        let code = [
            NOP,
            NOP,
            NOP,
            AARCH64_SIGRETURN[0],
            AARCH64_SIGRETURN[1],
            NOP,
        ];
        let built = build_vdso(&vdso_like(&code, 12)).expect("a table from the trampoline alone");
        let kind = |address| built.table.rule_at(address).map(|r| r.kind);
        // The handler returns to the trampoline's first instruction, looked
        // up one byte back; a sample on either instruction is exact.
        for address in [11, 12, 16, 19] {
            assert_eq!(kind(address), Some(RULE_SIGNAL), "at {address}");
        }
        assert_ne!(kind(10), Some(RULE_SIGNAL));
        assert_eq!(kind(20), Some(RULE_FRAME_POINTER));
    }

    #[test]
    fn other_code_under_the_trampolines_name_is_not_trusted() {
        let code = [NOP, NOP, NOP, NOP];
        assert_eq!(
            build_vdso(&vdso_like(&code, 4)).err(),
            Some(NoTable::NoUnwindInfo)
        );
    }
}

//! One object's unwind table: Go's pcsp rows over its Go code, CFI rows
//! over everything else.

use std::sync::Arc;

use object::Object;

use crate::cfi::{self, Arch, CfiSource, CfiStats};
use crate::table::ObjectTable;

/// Where an object's rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSource {
    EhFrame,
    DebugFrame,
    /// `.debug_frame` of the separate debug file.
    DebugFileFrame,
    GoPcsp,
    /// Go's pcsp over the Go text, CFI over the rest (cgo binaries).
    GoPcspAndCfi,
}

/// A built table and what went into it.
#[derive(Debug, Clone)]
pub struct BuiltTable {
    pub table: ObjectTable,
    pub source: TableSource,
    pub cfi: CfiStats,
    /// GNU build id: objects with the same id share one loaded table.
    pub build_id: Option<Vec<u8>>,
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
) -> Result<BuiltTable, NoTable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build_unguarded(map, Some(map), debug, Arch::native())
    }))
    .unwrap_or(Err(NoTable::Panicked))
}

/// Builds the table of an object given as bytes, for its own architecture
/// (tests, tools and the fuzz targets).
pub fn build_bytes(data: &[u8]) -> Result<BuiltTable, NoTable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let arch = object::File::parse(data)
            .ok()
            .and_then(|f| Arch::of(&f))
            .ok_or(NoTable::OtherArchitecture)?;
        build_unguarded(data, None, None, arch)
    }))
    .unwrap_or(Err(NoTable::Panicked))
}

fn build_unguarded(
    data: &[u8],
    map: Option<&Arc<memmap2::Mmap>>,
    debug: Option<DebugSearch<'_>>,
    arch: Arch,
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
    let go = profiler_symbolize::elf::looks_like_go(&file)
        .then(|| match map {
            Some(map) => profiler_symbolize::go::GoSymbols::from_mapped(&file, map).ok(),
            None => profiler_symbolize::go::GoSymbols::from_file(&file).ok(),
        })
        .flatten()
        .and_then(|symbols| crate::go::rows_for(&symbols));
    if cfi.is_none()
        && go.is_none()
        && let Some(search) = debug
    {
        cfi = debug_file_rows(&file, &search);
    }
    let (table, source, stats) = match (go, cfi) {
        (Some((go, start, end)), Some((cfi, stats, _))) => (
            cfi.overlay(&go, start, end),
            TableSource::GoPcspAndCfi,
            stats,
        ),
        (Some((go, _, _)), None) => (go, TableSource::GoPcsp, CfiStats::default()),
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

/// The vDSO's table, from its in-memory image.
pub fn build_vdso(image: &[u8]) -> Result<BuiltTable, NoTable> {
    std::panic::catch_unwind(|| {
        let file = object::File::parse(image).map_err(|e| NoTable::NotElf(e.to_string()))?;
        let (table, stats, _) = cfi::rows_of(&file).ok_or(NoTable::NoUnwindInfo)?;
        Ok(BuiltTable {
            table,
            source: TableSource::EhFrame,
            cfi: stats,
            build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        })
    })
    .unwrap_or(Err(NoTable::Panicked))
}

//! Finding the pclntab, the text start and the FUNCDATA base in an ELF
//! file, however it was linked and stripped.

use object::{Object, ObjectSection, ObjectSymbol};

use super::Backing;
use super::error::GoError;
use super::image::Image;
use super::table::{FUNCDATA_INL_TREE, PCDATA_INL_TREE_INDEX, Table, TableFormat, header_endian};

/// Where the pclntab was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PclntabSource {
    /// `.gopclntab` (internally or externally linked executables).
    Section,
    /// `.data.rel.ro.gopclntab` (Go-linked PIE of some versions).
    RelroSection,
    /// The `runtime.pclntab` symbol.
    Symbol,
    /// A validated scan of the non-executable segments (no section
    /// headers or symbols name it).
    Scan,
}

/// How hard to look: everything, or only the scan (tests use it to check
/// the scan on real binaries that also have sections).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    All,
    ScanOnly,
}

/// The table's bytes (from its header to the end of its segment's file
/// data, or of its section) and address.
pub(crate) struct Found<'data> {
    pub address: u64,
    pub bytes: &'data [u8],
    pub source: PclntabSource,
}

/// Looks for the pclntab in the order of GO.md: sections, symbol, scan.
/// The table keeps its bytes as `backing` shares them.
pub(crate) fn find_pclntab<'data>(
    file: &object::File<'data>,
    image: &Image<'data>,
    strategy: Strategy,
    backing: Backing<'_>,
) -> Result<(Table, PclntabSource), GoError> {
    let mut first_error = None;
    let mut try_candidate =
        |found: Found<'data>| match Table::parse(backing.share(found.bytes), found.address) {
            Ok(table) => Some((table, found.source)),
            Err(e) => {
                first_error.get_or_insert(e);
                None
            }
        };
    if strategy == Strategy::All {
        for (name, source) in [
            (".gopclntab", PclntabSource::Section),
            (".data.rel.ro.gopclntab", PclntabSource::RelroSection),
        ] {
            if let Some(section) = file.section_by_name(name)
                && let Ok(bytes) = section.data()
                && !bytes.is_empty()
                && let Some(found) = try_candidate(Found {
                    address: section.address(),
                    bytes,
                    source,
                })
            {
                return Ok(found);
            }
        }
        if let Some(address) = symbol_address(file, &["runtime.pclntab"])
            && let Some(bytes) = image.from(address)
        {
            let end = symbol_address(file, &["runtime.epclntab"])
                .and_then(|end| end.checked_sub(address))
                .and_then(|len| usize::try_from(len).ok())
                .filter(|&len| len > 0 && len <= bytes.len())
                .unwrap_or(bytes.len());
            if let Some(found) = try_candidate(Found {
                address,
                bytes: &bytes[..end],
                source: PclntabSource::Symbol,
            }) {
                return Ok(found);
            }
        }
    }
    for segment in image.data_segments() {
        let start = (segment.address.wrapping_neg() & 7) as usize;
        for at in (start..segment.bytes.len().saturating_sub(8)).step_by(8) {
            if header_endian(&segment.bytes[at..]).is_none() {
                continue;
            }
            if let Some(found) = try_candidate(Found {
                address: segment.address + at as u64,
                bytes: &segment.bytes[at..],
                source: PclntabSource::Scan,
            }) {
                return Ok(found);
            }
        }
    }
    Err(first_error.unwrap_or(GoError::NotFound))
}

pub(crate) fn symbol_address(file: &object::File<'_>, names: &[&str]) -> Option<u64> {
    file.symbols()
        .find(|s| s.name().is_ok_and(|n| names.contains(&n)) && s.address() != 0)
        .map(|s| s.address())
}

/// The pointer-sized words of `runtime.firstmoduledata` this resolver uses
/// (runtime/symtab.go moduledata). `pcHeader` is word 0 and the
/// `funcnametab` slice starts at word 1 in every version since 1.16;
/// `text` is word 22 since 1.18.
const MODULEDATA_TEXT: usize = 22;
/// Word index of `gofunc`: 38 in Go 1.18–1.19 (no covctrs), 40 in 1.20–1.26
/// (covctrs, ecovctrs added), 43 in 1.27 (typedesclen, itaboffset,
/// itabsize added). Candidates are validated against the inline trees.
const MODULEDATA_GOFUNC: [usize; 3] = [38, 40, 43];

/// What the module data says: the text start and the FUNCDATA base.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ModuleData {
    pub text: Option<u64>,
    pub gofunc_candidates: [Option<u64>; 3],
}

/// Finds `runtime.firstmoduledata` (by symbol, or by scanning the data
/// segments for a word holding the pclntab's address followed by the
/// address of its name table) and reads its `text` and `gofunc` fields.
/// The words are stored already relocated in the file for PIE too (both
/// Go's linker and GNU ld write the value in place).
pub(crate) fn moduledata(file: &object::File<'_>, image: &Image<'_>, table: &Table) -> ModuleData {
    if table.format < TableFormat::Go118 {
        return ModuleData::default();
    }
    let ptr = usize::from(table.ptr_size);
    let endian = table.endian();
    let names = table.address.wrapping_add(table.names_offset() as u64);
    let matches = |words: &[u8]| {
        endian.word(words, 0, table.ptr_size) == Some(table.address)
            && endian.word(words, ptr, table.ptr_size) == Some(names)
    };
    let words_needed = (MODULEDATA_GOFUNC[2] + 1) * ptr;
    let at_symbol = symbol_address(file, &["runtime.firstmoduledata"])
        .and_then(|a| image.read(a, words_needed))
        .filter(|w| matches(w));
    let found = at_symbol.or_else(|| {
        image.data_segments().find_map(|segment| {
            let start = (segment.address.wrapping_neg() % ptr as u64) as usize;
            (start..segment.bytes.len().saturating_sub(words_needed))
                .step_by(ptr)
                .map(|at| &segment.bytes[at..at + words_needed])
                .find(|w| matches(w))
        })
    });
    let Some(words) = found else {
        return ModuleData::default();
    };
    let word = |i: usize| {
        endian
            .word(words, i * ptr, table.ptr_size)
            .filter(|&w| w != 0)
    };
    ModuleData {
        text: word(MODULEDATA_TEXT),
        gofunc_candidates: MODULEDATA_GOFUNC.map(word),
    }
}

/// The minor version of a "go1.N[.P]" string.
pub(crate) fn go_minor(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The FUNCDATA base: the `go:func.*` (1.20+) / `go.func.*` (1.18–1.19)
/// symbol, else the moduledata candidate that makes the inline trees read
/// sensibly, preferring the field position of the binary's Go version.
pub(crate) fn gofunc(
    file: &object::File<'_>,
    image: &Image<'_>,
    table: &mut Table,
    module: &ModuleData,
    version: Option<&str>,
    backing: Backing<'_>,
) -> Option<u64> {
    if table.format < TableFormat::Go118 {
        return None;
    }
    if let Some(address) = symbol_address(file, &["go:func.*", "go.func.*"]) {
        return Some(address);
    }
    let preferred = match version.and_then(go_minor) {
        Some(0..=19) => 0,
        Some(20..=26) => 1,
        Some(_) => 2,
        None => 1,
    };
    let order = [preferred, 0, 1, 2];
    order
        .into_iter()
        .filter_map(|i| module.gofunc_candidates[i])
        .find(|&candidate| inline_trees_plausible(image, table, candidate, backing))
}

/// With `gofunc` as the FUNCDATA base, do the first inline trees found
/// point at records whose names and parent PCs make sense?
fn inline_trees_plausible(
    image: &Image<'_>,
    table: &mut Table,
    gofunc: u64,
    backing: Backing<'_>,
) -> bool {
    let Some(region) = image.from(gofunc) else {
        return false;
    };
    let saved = (table.gofunc, table.take_extra());
    table.gofunc = Some(gofunc);
    table.set_extra(
        gofunc,
        backing.share(region.get(..region.len().min(1 << 20)).unwrap_or(region)),
    );
    let mut checked = 0;
    let mut good = true;
    for i in 0..table.len() {
        if checked >= 20 {
            break;
        }
        let Some(f) = table.func(i) else { continue };
        if table.pcdata(&f, PCDATA_INL_TREE_INDEX).is_none() {
            continue;
        }
        let Some(tree) = table.funcdata(&f, FUNCDATA_INL_TREE) else {
            continue;
        };
        checked += 1;
        let size = f.end.saturating_sub(f.entry);
        let ok = table.inlined_call(tree, 0).is_some_and(|call| {
            u64::try_from(call.parent_pc).is_ok_and(|pc| pc < size)
                && table
                    .name(call.name_off)
                    .is_some_and(|n| !n.is_empty() && n.iter().all(|b| b.is_ascii_graphic()))
        });
        if !ok {
            good = false;
            break;
        }
    }
    table.gofunc = saved.0;
    table.restore_extra(saved.1);
    good && checked > 0
}

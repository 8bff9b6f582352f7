//! Where a Go binary's runtime keeps the running goroutine and its pprof
//! labels: field offsets in `runtime.g` and `runtime.m`, how runtime/pprof
//! stores a label set, and g's thread-local slot.
//!
//! Offsets come from the binary's own DWARF when it has some (exact for
//! any version), else from `versions` by the Go version in its build info
//! (stripped binaries keep that). The DWARF of a binary is untrusted input
//! like the rest of it: sizes are bounded and parse errors are answers.

use std::borrow::Cow;

use object::{Object, ObjectSection, ObjectSymbol};
use profiler_common::runtimes::go::{GO_LABELS_MAP, GO_LABELS_SLICE, GO_PROCESS_TLS, GoProcess};

use super::versions;

/// Largest DWARF section inflated to read the runtime's types (Go's
/// `.debug_info` is a few MiB for most services, tens for the largest).
const MAX_DWARF_SECTION_BYTES: u64 = 256 << 20;

/// Field offsets of the runtime structures the BPF program reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    pub g_m: u16,
    pub g_goid: u16,
    pub g_labels: u16,
    pub m_curg: u16,
}

/// How runtime/pprof keeps a goroutine's label set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelStorage {
    /// `*labelMap`, a `map[string]string` (Go 1.19 to 1.23).
    Map,
    /// `labelMap{LabelSet{list []label}}`, sorted by key (Go 1.24 on).
    Slice,
}

/// Where the offsets came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutSource {
    Dwarf,
    VersionTable,
}

/// What the sampling program needs to read one Go binary's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeLayout {
    /// "go1.21.13", from the build info.
    pub version: Option<String>,
    pub offsets: Offsets,
    pub storage: LabelStorage,
    pub source: LayoutSource,
    /// Offset of the current g from the thread pointer (amd64 only).
    pub tls_g_offset: Option<i64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("not an ELF file this agent reads: {0}")]
    NotElf(String),
    #[error("not a Go binary")]
    NotGo,
    #[error(
        "Go version {} has no known runtime layout and the binary has no DWARF to read it from \
         (labels are read for Go 1.19 to 1.27, or any version built with debug info)",
        .0.as_deref().unwrap_or("unknown")
    )]
    UnknownVersion(Option<String>),
}

impl RuntimeLayout {
    /// What the BPF program is given for a process running this binary.
    pub fn for_bpf(&self) -> GoProcess {
        GoProcess {
            tls_g_offset: self.tls_g_offset.unwrap_or(0),
            g_m: self.offsets.g_m,
            g_goid: self.offsets.g_goid,
            g_labels: self.offsets.g_labels,
            m_curg: self.offsets.m_curg,
            kind: match self.storage {
                LabelStorage::Map => GO_LABELS_MAP,
                LabelStorage::Slice => GO_LABELS_SLICE,
            },
            flags: if self.tls_g_offset.is_some() {
                GO_PROCESS_TLS
            } else {
                0
            },
            _pad: [0; 6],
            // Per process, where it loaded the binary (the registry).
            strings_start: 0,
            strings_end: 0,
        }
    }
}

/// Reads the layout of the Go binary whose bytes are `data`.
pub fn read_layout(data: &[u8]) -> Result<RuntimeLayout, LayoutError> {
    profiler_symbolize::elf::guard(|| Ok(read_layout_unguarded(data)))
        .map_err(|e| LayoutError::NotElf(e.to_string()))?
}

fn read_layout_unguarded(data: &[u8]) -> Result<RuntimeLayout, LayoutError> {
    let file = object::File::parse(data).map_err(|e| LayoutError::NotElf(e.to_string()))?;
    if !super::super::looks_like_go(&file) {
        return Err(LayoutError::NotGo);
    }
    let version = super::super::pclntab::version_of(&file);
    let minor = version.as_deref().and_then(minor_of);
    let from_dwarf = dwarf_layout(&file);
    let (offsets, source, dwarf_storage) = match from_dwarf {
        Some(found) => (found.offsets, LayoutSource::Dwarf, found.storage),
        None => {
            let offsets = minor
                .and_then(versions::offsets)
                .ok_or_else(|| LayoutError::UnknownVersion(version.clone()))?;
            (offsets, LayoutSource::VersionTable, None)
        }
    };
    let storage = dwarf_storage.unwrap_or(match minor {
        Some(minor) if minor <= 23 => LabelStorage::Map,
        _ => LabelStorage::Slice,
    });
    Ok(RuntimeLayout {
        version,
        offsets,
        storage,
        source,
        tls_g_offset: tls_g_offset(&file),
    })
}

/// 21 of "go1.21.13" (also "go1.21", "go1.24rc1").
pub(super) fn minor_of(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Offset of the current g from the FS base in an amd64 Go binary. The
/// runtime's only thread-local variable is `runtime.tlsg`; the
/// executable's TLS block ends at the thread pointer (x86-64 "variant
/// II"), so g is at tlsg's offset in the block minus the block's aligned
/// size. Go's own linker puts it at -8; an external linker (cgo) lays out
/// the block, with C's thread locals beside it.
fn tls_g_offset(file: &object::File<'_>) -> Option<i64> {
    let object::File::Elf64(elf) = file else {
        return None;
    };
    if file.architecture() != object::Architecture::X86_64 {
        return None;
    }
    let endian = elf.endian();
    use object::read::elf::ProgramHeader;
    let tls = elf
        .elf_program_headers()
        .iter()
        .find(|p| p.p_type(endian) == object::elf::PT_TLS);
    let Some(tls) = tls else {
        return Some(-8);
    };
    let align = tls.p_align(endian).max(1);
    let size = tls.p_memsz(endian).checked_next_multiple_of(align)?;
    let tlsg = file
        .symbols()
        .find(|s| s.name() == Ok("runtime.tlsg"))
        .map(|s| s.address());
    match tlsg {
        Some(offset) if offset < size => Some(offset as i64 - size as i64),
        Some(_) => None,
        // Stripped: a block of one pointer is Go's alone.
        None if size == 8 => Some(-8),
        None => None,
    }
}

struct DwarfLayout {
    offsets: Offsets,
    storage: Option<LabelStorage>,
}

/// Offsets from the binary's DWARF: the members of `runtime.g` and
/// `runtime.m`, and whether `runtime/pprof.labelMap` is a struct.
fn dwarf_layout(file: &object::File<'_>) -> Option<DwarfLayout> {
    let load = |id: gimli::SectionId| -> Result<Cow<'_, [u8]>, gimli::Error> {
        let Some(section) = file.section_by_name(id.name()) else {
            return Ok(Cow::Borrowed(&[][..]));
        };
        if section.size() > MAX_DWARF_SECTION_BYTES {
            return Err(gimli::Error::Io);
        }
        if let Ok(compressed) = section.compressed_data()
            && compressed.uncompressed_size > MAX_DWARF_SECTION_BYTES
        {
            return Err(gimli::Error::Io);
        }
        section.uncompressed_data().map_err(|_| gimli::Error::Io)
    };
    // Only the sections a type's name and members need.
    let sections = gimli::DwarfSections::load(|id| match id {
        gimli::SectionId::DebugInfo
        | gimli::SectionId::DebugAbbrev
        | gimli::SectionId::DebugStr => load(id),
        _ => Ok(Cow::Borrowed(&[][..])),
    })
    .ok()?;
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let mut found = Found::default();
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        if scan_unit(&dwarf, &header, &mut found).is_err() {
            continue;
        }
        if found.complete() {
            break;
        }
    }
    Some(DwarfLayout {
        offsets: Offsets {
            g_m: found.g_m?,
            g_goid: found.g_goid?,
            g_labels: found.g_labels?,
            m_curg: found.m_curg?,
        },
        storage: found.storage,
    })
}

#[derive(Default)]
struct Found {
    g_m: Option<u16>,
    g_goid: Option<u16>,
    g_labels: Option<u16>,
    m_curg: Option<u16>,
    storage: Option<LabelStorage>,
}

impl Found {
    fn complete(&self) -> bool {
        self.g_m.is_some()
            && self.g_goid.is_some()
            && self.g_labels.is_some()
            && self.m_curg.is_some()
            && self.storage.is_some()
    }
}

type Reader<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// Go's types are children of the compile unit: only the top level is
/// looked at. The unit is read from its header alone (a whole `Unit` would
/// parse its line program too, which names are not in).
fn scan_unit(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    header: &gimli::UnitHeader<Reader<'_>>,
    found: &mut Found,
) -> gimli::Result<()> {
    let abbreviations = dwarf.abbreviations(header)?;
    let mut tree = header.entries_tree(&abbreviations, None)?;
    let root = tree.root()?;
    let mut children = root.children();
    while let Some(child) = children.next()? {
        let entry = child.entry();
        let tag = entry.tag();
        if tag != gimli::DW_TAG_structure_type && tag != gimli::DW_TAG_typedef {
            continue;
        }
        let Some(name) = entry.attr_value(gimli::DW_AT_name)? else {
            continue;
        };
        let Some(name) = string(dwarf, name) else {
            continue;
        };
        match (tag, name) {
            (gimli::DW_TAG_structure_type, b"runtime.g") if found.g_m.is_none() => {
                let members = members(dwarf, child)?;
                found.g_m = member(&members, "m");
                found.g_goid = member(&members, "goid");
                found.g_labels = member(&members, "labels");
            }
            (gimli::DW_TAG_structure_type, b"runtime.m") if found.m_curg.is_none() => {
                let members = members(dwarf, child)?;
                found.m_curg = member(&members, "curg");
            }
            // Go names a struct type twice (the struct, and a typedef of
            // it); a map type only by a typedef.
            (gimli::DW_TAG_structure_type, b"runtime/pprof.labelMap") => {
                found.storage = Some(LabelStorage::Slice);
            }
            (gimli::DW_TAG_typedef, b"runtime/pprof.labelMap") if found.storage.is_none() => {
                found.storage = Some(LabelStorage::Map);
            }
            _ => {}
        }
    }
    Ok(())
}

/// A name: inline (how Go writes them) or in `.debug_str`.
fn string<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    value: gimli::AttributeValue<Reader<'a>>,
) -> Option<&'a [u8]> {
    match value {
        gimli::AttributeValue::String(s) => Some(s.slice()),
        gimli::AttributeValue::DebugStrRef(offset) => {
            dwarf.debug_str.get_str(offset).ok().map(|s| s.slice())
        }
        _ => None,
    }
}

fn member(members: &[(String, u64)], name: &str) -> Option<u16> {
    members
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, offset)| u16::try_from(*offset).ok())
}

/// (name, byte offset) of a structure's members.
fn members(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    node: gimli::EntriesTreeNode<'_, '_, '_, Reader<'_>>,
) -> gimli::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut children = node.children();
    while let Some(child) = children.next()? {
        let entry = child.entry();
        if entry.tag() != gimli::DW_TAG_member {
            continue;
        }
        let (Some(name), Some(location)) = (
            entry.attr_value(gimli::DW_AT_name)?,
            entry.attr_value(gimli::DW_AT_data_member_location)?,
        ) else {
            continue;
        };
        let Some(offset) = location.udata_value() else {
            continue;
        };
        let Some(name) = string(dwarf, name) else {
            continue;
        };
        out.push((String::from_utf8_lossy(name).into_owned(), offset));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_versions_are_read() {
        assert_eq!(minor_of("go1.21.13"), Some(21));
        assert_eq!(minor_of("go1.24rc1"), Some(24));
        assert_eq!(minor_of("go1.19"), Some(19));
        assert_eq!(minor_of("devel go1.25-abc"), None);
    }

    #[test]
    fn a_file_that_is_not_go_is_refused() {
        let own = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(read_layout(&own), Err(LayoutError::NotGo));
        assert!(matches!(
            read_layout(b"\x7fELF garbage"),
            Err(LayoutError::NotElf(_))
        ));
    }
}

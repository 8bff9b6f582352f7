//! DWARF: function, file and line with inline frames, for C, C++ and Rust
//! (and Go when the pclntab resolver does not claim an address), through
//! gimli/addr2line. Debug info may sit in the binary itself (compressed
//! sections included) or in a separate file found by build id or
//! `.gnu_debuglink` (see `debug_file`).

mod debug_file;
mod sections;

pub use debug_file::find_debug_file;

use std::sync::{Arc, Mutex};

use addr2line::LookupResult;
use object::{Object, ObjectSection};

use self::sections::{SectionData, SectionReader};
use super::demangle::demangle;
use super::frame::{Frame, Resolver};

/// A lazily indexed DWARF context over one file's debug sections.
pub struct DwarfSymbols {
    // addr2line's context fills its caches through interior mutability
    // (not Sync); a lookup holds the lock for microseconds.
    context: Mutex<addr2line::Context<SectionReader>>,
}

impl DwarfSymbols {
    /// Debug info of `file` (whose bytes are `data`), if it has any:
    /// `.debug_info` with at least one unit.
    pub fn from_object(file: &object::File<'_>, data: &Arc<memmap2::Mmap>) -> Option<Self> {
        let info = file.section_by_name(".debug_info")?;
        if info.size() == 0 {
            return None;
        }
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let load = |id: gimli::SectionId| -> Result<SectionReader, gimli::Error> {
            // Location lists describe variables, never code addresses: not
            // inflating them saves megabytes per large debug file.
            if matches!(id, gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists) {
                return Ok(SectionReader::new(SectionData::empty(), endian));
            }
            let data = match file.section_by_name(id.name()) {
                Some(section) => SectionData::of(section, data),
                None => SectionData::empty(),
            };
            Ok(SectionReader::new(data, endian))
        };
        let dwarf = gimli::Dwarf::load(load).ok()?;
        let context = addr2line::Context::from_dwarf(dwarf).ok()?;
        Some(DwarfSymbols {
            context: Mutex::new(context),
        })
    }
}

impl Resolver for DwarfSymbols {
    fn kind(&self) -> &'static str {
        "dwarf"
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        let context = self.context.lock().ok()?;
        let mut iter = match context.find_frames(address) {
            LookupResult::Output(result) => result.ok()?,
            // Split DWARF (.dwo) is not loaded: what the skeleton unit
            // knows is used instead.
            LookupResult::Load { .. } => context.find_frames(address).skip_all_loads().ok()?,
        };
        let mut frames = Vec::new();
        while let Ok(Some(frame)) = iter.next() {
            let Some(function) = frame.function.as_ref() else {
                continue;
            };
            let raw = function.raw_name().ok()?;
            let name = demangle(&raw);
            let location = frame.location.as_ref();
            frames.push(Frame {
                system_name: (name != raw).then(|| raw.to_string()),
                function: name,
                file: location.and_then(|l| l.file).map(str::to_string),
                line: location.and_then(|l| l.line),
                inlined: true,
            });
        }
        // Without a function DIE (assembly, stripped DIEs) let the symbol
        // table name it.
        let last = frames.last_mut()?;
        last.inlined = false;
        Some(frames)
    }
}

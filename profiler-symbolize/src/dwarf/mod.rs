//! DWARF: function, file and line with inline frames, for C, C++ and Rust
//! (and Go when the pclntab resolver does not claim an address), through
//! gimli. Debug info may sit in the binary itself (compressed sections
//! included) or in a separate file found by build id or `.gnu_debuglink`
//! (see `debug_file`).
//!
//! Memory stays bounded whatever the number of compilation units: loading
//! builds only an address index (`units`: ranges from `.debug_aranges`,
//! or from a unit's root DIE read once and dropped, plus unit offsets);
//! a lookup parses the unit holding the address — its functions, line
//! table and the inline tree of the function hit — into a small LRU of
//! parsed units (`cache`). Answers are addr2line's (`Context::find_frames`):
//! the same unit order, function and inline range searches, names and
//! file paths.

mod cache;
mod debug_file;
mod functions;
mod lines;
mod names;
mod sections;
mod units;

pub use debug_file::{find_by_build_id, find_debug_file};

use std::sync::Arc;

use gimli::Reader as _;
use object::{Object, ObjectSection};

use self::cache::{ParsedUnit, UnitCache};
use self::lines::Location;
use self::sections::SectionReader;
use self::units::{Dwarf, UnitIndex};
use super::demangle::demangle;
use super::frame::{Frame, NameSource, Resolver};
use crate::shared_bytes::SharedBytes;

/// Parsed units kept per file: a hot set of functions usually spans a few
/// units; beyond these counts the least recently used unit is dropped.
const CACHED_UNITS: usize = 32;
/// Estimated heap the cached units of one file may hold (the most recently
/// used unit stays whatever its size).
const CACHE_BUDGET: usize = 4 << 20;

/// One file's DWARF, indexed by address, its units parsed on demand.
pub struct DwarfSymbols {
    dwarf: Dwarf,
    index: UnitIndex,
    cache: UnitCache,
    /// `Dwarf`, or `Debuginfod` for a fetched debug file.
    source: NameSource,
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
            if matches!(
                id,
                gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists
            ) {
                return Ok(SectionReader::new(SharedBytes::empty(), endian));
            }
            let data = match file.section_by_name(id.name()) {
                Some(section) => SharedBytes::of(section, data),
                None => SharedBytes::empty(),
            };
            Ok(SectionReader::new(data, endian))
        };
        let dwarf = gimli::Dwarf::load(load).ok()?;
        Some(Self::from_dwarf(dwarf))
    }

    fn from_dwarf(dwarf: Dwarf) -> Self {
        Self::with_cache(dwarf, CACHED_UNITS, CACHE_BUDGET)
    }

    fn with_cache(dwarf: Dwarf, units: usize, budget: usize) -> Self {
        let index = UnitIndex::build(&dwarf);
        tracing::debug!(
            units = index.unit_count(),
            index_bytes = index.heap_bytes(),
            "DWARF address index built"
        );
        DwarfSymbols {
            dwarf,
            index,
            cache: UnitCache::new(units, budget),
            source: NameSource::Dwarf,
        }
    }

    /// The same DWARF, its names marked as coming from `source`.
    pub fn from_source(mut self, source: NameSource) -> Self {
        self.source = source;
        self
    }

    /// The parsed unit at `index` of the unit index.
    fn unit(&self, index: usize) -> gimli::Result<Arc<ParsedUnit>> {
        let offset = self
            .index
            .unit_offset(index)
            .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
        self.cache
            .get_or_parse(index, || ParsedUnit::parse(&self.dwarf, index, offset))
    }

    /// The unit holding the DIE at `offset` of `.debug_info`, and the
    /// DIE's offset in it (for `DW_FORM_ref_addr`).
    fn unit_at(
        &self,
        offset: gimli::DebugInfoOffset<usize>,
    ) -> gimli::Result<(Arc<ParsedUnit>, gimli::UnitOffset<usize>)> {
        let index = self
            .index
            .unit_containing(offset.0)
            .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
        let unit = self.unit(index)?;
        let offset = offset
            .to_unit_offset(unit.header())
            .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
        Ok((unit, offset))
    }

    /// Frames for `probe`, innermost first, as addr2line's `find_frames`
    /// gives them: `None` for an error, for an address without a function
    /// DIE, or when no frame has a name.
    fn frames(&self, probe: u64) -> Option<Vec<Frame>> {
        for index in self.index.candidates(probe) {
            // A unit that cannot be parsed is not there (as in addr2line,
            // which leaves such units out).
            let Ok(unit) = self.unit(index) else {
                continue;
            };
            let function = unit.functions(&self.dwarf).ok()?.find(probe);
            let tree = match function {
                Some(die) => Some(unit.inline_tree(&self.dwarf, die).ok()?),
                None => None,
            };
            let lines = unit.lines(&self.dwarf).ok()?;
            let location = lines.and_then(|l| l.find_location(probe));
            match (function, tree) {
                (Some(die), Some(tree)) => {
                    return self.chain(&unit, die, &tree.find(probe), lines, location);
                }
                // Only a line: no function to name it (the symbol table
                // will).
                _ if location.is_some() => return None,
                _ => continue,
            }
        }
        None
    }

    /// The frames of the subprogram `function` with the inlined
    /// subroutines `inlined` (outermost first) holding the address at
    /// `location`. Each inlined frame's caller is located at its call site.
    fn chain(
        &self,
        unit: &Arc<ParsedUnit>,
        function: gimli::UnitOffset<usize>,
        inlined: &[functions::Inlined],
        lines: Option<&lines::Lines>,
        location: Option<Location<'_>>,
    ) -> Option<Vec<Frame>> {
        let mut frames = Vec::with_capacity(inlined.len() + 1);
        let mut location = location;
        for call in inlined.iter().rev() {
            let here = location.take();
            location = Some(Location {
                file: call.call_file.and_then(|f| lines.and_then(|l| l.file(f))),
                line: (call.call_line != 0).then_some(call.call_line),
            });
            let name = names::function_name(self, unit, call.die).ok()?;
            push_frame(&mut frames, name, here)?;
        }
        let name = names::function_name(self, unit, function).ok()?;
        push_frame(&mut frames, name, location)?;
        // Without any named function DIE (assembly, stripped DIEs) let the
        // symbol table name it.
        let last = frames.last_mut()?;
        last.inlined = false;
        Some(frames)
    }
}

/// Appends the frame of a function named `name` (skipped when it has no
/// name, as addr2line's unnamed frames were).
fn push_frame(
    frames: &mut Vec<Frame>,
    name: Option<SectionReader>,
    location: Option<Location<'_>>,
) -> Option<()> {
    let Some(name) = name else {
        return Some(());
    };
    let raw = name.to_string_lossy().ok()?;
    let function = demangle(&raw);
    frames.push(Frame {
        system_name: (function != raw).then(|| raw.to_string()),
        function,
        file: location.and_then(|l| l.file).map(str::to_string),
        line: location.and_then(|l| l.line),
        inlined: true,
        source: NameSource::Dwarf,
    });
    Some(())
}

/// An object's own DWARF, read when an address first needs it. For
/// objects whose runtime's own tables name their code (a Go binary's
/// pclntab), the DWARF serves only code outside them (cgo's C), and
/// reading it up front (inflating compressed sections: megabytes for a
/// large Go service) cost more than naming every address.
pub struct LazyDwarf {
    data: Arc<memmap2::Mmap>,
    loaded: std::sync::OnceLock<Option<DwarfSymbols>>,
}

impl LazyDwarf {
    /// None when the object has no DWARF to read.
    pub fn of(file: &object::File<'_>, data: &Arc<memmap2::Mmap>) -> Option<Self> {
        let info = file.section_by_name(".debug_info")?;
        (info.size() > 0).then(|| LazyDwarf {
            data: data.clone(),
            loaded: std::sync::OnceLock::new(),
        })
    }

    fn symbols(&self) -> Option<&DwarfSymbols> {
        self.loaded
            .get_or_init(|| {
                // Under the same guard as an object's first parse: a
                // malformed binary's DWARF must not take down the thread
                // that builds the profile.
                crate::elf::guard(|| {
                    let file = object::File::parse(&**self.data)?;
                    Ok(DwarfSymbols::from_object(&file, &self.data))
                })
                .ok()
                .flatten()
            })
            .as_ref()
    }
}

impl Resolver for LazyDwarf {
    fn kind(&self) -> &'static str {
        "dwarf"
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        self.symbols()?.resolve(address)
    }
}

impl Resolver for DwarfSymbols {
    fn kind(&self) -> &'static str {
        "dwarf"
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        let mut frames = self.frames(address);
        for frame in frames.iter_mut().flatten() {
            frame.source = self.source;
        }
        // Tables filled in by this lookup count against the budget now.
        self.cache.trim();
        frames
    }
}

#[cfg(test)]
mod tests;

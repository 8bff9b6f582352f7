//! The address index built at load time: which compilation unit covers
//! which addresses, and where each unit starts in `.debug_info` — without
//! keeping any unit parsed. Ranges come from `.debug_aranges`; a unit it
//! does not cover is parsed once (header and root DIE: `DW_AT_ranges`,
//! `DW_AT_low_pc`/`DW_AT_high_pc`, else its line program's sequences) and
//! dropped, keeping only its ranges.

use super::lines::Lines;
use super::sections::{SectionReader, UnitRef};

pub(super) type Dwarf = gimli::Dwarf<SectionReader>;
pub(super) type Unit = gimli::Unit<SectionReader>;

/// A unit of `.debug_info` (type units are left out: they hold no code and
/// no function a name refers to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UnitEntry {
    /// Offset of the unit's header in `.debug_info`.
    offset: usize,
    /// Compilation (or skeleton) unit; false for partial units, which only
    /// matter as the targets of references.
    has_code: bool,
}

/// An address range of a unit; `min_begin` is the lowest `begin` of this
/// range and all after it (the ranges are sorted by `end`), which bounds
/// the scan for an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UnitRange {
    begin: u64,
    end: u64,
    min_begin: u64,
    unit: u32,
}

/// Sorted unit offsets and address ranges of one file's DWARF.
pub(super) struct UnitIndex {
    units: Box<[UnitEntry]>,
    ranges: Box<[UnitRange]>,
}

impl UnitIndex {
    pub fn build(dwarf: &Dwarf) -> Self {
        Self::build_from(dwarf, true)
    }

    /// `use_aranges: false` reads every unit's root DIE instead (tests
    /// compare the two).
    fn build_from(dwarf: &Dwarf, use_aranges: bool) -> Self {
        let units = unit_entries(dwarf);
        let mut ranges: Vec<UnitRange> = Vec::new();
        let mut covered = vec![false; units.len()];
        if use_aranges {
            aranges(dwarf, &units, &mut covered, &mut ranges);
        }
        for (index, entry) in units.iter().enumerate() {
            if entry.has_code && !covered[index] {
                root_ranges(dwarf, entry.offset, index, &mut ranges);
            }
        }
        // As addr2line orders them: by end, then unit order, each unit's
        // ranges in the order it lists them (the sort is stable).
        ranges.sort_by_key(|r| (r.end, r.unit));
        let mut min = u64::MAX;
        for range in ranges.iter_mut().rev() {
            min = min.min(range.begin);
            range.min_begin = min;
        }
        UnitIndex {
            units: units.into_boxed_slice(),
            ranges: ranges.into_boxed_slice(),
        }
    }

    /// The units whose ranges contain `probe`, as indices for
    /// [`UnitIndex::unit_offset`], in the order addr2line tries them.
    pub fn candidates(&self, probe: u64) -> impl Iterator<Item = usize> + '_ {
        // The first range that ends after `probe`.
        let start = match self.ranges.binary_search_by_key(&probe, |r| r.end) {
            Ok(i) => i + 1,
            Err(i) => i,
        };
        self.ranges[start..]
            .iter()
            .take_while(move |r| probe >= r.min_begin)
            .filter(move |r| r.begin <= probe && probe < r.end)
            .map(|r| r.unit as usize)
    }

    /// Offset in `.debug_info` of the unit at `index`.
    pub fn unit_offset(&self, index: usize) -> Option<usize> {
        self.units.get(index).map(|u| u.offset)
    }

    /// The index of the unit holding the `.debug_info` offset `offset`.
    pub fn unit_containing(&self, offset: usize) -> Option<usize> {
        match self.units.binary_search_by_key(&offset, |u| u.offset) {
            // A unit's header, not a DIE; or before the first unit.
            Ok(_) | Err(0) => None,
            Err(i) => Some(i - 1),
        }
    }

    /// Number of units (compilation and partial).
    pub fn unit_count(&self) -> usize {
        self.units.len()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        size_of_val(&*self.units) + size_of_val(&*self.ranges)
    }

    /// (begin, end, unit offset) of every range, sorted.
    #[cfg(test)]
    fn sorted_ranges(&self) -> Vec<(u64, u64, usize)> {
        let mut all: Vec<_> = self
            .ranges
            .iter()
            .map(|r| (r.begin, r.end, self.units[r.unit as usize].offset))
            .collect();
        all.sort_unstable();
        all
    }
}

/// Every unit header of `.debug_info`, up to the first unreadable one.
fn unit_entries(dwarf: &Dwarf) -> Vec<UnitEntry> {
    let mut units = Vec::new();
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        let Some(offset) = header.offset().as_debug_info_offset() else {
            continue;
        };
        let has_code = match header.type_() {
            gimli::UnitType::Type { .. } | gimli::UnitType::SplitType { .. } => continue,
            gimli::UnitType::Partial => false,
            _ => true,
        };
        units.push(UnitEntry {
            offset: offset.0,
            has_code,
        });
    }
    units
}

/// Ranges of `.debug_aranges`, for the units it names that exist and hold
/// code. A unit counts as covered when at least one non-empty range of its
/// set(s) was read; a set that fails to parse contributes nothing.
fn aranges(dwarf: &Dwarf, units: &[UnitEntry], covered: &mut [bool], out: &mut Vec<UnitRange>) {
    let mut headers = dwarf.debug_aranges.headers();
    while let Ok(Some(header)) = headers.next() {
        let offset = header.debug_info_offset().0;
        let Ok(index) = units.binary_search_by_key(&offset, |u| u.offset) else {
            continue;
        };
        if !units[index].has_code {
            continue;
        }
        let before = out.len();
        let mut entries = header.entries();
        let complete = loop {
            match entries.next() {
                Ok(Some(entry)) => {
                    let range = entry.range();
                    if entry.length() != 0 && range.begin < range.end {
                        out.push(unit_range(range, index));
                    }
                }
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        if !complete {
            out.truncate(before);
        } else if out.len() > before {
            covered[index] = true;
        }
    }
}

fn unit_range(range: gimli::Range, unit: usize) -> UnitRange {
    UnitRange {
        begin: range.begin,
        end: range.end,
        min_begin: 0,
        unit: unit as u32,
    }
}

/// Ranges of the unit at `offset` from its root DIE, else from its line
/// program's sequences; the parsed unit is dropped on return.
fn root_ranges(dwarf: &Dwarf, offset: usize, index: usize, out: &mut Vec<UnitRange>) {
    let Ok(header) = dwarf
        .debug_info
        .header_from_offset(gimli::DebugInfoOffset(offset))
    else {
        return;
    };
    let Ok(unit) = dwarf.unit(header) else {
        return;
    };
    let unit = UnitRef::new(dwarf, &unit);
    let before = out.len();
    let declared = (|| -> gimli::Result<bool> {
        let mut entries = unit.entries_raw(None)?;
        let Some(abbrev) = entries.read_abbreviation()? else {
            return Ok(false);
        };
        let mut ranges = RangeAttributes::default();
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            ranges.read(unit, &attr)?;
        }
        ranges.for_each_range(unit, |range| out.push(unit_range(range, index)))
    })();
    match declared {
        Ok(true) => {}
        Ok(false) => {
            // No declared ranges: what the line program covers.
            if let Some(program) = &unit.line_program
                && let Ok(lines) = Lines::parse(unit, program.clone())
            {
                out.extend(lines.ranges().map(|range| unit_range(range, index)));
            }
        }
        Err(_) => out.truncate(before),
    }
}

/// The address attributes of a DIE (unit, subprogram, inlined subroutine),
/// read as addr2line reads them.
#[derive(Default)]
pub(super) struct RangeAttributes {
    low_pc: Option<u64>,
    high_pc: Option<u64>,
    size: Option<u64>,
    ranges_offset: Option<gimli::RangeListsOffset<usize>>,
}

impl RangeAttributes {
    /// Records `attr` if it is `DW_AT_low_pc`, `DW_AT_high_pc` or
    /// `DW_AT_ranges` (`DW_FORM_addrx` and `DW_FORM_rnglistx` through the
    /// unit's bases).
    pub fn read(
        &mut self,
        unit: UnitRef<'_>,
        attr: &gimli::Attribute<SectionReader>,
    ) -> gimli::Result<()> {
        match attr.name() {
            gimli::DW_AT_low_pc => match attr.value() {
                gimli::AttributeValue::Addr(value) => self.low_pc = Some(value),
                gimli::AttributeValue::DebugAddrIndex(index) => {
                    self.low_pc = Some(unit.address(index)?)
                }
                _ => {}
            },
            gimli::DW_AT_high_pc => match attr.value() {
                gimli::AttributeValue::Addr(value) => self.high_pc = Some(value),
                gimli::AttributeValue::DebugAddrIndex(index) => {
                    self.high_pc = Some(unit.address(index)?)
                }
                gimli::AttributeValue::Udata(size) => self.size = Some(size),
                _ => {}
            },
            gimli::DW_AT_ranges => {
                self.ranges_offset = unit.attr_ranges_offset(attr.value())?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Calls `f` with each non-empty range; whether there was any.
    /// `DW_AT_ranges` wins over low/high pc.
    pub fn for_each_range(
        &self,
        unit: UnitRef<'_>,
        mut f: impl FnMut(gimli::Range),
    ) -> gimli::Result<bool> {
        let mut any = false;
        let mut add = |range: gimli::Range| {
            if range.begin < range.end {
                f(range);
                any = true;
            }
        };
        if let Some(offset) = self.ranges_offset {
            let mut list = unit.ranges(offset)?;
            while let Some(range) = list.next()? {
                add(range);
            }
        } else if let (Some(begin), Some(end)) = (self.low_pc, self.high_pc) {
            add(gimli::Range { begin, end });
        } else if let (Some(begin), Some(size)) = (self.low_pc, self.size) {
            // A -1 tombstone wraps around and is dropped as empty.
            add(gimli::Range {
                begin,
                end: begin.wrapping_add(size),
            });
        }
        Ok(any)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{compile_c, load_dwarf};
    use super::*;

    fn check_agree(dwarf: &Dwarf) -> usize {
        let from_aranges = UnitIndex::build(dwarf);
        let from_dies = UnitIndex::build_from(dwarf, false);
        assert_eq!(from_aranges.units, from_dies.units);
        let (a, b) = (from_aranges.sorted_ranges(), from_dies.sorted_ranges());
        assert!(!a.is_empty());
        // GCC's aranges list the same ranges as DW_AT_ranges/low-high pc.
        assert_eq!(a, b);
        a.len()
    }

    #[test]
    fn aranges_and_root_dies_give_the_same_index() {
        let dir = tempfile::tempdir().unwrap();
        for (source, flags) in [
            ("c/inlined.c", &["-O2", "-g"][..]),
            ("c/hot.c", &["-O2", "-g", "-gdwarf-4"][..]),
            ("c/deep.c", &["-O2", "-g", "-ffunction-sections"][..]),
            ("c/inlined.c", &["-O2", "-g", "-gz=zlib"][..]),
        ] {
            let binary = compile_c("cc", source, flags, dir.path());
            let (_map, dwarf) = load_dwarf(&binary);
            // crt files may add units with aranges of their own.
            check_agree(&dwarf);
        }
    }

    /// Debian's libc debug file (~1700 units, DWARF 5, compressed).
    #[test]
    fn aranges_and_root_dies_agree_on_libc() {
        let path = super::super::tests::libc_debug();
        let (_map, dwarf) = load_dwarf(&path);
        let ranges = check_agree(&dwarf);
        assert!(ranges > 1000, "{ranges}");
    }

    #[test]
    fn candidates_follow_ranges_and_unit_offsets_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let binary = compile_c("cc", "c/inlined.c", &["-O2", "-g"], dir.path());
        let (_map, dwarf) = load_dwarf(&binary);
        let index = UnitIndex::build(&dwarf);
        for (begin, end, offset) in index.sorted_ranges() {
            for probe in [begin, (begin + end) / 2, end - 1] {
                let found: Vec<usize> = index
                    .candidates(probe)
                    .map(|i| index.unit_offset(i).unwrap())
                    .collect();
                assert!(found.contains(&offset), "{probe:#x}");
            }
            let unit = index.unit_containing(offset + 20).unwrap();
            assert_eq!(index.unit_offset(unit), Some(offset));
            assert_eq!(
                index.unit_containing(offset).map(|i| index.unit_offset(i)),
                None
            );
        }
        assert_eq!(index.candidates(0).count(), 0);
        assert_eq!(index.candidates(u64::MAX).count(), 0);
    }
}

//! A unit's functions: the address ranges of its `DW_TAG_subprogram` DIEs
//! (for the whole unit) and, parsed per function when first needed, the
//! tree of `DW_TAG_inlined_subroutine` ranges inside one function, with
//! each call site. Names are not read here (see `names`): only DIE offsets
//! are kept, so a parsed unit costs a few words per function.

use std::cmp::Ordering;

use super::sections::UnitRef;
use super::units::RangeAttributes;

/// Deeper nesting of inlined subroutines than this is malformed input.
const MAX_INLINE_DEPTH: usize = 256;

struct FunctionAddress {
    begin: u64,
    end: u64,
    /// Offset of the subprogram DIE in its unit.
    die: usize,
}

/// Every subprogram of a unit that has code, by address.
pub(super) struct Functions {
    /// Sorted by `begin` (stable: DIE order for equal starts).
    addresses: Box<[FunctionAddress]>,
}

impl Functions {
    /// Reads every DIE of the unit once, keeping the ranges of
    /// subprograms (nested ones included, as addr2line does).
    pub fn parse(unit: UnitRef<'_>) -> gimli::Result<Self> {
        let mut addresses = Vec::new();
        let mut entries = unit.entries_raw(None)?;
        while !entries.is_empty() {
            let die = entries.next_offset().0;
            let Some(abbrev) = entries.read_abbreviation()? else {
                continue;
            };
            if abbrev.tag() != gimli::DW_TAG_subprogram {
                entries.skip_attributes(abbrev.attributes())?;
                continue;
            }
            let mut ranges = RangeAttributes::default();
            for spec in abbrev.attributes() {
                let attr = entries.read_attribute(*spec)?;
                ranges.read(unit, &attr)?;
            }
            ranges.for_each_range(unit, |range| {
                addresses.push(FunctionAddress {
                    begin: range.begin,
                    end: range.end,
                    die,
                });
            })?;
        }
        // Identical code folded into one address gives several functions
        // the same range: one of them answers, as in addr2line.
        addresses.sort_by_key(|a| a.begin);
        Ok(Functions {
            addresses: addresses.into_boxed_slice(),
        })
    }

    /// The offset of the subprogram DIE whose range holds `probe`.
    pub fn find(&self, probe: u64) -> Option<gimli::UnitOffset<usize>> {
        let index = self
            .addresses
            .binary_search_by(|a| {
                if probe < a.begin {
                    Ordering::Greater
                } else if probe >= a.end {
                    Ordering::Less
                } else {
                    Ordering::Equal
                }
            })
            .ok()?;
        Some(gimli::UnitOffset(self.addresses[index].die))
    }

    pub fn heap_bytes(&self) -> usize {
        size_of_val(&*self.addresses)
    }
}

/// An inlined subroutine: its DIE and where it was called from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Inlined {
    pub die: gimli::UnitOffset<usize>,
    /// `DW_AT_call_file`, an index into the line program's files.
    pub call_file: Option<u64>,
    /// `DW_AT_call_line`; 0 when unknown.
    pub call_line: u32,
}

struct InlinedAddress {
    begin: u64,
    end: u64,
    /// Number of inlined subroutines around this one in the function.
    depth: u32,
    /// Index into `InlineTree::inlined`.
    inlined: u32,
}

/// The inlined subroutines of one function.
pub(super) struct InlineTree {
    inlined: Box<[Inlined]>,
    /// Sorted by depth, then `begin`: at each depth the ranges do not
    /// overlap, so the one holding an address is a binary search away.
    addresses: Box<[InlinedAddress]>,
}

impl InlineTree {
    /// Reads the subtree of the subprogram DIE at `die` (nested
    /// subprograms skipped; lexical blocks looked through).
    pub fn parse(unit: UnitRef<'_>, die: gimli::UnitOffset<usize>) -> gimli::Result<Self> {
        let mut entries = unit.entries_raw(Some(die))?;
        let depth = entries.next_depth();
        let abbrev = entries
            .read_abbreviation()?
            .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
        entries.skip_attributes(abbrev.attributes())?;

        let mut inlined = Vec::new();
        let mut addresses = Vec::new();
        // DIE depths of the inlined subroutines enclosing the next entry.
        let mut open: Vec<isize> = Vec::new();
        loop {
            let offset = entries.next_offset();
            let entry_depth = entries.next_depth();
            if entry_depth <= depth {
                break;
            }
            while open.last().is_some_and(|&d| entry_depth <= d) {
                open.pop();
            }
            let Some(abbrev) = entries.read_abbreviation()? else {
                continue;
            };
            match abbrev.tag() {
                gimli::DW_TAG_subprogram => {
                    // A nested function has its own entry in `Functions`.
                    entries.skip_attributes(abbrev.attributes())?;
                    while entries.next_depth() > entry_depth {
                        if let Some(abbrev) = entries.read_abbreviation()? {
                            entries.skip_attributes(abbrev.attributes())?;
                        }
                    }
                }
                gimli::DW_TAG_inlined_subroutine => {
                    if open.len() >= MAX_INLINE_DEPTH {
                        return Err(gimli::Error::NoEntryAtGivenOffset);
                    }
                    let mut ranges = RangeAttributes::default();
                    let mut call_file = None;
                    let mut call_line = 0;
                    for spec in abbrev.attributes() {
                        let attr = entries.read_attribute(*spec)?;
                        match attr.name() {
                            gimli::DW_AT_call_file => {
                                // DWARF 5 numbers files from 0; before, 0
                                // meant no file.
                                if let gimli::AttributeValue::FileIndex(file) = attr.value()
                                    && (file > 0 || unit.header.version() >= 5)
                                {
                                    call_file = Some(file);
                                }
                            }
                            gimli::DW_AT_call_line => {
                                call_line = attr.udata_value().unwrap_or(0) as u32;
                            }
                            _ => ranges.read(unit, &attr)?,
                        }
                    }
                    let index = inlined.len() as u32;
                    inlined.push(Inlined {
                        die: offset,
                        call_file,
                        call_line,
                    });
                    let nesting = open.len() as u32;
                    ranges.for_each_range(unit, |range| {
                        addresses.push(InlinedAddress {
                            begin: range.begin,
                            end: range.end,
                            depth: nesting,
                            inlined: index,
                        });
                    })?;
                    open.push(entry_depth);
                }
                _ => entries.skip_attributes(abbrev.attributes())?,
            }
        }
        // Breadth first (depth, then begin): by begin first, a range at
        // depth 0 could not be told before or after a deeper one.
        addresses.sort_by_key(|a| (a.depth, a.begin));
        Ok(InlineTree {
            inlined: inlined.into_boxed_slice(),
            addresses: addresses.into_boxed_slice(),
        })
    }

    /// The inlined subroutines holding `probe`, outermost first.
    pub fn find(&self, probe: u64) -> Vec<Inlined> {
        let mut found = Vec::new();
        let mut addresses = &self.addresses[..];
        loop {
            let depth = found.len() as u32;
            let search = addresses.binary_search_by(|a| {
                if a.depth > depth {
                    Ordering::Greater
                } else if a.depth < depth {
                    Ordering::Less
                } else if a.begin > probe {
                    Ordering::Greater
                } else if a.end <= probe {
                    Ordering::Less
                } else {
                    Ordering::Equal
                }
            });
            let Ok(index) = search else {
                return found;
            };
            found.push(self.inlined[addresses[index].inlined as usize]);
            addresses = &addresses[index + 1..];
        }
    }

    pub fn heap_bytes(&self) -> usize {
        size_of_val(&*self.inlined) + size_of_val(&*self.addresses)
    }
}

//! Function names as addr2line finds them: `DW_AT_linkage_name` (or
//! `DW_AT_MIPS_linkage_name`), else `DW_AT_name`, else through
//! `DW_AT_abstract_origin` / `DW_AT_specification`, whose targets may sit
//! in other units (`DW_FORM_ref_addr`, common in Rust and LTO code).

use std::sync::Arc;

use super::DwarfSymbols;
use super::cache::ParsedUnit;
use super::sections::SectionReader;

/// How many DIEs a chain of origins/specifications may visit.
const MAX_HOPS: usize = 16;

/// The name of the subprogram or inlined subroutine DIE at `die` of
/// `unit`, attributes read in order: a linkage name wins, a plain name
/// counts if nothing was found yet, and so does an origin's name.
pub(super) fn function_name(
    symbols: &DwarfSymbols,
    unit: &Arc<ParsedUnit>,
    die: gimli::UnitOffset<usize>,
) -> gimli::Result<Option<SectionReader>> {
    let unit_ref = unit.unit_ref(&symbols.dwarf);
    let mut entries = unit_ref.entries_raw(Some(die))?;
    let abbrev = entries
        .read_abbreviation()?
        .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
    let mut name = None;
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec)?;
        match attr.name() {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                if let Ok(value) = unit_ref.attr_string(attr.value()) {
                    name = Some(value);
                }
            }
            gimli::DW_AT_name if name.is_none() => {
                name = unit_ref.attr_string(attr.value()).ok();
            }
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification if name.is_none() => {
                name = referenced_name(symbols, unit, attr.value())?;
            }
            _ => {}
        }
    }
    Ok(name)
}

/// The name of the DIE a reference attribute points at, following further
/// references up to `MAX_HOPS` DIEs.
fn referenced_name(
    symbols: &DwarfSymbols,
    unit: &Arc<ParsedUnit>,
    mut reference: gimli::AttributeValue<SectionReader>,
) -> gimli::Result<Option<SectionReader>> {
    let mut unit = unit.clone();
    for _ in 0..MAX_HOPS {
        let offset = match reference {
            gimli::AttributeValue::UnitRef(offset) => offset,
            gimli::AttributeValue::DebugInfoRef(offset) => {
                let (target, offset) = symbols.unit_at(offset)?;
                unit = target;
                offset
            }
            // No supplementary file is loaded (DebugInfoRefSup), and other
            // forms are not references.
            _ => return Ok(None),
        };
        let unit_ref = unit.unit_ref(&symbols.dwarf);
        let mut entries = unit_ref.entries_raw(Some(offset))?;
        let abbrev = entries
            .read_abbreviation()?
            .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
        let mut name = None;
        let mut next = None;
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(value) = unit_ref.attr_string(attr.value()) {
                        return Ok(Some(value));
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(value) = unit_ref.attr_string(attr.value()) {
                        name = Some(value);
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                    next = Some(attr.value());
                }
                _ => {}
            }
        }
        if name.is_some() {
            return Ok(name);
        }
        match next {
            Some(next) => reference = next,
            None => return Ok(None),
        }
    }
    Ok(None)
}

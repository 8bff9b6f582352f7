//! Parsed units, and the small LRU that keeps the recently used ones: a
//! unit is parsed (header, abbreviations, root DIE) when an address or a
//! reference leads to it; its functions, line table and the inline trees
//! of the functions looked up are filled in as lookups need them. The
//! cache holds at most `capacity` units and evicts least recently used
//! ones while their estimated heap exceeds `budget`, so memory does not
//! grow with the number of units in a file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::functions::{Functions, InlineTree};
use super::lines::Lines;
use super::sections::UnitRef;
use super::units::{Dwarf, Unit};

/// Estimated heap of a parsed unit before its tables: abbreviations
/// (~10 KiB per unit in glibc's debug info) and the line program header.
const UNIT_BASE_BYTES: usize = 16 << 10;

pub(super) struct ParsedUnit {
    /// Index of the unit in the `UnitIndex`.
    pub index: usize,
    unit: Unit,
    functions: OnceLock<gimli::Result<Functions>>,
    lines: OnceLock<gimli::Result<Option<Lines>>>,
    /// Inline trees of the functions looked up, by subprogram DIE offset.
    trees: Mutex<HashMap<usize, Arc<InlineTree>>>,
    /// Heap held by the tables filled in so far.
    table_bytes: AtomicUsize,
}

impl ParsedUnit {
    /// Parses the header, abbreviations and root DIE of the unit at
    /// `offset` in `.debug_info`.
    pub fn parse(dwarf: &Dwarf, index: usize, offset: usize) -> gimli::Result<Self> {
        let header = dwarf
            .debug_info
            .header_from_offset(gimli::DebugInfoOffset(offset))?;
        Ok(ParsedUnit {
            index,
            unit: dwarf.unit(header)?,
            functions: OnceLock::new(),
            lines: OnceLock::new(),
            trees: Mutex::new(HashMap::new()),
            table_bytes: AtomicUsize::new(0),
        })
    }

    pub fn unit_ref<'a>(&'a self, dwarf: &'a Dwarf) -> UnitRef<'a> {
        UnitRef::new(dwarf, &self.unit)
    }

    pub fn header(&self) -> &gimli::UnitHeader<super::sections::SectionReader> {
        &self.unit.header
    }

    /// The unit's subprograms by address (parsed on first use).
    pub fn functions(&self, dwarf: &Dwarf) -> gimli::Result<&Functions> {
        let functions = self.functions.get_or_init(|| {
            let parsed = Functions::parse(self.unit_ref(dwarf));
            if let Ok(functions) = &parsed {
                self.add_bytes(functions.heap_bytes());
            }
            parsed
        });
        functions.as_ref().map_err(|e| *e)
    }

    /// The unit's line table, if it has a line program (parsed on first
    /// use).
    pub fn lines(&self, dwarf: &Dwarf) -> gimli::Result<Option<&Lines>> {
        let lines = self.lines.get_or_init(|| {
            let Some(program) = &self.unit.line_program else {
                return Ok(None);
            };
            let parsed = Lines::parse(self.unit_ref(dwarf), program.clone());
            if let Ok(lines) = &parsed {
                self.add_bytes(lines.heap_bytes());
            }
            parsed.map(Some)
        });
        match lines {
            Ok(lines) => Ok(lines.as_ref()),
            Err(e) => Err(*e),
        }
    }

    /// The inline tree of the subprogram DIE at `die` (parsed on first
    /// use; a failure is not remembered).
    pub fn inline_tree(
        &self,
        dwarf: &Dwarf,
        die: gimli::UnitOffset<usize>,
    ) -> gimli::Result<Arc<InlineTree>> {
        if let Some(tree) = lock(&self.trees).get(&die.0) {
            return Ok(tree.clone());
        }
        let tree = Arc::new(InlineTree::parse(self.unit_ref(dwarf), die)?);
        let mut trees = lock(&self.trees);
        if let Some(existing) = trees.get(&die.0) {
            return Ok(existing.clone());
        }
        self.add_bytes(tree.heap_bytes() + 64);
        trees.insert(die.0, tree.clone());
        Ok(tree)
    }

    fn add_bytes(&self, bytes: usize) {
        self.table_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Estimated heap held by this unit.
    pub fn heap_bytes(&self) -> usize {
        UNIT_BASE_BYTES + self.table_bytes.load(Ordering::Relaxed)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds
    // consistent data.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Least recently used parsed units.
pub(super) struct UnitCache {
    capacity: usize,
    budget: usize,
    /// Most recently used last.
    units: Mutex<Vec<Arc<ParsedUnit>>>,
}

impl UnitCache {
    pub fn new(capacity: usize, budget: usize) -> Self {
        UnitCache {
            capacity: capacity.max(1),
            budget,
            units: Mutex::new(Vec::new()),
        }
    }

    /// The parsed unit at `index`, parsing it with `parse` (without
    /// holding the cache's lock) when it is not cached.
    pub fn get_or_parse(
        &self,
        index: usize,
        parse: impl FnOnce() -> gimli::Result<ParsedUnit>,
    ) -> gimli::Result<Arc<ParsedUnit>> {
        {
            let mut units = lock(&self.units);
            if let Some(position) = units.iter().position(|u| u.index == index) {
                let unit = units.remove(position);
                units.push(unit.clone());
                return Ok(unit);
            }
        }
        let parsed = Arc::new(parse()?);
        let mut units = lock(&self.units);
        // Another thread may have parsed it meanwhile.
        if let Some(position) = units.iter().position(|u| u.index == index) {
            let unit = units.remove(position);
            units.push(unit.clone());
            return Ok(unit);
        }
        units.push(parsed.clone());
        self.trim_locked(&mut units);
        Ok(parsed)
    }

    /// Evicts least recently used units beyond the capacity or the byte
    /// budget (the most recent one always stays). Units grow as lookups
    /// fill their tables: call after lookups.
    pub fn trim(&self) {
        self.trim_locked(&mut lock(&self.units));
    }

    fn trim_locked(&self, units: &mut Vec<Arc<ParsedUnit>>) {
        let mut total: usize = units.iter().map(|u| u.heap_bytes()).sum();
        let mut evict = 0;
        while units.len() - evict > 1
            && (units.len() - evict > self.capacity || total > self.budget)
        {
            total = total.saturating_sub(units[evict].heap_bytes());
            evict += 1;
        }
        units.drain(..evict);
    }

    /// Number of cached units and their estimated heap.
    #[cfg(test)]
    pub fn usage(&self) -> (usize, usize) {
        let units = lock(&self.units);
        (units.len(), units.iter().map(|u| u.heap_bytes()).sum())
    }
}

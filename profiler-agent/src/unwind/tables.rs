//! Loads unwind tables into the BPF maps the stack walker reads, once per
//! object, and tells the walker which mappings of a process have them.

use std::collections::HashMap;

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use profiler_common::{
    MAX_UNWIND_MAPPINGS, MAX_UNWIND_ROWS, ProcessUnwind, UnwindMapping, UnwindRow,
};

use super::TableRows;
use crate::process::{ObjectId, Process};
use crate::symbolize::Symbolizer;

/// Where one object's rows sit in the row array.
#[derive(Debug, Clone, Copy)]
struct LoadedTable {
    first_row: u32,
    row_count: u32,
    /// ELF virtual address the rows are relative to.
    base: u64,
    /// ELF virtual address just past the last row's pc.
    end: u64,
}

/// What loading tables did, for the run's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindTableStats {
    pub objects_with_tables: u64,
    pub rows_loaded: u64,
    pub processes_registered: u64,
    /// Objects whose table did not fit in the row array (they unwind by
    /// frame pointers).
    pub tables_dropped: u64,
    pub map_errors: u64,
}

pub struct UnwindTables {
    rows: Array<MapData, UnwindRow>,
    processes: BpfHashMap<MapData, u32, ProcessUnwind>,
    next_row: u32,
    objects: HashMap<ObjectId, Option<LoadedTable>>,
    pub stats: UnwindTableStats,
}

impl UnwindTables {
    pub fn new(
        rows: Array<MapData, UnwindRow>,
        processes: BpfHashMap<MapData, u32, ProcessUnwind>,
    ) -> Self {
        UnwindTables {
            rows,
            processes,
            next_row: 0,
            objects: HashMap::new(),
            stats: UnwindTableStats::default(),
        }
    }

    /// Loads the tables of every object `process` maps (parsing each object
    /// once per run) and registers the process with the stack walker.
    /// Returns how many of its mappings have tables.
    pub fn register(&mut self, process: &Process, symbolizer: &mut Symbolizer) -> usize {
        let mut entry = ProcessUnwind::default();
        for mapping in &process.mappings {
            if entry.count as usize >= MAX_UNWIND_MAPPINGS {
                break;
            }
            let Some(file) = mapping.object.as_ref() else {
                continue;
            };
            let Some(table) = self.table(file.id, || {
                symbolizer
                    .object(file)
                    .and_then(|object| object.unwind_rows())
            }) else {
                continue;
            };
            let Some(object) = symbolizer.object(file) else {
                continue;
            };
            // Runtime address of ELF address v in this mapping.
            let Some(mapping_vaddr) = object.offset_to_address(mapping.offset) else {
                continue;
            };
            let runtime = |v: u64| v.wrapping_sub(mapping_vaddr).wrapping_add(mapping.start);
            let start = mapping.start.max(runtime(table.base));
            let end = mapping.end.min(runtime(table.end));
            if start >= end {
                continue;
            }
            entry.mappings[entry.count as usize] = UnwindMapping {
                start,
                end,
                base: runtime(table.base),
                first_row: table.first_row,
                row_count: table.row_count,
            };
            entry.count += 1;
        }
        if entry.count > 0 {
            match self.processes.insert(process.pid, entry, 0) {
                Ok(()) => self.stats.processes_registered += 1,
                Err(error) => {
                    self.stats.map_errors += 1;
                    tracing::debug!(pid = process.pid, %error, "registering unwind tables");
                }
            }
        }
        entry.count as usize
    }

    /// Stops using tables for `pid` (it exited).
    pub fn unregister(&mut self, pid: u32) {
        let _ = self.processes.remove(&pid);
    }

    fn table(
        &mut self,
        id: ObjectId,
        rows: impl FnOnce() -> Option<TableRows>,
    ) -> Option<LoadedTable> {
        if let Some(loaded) = self.objects.get(&id) {
            return *loaded;
        }
        let loaded = rows().and_then(|table| self.load(table));
        self.objects.insert(id, loaded);
        loaded
    }

    fn load(&mut self, table: TableRows) -> Option<LoadedTable> {
        let count = u32::try_from(table.rows.len()).ok()?;
        if count == 0 {
            return None;
        }
        if self.next_row.checked_add(count)? > MAX_UNWIND_ROWS {
            self.stats.tables_dropped += 1;
            return None;
        }
        let first_row = self.next_row;
        for (i, row) in table.rows.iter().enumerate() {
            if let Err(error) = self.rows.set(first_row + i as u32, row, 0) {
                self.stats.map_errors += 1;
                tracing::debug!(%error, "writing unwind rows");
                return None;
            }
        }
        self.next_row += count;
        self.stats.objects_with_tables += 1;
        self.stats.rows_loaded += u64::from(count);
        let last = table.rows.last()?;
        Some(LoadedTable {
            first_row,
            row_count: count,
            base: table.base,
            end: table.base + u64::from(last.pc) + 1,
        })
    }
}

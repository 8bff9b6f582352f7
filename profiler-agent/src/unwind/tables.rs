//! Loads unwind tables into the BPF maps the stack walker reads, once per
//! object, and tells the walker which mappings of a process have them.

use std::collections::HashMap;

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use profiler_common::{
    MAX_UNWIND_MAPPINGS, MAX_UNWIND_PROCESSES, MAX_UNWIND_ROWS, ProcessUnwind, UnwindMapping,
    UnwindRow,
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
    /// Rows returned to the free space when their objects were unmapped.
    pub rows_freed: u64,
}

pub struct UnwindTables {
    rows: Array<MapData, UnwindRow>,
    processes: BpfHashMap<MapData, u32, ProcessUnwind>,
    allocator: RowAllocator,
    objects: HashMap<ObjectId, Option<LoadedTable>>,
    /// Pids with an entry in the walker's process map.
    registered: std::collections::HashSet<u32>,
    pub stats: UnwindTableStats,
}

/// How full the walker's maps are, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindOccupancy {
    pub rows_used: u32,
    pub rows_capacity: u32,
    pub processes: u32,
    pub processes_capacity: u32,
}

impl UnwindTables {
    pub fn new(
        rows: Array<MapData, UnwindRow>,
        processes: BpfHashMap<MapData, u32, ProcessUnwind>,
    ) -> Self {
        UnwindTables {
            rows,
            processes,
            allocator: RowAllocator::new(MAX_UNWIND_ROWS),
            objects: HashMap::new(),
            registered: Default::default(),
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
                Ok(()) => {
                    self.stats.processes_registered += 1;
                    self.registered.insert(process.pid);
                }
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
        if self.registered.remove(&pid) {
            let _ = self.processes.remove(&pid);
        }
    }

    pub fn occupancy(&self) -> UnwindOccupancy {
        UnwindOccupancy {
            rows_used: self.allocator.used(),
            rows_capacity: MAX_UNWIND_ROWS,
            processes: self.registered.len() as u32,
            processes_capacity: MAX_UNWIND_PROCESSES,
        }
    }

    /// Forgets the tables of objects no live process maps any more (call
    /// after `unregister`ing the processes that exited) and returns their
    /// rows to the free space, so a long run over many short-lived
    /// binaries keeps loading tables. Returns how many rows were freed.
    pub fn retain_objects(&mut self, mut keep: impl FnMut(&ObjectId) -> bool) -> u64 {
        let mut freed = 0;
        let allocator = &mut self.allocator;
        self.objects.retain(|id, loaded| {
            if keep(id) {
                return true;
            }
            if let Some(table) = loaded {
                allocator.free(table.first_row, table.row_count);
                freed += u64::from(table.row_count);
            }
            false
        });
        self.stats.rows_freed += freed;
        freed
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
        let Some(first_row) = self.allocator.allocate(count) else {
            self.stats.tables_dropped += 1;
            return None;
        };
        for (i, row) in table.rows.iter().enumerate() {
            if let Err(error) = self.rows.set(first_row + i as u32, row, 0) {
                self.stats.map_errors += 1;
                tracing::debug!(%error, "writing unwind rows");
                self.allocator.free(first_row, count);
                return None;
            }
        }
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

/// Hands out contiguous row ranges of the BPF row array: first fit from
/// freed ranges (kept sorted and coalesced), else from the never-used
/// tail. A process's rows are only freed once no registered process maps
/// the object; a walk already in flight on another CPU at that moment may
/// read rows being rewritten, which costs that one sample's stack, never
/// safety (the BPF walker bounds-checks every row it reads).
#[derive(Debug)]
struct RowAllocator {
    capacity: u32,
    /// Start of the never-allocated tail.
    next: u32,
    /// Freed ranges below `next`: (first row, count), sorted, disjoint, not
    /// adjacent to each other.
    free: Vec<(u32, u32)>,
}

impl RowAllocator {
    fn new(capacity: u32) -> Self {
        RowAllocator {
            capacity,
            next: 0,
            free: Vec::new(),
        }
    }

    fn allocate(&mut self, count: u32) -> Option<u32> {
        if count == 0 {
            return None;
        }
        if let Some(i) = self.free.iter().position(|&(_, len)| len >= count) {
            let (start, len) = self.free[i];
            if len == count {
                self.free.remove(i);
            } else {
                self.free[i] = (start + count, len - count);
            }
            return Some(start);
        }
        let start = self.next;
        if start.checked_add(count)? > self.capacity {
            return None;
        }
        self.next = start + count;
        Some(start)
    }

    fn free(&mut self, start: u32, count: u32) {
        if count == 0 {
            return;
        }
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, count));
        // Coalesce with the following range, then with the preceding one.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        // A free range that reaches the tail gives it back.
        if let Some(&(s, len)) = self.free.last()
            && s + len == self.next
        {
            self.next = s;
            self.free.pop();
        }
    }

    /// Rows in use.
    fn used(&self) -> u32 {
        self.next - self.free.iter().map(|&(_, len)| len).sum::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_ranges_are_reused_and_coalesced() {
        let mut a = RowAllocator::new(100);
        let x = a.allocate(30).unwrap();
        let y = a.allocate(30).unwrap();
        let z = a.allocate(30).unwrap();
        assert_eq!((x, y, z), (0, 30, 60));
        assert_eq!(a.allocate(20), None, "only 10 rows left");
        a.free(y, 30);
        // First fit inside the hole.
        assert_eq!(a.allocate(10), Some(30));
        assert_eq!(a.allocate(20), Some(40));
        assert_eq!(a.used(), 90);
        a.free(x, 30);
        a.free(30, 10);
        a.free(40, 20);
        // 0..60 coalesced into one range.
        assert_eq!(a.free, vec![(0, 60)]);
        assert_eq!(a.allocate(55), Some(0));
        a.free(0, 55);
        a.free(z, 30);
        // Everything free: the tail is back at 0.
        assert_eq!((a.next, a.free.len(), a.used()), (0, 0, 0));
        assert_eq!(a.allocate(100), Some(0));
    }

    #[test]
    fn a_churn_of_tables_never_runs_out() {
        // Many short-lived binaries, at most 4 alive at a time: without
        // freeing, 1000 tables of 500 rows would need 500k rows.
        let mut a = RowAllocator::new(4 * 500 + 499);
        let mut live = std::collections::VecDeque::new();
        for i in 0..1000u32 {
            let count = 400 + (i * 37) % 100;
            let start = a.allocate(count).expect("space for a live set of 4");
            live.push_back((start, count));
            if live.len() == 4 {
                let (s, c) = live.pop_front().unwrap();
                a.free(s, c);
            }
        }
        assert!(a.used() <= 4 * 500);
    }
}

//! The node's unwind tables in the BPF arrays, and which processes use them.
//!
//! An object's table is built once and loaded once per node, keyed by GNU
//! build id where it has one (the same libc in every container shares one
//! table), else by its (device, inode). A process is registered as the
//! sorted list of its mappings with tables. The row memory has a bound
//! (the row array's size, set from the agent's configuration); when a new
//! table does not fit, the tables least recently sampled are evicted, and
//! the processes that mapped them walk those objects by frame pointers.

use profiler_bpf::maps;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::unwind::{
    CodeRange, FRAME_RECORD_RANGES, MAX_PROCESS_UNWIND_MAPPINGS, ProcessUnwind, UNWIND_PAGE_SHIFT,
    UnwindMapping, UnwindPage, UnwindRow, UnwindRowBlock, UnwindRule,
};

use super::allocator::RangeAllocator;
use super::arrays::MappedArray;
use profiler_symbolize::process::{ObjectFile, ObjectId};
use profiler_unwind::build::{self, BuiltTable, DebugSearch, NoTable};
use profiler_unwind::table::{PagedTable, RuleSet};

/// What backs a mapping that may have a table.
#[derive(Debug, Clone)]
pub enum TableObject {
    File(Arc<ObjectFile>),
    /// `[vdso]`: built from the agent's own vDSO image.
    Vdso,
    /// Code with no file (JIT output): registered without a table, so the
    /// walker knows the mapping (and does not take it for one mapped since
    /// the agent read the process's maps).
    Anonymous,
}

/// A mapping of a process, as registration needs it.
#[derive(Debug, Clone)]
pub struct TableMapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub object: TableObject,
}

/// What loading tables did, for the run's report and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnwindTableStats {
    /// Mapped objects (by device and inode) that got a table.
    pub objects_with_tables: u64,
    /// Distinct tables loaded (objects with one build id share one).
    pub tables_loaded: u64,
    pub rows_loaded: u64,
    pub processes_registered: u64,
    /// Objects without a table, by reason (they walk frame pointers).
    pub objects_no_unwind_info: u64,
    pub objects_unreadable: u64,
    /// Tables that did not fit in the row memory even after eviction.
    pub tables_dropped: u64,
    /// Tables evicted to make room (least recently sampled first).
    pub tables_evicted: u64,
    pub map_errors: u64,
    /// Rows returned to the free space (objects unmapped or evicted).
    pub rows_freed: u64,
    /// CFI rows the walker does not model (frame-pointer fallback).
    pub cfi_unsupported_rows: u64,
    /// FDEs that did not parse (their functions walk frame pointers).
    pub cfi_bad_fdes: u64,
    /// Rows whose rule did not fit in the rule array.
    pub rules_full_rows: u64,
    /// Time spent building tables (parsing CFI and pclntabs).
    pub build_time: Duration,
}

/// How full the walker's arrays are, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindOccupancy {
    pub rows_used: u32,
    pub rows_capacity: u32,
    pub pages_used: u32,
    pub rules_used: u32,
    pub mappings_used: u32,
    pub processes: u32,
    pub processes_capacity: u32,
    /// Bytes of kernel memory the four arrays hold (allocated up front).
    pub bytes_capacity: u64,
    /// Bytes of that in use by loaded tables.
    pub bytes_used: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TableKey {
    BuildId(Vec<u8>),
    Object(ObjectId),
    Vdso,
}

/// Object address ranges as offsets from a table's `base` (the walker's
/// `UnwindMapping::frame_record_callers`): the first `FRAME_RECORD_RANGES`,
/// each cut to what the offsets can say.
fn code_ranges(ranges: &[(u64, u64)], base: u64) -> [CodeRange; FRAME_RECORD_RANGES] {
    let mut out = [CodeRange::default(); FRAME_RECORD_RANGES];
    let offsets = ranges.iter().filter_map(|&(start, end)| {
        let start = u32::try_from(start.checked_sub(base)?).ok()?;
        let end = end.checked_sub(base)?.min(u64::from(u32::MAX)) as u32;
        (start < end).then_some(CodeRange {
            start,
            len: end - start,
        })
    });
    for (slot, range) in out.iter_mut().zip(offsets) {
        *slot = range;
    }
    out
}

/// A `PT_LOAD` segment, to turn a mapping's file offset into an address.
#[derive(Debug, Clone, Copy)]
struct Segment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

#[derive(Debug)]
struct LoadedTable {
    first_row: u32,
    row_count: u32,
    first_page: u32,
    page_count: u32,
    /// ELF virtual address of page 0.
    base: u64,
    segments: Vec<Segment>,
    /// `UnwindMapping::frame_record_callers`, as offsets from `base`.
    frame_record_callers: [CodeRange; FRAME_RECORD_RANGES],
    /// Objects (by identity) using this table.
    users: HashSet<ObjectId>,
}

impl LoadedTable {
    fn address_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            let within = offset.checked_sub(s.file_offset)?;
            (within < s.file_size).then(|| s.address.wrapping_add(within))
        })
    }
}

#[derive(Debug)]
enum ObjectState {
    Table(TableKey),
    /// No table; the reason was counted when first seen.
    None,
}

#[derive(Debug)]
struct RegisteredProcess {
    first: u32,
    /// The walker's entries, with the table each uses (None: a mapping
    /// without a table, walked by frame pointers).
    entries: Vec<(UnwindMapping, Option<TableKey>)>,
    /// Registration tick at which the process was last sampled.
    last_sampled: u64,
    /// Its entry's `ProcessUnwind::generation` (kept for the tests of the
    /// walker's cache invariant: a new one at every registration).
    #[cfg_attr(not(test), allow(dead_code))]
    generation: u32,
}

/// The BPF arrays the walker reads.
pub struct UnwindArrays {
    pub rows: MappedArray<UnwindRowBlock>,
    pub pages: MappedArray<UnwindPage>,
    pub rules: MappedArray<UnwindRule>,
    pub mappings: MappedArray<UnwindMapping>,
    pub processes: Box<dyn ProcessSlots>,
}

impl UnwindArrays {
    /// The walker's arrays of a loaded BPF object (the sampling object,
    /// or the latency object walking stacks at probe hits).
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self, super::ArrayError> {
        let processes = maps::UNWIND_PROCESSES
            .take(ebpf)
            .map_err(|_| super::ArrayError::NotAHashMap(maps::UNWIND_PROCESSES.name))?;
        Ok(UnwindArrays {
            rows: MappedArray::take(ebpf, maps::UNWIND_ROWS)?,
            pages: MappedArray::take(ebpf, maps::UNWIND_PAGES)?,
            rules: MappedArray::take(ebpf, maps::UNWIND_RULES)?,
            mappings: MappedArray::take(ebpf, maps::UNWIND_MAPPINGS)?,
            processes: Box::new(processes),
        })
    }

    /// Arrays in this process's memory, with room for `rows` rows (tests,
    /// and measuring tables without loading them into a kernel).
    pub fn in_memory(rows: u32) -> std::io::Result<Self> {
        use profiler_common::unwind::{
            MAX_UNWIND_MAPPINGS, MAX_UNWIND_PAGES, MAX_UNWIND_RULES, UNWIND_ROWS_PER_BLOCK,
        };
        Ok(UnwindArrays {
            rows: MappedArray::anonymous(rows.div_ceil(UNWIND_ROWS_PER_BLOCK) as usize)?,
            pages: MappedArray::anonymous(MAX_UNWIND_PAGES as usize)?,
            rules: MappedArray::anonymous(MAX_UNWIND_RULES as usize)?,
            mappings: MappedArray::anonymous(MAX_UNWIND_MAPPINGS as usize)?,
            processes: Box::new(HashMap::<u32, ProcessUnwind>::new()),
        })
    }
}

/// The per-process map of the walker: pid -> where its mappings are.
pub trait ProcessSlots: Send {
    fn set(&mut self, pid: u32, value: ProcessUnwind) -> Result<(), String>;
    fn clear(&mut self, pid: u32);
}

impl ProcessSlots for BpfHashMap<MapData, u32, ProcessUnwind> {
    fn set(&mut self, pid: u32, value: ProcessUnwind) -> Result<(), String> {
        self.insert(pid, value, 0).map_err(|e| e.to_string())
    }
    fn clear(&mut self, pid: u32) {
        let _ = self.remove(&pid);
    }
}

impl ProcessSlots for HashMap<u32, ProcessUnwind> {
    fn set(&mut self, pid: u32, value: ProcessUnwind) -> Result<(), String> {
        self.insert(pid, value);
        Ok(())
    }
    fn clear(&mut self, pid: u32) {
        self.remove(&pid);
    }
}

pub struct TableStore {
    arrays: UnwindArrays,
    rule_set: RuleSet,
    rules_written: usize,
    row_space: RangeAllocator,
    page_space: RangeAllocator,
    mapping_space: RangeAllocator,
    tables: HashMap<TableKey, LoadedTable>,
    objects: HashMap<ObjectId, ObjectState>,
    vdso: Option<ObjectState>,
    processes: HashMap<u32, RegisteredProcess>,
    processes_capacity: u32,
    tick: u64,
    /// The last `ProcessUnwind::generation` given out.
    generation: u32,
    pub stats: UnwindTableStats,
}

impl TableStore {
    pub fn new(arrays: UnwindArrays, processes_capacity: u32) -> Self {
        let rows = arrays.rows.len() as u32 * profiler_common::unwind::UNWIND_ROWS_PER_BLOCK;
        let pages = arrays.pages.len() as u32;
        let mappings = arrays.mappings.len() as u32;
        let mut store = TableStore {
            arrays,
            rule_set: RuleSet::default(),
            rules_written: 0,
            row_space: RangeAllocator::new(rows),
            page_space: RangeAllocator::new(pages),
            mapping_space: RangeAllocator::new(mappings),
            tables: HashMap::new(),
            objects: HashMap::new(),
            vdso: None,
            processes: HashMap::new(),
            processes_capacity,
            tick: 1,
            generation: 0,
            stats: UnwindTableStats::default(),
        };
        store.write_new_rules();
        store
    }

    pub fn occupancy(&self) -> UnwindOccupancy {
        let size = |len: usize, element: usize| (len * element) as u64;
        let a = &self.arrays;
        UnwindOccupancy {
            rows_used: self.row_space.used(),
            rows_capacity: self.row_space.capacity(),
            pages_used: self.page_space.used(),
            rules_used: self.rule_set.len() as u32,
            mappings_used: self.mapping_space.used(),
            processes: self.processes.len() as u32,
            processes_capacity: self.processes_capacity,
            bytes_capacity: size(a.rows.len(), size_of::<UnwindRowBlock>())
                + size(a.pages.len(), size_of::<UnwindPage>())
                + size(a.rules.len(), size_of::<UnwindRule>())
                + size(a.mappings.len(), size_of::<UnwindMapping>()),
            bytes_used: u64::from(self.row_space.used()) * size_of::<UnwindRow>() as u64
                + u64::from(self.page_space.used()) * size_of::<UnwindPage>() as u64
                + self.rule_set.len() as u64 * size_of::<UnwindRule>() as u64
                + u64::from(self.mapping_space.used()) * size_of::<UnwindMapping>() as u64,
        }
    }

    /// Marks processes as sampled now (eviction keeps their tables longest).
    pub fn sampled(&mut self, pids: &[u32]) {
        self.tick += 1;
        for pid in pids {
            if let Some(process) = self.processes.get_mut(pid) {
                process.last_sampled = self.tick;
            }
        }
    }

    /// Loads the tables of `pid`'s mappings (building each object's once)
    /// and registers the process with the walker, replacing what it had.
    pub fn register(&mut self, pid: u32, mappings: &[TableMapping]) -> usize {
        self.tick += 1;
        let mut entries: Vec<(UnwindMapping, Option<TableKey>)> = Vec::new();
        for mapping in mappings {
            let key = self.table_for(&mapping.object);
            let entry = key.as_ref().and_then(|key| self.entry_for(mapping, key));
            match entry {
                Some(entry) => entries.push((entry, key)),
                None => entries.push((
                    UnwindMapping {
                        start: mapping.start,
                        end: mapping.end,
                        base: mapping.start,
                        ..Default::default()
                    },
                    None,
                )),
            }
        }
        entries.sort_by_key(|(e, _)| e.start);
        entries.truncate(MAX_PROCESS_UNWIND_MAPPINGS as usize);
        let count = entries.len();
        // Registered again with nothing changed (a maps re-read that found
        // the same mappings): the walker's entry stays, and with its
        // generation the rules the walker keeps for it. Its tables cannot
        // have changed under it: one is freed only after every process
        // using it was installed again without it (`evict`).
        if self
            .processes
            .get(&pid)
            .is_some_and(|old| old.entries == entries)
        {
            return count;
        }
        self.install(pid, entries);
        count
    }

    /// Stops using tables for `pid` (it exited).
    pub fn unregister(&mut self, pid: u32) {
        if let Some(old) = self.processes.remove(&pid) {
            self.arrays.processes.clear(pid);
            self.mapping_space.free(old.first, old.entries.len() as u32);
        }
    }

    /// Forgets the objects no live process maps any more (call after
    /// unregistering the processes that exited), freeing tables no object
    /// uses. Returns how many rows were freed.
    pub fn retain_objects(&mut self, keep: &HashSet<ObjectId>) -> u64 {
        let gone: Vec<ObjectId> = self
            .objects
            .keys()
            .filter(|id| !keep.contains(id))
            .copied()
            .collect();
        let mut freed = 0;
        // The vDSO's table goes with the last process that had it.
        let vdso_used = self
            .processes
            .values()
            .any(|p| p.entries.iter().any(|(_, k)| *k == Some(TableKey::Vdso)));
        if !vdso_used && self.vdso.take().is_some() {
            freed += self.free_table(&TableKey::Vdso);
        }
        for id in gone {
            if let Some(ObjectState::Table(key)) = self.objects.remove(&id)
                && let Some(table) = self.tables.get_mut(&key)
            {
                table.users.remove(&id);
                if table.users.is_empty() {
                    freed += self.free_table(&key);
                }
            }
        }
        freed
    }

    /// The table key for `object`, building and loading its table on
    /// first sight.
    fn table_for(&mut self, object: &TableObject) -> Option<TableKey> {
        match object {
            TableObject::Anonymous => None,
            TableObject::Vdso => {
                if self.vdso.is_none() {
                    let started = Instant::now();
                    let built = profiler_symbolize::process::vdso_image()
                        .ok_or(NoTable::NoUnwindInfo)
                        .and_then(|image| {
                            let segments = segments_of(&image);
                            build::build_vdso(&image).map(|b| (b, segments))
                        });
                    self.stats.build_time += started.elapsed();
                    let state = match built {
                        Ok((built, segments)) => self.load(TableKey::Vdso, &built, segments, None),
                        Err(reason) => self.count_no_table(&reason),
                    };
                    self.vdso = Some(state);
                }
                match &self.vdso {
                    Some(ObjectState::Table(key)) if self.tables.contains_key(key) => {
                        Some(key.clone())
                    }
                    _ => None,
                }
            }
            TableObject::File(file) => {
                if !self.objects.contains_key(&file.id) {
                    let state = self.build_object(file);
                    self.objects.insert(file.id, state);
                }
                match self.objects.get(&file.id) {
                    Some(ObjectState::Table(key)) if self.tables.contains_key(key) => {
                        Some(key.clone())
                    }
                    _ => None,
                }
            }
        }
    }

    fn build_object(&mut self, file: &ObjectFile) -> ObjectState {
        let handle = match &file.file {
            Ok(handle) => handle,
            Err(reason) => return self.count_no_table(&NoTable::Unreadable(reason.clone())),
        };
        // SAFETY: a read-only private mapping of a file we only read (see
        // symbolize::map_file for the truncation caveat).
        let map = match unsafe { memmap2::Mmap::map(handle) } {
            Ok(map) => Arc::new(map),
            Err(e) => return self.count_no_table(&NoTable::Unreadable(e.to_string())),
        };
        let started = Instant::now();
        let built = build::build(
            &map,
            Some(DebugSearch { object: file }),
            profiler_runtimes::unwind_rows(),
        );
        self.stats.build_time += started.elapsed();
        let built = match built {
            Ok(built) => built,
            Err(reason) => {
                tracing::debug!(path = %file.path.display(), %reason, "no unwind table");
                return self.count_no_table(&reason);
            }
        };
        let key = match &built.build_id {
            Some(id) if !id.is_empty() => TableKey::BuildId(id.clone()),
            _ => TableKey::Object(file.id),
        };
        if let Some(table) = self.tables.get_mut(&key) {
            table.users.insert(file.id);
            self.stats.objects_with_tables += 1;
            return ObjectState::Table(key);
        }
        let segments = segments_of(&map);
        self.load(key, &built, segments, Some(file.id))
    }

    fn count_no_table(&mut self, reason: &NoTable) -> ObjectState {
        match reason {
            NoTable::Unreadable(_) | NoTable::NotElf(_) | NoTable::Panicked => {
                self.stats.objects_unreadable += 1
            }
            NoTable::NoUnwindInfo | NoTable::OtherArchitecture => {
                self.stats.objects_no_unwind_info += 1
            }
        }
        ObjectState::None
    }

    /// Writes `built` into the arrays, evicting older tables if needed.
    fn load(
        &mut self,
        key: TableKey,
        built: &BuiltTable,
        segments: Vec<Segment>,
        user: Option<ObjectId>,
    ) -> ObjectState {
        self.stats.cfi_unsupported_rows += built.cfi.unsupported_rows;
        self.stats.cfi_bad_fdes += built.cfi.bad_fdes;
        let Some(paged) = PagedTable::build(&built.table, &mut self.rule_set) else {
            self.stats.tables_dropped += 1;
            return ObjectState::None;
        };
        self.stats.rules_full_rows += paged.rules_full;
        self.write_new_rules();
        let (row_count, page_count) = (paged.rows.len() as u32, paged.pages.len() as u32);
        let Some((first_row, first_page)) = self.allocate_table(row_count, page_count) else {
            self.stats.tables_dropped += 1;
            return ObjectState::None;
        };
        // Rows first, then the pages pointing at them: a walker never sees
        // a page whose rows are not there yet. A block is
        // UNWIND_ROWS_PER_BLOCK rows with no padding (repr(C), 4-byte rows),
        // so row i is at byte 4 * i of the block array.
        // SAFETY: UnwindRow is plain data (two u16), so its bytes are what
        // the kernel array stores.
        let row_bytes = unsafe {
            std::slice::from_raw_parts(
                paged.rows.as_ptr().cast::<u8>(),
                std::mem::size_of_val(paged.rows.as_slice()),
            )
        };
        if !self
            .arrays
            .rows
            .write_bytes(first_row as usize * size_of::<UnwindRow>(), row_bytes)
        {
            self.stats.map_errors += 1;
            self.row_space.free(first_row, row_count);
            self.page_space.free(first_page, page_count);
            return ObjectState::None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        let pages: Vec<UnwindPage> = paged
            .pages
            .iter()
            .map(|p| UnwindPage {
                first_row: if p.row_count == 0 {
                    0
                } else {
                    p.first_row + first_row
                },
                row_count: p.row_count,
            })
            .collect();
        if !self.arrays.pages.write(first_page as usize, &pages) {
            self.stats.map_errors += 1;
            self.row_space.free(first_row, row_count);
            self.page_space.free(first_page, page_count);
            return ObjectState::None;
        }
        self.stats.tables_loaded += 1;
        self.stats.rows_loaded += u64::from(row_count);
        if user.is_some() {
            self.stats.objects_with_tables += 1;
        }
        self.tables.insert(
            key.clone(),
            LoadedTable {
                first_row,
                row_count,
                first_page,
                page_count,
                base: paged.base,
                segments,
                frame_record_callers: code_ranges(&built.frame_record_callers, paged.base),
                users: user.into_iter().collect(),
            },
        );
        ObjectState::Table(key)
    }

    /// Space for a table's rows and pages, evicting the least recently
    /// sampled tables until it fits (or nothing is left to evict).
    fn allocate_table(&mut self, rows: u32, pages: u32) -> Option<(u32, u32)> {
        if rows > self.row_space.capacity() || pages > self.page_space.capacity() {
            return None;
        }
        loop {
            if let Some(first_row) = self.row_space.allocate(rows) {
                if let Some(first_page) = self.page_space.allocate(pages) {
                    return Some((first_row, first_page));
                }
                self.row_space.free(first_row, rows);
            }
            let victim = self.least_recently_sampled()?;
            self.evict(&victim);
        }
    }

    fn least_recently_sampled(&self) -> Option<TableKey> {
        let mut recency: HashMap<&TableKey, u64> = self.tables.keys().map(|k| (k, 0)).collect();
        for process in self.processes.values() {
            for (_, key) in &process.entries {
                if let Some(r) = key.as_ref().and_then(|key| recency.get_mut(key)) {
                    *r = (*r).max(process.last_sampled);
                }
            }
        }
        recency
            .into_iter()
            .min_by_key(|(_, r)| *r)
            .map(|(k, _)| k.clone())
    }

    /// Drops a table still in use: its processes walk that object by
    /// frame pointers from now on.
    fn evict(&mut self, key: &TableKey) {
        self.stats.tables_evicted += 1;
        let affected: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| p.entries.iter().any(|(_, k)| k.as_ref() == Some(key)))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in affected {
            if let Some(process) = self.processes.get(&pid) {
                // The mapping stays known, without a table.
                let entries: Vec<_> = process
                    .entries
                    .iter()
                    .map(|(e, k)| {
                        if k.as_ref() == Some(key) {
                            let bare = UnwindMapping {
                                start: e.start,
                                end: e.end,
                                base: e.start,
                                ..Default::default()
                            };
                            (bare, None)
                        } else {
                            (*e, k.clone())
                        }
                    })
                    .collect();
                self.install(pid, entries);
            }
        }
        self.free_table(key);
    }

    fn free_table(&mut self, key: &TableKey) -> u64 {
        let Some(table) = self.tables.remove(key) else {
            return 0;
        };
        // Unused pages are emptied first so no walker follows them into
        // rows another table gets next.
        let empty = vec![UnwindPage::default(); table.page_count as usize];
        self.arrays.pages.write(table.first_page as usize, &empty);
        self.page_space.free(table.first_page, table.page_count);
        self.row_space.free(table.first_row, table.row_count);
        self.stats.rows_freed += u64::from(table.row_count);
        u64::from(table.row_count)
    }

    /// The walker's entry for `mapping`, whose object has table `key`.
    fn entry_for(&self, mapping: &TableMapping, key: &TableKey) -> Option<UnwindMapping> {
        let table = self.tables.get(key)?;
        let mapping_address = table.address_of_offset(mapping.offset)?;
        let runtime = |v: u64| v.wrapping_sub(mapping_address).wrapping_add(mapping.start);
        let base = runtime(table.base);
        let table_end = runtime(table.base + (u64::from(table.page_count) << UNWIND_PAGE_SHIFT));
        let start = mapping.start.max(base);
        let end = mapping.end.min(table_end);
        (start < end && base <= start).then_some(UnwindMapping {
            start,
            end,
            base,
            first_page: table.first_page,
            page_count: table.page_count,
            frame_record_callers: table.frame_record_callers,
        })
    }

    /// Writes a process's entries and points the walker at them.
    fn install(&mut self, pid: u32, entries: Vec<(UnwindMapping, Option<TableKey>)>) {
        let old = self.processes.remove(&pid);
        let last_sampled = old.as_ref().map_or(self.tick, |p| p.last_sampled);
        let count = entries.len() as u32;
        let first = if count == 0 {
            None
        } else {
            self.mapping_space.allocate(count)
        };
        match first {
            Some(first) => {
                let values: Vec<UnwindMapping> = entries.iter().map(|(e, _)| *e).collect();
                if !self.arrays.mappings.write(first as usize, &values) {
                    self.stats.map_errors += 1;
                }
                std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
                // Never 0, which the walker's empty cache slots hold.
                self.generation = self.generation.checked_add(1).unwrap_or(1);
                let value = ProcessUnwind {
                    first_mapping: first,
                    mapping_count: count,
                    generation: self.generation,
                };
                match self.arrays.processes.set(pid, value) {
                    Ok(()) => {
                        if old.is_none() {
                            self.stats.processes_registered += 1;
                        }
                        self.processes.insert(
                            pid,
                            RegisteredProcess {
                                first,
                                entries,
                                last_sampled,
                                generation: value.generation,
                            },
                        );
                    }
                    Err(error) => {
                        self.stats.map_errors += 1;
                        tracing::debug!(pid, %error, "registering unwind tables");
                        self.mapping_space.free(first, count);
                        self.arrays.processes.clear(pid);
                    }
                }
            }
            None => {
                if count > 0 {
                    self.stats.map_errors += 1;
                }
                self.arrays.processes.clear(pid);
            }
        }
        if let Some(old) = old {
            self.mapping_space.free(old.first, old.entries.len() as u32);
        }
    }

    fn write_new_rules(&mut self) {
        let new = self.rule_set.since(self.rules_written).to_vec();
        if self.arrays.rules.write(self.rules_written, &new) {
            self.rules_written += new.len();
        }
    }
}

fn segments_of(data: &[u8]) -> Vec<Segment> {
    use object::{Object, ObjectSegment};
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    file.segments()
        .map(|segment| {
            let (file_offset, file_size) = segment.file_range();
            Segment {
                file_offset,
                file_size,
                address: segment.address(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::unwind::UNWIND_ROWS_PER_BLOCK;

    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

    fn object(path: &str, inode: u64) -> Arc<ObjectFile> {
        let mut file = ObjectFile::open_path(std::path::Path::new(path)).unwrap();
        if inode != 0 {
            file.id.inode = inode;
        }
        Arc::new(file)
    }

    /// A mapping of `object`'s first executable segment at `start`.
    fn mapping(object: &Arc<ObjectFile>, start: u64) -> TableMapping {
        use object::{Object, ObjectSegment, SegmentFlags};
        let data = std::fs::read(&object.path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let text = file
            .segments()
            .find(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & 1 != 0))
            .unwrap();
        let (offset, size) = text.file_range();
        TableMapping {
            start,
            end: start + size,
            offset,
            object: TableObject::File(object.clone()),
        }
    }

    fn store(rows: u32) -> TableStore {
        TableStore::new(UnwindArrays::in_memory(rows).unwrap(), 64)
    }

    /// The rule for `pc` found the way the BPF walker finds it, through the
    /// arrays as written.
    fn walker_rule(store: &mut TableStore, entries: &[UnwindMapping], pc: u64) -> UnwindRule {
        let Some(m) = entries.iter().find(|m| m.start <= pc && pc < m.end) else {
            return UnwindRule::default();
        };
        let offset = pc - m.base;
        let page = offset >> UNWIND_PAGE_SHIFT;
        if page >= u64::from(m.page_count) {
            return UnwindRule::default();
        }
        let page = store
            .arrays
            .pages
            .get((m.first_page + page as u32) as usize)
            .unwrap();
        if page.row_count == 0 {
            return UnwindRule::default();
        }
        let rows = &store.arrays.rows;
        let row = |i: u32| {
            rows.get((i / UNWIND_ROWS_PER_BLOCK) as usize).unwrap().rows
                [(i % UNWIND_ROWS_PER_BLOCK) as usize]
        };
        let low = (offset & ((1 << UNWIND_PAGE_SHIFT) - 1)) as u16;
        let mut chosen = row(page.first_row);
        for i in page.first_row..page.first_row + page.row_count {
            if row(i).pc_low <= low {
                chosen = row(i);
            }
        }
        store.arrays.rules.get(chosen.rule as usize).unwrap()
    }

    #[test]
    fn the_walker_finds_the_rules_of_the_built_table() {
        let libc = object(LIBC, 0);
        let mut store = store(1 << 20);
        let map = mapping(
            &libc,
            0x7f00_0000_0000 + (mapping(&libc, 0).offset & !0xfff),
        );
        assert_eq!(store.register(42, std::slice::from_ref(&map)), 1);
        let process = &store.processes[&42];
        let entries: Vec<UnwindMapping> = process.entries.iter().map(|(e, _)| *e).collect();
        assert!(entries[0].page_count > 0);
        let table = build::build_bytes(
            &std::fs::read(LIBC).unwrap(),
            profiler_runtimes::unwind_rows(),
        )
        .unwrap()
        .table;
        // Runtime address of ELF address v: the segment's offset maps to
        // the mapping's start.
        let vaddr_of_start = {
            use object::{Object, ObjectSegment};
            let data = std::fs::read(LIBC).unwrap();
            let file = object::File::parse(&*data).unwrap();
            file.segments()
                .find_map(|s| {
                    let (o, size) = s.file_range();
                    (o <= map.offset && map.offset < o + size).then(|| s.address() + map.offset - o)
                })
                .unwrap()
        };
        let mut checked = 0;
        for row in table.rows.iter().step_by(37) {
            for delta in [0, 1] {
                let v = row.address + delta;
                if v < vaddr_of_start || v - vaddr_of_start >= map.end - map.start {
                    continue;
                }
                let pc = map.start + (v - vaddr_of_start);
                assert_eq!(
                    walker_rule(&mut store, &entries, pc),
                    table.rule_at(v).unwrap(),
                    "at {v:#x}"
                );
                checked += 1;
            }
        }
        assert!(checked > 500, "only {checked} addresses checked");
    }

    #[test]
    fn one_table_per_build_id() {
        let mut store = store(1 << 20);
        // The same library seen as two files (two containers' copies).
        let a = object(LIBC, 1001);
        let b = object(LIBC, 1002);
        store.register(1, &[mapping(&a, 0x10_0000_0000)]);
        store.register(2, &[mapping(&b, 0x20_0000_0000)]);
        assert_eq!(store.stats.tables_loaded, 1);
        assert_eq!(store.stats.objects_with_tables, 2);
        let rows = store.occupancy().rows_used;
        // Forgetting one copy keeps the table; forgetting both frees it.
        store.unregister(1);
        store.retain_objects(&HashSet::from([b.id]));
        assert_eq!(store.occupancy().rows_used, rows);
        store.unregister(2);
        store.retain_objects(&HashSet::new());
        assert_eq!(store.occupancy().rows_used, 0);
        assert_eq!(store.occupancy().mappings_used, 0);
    }

    #[test]
    fn the_least_recently_sampled_table_is_evicted_when_memory_is_full() {
        const LIBSTDCXX: &str = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";
        const LIBGCC: &str = "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1";
        let rows_of = |path: &str| {
            let table = build::build_bytes(
                &std::fs::read(path).unwrap(),
                profiler_runtimes::unwind_rows(),
            )
            .unwrap()
            .table;
            PagedTable::build(&table, &mut RuleSet::default())
                .unwrap()
                .rows
                .len() as u32
        };
        let (libc_rows, libstdcxx_rows, libgcc_rows) =
            (rows_of(LIBC), rows_of(LIBSTDCXX), rows_of(LIBGCC));
        assert!(libgcc_rows < libc_rows);
        // Room for libc's and libstdc++'s tables, not for a third.
        let capacity = libc_rows + libstdcxx_rows + 64;
        let mut store = store(capacity);
        store.register(1, &[mapping(&object(LIBC, 0), 0x10_0000_0000)]);
        store.register(2, &[mapping(&object(LIBSTDCXX, 0), 0x20_0000_0000)]);
        store.sampled(&[1]);
        store.sampled(&[2]); // libstdc++ sampled last
        let generation_before = store.processes[&1].generation;
        store.register(3, &[mapping(&object(LIBGCC, 0), 0x30_0000_0000)]);
        assert_eq!(store.stats.tables_evicted, 1, "{:?}", store.stats);
        // The walker's cached rules of process 1 were for libc's table,
        // whose rows libgcc's may now hold: its entry has a new generation.
        assert_ne!(store.processes[&1].generation, generation_before);
        assert_eq!(store.stats.tables_dropped, 0);
        // Process 1 still knows its mapping, without a table now; 2 and 3
        // have theirs.
        let without = |pid: u32| store.processes[&pid].entries[0].0.page_count == 0;
        assert!(without(1) && !without(2) && !without(3));
        assert!(store.occupancy().rows_used <= capacity);
    }

    /// The walker keeps rules by (address, generation): every entry it is
    /// given must have a generation no other entry had. A registration
    /// that changes nothing writes nothing: the entry keeps its generation,
    /// and the walker the rules it kept.
    #[test]
    fn every_new_entry_has_a_generation_of_its_own() {
        let mut store = store(1 << 16);
        let libc = object(LIBC, 0);
        let mut seen = HashSet::new();
        for (pid, at) in [(1, 0x10), (2, 0x10), (1, 0x20), (3, 0x10), (2, 0x30)] {
            store.register(pid, &[mapping(&libc, at << 32)]);
            let generation = store.processes[&pid].generation;
            assert_ne!(generation, 0, "0 is the walker's empty cache slot");
            assert!(
                seen.insert(generation),
                "generation {generation} given twice"
            );
        }
        let entry =
            |store: &TableStore| (store.processes[&1].generation, store.processes[&1].first);
        let before = entry(&store);
        store.register(1, &[mapping(&libc, 0x20 << 32)]);
        assert_eq!(entry(&store), before, "the same mappings installed again");
    }

    #[test]
    fn frame_record_ranges_become_offsets_from_the_table_base() {
        let ranges = code_ranges(
            &[
                (0x40_1000, 0x40_2000),
                // Below the base: left out; empty: left out.
                (0x30_0000, 0x30_1000),
                (0x40_5000, 0x40_5000),
                (0x40_6000, 0x40_6100),
            ],
            0x40_0000,
        );
        assert_eq!(
            ranges[0],
            CodeRange {
                start: 0x1000,
                len: 0x1000
            }
        );
        assert_eq!(
            ranges[1],
            CodeRange {
                start: 0x6000,
                len: 0x100
            }
        );
        assert!(ranges[2..].iter().all(|r| r.len == 0));
    }
}

//! Symbolization: runtime addresses → functions, files and lines.
//!
//! Two steps, as in blazesym: *normalize* a process address into (object,
//! file offset → ELF virtual address) through the process's mappings, then
//! *resolve* that address with the object's resolvers. Objects are parsed
//! once per run, keyed by (device, inode) and shared by GNU build id.
//! Nothing here fails a profile: an address that cannot be named becomes a
//! frame like `libfoo.so+0x1234` and is counted.
//!
//! No BPF and no network (debuginfod, the one thing that downloads, is the
//! `debuginfod` feature): the fuzz targets and `symbolize` link this alone.

pub mod debuginfod;
pub mod demangle;
pub mod dwarf;
pub mod elf;
mod frame;
pub mod kernel;
pub mod perf_map;
pub mod process;
pub mod runtime;
pub mod shared_bytes;

pub use elf::{ElfError, ElfObject};
pub use frame::{Frame, NameSource, Resolver, nul_padded, printable};
pub use kernel::KernelSymbols;
pub use runtime::{RuntimeObjects, RuntimeSymbols, Runtimes};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use crate::process::{Mapping, ObjectFile, ObjectId, Process};

/// The bytes of an object file, shared by the resolvers that read from it
/// lazily (a memory map in the agent; any buffer in tests).
pub type FileBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Counts of what symbolization did, reported at the end of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolizerStats {
    pub objects_parsed: u64,
    /// Objects that could not be opened or parsed (their frames stay
    /// unsymbolized).
    pub objects_failed: u64,
    pub user_resolved: u64,
    pub user_unresolved: u64,
    pub kernel_resolved: u64,
    pub kernel_unresolved: u64,
    /// User addresses named by a JIT's perf map (also in `user_resolved`).
    pub jit_resolved: u64,
}

/// Maps an object file read-only.
fn map_file(file: &std::fs::File) -> Result<memmap2::Mmap, String> {
    // SAFETY: a read-only private mapping of a file we only read; if the
    // file is truncated underneath us, reads fault — the same risk every
    // profiler reading live binaries takes; package managers replace
    // binaries (a new inode) rather than rewriting them in place.
    unsafe { memmap2::Mmap::map(file) }.map_err(|e| format!("mmap: {e}"))
}

/// Adds DWARF line and inline information: from the object itself, or
/// from its separate debug file (build id or .gnu_debuglink, else a
/// debuginfod server), whose symbol table also helps a stripped binary.
/// Returns true when the debug file is still downloading: the object is
/// then read again once it has arrived (see `Symbolizer::refresh_fetched`).
fn add_debug_info(
    object: &mut ElfObject,
    parsed: &object::File<'_>,
    data: &Arc<memmap2::Mmap>,
    file: &ObjectFile,
    maps: &mut Vec<Weak<memmap2::Mmap>>,
    fetch: Option<(&debuginfod::Debuginfod, Option<std::time::Instant>)>,
) -> bool {
    // Behind a runtime's own tables the DWARF is for the rest only: read
    // when first asked.
    if object.runtime_symbols().is_some()
        && let Some(dwarf) = dwarf::LazyDwarf::of(parsed, data)
    {
        object.insert_before_symbols(Box::new(dwarf));
        return false;
    }
    if let Some(dwarf) = dwarf::DwarfSymbols::from_object(parsed, data) {
        object.insert_before_symbols(Box::new(dwarf));
        return false;
    }
    let mut awaiting = false;
    let found = match dwarf::find_debug_file(parsed, file) {
        Some((_, file)) => Some((file, NameSource::Dwarf)),
        None => match fetch
            .filter(|_| wants_debuginfod(parsed) && object.runtime_symbols().is_none())
        {
            Some((client, wait_until)) => {
                match client.lookup(object.build_id.as_deref().unwrap_or_default(), wait_until) {
                    debuginfod::Lookup::Found(path) => std::fs::File::open(path)
                        .ok()
                        .map(|f| (f, NameSource::Debuginfod)),
                    debuginfod::Lookup::Pending => {
                        awaiting = true;
                        None
                    }
                    debuginfod::Lookup::Missing => None,
                }
            }
            None => None,
        },
    };
    let Some((debug_file, source)) = found else {
        add_minidebuginfo(object, parsed, &file.path);
        return awaiting;
    };
    let Some(debug_data) = map_file(&debug_file).ok().map(Arc::new) else {
        return false;
    };
    maps.push(Arc::downgrade(&debug_data));
    let _ = elf::guard(|| {
        let debug = object::File::parse(&**debug_data)?;
        if let Some(dwarf) = dwarf::DwarfSymbols::from_object(&debug, &debug_data) {
            object.insert_before_symbols(Box::new(dwarf.from_source(source)));
        }
        let debug_bytes: FileBytes = debug_data.clone();
        let mut symbols = elf::ElfSymbols::from_object(&debug, &debug_bytes);
        if source == NameSource::Debuginfod {
            symbols = symbols.from_source(source);
        }
        if !symbols.is_empty() {
            object.push_resolver(Box::new(symbols));
        }
        Ok(())
    });
    false
}

/// Whether a debuginfod server is worth asking for this object's debug
/// file: it has no `.symtab` and no DWARF of its own (and no runtime's own
/// table names its functions: checked by the caller). A local debug file
/// is looked for first.
fn wants_debuginfod(parsed: &object::File<'_>) -> bool {
    use object::Object;
    parsed.symbol_table().is_none() && parsed.section_by_name(".debug_info").is_none()
}

/// Names from MiniDebugInfo (`.gnu_debugdata`), for a binary without a
/// debug file: tried after the binary's own symbols, whose `.dynsym` names
/// what it exports, so they name the rest.
fn add_minidebuginfo(object: &mut ElfObject, parsed: &object::File<'_>, path: &Path) {
    use object::{Object, ObjectSection};
    let Some(compressed) = parsed
        .section_by_name(".gnu_debugdata")
        .and_then(|s| s.data().ok())
    else {
        return;
    };
    let image = match elf::minidebuginfo::decompress(compressed) {
        Ok(image) => image,
        Err(e) => {
            tracing::debug!("{}: {e}", path.display());
            return;
        }
    };
    let data: FileBytes = Arc::new(image);
    let _ = elf::guard(|| {
        let mini = object::File::parse((*data).as_ref())?;
        let symbols =
            elf::ElfSymbols::from_object(&mini, &data).from_source(NameSource::MiniDebugInfo);
        if !symbols.is_empty() {
            object.push_resolver(Box::new(symbols));
        }
        Ok(())
    });
}

/// The frames of one address, innermost first; never empty.
#[derive(Debug, Clone)]
pub struct Symbolized {
    pub frames: Vec<Frame>,
    /// Whether a resolver named it (false for `libfoo.so+0x1234` frames).
    pub resolved: bool,
}

impl Symbolized {
    fn unresolved(name: String) -> Self {
        Symbolized {
            frames: vec![Frame::named(name)],
            resolved: false,
        }
    }
}

/// The frame of an address no symbol source names: `DSO+0xSTART`, START
/// being the start of the function from the FDE covering the address, so
/// every sample in one unnamed function adds up under one name (and a later
/// symbolization can name it by that address). The frame's file is the
/// object's path, its line unknown: in pprof, a function whose filename is
/// a binary and that has no line is one grouped this way. Without an FDE
/// the address itself is the name.
fn cfi_grouped(
    name: &str,
    path: Option<&Path>,
    object: Option<&ElfObject>,
    address: u64,
) -> Symbolized {
    match object.and_then(|o| o.function_start(address)) {
        Some(start) => {
            let mut frame =
                Frame::named(format!("{name}+{start:#x}")).from_source(NameSource::CfiGrouped);
            frame.file = path.map(|p| p.display().to_string());
            Symbolized {
                frames: vec![frame],
                resolved: false,
            }
        }
        None => Symbolized::unresolved(format!("{name}+{address:#x}")),
    }
}

pub struct Symbolizer {
    objects: HashMap<ObjectId, Option<Arc<ElfObject>>>,
    by_build_id: HashMap<Vec<u8>, Arc<ElfObject>>,
    kallsyms: PathBuf,
    kernel: Option<Result<KernelSymbols, String>>,
    /// The vDSO's symbols (its lowest address, and its names), read from
    /// the agent's own on first use.
    vdso: Option<Option<(u64, elf::ElfSymbols)>>,
    /// Every file this symbolizer mapped (binaries, debug files), to hand
    /// their resident pages back between windows.
    maps: Vec<Weak<memmap2::Mmap>>,
    /// One line per object or source that failed, for the run's report.
    pub problems: Vec<String>,
    pub stats: SymbolizerStats,
    /// Debug files by build id from debuginfod servers (`DEBUGINFOD_URLS`).
    pub debuginfod: Option<Arc<debuginfod::Debuginfod>>,
    /// How long a lookup may wait for a debug file being downloaded: until
    /// this instant (the end of `record`), or not at all (None: the
    /// continuous agent, which names it in a later window).
    pub fetch_deadline: Option<std::time::Instant>,
    /// Objects read while their debug file was downloading, to read again
    /// once it is there: (object, build id).
    awaiting: Vec<(ObjectId, Vec<u8>)>,
    /// Objects whose debug file was already asked for by `prefetch`.
    prefetched: std::collections::HashSet<ObjectId>,
    /// The runtimes asked for their own tables of each object (Go's
    /// pclntab): see `with_runtimes`.
    runtimes: Runtimes,
}

impl Default for Symbolizer {
    /// The machine's kallsyms, and debuginfod when `DEBUGINFOD_URLS` is
    /// set (elfutils' variables, see `debuginfod`).
    fn default() -> Self {
        let mut symbolizer = Self::new("/proc/kallsyms");
        symbolizer.debuginfod = debuginfod::global();
        symbolizer
    }
}

impl Symbolizer {
    pub fn new(kallsyms: impl Into<PathBuf>) -> Self {
        Symbolizer {
            objects: HashMap::new(),
            by_build_id: HashMap::new(),
            kallsyms: kallsyms.into(),
            kernel: None,
            vdso: None,
            maps: Vec::new(),
            problems: Vec::new(),
            stats: SymbolizerStats::default(),
            debuginfod: None,
            fetch_deadline: None,
            awaiting: Vec::new(),
            prefetched: Default::default(),
            runtimes: &[],
        }
    }

    /// The same symbolizer, asking `runtimes` (profiler-runtimes' list)
    /// for their own tables of every object it parses from now on.
    pub fn with_runtimes(mut self, runtimes: Runtimes) -> Self {
        self.runtimes = runtimes;
        self
    }

    /// Asks the debuginfod servers, in the background, for the debug files
    /// of `process`'s stripped objects, so that they are there (or on their
    /// way) by the time its samples are symbolized. Only the ELF headers are
    /// read here; nothing when no server is configured.
    pub fn prefetch(&mut self, process: &Process) {
        let Some(client) = self.debuginfod.clone() else {
            return;
        };
        if self.prefetched.len() > 100_000 {
            self.prefetched.clear();
        }
        for file in process.mappings.iter().filter_map(|m| m.object.as_deref()) {
            if self.objects.contains_key(&file.id) || !self.prefetched.insert(file.id) {
                continue;
            }
            let Some(data) = file.file.as_ref().ok().and_then(|f| map_file(f).ok()) else {
                continue;
            };
            let _ = elf::guard(|| {
                let parsed = object::File::parse(&*data)?;
                // Only the build-id path is looked at locally: a debuglink's
                // CRC check reads the whole file, too slow for the thread
                // that drains samples (an object with only a debuglinked
                // debug file may be asked for needlessly; reading it later
                // prefers the local file all the same).
                if wants_debuginfod(&parsed)
                    && let Some(id) = object::Object::build_id(&parsed)?
                    && dwarf::find_by_build_id(&parsed, file).is_none()
                {
                    client.lookup(id, None);
                }
                Ok(())
            });
        }
    }

    /// Forgets the objects whose debug file has finished downloading since
    /// they were read, so the next lookup reads them again with it. Returns
    /// how many were forgotten.
    pub fn refresh_fetched(&mut self) -> usize {
        let Some(client) = self.debuginfod.clone() else {
            return 0;
        };
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.awaiting)
            .into_iter()
            .partition(|(_, build_id)| !client.is_pending(build_id));
        self.awaiting = waiting;
        for (id, build_id) in &done {
            self.objects.remove(id);
            self.by_build_id.remove(build_id);
        }
        done.len()
    }

    /// Drops the parsed objects `keep` rejects (no process maps them any
    /// more), and build-id entries nothing else holds.
    pub fn retain_objects(&mut self, keep: impl Fn(&ObjectId) -> bool) {
        self.objects.retain(|id, _| keep(id));
        self.by_build_id
            .retain(|_, object| Arc::strong_count(object) > 1);
    }

    /// Drops the resident pages of every mapped binary and debug file from
    /// this process (they stay in the page cache; the next lookup faults
    /// the few it needs back in). A window touches scattered pages of big
    /// binaries' symbol tables, pclntabs and debug sections; without this
    /// they stay counted in the agent's RSS though it is done with them.
    /// Returns how many mappings were advised.
    pub fn release_mapped_pages(&mut self) -> usize {
        self.maps.retain(|map| map.strong_count() > 0);
        let mut advised = 0;
        for map in self.maps.iter().filter_map(Weak::upgrade) {
            // SAFETY: a read-only private mapping of a file, never written
            // through: MADV_DONTNEED only unmaps its pages, and later reads
            // see the file's contents again (the same bytes).
            if unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) }.is_ok() {
                advised += 1;
            }
        }
        advised
    }

    /// Number of parsed (or failed) objects held.
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// The parsed object behind `file`, parsing it on first use.
    pub fn object(&mut self, file: &ObjectFile) -> Option<Arc<ElfObject>> {
        if let Some(parsed) = self.objects.get(&file.id) {
            return parsed.clone();
        }
        let parsed = match self.parse(file) {
            Ok(object) => {
                self.stats.objects_parsed += 1;
                Some(object)
            }
            Err(reason) => {
                self.stats.objects_failed += 1;
                self.problems
                    .push(format!("{}: {reason}", file.path.display()));
                None
            }
        };
        self.objects.insert(file.id, parsed.clone());
        parsed
    }

    fn parse(&mut self, file: &ObjectFile) -> Result<Arc<ElfObject>, String> {
        let handle = file
            .file
            .as_ref()
            .map_err(|e| format!("unreadable ({e})"))?;
        let data = Arc::new(map_file(handle)?);
        self.maps.push(Arc::downgrade(&data));
        let bytes: FileBytes = data.clone();
        elf::guard(|| {
            let parsed = object::File::parse(&**data)?;
            let build_id = object::Object::build_id(&parsed).ok().flatten();
            if let Some(shared) = build_id.and_then(|id| self.by_build_id.get(id)) {
                return Ok(shared.clone());
            }
            let mut object = ElfObject::from_file(&parsed, &bytes, Some(&data), self.runtimes);
            let fetch = self.debuginfod.as_deref().map(|d| (d, self.fetch_deadline));
            let awaiting = add_debug_info(&mut object, &parsed, &data, file, &mut self.maps, fetch);
            if awaiting && let Some(build_id) = &object.build_id {
                self.awaiting.push((file.id, build_id.clone()));
            }

            let object = Arc::new(object);
            if let Some(id) = &object.build_id {
                self.by_build_id.insert(id.clone(), object.clone());
            }
            Ok(object)
        })
        .map_err(|e| e.to_string())
    }

    /// Symbolizes a user-space address of `process`. `lookup_pc` is the
    /// address to look up (a return address minus one for callers, see
    /// `unwind`); the frame name of an unknown address keeps `pc`.
    pub fn user(&mut self, process: Option<&Process>, pc: u64, lookup_pc: u64) -> Symbolized {
        let mapping = process.and_then(|p| p.mapping_for(pc));
        // A return address at the very start of a mapping: one byte back is
        // in the mapping below (or nowhere); look up the address itself.
        let lookup_pc = match mapping {
            Some(mapping) if !mapping.contains(lookup_pc) => pc,
            _ => lookup_pc,
        };
        let result = match mapping {
            None => Symbolized::unresolved(format!("[unknown] {pc:#x}")),
            Some(mapping) if mapping.object.is_none() && mapping.name == "[vdso]" => {
                self.in_vdso(mapping, lookup_pc)
            }
            Some(mapping) if mapping.path.is_none() && process.is_some_and(|p| p.jit.is_some()) => {
                self.in_jit(process.and_then(|p| p.jit.as_deref()), mapping, lookup_pc)
            }
            Some(mapping) => self.in_mapping(mapping, pc, lookup_pc),
        };
        if result.resolved {
            self.stats.user_resolved += 1;
        } else {
            self.stats.user_unresolved += 1;
        }
        result
    }

    /// A frame in the vDSO (`clock_gettime` and friends): the kernel maps
    /// the same image into every process, so the agent's own names it.
    fn in_vdso(&mut self, mapping: &Mapping, lookup_pc: u64) -> Symbolized {
        let offset = lookup_pc.wrapping_sub(mapping.start);
        let vdso = self.vdso.get_or_insert_with(|| {
            let image: FileBytes = Arc::new(crate::process::vdso_image()?);
            elf::guard(|| {
                let file = object::File::parse((*image).as_ref())?;
                use object::{Object, ObjectSegment};
                let base = file.segments().map(|s| s.address()).min().unwrap_or(0);
                let symbols = elf::ElfSymbols::from_object(&file, &image);
                Ok((base, symbols.from_source(NameSource::Vdso)))
            })
            .ok()
        });
        let named = vdso
            .as_ref()
            .and_then(|(base, symbols)| Resolver::resolve(symbols, base + offset));
        match named {
            Some(frames) if !frames.is_empty() => Symbolized {
                frames,
                resolved: true,
            },
            _ => Symbolized::unresolved(format!("[vdso]+{offset:#x}")),
        }
    }

    /// A frame in anonymous executable memory: a JIT's code, named by the
    /// runtime's perf map when it writes one.
    fn in_jit(
        &mut self,
        jit: Option<&crate::process::JitMap>,
        mapping: &Mapping,
        lookup_pc: u64,
    ) -> Symbolized {
        let Some(jit) = jit else {
            return Symbolized::unresolved(format!("{}+{lookup_pc:#x}", mapping.name));
        };
        let name = jit.lookup(lookup_pc);
        if let Some(problem) = jit.take_problem() {
            self.problems.push(problem);
        }
        match name {
            Some(name) => {
                self.stats.jit_resolved += 1;
                Symbolized {
                    frames: vec![Frame::named(name).from_source(NameSource::PerfMap)],
                    resolved: true,
                }
            }
            None => Symbolized::unresolved(format!("[jit] {lookup_pc:#x}")),
        }
    }

    fn in_mapping(&mut self, mapping: &Mapping, pc: u64, lookup_pc: u64) -> Symbolized {
        let offset = mapping.file_offset(lookup_pc);
        let Some(object) = mapping.object.as_ref().and_then(|file| self.object(file)) else {
            return Symbolized::unresolved(format!("{}+{offset:#x}", mapping.name));
        };
        let Some(mut address) = object.offset_to_address(offset) else {
            return Symbolized::unresolved(format!("{}+{offset:#x}", mapping.name));
        };
        // Go presents some PCs that are function entries as return
        // addresses (before Go 1.21, the goroutine's saved PC at a cgo
        // call was `runtime.systemstack_switch` itself); like Go's own
        // traceback, do not step back from a function's entry.
        if lookup_pc != pc
            && let Some(runtime) = object.runtime_symbols()
            && let Some(entry) = object
                .offset_to_address(mapping.file_offset(pc))
                .filter(|&a| runtime.function_entry(a) == Some(a))
        {
            address = entry;
        }
        match object.resolve(address) {
            Some(frames) if !frames.is_empty() => Symbolized {
                frames,
                resolved: true,
            },
            _ => cfi_grouped(
                &mapping.name,
                mapping.path.as_deref(),
                Some(&object),
                address,
            ),
        }
    }

    /// Symbolizes `address`, an ELF virtual address of the object `file`.
    pub fn object_address(&mut self, file: &ObjectFile, address: u64) -> Symbolized {
        let object = self.object(file);
        match object.as_ref().and_then(|object| object.resolve(address)) {
            Some(frames) if !frames.is_empty() => Symbolized {
                frames,
                resolved: true,
            },
            _ => {
                let name = file.path.file_name().map_or_else(
                    || file.path.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                );
                cfi_grouped(&name, Some(&file.path), object.as_deref(), address)
            }
        }
    }

    /// The kernel's symbols, read from `/proc/kallsyms` on first use.
    fn kernel_symbols(&mut self) -> Option<&KernelSymbols> {
        let kallsyms = &self.kallsyms;
        let problems = &mut self.problems;
        self.kernel
            .get_or_insert_with(|| {
                KernelSymbols::load(kallsyms).map_err(|e| {
                    problems.push(e.to_string());
                    e.to_string()
                })
            })
            .as_ref()
            .ok()
    }

    /// The kernel function at `lookup_pc`, uncounted in the statistics
    /// (for looking at a stack, not symbolizing it).
    pub fn kernel_function(&mut self, lookup_pc: u64) -> Option<&str> {
        self.kernel_symbols()?.lookup(lookup_pc)
    }

    /// Whether a kernel address is in the scheduler's text (see
    /// `KernelSymbols::in_scheduler`).
    pub fn kernel_in_scheduler(&mut self, address: u64) -> bool {
        self.kernel_symbols()
            .is_some_and(|s| s.in_scheduler(address))
    }

    /// Symbolizes a kernel address through `/proc/kallsyms` (read once).
    pub fn kernel(&mut self, lookup_pc: u64) -> Symbolized {
        let result = match self.kernel_symbols().and_then(|s| s.lookup(lookup_pc)) {
            Some(name) => Symbolized {
                frames: vec![Frame::named(name).from_source(NameSource::Kallsyms)],
                resolved: true,
            },
            None => Symbolized::unresolved(format!("[kernel] {lookup_pc:#x}")),
        };
        if result.resolved {
            self.stats.kernel_resolved += 1;
        } else {
            self.stats.kernel_unresolved += 1;
        }
        result
    }

    /// The GNU build id of a mapped object, as lowercase hex, once parsed.
    /// For a Go binary without a GNU build id (Go's own linker writes
    /// none), its Go build id, as `go tool buildid` prints it.
    pub fn build_id(&self, id: &ObjectId) -> Option<String> {
        let object = self.objects.get(id)?.as_ref()?;
        match &object.build_id {
            Some(bytes) => Some(bytes.iter().map(|b| format!("{b:02x}")).collect()),
            None => object.runtime_symbols()?.build_id(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::process::{Mapping, ObjectFile, ObjectId, Process};

    fn process_mapping(path: &Path, inode: u64) -> Process {
        let object = ObjectFile {
            id: ObjectId { dev: (0, 1), inode },
            path: path.to_path_buf(),
            root: std::path::PathBuf::from("/"),
            root_dir: None,
            file: File::open(path).map_err(|e| e.to_string()),
            go_binary: Default::default(),
        };
        Process::new(
            7,
            "victim",
            vec![Mapping {
                start: 0x10000,
                end: 0x20000,
                offset: 0x1000,
                name: path.file_name().unwrap().to_string_lossy().into_owned(),
                path: Some(path.to_path_buf()),
                object: Some(Arc::new(object)),
            }],
        )
    }

    #[test]
    fn malformed_binary_leaves_frames_unsymbolized_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libgarbage.so");
        std::fs::write(&path, b"\x7fELF this is not really an ELF file").unwrap();
        let process = process_mapping(&path, 1);
        let mut symbolizer = Symbolizer::new(dir.path().join("no-kallsyms"));
        let result = symbolizer.user(Some(&process), 0x10234, 0x10234);
        assert!(!result.resolved);
        assert_eq!(result.frames[0].function, "libgarbage.so+0x1234");
        assert_eq!(symbolizer.stats.objects_failed, 1);
        assert_eq!(symbolizer.stats.user_unresolved, 1);
        assert!(
            symbolizer.problems[0].contains("libgarbage.so"),
            "{:?}",
            symbolizer.problems
        );
        // Parsed (and failed) once, not once per address.
        symbolizer.user(Some(&process), 0x10300, 0x10300);
        assert_eq!(symbolizer.stats.objects_failed, 1);
    }

    #[test]
    fn unreadable_binary_and_unmapped_addresses_keep_their_address() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone");
        let process = process_mapping(&path, 2);
        let mut symbolizer = Symbolizer::new(dir.path().join("no-kallsyms"));
        let result = symbolizer.user(Some(&process), 0x10010, 0x10010);
        assert_eq!(result.frames[0].function, "gone+0x1010");
        let result = symbolizer.user(Some(&process), 0x90000, 0x90000);
        assert_eq!(result.frames[0].function, "[unknown] 0x90000");
        // A return address at the mapping's first byte: one byte back is
        // outside it (this panicked on an overflow, found by the bench's
        // system-wide runs).
        let result = symbolizer.user(Some(&process), 0x10000, 0xffff);
        assert_eq!(result.frames[0].function, "gone+0x1000");
        let result = symbolizer.kernel(0xffffffff81000000);
        assert!(!result.resolved);
        assert!(
            symbolizer
                .problems
                .iter()
                .any(|p| p.contains("no-kallsyms"))
        );
    }

    #[test]
    fn truncated_and_corrupted_elf_never_panics() {
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Parsing runs inside catch_unwind: a panic becomes this error,
        // which is what must never happen.
        let parse = |bytes: &[u8]| {
            let parsed = ElfObject::parse(bytes);
            assert!(
                !matches!(parsed, Err(ElfError::Panicked)),
                "the ELF parser panicked on {} bytes",
                bytes.len()
            );
            parsed
        };
        for length in [0, 4, 16, 64, 100, 1000, 4096, data.len() / 2] {
            let _ = parse(&data[..length.min(data.len())]);
        }
        // Flip bytes across the headers and tables, deterministically.
        let mut corrupted = data[..data.len().min(1 << 20)].to_vec();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let index = (seed as usize) % corrupted.len().min(8192);
            corrupted[index] ^= (seed >> 32) as u8 | 1;
            if let Ok(object) = parse(&corrupted) {
                let _ = object.resolve(0x1000);
                let _ = object.offset_to_address(0x1000);
            }
        }
    }
}

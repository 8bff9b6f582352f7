//! Processes as the profiler sees them: name, executable mappings, and an
//! open handle on every mapped object file.
//!
//! A process is captured the first time one of its samples arrives, and the
//! object files are opened then (through `/proc/PID/root`, so processes in
//! other mount namespaces work, or `/proc/PID/map_files` for deleted files).
//! Holding the handle means a process that exits mid-run is still
//! symbolized at the end.

pub mod contained;
mod container;
mod jit;
mod maps;
mod object;

pub use container::{ContainerInfo, ContainerRuntime, cgroup_paths, container_of, parse_cgroup};
pub use jit::{JitMap, namespace_pid};
pub use maps::{Backing, MapEntry, parse_maps};
pub use object::{ObjectFile, ObjectId};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An executable mapping of a process.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// Short name for unsymbolized frames: `libc.so.6`, `[vdso]`, `[anon]`.
    pub name: String,
    /// The path as the process sees it, when file-backed.
    pub path: Option<PathBuf>,
    /// The opened object, when file-backed and readable.
    pub object: Option<Arc<ObjectFile>>,
}

impl Mapping {
    pub fn contains(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }

    /// The file offset of a runtime address inside this mapping (wrapping,
    /// never a panic, for an address outside it: the offset then matches
    /// no segment).
    pub fn file_offset(&self, address: u64) -> u64 {
        address.wrapping_sub(self.start).wrapping_add(self.offset)
    }
}

/// A process captured while it ran.
#[derive(Debug)]
pub struct Process {
    pub pid: u32,
    /// `/proc/PID/comm` when captured (empty if the process was already gone).
    pub name: String,
    /// Executable mappings, sorted by start address.
    pub mappings: Vec<Mapping>,
    /// False when `/proc/PID` could not be read at capture time.
    pub captured: bool,
    /// Its JIT symbol map (`/tmp/perf-PID.map`), when it has anonymous
    /// executable mappings.
    pub jit: Option<Arc<JitMap>>,
    maps_read_at: Instant,
    /// When a stack seen before last had its addresses checked against
    /// the mappings (see [`ProcessTable::observe_stack`]).
    maps_checked_at: Instant,
    /// How long after `maps_read_at` the maps may be read again: doubled
    /// by every re-read that found them unchanged, reset by one that did
    /// not.
    refresh_after: Duration,
    /// The same wait for re-reads asked for by a stack whose leaf is
    /// outside every mapping, kept apart from `refresh_after`: a leaf is
    /// code running now, so new code (a dlopen) shows first there, while
    /// garbage callers (a walk through a bad frame pointer, an exception
    /// handler rewriting its frames) back `refresh_after` off to seconds.
    /// It grows only when leaves outside every mapping keep finding
    /// nothing new.
    leaf_refresh_after: Duration,
}

impl Process {
    /// A process known from elsewhere than /proc (tests, replays).
    pub fn new(pid: u32, name: impl Into<String>, mut mappings: Vec<Mapping>) -> Self {
        mappings.sort_by_key(|m| m.start);
        Process {
            pid,
            name: name.into(),
            mappings,
            captured: true,
            jit: None,
            maps_read_at: Instant::now(),
            maps_checked_at: Instant::now(),
            refresh_after: MAPS_REFRESH_INTERVAL,
            leaf_refresh_after: MAPS_REFRESH_INTERVAL,
        }
    }

    pub fn mapping_for(&self, address: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        mapping.contains(address).then_some(mapping)
    }
}

/// Every process seen during a run, and the objects they map.
pub struct ProcessTable {
    proc_root: PathBuf,
    processes: HashMap<u32, Process>,
    objects: HashMap<ObjectId, Arc<ObjectFile>>,
    /// The buffer `/proc` files are read into, kept between reads.
    scratch: Vec<u8>,
}

/// How often the maps of one process may be re-read when a sample has an
/// address outside every known mapping (code loaded by dlopen, a JIT).
/// Short, because until then the stacks in that code are cut (its unwind
/// table loads after the re-read); a read costs well under a millisecond,
/// so this bounds the cost at a few per second per process.
const MAPS_REFRESH_INTERVAL: Duration = Duration::from_millis(200);

/// The longest wait between re-reads of maps that keep coming back
/// unchanged. An address outside every mapping is not always new code: a
/// stack walked through a garbage frame pointer ends in such addresses
/// (0xc, a stack or heap address) on every sample, and re-reading the
/// same maps five times a second for it was a steady cost (the agent's
/// own stacks did it).
const MAPS_REFRESH_MAX: Duration = Duration::from_secs(2);

/// Whether two captures map the same code at the same places.
fn same_mappings(a: &[Mapping], b: &[Mapping]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            (a.start, a.end, a.offset, &a.path) == (b.start, b.end, b.offset, &b.path)
        })
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ProcessTable {
    /// A table reading processes under `proc_root` (normally `/proc`).
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        ProcessTable {
            proc_root: proc_root.into(),
            processes: HashMap::new(),
            objects: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.processes.get(&pid)
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    /// Every process captured so far.
    pub fn iter(&self) -> impl Iterator<Item = &Process> {
        self.processes.values()
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// Identities of the objects the known processes map.
    pub fn object_ids(&self) -> std::collections::HashSet<ObjectId> {
        self.objects.keys().copied().collect()
    }

    /// Distinct object files opened so far.
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// Forgets the processes `keep` rejects (a continuous run calls this
    /// with "still alive" once their last window is exported), and closes
    /// the objects no remaining process maps. Returns how many processes
    /// were forgotten. Without it a long run's table only grows.
    pub fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) -> usize {
        let before = self.processes.len();
        self.processes.retain(|&pid, _| keep(pid));
        // An object still mapped by a process has a second reference.
        self.objects
            .retain(|_, object| Arc::strong_count(object) > 1);
        before - self.processes.len()
    }

    /// Captures `pid` on first sight; later, re-reads its maps when one of
    /// `user_pcs` is outside every known mapping (at most once every
    /// `MAPS_REFRESH_INTERVAL`, less often while re-reads find nothing
    /// new; a stack whose leaf is outside has a wait of its own, which
    /// garbage callers do not lengthen). Returns true when it (re)read the
    /// process's mappings.
    pub fn observe(&mut self, pid: u32, user_pcs: &[u64]) -> bool {
        self.observe_stack(pid, user_pcs, true, Instant::now(), None)
    }

    /// [`observe`](Self::observe) for a sampled stack, `new` when the
    /// recording had not seen it before. A stack seen before had its
    /// addresses checked when it was new, so the addresses of such stacks
    /// are checked at most once per interval per process: the check is a
    /// lookup per frame, and at thousands of samples a second it was a
    /// tenth of the agent's time. An address still unmapped then (the
    /// stack was new while a re-read was not yet allowed) is found when a
    /// later check samples one of its stacks: soon for code that runs
    /// often, which is the code a profile is about.
    ///
    /// `now` is the caller's: at thousands of samples a second, reading
    /// the clock twice per sample here was a twentieth of the agent's
    /// time, and one reading serves a batch of samples.
    ///
    /// `leader_comm` is the process's name when the caller has it: a
    /// sample of the main thread (tid = pid) carries its `task->comm`,
    /// which is what `/proc/PID/comm` reads. Given, the capture opens
    /// one file fewer: with a thousand processes on the node, the
    /// captures of those first sampled were a quarter of the agent's
    /// time, and opening a `/proc` file is as dear as reading a small one.
    pub fn observe_stack(
        &mut self,
        pid: u32,
        user_pcs: &[u64],
        new: bool,
        now: Instant,
        leader_comm: Option<&[u8]>,
    ) -> bool {
        // Which wait allowed the re-read: the leaf's or the callers'.
        let mut for_leaf = false;
        let refresh = match self.processes.get_mut(&pid) {
            None => true,
            Some(process) => {
                let since_read = now.saturating_duration_since(process.maps_read_at);
                let leaf_unmapped = || {
                    profiler_common::runtimes::native_pcs(user_pcs)
                        .next()
                        .is_some_and(|leaf| process.mapping_for(leaf).is_none())
                };
                if process.captured && since_read >= process.leaf_refresh_after && leaf_unmapped() {
                    for_leaf = true;
                    true
                } else {
                    process.captured
                        && (new
                            || now.saturating_duration_since(process.maps_checked_at)
                                >= MAPS_REFRESH_INTERVAL)
                        && since_read >= process.refresh_after
                        && {
                            if !new {
                                process.maps_checked_at = now;
                            }
                            // The callers: the leaf has its own wait.
                            profiler_common::runtimes::native_pcs(user_pcs)
                                .skip(1)
                                .any(|pc| process.mapping_for(pc).is_none())
                        }
                }
            }
        };
        if !refresh {
            return false;
        }
        let process = self.capture(pid, leader_comm);
        let captured = process.captured;
        match self.processes.get_mut(&pid) {
            // Keep what we knew if the process is gone by now.
            Some(old) if !captured => {
                old.maps_read_at = Instant::now();
                false
            }
            Some(old) => {
                let unchanged = same_mappings(&old.mappings, &process.mappings);
                let backed_off = |wait: Duration| (wait * 2).min(MAPS_REFRESH_MAX);
                let (refresh_after, leaf_refresh_after) = match (unchanged, for_leaf) {
                    (false, _) => (MAPS_REFRESH_INTERVAL, MAPS_REFRESH_INTERVAL),
                    (true, false) => (backed_off(old.refresh_after), old.leaf_refresh_after),
                    (true, true) => (old.refresh_after, backed_off(old.leaf_refresh_after)),
                };
                *old = process;
                old.refresh_after = refresh_after;
                old.leaf_refresh_after = leaf_refresh_after;
                // Registered again even when unchanged: a registry that
                // could not read the process the first time (an
                // interpreter with no threads yet) gets another try, at
                // the re-reads' (backed-off) pace.
                true
            }
            None => {
                self.processes.insert(pid, process);
                captured
            }
        }
    }

    fn capture(&mut self, pid: u32, leader_comm: Option<&[u8]>) -> Process {
        let dir = self.proc_root.join(pid.to_string());
        let mut scratch = std::mem::take(&mut self.scratch);
        let name = match leader_comm {
            Some(comm) => crate::nul_padded(comm).into_owned(),
            None => read_proc(&dir.join("comm"), &mut scratch)
                .map(|()| {
                    let name = scratch.strip_suffix(b"\n").unwrap_or(&scratch);
                    String::from_utf8_lossy(name).into_owned()
                })
                .unwrap_or_default(),
        };
        let captured = read_proc(&dir.join("maps"), &mut scratch).is_ok();
        // The process's root, opened for its first new object only.
        let mut root_dir = None;
        let mut mappings: Vec<Mapping> = if captured {
            maps::parse_executable_maps(&scratch)
                .map(|entry| self.mapping(&dir, &mut root_dir, &entry))
                .collect()
        } else {
            Vec::new()
        };
        if scratch.capacity() <= PROC_BUFFER_KEPT {
            self.scratch = scratch;
        }
        mappings.sort_by_key(|m| m.start);
        // Code in anonymous executable memory is a JIT's: its names, if
        // the runtime publishes them, are in the perf map under the pid
        // the process knows itself by (its own pid namespace's).
        let jit = mappings
            .iter()
            .any(|m| m.path.is_none() && m.name == "[anon]")
            .then(|| {
                let root = root_dir
                    .get_or_insert_with(|| {
                        contained::Root::open(&dir.join("root")).ok().map(Arc::new)
                    })
                    .clone()?;
                let nspid = std::fs::read_to_string(dir.join("status"))
                    .ok()
                    .and_then(|status| namespace_pid(&status))
                    .unwrap_or(pid);
                Some(Arc::new(JitMap::new(root, pid, nspid)))
            })
            .flatten();
        Process {
            pid,
            name,
            mappings,
            captured,
            jit,
            maps_read_at: Instant::now(),
            maps_checked_at: Instant::now(),
            refresh_after: MAPS_REFRESH_INTERVAL,
            leaf_refresh_after: MAPS_REFRESH_INTERVAL,
        }
    }

    fn mapping(
        &mut self,
        proc_dir: &Path,
        root_dir: &mut Option<Option<Arc<contained::Root>>>,
        entry: &MapEntry,
    ) -> Mapping {
        let path = match &entry.backing {
            Backing::File(path) | Backing::Deleted(path) => Some(path.clone()),
            _ => None,
        };
        let object = path.as_ref().map(|path| {
            let id = ObjectId {
                dev: entry.dev,
                inode: entry.inode,
            };
            self.objects
                .entry(id)
                .or_insert_with(|| {
                    let root = root_dir
                        .get_or_insert_with(|| {
                            contained::Root::open(&proc_dir.join("root"))
                                .ok()
                                .map(Arc::new)
                        })
                        .clone();
                    Arc::new(ObjectFile::open(proc_dir, root, entry, path, id))
                })
                .clone()
        });
        Mapping {
            start: entry.start,
            end: entry.end,
            offset: entry.offset,
            name: entry.display_name(),
            path,
            object,
        }
    }
}

/// What one `read` of a `/proc` file asks for: a small process's whole
/// maps.
const PROC_READ: usize = 16 * 1024;

/// A read buffer grown past this (a process with tens of thousands of
/// mappings) is not kept for the next process.
const PROC_BUFFER_KEPT: usize = 1 << 20;

/// Reads a `/proc` file whole into `buf`. Not `std::fs::read_to_string`:
/// that asks `statx` for a size `/proc` does not have, then reads in
/// steps growing from 32 bytes, each of which the kernel formats again
/// from where the last stopped (nine reads for a 3.7 KiB maps file).
/// Here most files take one read and the one that finds the end; with
/// thousands of processes first seen, these reads were the agent's
/// largest cost after the samples themselves. Each read asks for
/// `PROC_READ` bytes, so a buffer grown by one huge file costs nothing
/// more for the small ones after it.
fn read_proc(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    buf.clear();
    loop {
        let len = buf.len();
        buf.resize(len + PROC_READ, 0);
        let read = file.read(&mut buf[len..]);
        buf.truncate(len + *read.as_ref().unwrap_or(&0));
        match read {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The vDSO of this process: the same image the kernel maps into every
/// process of this architecture, whose CFI exists only in memory.
pub fn vdso_image() -> Option<Vec<u8>> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let entry = parse_maps(&maps)
        .into_iter()
        .find(|e| e.start == base && e.display_name() == "[vdso]")?;
    let len = usize::try_from(entry.end - entry.start).ok()?;
    // SAFETY: [base, base + len) is this process's vDSO mapping, readable
    // for the life of the process.
    let bytes = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
    Some(bytes.to_vec())
}

#[cfg(test)]
mod retain_tests {
    use super::*;

    /// A maps file larger than one read, with a path that is not UTF-8:
    /// every executable mapping is captured (the odd path byte for byte),
    /// and the comm keeps its spaces.
    #[test]
    fn a_large_maps_file_with_an_odd_path_is_captured_whole() {
        use std::os::unix::ffi::OsStrExt;
        let proc_root = tempfile::tempdir().unwrap();
        let dir = proc_root.path().join("11");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("comm"), "my app \n").unwrap();
        let mut maps = Vec::new();
        // Data lines past one read's worth, then code.
        for i in 0..600u64 {
            let start = 0x1000_0000 + i * 0x1000;
            maps.extend_from_slice(
                format!("{start:x}-{:x} rw-p 00000000 00:00 0 \n", start + 0x1000).as_bytes(),
            );
        }
        maps.extend_from_slice(b"40000000-40001000 r-xp 00000000 08:01 7 /opt/\xff\xfe.so\n");
        maps.extend_from_slice(b"40002000-40003000 r-xp 00000000 08:01 8 /opt/b c.so\n");
        assert!(maps.len() > PROC_READ);
        std::fs::write(dir.join("maps"), &maps).unwrap();
        let mut table = ProcessTable::new(proc_root.path());
        assert!(table.observe(11, &[]));
        let process = table.get(11).unwrap();
        assert_eq!(process.name, "my app ");
        let paths: Vec<_> = process
            .mappings
            .iter()
            .map(|m| m.path.clone().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                PathBuf::from(std::ffi::OsStr::from_bytes(b"/opt/\xff\xfe.so")),
                PathBuf::from("/opt/b c.so")
            ]
        );
    }

    /// A main thread's sample names its process: `/proc/PID/comm` is not
    /// read (here it says something else, to tell the two apart), and the
    /// NUL padding of `task->comm` is not part of the name. Without the
    /// name, the file is read.
    #[test]
    fn the_main_threads_comm_names_the_process_without_reading_proc() {
        let proc_root = tempfile::tempdir().unwrap();
        for pid in [12, 13] {
            let dir = proc_root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("comm"), "from proc\n").unwrap();
            std::fs::write(dir.join("maps"), b"").unwrap();
        }
        let mut table = ProcessTable::new(proc_root.path());
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"server");
        assert!(table.observe_stack(12, &[], true, Instant::now(), Some(&comm)));
        assert_eq!(table.get(12).unwrap().name, "server");
        assert!(table.observe_stack(13, &[], true, Instant::now(), None));
        assert_eq!(table.get(13).unwrap().name, "from proc");
    }

    /// Maps re-read for an address outside them: a re-read that finds them
    /// unchanged is not reported and doubles the wait before the next; one
    /// that finds new code is reported and resets it.
    #[test]
    fn unchanged_maps_are_read_less_often_and_new_code_is_found() {
        let proc_root = tempfile::tempdir().unwrap();
        let binary = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(binary.path(), b"not an ELF file, only opened").unwrap();
        let dir = proc_root.path().join("10");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("comm"), "app\n").unwrap();
        let line = |start: u64, inode: u32| {
            format!(
                "{start:08x}-{:08x} r-xp 00000000 08:01 {inode} {}\n",
                start + 0x1000,
                binary.path().display()
            )
        };
        std::fs::write(dir.join("maps"), line(0x400000, 1)).unwrap();
        let mut table = ProcessTable::new(proc_root.path());
        assert!(table.observe(10, &[]));
        // As if the last read were long ago (no sleeping in the test).
        let age = |table: &mut ProcessTable, by: Duration| {
            let process = table.processes.get_mut(&10).unwrap();
            process.maps_read_at -= by;
            process.maps_checked_at -= by;
        };
        // A walk through a garbage frame pointer: the leaf is known code,
        // a caller is not.
        let outside = [0x400010_u64, 0xc];
        age(&mut table, MAPS_REFRESH_INTERVAL);
        assert!(
            table.observe_stack(10, &outside, true, Instant::now(), None),
            "read again"
        );
        assert_eq!(
            table.get(10).unwrap().refresh_after,
            2 * MAPS_REFRESH_INTERVAL
        );
        // Within the longer wait: not read again (a read would be
        // unchanged again and double the wait once more).
        age(&mut table, MAPS_REFRESH_INTERVAL);
        assert!(!table.observe_stack(10, &outside, true, Instant::now(), None));
        assert_eq!(
            table.get(10).unwrap().refresh_after,
            2 * MAPS_REFRESH_INTERVAL
        );
        // New code (a dlopen) running now, still within the callers' wait:
        // a leaf outside every mapping has a wait of its own, so it is
        // read at once.
        std::fs::write(dir.join("maps"), line(0x400000, 1) + &line(0x500000, 2)).unwrap();
        assert!(
            table.observe_stack(10, &[0x500010, 0x400020], true, Instant::now(), None),
            "new mapping"
        );
        let process = table.get(10).unwrap();
        assert_eq!(process.mappings.len(), 2);
        assert_eq!(process.refresh_after, MAPS_REFRESH_INTERVAL);
        assert_eq!(process.leaf_refresh_after, MAPS_REFRESH_INTERVAL);
        // A stack seen before is checked at most once per interval.
        assert!(!table.observe_stack(10, &outside, false, Instant::now(), None));
        // A leaf outside every mapping that re-reads keep not finding (code
        // in memory /proc does not show, a forged pc) backs off too, and
        // leaves the callers' wait as it was.
        age(&mut table, MAPS_REFRESH_INTERVAL);
        assert!(table.observe_stack(10, &[0xd, 0x400020], true, Instant::now(), None));
        let process = table.get(10).unwrap();
        assert_eq!(process.leaf_refresh_after, 2 * MAPS_REFRESH_INTERVAL);
        assert_eq!(process.refresh_after, MAPS_REFRESH_INTERVAL);
        age(&mut table, MAPS_REFRESH_INTERVAL);
        assert!(!table.observe_stack(10, &[0xd, 0x400020], false, Instant::now(), None));
    }

    #[test]
    fn retain_forgets_processes_and_closes_unmapped_objects() {
        let proc_root = tempfile::tempdir().unwrap();
        let binary = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(binary.path(), b"not an ELF file, only opened").unwrap();
        for (pid, inode) in [(10, 1), (11, 2)] {
            let dir = proc_root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("comm"), "app\n").unwrap();
            std::fs::write(
                dir.join("maps"),
                format!(
                    "00400000-00401000 r-xp 00000000 08:01 {inode} {}\n",
                    binary.path().display()
                ),
            )
            .unwrap();
        }
        let mut table = ProcessTable::new(proc_root.path());
        assert!(table.observe(10, &[]));
        assert!(table.observe(11, &[]));
        assert_eq!((table.len(), table.object_count()), (2, 2));
        assert_eq!(table.retain(|pid| pid == 10), 1);
        assert_eq!((table.len(), table.object_count()), (1, 1));
        assert!(table.get(10).is_some() && table.get(11).is_none());
    }
}

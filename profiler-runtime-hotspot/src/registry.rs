//! The thread that tells the BPF walker about JVMs: for each process the
//! sampler meets that maps a `libjvm.so`, it reads the VM's own
//! description of itself (VMStructs, from the process's memory: off the
//! sampling path), then the code cache's heaps and the interpreter, and
//! writes the process's `JvmProcess` (`JVM_PROCESSES`). A JVM still
//! starting (no code cache yet) is tried again a few times; one whose
//! tables cannot be read (OpenJ9, a libjvm without them) is named in one
//! log line and counted, and its samples stay native.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData};
use object::{Object, ObjectSymbol};
use profiler_common::runtimes::RUNTIME_HOTSPOT;
use profiler_common::runtimes::hotspot::JvmProcess;
use profiler_runtime::Regions;
use profiler_symbolize::process::{ObjectFile, ObjectId, Process};

use super::layout::{self, JvmLayout, LayoutError};
use super::vmstructs::{SYMBOLS, VmStructs};
use profiler_runtime::memory::ProcessMemory;
use profiler_runtime::objects::{NotRuntime, ObjectMapping, load_bias, mappings_of, segments_of};
use profiler_runtime::worker::{Handler, Worker};

/// Tries for a JVM whose VM is not up yet.
const MAX_ATTEMPTS: u32 = 20;
const RETRY: Duration = Duration::from_millis(500);

/// One registered JVM, for the symbolizer.
#[derive(Debug, Clone)]
pub struct JvmInstance {
    pub pid: u32,
    pub layout: JvmLayout,
    /// "21".
    pub major: u32,
}

/// Registered JVMs by pid.
pub type JvmProcesses = Arc<RwLock<HashMap<u32, Arc<JvmInstance>>>>;

/// What the registry did, for the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JvmStats {
    /// JVMs whose Java frames the walker reads.
    pub processes: u64,
    /// JVMs refused, with why (one line each, at most 16).
    pub refused: Vec<String>,
}

enum Command {
    Register(u32, Vec<ObjectMapping>),
    Unregister(u32),
    /// Forget the objects not in the set (no live process maps them).
    Retain(HashSet<ObjectId>),
}

/// See the module's documentation.
pub struct JvmRegistry {
    worker: Worker<Command>,
    stats: Arc<Mutex<JvmStats>>,
    processes: JvmProcesses,
    not_jvm: NotRuntime,
}

impl JvmRegistry {
    pub fn spawn(
        process_map: BpfHashMap<MapData, u32, JvmProcess>,
        regions: Regions,
    ) -> std::io::Result<Self> {
        let stats = Arc::new(Mutex::new(JvmStats::default()));
        let processes: JvmProcesses = Arc::default();
        let not_jvm = NotRuntime::default();
        let state = State {
            process_map,
            regions,
            objects: HashMap::new(),
            not_jvm: not_jvm.clone(),
            pending: HashMap::new(),
            registered: HashMap::new(),
            stats: stats.clone(),
            processes: processes.clone(),
        };
        Ok(JvmRegistry {
            worker: Worker::spawn("jvm", state)?,
            stats,
            processes,
            not_jvm,
        })
    }

    /// Reads `process`'s Java frames from now on, if it runs HotSpot.
    /// Returns at once.
    pub fn register(&self, process: &Process) {
        if self.not_jvm.covers(process) {
            return;
        }
        self.worker
            .send(Command::Register(process.pid, mappings_of(process)));
    }

    pub fn unregister(&self, pid: u32) {
        self.worker.send(Command::Unregister(pid));
    }

    /// Forgets what it read of the objects not in `keep`.
    pub fn retain_objects(&self, keep: &HashSet<ObjectId>) {
        // The thread prunes the shared set too, after any insert queued
        // before this.
        self.worker.send(Command::Retain(keep.clone()));
    }

    /// Waits until every command sent so far is done.
    pub fn flush(&self) {
        self.worker.flush();
    }

    pub fn stats(&self) -> JvmStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn processes(&self) -> JvmProcesses {
        self.processes.clone()
    }
}

/// A `libjvm.so`: its exported tables' symbols and its segments.
#[derive(Clone)]
struct JvmObject {
    symbols: HashMap<&'static str, u64>,
    segments: Vec<(u64, u64, u64)>,
}

struct State {
    process_map: BpfHashMap<MapData, u32, JvmProcess>,
    /// Where the native walker hands the walk over: the code cache.
    regions: Regions,
    /// Per object: a libjvm, None when it is not one.
    objects: HashMap<ObjectId, Option<JvmObject>>,
    /// The objects of `objects` that are no libjvm.
    not_jvm: NotRuntime,
    /// JVMs not up yet: (mapping, attempts, next try).
    pending: HashMap<u32, (ObjectMapping, JvmObject, u32, Instant)>,
    registered: HashMap<u32, ()>,
    stats: Arc<Mutex<JvmStats>>,
    processes: JvmProcesses,
}

impl Handler for State {
    type Command = Command;

    /// JVMs still starting are tried again this often.
    const IDLE: Option<Duration> = Some(RETRY);

    fn idle(&mut self) {
        self.retry_due();
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Register(pid, mappings) => {
                if self.registered.contains_key(&pid) || self.pending.contains_key(&pid) {
                    return;
                }
                let found = mappings.into_iter().find_map(|mapping| {
                    let object = self
                        .objects
                        .entry(mapping.object.id)
                        .or_insert_with(|| {
                            let read = read_object(&mapping.object);
                            if read.is_none() {
                                self.not_jvm.insert(mapping.object.id);
                            }
                            read
                        })
                        .clone()?;
                    Some((mapping, object))
                });
                if let Some((mapping, object)) = found {
                    self.attempt(pid, mapping, object, 0);
                }
            }
            Command::Retain(keep) => {
                self.objects.retain(|id, _| keep.contains(id));
                self.not_jvm.retain(&keep);
            }
            Command::Unregister(pid) => {
                self.pending.remove(&pid);
                if self.registered.remove(&pid).is_some() {
                    let _ = self.process_map.remove(&pid);
                    self.regions.clear(pid, RUNTIME_HOTSPOT);
                }
                if let Ok(mut processes) = self.processes.write() {
                    processes.remove(&pid);
                }
            }
        }
    }
}

impl State {
    /// Registers `pid`, or schedules another try while its VM starts.
    fn attempt(&mut self, pid: u32, mapping: ObjectMapping, object: JvmObject, attempts: u32) {
        match self.register(pid, &mapping, &object) {
            Ok(()) => {}
            Err(LayoutError::NotReady(why)) if attempts + 1 < MAX_ATTEMPTS => {
                tracing::debug!(pid, "JVM not up yet ({why}): trying again");
                self.pending
                    .insert(pid, (mapping, object, attempts + 1, Instant::now() + RETRY));
            }
            Err(why) => {
                let path = mapping.object.path.display().to_string();
                tracing::info!(
                    pid,
                    "no Java frames ({path}): {why}; its samples stay native"
                );
                if let Ok(mut stats) = self.stats.lock()
                    && stats.refused.len() < 16
                {
                    stats.refused.push(format!("pid {pid} ({path}): {why}"));
                }
            }
        }
    }

    fn retry_due(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, (_, _, _, at))| *at <= now)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            if let Some((mapping, object, attempts, _)) = self.pending.remove(&pid) {
                self.attempt(pid, mapping, object, attempts);
            }
        }
    }

    fn register(
        &mut self,
        pid: u32,
        mapping: &ObjectMapping,
        object: &JvmObject,
    ) -> Result<(), LayoutError> {
        let bias = load_bias(&object.segments, mapping)
            .ok_or_else(|| LayoutError::Invalid("its mapping matches no segment".into()))?;
        let memory = ProcessMemory::new(pid);
        let structs = VmStructs::read(&memory, |name| {
            object.symbols.get(name).map(|a| a.wrapping_add(bias))
        })
        .map_err(|e| LayoutError::Invalid(format!("its VMStructs: {e}")))?;
        let major = layout::major_version(&structs, &memory)?;
        let jvm_layout = JvmLayout::new(&structs, major)?;
        let walker = layout::walker_layout(&structs, &jvm_layout, &memory)?;
        // A code cache the JVM's own tables place over other code, or over
        // all of user space, is a forgery: refused, the process native.
        self.regions
            .set_for_process(pid, RUNTIME_HOTSPOT, &[(walker.code_low, walker.code_high)])
            .map_err(|e| LayoutError::Invalid(format!("its code cache: {e}")))?;
        self.process_map
            .insert(pid, walker, 0)
            .map_err(|e| LayoutError::Invalid(format!("JVM_PROCESSES: {e}")))?;
        self.registered.insert(pid, ());
        if let Ok(mut processes) = self.processes.write() {
            processes.insert(
                pid,
                Arc::new(JvmInstance {
                    pid,
                    layout: jvm_layout,
                    major,
                }),
            );
        }
        tracing::debug!(pid, major, heaps = walker.heap_count, "Java frames");
        if let Ok(mut stats) = self.stats.lock() {
            stats.processes += 1;
        }
        Ok(())
    }
}

/// The VMStructs symbols of an object named `libjvm.so`; None for any
/// other object (or one without them: then the process is named when it
/// registers).
fn read_object(object: &ObjectFile) -> Option<JvmObject> {
    if object.path.file_name()? != "libjvm.so" {
        return None;
    }
    let file = object.file.as_ref().ok()?;
    // SAFETY: a read-only mapping of a file we only read (see symbolize).
    let data = unsafe { memmap2::Mmap::map(file) }.ok()?;
    let parsed = object::File::parse(&*data).ok()?;
    profiler_symbolize::elf::guard(|| {
        let mut symbols = HashMap::new();
        for symbol in parsed.dynamic_symbols() {
            if let Ok(name) = symbol.name()
                && let Some(wanted) = SYMBOLS.iter().find(|w| **w == name)
            {
                symbols.insert(*wanted, symbol.address());
            }
        }
        Ok(Some(JvmObject {
            symbols,
            segments: segments_of(&parsed),
        }))
    })
    .ok()?
}

impl profiler_runtime::Registry for JvmRegistry {
    fn register(&self, process: &Process) {
        JvmRegistry::register(self, process);
    }

    fn unregister(&self, pid: u32) {
        JvmRegistry::unregister(self, pid);
    }

    fn retain_objects(&self, keep: &HashSet<ObjectId>) {
        JvmRegistry::retain_objects(self, keep);
    }

    fn flush(&self) {
        JvmRegistry::flush(self);
    }

    fn report(&self, counts: &profiler_runtime::Counts) -> Vec<String> {
        use profiler_common::runtimes::RuntimeCounter;
        let j = self.stats();
        if j.processes == 0 && j.refused.is_empty() {
            return Vec::new();
        }
        let mut lines = vec![format!(
            "Java: frames read in {} JVMs; {} Java frames written, {} stacks cut in Java code, \
             {} frames in the code cache without a blob walked by frame pointer",
            j.processes,
            counts.runtime(RuntimeCounter::Frames),
            counts.runtime(RuntimeCounter::Cut),
            counts.runtime(RuntimeCounter::Fallback),
        )];
        lines.extend(
            j.refused
                .iter()
                .map(|why| format!("no Java frames for {why}")),
        );
        lines
    }

    fn namer(&self) -> Option<Box<dyn profiler_runtime::FrameNamer>> {
        Some(Box::new(JvmNamer {
            frames: super::JvmFrames::default(),
            processes: self.processes(),
        }))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Names Java frames with what the registry read of JVMs.
struct JvmNamer {
    frames: super::JvmFrames,
    processes: JvmProcesses,
}

impl profiler_runtime::FrameNamer for JvmNamer {
    fn frames(&mut self, pid: u32, payload: u64, second: u64) -> Vec<profiler_symbolize::Frame> {
        let jvm = self
            .processes
            .read()
            .ok()
            .and_then(|p| p.get(&pid).cloned());
        self.frames.frames(jvm.as_deref(), payload, second)
    }

    fn retain(&mut self, keep: &dyn Fn(u32) -> bool) {
        self.frames.retain(keep);
    }
}

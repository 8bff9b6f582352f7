//! The thread that tells the BPF walker about CPython processes: for each
//! process the sampler meets, it looks for an interpreter among its
//! objects, reads its layout (off the sampling path: a process's memory
//! and a binary's symbols take milliseconds), checks it, and writes the
//! process's offsets (`PY_PROCESSES`) and its threads' thread states
//! (`PY_THREADS`). Threads started later are added when a sample says it
//! met one (`refresh`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::runtimes::python::{PyProcess, PyThread};
use profiler_symbolize::process::{ObjectFile, ObjectId, Process};

use super::code::Interpreter;
use super::interpreter::{self, InterpreterFile};
use super::layout::{Layout, LayoutSource};
use super::threads;
use profiler_runtime::memory::ProcessMemory;
use profiler_runtime::objects::{NotRuntime, ObjectMapping, load_bias, mappings_of, segments_of};
use profiler_runtime::worker::{Handler, Worker};

/// One registered CPython process.
#[derive(Debug, Clone)]
pub struct PythonProcess {
    pub interpreter: Interpreter,
    /// The address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// "3.11.2".
    pub version: String,
    /// The object holding the interpreter.
    pub object: PathBuf,
}

/// What the registry did, for the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonStats {
    /// Processes whose Python frames the walker reads.
    pub processes: u64,
    /// Layouts from the interpreter's `_Py_DebugOffsets` / from the
    /// version tables (checked against the binary).
    pub from_debug_offsets: u64,
    pub from_tables: u64,
    /// Thread states registered.
    pub threads: u64,
    /// Interpreters refused, with why (one line each, at most 16).
    pub refused: Vec<String>,
}

enum Command {
    Register(u32, Vec<ObjectMapping>),
    Refresh(u32),
    Unregister(u32),
    /// Forget the objects not in the set (no live process maps them).
    Retain(HashSet<ObjectId>),
}

/// Registered processes, for the symbolizer.
pub type PythonProcesses = Arc<RwLock<HashMap<u32, Arc<PythonProcess>>>>;

/// See the module's documentation.
pub struct PythonRegistry {
    worker: Worker<Command>,
    stats: Arc<Mutex<PythonStats>>,
    processes: PythonProcesses,
    not_python: NotRuntime,
}

impl PythonRegistry {
    pub fn spawn(
        process_map: BpfHashMap<MapData, u32, PyProcess>,
        thread_map: BpfHashMap<MapData, u64, PyThread>,
    ) -> std::io::Result<Self> {
        let stats = Arc::new(Mutex::new(PythonStats::default()));
        let processes: PythonProcesses = Arc::default();
        let not_python = NotRuntime::default();
        let state = State {
            process_map,
            thread_map,
            objects: HashMap::new(),
            not_python: not_python.clone(),
            threads: HashMap::new(),
            stats: stats.clone(),
            processes: processes.clone(),
        };
        Ok(PythonRegistry {
            worker: Worker::spawn("python", state)?,
            stats,
            processes,
            not_python,
        })
    }

    /// Reads `process`'s Python frames from now on, if it runs CPython.
    /// Returns at once.
    pub fn register(&self, process: &Process) {
        if self.not_python.covers(process) {
            return;
        }
        self.worker
            .send(Command::Register(process.pid, mappings_of(process)));
    }

    /// Reads `pid`'s thread list again (a sample met a thread the walker
    /// did not know).
    pub fn refresh(&self, pid: u32) {
        self.worker.send(Command::Refresh(pid));
    }

    /// Forgets `pid` (it exited).
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

    pub fn stats(&self) -> PythonStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The registered processes (the symbolizer reads their code objects).
    pub fn processes(&self) -> PythonProcesses {
        self.processes.clone()
    }
}

/// An object's interpreter, and how its file offsets become addresses.
#[derive(Clone)]
struct InterpreterObject {
    file: InterpreterFile,
    /// `PT_LOAD` segments: (virtual address, file offset, file size).
    segments: Vec<(u64, u64, u64)>,
    path: PathBuf,
}

struct State {
    process_map: BpfHashMap<MapData, u32, PyProcess>,
    thread_map: BpfHashMap<MapData, u64, PyThread>,
    /// Per object: its interpreter, None when it has none, or why it
    /// cannot be read.
    objects: HashMap<ObjectId, Option<Result<InterpreterObject, String>>>,
    /// The objects of `objects` that are no interpreter.
    not_python: NotRuntime,
    /// The thread-state keys written for each process.
    threads: HashMap<u32, HashSet<u64>>,
    stats: Arc<Mutex<PythonStats>>,
    processes: PythonProcesses,
}

impl Handler for State {
    type Command = Command;

    fn handle(&mut self, command: Command) {
        match command {
            Command::Register(pid, mappings) => {
                if self.threads.contains_key(&pid) {
                    return;
                }
                if let Err(why) = self.register(pid, &mappings) {
                    tracing::info!(pid, "no Python frames: {why}");
                    if let Ok(mut stats) = self.stats.lock()
                        && stats.refused.len() < 16
                    {
                        stats.refused.push(format!("pid {pid}: {why}"));
                    }
                }
            }
            Command::Refresh(pid) => {
                let process = self
                    .processes
                    .read()
                    .ok()
                    .and_then(|p| p.get(&pid).cloned());
                if let Some(process) = process {
                    self.write_threads(&process);
                }
            }
            Command::Retain(keep) => {
                self.objects.retain(|id, _| keep.contains(id));
                self.not_python.retain(&keep);
            }
            Command::Unregister(pid) => {
                if let Some(keys) = self.threads.remove(&pid) {
                    for key in keys {
                        let _ = self.thread_map.remove(&key);
                    }
                    let _ = self.process_map.remove(&pid);
                }
                if let Ok(mut processes) = self.processes.write() {
                    processes.remove(&pid);
                }
            }
        }
    }
}

impl State {
    /// Finds, reads and checks the interpreter of `pid`; Ok(()) also when
    /// the process runs none.
    fn register(&mut self, pid: u32, mappings: &[ObjectMapping]) -> Result<(), String> {
        let mut found = None;
        for mapping in mappings {
            let entry = self.objects.entry(mapping.object.id).or_insert_with(|| {
                let read = read_object(&mapping.object);
                if read.is_none() {
                    self.not_python.insert(mapping.object.id);
                }
                read
            });
            match entry {
                Some(Ok(object)) => {
                    found = Some((object.clone(), mapping.clone()));
                    break;
                }
                Some(Err(why)) => return Err(format!("{}: {why}", mapping.object.path.display())),
                None => {}
            }
        }
        let Some((object, mapping)) = found else {
            return Ok(());
        };
        let bias = load_bias(&object.segments, &mapping)
            .ok_or_else(|| format!("{}: its mapping matches no segment", object.path.display()))?;
        let memory = ProcessMemory::new(pid);
        let runtime = object.file.runtime.wrapping_add(bias);
        let code_type = object.file.code_type.map(|a| a.wrapping_add(bias));
        let minor = object.file.minor;
        let layout = if minor >= 13 {
            Layout::from_debug_offsets(&memory, runtime)
        } else {
            Layout::table(minor).and_then(|layout| match code_type {
                Some(code_type) => layout.check(&memory, code_type).map(|()| layout),
                None => Err(super::layout::LayoutError::Mismatch {
                    minor,
                    what: "it exports no PyCode_Type to check the table against".into(),
                }),
            })
        }
        .map_err(|e| format!("{}: {e}", object.path.display()))?;
        if layout.thread_native_id.is_none() && !cfg!(target_arch = "x86_64") {
            return Err(format!(
                "{}: Python 3.{minor} records no native thread id, and its threads are found by \
                 their thread pointer on x86_64 only; 3.11 and later work everywhere",
                object.path.display()
            ));
        }
        let version = match object.file.micro {
            Some(micro) => format!("3.{minor}.{micro}"),
            None => format!("3.{minor}"),
        };
        let process = Arc::new(PythonProcess {
            interpreter: Interpreter {
                pid,
                layout: layout.clone(),
                code_type,
            },
            runtime,
            version: version.clone(),
            object: object.path.clone(),
        });
        // The thread list must read: a layout that finds no thread of a
        // running interpreter is not this interpreter's.
        let states = self.read_threads(&process).map_err(|e| {
            format!(
                "{}: Python {version}: reading its thread list: {e}",
                object.path.display()
            )
        })?;
        if states.is_empty() {
            return Err(format!(
                "{}: Python {version}: its thread list names none of its threads",
                object.path.display()
            ));
        }
        let walker = layout
            .for_bpf()
            .map_err(|e| format!("{}: Python {version}: {e}", object.path.display()))?;
        self.process_map
            .insert(pid, walker, 0)
            .map_err(|e| format!("PY_PROCESSES: {e}"))?;
        if let Ok(mut processes) = self.processes.write() {
            processes.insert(pid, process.clone());
        }
        self.threads.insert(pid, HashSet::new());
        self.write_states(pid, &states);
        tracing::debug!(
            pid,
            %version,
            object = %object.path.display(),
            source = ?layout.source,
            threads = states.len(),
            "Python frames"
        );
        if let Ok(mut stats) = self.stats.lock() {
            stats.processes += 1;
            match layout.source {
                LayoutSource::DebugOffsets => stats.from_debug_offsets += 1,
                LayoutSource::VersionTable => stats.from_tables += 1,
            }
        }
        Ok(())
    }

    fn read_threads(&self, process: &PythonProcess) -> std::io::Result<Vec<threads::ThreadState>> {
        let interpreter = &process.interpreter;
        let memory = ProcessMemory::new(interpreter.pid);
        let host_tids = threads::namespace_tids(Path::new("/proc"), interpreter.pid);
        threads::thread_states(&memory, &interpreter.layout, process.runtime, &host_tids)
    }

    /// Reads the thread list again and writes what changed.
    fn write_threads(&mut self, process: &PythonProcess) {
        match self.read_threads(process) {
            Ok(states) => self.write_states(process.interpreter.pid, &states),
            Err(e) => tracing::debug!(pid = process.interpreter.pid, "Python threads: {e}"),
        }
    }

    fn write_states(&mut self, pid: u32, states: &[threads::ThreadState]) {
        let Some(known) = self.threads.get_mut(&pid) else {
            return;
        };
        let now: HashSet<u64> = states.iter().map(|s| s.key).collect();
        for gone in known.difference(&now) {
            let _ = self.thread_map.remove(gone);
        }
        let mut added = 0;
        for state in states {
            let value = PyThread {
                thread_state: state.address,
                pid,
                _pad: 0,
            };
            if self.thread_map.insert(state.key, value, 0).is_ok() && !known.contains(&state.key) {
                added += 1;
            }
        }
        *known = now;
        if let Ok(mut stats) = self.stats.lock() {
            stats.threads += added;
        }
    }
}

/// The interpreter in an object file, if any.
fn read_object(object: &ObjectFile) -> Option<Result<InterpreterObject, String>> {
    let file = object.file.as_ref().ok()?;
    // SAFETY: a read-only mapping of a file we only read (see symbolize).
    let data = unsafe { memmap2::Mmap::map(file) }.ok()?;
    let parsed = object::File::parse(&*data).ok()?;
    let found = profiler_symbolize::elf::guard(|| Ok(interpreter::find(&parsed))).ok()??;
    Some(match found {
        Ok(file) => Ok(InterpreterObject {
            file,
            segments: segments_of(&parsed),
            path: object.path.clone(),
        }),
        Err(e) => Err(e.to_string()),
    })
}

impl profiler_runtime::Registry for PythonRegistry {
    fn register(&self, process: &Process) {
        PythonRegistry::register(self, process);
    }

    fn unregister(&self, pid: u32) {
        PythonRegistry::unregister(self, pid);
    }

    fn retain_objects(&self, keep: &HashSet<ObjectId>) {
        PythonRegistry::retain_objects(self, keep);
    }

    fn refresh_threads(&self, pid: u32) {
        self.refresh(pid);
    }

    fn flush(&self) {
        PythonRegistry::flush(self);
    }

    fn report(&self, counts: &profiler_runtime::Counts) -> Vec<String> {
        use profiler_common::runtimes::RuntimeCounter;
        let p = self.stats();
        if p.processes == 0 && p.refused.is_empty() {
            return Vec::new();
        }
        let mut lines = vec![format!(
            "Python: frames read in {} processes (layout from the interpreter's \
             _Py_DebugOffsets for {}, from the checked version table for {}), {} threads; {} \
             Python frames written, {} samples met a thread not yet registered, {} cut",
            p.processes,
            p.from_debug_offsets,
            p.from_tables,
            p.threads,
            counts.runtime(RuntimeCounter::Frames),
            counts.runtime(RuntimeCounter::ThreadUnknown),
            counts.runtime(RuntimeCounter::Cut),
        )];
        lines.extend(
            p.refused
                .iter()
                .map(|why| format!("no Python frames for {why}")),
        );
        lines
    }

    fn namer(&self) -> Option<Box<dyn profiler_runtime::FrameNamer>> {
        Some(Box::new(PythonNamer {
            frames: super::code::PythonFrames::default(),
            processes: self.processes(),
        }))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Names Python frames with what the registry read of processes.
struct PythonNamer {
    frames: super::code::PythonFrames,
    processes: PythonProcesses,
}

impl profiler_runtime::FrameNamer for PythonNamer {
    fn frames(&mut self, pid: u32, payload: u64, second: u64) -> Vec<profiler_symbolize::Frame> {
        use profiler_common::runtimes::MARK_CUT;
        use profiler_common::runtimes::python::PY_CUT_TOO_DEEP;
        use profiler_symbolize::{Frame, NameSource};
        let source = NameSource::Runtime("cpython");
        if payload == MARK_CUT {
            return vec![
                Frame::named(match second {
                    PY_CUT_TOO_DEEP => "[python: deeper frames cut]",
                    _ => "[python: frame unreadable]",
                })
                .from_source(source),
            ];
        }
        let process = self
            .processes
            .read()
            .ok()
            .and_then(|p| p.get(&pid).cloned());
        vec![match process {
            Some(process) => self.frames.frame(&process.interpreter, payload, second),
            None => Frame::named(format!("[python] code {payload:#x}")).from_source(source),
        }]
    }

    fn retain(&mut self, keep: &dyn Fn(u32) -> bool) {
        self.frames.retain(keep);
    }
}

//! Language runtimes, one folder each.
//!
//! A runtime is code the native view of a process does not explain: Go's
//! own symbol table and stack switches, and the interpreters whose frames
//! are data, not code (CPython; HotSpot next). Everything the profiler
//! knows of one runtime in user space lives in its folder here; its BPF
//! walker is `profiler-ebpf/src/runtimes/<name>`, and the types the two
//! sides share are `profiler-common/src/runtimes/<name>.rs`. Three places
//! per runtime, no more.
//!
//! A runtime plugs into the stages of the data flow through small traits
//! the lower crates define (so that they depend on no runtime), and
//! through this crate's two facades:
//!
//! - `profiler_symbolize::RuntimeObjects`: its own symbol table of an
//!   object (Go's pclntab), tried before the ELF symbols ([`SYMBOLS`]);
//! - `profiler_unwind::build::RuntimeRows`: unwind rows over its code
//!   (Go's pcsp), or marks on the CFI's (CPython's eval loop)
//!   ([`UNWIND_ROWS`]);
//! - [`RuntimeRegistry`]: per process, what its BPF walker needs (Go's
//!   label layout, CPython's offsets and thread states), read off the
//!   sampling path and written into the walker's maps;
//! - [`RuntimeFrames`]: the runtime frames the walker wrote into a stack
//!   (two words each), named while their process lives.
//!
//! How to add a runtime is in docs/runtimes.md.

pub mod go;
pub mod jvm;
pub mod loading;
pub mod memory;
pub mod objects;
pub mod python;
pub mod worker;

use aya::Ebpf;
use aya::maps::HashMap as BpfHashMap;
use profiler_common::runtimes::python::{
    RUNTIME_CPYTHON, RUNTIME_KIND_SHIFT, RUNTIME_PAYLOAD_MASK,
};
use profiler_symbolize::process::{ObjectId, Process};
use profiler_symbolize::{Frame, NameSource};

use go::labels::{GoLabelRegistry, GoLabelStats};
use jvm::JvmFrames;
use jvm::registry::{JvmProcesses, JvmRegistry, JvmStats};
use profiler_common::runtimes::hotspot::RUNTIME_HOTSPOT;
use python::code::PythonFrames;
use python::registry::{PythonProcesses, PythonRegistry, PythonStats};

/// The runtimes the symbolizer asks for their own tables of each object.
pub static SYMBOLS: profiler_symbolize::Runtimes = &[&go::GO];

/// The runtimes the unwind-table builder asks for rows of each object.
pub static UNWIND_ROWS: profiler_unwind::build::Runtimes = &[&go::GO, &python::PYTHON];

/// A symbolizer that knows every runtime's own tables: the one the
/// products use.
pub fn symbolizer() -> profiler_symbolize::Symbolizer {
    profiler_symbolize::Symbolizer::default().with_runtimes(SYMBOLS)
}

/// Which runtimes' walkers read processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeSettings {
    /// Copy goroutines' pprof labels into Go samples.
    pub go_labels: bool,
    /// Write Python frames into the stacks of CPython processes.
    pub python: bool,
    /// Write Java frames into the stacks of HotSpot JVMs.
    pub java: bool,
}

/// Why the runtimes' part of the sampler could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the BPF object has no map {0} (a build problem)")]
    MissingMap(&'static str),
    #[error("BPF map {0}: {1}")]
    Map(&'static str, aya::maps::MapError),
    #[error("starting the {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
}

/// Per process, what the runtimes' BPF walkers need: each runtime's
/// registry thread, told about every process the sampler meets.
pub struct RuntimeRegistry {
    go_labels: Option<GoLabelRegistry>,
    python: Option<PythonRegistry>,
    jvm: Option<JvmRegistry>,
}

/// What the registries did, for the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    pub go_labels: GoLabelStats,
    pub python: PythonStats,
    pub jvm: JvmStats,
}

impl RuntimeRegistry {
    /// Takes the runtimes' maps out of the loaded sampling object and
    /// starts the registries `settings` asks for.
    pub fn spawn(ebpf: &mut Ebpf, settings: RuntimeSettings) -> Result<Self, RuntimeError> {
        fn map<K: aya::Pod, V: aya::Pod>(
            ebpf: &mut Ebpf,
            name: &'static str,
        ) -> Result<BpfHashMap<aya::maps::MapData, K, V>, RuntimeError> {
            let map = ebpf.take_map(name).ok_or(RuntimeError::MissingMap(name))?;
            BpfHashMap::try_from(map).map_err(|e| RuntimeError::Map(name, e))
        }
        let go_labels = match settings.go_labels {
            true => Some(
                GoLabelRegistry::spawn(map(ebpf, "GO_PROCESSES")?)
                    .map_err(|e| RuntimeError::Thread("go-labels", e))?,
            ),
            false => None,
        };
        let python = match settings.python {
            true => Some(
                PythonRegistry::spawn(map(ebpf, "PY_PROCESSES")?, map(ebpf, "PY_THREADS")?)
                    .map_err(|e| RuntimeError::Thread("python", e))?,
            ),
            false => None,
        };
        let jvm = match settings.java {
            true => Some(
                JvmRegistry::spawn(map(ebpf, "JVM_PROCESSES")?)
                    .map_err(|e| RuntimeError::Thread("jvm", e))?,
            ),
            false => None,
        };
        Ok(RuntimeRegistry {
            go_labels,
            python,
            jvm,
        })
    }

    /// A registry with no runtime (unwind tables off: nothing to walk).
    pub fn none() -> Self {
        RuntimeRegistry {
            go_labels: None,
            python: None,
            jvm: None,
        }
    }

    /// Tells every runtime about `process` (each looks for itself in its
    /// objects, on its own thread). Returns at once.
    pub fn register(&self, process: &Process) {
        if let Some(registry) = &self.go_labels {
            registry.register(process);
        }
        if let Some(registry) = &self.python {
            registry.register(process);
        }
        if let Some(registry) = &self.jvm {
            registry.register(process);
        }
    }

    /// Forgets `pid` (it exited).
    pub fn unregister(&self, pid: u32) {
        if let Some(registry) = &self.go_labels {
            registry.unregister(pid);
        }
        if let Some(registry) = &self.python {
            registry.unregister(pid);
        }
        if let Some(registry) = &self.jvm {
            registry.unregister(pid);
        }
    }

    /// Forgets what the registries read of the objects not in `keep` (no
    /// live process maps them): with a new binary every second, a long
    /// run's caches of objects would otherwise only grow.
    pub fn retain_objects(&self, keep: &std::collections::HashSet<ObjectId>) {
        if let Some(registry) = &self.go_labels {
            registry.retain_objects(keep);
        }
        if let Some(registry) = &self.python {
            registry.retain_objects(keep);
        }
        if let Some(registry) = &self.jvm {
            registry.retain_objects(keep);
        }
    }

    /// A sample of `pid` met an interpreter thread the walker did not
    /// know: read its threads again.
    pub fn refresh_threads(&self, pid: u32) {
        if let Some(registry) = &self.python {
            registry.refresh(pid);
        }
    }

    /// Waits until every registration sent so far is done.
    pub fn flush(&self) {
        if let Some(registry) = &self.go_labels {
            registry.flush();
        }
        if let Some(registry) = &self.python {
            registry.flush();
        }
        if let Some(registry) = &self.jvm {
            registry.flush();
        }
    }

    pub fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            go_labels: self
                .go_labels
                .as_ref()
                .map(GoLabelRegistry::stats)
                .unwrap_or_default(),
            python: self
                .python
                .as_ref()
                .map(PythonRegistry::stats)
                .unwrap_or_default(),
            jvm: self
                .jvm
                .as_ref()
                .map(JvmRegistry::stats)
                .unwrap_or_default(),
        }
    }

    /// The Go binaries of registered processes, to read the label
    /// strings the sampling program sent by address (None without
    /// labels).
    pub fn go_strings(&self) -> Option<&go::labels::GoStrings> {
        self.go_labels.as_ref().map(GoLabelRegistry::strings)
    }

    /// Names runtime frames with what the registries know of processes.
    pub fn frames(&self) -> RuntimeFrames {
        RuntimeFrames {
            python: PythonFrames::default(),
            python_processes: self.python.as_ref().map(PythonRegistry::processes),
            jvm: JvmFrames::default(),
            jvm_processes: self.jvm.as_ref().map(JvmRegistry::processes),
        }
    }
}

/// The runtime frames of a run's stacks, named as they are first seen.
#[derive(Default)]
pub struct RuntimeFrames {
    python: PythonFrames,
    python_processes: Option<PythonProcesses>,
    jvm: JvmFrames,
    jvm_processes: Option<JvmProcesses>,
}

impl RuntimeFrames {
    /// Names the runtime frames of a new stack of `pid` (words as the
    /// walker wrote them) now, while the process lives: a profile built
    /// after it exited still names them.
    pub fn observe(&mut self, pid: u32, words: &[u64]) {
        for frame in profiler_unwind::user_frames(words) {
            if let profiler_unwind::UserFrame::Runtime { first, second } = frame {
                self.frames(pid, first, second);
            }
        }
    }

    /// The frames of a runtime frame's two words: one, or (a compiled Java
    /// frame) the methods inlined there too, innermost first.
    pub fn frames(&mut self, pid: u32, first: u64, second: u64) -> Vec<Frame> {
        let kind = (first >> RUNTIME_KIND_SHIFT) & 0x3f;
        let payload = first & RUNTIME_PAYLOAD_MASK;
        match kind {
            RUNTIME_CPYTHON if payload == 0 => vec![
                Frame::named(match second {
                    profiler_common::runtimes::python::PY_CUT_TOO_DEEP => {
                        "[python: deeper frames cut]"
                    }
                    _ => "[python: frame unreadable]",
                })
                .from_source(NameSource::CPython),
            ],
            RUNTIME_CPYTHON => {
                let process = self
                    .python_processes
                    .as_ref()
                    .and_then(|p| p.read().ok()?.get(&pid).cloned());
                vec![match process {
                    Some(process) => self.python.frame(&process.interpreter, payload, second),
                    None => Frame::named(format!("[python] code {payload:#x}"))
                        .from_source(NameSource::CPython),
                }]
            }
            RUNTIME_HOTSPOT => {
                let jvm = self
                    .jvm_processes
                    .as_ref()
                    .and_then(|p| p.read().ok()?.get(&pid).cloned());
                self.jvm.frames(jvm.as_deref(), payload, second)
            }
            other => vec![Frame::named(format!("[runtime {other}] {payload:#x}"))],
        }
    }

    /// Forgets the frames of processes `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.python.retain(&keep);
        self.jvm.retain(keep);
    }
}

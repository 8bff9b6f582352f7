//! What a language runtime is to the profiler: one small interface
//! ([`Runtime`]) every runtime's crate implements, and the generic parts
//! the products use without naming any runtime.
//!
//! A runtime (Go, CPython, HotSpot, ...) is a crate of its own,
//! `profiler-runtime-<name>`, with its BPF walker in
//! `profiler-ebpf/src/runtimes/<name>` and the types the two share in
//! `profiler_common::runtimes::<name>`; the list of them is the
//! `profiler-runtimes` crate. A runtime:
//!
//! - detects itself from a process's objects and reads its layout, off the
//!   sampling path ([`Registry`], started by [`Runtime::start`] on the
//!   loaded BPF object: it takes its own maps and writes per-process data
//!   for its walker);
//! - may name its own objects' code ([`Runtime::symbols`], Go's pclntab)
//!   and give unwind rows over it ([`Runtime::unwind_rows`], Go's pcsp;
//!   CPython's marked eval loop);
//! - names the frames its walker wrote ([`FrameNamer`]);
//! - contributes its report lines, its frame type and its switch in the
//!   one `--runtimes` setting ([`Selection`]); its kernel counters are
//!   `profiler_common::runtimes::RuntimeCounter`'s, per runtime id.
//!
//! [`RuntimeRegistry`] and [`RuntimeFrames`] are what the products hold:
//! every selected runtime's registry and frame namer, asked in turn.

pub mod cache;
pub mod loading;
pub mod memory;
pub mod objects;
pub mod regions;
pub mod worker;

use std::any::Any;
use std::collections::HashSet;

use aya::Ebpf;
use profiler_common::Counter;
use profiler_common::runtimes::{MARK_CUT, RUNTIME_PAYLOAD_MASK, RuntimeCounter, runtime_of};
use profiler_symbolize::Frame;
use profiler_symbolize::process::{ObjectId, Process};

pub use loading::Globals;
pub use regions::Regions;

/// One language runtime (see the crate's documentation).
pub trait Runtime: Sync {
    /// Its name: in `--runtimes`, reports and metrics ("go", "cpython",
    /// "hotspot").
    fn name(&self) -> &'static str;

    /// Other names `--runtimes` accepts for it ("python", "java").
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// What switching it on adds, in a few words (for `--help`).
    fn about(&self) -> &'static str;

    /// Its id in the records (`profiler_common::runtimes::RUNTIME_*`); 0
    /// for a runtime whose walker writes no frames of its own (Go).
    fn id(&self) -> u8 {
        0
    }

    /// The frame type of its frames (OTLP's `profile.frame.type`, and
    /// `NameSource::Runtime`).
    fn frame_type(&self) -> &'static str;

    /// Its own symbol table of objects (Go's pclntab), tried before the
    /// ELF symbols, whether or not it is selected.
    fn symbols(&self) -> Option<&'static dyn profiler_symbolize::RuntimeObjects> {
        None
    }

    /// Its unwind rows over its code, whether or not it is selected (a
    /// mark for an off runtime's walker is ignored by the native walker).
    fn unwind_rows(&self) -> Option<&'static dyn profiler_unwind::build::RuntimeRows> {
        None
    }

    /// Its BPF walker's program, without the context's suffix
    /// (`walk_cpython`), when it has one: loaded into each context's chain
    /// at its id's slot.
    fn walker(&self) -> Option<&'static str> {
        None
    }

    /// Whether its walker is found through unwind tables (an eval loop's
    /// marked rows, native frames between its own): off without them.
    fn needs_tables(&self) -> bool {
        false
    }

    /// Its BPF maps (sized down by products that do not walk stacks).
    fn maps(&self) -> &'static [&'static str] {
        &[]
    }

    /// Sets its globals of the BPF object before it is loaded; `on` says
    /// whether it is selected.
    fn globals(&self, _on: bool, _globals: &mut Globals) {}

    /// Starts its registry on the loaded object (its maps are taken from
    /// it).
    fn start(&self, ebpf: &mut Ebpf, shared: &Shared) -> Result<Box<dyn Registry>, RuntimeError>;
}

/// What every runtime's registry shares.
#[derive(Clone)]
pub struct Shared {
    /// The code regions of processes' runtimes the native walker hands
    /// over in.
    pub regions: Regions,
}

/// A runtime's per-process side: told about every process the sampler
/// meets (it looks for itself in its objects on a thread of its own).
pub trait Registry: Send + Sync {
    /// Reads `process`'s runtime state from now on, if it runs this
    /// runtime. Returns at once.
    fn register(&self, process: &Process);

    /// Forgets `pid` (it exited).
    fn unregister(&self, pid: u32);

    /// Forgets what it read of the objects not in `keep` (no live process
    /// maps them).
    fn retain_objects(&self, keep: &HashSet<ObjectId>);

    /// A sample of `pid` met a thread of this runtime its walker did not
    /// know: read the process's threads again.
    fn refresh_threads(&self, _pid: u32) {}

    /// Waits until every registration sent so far is done.
    fn flush(&self);

    /// Lines for the end-of-run report: what it read and what it refused,
    /// with its kernel counters (`counts`).
    fn report(&self, counts: &Counts) -> Vec<String>;

    /// Its namer of the frames its walker writes (None: it writes none).
    fn namer(&self) -> Option<Box<dyn FrameNamer>> {
        None
    }

    /// Itself, for a product that needs a runtime's own API (Go's label
    /// strings).
    fn as_any(&self) -> &dyn Any;
}

/// Names the frames a runtime's walker wrote.
pub trait FrameNamer: Send {
    /// The frames of one runtime frame of process `pid`: its payload (the
    /// first word's low bits; `MARK_CUT` for a cut, whose reason is in
    /// `second`) and second word. One frame, or several (a compiled Java
    /// frame with the methods inlined there), innermost first.
    fn frames(&mut self, pid: u32, payload: u64, second: u64) -> Vec<Frame>;

    /// Forgets the frames of processes `keep` says are gone.
    fn retain(&mut self, keep: &dyn Fn(u32) -> bool);
}

/// A run's kernel counters, for a runtime's report.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// By `Counter` slot.
    pub kernel: Vec<u64>,
    /// This runtime's, in `RuntimeCounter::ALL`'s order.
    pub runtime: [u64; RuntimeCounter::ALL.len()],
}

impl Counts {
    pub fn kernel(&self, counter: Counter) -> u64 {
        self.kernel.get(counter as usize).copied().unwrap_or(0)
    }

    pub fn runtime(&self, counter: RuntimeCounter) -> u64 {
        self.runtime[counter as usize]
    }
}

/// Why the runtimes' part of a product could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Map(#[from] profiler_bpf::maps::MapTakeError),
    #[error("starting the {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
}

/// A runtime's map of the loaded object, per process (a typed handle, see
/// `profiler_bpf::maps`).
pub type ProcessMap<V> = profiler_bpf::maps::Handle<aya::maps::HashMap<aya::maps::MapData, u32, V>>;

/// Which runtimes are on: the one setting (`--runtimes`, `runtimes` in
/// the config, `PROFILER_AGENT_RUNTIMES`), a comma-separated list of
/// names; `all` (the default) and `none` also.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Selection {
    #[default]
    All,
    Only(Vec<String>),
}

impl Selection {
    /// Parses a list against the runtimes `known`; an unknown name is an
    /// error that lists the known ones.
    pub fn parse(text: &str, known: &[&'static dyn Runtime]) -> Result<Selection, String> {
        let names: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        match names.as_slice() {
            ["all"] => return Ok(Selection::All),
            ["none"] | [] => return Ok(Selection::Only(Vec::new())),
            _ => {}
        }
        let mut chosen = Vec::new();
        for name in names {
            let Some(runtime) = known
                .iter()
                .find(|r| r.name() == name || r.aliases().contains(&name))
            else {
                let list: Vec<&str> = known.iter().map(|r| r.name()).collect();
                return Err(format!(
                    "unknown runtime {name:?}: the runtimes are {}, or all, or none",
                    list.join(", ")
                ));
            };
            if !chosen.iter().any(|c| c == runtime.name()) {
                chosen.push(runtime.name().to_string());
            }
        }
        Ok(Selection::Only(chosen))
    }

    /// Whether `runtime` is on.
    pub fn includes(&self, runtime: &dyn Runtime) -> bool {
        match self {
            Selection::All => true,
            Selection::Only(names) => names.iter().any(|n| n == runtime.name()),
        }
    }

    /// The list as `parse` reads it.
    pub fn to_text(&self) -> String {
        match self {
            Selection::All => "all".into(),
            Selection::Only(names) if names.is_empty() => "none".into(),
            Selection::Only(names) => names.join(","),
        }
    }
}

/// Every started runtime's registry.
pub struct RuntimeRegistry {
    runtimes: Vec<(&'static dyn Runtime, Box<dyn Registry>)>,
}

impl RuntimeRegistry {
    /// Starts the registries of the runtimes of `list` that `selection`
    /// switches on (those that need unwind tables only with `tables`).
    pub fn start(
        ebpf: &mut Ebpf,
        list: &[&'static dyn Runtime],
        selection: &Selection,
        tables: bool,
    ) -> Result<Self, RuntimeError> {
        let shared = Shared {
            regions: Regions::take(ebpf)?,
        };
        let mut runtimes = Vec::new();
        for &runtime in list {
            if !on(runtime, selection, tables) {
                continue;
            }
            runtimes.push((runtime, runtime.start(ebpf, &shared)?));
        }
        Ok(RuntimeRegistry { runtimes })
    }

    /// A registry with no runtime.
    pub fn none() -> Self {
        RuntimeRegistry {
            runtimes: Vec::new(),
        }
    }

    /// Tells every runtime about `process`. Returns at once.
    pub fn register(&self, process: &Process) {
        for (_, registry) in &self.runtimes {
            registry.register(process);
        }
    }

    /// Forgets `pid` (it exited).
    pub fn unregister(&self, pid: u32) {
        for (_, registry) in &self.runtimes {
            registry.unregister(pid);
        }
    }

    /// Forgets what the registries read of the objects not in `keep`: with
    /// a new binary every second, a long run's caches of objects would
    /// otherwise only grow.
    pub fn retain_objects(&self, keep: &HashSet<ObjectId>) {
        for (_, registry) in &self.runtimes {
            registry.retain_objects(keep);
        }
    }

    /// A sample of `pid` met a runtime's thread its walker did not know.
    pub fn refresh_threads(&self, pid: u32) {
        for (_, registry) in &self.runtimes {
            registry.refresh_threads(pid);
        }
    }

    /// Waits until every registration sent so far is done.
    pub fn flush(&self) {
        for (_, registry) in &self.runtimes {
            registry.flush();
        }
    }

    /// Every started runtime's report lines, with the kernel counters
    /// (`kernel`, by `Counter` slot) and the runtimes' (`runtime`, by
    /// `RuntimeCounter::slot`).
    pub fn report(&self, kernel: &[u64], runtime: &[u64]) -> Vec<String> {
        let mut lines = Vec::new();
        for (each, registry) in &self.runtimes {
            let counts = Counts {
                kernel: kernel.to_vec(),
                runtime: RuntimeCounter::ALL.map(|c| {
                    runtime
                        .get(c.slot(each.id()) as usize)
                        .copied()
                        .unwrap_or(0)
                }),
            };
            lines.extend(registry.report(&counts));
        }
        lines.extend(cache::report());
        lines
    }

    /// The started runtimes' ids and names.
    pub fn ids(&self) -> Vec<(u8, &'static str)> {
        self.runtimes
            .iter()
            .map(|(r, _)| (r.id(), r.name()))
            .collect()
    }

    /// The registry of type `T`, when that runtime is started (a product
    /// that needs one runtime's own API: Go's label strings).
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.runtimes
            .iter()
            .find_map(|(_, registry)| registry.as_any().downcast_ref::<T>())
    }

    /// Names runtime frames with what the registries know of processes.
    pub fn frames(&self) -> RuntimeFrames {
        RuntimeFrames {
            namers: self
                .runtimes
                .iter()
                .filter_map(|(runtime, registry)| Some((runtime.id(), registry.namer()?)))
                .collect(),
        }
    }
}

/// Whether `runtime` runs in a product with `selection` (and unwind
/// tables when `tables`).
pub fn on(runtime: &dyn Runtime, selection: &Selection, tables: bool) -> bool {
    selection.includes(runtime) && (tables || !runtime.needs_tables())
}

/// The runtime frames of a run's stacks, named as they are first seen.
#[derive(Default)]
pub struct RuntimeFrames {
    namers: Vec<(u8, Box<dyn FrameNamer>)>,
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

    /// The frames of a runtime frame's two words.
    pub fn frames(&mut self, pid: u32, first: u64, second: u64) -> Vec<Frame> {
        let id = runtime_of(first);
        let payload = first & RUNTIME_PAYLOAD_MASK;
        match self.namers.iter_mut().find(|(runtime, _)| *runtime == id) {
            Some((_, namer)) => namer.frames(pid, payload, second),
            None if payload == MARK_CUT => {
                vec![Frame::named(format!("[runtime {id}: frames cut]"))]
            }
            None => vec![Frame::named(format!("[runtime {id}] {payload:#x}"))],
        }
    }

    /// Forgets the frames of processes `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        for (_, namer) in &mut self.namers {
            namer.retain(&keep);
        }
    }
}

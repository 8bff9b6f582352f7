//! The BPF object's maps as typed handles: a map's name and the aya type
//! it is read as, in one place, so a wrong key or value type is a compile
//! error, not a corrupted read. Each runtime declares its own maps' handles
//! in its crate (`profiler_runtime_python`'s `PY_PROCESSES`, ...).

use std::marker::PhantomData;

use aya::maps::{
    Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, ProgramArray, RingBuf,
};
use aya::{Ebpf, EbpfLoader};
use profiler_common::latency::{HistKey, HistValue, ProbeStack, SiteConfig, StackId, StackTotals};
use profiler_common::unwind::ProcessUnwind;

/// A map of the object, read as `T`.
pub struct Handle<T> {
    pub name: &'static str,
    _type: PhantomData<fn() -> T>,
}

/// Why a map could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum MapTakeError {
    #[error("the BPF object has no map {0} (a build problem: run `cargo xtask setup`)")]
    Missing(&'static str),
    #[error("BPF map {0}: {1}")]
    Type(&'static str, #[source] MapError),
}

impl<T> Handle<T> {
    pub const fn new(name: &'static str) -> Self {
        Handle {
            name,
            _type: PhantomData,
        }
    }

    /// Sizes the map before the object loads (`max_entries`).
    pub fn size<'a>(&self, loader: &mut EbpfLoader<'a>, entries: u32) {
        loader.map_max_entries(self.name, entries);
    }
}

impl<T: TryFrom<Map, Error = MapError>> Handle<T> {
    /// Takes the map out of the loaded object.
    pub fn take(&self, ebpf: &mut Ebpf) -> Result<T, MapTakeError> {
        let map = ebpf
            .take_map(self.name)
            .ok_or(MapTakeError::Missing(self.name))?;
        T::try_from(map).map_err(|e| MapTakeError::Type(self.name, e))
    }
}

/// Samples and off-CPU records, to user space.
pub const SAMPLES: Handle<RingBuf<MapData>> = Handle::new("SAMPLES");
/// The `--pid` filter.
pub const PID_FILTER: Handle<HashMap<MapData, u32, u8>> = Handle::new("PID_FILTER");
/// The walk's counters (`profiler_common::Counter`).
pub const COUNTERS: Handle<PerCpuArray<MapData, u64>> = Handle::new("COUNTERS");
/// The runtimes' walkers' counters (`RuntimeCounter::slot`).
pub const RUNTIME_COUNTERS: Handle<PerCpuArray<MapData, u64>> = Handle::new("RUNTIME_COUNTERS");
/// The chains' program arrays, one per context.
pub const CHAIN_CPU: Handle<ProgramArray<MapData>> = Handle::new("CHAIN_CPU");
pub const CHAIN_SCHED: Handle<ProgramArray<MapData>> = Handle::new("CHAIN_SCHED");
pub const CHAIN_PROBE: Handle<ProgramArray<MapData>> = Handle::new("CHAIN_PROBE");
/// Where each process's unwind mappings are.
pub const UNWIND_PROCESSES: Handle<HashMap<MapData, u32, ProcessUnwind>> =
    Handle::new("UNWIND_PROCESSES");
/// The unwind-table arrays (written through a mapping of their memory).
pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
pub const UNWIND_PAGES: &str = "UNWIND_PAGES";
pub const UNWIND_RULES: &str = "UNWIND_RULES";
pub const UNWIND_MAPPINGS: &str = "UNWIND_MAPPINGS";

/// The probes' maps.
pub const SITES: Handle<Array<MapData, SiteConfig>> = Handle::new("SITES");
pub const HISTOGRAMS: Handle<PerCpuHashMap<MapData, HistKey, HistValue>> =
    Handle::new("HISTOGRAMS");
pub const LATENCY_COUNTERS: Handle<PerCpuArray<MapData, u64>> = Handle::new("LATENCY_COUNTERS");
pub const TRACE_EVENTS: Handle<RingBuf<MapData>> = Handle::new("TRACE_EVENTS");
pub const TRACE_STARTS: &str = "TRACE_STARTS";
pub const STACKS: Handle<HashMap<MapData, StackId, ProbeStack>> = Handle::new("STACKS");
pub const STACK_TOTALS: Handle<PerCpuHashMap<MapData, StackId, StackTotals>> =
    Handle::new("STACK_TOTALS");

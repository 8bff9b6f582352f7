//! Filling a context's chain of walker programs (profiler-ebpf's
//! `chain`): each walker is loaded as a program of the context's type (a
//! perf-event program for CPU samples, a BTF tracepoint on `sched_switch`
//! for off-CPU stacks, a uprobe for probe hits) and put in the context's
//! program array at its slot. The array must stay open while the programs
//! run: the kernel empties a program array once user space holds no
//! reference to it.

use aya::Ebpf;
use aya::maps::{MapData, ProgramArray};
use aya::programs::{BtfTracePoint, PerfEvent, Program, UProbe};
use profiler_common::runtimes::{CHAIN_FINISH, CHAIN_NATIVE};

use crate::loading::error_chain;

/// A context whose stack walks run as a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// CPU-clock samples (perf-event programs).
    Cpu,
    /// The scheduler's switch-outs of off-CPU profiling (BTF tracepoints
    /// on `sched_switch`).
    Sched,
    /// Probe hits with stacks (uprobes).
    Probe,
}

impl Context {
    /// The suffix of its copy of each walker's program.
    fn suffix(self) -> &'static str {
        match self {
            Context::Cpu => "cpu",
            Context::Sched => "sched",
            Context::Probe => "probe",
        }
    }

    /// Its program array.
    pub fn array(self) -> &'static str {
        match self {
            Context::Cpu => "CHAIN_CPU",
            Context::Sched => "CHAIN_SCHED",
            Context::Probe => "CHAIN_PROBE",
        }
    }

    /// Its finishing program (the chain's `CHAIN_FINISH` slot).
    pub fn finish(self) -> &'static str {
        match self {
            Context::Cpu => "finish_cpu",
            Context::Sched => "finish_sched",
            Context::Probe => "finish_probe",
        }
    }
}

/// A walker to put in the chain: its program's name without the
/// context's suffix (`walk_native`, `walk_cpython`), and its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walker {
    pub program: &'static str,
    pub slot: u32,
}

/// The native walker.
pub const NATIVE: Walker = Walker {
    program: "walk_native",
    slot: CHAIN_NATIVE,
};

/// Why a chain could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("the BPF object has no {0} (a build problem)")]
    Missing(String),
    #[error("the kernel refused the walker program {program}: {reason}")]
    Refused { program: String, reason: String },
    #[error("{0}: {1}")]
    Map(&'static str, String),
}

/// A context's filled program array: keep it while its programs run.
pub struct Chain {
    _array: ProgramArray<MapData>,
}

/// Loads `walkers` and the context's finish as programs of `context`'s
/// type and fills its program array. `btf` is the kernel's, for the
/// scheduler's tracepoint programs.
pub fn fill(
    ebpf: &mut Ebpf,
    context: Context,
    walkers: &[Walker],
    btf: Option<&aya::Btf>,
) -> Result<Chain, ChainError> {
    let name = context.array();
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| ChainError::Missing(format!("map {name}")))?;
    let mut array =
        ProgramArray::try_from(map).map_err(|e| ChainError::Map(name, e.to_string()))?;
    let finish = Walker {
        program: context.finish(),
        slot: CHAIN_FINISH,
    };
    for walker in walkers.iter().chain([&finish]) {
        let program = if walker.slot == CHAIN_FINISH {
            walker.program.to_string()
        } else {
            format!("{}_{}", walker.program, context.suffix())
        };
        let refused = |e: &dyn std::error::Error| ChainError::Refused {
            program: program.clone(),
            reason: error_chain(e),
        };
        let loaded = ebpf
            .program_mut(&program)
            .ok_or_else(|| ChainError::Missing(format!("program {program}")))?;
        load(loaded, context, btf).map_err(|e| refused(&e))?;
        let fd = loaded.fd().map_err(|e| refused(&e))?;
        array
            .set(walker.slot, fd, 0)
            .map_err(|e| ChainError::Map(name, e.to_string()))?;
    }
    Ok(Chain { _array: array })
}

/// Loads one program as `context`'s type (once: a program already loaded,
/// a finish shared by two fills, is left as it is).
fn load(
    program: &mut Program,
    context: Context,
    btf: Option<&aya::Btf>,
) -> Result<(), aya::programs::ProgramError> {
    if program.fd().is_ok() {
        return Ok(());
    }
    match (context, btf) {
        (Context::Cpu, _) => <&mut PerfEvent>::try_from(program)?.load(),
        (Context::Sched, Some(btf)) => {
            <&mut BtfTracePoint>::try_from(program)?.load("sched_switch", btf)
        }
        (Context::Sched, None) => Err(aya::programs::ProgramError::UnexpectedProgramType),
        (Context::Probe, _) => <&mut UProbe>::try_from(program)?.load(),
    }
}

//! Loading and attaching the off-CPU programs (`profiler_common::offcpu`
//! describes what they do): their settings, the kernel layout they need,
//! and the three programs on two tracepoints.

use std::time::Duration;

use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf, EbpfLoader};
use profiler_common::offcpu::{
    GLOBAL_OFF_CPU_MIN_NS, GLOBAL_OFF_CPU_PERIOD_NS, GLOBAL_TASK_FLAGS_OFFSET,
    GLOBAL_TASK_PID_OFFSET,
};

use super::SamplingError;
use profiler_bpf::btf::KernelBtf;
use profiler_bpf::loading::error_chain;

/// What off-CPU time to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// Intervals shorter than this are not recorded (bcc's offcputime
    /// default is 1 µs too).
    pub min: Duration,
    /// Intervals shorter than this are recorded with probability
    /// interval / period, each then standing for one period; longer ones
    /// are all recorded. Zero records every interval (at a stack walk per
    /// context switch).
    pub period: Duration,
    /// Show off-CPU time as wall-clock time added to CPU time (CPU samples
    /// as time), in one sample type, instead of beside it.
    pub wall: bool,
}

/// Default minimum off-CPU interval.
pub const DEFAULT_OFF_CPU_MIN: Duration = Duration::from_micros(1);

/// Byte offsets in the running kernel's `struct task_struct`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub flags: u32,
}

impl TaskOffsets {
    /// From the kernel's BTF (`/sys/kernel/btf/vmlinux`).
    pub fn from_kernel() -> Result<TaskOffsets, SamplingError> {
        let btf = KernelBtf::load().map_err(|e| SamplingError::OffCpuBtf(e.to_string()))?;
        let offset = |member: &str| {
            btf.member_offset("task_struct", member)
                .map_err(|e| SamplingError::OffCpuBtf(e.to_string()))
        };
        Ok(TaskOffsets {
            pid: offset("pid")?,
            flags: offset("flags")?,
        })
    }
}

/// The values the loader writes into the object before loading (they must
/// outlive the loader, which borrows them).
pub(super) struct Globals {
    min_ns: u64,
    period_ns: u64,
    pid_offset: u32,
    flags_offset: u32,
}

impl Globals {
    pub(super) fn new(config: &OffCpuConfig) -> Result<Globals, SamplingError> {
        if config.period > Duration::from_secs(3600) {
            return Err(SamplingError::OffCpuPeriod(config.period));
        }
        let offsets = TaskOffsets::from_kernel()?;
        Ok(Globals {
            min_ns: config.min.as_nanos().min(u64::MAX as u128) as u64,
            period_ns: config.period.as_nanos() as u64,
            pid_offset: offsets.pid,
            flags_offset: offsets.flags,
        })
    }

    pub(super) fn apply<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        loader
            .override_global(GLOBAL_OFF_CPU_MIN_NS, &self.min_ns, true)
            .override_global(GLOBAL_OFF_CPU_PERIOD_NS, &self.period_ns, true)
            .override_global(GLOBAL_TASK_PID_OFFSET, &self.pid_offset, true)
            .override_global(GLOBAL_TASK_FLAGS_OFFSET, &self.flags_offset, true);
    }
}

/// The programs and their tracepoints, in attach order: wakeups first, so
/// no switch is seen without them. (Nothing on `sys_exit`: see
/// `profiler_common::offcpu`.)
const PROGRAMS: [(&str, &str); 2] = [
    ("off_cpu_wakeup", "sched_wakeup"),
    ("off_cpu_switch", "sched_switch"),
];

/// Loads the off-CPU programs (before the maps they use may close).
pub(super) fn load(ebpf: &mut Ebpf) -> Result<(), SamplingError> {
    let btf = Btf::from_sys_fs().map_err(|e| SamplingError::OffCpuBtf(error_chain(&e)))?;
    for (name, tracepoint) in PROGRAMS {
        program(ebpf, name, tracepoint)?
            .load(tracepoint, &btf)
            .map_err(refused(tracepoint))?;
    }
    Ok(())
}

/// Attaches the loaded off-CPU programs (the links live as long as
/// `ebpf`).
pub(super) fn attach(ebpf: &mut Ebpf) -> Result<(), SamplingError> {
    for (name, tracepoint) in PROGRAMS {
        program(ebpf, name, tracepoint)?
            .attach()
            .map_err(refused(tracepoint))?;
    }
    Ok(())
}

fn program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
    tracepoint: &'static str,
) -> Result<&'a mut BtfTracePoint, SamplingError> {
    ebpf.program_mut(name)
        .ok_or(SamplingError::MissingProgram(name))?
        .try_into()
        .map_err(refused(tracepoint))
}

/// The error of a program the kernel refused on `tracepoint`.
fn refused(tracepoint: &'static str) -> impl Fn(aya::programs::ProgramError) -> SamplingError {
    move |e| {
        let message = error_chain(&e);
        let permission_denied =
            message.contains("Operation not permitted") || message.contains("Permission denied");
        SamplingError::OffCpuProgram {
            tracepoint,
            message,
            permission_denied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_struct_offsets_come_from_the_running_kernel() {
        let Ok(offsets) = TaskOffsets::from_kernel() else {
            // No BTF here: the error path is what the agent reports.
            assert!(!std::path::Path::new("/sys/kernel/btf/vmlinux").exists());
            return;
        };
        // pid follows flags by far in every kernel's task_struct, and
        // both lie inside it (it is a few KiB).
        assert!(offsets.flags < offsets.pid, "{offsets:?}");
        assert!(offsets.pid < 16384, "{offsets:?}");
    }
}

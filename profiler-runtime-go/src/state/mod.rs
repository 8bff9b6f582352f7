//! The Go runtime's own state, read from outside: a process's heap profile
//! (the runtime's sampled allocation records, `runtime.mbuckets`) and its
//! goroutines (`runtime.allgs`), through `/proc/PID/mem`, without pausing
//! it (unless asked: [`freeze`]), on stripped binaries too.
//!
//! - [`globals`]: the runtime's variables in the binary, by symbol or by
//!   decoding the runtime functions that use them;
//! - [`layout`]: the structures' offsets by Go version;
//! - [`heap`]: the heap profile, as `pprof.WriteHeapProfile` writes it;
//! - [`goroutines`]: every goroutine, as `debug=2` prints it, and the
//!   goroutine profile;
//! - [`freeze`]: stopping the process (ptrace) for an exact dump.
//!
//! Everything read is the process's to forge: lists are bounded and
//! checked for loops, counts and lengths are capped, a bad record is
//! counted and skipped, and an error names the process and what was wrong.

pub mod frames;
pub mod freeze;
pub mod globals;
pub mod goroutines;
pub mod heap;
pub mod layout;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use object::{Object, ObjectSegment};

use super::pclntab::GoSymbols;
use globals::{Global, Globals};
use profiler_runtime::memory::{Memory, ProcessMemory};

/// Largest executable mapped (as for every file the agent maps).
const MAX_EXECUTABLE_BYTES: u64 = 8 << 30;

/// Why a process's Go runtime state cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("process {pid}: {reason}")]
    Process { pid: u32, reason: String },
    #[error("process {pid} ({path}) is not a Go program")]
    NotGo { pid: u32, path: String },
    #[error(
        "process {pid}: Go {version} is not one whose runtime this agent reads ({what}); Go 1.19 \
         and 1.21 to 1.27 are"
    )]
    UnknownVersion {
        pid: u32,
        version: String,
        what: &'static str,
    },
    #[error(
        "process {pid} ({path}): memory profiling is disabled in this binary (the linker turns \
         it off when nothing references runtime.MemProfile: no runtime/pprof heap profile, no \
         net/http/pprof), so the runtime records no allocations; `heap \
         --set-mem-profile-rate 524288` turns recording on from now (it changes the process)"
    )]
    ProfilingDisabled { pid: u32, path: String },
    #[error("process {pid}: {symbol} not found in {path} (neither by symbol nor in {anchor})")]
    NotFound {
        pid: u32,
        path: String,
        symbol: &'static str,
        anchor: &'static str,
    },
    #[error("process {pid}: reading {what}: {reason}")]
    Read {
        pid: u32,
        what: String,
        reason: String,
    },
}

/// A Go process opened for reading its runtime.
pub struct GoTarget {
    pub pid: u32,
    /// The executable, as the process runs it.
    pub path: String,
    /// "go1.21.13".
    pub version: String,
    pub minor: u32,
    pub symbols: Arc<GoSymbols>,
    /// Process address − link-time address (PIE executables).
    pub bias: u64,
    pub memory: ProcessMemory,
    /// The runtime variables found, at their process addresses.
    addresses: HashMap<&'static str, u64>,
    /// `waitReasonStrings`' entries, when found.
    wait_reason_count: Option<usize>,
    /// Whether the linker kept memory profiling.
    memory_profiling: bool,
}

impl GoTarget {
    /// Opens process `pid`'s executable (through `/proc/PID/exe`, so a
    /// container's binary or a deleted one are read as the process runs
    /// them) and finds its runtime's variables.
    pub fn open(pid: u32) -> Result<GoTarget, StateError> {
        let process = |reason: String| StateError::Process { pid, reason };
        let exe = format!("/proc/{pid}/exe");
        let path = std::fs::read_link(&exe)
            .map(|p| p.display().to_string())
            .map_err(|e| process(format!("{exe}: {e} (is the process running?)")))?;
        let file = std::fs::File::open(&exe).map_err(|e| process(format!("{exe}: {e}")))?;
        // As for every file the agent maps for a process: a regular file
        // of bounded size.
        let metadata = file
            .metadata()
            .map_err(|e| process(format!("{exe}: {e}")))?;
        if !metadata.is_file() || metadata.len() > MAX_EXECUTABLE_BYTES {
            return Err(process(format!(
                "{path}: not a regular file of at most {} GiB",
                MAX_EXECUTABLE_BYTES >> 30
            )));
        }
        // SAFETY: a read-only mapping of a file we only read (see
        // profiler-symbolize: a truncated file faults reads, as for any
        // profiler reading live binaries).
        let map = Arc::new(
            unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| process(format!("mapping {exe}: {e}")))?,
        );
        let parsed = object::File::parse(&**map).map_err(|_| StateError::NotGo {
            pid,
            path: path.clone(),
        })?;
        if !super::looks_like_go(&parsed) {
            return Err(StateError::NotGo { pid, path });
        }
        let symbols = Arc::new(
            GoSymbols::from_mapped(&parsed, &map)
                .map_err(|e| process(format!("{path}: its pclntab: {e}")))?,
        );
        let version = symbols.version().unwrap_or("unknown").to_string();
        let minor = layout::minor_of(&version).ok_or_else(|| StateError::UnknownVersion {
            pid,
            version: version.clone(),
            what: "no Go version in its build info",
        })?;
        let bias = load_bias(pid, &parsed, &path).unwrap_or(0);
        let globals = Globals::new(&parsed, &symbols);
        let mut addresses = HashMap::new();
        for global in [
            globals::MBUCKETS,
            globals::MPROF_CYCLE,
            globals::MEM_PROFILE_RATE,
            globals::ALLGLEN,
            globals::ALLGPTR,
            globals::WAIT_REASON_STRINGS,
        ] {
            if let Some(address) = globals.find(global) {
                addresses.insert(global.symbol, address.wrapping_add(bias));
            }
        }
        // The linker disables memory profiling when the function behind
        // runtime.MemProfile is unreachable (runtime.memProfileInternal
        // from Go 1.23).
        let profiling_function = if minor >= 23 {
            "runtime.memProfileInternal"
        } else {
            "runtime.MemProfile"
        };
        Ok(GoTarget {
            pid,
            memory_profiling: globals.has_function(profiling_function),
            wait_reason_count: globals.wait_reason_count(),
            path,
            version,
            minor,
            symbols,
            bias,
            memory: ProcessMemory::new(pid),
            addresses,
        })
    }

    /// A runtime variable's process address.
    fn address(&self, global: Global) -> Result<u64, StateError> {
        self.addresses
            .get(global.symbol)
            .copied()
            .ok_or_else(|| StateError::NotFound {
                pid: self.pid,
                path: self.path.clone(),
                symbol: global.symbol,
                anchor: global.anchor,
            })
    }

    /// An error reading `what`.
    fn read_error(&self, what: impl Into<String>, reason: impl std::fmt::Display) -> StateError {
        StateError::Read {
            pid: self.pid,
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    fn u64(&self, address: u64, what: &str) -> Result<u64, StateError> {
        self.memory
            .u64(address)
            .map_err(|e| self.read_error(what, format!("{address:#x}: {e}")))
    }

    /// The link-time address of a process code address (for the pclntab).
    pub fn link_address(&self, pc: u64) -> u64 {
        pc.wrapping_sub(self.bias)
    }
}

/// The executable's load bias: where its first `PT_LOAD` landed minus
/// where it was linked (0 unless PIE).
fn load_bias(pid: u32, file: &object::File<'_>, path: &str) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let path = path.trim_end_matches(" (deleted)");
    let start = maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let range = fields.next()?;
        let _perms = fields.next()?;
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let name = fields.nth(2)?;
        (offset == 0 && name == path)
            .then(|| u64::from_str_radix(range.split('-').next()?, 16).ok())
            .flatten()
    })?;
    let first = file.segments().next()?;
    let (offset, _) = first.file_range();
    Some(start.wrapping_sub(first.address().wrapping_sub(offset)))
}

/// Where an executable lies: its path and its Go build id, for profiles.
pub fn executable_mapping(target: &GoTarget) -> profiler_profile::Mapping {
    profiler_profile::Mapping {
        file: target.path.clone(),
        build_id: target.symbols.build_id().unwrap_or_default().to_string(),
        has_functions: true,
        ..Default::default()
    }
}

/// Where the process's executable file is, when a caller needs to read it
/// again.
pub fn executable_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/exe"))
}

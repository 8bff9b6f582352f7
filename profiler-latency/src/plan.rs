//! From what the user asked (`latency START END`, `latency uprobe:F`,
//! `latency --count P`, `--pid`, `--by`, the layout) to the exact list of
//! uprobes to open and what the BPF side must know about each, checked
//! before anything is attached: unknown probes, missing arguments, a
//! layout too wide for the kernel's histogram value are refused here.

use std::path::{Path, PathBuf};

use profiler_common::latency::{
    ARG_ABSOLUTE, ARG_IMMEDIATE, ARG_MEMORY, ARG_REGISTER, ArgReader, FILTER_NONE, HIST_SLOTS,
    KEY_ARG, KEY_COMM, KEY_NONE, KEY_PID, KEY_STRING_ARG, LatencyConfig, MAX_SITES, NO_REGISTER,
    SiteConfig, TRACE_NO_SLOT, TRACE_SLOTS,
};

use super::histogram::{Layout, Unit};
use profiler_probes::args::{ArgSpec, Location};
use profiler_probes::attach::UprobeTarget;
use profiler_probes::functions::{FunctionError, FunctionTable};
use profiler_probes::registers::Arch;
use profiler_probes::spec::{ProbeSpec, Target, glob_match, suggest};
use profiler_probes::target::{TargetError, find_by_name, mapped_objects};
use profiler_probes::usdt::{UsdtError, read_probes_as};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// Time from a hit of `start` to the next hit of `end` on the same
    /// thread (goroutine for Go functions).
    Between { start: ProbeSpec, end: ProbeSpec },
    /// Hits of one probe.
    Count(ProbeSpec),
    /// Every hit of one probe, one record each (`trace`).
    Trace(ProbeSpec),
    /// Every operation from `start` to `end` on a thread (goroutine for Go
    /// functions), one record each with its latency (`trace START END`).
    TracePair { start: ProbeSpec, end: ProbeSpec },
}

/// What each traced hit carries and which hits are sent (`trace`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// The argument index read into each slot (at most `TRACE_SLOTS`).
    pub slots: Vec<usize>,
    /// The slot whose value points to the string to copy.
    pub text_slot: Option<usize>,
    /// Only hits whose slot compares so with the value.
    pub filter: Option<TraceFilter>,
    /// Records per second on one CPU at most (0: no limit).
    pub max_per_second: u64,
    /// Start/end pairs: only operations at least this long.
    pub min_latency_ns: u64,
}

/// `--filter 'argN OP VALUE'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceFilter {
    pub slot: usize,
    /// One of `FILTER_*`.
    pub op: u8,
    pub value: i64,
}

impl Measure {
    /// `latency uprobe:PATH:F` is shorthand for
    /// `latency uprobe:PATH:F uretprobe:PATH:F`.
    pub fn function(spec: ProbeSpec) -> Result<Measure, PlanError> {
        match spec {
            ProbeSpec::Uprobe {
                target,
                symbol,
                ret: false,
            } => Ok(Measure::Between {
                start: ProbeSpec::Uprobe {
                    target: target.clone(),
                    symbol: symbol.clone(),
                    ret: false,
                },
                end: ProbeSpec::Uprobe {
                    target,
                    symbol,
                    ret: true,
                },
            }),
            other => Err(PlanError::OneProbe(other.to_string())),
        }
    }
}

/// What the histogram is keyed by (`--by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyBy {
    #[default]
    None,
    /// An integer argument of the start (or counted) probe.
    Arg(usize),
    /// A string an argument points to.
    StringArg(usize),
    Pid,
    Comm,
}

impl KeyBy {
    /// `arg0`, `str:arg1`, `pid`, `comm`.
    pub fn parse(text: &str) -> Result<KeyBy, String> {
        let arg_index = |rest: &str| -> Result<usize, String> {
            rest.parse::<usize>()
                .map_err(|_| format!("{text:?}: expected argN with N a number (arg0, arg1, ...)"))
        };
        match text {
            "pid" => Ok(KeyBy::Pid),
            "comm" => Ok(KeyBy::Comm),
            _ => {
                if let Some(rest) = text.strip_prefix("str:arg") {
                    Ok(KeyBy::StringArg(arg_index(rest)?))
                } else if let Some(rest) = text.strip_prefix("arg") {
                    Ok(KeyBy::Arg(arg_index(rest)?))
                } else {
                    Err(format!("{text:?}: --by takes argN, str:argN, pid or comm"))
                }
            }
        }
    }

    fn argument(self) -> Option<usize> {
        match self {
            KeyBy::Arg(n) | KeyBy::StringArg(n) => Some(n),
            _ => None,
        }
    }

    fn kind(self) -> u32 {
        match self {
            KeyBy::None => KEY_NONE,
            KeyBy::Arg(_) => KEY_ARG,
            KeyBy::StringArg(_) => KEY_STRING_ARG,
            KeyBy::Pid => KEY_PID,
            KeyBy::Comm => KEY_COMM,
        }
    }
}

/// `--unit`: ns, us or ms.
pub fn parse_unit(text: &str) -> Result<Unit, String> {
    match text {
        "ns" => Ok(Unit::Nanoseconds),
        "us" => Ok(Unit::Microseconds),
        "ms" => Ok(Unit::Milliseconds),
        _ => Err(format!("{text:?}: the unit is ns, us or ms")),
    }
}

/// `--linear MIN,MAX,STEP`.
pub fn parse_linear(text: &str) -> Result<Layout, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let [min, max, step] = parts.as_slice() else {
        return Err(format!("{text:?}: expected MIN,MAX,STEP, e.g. 0,100,10"));
    };
    let number = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| format!("{s:?} in {text:?} is not an integer"))
    };
    Layout::linear(number(min)?, number(max)?, number(step)?).map_err(|e| e.to_string())
}

#[derive(Debug, Clone)]
pub struct LatencyOptions {
    pub measure: Measure,
    pub pid: Option<u32>,
    pub unit: Unit,
    pub layout: Layout,
    pub key: KeyBy,
    /// `Measure::Trace` only.
    pub trace: TraceOptions,
    /// Walk the user stack at each start (or counted hit) and total the
    /// operations per stack, those at least this many nanoseconds long;
    /// None: no stacks.
    pub stacks: Option<u64>,
}

/// The program a site runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Start,
    End,
    Count,
    Trace,
    TraceStart,
    TraceEnd,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Start,
        Role::End,
        Role::Count,
        Role::Trace,
        Role::TraceStart,
        Role::TraceEnd,
    ];

    pub fn program(self) -> &'static str {
        match self {
            Role::Start => "latency_start",
            Role::End => "latency_end",
            Role::Count => "latency_count",
            Role::Trace => "latency_trace",
            Role::TraceStart => "latency_trace_start",
            Role::TraceEnd => "latency_trace_end",
        }
    }
}

/// One uprobe to open.
#[derive(Debug, Clone)]
pub struct PlannedSite {
    pub role: Role,
    /// What the user called it, e.g. `usdt:./app:demo:op__start` plus the
    /// site (`@0x1139`) or function.
    pub label: String,
    pub target: UprobeTarget,
    pub site: SiteConfig,
}

/// Everything to load and attach.
#[derive(Debug, Clone)]
pub struct Plan {
    pub sites: Vec<PlannedSite>,
    pub config: LatencyConfig,
    pub layout: Layout,
    pub unit: Unit,
    pub key: KeyBy,
    /// Print integer keys as signed (the argument spec said `-N@`).
    pub key_signed: bool,
    pub counting: bool,
    /// Starts are keyed by goroutine (a Go function).
    pub by_goroutine: bool,
    /// Tracing: every hit through the ring buffer.
    pub tracing: bool,
    /// Tracing start/end pairs (records carry a latency).
    pub trace_pairs: bool,
    /// Per trace slot: the argument spec said it is signed.
    pub trace_signed: [bool; TRACE_SLOTS],
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "one probe was given ({0}): latency needs START and END probes, or one \
         uprobe:PATH:FUNCTION (entry to return), or --count PROBE"
    )]
    OneProbe(String),
    #[error("trace: {0}")]
    Trace(String),
    #[error(transparent)]
    Usdt(#[from] UsdtError),
    #[error(transparent)]
    Function(#[from] FunctionError),
    #[error(transparent)]
    Process(#[from] TargetError),
    #[error("no USDT probe {wanted} in {path}{hint}")]
    UnknownProbe {
        wanted: String,
        path: PathBuf,
        hint: String,
    },
    #[error("cannot find {name}: {detail} (give a path, or --pid of a process that maps it)")]
    NotFound { name: String, detail: String },
    #[error("{path}: {reason}")]
    Path { path: PathBuf, reason: String },
    #[error(
        "{path} is built for {found}; this agent runs on {host} and can only probe {host} code"
    )]
    Arch {
        path: PathBuf,
        found: Arch,
        host: String,
    },
    #[error("--by {key}: {reason}")]
    Key { key: String, reason: String },
    #[error(
        "--linear with {buckets} buckets: the in-kernel histogram holds at most {max}; \
         widen STEP or narrow MIN,MAX"
    )]
    TooManyBuckets { buckets: i64, max: usize },
    #[error("{count} probe sites: at most {max} per run")]
    TooManySites { count: usize, max: u32 },
}

/// A probe's object: where we open it and how we name it.
#[derive(Debug, Clone)]
struct Object {
    open_path: PathBuf,
    display: PathBuf,
}

/// Builds the plan, reading every binary involved.
pub fn plan(options: &LatencyOptions) -> Result<Plan, PlanError> {
    let host = Arch::host();
    let mut builder = Builder {
        options,
        host,
        sites: Vec::new(),
        key_signed: false,
        by_goroutine: false,
        trace_signed: [false; TRACE_SLOTS],
    };
    if options.trace.slots.len() > TRACE_SLOTS {
        return Err(PlanError::Trace(format!(
            "at most {TRACE_SLOTS} arguments can be printed or filtered on"
        )));
    }
    let tracing = matches!(
        options.measure,
        Measure::Trace(_) | Measure::TracePair { .. }
    );
    let trace_pairs = matches!(options.measure, Measure::TracePair { .. });
    let counting = match &options.measure {
        Measure::Between { start, end } => {
            builder.add(start, Role::Start)?;
            builder.add(end, Role::End)?;
            false
        }
        Measure::Count(spec) => {
            builder.add(spec, Role::Count)?;
            true
        }
        Measure::Trace(spec) => {
            builder.add(spec, Role::Trace)?;
            false
        }
        Measure::TracePair { start, end } => {
            builder.add(start, Role::TraceStart)?;
            builder.add(end, Role::TraceEnd)?;
            false
        }
    };
    if builder.sites.len() > MAX_SITES as usize {
        return Err(PlanError::TooManySites {
            count: builder.sites.len(),
            max: MAX_SITES,
        });
    }
    let (linear_min, linear_step, linear_buckets) = match options.layout {
        Layout::Log2 => (0, 1, 0),
        Layout::Linear { min, max, step } => {
            let buckets = (max - min) / step;
            if buckets as usize > HIST_SLOTS - 2 {
                return Err(PlanError::TooManyBuckets {
                    buckets,
                    max: HIST_SLOTS - 2,
                });
            }
            (min, step, buckets as u32)
        }
    };
    let arch = host.unwrap_or(Arch::X86_64);
    let slot = |name: &str| {
        arch.register(name)
            .map(|r| r.pt_regs_offset)
            .unwrap_or(NO_REGISTER)
    };
    let config = LatencyConfig {
        divisor: match options.unit {
            Unit::Microseconds => 1_000,
            Unit::Milliseconds => 1_000_000,
            _ => 1,
        },
        linear_min,
        linear_step,
        linear_buckets,
        key_kind: options.key.kind(),
        tgid: options.pid.unwrap_or(0),
        goroutine_register: if builder.by_goroutine {
            slot(go_goroutine_register(arch))
        } else {
            NO_REGISTER
        },
        ip_register: slot(match arch {
            Arch::X86_64 => "rip",
            Arch::Arm64 => "pc",
        }),
        trace_slots: options.trace.slots.len() as u8,
        trace_text_slot: options.trace.text_slot.map_or(TRACE_NO_SLOT, |s| s as u8),
        filter_slot: options.trace.filter.map_or(TRACE_NO_SLOT, |f| f.slot as u8),
        filter_op: options.trace.filter.map_or(FILTER_NONE, |f| f.op),
        filter_signed: u8::from(options.trace.filter.is_some_and(|f| {
            f.value < 0 || builder.trace_signed.get(f.slot).copied().unwrap_or(false)
        })),
        stacks: u8::from(options.stacks.is_some()),
        _pad: [0; 2],
        filter_value: options.trace.filter.map_or(0, |f| f.value),
        trace_max_per_second: options.trace.max_per_second,
        trace_min_ns: options.trace.min_latency_ns,
        stack_min_ns: options.stacks.unwrap_or(0),
    };
    Ok(Plan {
        key_signed: builder.key_signed,
        by_goroutine: builder.by_goroutine,
        sites: builder.sites,
        config,
        layout: options.layout,
        unit: options.unit,
        key: options.key,
        counting,
        tracing,
        trace_pairs,
        trace_signed: builder.trace_signed,
    })
}

/// Go's ABIInternal keeps the current goroutine (g) in R14 on amd64 and
/// X28 on arm64 (Go internal/abi and cmd/compile/abi-internal.md).
fn go_goroutine_register(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "r14",
        Arch::Arm64 => "x28",
    }
}

/// How to read a function's integer argument from its entry register
/// (the `pt_regs` slot at `offset`), as a signed 64-bit value.
fn entry_register_reader(offset: u16) -> ArgReader {
    ArgReader {
        kind: ARG_REGISTER,
        size: 8,
        signed: 1,
        scale: 1,
        base: offset,
        index: NO_REGISTER,
        value: 0,
    }
}

/// Integer argument registers of a function's entry: the SysV ABI for C,
/// Go's ABIInternal (Go ≥ 1.17 on amd64, ≥ 1.18 on arm64) for Go.
fn entry_argument_register(arch: Arch, go: bool, index: usize) -> Option<&'static str> {
    const SYSV: [&str; 6] = ["rdi", "rsi", "rdx", "rcx", "r8", "r9"];
    const GO_AMD64: [&str; 9] = ["rax", "rbx", "rcx", "rdi", "rsi", "r8", "r9", "r10", "r11"];
    const ARM64: [&str; 8] = ["x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7"];
    match (arch, go) {
        (Arch::X86_64, false) => SYSV.get(index).copied(),
        (Arch::X86_64, true) => GO_AMD64.get(index).copied(),
        (Arch::Arm64, _) => ARM64.get(index).copied(),
    }
}

struct Builder<'a> {
    options: &'a LatencyOptions,
    host: Option<Arch>,
    sites: Vec<PlannedSite>,
    key_signed: bool,
    by_goroutine: bool,
    trace_signed: [bool; TRACE_SLOTS],
}

impl Builder<'_> {
    fn reads_key(&self, role: Role) -> Option<usize> {
        match role {
            Role::Start | Role::Count => self.options.key.argument(),
            Role::End | Role::Trace | Role::TraceStart | Role::TraceEnd => None,
        }
    }

    /// The argument indices a site of `role` reads into trace slots.
    fn trace_slots(&self, role: Role) -> Vec<usize> {
        match role {
            Role::Trace | Role::TraceStart => self.options.trace.slots.clone(),
            _ => Vec::new(),
        }
    }

    fn check_arch(&self, path: &Path, found: Option<Arch>) -> Result<(), PlanError> {
        match (found, self.host) {
            (Some(found), Some(host)) if found != host => Err(PlanError::Arch {
                path: path.to_path_buf(),
                found,
                host: host.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn add(&mut self, spec: &ProbeSpec, role: Role) -> Result<(), PlanError> {
        let object = resolve_object(spec.target(), self.options.pid)?;
        match spec {
            ProbeSpec::Usdt { provider, name, .. } => {
                self.add_usdt(spec, &object, provider, name, role)
            }
            ProbeSpec::Uprobe { symbol, ret, .. } => {
                self.add_function(spec, &object, symbol, *ret, role)
            }
        }
    }

    fn add_usdt(
        &mut self,
        spec: &ProbeSpec,
        object: &Object,
        provider: &str,
        name: &str,
        role: Role,
    ) -> Result<(), PlanError> {
        let probes = read_probes_as(&object.open_path, &object.display)?;
        self.check_arch(&object.display, probes.arch)?;
        let matching: Vec<_> = probes
            .probes
            .iter()
            .filter(|p| glob_match(provider, &p.provider) && glob_match(name, &p.name))
            .collect();
        if matching.is_empty() {
            let names = probes.names();
            let wanted = format!("{provider}:{name}");
            let mut near = suggest(&wanted, names.iter().map(String::as_str));
            if near.is_empty() {
                let bare: Vec<&str> = probes.probes.iter().map(|p| p.name.as_str()).collect();
                near = suggest(name, bare.iter().copied())
                    .into_iter()
                    .filter_map(|n| names.iter().find(|q| q.ends_with(&format!(":{n}"))))
                    .map(String::as_str)
                    .collect();
                near.dedup();
            }
            let hint = if near.is_empty() {
                format!("; it has: {}", names.join(", "))
            } else {
                format!(" (did you mean {}?)", near.join(", "))
            };
            return Err(PlanError::UnknownProbe {
                wanted,
                path: object.display.clone(),
                hint,
            });
        }
        for probe in matching {
            let mut site = SiteConfig {
                key_arg: ArgReader::default(),
                site_address: probe.address,
                trace_args: [ArgReader::default(); TRACE_SLOTS],
            };
            for (slot, index) in self.trace_slots(role).into_iter().enumerate() {
                let spec_arg = probe.argument(index)?;
                site.trace_args[slot] = reader(spec_arg).map_err(|reason| {
                    PlanError::Trace(format!(
                        "probe {} at {:#x}, arg{index}: {reason}",
                        probe.qualified_name(),
                        probe.address
                    ))
                })?;
                self.trace_signed[slot] |= spec_arg.signed;
            }
            if let Some(index) = self.reads_key(role) {
                let spec_arg = probe.argument(index)?;
                site.key_arg = reader(spec_arg).map_err(|reason| PlanError::Key {
                    key: key_text(self.options.key),
                    reason: format!(
                        "probe {} at {:#x}: {reason}",
                        probe.qualified_name(),
                        probe.address
                    ),
                })?;
                self.key_signed |= spec_arg.signed;
            }
            self.sites.push(PlannedSite {
                role,
                label: format!("{spec} @{:#x}", probe.address),
                target: UprobeTarget {
                    path: object.open_path.clone(),
                    file_offset: probe.file_offset,
                    ref_ctr_offset: probe.semaphore.map(|s| s.file_offset),
                    retprobe: false,
                    pid: self.options.pid,
                },
                site,
            });
        }
        Ok(())
    }

    fn add_function(
        &mut self,
        spec: &ProbeSpec,
        object: &Object,
        symbol: &str,
        ret: bool,
        role: Role,
    ) -> Result<(), PlanError> {
        let table = FunctionTable::read(&object.open_path, &object.display)?;
        self.check_arch(&object.display, Some(table.arch))?;
        if table.is_go {
            self.by_goroutine = true;
        }
        let key_index = self.reads_key(role);
        if key_index.is_some() && ret {
            return Err(PlanError::Key {
                key: key_text(self.options.key),
                reason: format!(
                    "{spec} is a return probe: arguments are read where the operation \
                     starts, and a function's arguments are gone when it returns"
                ),
            });
        }
        let mut key_arg = ArgReader::default();
        if let Some(index) = key_index {
            let register = entry_argument_register(table.arch, table.is_go, index)
                .and_then(|name| table.arch.register(name))
                .ok_or_else(|| PlanError::Key {
                    key: key_text(self.options.key),
                    reason: format!(
                        "{spec}: only the first integer arguments passed in registers can \
                         be read at a function's entry"
                    ),
                })?;
            key_arg = entry_register_reader(register.pt_regs_offset);
            self.key_signed = true;
        }
        let mut trace_args = [ArgReader::default(); TRACE_SLOTS];
        if !self.trace_slots(role).is_empty() && ret {
            return Err(PlanError::Trace(format!(
                "{spec} is a return probe: a function's arguments are gone when it returns"
            )));
        }
        for (slot, index) in self.trace_slots(role).into_iter().enumerate() {
            let register = entry_argument_register(table.arch, table.is_go, index)
                .and_then(|name| table.arch.register(name))
                .ok_or_else(|| {
                    PlanError::Trace(format!(
                        "{spec}: arg{index}: only the first integer arguments passed in \
                         registers can be read at a function's entry"
                    ))
                })?;
            trace_args[slot] = entry_register_reader(register.pt_regs_offset);
            self.trace_signed[slot] = true;
        }
        for function in table.find(symbol)? {
            let site = SiteConfig {
                key_arg,
                site_address: function.address,
                trace_args,
            };
            let target = |file_offset, retprobe| UprobeTarget {
                path: object.open_path.clone(),
                file_offset,
                ref_ctr_offset: None,
                retprobe,
                pid: self.options.pid,
            };
            if ret && table.is_go {
                for offset in table.return_offsets(function)? {
                    self.sites.push(PlannedSite {
                        role,
                        label: format!("{spec} ({} RET at file offset {offset:#x})", function.name),
                        target: target(offset, false),
                        site,
                    });
                }
            } else {
                self.sites.push(PlannedSite {
                    role,
                    label: format!("{spec} ({})", function.name),
                    target: target(function.file_offset, ret),
                    site,
                });
            }
        }
        Ok(())
    }
}

fn key_text(key: KeyBy) -> String {
    match key {
        KeyBy::Arg(n) => format!("arg{n}"),
        KeyBy::StringArg(n) => format!("str:arg{n}"),
        KeyBy::Pid => "pid".into(),
        KeyBy::Comm => "comm".into(),
        KeyBy::None => String::new(),
    }
}

/// How the BPF side reads an argument spec.
pub fn reader(spec: &ArgSpec) -> Result<ArgReader, String> {
    if spec.float {
        return Err("the argument is floating point; --by needs an integer or a string".into());
    }
    let mut reader = ArgReader {
        kind: 0,
        size: spec.size,
        signed: u8::from(spec.signed),
        scale: 1,
        base: NO_REGISTER,
        index: NO_REGISTER,
        value: 0,
    };
    match &spec.location {
        Location::Register { register } => {
            reader.kind = ARG_REGISTER;
            reader.base = register.pt_regs_offset;
        }
        Location::Memory {
            base,
            index,
            displacement,
        } => {
            reader.kind = ARG_MEMORY;
            reader.base = base.as_ref().map_or(NO_REGISTER, |r| r.pt_regs_offset);
            if let Some(index) = index {
                reader.index = index.register.pt_regs_offset;
                reader.scale = index.scale;
            }
            reader.value = *displacement;
        }
        Location::Immediate { value } => {
            reader.kind = ARG_IMMEDIATE;
            reader.value = *value;
        }
        Location::Symbol {
            symbol,
            address: Some(address),
            ..
        } => {
            let _ = symbol;
            reader.kind = ARG_ABSOLUTE;
            reader.value = *address as i64;
        }
        Location::Symbol {
            symbol,
            address: None,
            ..
        } => {
            return Err(format!(
                "the argument is at symbol {symbol}, which is not in the file's symbol table"
            ));
        }
    }
    Ok(reader)
}

/// Finds the object a spec names: a path (made absolute; through
/// `/proc/PID/root` with `--pid`, so a container's own file is probed), or
/// a bare name among the process's mappings, `$PATH` or the library
/// directories.
fn resolve_object(target: &Target, pid: Option<u32>) -> Result<Object, PlanError> {
    match target {
        Target::Path(path) => {
            let absolute = if path.is_absolute() {
                path.clone()
            } else {
                std::env::current_dir()
                    .map(|cwd| cwd.join(path))
                    .map_err(|e| PlanError::Path {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?
            };
            let open_path = match pid {
                Some(pid) => Path::new("/proc")
                    .join(pid.to_string())
                    .join("root")
                    .join(absolute.strip_prefix("/").unwrap_or(&absolute)),
                None => absolute.clone(),
            };
            if !open_path.exists() {
                return Err(PlanError::Path {
                    path: path.clone(),
                    reason: match pid {
                        Some(pid) => format!("no such file in the file system of pid {pid}"),
                        None => "no such file".into(),
                    },
                });
            }
            Ok(Object {
                open_path,
                display: path.clone(),
            })
        }
        Target::Name(name) => {
            if let Some(pid) = pid {
                let objects = mapped_objects(Path::new("/proc"), pid)?;
                return find_by_name(&objects, name)
                    .map(|o| Object {
                        open_path: o.open_path.clone(),
                        display: o.path.clone(),
                    })
                    .ok_or_else(|| PlanError::NotFound {
                        name: name.clone(),
                        detail: format!("pid {pid} maps no file of that name"),
                    });
            }
            search_path(name)
                .or_else(|| profiler_probes::ldcache::lookup(name))
                .map(|path| Object {
                    open_path: path.clone(),
                    display: path,
                })
                .ok_or_else(|| PlanError::NotFound {
                    name: name.clone(),
                    detail: "not in $PATH, the library directories nor /etc/ld.so.cache".into(),
                })
        }
    }
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let lib_dirs = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
        "/usr/local/lib",
    ];
    path_dirs
        .into_iter()
        .chain(lib_dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_probes::args::ArgSpec;

    #[test]
    fn key_by_parses() {
        assert_eq!(KeyBy::parse("arg0"), Ok(KeyBy::Arg(0)));
        assert_eq!(KeyBy::parse("arg11"), Ok(KeyBy::Arg(11)));
        assert_eq!(KeyBy::parse("str:arg1"), Ok(KeyBy::StringArg(1)));
        assert_eq!(KeyBy::parse("pid"), Ok(KeyBy::Pid));
        assert_eq!(KeyBy::parse("comm"), Ok(KeyBy::Comm));
        assert!(KeyBy::parse("argx").is_err());
        assert!(KeyBy::parse("tid").is_err());
    }

    #[test]
    fn readers_from_argument_specs() {
        let r = reader(&ArgSpec::parse("-4@%edi", Arch::X86_64).unwrap()).unwrap();
        assert_eq!(
            (r.kind, r.size, r.signed, r.base),
            (ARG_REGISTER, 4, 1, 112)
        );
        let r = reader(&ArgSpec::parse("8@-16(%rbp)", Arch::X86_64).unwrap()).unwrap();
        assert_eq!(
            (r.kind, r.base, r.index, r.value),
            (ARG_MEMORY, 32, NO_REGISTER, -16)
        );
        let r = reader(&ArgSpec::parse("-4@(%rcx,%rax,4)", Arch::X86_64).unwrap()).unwrap();
        assert_eq!((r.kind, r.base, r.index, r.scale), (ARG_MEMORY, 88, 80, 4));
        let r = reader(&ArgSpec::parse("-4@$8192", Arch::X86_64).unwrap()).unwrap();
        assert_eq!((r.kind, r.value), (ARG_IMMEDIATE, 8192));
        let r = reader(&ArgSpec::parse("8@[sp, 16]", Arch::Arm64).unwrap()).unwrap();
        assert_eq!((r.kind, r.base, r.value), (ARG_MEMORY, 248, 16));
        assert!(reader(&ArgSpec::parse("8f@%rsi", Arch::X86_64).unwrap()).is_err());
    }

    #[test]
    fn entry_registers_follow_the_abi() {
        assert_eq!(entry_argument_register(Arch::X86_64, false, 0), Some("rdi"));
        assert_eq!(entry_argument_register(Arch::X86_64, true, 0), Some("rax"));
        assert_eq!(entry_argument_register(Arch::X86_64, true, 1), Some("rbx"));
        assert_eq!(entry_argument_register(Arch::X86_64, false, 6), None);
        assert_eq!(entry_argument_register(Arch::Arm64, true, 7), Some("x7"));
        assert_eq!(Arch::X86_64.register("r14").unwrap().pt_regs_offset, 8);
        assert_eq!(Arch::Arm64.register("x28").unwrap().pt_regs_offset, 224);
    }

    #[test]
    fn single_probe_forms() {
        let f = ProbeSpec::parse("uprobe:/bin/true:main").unwrap();
        match Measure::function(f).unwrap() {
            Measure::Between { start, end } => {
                assert_eq!(start.to_string(), "uprobe:/bin/true:main");
                assert_eq!(end.to_string(), "uretprobe:/bin/true:main");
            }
            other => panic!("{other:?}"),
        }
        let u = ProbeSpec::parse("usdt:/bin/true:a:b").unwrap();
        assert!(matches!(Measure::function(u), Err(PlanError::OneProbe(_))));
    }
}

//! User-space half of USDT probes and uprobes: what a probe is and where
//! to attach it, before any BPF.
//!
//! - [`usdt`]: probe sites from `.note.stapsdt` (file offset to attach at,
//!   semaphore file offset for the kernel's `ref_ctr_offset`).
//! - [`args`]: argument specs (`-4@%edi`, `8@[sp, 16]`) to typed locations,
//!   registers as `struct pt_regs` offsets ([`registers`]).
//! - [`spec`]: `usdt:PATH:PROVIDER:NAME` / `uprobe:PATH:SYMBOL` specs,
//!   globs, near-match suggestions.
//! - [`target`]: the objects a running process maps, where its probes live.
//! - [`ldcache`]: bare library names resolved through `/etc/ld.so.cache`,
//!   as the dynamic loader resolves them.
//! - [`functions`]: functions by name (ELF symbols, Go pclntab) and their
//!   RET instructions, for `uprobe:`/`uretprobe:` specs.
//! - [`attach`]: uprobe perf events opened by hand (semaphores through
//!   `ref_ctr_offset`) with a BPF program and cookie attached.
//!
//! Measuring at probes (latency histograms, traces, the circuit breaker)
//! is the `latency` module beside this one.
//!
//! docs/probes.md says what is supported and how it was checked.

pub mod args;
pub mod attach;
pub mod functions;
pub mod ldcache;
pub mod registers;
pub mod spec;
pub mod target;
pub mod usdt;

pub use args::{ArgSpec, ArgSpecError, Location, ScaledIndex, parse_args};
pub use registers::{Arch, Register};
pub use spec::{ProbeSpec, SpecError, Target, glob_match, suggest};
pub use usdt::{Semaphore, UsdtError, UsdtProbe, UsdtProbes, read_probes, read_probes_as};

//! Language runtimes' BPF walkers, one module each (their user-space home
//! is their `profiler-runtime-<name>` crate, their shared types
//! `profiler_common::runtimes::<name>`). This list is the only place the
//! BPF side names them: each module declares its walker's programs
//! (`walkers!`), which the loader puts in the chain's slot of the
//! runtime's id.

pub mod go;
pub mod hotspot;
pub mod python;

/// Bit per runtime id whose walker the loader put in the chain: the native
/// walker marks or hands over to no other. A read-only global, so the
/// verifier drops the paths of runtimes that are off.
#[unsafe(no_mangle)]
static ENABLED_RUNTIMES: u32 = 0;

/// Whether runtime `id`'s walker is in the chain.
#[inline(always)]
pub(crate) fn enabled(id: u8) -> bool {
    // SAFETY: a read-only global the loader initialised.
    let enabled = unsafe { core::ptr::read_volatile(&ENABLED_RUNTIMES) };
    id != 0 && enabled & (1 << (id & 31)) != 0
}

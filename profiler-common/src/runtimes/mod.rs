//! Types each language runtime's BPF walker shares with user space, one
//! module per runtime (its user-space home is profiler-runtimes).

pub mod go;
pub mod hotspot;
pub mod python;

use crate::unwind::FRAME_EXACT_PC;
use python::RUNTIME_FRAME;

/// The native code addresses of a user stack as the walker wrote it:
/// runtime frames (two words each, see `python::RUNTIME_FRAME`) left out,
/// the exact-PC mark cleared.
pub fn native_pcs(words: &[u64]) -> impl Iterator<Item = u64> + '_ {
    let mut at = 0;
    core::iter::from_fn(move || {
        loop {
            let raw = *words.get(at)?;
            if raw & RUNTIME_FRAME != 0 && raw & FRAME_EXACT_PC == 0 {
                at += 2;
                continue;
            }
            at += 1;
            return Some(raw & !FRAME_EXACT_PC);
        }
    })
}

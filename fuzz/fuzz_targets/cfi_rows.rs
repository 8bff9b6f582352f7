//! Any bytes as an `.eh_frame` or `.debug_frame` section: converting them to
//! unwind rows must never panic, and the rows and pages it gives must keep
//! the BPF walker's invariants (sorted rows, row ranges inside the row
//! array, a row at the start of every page).
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_unwind::cfi::{Arch, check_invariants};

fuzz_target!(|data: &[u8]| {
    check_invariants(data, 0x1000, Arch::X86_64);
    check_invariants(data, 0x1000, Arch::Aarch64);
});

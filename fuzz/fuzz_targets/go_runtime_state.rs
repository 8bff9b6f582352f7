//! Any bytes as a Go process's memory: the heap bucket list (from an
//! address the first bytes choose, every record layout), the pprof label
//! sets of goroutines (map and slice forms) and Go strings. Answers or
//! errors, never a panic, a hang or an allocation past the readers'
//! bounds, whatever loops, depths and lengths the bytes claim.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_runtimes::go::state::goroutines::{go_string, label_set};
use profiler_runtimes::go::state::heap::read_buckets;
use profiler_runtimes::memory::ImageMemory;

const BASE: u64 = 0x10_0000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let word = u64::from_le_bytes(data[..8].try_into().unwrap());
    let memory = ImageMemory {
        base: BASE,
        bytes: data.to_vec(),
    };
    let at = BASE + (word % (data.len() as u64));
    for cycle_bytes in [16, 32] {
        let _ = read_buckets(&memory, at, (word >> 32) as u32, cycle_bytes);
    }
    let _ = label_set(&memory, at, true);
    let _ = label_set(&memory, at, false);
    let _ = go_string(&memory, at, 4096);
});

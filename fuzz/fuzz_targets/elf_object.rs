//! Any bytes as an object file: parsing, symbol and DWARF lookups, address
//! translation and unwind rows must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_symbolize::ElfObject;

fuzz_target!(|data: &[u8]| {
    if let Ok(object) = ElfObject::parse(data) {
        for address in [0, 0x1000, 0x401000, u64::MAX / 2, u64::MAX] {
            let _ = object.resolve(address);
            let _ = object.offset_to_address(address);
        }
    }
    // The builder turns a panic into an error: that error is the failure.
    assert!(!matches!(
        profiler_unwind::build::build_bytes(data, profiler_runtimes::unwind_rows()),
        Err(profiler_unwind::build::NoTable::Panicked)
    ));
});

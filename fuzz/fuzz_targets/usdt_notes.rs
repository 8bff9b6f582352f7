//! Any bytes as an ELF file with USDT notes, and as a raw note section:
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = profiler_probes::usdt::probes_from_elf(data, std::path::Path::new("fuzz"));
    for (little_endian, word_size) in [(true, 8), (true, 4), (false, 8), (false, 4)] {
        let layout = profiler_probes::usdt::NoteLayout {
            little_endian,
            word_size,
        };
        let _ = profiler_probes::usdt::parse_notes(data, layout);
    }
});

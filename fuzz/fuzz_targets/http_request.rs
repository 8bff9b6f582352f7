//! Any bytes as one client connection to the agent's listener: hyper's
//! parser, the limits, routing and the 4xx answers must never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = profiler_export::server::serve_bytes_for_fuzzing(data);
});

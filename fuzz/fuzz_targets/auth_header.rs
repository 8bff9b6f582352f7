//! Any text as an `Authorization` header and as a web config: parsing must
//! never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_export::auth::{WebConfig, parse_authorization};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_authorization(text);
        let _ = WebConfig::parse(text, std::path::Path::new("/etc/agent/web.yml"));
    }
});

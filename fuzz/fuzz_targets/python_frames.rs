//! Any bytes as a CPython process's memory: the code object reader (names,
//! files, line tables of every supported layout), the thread-list walker
//! and the debug-offsets parser read it from an image whose first bytes
//! choose the addresses; and any bytes as a line table of either format.
//! Answers or errors, never a panic, and nothing read beyond its bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_runtimes::memory::ImageMemory;
use profiler_runtime_python::code::Interpreter;
use profiler_runtime_python::layout::Layout;
use profiler_runtime_python::{linetable, threads};

const BASE: u64 = 0x10_0000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let word = u64::from_le_bytes(data[..8].try_into().unwrap());
    let index = (word >> 32) as i64;
    let _ = linetable::line_311(data, word as i32, index);
    let _ = linetable::line_310(data, word as i32, index);
    let memory = ImageMemory {
        base: BASE,
        bytes: data.to_vec(),
    };
    let at = BASE + (word % (data.len() as u64));
    let _ = Layout::from_debug_offsets(&memory, BASE);
    for minor in 10..=14 {
        let Ok(layout) = Layout::table(minor) else {
            continue;
        };
        let interpreter = Interpreter {
            pid: 0,
            layout: layout.clone(),
            code_type: (word & 1 == 1).then_some(BASE),
        };
        if let Ok(code) = interpreter.code_in(&memory, at) {
            let _ = interpreter.line(at, &code, word);
        }
        let tids = std::collections::HashMap::from([(1u32, 1u32), (word as u32, 2)]);
        let _ = threads::thread_states(&memory, &layout, at, &tids);
        let _ = layout.check(&memory, at);
    }
});

//! Any text as /proc/PID/maps, /proc/kallsyms, a JIT perf map, a USDT
//! argument spec (both architectures) or a probe spec, and any bytes as
//! /etc/ld.so.cache: never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_probes::{Arch, ArgSpec, ProbeSpec};

fuzz_target!(|data: &[u8]| {
    let _ = profiler_probes::ldcache::parse(data);
    // Maps are bytes: a path need not be UTF-8.
    let _ = profiler_symbolize::process::parse_maps(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = profiler_symbolize::KernelSymbols::parse(text).lookup(0xffffffff81000000);
    for arch in [Arch::X86_64, Arch::Arm64] {
        let _ = ArgSpec::parse(text, arch);
    }
    let _ = ProbeSpec::parse(text);
    let jit = profiler_symbolize::perf_map::PerfMap::parse(text);
    for address in [0, 0x1000, 0x7f00_0000_0000, u64::MAX] {
        let _ = jit.lookup(address);
    }
});

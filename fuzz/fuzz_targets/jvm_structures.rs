//! Any bytes as a JVM's memory and its streams: the VMStructs reader (the
//! tables at addresses the first bytes choose), the compressed number
//! streams and line-number tables of both encodings, and the method and
//! compiled-code readers of every layout shape (from a layout built over
//! the same bytes). Answers or errors, never a panic, a hang or an
//! allocation past the readers' bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_runtime_hotspot::code::{JvmCode, Target};
use profiler_runtime_hotspot::layout::{CodeStart, DebugInfo, JvmLayout};
use profiler_runtime_hotspot::stream::{self, Encoding, Stream};
use profiler_runtime_hotspot::vmstructs::{SYMBOLS, VmStructs};
use profiler_runtimes::memory::ImageMemory;

const BASE: u64 = 0x10_0000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let word = u64::from_le_bytes(data[..8].try_into().unwrap());
    let other = u64::from_le_bytes(data[8..16].try_into().unwrap());
    for encoding in [Encoding::Compressed, Encoding::Unsigned5] {
        let table = stream::line_table(data, encoding, 4096);
        let _ = stream::line_of(&table, word as i64);
        let mut s = Stream::new(data, (word % data.len() as u64) as usize, encoding);
        for _ in 0..64 {
            if s.unsigned().is_none() || s.signed().is_none() {
                break;
            }
        }
    }
    let memory = ImageMemory {
        base: BASE,
        bytes: data.to_vec(),
    };
    let at = |i: usize| BASE + (word.rotate_left(i as u32 * 7) % data.len() as u64);
    let _ = VmStructs::read(&memory, |name| {
        SYMBOLS.iter().position(|s| *s == name).map(at)
    });
    let small = |shift: u32| (other >> shift) & 0xff;
    for (code, debug) in [
        (
            CodeStart::Pointer(small(0)),
            DebugInfo::InBlob {
                pcs: small(8),
                pcs_end: small(16),
                scopes_data: small(24),
                metadata: small(32),
            },
        ),
        (
            CodeStart::Offset(small(40)),
            DebugInfo::Separate {
                immutable: small(48),
                pcs: small(56),
                scopes_data: small(4),
                mutable: small(12),
                relocation_size: small(20),
            },
        ),
    ] {
        let layout = JvmLayout {
            major: if other & 1 == 0 { 17 } else { 25 },
            encoding: if other & 2 == 0 {
                Encoding::Compressed
            } else {
                Encoding::Unsigned5
            },
            blob_name: small(28),
            blob_frame_size: small(36),
            blob_frame_complete: small(44),
            frame_complete_16: other & 4 != 0,
            blob_code: code,
            nmethod_method: small(52),
            nmethod_compile_id: small(60),
            nmethod_verified_entry: (small(2), other & 8 != 0),
            debug_info: debug,
            method_const: small(6),
            const_method_size: small(10),
            const_method_constants: small(14),
            const_method_code_size: small(18),
            const_method_name_index: small(22),
            const_method_signature_index: small(26),
            const_method_flags: (small(30), other & 16 != 0),
            has_line_table_bit: 1,
            pool_size: small(34),
            pool_holder: small(38),
            pool_length: small(42),
            pool_source_file: small(46),
            klass_name: small(50),
            symbol_length: small(54),
            symbol_body: small(3),
        };
        let mut code = JvmCode::default();
        let target = Target { pid: 1, layout: &layout };
        let _ = code.interpreted(target, &memory, at(1), at(2));
        let _ = code.compiled(target, &memory, at(3), other as u32, (other >> 32) as u32, word & 1 == 0);
    }
});

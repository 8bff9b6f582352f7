//! Any bytes as the `.gopclntab` section of an otherwise well-formed ELF
//! file (seeded with real tables): locating and parsing the table, every
//! lookup, inline expansion and unwind-row building must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use object::write::{Object, StandardSection, Symbol, SymbolSection};
use object::{Architecture, BinaryFormat, Endianness, SectionKind, SymbolFlags, SymbolKind, SymbolScope};
use profiler_runtimes::go::pclntab::GoSymbols;

const TEXT: u64 = 0x401000;

fn elf_with_pclntab(table: &[u8]) -> Option<Vec<u8>> {
    let mut elf = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let text = elf.section_id(StandardSection::Text);
    elf.append_section_data(text, &[0xc3; 4096], 16);
    elf.add_symbol(Symbol {
        name: b"runtime.text".to_vec(),
        value: 0,
        size: 0,
        kind: SymbolKind::Text,
        scope: SymbolScope::Linkage,
        weak: false,
        section: SymbolSection::Section(text),
        flags: SymbolFlags::None,
    });
    let pclntab = elf.add_section(Vec::new(), b".gopclntab".to_vec(), SectionKind::ReadOnlyData);
    elf.append_section_data(pclntab, table, 8);
    elf.write().ok()
}

fuzz_target!(|data: &[u8]| {
    let Some(bytes) = elf_with_pclntab(data) else {
        return;
    };
    let Ok(file) = object::File::parse(&*bytes) else {
        return;
    };
    let Ok(symbols) = GoSymbols::from_file(&file) else {
        return;
    };
    for function in symbols.functions().take(256) {
        let _ = function.name();
        let _ = function.pcsp_runs().take(64).count();
        let _ = symbols.frames(function.entry());
        let _ = symbols.frames(function.end().wrapping_sub(1));
    }
    for pc in [0, TEXT, TEXT + 17, u64::MAX] {
        let _ = symbols.frames(pc);
        let _ = symbols.pcsp(pc);
    }
    let _ = profiler_runtimes::go::unwind::rows_for(&symbols, None);
});

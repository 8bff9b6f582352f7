//! Function names from the ELF symbol tables (`.symtab`, then `.dynsym`).

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SectionKind, SymbolKind};

use super::super::FileBytes;
use super::super::demangle::demangle;
use super::super::frame::{Frame, NameSource, Resolver};

#[derive(Debug, Clone, Copy)]
struct Entry {
    address: u64,
    /// 0 when neither the table nor the symbol's section says (assembly
    /// labels with no section end to stop at).
    size: u64,
    /// Where the (mangled) name sits in the file's bytes.
    name_offset: u64,
    name_len: u32,
    /// From `.dynsym` rather than `.symtab`.
    dynamic: bool,
    /// A PLT stub, named after the function it jumps to (`name@plt`).
    plt: bool,
}

/// A sorted table of function symbols. Names stay in the file's bytes
/// (memory-mapped) and are demangled when looked up: a large C++ or Rust
/// library has hundreds of thousands of symbols, and a profile names a few
/// hundred of them, so copying or demangling them all up front cost most of
/// the agent's CPU and memory (measured on rustc's librustc_driver).
pub struct ElfSymbols {
    entries: Vec<Entry>,
    data: FileBytes,
    /// Where the table itself came from when it is not the object's own
    /// (a debuginfod file, MiniDebugInfo, the vDSO).
    source: Option<NameSource>,
}

impl ElfSymbols {
    pub const KIND: &'static str = "elf-symbols";

    /// Reads every function symbol of `file` (whose bytes are `data`):
    /// `.symtab` first, then `.dynsym` for what a stripped file still
    /// exports. At one address the first name seen wins, a global over a
    /// local.
    pub fn from_object<'data>(file: &object::File<'data>, data: &FileBytes) -> Self {
        let bytes: &[u8] = (**data).as_ref();
        let base = bytes.as_ptr() as usize;
        let mut raw: Vec<(u64, u64, bool, Entry)> = Vec::new();
        let text_sections: Vec<_> = file
            .sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .map(|s| s.index())
            .collect();
        let mut take = |symbol: object::Symbol<'data, '_>, dynamic: bool| {
            if symbol.is_undefined() || symbol.address() == 0 {
                return;
            }
            let is_code = match symbol.kind() {
                SymbolKind::Text => true,
                // Untyped labels in code sections (hand-written assembly).
                SymbolKind::Unknown | SymbolKind::Label => symbol
                    .section_index()
                    .is_some_and(|index| text_sections.contains(&index)),
                _ => false,
            };
            if !is_code {
                return;
            }
            let Ok(name) = symbol.name() else {
                return;
            };
            // Arm's mapping symbols (`$x`, `$d`, `$a`, `$t`, optionally
            // `.suffix`) mark where code and literal data begin inside a
            // function: untyped labels in .text, but no function's name
            // (taken for one, `$x` named the code after a literal pool).
            if is_mapping_symbol(name) {
                return;
            }
            let Some((name_offset, name_len)) = name_span(name, base, bytes.len()) else {
                return;
            };
            // A sizeless symbol reaches to the next one, but never out of
            // its own section: crti's `_init` (size 0, at the end of
            // .init) named every PLT stub after it, so a thread preempted
            // in `clock_gettime@plt` showed under `_init`.
            let size = match symbol.size() {
                0 => symbol
                    .section_index()
                    .and_then(|index| file.section_by_index(index).ok())
                    .filter(|section| section.address() != 0)
                    .map_or(0, |section| {
                        (section.address().saturating_add(section.size()))
                            .saturating_sub(symbol.address())
                    }),
                size => size,
            };
            let entry = Entry {
                address: symbol.address(),
                size,
                name_offset,
                name_len,
                dynamic,
                plt: false,
            };
            raw.push((entry.address, entry.size, symbol.is_global(), entry));
        };
        file.symbols().for_each(|s| take(s, false));
        file.dynamic_symbols().for_each(|s| take(s, true));
        // After every symbol, so that a symbol of the table's own at a
        // stub's address wins.
        for entry in plt_stubs(file, base, bytes.len()) {
            raw.push((entry.address, entry.size, false, entry));
        }

        // Stable sort keeps .symtab before .dynsym at equal keys; globals first.
        raw.sort_by_key(|&(address, _, global, _)| (address, !global));
        raw.dedup_by_key(|&mut (address, ..)| address);
        ElfSymbols {
            entries: raw.into_iter().map(|(.., entry)| entry).collect(),
            data: data.clone(),
            source: None,
        }
    }

    /// The same table, its names marked as coming from `source`.
    pub fn from_source(mut self, source: NameSource) -> Self {
        self.source = Some(source);
        self
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn raw_name(&self, entry: &Entry) -> Option<&str> {
        let bytes: &[u8] = (*self.data).as_ref();
        let start = usize::try_from(entry.name_offset).ok()?;
        let name = bytes.get(start..start.checked_add(entry.name_len as usize)?)?;
        std::str::from_utf8(name).ok()
    }

    /// The symbol covering `address`: the last one starting at or below it,
    /// if its size reaches `address` (sizeless symbols reach to the next,
    /// within their section).
    /// Returns the demangled name, the mangled one when it differs, and the
    /// symbol's address.
    pub fn lookup(&self, address: u64) -> Option<(String, Option<&str>, u64)> {
        self.lookup_entry(address)
            .map(|(name, system, entry)| (name, system, entry.address))
    }

    fn lookup_entry(&self, address: u64) -> Option<(String, Option<&str>, &Entry)> {
        let index = self.entries.partition_point(|e| e.address <= address);
        let entry = self.entries.get(index.checked_sub(1)?)?;
        if entry.size != 0 && address - entry.address >= entry.size {
            return None;
        }
        let (name, system) = self.name_of(entry)?;
        Some((name, system, entry))
    }

    /// `entry`'s name, demangled, and the mangled one when it differs.
    fn name_of(&self, entry: &Entry) -> Option<(String, Option<&str>)> {
        let raw = self.raw_name(entry)?;
        let mut name = demangle(raw);
        let system = (name != raw).then_some(raw);
        if entry.plt {
            name.push_str("@plt");
        }
        Some((name, system))
    }

    /// Every name, demangled, in address order.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.entries
            .iter()
            .filter_map(|e| self.name_of(e))
            .map(|(name, _)| name)
    }
}

impl Resolver for ElfSymbols {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        let (name, system, entry) = self.lookup_entry(address)?;
        let source = self.source.unwrap_or(if entry.dynamic {
            NameSource::Dynsym
        } else {
            NameSource::Symtab
        });
        Some(vec![Frame {
            function: name,
            system_name: system.map(str::to_string),
            file: None,
            line: None,
            inlined: false,
            source,
        }])
    }
}

/// The PLT's stubs, each named as objdump names it: after the dynamic
/// symbol of the relocation that fills the GOT slot the stub jumps
/// through (`.rela.plt`, or `.rela.dyn` for x86-64's `.plt.got`). The
/// slot is decoded from the stub's own instructions: the n-th stub is not
/// the n-th relocation (libc's IRELATIVE stubs come first, their
/// relocations do not). A stub whose slot has no named relocation (an
/// IRELATIVE one) or whose code is not a known stub is left unnamed.
fn plt_stubs(file: &object::File<'_>, base: usize, len: usize) -> Vec<Entry> {
    use std::collections::HashMap;
    let stub_slot: fn(&[u8], u64) -> Option<u64> = match file.architecture() {
        object::Architecture::X86_64 => x86_64_stub_slot,
        object::Architecture::Aarch64 => aarch64_stub_slot,
        _ => return Vec::new(),
    };
    let sections: Vec<_> = file
        .sections()
        .filter(|s| matches!(s.name(), Ok(".plt" | ".plt.sec" | ".plt.got")))
        .collect();
    // No PLT (a debug file's is empty): the relocations are not read.
    if sections.is_empty() {
        return Vec::new();
    }
    let (Some(relocations), Some(dynamic)) =
        (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return Vec::new();
    };
    let symbol_of_slot: HashMap<u64, object::SymbolIndex> = relocations
        .filter_map(|(slot, relocation)| match relocation.target() {
            object::RelocationTarget::Symbol(index) if index.0 != 0 => Some((slot, index)),
            _ => None,
        })
        .collect();
    let mut entries = Vec::new();
    for section in sections {
        let Ok(code) = section.data() else { continue };
        // Stubs are 16 bytes, but for x86-64's `.plt.got` without IBT
        // (`jmp *slot(%rip)` and a 2-byte nop). The PLT's header, and the
        // lazy-binding entries of an IBT `.plt`, decode as no stub.
        let step = if section.name() == Ok(".plt.got") && !code.starts_with(&ENDBR64) {
            8
        } else {
            16
        };
        for (n, stub) in code.chunks_exact(step).enumerate() {
            let address = section.address() + (n * step) as u64;
            let Some(index) = stub_slot(stub, address).and_then(|slot| symbol_of_slot.get(&slot))
            else {
                continue;
            };
            let Ok(name) = dynamic.symbol_by_index(*index).and_then(|s| s.name()) else {
                continue;
            };
            let Some((name_offset, name_len)) = name_span(name, base, len) else {
                continue;
            };
            entries.push(Entry {
                address,
                size: step as u64,
                name_offset,
                name_len,
                dynamic: true,
                plt: true,
            });
        }
    }
    entries
}

/// Where `name`, a slice of the file's bytes (object reads names without
/// copying; the bytes start at address `base` and are `len` long), sits
/// in them: kept instead of the text. None for an empty name or one
/// outside the bytes.
fn name_span(name: &str, base: usize, len: usize) -> Option<(u64, u32)> {
    let offset = (name.as_ptr() as usize).wrapping_sub(base);
    if name.is_empty() || offset.checked_add(name.len())? > len {
        return None;
    }
    Some((offset as u64, u32::try_from(name.len()).ok()?))
}

/// `endbr64`, which begins every stub of an IBT-enabled x86-64 PLT.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The GOT slot an x86-64 stub at `address` jumps through:
/// `[endbr64] [bnd] jmp *disp32(%rip)`.
fn x86_64_stub_slot(stub: &[u8], address: u64) -> Option<u64> {
    let mut at = if stub.starts_with(&ENDBR64) { 4 } else { 0 };
    if stub.get(at) == Some(&0xf2) {
        at += 1; // bnd
    }
    if stub.get(at..at + 2)? != [0xff, 0x25] {
        return None;
    }
    let displacement = i32::from_le_bytes(stub.get(at + 2..at + 6)?.try_into().ok()?);
    let next = address.checked_add(at as u64 + 6)?;
    Some(next.wrapping_add(i64::from(displacement) as u64))
}

/// The GOT slot an arm64 stub at `address` loads its target from:
/// `adrp x16, page; ldr x17, [x16, #offset]` (after a `bti c` where BTI
/// is on).
fn aarch64_stub_slot(stub: &[u8], address: u64) -> Option<u64> {
    const BTI_C: u32 = 0xd503_245f;
    let word = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            stub.get(i * 4..i * 4 + 4)?.try_into().ok()?,
        ))
    };
    let first = usize::from(word(0)? == BTI_C);
    let (adrp, ldr) = (word(first)?, word(first + 1)?);
    // adrp x16 (Rd = 16), then ldr x17, [x16, #imm12 * 8].
    if adrp & 0x9f00_001f != 0x9000_0010 || ldr & 0xffc0_03ff != 0xf940_0211 {
        return None;
    }
    let immediate = (u64::from(adrp >> 5) & 0x7_ffff) << 2 | (u64::from(adrp >> 29) & 3);
    // 21 bits, signed, in pages.
    let pages = ((immediate << 43) as i64) >> 43;
    let at = address + (first as u64) * 4;
    let page = (at & !0xfff).wrapping_add((pages << 12) as u64);
    Some(page.wrapping_add(u64::from((ldr >> 10) & 0xfff) * 8))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::ElfSymbols;

    fn fixture_source(relative: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(relative)
    }

    fn compile(compiler: &str, source: &str, flags: &[&str], dir: &Path) -> PathBuf {
        let out = dir.join("fixture");
        let status = Command::new(compiler)
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(fixture_source(source))
            .status()
            .unwrap_or_else(|e| panic!("running {compiler} (cargo xtask setup --tests): {e}"));
        assert!(status.success(), "{compiler} {source} failed");
        out
    }

    /// `nm` lines of defined code symbols: (address, size, type, name).
    fn nm(binary: &Path, demangle: bool) -> Vec<(u64, Option<u64>, char, String)> {
        let mut command = Command::new("nm");
        command.args(["--defined-only", "-S"]);
        if demangle {
            command.arg("-C");
        }
        let output = command.arg(binary).output().expect("running nm (binutils)");
        assert!(output.status.success());
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.splitn(4, ' ').collect();
                let address = u64::from_str_radix(fields[0], 16).ok()?;
                let (size, kind, name) = match fields.len() {
                    4 => (
                        u64::from_str_radix(fields[1], 16).ok(),
                        fields[2],
                        fields[3],
                    ),
                    3 => (None, fields[1], fields[2]),
                    _ => return None,
                };
                let kind = kind.chars().next()?;
                matches!(kind, 'T' | 't' | 'W' | 'w')
                    .then(|| (address, size, kind, name.to_string()))
            })
            .collect()
    }

    fn symbols_of(binary: &Path) -> ElfSymbols {
        let data: crate::FileBytes = std::sync::Arc::new(std::fs::read(binary).unwrap());
        let file = object::File::parse((*data).as_ref()).unwrap();
        ElfSymbols::from_object(&file, &data)
    }

    /// Every code symbol `nm` lists is found at its address and at its
    /// last byte, under its own name or an alias at the same address.
    fn assert_agrees_with_nm(binary: &Path) -> usize {
        use object::{Object, ObjectSection, SectionKind};
        let symbols = symbols_of(binary);
        // nm's W/w (weak) covers data too: keep symbols in code sections.
        let data = std::fs::read(binary).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let code: Vec<(u64, u64)> = file
            .sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        let listed: Vec<_> = nm(binary, true)
            .into_iter()
            .filter(|(a, ..)| code.iter().any(|(lo, hi)| lo <= a && a < hi))
            .collect();
        let mut checked = 0;
        for &(address, size, _, ref name) in &listed {
            if address == 0 {
                continue;
            }
            let aliases: Vec<&str> = listed
                .iter()
                .filter(|(a, ..)| *a == address)
                .map(|(.., n)| n.as_str())
                .collect();
            let (found, _, start) = symbols
                .lookup(address)
                .unwrap_or_else(|| panic!("{name} at {address:#x} not found"));
            assert_eq!(start, address, "{name}");
            assert!(
                aliases.contains(&found.as_str()),
                "{address:#x}: we say {found}, nm says {aliases:?}"
            );
            if let Some(size) = size.filter(|&s| s > 1) {
                let (last, ..) = symbols.lookup(address + size - 1).unwrap();
                assert!(
                    aliases.contains(&last.as_str()),
                    "{name}+{:#x}: we say {last}",
                    size - 1
                );
            }
            checked += 1;
        }
        checked
    }

    #[test]
    fn c_symbols_agree_with_nm() {
        let dir = tempfile::tempdir().unwrap();
        let binary = compile("cc", "c/hot.c", &["-O2", "-g"], dir.path());
        let checked = assert_agrees_with_nm(&binary);
        assert!(checked >= 5, "only {checked} symbols checked");
        let symbols = symbols_of(&binary);
        for name in ["main", "hot_a", "hot_b", "round_trip"] {
            assert!(
                nm(&binary, false).iter().any(|(.., n)| n == name),
                "nm lacks {name}"
            );
            let address = nm(&binary, false)
                .into_iter()
                .find(|(.., n)| n == name)
                .unwrap()
                .0;
            assert_eq!(symbols.lookup(address).unwrap().0, name);
        }
    }

    /// The PLT has no symbols of its own: its stubs are named as objdump
    /// names them (`clock_gettime@plt`), on x86-64 and arm64, in a program
    /// and in libc (whose IRELATIVE stubs, which objdump calls
    /// `*ABS*+0x...@plt`, come before the named ones and stay unnamed), and
    /// never after the sizeless symbol before them (crti's `_init`).
    #[test]
    fn plt_stubs_are_named_as_objdump_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut objects = Vec::new();
        for (compiler, objdump) in [
            ("cc", "objdump"),
            ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-objdump"),
        ] {
            let out = dir.path().join(compiler);
            std::fs::create_dir_all(&out).unwrap();
            let binary = compile(compiler, "c/offcpu.c", &["-O2", "-pthread"], &out);
            let init = nm(&binary, false)
                .into_iter()
                .find(|(.., n)| n == "_init")
                .expect("crti's _init in the fixture");
            assert_eq!(
                symbols_of(&binary).lookup(init.0).map(|l| l.0).as_deref(),
                Some("_init")
            );
            objects.push((binary, objdump, 10));
        }
        let libc = Command::new("cc")
            .arg("-print-file-name=libc.so.6")
            .output()
            .expect("cc -print-file-name");
        let libc = PathBuf::from(String::from_utf8(libc.stdout).unwrap().trim());
        objects.push((libc, "objdump", 5));
        for (object, objdump, at_least) in objects {
            let symbols = symbols_of(&object);
            let output = Command::new(objdump)
                .arg("-d")
                .arg(&object)
                .output()
                .unwrap_or_else(|e| panic!("running {objdump} (binutils): {e}"));
            let text = String::from_utf8_lossy(&output.stdout);
            // "0000000000001060 <clock_gettime@plt>:"
            let stubs: Vec<(u64, &str)> = text
                .lines()
                .filter_map(|line| {
                    let (address, rest) = line.split_once(" <")?;
                    let name = rest.strip_suffix(">:")?;
                    let address = u64::from_str_radix(address, 16).ok()?;
                    name.ends_with("@plt").then_some((address, name))
                })
                .collect();
            let mut named = 0;
            for (address, name) in &stubs {
                for at in [*address, address + 4] {
                    let found = symbols.lookup(at).map(|l| l.0);
                    if name.starts_with("*ABS*") {
                        assert!(
                            found.as_deref().is_none_or(|f| !f.ends_with("@plt")),
                            "{}: {at:#x} ({name}) named {found:?}",
                            object.display()
                        );
                    } else {
                        assert_eq!(
                            found.as_deref(),
                            Some(*name),
                            "{}: {at:#x}",
                            object.display()
                        );
                        named += 1;
                    }
                }
            }
            assert!(
                named >= 2 * at_least,
                "{}: {named} stub addresses named of {} stubs",
                object.display(),
                stubs.len()
            );
        }
    }

    #[test]
    fn cpp_symbols_agree_with_nm_demangled() {
        let dir = tempfile::tempdir().unwrap();
        let binary = compile("g++", "cpp/shapes.cpp", &["-O2", "-g"], dir.path());
        let checked = assert_agrees_with_nm(&binary);
        assert!(checked >= 5, "only {checked} symbols checked");
        let symbols = symbols_of(&binary);
        let demangled: Vec<String> = symbols.names().collect();
        for expected in [
            "geometry::Circle::area() const",
            "geometry::scale(double, int)",
            "geometry::scale(double, double)",
            "int geometry::sum<int>(int const*, int)",
            "double geometry::sum<double>(double const*, int)",
        ] {
            // GCC may clone a function (`area() const [clone .isra.0]`).
            assert!(
                demangled.iter().any(|n| n.starts_with(expected)),
                "{expected} not in {demangled:?}"
            );
        }
        // The mangled name is kept as the system name.
        let (_, system, _) = symbols
            .lookup(
                nm(&binary, false)
                    .into_iter()
                    .find(|(.., n)| n == "_ZN8geometry5scaleEdi")
                    .unwrap()
                    .0,
            )
            .unwrap();
        assert_eq!(system, Some("_ZN8geometry5scaleEdi"));
    }

    #[test]
    fn stripped_binaries_fall_back_to_dynsym() {
        let dir = tempfile::tempdir().unwrap();
        // -rdynamic exports main and friends through .dynsym; -s drops .symtab.
        let binary = compile("cc", "c/hot.c", &["-O2", "-rdynamic", "-s"], dir.path());
        let symbols = symbols_of(&binary);
        assert!(!symbols.is_empty());
        let dynamic = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(&binary)
            .output()
            .unwrap();
        let text = String::from_utf8(dynamic.stdout).unwrap();
        let hot_a = text
            .lines()
            .find(|l| l.ends_with(" hot_a"))
            .expect("hot_a in .dynsym");
        let address = u64::from_str_radix(hot_a.split(' ').next().unwrap(), 16).unwrap();
        assert_eq!(symbols.lookup(address).unwrap().0, "hot_a");
    }
}

/// An Arm ELF mapping symbol: `$a`, `$d`, `$t` or `$x`, alone or followed
/// by a `.` and anything (AAELF64 5.7.2).
fn is_mapping_symbol(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() >= 2
        && bytes[0] == b'$'
        && matches!(bytes[1], b'a' | b'd' | b't' | b'x')
        && (bytes.len() == 2 || bytes[2] == b'.')
}

#[cfg(test)]
mod mapping_symbol_tests {
    use super::is_mapping_symbol;

    #[test]
    fn arm_mapping_symbols_are_not_functions() {
        for name in ["$x", "$d", "$x.12", "$d.0", "$a", "$t"] {
            assert!(is_mapping_symbol(name), "{name}");
        }
        for name in ["$xyz", "x", "$", "$e", "main", "$x_y"] {
            assert!(!is_mapping_symbol(name), "{name}");
        }
    }
}

//! Function names from the ELF symbol tables (`.symtab`, then `.dynsym`).

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

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
            // The name is a slice of `data` (object reads without copying):
            // keep where it is, not the text.
            let offset = (name.as_ptr() as usize).wrapping_sub(base);
            if name.is_empty()
                || offset
                    .checked_add(name.len())
                    .is_none_or(|end| end > bytes.len())
            {
                return;
            }
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
                name_offset: offset as u64,
                name_len: u32::try_from(name.len()).unwrap_or(0),
                dynamic,
            };
            raw.push((entry.address, entry.size, symbol.is_global(), entry));
        };
        file.symbols().for_each(|s| take(s, false));
        file.dynamic_symbols().for_each(|s| take(s, true));

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
        let raw = self.raw_name(entry)?;
        let name = demangle(raw);
        let system = (name != raw).then_some(raw);
        Some((name, system, entry))
    }

    /// Every name, demangled, in address order.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.entries
            .iter()
            .filter_map(|e| self.raw_name(e))
            .map(demangle)
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

    /// The PLT has no symbols of its own: a sizeless symbol before it (crti's
    /// `_init`, in .init) must not name its stubs.
    #[test]
    fn plt_stubs_are_not_named_after_the_sizeless_symbol_before_them() {
        use object::{Object, ObjectSection};
        let dir = tempfile::tempdir().unwrap();
        let binary = compile("cc", "c/offcpu.c", &["-O2", "-pthread"], dir.path());
        let symbols = symbols_of(&binary);
        let data = std::fs::read(&binary).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let init = nm(&binary, false)
            .into_iter()
            .find(|(.., n)| n == "_init")
            .expect("crti's _init in the fixture");
        assert_eq!(
            symbols.lookup(init.0).map(|l| l.0).as_deref(),
            Some("_init")
        );
        let mut checked = 0;
        for section in file.sections() {
            let Ok(name) = section.name() else { continue };
            if !name.starts_with(".plt") {
                continue;
            }
            for address in (section.address()..section.address() + section.size()).step_by(4) {
                let found = symbols.lookup(address).map(|l| l.0);
                assert_ne!(found.as_deref(), Some("_init"), "{name} at {address:#x}");
                checked += 1;
            }
        }
        assert!(checked > 0, "no .plt section in the fixture");
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

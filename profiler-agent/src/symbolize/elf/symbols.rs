//! Function names from the ELF symbol tables (`.symtab`, then `.dynsym`).

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use super::super::demangle::demangle;
use super::super::frame::{Frame, Resolver};

#[derive(Debug, Clone, Copy)]
struct Entry {
    address: u64,
    /// 0 when the table does not say (assembly labels).
    size: u64,
    /// Index into `ElfSymbols::names`.
    name: u32,
}

/// A sorted table of function symbols with their demangled names.
pub struct ElfSymbols {
    entries: Vec<Entry>,
    /// (demangled, mangled-if-different)
    names: Vec<(String, Option<String>)>,
}

impl ElfSymbols {
    /// Reads every function symbol of `file`: `.symtab` first, then
    /// `.dynsym` for what a stripped file still exports. At one address the
    /// first name seen wins, a global over a local.
    pub fn from_object<'data>(file: &object::File<'data>) -> Self {
        let mut raw: Vec<(u64, u64, bool, &'data str)> = Vec::new();
        let text_sections: Vec<_> = file
            .sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .map(|s| s.index())
            .collect();
        let mut take = |symbol: object::Symbol<'data, '_>| {
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
            if let Ok(name) = symbol.name()
                && !name.is_empty()
            {
                raw.push((symbol.address(), symbol.size(), symbol.is_global(), name));
            }
        };
        file.symbols().for_each(&mut take);
        file.dynamic_symbols().for_each(&mut take);

        // Stable sort keeps .symtab before .dynsym at equal keys; globals first.
        raw.sort_by_key(|&(address, _, global, _)| (address, !global));
        raw.dedup_by_key(|&mut (address, ..)| address);

        let mut names = Vec::with_capacity(raw.len());
        let mut entries = Vec::with_capacity(raw.len());
        for (address, size, _, name) in raw {
            let demangled = demangle(name);
            let system = (demangled != name).then(|| name.to_string());
            entries.push(Entry {
                address,
                size,
                name: names.len() as u32,
            });
            names.push((demangled, system));
        }
        ElfSymbols { entries, names }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The symbol covering `address`: the last one starting at or below it,
    /// if its size reaches `address` (sizeless symbols reach to the next).
    pub fn lookup(&self, address: u64) -> Option<(&str, Option<&str>, u64)> {
        let index = self.entries.partition_point(|e| e.address <= address);
        let entry = self.entries.get(index.checked_sub(1)?)?;
        if entry.size != 0 && address >= entry.address + entry.size {
            return None;
        }
        let (name, system) = &self.names[entry.name as usize];
        Some((name, system.as_deref(), entry.address))
    }
}

impl Resolver for ElfSymbols {
    fn kind(&self) -> &'static str {
        "elf-symbols"
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        let (name, system, _) = self.lookup(address)?;
        Some(vec![Frame {
            function: name.to_string(),
            system_name: system.map(str::to_string),
            file: None,
            line: None,
            inlined: false,
        }])
    }
}

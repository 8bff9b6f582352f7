//! Functions to put `uprobe:PATH:SYMBOL` / `uretprobe:PATH:SYMBOL` on:
//! names (exact or glob) resolved through the ELF symbol tables, and for Go
//! binaries through the pclntab (which survives stripping), each with the
//! file offset a uprobe attaches at and, for return probes on Go code, the
//! offsets of its RET instructions.
//!
//! Why RETs for Go: a uretprobe replaces the return address on the stack,
//! and when the goroutine's stack grows the Go runtime copies the stack and
//! walks it, finds the trampoline address and aborts ("unexpected return
//! pc", verified with Go 1.19; PROBES.md). Entry uprobes on each RET leave
//! the stack alone.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::registers::Arch;
use super::spec::{glob_match, is_glob, suggest};
use profiler_runtimes::go::pclntab::GoSymbols;
use profiler_symbolize::demangle::{demangle, demangle_base};

/// One function matching a symbol pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// The name as stored (mangled for C++ and Rust).
    pub name: String,
    /// Demangled, with parameters (`shop::Register::ring(int)`); the name
    /// itself for C and Go.
    pub demangled: String,
    /// Demangled without parameters or return type
    /// (`shop::Register::ring`).
    pub base: String,
    /// Link-time address of the entry and its size in bytes.
    pub address: u64,
    pub size: u64,
    /// File offset of the entry.
    pub file_offset: u64,
}

/// What a binary offers to function probes.
#[derive(Debug)]
pub struct FunctionTable {
    pub path: PathBuf,
    pub arch: Arch,
    /// A Go binary (a pclntab was found): return probes use RET sites and
    /// starts are keyed by goroutine.
    pub is_go: bool,
    functions: Vec<Function>,
    data: memmap2::Mmap,
    /// (link address, size, file offset) of each PT_LOAD.
    segments: Vec<(u64, u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FunctionError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} is not an ELF file we can read: {reason}")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path}: architecture {arch} is not supported (x86_64 and arm64 are)")]
    Arch { path: PathBuf, arch: String },
    #[error(
        "{path} has no symbol table (.symtab/.dynsym) and no Go pclntab: it is stripped; \
         use a USDT probe or an unstripped build"
    )]
    NoSymbols { path: PathBuf },
    #[error("no function {pattern:?} in {path}{hint}")]
    NoMatch {
        path: PathBuf,
        pattern: String,
        hint: String,
    },
    #[error(
        "{pattern:?} names {} functions in {path}: {}; name one in full (as listed) to \
         pick it, or a glob ({pattern}*) to attach to all",
        candidates.len(),
        candidates.join(", ")
    )]
    Ambiguous {
        path: PathBuf,
        pattern: String,
        candidates: Vec<String>,
    },
    #[error("{path}: function {name} at {address:#x} is outside every loadable segment")]
    NotLoaded {
        path: PathBuf,
        name: String,
        address: u64,
    },
    #[error("{path}: cannot find the return instructions of {name}: {reason}")]
    Returns {
        path: PathBuf,
        name: String,
        reason: String,
    },
}

impl FunctionTable {
    /// Reads `open_path` (named `display_path` in messages).
    pub fn read(open_path: &Path, display_path: &Path) -> Result<FunctionTable, FunctionError> {
        let path = display_path.to_path_buf();
        let data = profiler_symbolize::process::contained::map(open_path).map_err(|e| {
            FunctionError::Read {
                path: path.clone(),
                reason: e.to_string(),
            }
        })?;
        let file = object::File::parse(&*data).map_err(|e| FunctionError::NotElf {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let arch = Arch::from_object(file.architecture()).ok_or_else(|| FunctionError::Arch {
            path: path.clone(),
            arch: format!("{:?}", file.architecture()),
        })?;
        let segments: Vec<(u64, u64, u64)> = file
            .segments()
            .map(|s| (s.address(), s.size(), s.file_range().0))
            .collect();
        let (is_go, mut raw) = match GoSymbols::from_file(&file) {
            Ok(go) => (
                true,
                go.functions()
                    .map(|f| (f.name().into_owned(), f.entry(), f.end() - f.entry()))
                    .collect::<Vec<_>>(),
            ),
            Err(_) => (false, Vec::new()),
        };
        if !is_go {
            for symbol in file.symbols().chain(file.dynamic_symbols()) {
                if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                    continue;
                }
                if let Ok(name) = symbol.name() {
                    raw.push((name.to_string(), symbol.address(), symbol.size()));
                }
            }
        }
        if raw.is_empty() {
            return Err(FunctionError::NoSymbols { path });
        }
        raw.sort();
        raw.dedup();
        let functions = raw
            .into_iter()
            .filter_map(|(name, address, size)| {
                let file_offset = file_offset(&segments, address)?;
                let (demangled, base) = if is_go {
                    (name.clone(), name.clone())
                } else {
                    (demangle(&name), demangle_base(&name))
                };
                Some(Function {
                    name,
                    demangled,
                    base,
                    address,
                    size,
                    file_offset,
                })
            })
            .collect();
        drop(file);
        Ok(FunctionTable {
            path,
            arch,
            is_go,
            functions,
            data,
            segments,
        })
    }

    /// Every function, in name order.
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// Functions named `pattern`: a glob (every match: `shop::Register::*`)
    /// or an exact name, each compared with the name as stored (mangled),
    /// demangled with parameters (`shop::Register::ring(int)`) and without
    /// (`shop::Register::ring`). An exact name without parameters that
    /// names several functions (overloads, template instances) is refused
    /// with the candidates; an unknown one with the nearest names.
    pub fn find(&self, pattern: &str) -> Result<Vec<&Function>, FunctionError> {
        let matches = self.list(pattern)?;
        let mut distinct: Vec<u64> = matches.iter().map(|f| f.address).collect();
        distinct.sort_unstable();
        distinct.dedup();
        if !is_glob(pattern) && distinct.len() > 1 {
            return Err(FunctionError::Ambiguous {
                path: self.path.clone(),
                pattern: pattern.to_string(),
                candidates: matches
                    .iter()
                    .map(|f| format!("{} at {:#x}", f.demangled, f.address))
                    .collect(),
            });
        }
        Ok(matches)
    }

    /// Every function `pattern` matches (as `find` matches, all of an
    /// ambiguous name); an error with the nearest names when none does.
    pub fn list(&self, pattern: &str) -> Result<Vec<&Function>, FunctionError> {
        fn names(f: &Function) -> [&str; 4] {
            [
                &f.name,
                &f.demangled,
                &f.base,
                without_template_arguments(&f.base),
            ]
        }
        let matches: Vec<&Function> = if is_glob(pattern) {
            self.functions
                .iter()
                .filter(|f| names(f).iter().any(|n| glob_match(pattern, n)))
                .collect()
        } else {
            // The stored or full demangled name picks one function; the
            // base name may pick several.
            let exact: Vec<&Function> = self
                .functions
                .iter()
                .filter(|f| f.name == pattern || f.demangled == pattern)
                .collect();
            if exact.is_empty() {
                self.functions
                    .iter()
                    .filter(|f| f.base == pattern || without_template_arguments(&f.base) == pattern)
                    .collect()
            } else {
                exact
            }
        };
        if matches.is_empty() {
            let near = suggest(
                pattern,
                self.functions
                    .iter()
                    .flat_map(|f| [f.name.as_str(), f.base.as_str()]),
            );
            let hint = if near.is_empty() {
                String::new()
            } else {
                format!(" (did you mean {}?)", near.join(", "))
            };
            return Err(FunctionError::NoMatch {
                path: self.path.clone(),
                pattern: pattern.to_string(),
                hint,
            });
        }
        Ok(matches)
    }

    /// File offsets of every return instruction of `function`.
    pub fn return_offsets(&self, function: &Function) -> Result<Vec<u64>, FunctionError> {
        let fail = |reason: String| FunctionError::Returns {
            path: self.path.clone(),
            name: function.name.clone(),
            reason,
        };
        if function.size == 0 {
            return Err(fail("the symbol has no size".to_string()));
        }
        let start = function.file_offset as usize;
        let code = start
            .checked_add(function.size as usize)
            .and_then(|end| self.data.get(start..end))
            .ok_or_else(|| fail("its bytes are not in the file".to_string()))?;
        let returns = return_addresses(code, function.address, self.arch);
        if returns.is_empty() {
            return Err(fail(
                "it has no RET instruction (does it ever return?)".to_string(),
            ));
        }
        returns
            .into_iter()
            .map(|address| {
                file_offset(&self.segments, address).ok_or_else(|| FunctionError::NotLoaded {
                    path: self.path.clone(),
                    name: function.name.clone(),
                    address,
                })
            })
            .collect()
    }
}

/// A template instance's name without its arguments (`shop::sum_of` for
/// `shop::sum_of<double>`), so one name picks every instance.
fn without_template_arguments(name: &str) -> &str {
    if !name.ends_with('>') {
        return name;
    }
    let mut depth = 0usize;
    for (i, c) in name.char_indices().rev() {
        match c {
            '>' => depth += 1,
            '<' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &name[..i];
                }
            }
            _ => {}
        }
    }
    name
}

/// The file offset of a link-time address, through the PT_LOAD holding it.
fn file_offset(segments: &[(u64, u64, u64)], address: u64) -> Option<u64> {
    segments
        .iter()
        .find(|(start, size, _)| *start <= address && address - start < *size)
        .map(|(start, _, offset)| address - start + offset)
}

/// Addresses of the return instructions in `code`, which starts at
/// `address`. x86_64 is decoded instruction by instruction (a `0xc3`
/// byte may be part of another instruction); arm64 instructions are
/// 4-byte words, and `RET Xn` is `0xd65f0000 | n << 5`.
pub fn return_addresses(code: &[u8], address: u64, arch: Arch) -> Vec<u64> {
    match arch {
        Arch::X86_64 => {
            use iced_x86::{Decoder, DecoderOptions, Mnemonic};
            let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
            let mut returns = Vec::new();
            while decoder.can_decode() {
                let instruction = decoder.decode();
                if instruction.mnemonic() == Mnemonic::Ret {
                    returns.push(instruction.ip());
                }
            }
            returns
        }
        Arch::Arm64 => code
            .chunks_exact(4)
            .enumerate()
            .filter(|(_, word)| {
                let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                word & 0xffff_fc1f == 0xd65f_0000
            })
            .map(|(i, _)| address + 4 * i as u64)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_64_returns_are_decoded_not_grepped() {
        // mov eax, 0xc3 (b8 c3 00 00 00); ret (c3); int3 padding; ret imm16.
        let code = [0xb8, 0xc3, 0, 0, 0, 0xc3, 0xcc, 0xc2, 0x08, 0x00];
        assert_eq!(
            return_addresses(&code, 0x1000, Arch::X86_64),
            vec![0x1005, 0x1007]
        );
    }

    #[test]
    fn arm64_returns() {
        let words: [u32; 4] = [0xd503201f, 0xd65f03c0, 0xd65f0220, 0xd61f0200];
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        // nop; ret; ret x17; br x16 (not a return).
        assert_eq!(
            return_addresses(&code, 0x400, Arch::Arm64),
            vec![0x404, 0x408]
        );
    }

    #[test]
    fn template_arguments_are_cut_at_the_matching_bracket() {
        assert_eq!(
            without_template_arguments("shop::sum_of<double>"),
            "shop::sum_of"
        );
        assert_eq!(
            without_template_arguments("ns::f<std::vector<int, std::allocator<int> > >"),
            "ns::f"
        );
        assert_eq!(without_template_arguments("operator>"), "operator>");
        assert_eq!(without_template_arguments("main"), "main");
    }

    #[test]
    fn offsets_go_through_segments() {
        let segments = [(0x0, 0x1000, 0x0), (0x401000, 0x2000, 0x1000)];
        assert_eq!(file_offset(&segments, 0x401234), Some(0x1234));
        assert_eq!(file_offset(&segments, 0x10), Some(0x10));
        assert_eq!(file_offset(&segments, 0x403000), None);
    }

    #[test]
    fn finds_functions_of_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let table = FunctionTable::read(&exe, &exe).unwrap();
        assert!(!table.is_go);
        let main = table.find("main").unwrap();
        assert_eq!(main.len(), 1);
        let error = table.find("mian").unwrap_err().to_string();
        assert!(
            error.contains("did you mean") && error.contains("main"),
            "{error}"
        );
        assert!(!table.find("mai?").unwrap().is_empty());
    }
}

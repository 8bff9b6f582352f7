//! USDT probe sites from an ELF file's `.note.stapsdt` section.
//!
//! Layout (sys/sdt.h, `_SDT_NOTE_TYPE` 3):
//! one note per probe site, owner `stapsdt`, type 3; the descriptor holds
//! three pointer-sized words (site PC, link-time address of
//! `_.stapsdt.base`, semaphore address or 0) then three NUL-terminated
//! strings (provider, name, arguments). Notes are 4-byte aligned.
//!
//! The section is not loaded, so prelink-style relocation is undone by the
//! `.stapsdt.base` adjustment, and every address is turned into the file
//! offset a uprobe attaches at through the PT_LOAD segment containing it.

use std::fmt;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags};
use serde::Serialize;

use super::args::{ArgSpec, ArgSpecError, Location, parse_args};
use super::registers::Arch;

/// The note owner and type `sys/sdt.h` writes.
const NOTE_OWNER: &[u8] = b"stapsdt";
const NOTE_TYPE: u32 = 3;
const NOTE_SECTION: &str = ".note.stapsdt";
const BASE_SECTION: &str = ".stapsdt.base";

/// ELF segment permission bits (elf.h).
const PF_X: u32 = 1;
const PF_W: u32 = 2;

/// One probe site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// The argument string as written in the note, e.g. `-4@%edi 8@%rsi`.
    pub args: String,
    /// The parsed arguments, or why they could not be parsed (also when
    /// the file's architecture is not one we know).
    pub arguments: Result<Vec<ArgSpec>, ArgSpecError>,
    /// Link-time virtual address of the site (after the base adjustment).
    pub address: u64,
    /// Offset in the file: what a uprobe attaches at.
    pub file_offset: u64,
    /// The semaphore (a u16 counter the probe's code tests), if any.
    pub semaphore: Option<Semaphore>,
}

/// A probe's semaphore: its link-time address and the file offset the
/// kernel takes as `ref_ctr_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Semaphore {
    pub address: u64,
    pub file_offset: u64,
}

impl UsdtProbe {
    /// `provider:name`.
    pub fn qualified_name(&self) -> String {
        format!("{}:{}", self.provider, self.name)
    }

    /// Argument `index` (0-based) of this site, refusing an index beyond the
    /// arguments the site has, or arguments that did not parse.
    pub fn argument(&self, index: usize) -> Result<&ArgSpec, UsdtError> {
        let arguments = self
            .arguments
            .as_ref()
            .map_err(|error| UsdtError::Arguments {
                probe: self.qualified_name(),
                source: error.clone(),
            })?;
        arguments
            .get(index)
            .ok_or_else(|| UsdtError::NoSuchArgument {
                probe: self.qualified_name(),
                index,
                count: arguments.len(),
            })
    }
}

impl fmt::Display for UsdtProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} at {:#x}", self.provider, self.name, self.address)
    }
}

/// Every probe site of one file.
#[derive(Debug, Clone)]
pub struct UsdtProbes {
    pub path: PathBuf,
    /// `None` for architectures whose argument specs we do not parse.
    pub arch: Option<Arch>,
    /// Probe sites in note order.
    pub probes: Vec<UsdtProbe>,
    /// Notes that were malformed or pointed outside every PT_LOAD.
    pub skipped: Vec<UsdtError>,
}

impl UsdtProbes {
    /// Sites of `provider:name` (one name may have many sites).
    pub fn sites<'a>(
        &'a self,
        provider: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a UsdtProbe> + 'a {
        self.probes
            .iter()
            .filter(move |p| p.provider == provider && p.name == name)
    }

    /// Distinct `provider:name` pairs, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.probes.iter().map(UsdtProbe::qualified_name).collect();
        names.sort();
        names.dedup();
        names
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsdtError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} is not an ELF file we can read: {reason}")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} has no USDT probes (.note.stapsdt)")]
    NoNotes { path: PathBuf },
    #[error("{path}: USDT note {index}: {reason}")]
    BadNote {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("probe {probe}: {source}")]
    Arguments {
        probe: String,
        #[source]
        source: ArgSpecError,
    },
    #[error(
        "probe {probe} has {count} argument(s); there is no argument {index} (they count from 0)"
    )]
    NoSuchArgument {
        probe: String,
        index: usize,
        count: usize,
    },
}

/// A note's descriptor as written, before any address conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawNote {
    pub pc: u64,
    pub base: u64,
    pub semaphore: u64,
    pub provider: String,
    pub name: String,
    pub args: String,
}

/// A PT_LOAD segment: where its bytes are in memory and in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub executable: bool,
    pub writable: bool,
}

impl LoadSegment {
    fn contains(&self, address: u64) -> bool {
        self.vaddr <= address && address - self.vaddr < self.memsz
    }

    fn file_offset(&self, address: u64) -> u64 {
        // Wrapping: a malformed p_offset must not panic.
        (address - self.vaddr).wrapping_add(self.offset)
    }
}

/// Reads the probe sites of the ELF file at `path`.
pub fn read_probes(path: &Path) -> Result<UsdtProbes, UsdtError> {
    read_probes_as(path, path)
}

/// Reads the file at `open_path` (e.g. through `/proc/PID/root`), naming it
/// `display_path` in results and errors.
pub fn read_probes_as(open_path: &Path, display_path: &Path) -> Result<UsdtProbes, UsdtError> {
    // Resolved inside the process's root, regular files only, mapped.
    let data = profiler_symbolize::process::contained::map(open_path).map_err(|error| {
        UsdtError::Read {
            path: display_path.to_path_buf(),
            reason: error.to_string(),
        }
    })?;
    probes_from_elf(&data, display_path)
}

/// Reads the probe sites of an ELF image in memory; `path` names it in
/// errors.
pub fn probes_from_elf(data: &[u8], path: &Path) -> Result<UsdtProbes, UsdtError> {
    let not_elf = |reason: String| UsdtError::NotElf {
        path: path.to_path_buf(),
        reason,
    };
    let file = object::File::parse(data).map_err(|e| not_elf(e.to_string()))?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(not_elf(format!("it is {:?}", file.format())));
    }
    let Some(section) = file.section_by_name(NOTE_SECTION) else {
        return Err(UsdtError::NoNotes {
            path: path.to_path_buf(),
        });
    };
    let notes = section
        .data()
        .map_err(|e| not_elf(format!("{NOTE_SECTION}: {e}")))?;
    let base_address = file
        .section_by_name(BASE_SECTION)
        .map(|s| s.address())
        .unwrap_or(0);
    let segments: Vec<LoadSegment> = file
        .segments()
        .map(|segment| {
            let flags = match segment.flags() {
                SegmentFlags::Elf { p_flags } => p_flags,
                _ => 0,
            };
            LoadSegment {
                vaddr: segment.address(),
                memsz: segment.size(),
                offset: segment.file_range().0,
                executable: flags & PF_X != 0,
                writable: flags & PF_W != 0,
            }
        })
        .collect();
    let layout = NoteLayout {
        little_endian: file.is_little_endian(),
        word_size: if file.is_64() { 8 } else { 4 },
    };
    let arch = Arch::from_object(file.architecture());
    let mut result = UsdtProbes {
        path: path.to_path_buf(),
        arch,
        probes: Vec::new(),
        skipped: Vec::new(),
    };
    for (index, raw) in parse_notes(notes, layout).into_iter().enumerate() {
        let bad = |reason: String| UsdtError::BadNote {
            path: path.to_path_buf(),
            index,
            reason,
        };
        match raw.and_then(|raw| {
            raw.map(|raw| locate(raw, base_address, &segments, arch))
                .transpose()
        }) {
            Ok(Some(probe)) => result.probes.push(probe),
            Ok(None) => {} // Another owner's note in the section: not ours.
            Err(reason) => result.skipped.push(bad(reason)),
        }
    }
    if result.probes.is_empty() && result.skipped.is_empty() {
        return Err(UsdtError::NoNotes {
            path: path.to_path_buf(),
        });
    }
    resolve_symbols(&file, &mut result.probes);
    Ok(result)
}

/// Fills in the link-time address of `sym(%rip)` arguments from the
/// file's symbol tables (libbpf refuses these arguments, bpftrace 0.17
/// reads garbage for them; PROBES.md).
fn resolve_symbols(file: &object::File<'_>, probes: &mut [UsdtProbe]) {
    let is_symbol = |arg: &ArgSpec| matches!(arg.location, Location::Symbol { .. });
    let wanted = probes.iter().any(|p| {
        p.arguments
            .as_ref()
            .is_ok_and(|args| args.iter().any(is_symbol))
    });
    if !wanted {
        return;
    }
    let table: std::collections::HashMap<&str, u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.is_definition())
        .filter_map(|s| Some((s.name().ok()?, s.address())))
        .collect();
    for probe in probes {
        let Ok(args) = &mut probe.arguments else {
            continue;
        };
        for arg in args {
            if let Location::Symbol {
                symbol,
                offset,
                address,
            } = &mut arg.location
            {
                *address = table
                    .get(symbol.as_str())
                    .map(|a| a.wrapping_add_signed(*offset));
            }
        }
    }
}

/// Byte order and pointer size of the file the notes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoteLayout {
    pub little_endian: bool,
    /// 4 (ELF32) or 8 (ELF64).
    pub word_size: usize,
}

impl NoteLayout {
    fn word(&self, bytes: &[u8]) -> u64 {
        let mut value = 0u64;
        for (i, &b) in bytes.iter().enumerate() {
            let shift = if self.little_endian {
                8 * i
            } else {
                8 * (bytes.len() - 1 - i)
            };
            value |= u64::from(b) << shift;
        }
        value
    }
}

/// Walks the notes of a `.note.stapsdt` section. Each entry is one note:
/// `Ok(Some)` a stapsdt descriptor, `Ok(None)` some other owner or type,
/// `Err` a malformed note. A truncated header ends the walk with an error.
pub fn parse_notes(data: &[u8], layout: NoteLayout) -> Vec<Result<Option<RawNote>, String>> {
    let align4 = |n: usize| n.div_ceil(4) * 4;
    let mut notes = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let Some(header) = data.get(at..at + 12) else {
            notes.push(Err(format!(
                "truncated note header at byte {at} of {}",
                data.len()
            )));
            break;
        };
        let namesz = layout.word(&header[0..4]) as usize;
        let descsz = layout.word(&header[4..8]) as usize;
        let n_type = layout.word(&header[8..12]) as u32;
        let name_start = at + 12;
        let desc_start = name_start.saturating_add(align4(namesz));
        let next = desc_start.saturating_add(align4(descsz));
        let (Some(name), Some(desc)) = (
            data.get(name_start..name_start.saturating_add(namesz)),
            data.get(desc_start..desc_start.saturating_add(descsz)),
        ) else {
            notes.push(Err(format!(
                "note at byte {at} (name {namesz} bytes, descriptor {descsz} bytes) runs past \
                 the section's {} bytes",
                data.len()
            )));
            break;
        };
        let owner = name.strip_suffix(b"\0").unwrap_or(name);
        if owner != NOTE_OWNER || n_type != NOTE_TYPE {
            notes.push(Ok(None));
        } else {
            notes.push(parse_descriptor(desc, layout).map(Some));
        }
        at = next;
    }
    notes
}

fn parse_descriptor(desc: &[u8], layout: NoteLayout) -> Result<RawNote, String> {
    let w = layout.word_size;
    if desc.len() < 3 * w {
        return Err(format!(
            "descriptor of {} bytes is shorter than its three {w}-byte addresses",
            desc.len()
        ));
    }
    let pc = layout.word(&desc[0..w]);
    let base = layout.word(&desc[w..2 * w]);
    let semaphore = layout.word(&desc[2 * w..3 * w]);
    let mut strings = desc[3 * w..].split(|&b| b == 0);
    let mut next = |what: &str| -> Result<String, String> {
        let bytes = strings
            .next()
            .ok_or_else(|| format!("descriptor ends before the {what} string"))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("the {what} string is not UTF-8"))
    };
    let provider = next("provider")?;
    let name = next("name")?;
    // The argument string is NUL-terminated too; a descriptor that ends
    // right after the name (no terminator) is malformed.
    if desc[3 * w..].iter().filter(|&&b| b == 0).nth(2).is_none() {
        return Err(format!(
            "probe {provider}:{name}: descriptor is missing the NUL-terminated argument string"
        ));
    }
    let args = next("argument")?;
    if provider.is_empty() || name.is_empty() {
        return Err("empty provider or probe name".to_string());
    }
    Ok(RawNote {
        pc,
        base,
        semaphore,
        provider,
        name,
        args,
    })
}

/// Turns a note into a probe site: base adjustment, then file offsets
/// through the PT_LOAD containing each address (PC in an executable one,
/// semaphore in a writable one, as libbpf's usdt.c also requires).
pub fn locate(
    raw: RawNote,
    base_section_address: u64,
    segments: &[LoadSegment],
    arch: Option<Arch>,
) -> Result<UsdtProbe, String> {
    let probe = format!("{}:{}", raw.provider, raw.name);
    let mut address = raw.pc;
    // sys/sdt.h: the note records where `_.stapsdt.base` was at link time;
    // if the file was relocated afterwards (prelink), the section moved
    // by the same amount as the code.
    if base_section_address != 0 && raw.base != 0 {
        address = address.wrapping_add(base_section_address.wrapping_sub(raw.base));
    }
    let text = segments
        .iter()
        .find(|s| s.executable && s.contains(address))
        .ok_or_else(|| {
            format!("probe {probe}: address {address:#x} is in no executable PT_LOAD segment")
        })?;
    let semaphore = match raw.semaphore {
        0 => None,
        semaphore => {
            let data = segments
                .iter()
                .find(|s| s.writable && s.contains(semaphore))
                .ok_or_else(|| {
                    format!(
                        "probe {probe}: semaphore {semaphore:#x} is in no writable PT_LOAD segment"
                    )
                })?;
            Some(Semaphore {
                address: semaphore,
                file_offset: data.file_offset(semaphore),
            })
        }
    };
    let arguments = match arch {
        Some(arch) => parse_args(&raw.args, arch),
        None => Err(ArgSpecError {
            text: raw.args.clone(),
            arch: Arch::X86_64,
            reason: "the file's architecture is neither x86_64 nor arm64".to_string(),
        }),
    };
    Ok(UsdtProbe {
        address,
        file_offset: text.file_offset(address),
        semaphore,
        arguments,
        provider: raw.provider,
        name: raw.name,
        args: raw.args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LE64: NoteLayout = NoteLayout {
        little_endian: true,
        word_size: 8,
    };

    /// Builds one note the way sys/sdt.h's assembler directives lay it out.
    fn note(layout: NoteLayout, owner: &[u8], n_type: u32, desc: &[u8]) -> Vec<u8> {
        let word32 = |v: u32| {
            if layout.little_endian {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let mut out = Vec::new();
        out.extend(word32(owner.len() as u32 + 1));
        out.extend(word32(desc.len() as u32));
        out.extend(word32(n_type));
        out.extend(owner);
        out.push(0);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out.extend(desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    fn descriptor(layout: NoteLayout, words: [u64; 3], strings: [&str; 3]) -> Vec<u8> {
        let mut out = Vec::new();
        for w in words {
            let bytes = if layout.little_endian {
                w.to_le_bytes()
            } else {
                w.to_be_bytes()
            };
            match (layout.word_size, layout.little_endian) {
                (8, _) => out.extend(bytes),
                (_, true) => out.extend(&bytes[..4]),
                (_, false) => out.extend(&bytes[4..]),
            }
        }
        for s in strings {
            out.extend(s.as_bytes());
            out.push(0);
        }
        out
    }

    fn stapsdt(layout: NoteLayout, words: [u64; 3], strings: [&str; 3]) -> Vec<u8> {
        note(layout, b"stapsdt", 3, &descriptor(layout, words, strings))
    }

    #[test]
    fn notes_parse_in_order_with_padding() {
        let mut data = stapsdt(LE64, [0x1130, 0x2004, 0], ["prov", "a", "-4@%edi"]);
        // A name whose strings end off a 4-byte boundary forces padding.
        data.extend(stapsdt(
            LE64,
            [0x1140, 0x2004, 0x4010],
            ["prov", "bb", "8@%rsi -4@$8192"],
        ));
        data.extend(note(LE64, b"GNU", 3, &[1, 2, 3, 4]));
        data.extend(stapsdt(LE64, [0x1150, 0x2004, 0], ["prov", "noargs", ""]));
        let notes = parse_notes(&data, LE64);
        assert_eq!(notes.len(), 4);
        let a = notes[0].clone().unwrap().unwrap();
        assert_eq!((a.pc, a.base, a.semaphore), (0x1130, 0x2004, 0));
        assert_eq!(
            (a.provider.as_str(), a.name.as_str(), a.args.as_str()),
            ("prov", "a", "-4@%edi")
        );
        let b = notes[1].clone().unwrap().unwrap();
        assert_eq!((b.semaphore, b.args.as_str()), (0x4010, "8@%rsi -4@$8192"));
        assert_eq!(notes[2], Ok(None));
        let c = notes[3].clone().unwrap().unwrap();
        assert_eq!((c.name.as_str(), c.args.as_str()), ("noargs", ""));
    }

    #[test]
    fn thirty_two_bit_and_big_endian_words() {
        for layout in [
            NoteLayout {
                little_endian: true,
                word_size: 4,
            },
            NoteLayout {
                little_endian: false,
                word_size: 4,
            },
            NoteLayout {
                little_endian: false,
                word_size: 8,
            },
        ] {
            let data = stapsdt(
                layout,
                [0x8048123, 0x804a000, 0x804c010],
                ["p", "n", "4@x0"],
            );
            let raw = parse_notes(&data, layout)[0].clone().unwrap().unwrap();
            assert_eq!(
                (raw.pc, raw.base, raw.semaphore),
                (0x8048123, 0x804a000, 0x804c010),
                "{layout:?}"
            );
        }
    }

    #[test]
    fn malformed_notes_are_errors_not_panics() {
        let good = stapsdt(LE64, [1, 2, 3], ["p", "n", ""]);
        // Truncated at every length: never a panic, always an error or
        // nothing.
        // Header 12 + owner 8, then the 24 + 5 descriptor bytes; what follows
        // is padding, which a truncation may drop without harm.
        for len in 1..12 + 8 + 29 {
            let notes = parse_notes(&good[..len], LE64);
            assert!(notes.iter().any(|n| n.is_err()), "length {len}: {notes:?}");
        }
        // Descriptor too short for its three words.
        let short = note(LE64, b"stapsdt", 3, &[0; 20]);
        assert!(
            parse_notes(&short, LE64)[0]
                .as_ref()
                .unwrap_err()
                .contains("shorter")
        );
        // Missing the argument string's terminator.
        let mut desc = descriptor(LE64, [1, 2, 3], ["p", "n", ""]);
        desc.pop();
        let unterminated = note(LE64, b"stapsdt", 3, &desc);
        assert!(
            parse_notes(&unterminated, LE64)[0]
                .as_ref()
                .unwrap_err()
                .contains("argument string")
        );
        // A huge size field.
        let mut huge = good.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            parse_notes(&huge, LE64)[0]
                .as_ref()
                .unwrap_err()
                .contains("runs past")
        );
    }

    fn segments() -> Vec<LoadSegment> {
        vec![
            LoadSegment {
                vaddr: 0,
                memsz: 0x1000,
                offset: 0,
                executable: false,
                writable: false,
            },
            LoadSegment {
                vaddr: 0x401000,
                memsz: 0x2000,
                offset: 0x1000,
                executable: true,
                writable: false,
            },
            LoadSegment {
                vaddr: 0x404e10,
                memsz: 0x300,
                offset: 0x3e10,
                executable: false,
                writable: true,
            },
        ]
    }

    fn raw(pc: u64, base: u64, semaphore: u64) -> RawNote {
        RawNote {
            pc,
            base,
            semaphore,
            provider: "prov".into(),
            name: "probe".into(),
            args: "-4@%edi 8@-16(%rbp)".into(),
        }
    }

    #[test]
    fn addresses_become_file_offsets_through_their_segment() {
        let probe = locate(
            raw(0x401136, 0x402004, 0x404f00),
            0x402004,
            &segments(),
            Some(Arch::X86_64),
        )
        .unwrap();
        assert_eq!(probe.address, 0x401136);
        assert_eq!(probe.file_offset, 0x1136);
        assert_eq!(
            probe.semaphore,
            Some(Semaphore {
                address: 0x404f00,
                file_offset: 0x3f00
            })
        );
        let args = probe.arguments.as_ref().unwrap();
        assert_eq!(args[0].register_offset(), Some(112));
    }

    #[test]
    fn base_adjustment_moves_the_pc_only_when_both_bases_are_known() {
        // The file was relocated by +0x100 after linking.
        let moved = locate(
            raw(0x401036, 0x401f04, 0),
            0x402004,
            &segments(),
            Some(Arch::X86_64),
        )
        .unwrap();
        assert_eq!((moved.address, moved.file_offset), (0x401136, 0x1136));
        // No .stapsdt.base section, or a zero base in the note: unchanged.
        let plain = locate(
            raw(0x401036, 0x401f04, 0),
            0,
            &segments(),
            Some(Arch::X86_64),
        )
        .unwrap();
        assert_eq!(plain.address, 0x401036);
        let plain = locate(
            raw(0x401036, 0, 0),
            0x402004,
            &segments(),
            Some(Arch::X86_64),
        )
        .unwrap();
        assert_eq!(plain.address, 0x401036);
    }

    #[test]
    fn addresses_outside_the_right_segment_are_refused() {
        // PC in a non-executable segment.
        let error = locate(raw(0x100, 0, 0), 0, &segments(), Some(Arch::X86_64)).unwrap_err();
        assert!(
            error.contains("prov:probe") && error.contains("executable"),
            "{error}"
        );
        // Semaphore in the text segment (not writable).
        let error = locate(
            raw(0x401136, 0, 0x401200),
            0,
            &segments(),
            Some(Arch::X86_64),
        )
        .unwrap_err();
        assert!(error.contains("semaphore 0x401200"), "{error}");
        // Just past the end of the writable segment.
        let error = locate(
            raw(0x401136, 0, 0x405110),
            0,
            &segments(),
            Some(Arch::X86_64),
        )
        .unwrap_err();
        assert!(error.contains("writable"), "{error}");
    }

    #[test]
    fn argument_index_beyond_the_probe_is_refused() {
        let probe = locate(raw(0x401136, 0, 0), 0, &segments(), Some(Arch::X86_64)).unwrap();
        assert_eq!(probe.argument(1).unwrap().size, 8);
        let error = probe.argument(2).unwrap_err().to_string();
        assert!(
            error.contains("prov:probe has 2 argument(s)") && error.contains("no argument 2"),
            "{error}"
        );
        let mut bad = raw(0x401136, 0, 0);
        bad.args = "4@%bogus".into();
        let probe = locate(bad, 0, &segments(), Some(Arch::X86_64)).unwrap();
        let error = probe.argument(0).unwrap_err().to_string();
        assert!(error.contains("%bogus"), "{error}");
    }

    #[test]
    fn unknown_architecture_keeps_the_probe_without_arguments() {
        let probe = locate(raw(0x401136, 0, 0), 0, &segments(), None).unwrap();
        assert!(
            probe
                .arguments
                .unwrap_err()
                .reason
                .contains("neither x86_64 nor arm64")
        );
    }

    #[test]
    fn files_without_notes_say_so() {
        let path = Path::new("/proc/self/exe");
        let data = std::fs::read(path).unwrap();
        // The unit-test binary is Rust: no sys/sdt.h notes in it.
        let error = probes_from_elf(&data, path).unwrap_err();
        assert_eq!(error, UsdtError::NoNotes { path: path.into() });
        assert!(
            error
                .to_string()
                .contains("/proc/self/exe has no USDT probes (.note.stapsdt)")
        );
        let error = probes_from_elf(b"#!/bin/sh\n", Path::new("script.sh")).unwrap_err();
        assert!(matches!(error, UsdtError::NotElf { .. }), "{error}");
        let error = read_probes(Path::new("/nonexistent/libfoo.so")).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot read /nonexistent/libfoo.so"),
            "{error}"
        );
    }
}

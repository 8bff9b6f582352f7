//! The lazy resolver against addr2line's `Context` (the resolver it
//! replaced, kept here as the oracle) on compiled fixtures, cross-unit
//! references (GCC LTO), the LRU bound, and malformed input.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use object::{Object, ObjectSection};

use super::sections::SectionReader;
use super::units::Dwarf;
use super::{DwarfSymbols, demangle};
use crate::frame::{Frame, Resolver};
use crate::shared_bytes::SharedBytes;

/// This machine's libc.
pub(super) const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// libc's separate debug file (Debian's libc6-dbg, which `cargo xtask
/// setup --tests` installs: compressed DWARF 5, ~1700 units), found by the
/// build id of the installed libc. Missing, the test fails naming the
/// package rather than passing without checking anything.
pub(super) fn libc_debug() -> std::path::PathBuf {
    let bytes = std::fs::read(LIBC).unwrap_or_else(|e| panic!("{LIBC}: {e}"));
    let file = object::File::parse(&*bytes).unwrap();
    let id = object::Object::build_id(&file)
        .unwrap()
        .expect("libc has a GNU build id");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let path = Path::new("/usr/lib/debug/.build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    assert!(
        path.exists(),
        "{} is missing: install libc6-dbg (`cargo xtask setup --tests` does)",
        path.display()
    );
    path
}

fn fixture_source(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(relative)
}

/// Compiles `sources` (fixture paths relative to tests/fixtures, or
/// absolute) into a binary in `dir` named after the sources and flags.
pub(super) fn compile(compiler: &str, sources: &[&Path], flags: &[&str], dir: &Path) -> PathBuf {
    let name: String = sources
        .iter()
        .map(|s| s.file_stem().unwrap().to_string_lossy().into_owned())
        .chain(flags.iter().map(|f| f.replace(['-', '=', '/'], "")))
        .collect::<Vec<_>>()
        .join("_");
    let out = dir.join(name);
    let status = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .args(sources)
        .status()
        .unwrap_or_else(|e| panic!("running {compiler} (cargo xtask setup --tests): {e}"));
    assert!(status.success(), "{compiler} {sources:?} failed");
    out
}

pub(super) fn compile_c(compiler: &str, source: &str, flags: &[&str], dir: &Path) -> PathBuf {
    compile(compiler, &[&fixture_source(source)], flags, dir)
}

fn map(path: &Path) -> Arc<memmap2::Mmap> {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: test files nobody modifies while mapped.
    Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap())
}

/// The file's DWARF sections, as `from_object` loads them.
pub(super) fn load_dwarf(path: &Path) -> (Arc<memmap2::Mmap>, Dwarf) {
    let data = map(path);
    let file = object::File::parse(&**data).unwrap();
    let dwarf = load(&file, &data).unwrap();
    (data.clone(), dwarf)
}

fn load(file: &object::File<'_>, data: &Arc<memmap2::Mmap>) -> Option<Dwarf> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    gimli::Dwarf::load(
        |id: gimli::SectionId| -> Result<SectionReader, gimli::Error> {
            if matches!(
                id,
                gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists
            ) {
                return Ok(SectionReader::new(SharedBytes::empty(), endian));
            }
            let data = match file.section_by_name(id.name()) {
                Some(section) => SharedBytes::of(section, data),
                None => SharedBytes::empty(),
            };
            Ok(SectionReader::new(data, endian))
        },
    )
    .ok()
}

/// The resolver this module replaced: addr2line's `Context` over the same
/// sections, answers mapped to frames the same way.
struct Oracle {
    context: Mutex<addr2line::Context<SectionReader>>,
}

impl Oracle {
    fn new(dwarf: Dwarf) -> Option<Self> {
        Some(Oracle {
            context: Mutex::new(addr2line::Context::from_dwarf(dwarf).ok()?),
        })
    }

    fn resolve(&self, address: u64) -> Option<Vec<Frame>> {
        let context = self.context.lock().ok()?;
        let mut iter = match context.find_frames(address) {
            addr2line::LookupResult::Output(result) => result.ok()?,
            addr2line::LookupResult::Load { .. } => {
                context.find_frames(address).skip_all_loads().ok()?
            }
        };
        let mut frames = Vec::new();
        while let Ok(Some(frame)) = iter.next() {
            let Some(function) = frame.function.as_ref() else {
                continue;
            };
            let raw = function.raw_name().ok()?;
            let name = demangle(&raw);
            let location = frame.location.as_ref();
            frames.push(Frame {
                system_name: (name != raw).then(|| raw.to_string()),
                function: name,
                file: location.and_then(|l| l.file).map(str::to_string),
                line: location.and_then(|l| l.line),
                inlined: true,
                source: crate::frame::NameSource::Dwarf,
            });
        }
        let last = frames.last_mut()?;
        last.inlined = false;
        Some(frames)
    }
}

/// Address range of `.text`.
fn text_range(path: &Path) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let text = file.section_by_name(".text").unwrap();
    (text.address(), text.address() + text.size())
}

/// Compares every `stride`-th address of `.text` (of `code`, the binary
/// whose code the debug info describes). Returns (addresses compared,
/// addresses with frames, with inlined frames).
fn compare_with_oracle(
    symbols: &DwarfSymbols,
    oracle: &Oracle,
    code: &Path,
    stride: u64,
) -> (usize, usize, usize) {
    let (start, end) = text_range(code);
    let (mut compared, mut named, mut inlined) = (0, 0, 0);
    let mut address = start;
    while address < end {
        let want = oracle.resolve(address);
        let got = symbols.resolve(address);
        assert_eq!(got, want, "at {address:#x} of {}", code.display());
        compared += 1;
        if let Some(frames) = &want {
            named += 1;
            if frames.len() > 1 {
                inlined += 1;
            }
        }
        address += stride;
    }
    eprintln!(
        "{}: {compared} addresses equal to addr2line's, {named} named, {inlined} inlined",
        code.display()
    );
    (compared, named, inlined)
}

fn both(path: &Path) -> (Arc<memmap2::Mmap>, DwarfSymbols, Oracle) {
    let data = map(path);
    let file = object::File::parse(&**data).unwrap();
    let symbols = DwarfSymbols::from_object(&file, &data).expect("DWARF");
    let oracle = Oracle::new(load(&file, &data).unwrap()).unwrap();
    (data.clone(), symbols, oracle)
}

#[test]
fn same_frames_as_addr2line_on_c_and_cpp_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let mut inlined_total = 0;
    for (compiler, source, flags) in [
        ("cc", "c/inlined.c", &["-O2", "-g"][..]),
        ("cc", "c/inlined.c", &["-O2", "-g", "-gdwarf-4"][..]),
        ("cc", "c/inlined.c", &["-O2", "-g", "-gz=zlib"][..]),
        ("cc", "c/hot.c", &["-O2", "-g"][..]),
        ("cc", "c/deep.c", &["-O2", "-g", "-ffunction-sections"][..]),
        ("cc", "c/deep.c", &["-O0", "-g"][..]),
        ("c++", "cpp/shapes.cpp", &["-O2", "-g"][..]),
        ("c++", "cpp/shapes.cpp", &["-O2", "-g", "-gdwarf-4"][..]),
    ] {
        let binary = compile_c(compiler, source, flags, dir.path());
        let (_data, symbols, oracle) = both(&binary);
        let (compared, named, inlined) = compare_with_oracle(&symbols, &oracle, &binary, 1);
        assert!(named > 10, "{source} {flags:?}: {named} of {compared}");
        inlined_total += inlined;
    }
    assert!(inlined_total > 50, "{inlined_total}");
}

/// Split DWARF: the `.dwo` is not loaded; the skeleton unit gives what it
/// has (a line table, no function DIEs), as addr2line did without it.
#[test]
fn split_dwarf_answers_what_the_skeleton_knows() {
    let dir = tempfile::tempdir().unwrap();
    let binary = compile_c(
        "cc",
        "c/inlined.c",
        &["-O2", "-g", "-gsplit-dwarf"],
        dir.path(),
    );
    let (_data, symbols, oracle) = both(&binary);
    compare_with_oracle(&symbols, &oracle, &binary, 1);
}

#[test]
fn shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<DwarfSymbols>();
    // Concurrent lookups through one small cache agree with serial ones.
    let dir = tempfile::tempdir().unwrap();
    let binary = compile_c("c++", "cpp/shapes.cpp", &["-O2", "-g"], dir.path());
    let data = map(&binary);
    let file = object::File::parse(&**data).unwrap();
    let symbols = DwarfSymbols::with_cache(load(&file, &data).unwrap(), 1, usize::MAX);
    let (start, end) = text_range(&binary);
    let serial: Vec<_> = (start..end).map(|a| symbols.resolve(a)).collect();
    std::thread::scope(|scope| {
        for offset in 0..4 {
            let (symbols, serial) = (&symbols, &serial);
            scope.spawn(move || {
                for (i, address) in (start..end).enumerate().skip(offset) {
                    assert_eq!(symbols.resolve(address), serial[i]);
                }
            });
        }
    });
}

/// Two C files linked with GCC's LTO: the final units' inlined
/// subroutines and functions name their origins by `DW_FORM_ref_addr` in
/// the units of the compile step.
#[test]
fn cross_unit_origins_resolve_as_addr2line_does() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("lto_main.c");
    let b = dir.path().join("lto_mix.c");
    std::fs::write(
        &a,
        "static int helper(int x) { return x * 3 + (x >> 2); }\n\
         int mix(int x);\n\
         int main(int argc, char **argv) {\n\
             int acc = 0;\n\
             for (int i = 0; i < argc * 1000; i++) acc += mix(i) + helper(acc);\n\
             return acc & 0xff;\n\
         }\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "static inline int square(int x) { return x * x; }\n\
         __attribute__((noinline)) int mix(int x) { return square(x) ^ (x << 3); }\n",
    )
    .unwrap();
    let binary = compile("cc", &[&a, &b], &["-O2", "-g", "-flto"], dir.path());
    let (_data, symbols, oracle) = both(&binary);
    assert!(
        has_cross_unit_origin(&symbols.dwarf),
        "no DW_FORM_ref_addr origin"
    );
    let (_, named, inlined) = compare_with_oracle(&symbols, &oracle, &binary, 1);
    assert!(named > 10 && inlined > 3, "{named} {inlined}");
    // The inlined frames are named from the other units.
    let (start, end) = text_range(&binary);
    let names: Vec<String> = (start..end)
        .filter_map(|a| symbols.resolve(a))
        .flatten()
        .map(|f| f.function)
        .collect();
    for function in ["main", "mix", "square", "helper"] {
        assert!(names.iter().any(|n| n == function), "{function}: {names:?}");
    }
}

/// Rust with fat LTO over several codegen units, as DWARF 5: strings by
/// `DW_FORM_strx`, addresses by `DW_FORM_addrx`, ranges by
/// `DW_FORM_rnglistx`, origins across units by `DW_FORM_ref_addr`; also
/// with `.debug_aranges` removed, so the index comes from root DIEs.
#[test]
fn rust_dwarf5_lto_with_and_without_aranges() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("lto.rs");
    std::fs::write(
        &source,
        "use std::collections::HashMap;\n\
         #[inline(always)]\n\
         fn mix(x: u64) -> u64 { let x = x ^ (x >> 33); let x = x.wrapping_mul(0xff51afd7ed558ccd); x ^ (x >> 33) }\n\
         #[inline(never)]\n\
         fn checksum(data: &[u64]) -> u64 { data.iter().map(|&v| mix(v)).fold(0, u64::wrapping_add) }\n\
         fn main() {\n\
             let args: Vec<String> = std::env::args().collect();\n\
             let mut m: HashMap<String, u64> = HashMap::new();\n\
             for (i, a) in args.iter().enumerate() { m.insert(a.clone(), i as u64); }\n\
             let data: Vec<u64> = (0..1000u64).map(|i| i * 2654435761).collect();\n\
             println!(\"{} {}\", checksum(&data), m.len());\n\
         }\n",
    )
    .unwrap();
    let binary = dir.path().join("lto");
    let status = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args([
            "-O",
            "-g",
            "-Cdwarf-version=5",
            "-Ccodegen-units=4",
            "-Clto=fat",
            "-o",
        ])
        .arg(&binary)
        .arg(&source)
        .status()
        .expect("rustc");
    assert!(status.success());
    let (_data, symbols, oracle) = both(&binary);
    assert!(
        has_cross_unit_origin(&symbols.dwarf),
        "no DW_FORM_ref_addr origin"
    );
    assert!(
        symbols
            .dwarf
            .debug_aranges
            .headers()
            .next()
            .unwrap()
            .is_some()
    );
    let (_, named, inlined) = compare_with_oracle(&symbols, &oracle, &binary, 7);
    assert!(named > 1000 && inlined > 100, "{named} {inlined}");

    let bare = dir.path().join("lto-no-aranges");
    let status = Command::new("objcopy")
        .arg("--remove-section=.debug_aranges")
        .arg(&binary)
        .arg(&bare)
        .status()
        .expect("objcopy (binutils)");
    assert!(status.success());
    let (_data, symbols, oracle) = both(&bare);
    assert!(
        symbols
            .dwarf
            .debug_aranges
            .headers()
            .next()
            .unwrap()
            .is_none()
    );
    let (_, named_bare, _) = compare_with_oracle(&symbols, &oracle, &bare, 7);
    assert_eq!(named_bare, named);
}

/// Whether an abstract origin or specification uses `DW_FORM_ref_addr`.
fn has_cross_unit_origin(dwarf: &Dwarf) -> bool {
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        let unit = dwarf.unit(header).unwrap();
        let mut entries = unit.entries();
        while let Ok(Some((_, entry))) = entries.next_dfs() {
            for name in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
                if let Ok(Some(gimli::AttributeValue::DebugInfoRef(_))) = entry.attr_value(name) {
                    return true;
                }
            }
        }
    }
    false
}

/// With room for two units, lookups across many units still answer as
/// addr2line does, and no more than two units stay parsed.
#[test]
fn lru_keeps_at_most_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    // Several units: one per source, plus crt's.
    let sources: Vec<PathBuf> = ["c/inlined.c", "c/hot.c"]
        .iter()
        .map(|s| {
            let text = std::fs::read_to_string(fixture_source(s)).unwrap();
            let path = dir.path().join(s.replace('/', "_"));
            // Only one main: rename the others'.
            let text = if s.ends_with("hot.c") {
                text.replace("int main(", "int hot_main(").replace(
                    "volatile unsigned long sink;",
                    "extern volatile unsigned long sink;",
                )
            } else {
                text
            };
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
    let sources: Vec<&Path> = sources.iter().map(PathBuf::as_path).collect();
    let binary = compile("cc", &sources, &["-O2", "-g"], dir.path());
    let data = map(&binary);
    let file = object::File::parse(&**data).unwrap();
    let symbols = DwarfSymbols::with_cache(load(&file, &data).unwrap(), 2, usize::MAX);
    let oracle = Oracle::new(load(&file, &data).unwrap()).unwrap();
    let (start, end) = text_range(&binary);
    let mut units_seen = std::collections::HashSet::new();
    // Alternate between the two ends of .text so units keep changing.
    for i in 0..(end - start) {
        let address = if i % 2 == 0 { start + i } else { end - i };
        assert_eq!(
            symbols.resolve(address),
            oracle.resolve(address),
            "{address:#x}"
        );
        units_seen.extend(symbols.index.candidates(address));
        let (cached, _) = symbols.cache.usage();
        assert!(cached <= 2, "{cached} units cached");
    }
    assert!(units_seen.len() >= 2, "{units_seen:?}");

    // A byte budget smaller than any unit keeps only the last one.
    let symbols = DwarfSymbols::with_cache(load(&file, &data).unwrap(), 32, 1);
    for address in (start..end).step_by(7) {
        assert_eq!(
            symbols.resolve(address),
            oracle.resolve(address),
            "{address:#x}"
        );
        assert!(symbols.cache.usage().0 <= 1);
    }
}

/// libc's debug file: sampled addresses answer as addr2line does, and the
/// cache stays within its bounds.
#[test]
fn same_frames_as_addr2line_on_libc() {
    let debug = libc_debug();
    let code = Path::new(LIBC);
    let (_data, symbols, oracle) = both(&debug);
    let (compared, named, inlined) = compare_with_oracle(&symbols, &oracle, code, 97);
    assert!(
        named > compared / 2 && inlined > 100,
        "{compared} {named} {inlined}"
    );
    let (units, bytes) = symbols.cache.usage();
    assert!(units <= super::CACHED_UNITS, "{units}");
    assert!(bytes <= super::CACHE_BUDGET.max(1 << 20) * 2, "{bytes}");
}

/// A Rust binary with full debug info (the test binary itself, when built
/// with debug info): cross-unit origins are common there.
#[test]
fn same_frames_as_addr2line_on_this_test_binary() {
    let path = std::env::current_exe().unwrap();
    let (_data, symbols, oracle) = both(&path);
    let (compared, named, inlined) = compare_with_oracle(&symbols, &oracle, &path, 13);
    eprintln!("{compared} addresses, {named} named, {inlined} inlined");
    // Equal answers prove nothing if both sides answered nothing: the test
    // binary is a debug build, most of its code is described.
    assert!(
        named > compared / 2 && inlined > 0,
        "{compared} addresses, {named} named, {inlined} inlined"
    );
}

/// Flipped bytes in the debug sections of a fixture: lookups may fail but
/// never panic, loop or recurse without bound.
#[test]
fn corrupted_debug_sections_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (mut built, mut lookups, mut answered) = (0, 0, 0);
    for flags in [&["-O2", "-g"][..], &["-O2", "-g", "-gdwarf-4"][..]] {
        let binary = compile_c("c++", "cpp/shapes.cpp", flags, dir.path());
        let pristine = std::fs::read(&binary).unwrap();
        let file = object::File::parse(&*pristine).unwrap();
        let (start, end) = text_range(&binary);
        let debug: Vec<(usize, usize)> = file
            .sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
            .filter_map(|s| s.file_range())
            .map(|(offset, size)| (offset as usize, size as usize))
            .filter(|&(_, size)| size > 0)
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..60 {
            let mut bytes = pristine.clone();
            for _ in 0..(1 + round % 8) {
                let (offset, size) = debug[(next() as usize) % debug.len()];
                let at = offset + (next() as usize) % size;
                bytes[at] ^= (next() >> 24) as u8 | 1;
            }
            let path = dir.path().join("corrupted");
            std::fs::write(&path, &bytes).unwrap();
            let data = map(&path);
            let Ok(file) = object::File::parse(&**data) else {
                continue;
            };
            if let Some(symbols) = DwarfSymbols::from_object(&file, &data) {
                built += 1;
                for address in (start..end).step_by(5).chain([0, u64::MAX]) {
                    lookups += 1;
                    answered += usize::from(symbols.resolve(address).is_some());
                }
            }
        }
    }
    eprintln!("{built} corrupted files indexed, {answered} of {lookups} lookups answered");
    assert!(
        built > 60 && answered > lookups / 8,
        "the corruption hid the DWARF"
    );
}

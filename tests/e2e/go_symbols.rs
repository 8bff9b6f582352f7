//! Go symbolization (profiler-runtimes/src/go/pclntab) against the Go
//! toolchains' own answers, on binaries built by each toolchain in each
//! build mode:
//!
//! - every function entry and three interior PCs per function, plus every
//!   byte of the fixture's hot and probe functions: our outermost frame's
//!   name and innermost frame's file:line equal `go tool addr2line` of the
//!   same Go version (which names the physical function and gives the
//!   position of the inlined body);
//! - call sites inside inlined code: our whole inline chain equals what
//!   `runtime.CallersFrames` printed in the fixture;
//! - the Go version and build id equal `go version` / `go tool buildid`.
//!
//! These read binaries only (no BPF) and need no privileges. A missing
//! toolchain fails the test, naming `cargo xtask setup --tests`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use profiler_runtimes::go::pclntab::{GoSymbols, PclntabSource, Strategy};
use profiler_symbolize::Frame;
use profiler_tests::go::{build_go_fixture, go_command, go_toolchain};

/// A build mode: (name, go build flags, extra environment).
type Mode = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
);

const MODES: &[Mode] = &[
    ("plain", &[], &[]),
    ("stripped", &["-ldflags=-s -w"], &[]),
    ("pie", &["-buildmode=pie"], &[]),
    (
        "external",
        &["-ldflags=-linkmode=external"],
        &[("CGO_ENABLED", "1")],
    ),
    (
        "external-pie",
        &["-buildmode=pie", "-ldflags=-linkmode=external"],
        &[("CGO_ENABLED", "1")],
    ),
    (
        "external-pie-stripped",
        &["-buildmode=pie", "-ldflags=-linkmode=external -s -w"],
        &[("CGO_ENABLED", "1")],
    ),
];

/// Functions of the fixture every byte of which is compared.
const FULLY_CHECKED: &[&str] = &[
    "main.hot",
    "main.probeOuter",
    "main.probeShallow",
    "main.probeDirect",
    "main.report",
    "main.main",
];

fn describe(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| {
            format!(
                "{} {}:{}{}",
                f.function,
                f.file.as_deref().unwrap_or("?"),
                f.line.unwrap_or(0),
                if f.inlined { " (inlined)" } else { "" }
            )
        })
        .collect()
}

/// `go tool addr2line` of the binary for `pcs`: (function, "file:line").
fn addr2line(go: &Path, binary: &Path, pcs: &[u64]) -> Vec<(String, String)> {
    let mut child = Command::new(go)
        .args(["tool", "addr2line"])
        .arg(binary)
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running go tool addr2line");
    let input: String = pcs.iter().map(|pc| format!("{pc:#x}\n")).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success(), "go tool addr2line failed");
    let text = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * pcs.len(), "addr2line answered {text}");
    lines
        .chunks(2)
        .map(|pair| {
            // debug/gosym decodes a pcln offset of 0 as a table starting at
            // the pc tables' first byte (giving lines like -5 for linker
            // markers such as go:textfipsstart); the runtime treats 0 as
            // "no table" (runtime/symtab.go pcvalue). Both mean no line.
            let position = match pair[1].strip_prefix(':') {
                Some(line) if line.starts_with('-') => ":-1".to_string(),
                _ => pair[1].to_string(),
            };
            (pair[0].to_string(), position)
        })
        .collect()
}

/// Our answer in addr2line's terms: the physical function's stored name
/// and the innermost position.
fn ours_as_addr2line(frames: &[Frame]) -> (String, String) {
    let outer = frames.last().unwrap();
    let inner = &frames[0];
    // Where the tables do not cover a PC (padding after a function's
    // code), debug/gosym gives file "" and line -1: addr2line prints ":-1".
    let line = inner.line.map_or(-1, i64::from);
    (
        outer.system_name.clone().unwrap_or(outer.function.clone()),
        format!("{}:{line}", inner.file.as_deref().unwrap_or("")),
    )
}

/// Compares every function entry, interior samples and the fixture's
/// functions byte by byte with addr2line. Returns (PCs compared, PCs with
/// inline frames).
fn compare_with_addr2line(go: &Path, binary: &Path, symbols: &GoSymbols) -> (usize, usize) {
    every_go_nm_function_is_found(go, binary, symbols);
    let mut pcs = Vec::new();
    for function in symbols.functions() {
        let (entry, end) = (function.entry(), function.end());
        pcs.push(entry);
        if FULLY_CHECKED.contains(&function.name().as_ref()) {
            pcs.extend(entry + 1..end);
        } else {
            let size = end - entry;
            pcs.extend(
                (1..4)
                    .map(|k| entry + size * k / 4)
                    .filter(|&pc| pc > entry),
            );
        }
    }
    pcs.sort_unstable();
    pcs.dedup();
    let expected = addr2line(go, binary, &pcs);
    let mut mismatches = Vec::new();
    let mut inlined = 0;
    for (pc, expected) in pcs.iter().zip(&expected) {
        let frames = symbols.frames(*pc).unwrap_or_default();
        if frames.is_empty() {
            // addr2line answers "?" only where Go has no function either.
            if expected.0 != "?" {
                mismatches.push(format!("{pc:#x}: we found nothing, addr2line {expected:?}"));
            }
            continue;
        }
        if frames.len() > 1 {
            inlined += 1;
        }
        assert!(
            frames[..frames.len() - 1].iter().all(|f| f.inlined) && !frames.last().unwrap().inlined,
            "{pc:#x}: inlined flags wrong: {:?}",
            describe(&frames)
        );
        let ours = ours_as_addr2line(&frames);
        if &ours != expected {
            mismatches.push(format!(
                "{pc:#x}: ours {ours:?} ({:?}), addr2line {expected:?}",
                describe(&frames)
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{}: {} of {} PCs differ from go tool addr2line, first: {:#?}",
        binary.display(),
        mismatches.len(),
        pcs.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    (pcs.len(), inlined)
}

/// Every text symbol `go tool nm` lists is a function of ours at the same
/// address (the PCs compared above come from our own table, so a function
/// we miss would otherwise go unnoticed). nm names assembly functions with
/// their ABI (`.abi0`), which the pclntab leaves out; `runtime.text` and
/// `runtime.etext` mark the text's bounds, they are not functions; C
/// functions of an external link lie outside the Go functions.
fn every_go_nm_function_is_found(go: &Path, binary: &Path, symbols: &GoSymbols) {
    let output = Command::new(go)
        .args(["tool", "nm"])
        .arg(binary)
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("running go tool nm");
    if !output.status.success() && String::from_utf8_lossy(&output.stderr).contains("no symbol") {
        // A stripped build: nothing to list (its plain twin was checked).
        return;
    }
    assert!(
        output.status.success(),
        "go tool nm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Names as the runtime prints them on both sides: nm writes the
    // symbol table's `.` where the pclntab has `·` (`untracedG·4`), and
    // type arguments print as `[...]`.
    let printed = |name: &str| {
        profiler_runtimes::go::pclntab::name_for_print(&name.replace('·', ".")).into_owned()
    };
    let ours: std::collections::HashSet<(u64, String)> = symbols
        .functions()
        .map(|f| (f.entry(), printed(&f.name())))
        .collect();
    let mut listed = 0;
    let mut missing = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [address, kind, name] = fields.as_slice() else {
            continue;
        };
        if !matches!(*kind, "T" | "t") || matches!(*name, "runtime.text" | "runtime.etext") {
            continue;
        }
        let Ok(address) = u64::from_str_radix(address, 16) else {
            continue;
        };
        // C code of an externally linked binary (crt, cgo's C helpers):
        // outside every Go function, named by the ELF symbols instead.
        if symbols.function(address).is_none() {
            continue;
        }
        listed += 1;
        let name = printed(name.strip_suffix(".abi0").unwrap_or(name));
        if !ours.contains(&(address, name.clone())) {
            missing.push(format!("{address:#x} {name}"));
        }
    }
    assert!(listed > 500, "go tool nm listed {listed} functions");
    assert!(
        missing.is_empty(),
        "{}: {} of {listed} functions go tool nm lists are not ours: {:?}",
        binary.display(),
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

/// One call site the fixture reported: physical function's offset and
/// CallersFrames' chain (function, file, line), innermost first.
struct Site {
    name: String,
    offset: u64,
    frames: Vec<(String, String, u32)>,
}

fn fixture_sites(binary: &Path) -> Vec<Site> {
    let output = Command::new(binary).arg("frames").output().unwrap();
    assert!(
        output.status.success(),
        "{} frames failed",
        binary.display()
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let mut sites: Vec<Site> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["site", name, offset] => sites.push(Site {
                name: name.to_string(),
                offset: u64::from_str_radix(offset, 16).unwrap(),
                frames: Vec::new(),
            }),
            ["frame", function, file, line] => sites.last_mut().unwrap().frames.push((
                function.to_string(),
                file.to_string(),
                line.parse().unwrap(),
            )),
            ["end"] => {}
            _ => panic!("unexpected fixture output line {line:?}"),
        }
    }
    assert_eq!(sites.len(), 3, "fixture output: {text}");
    sites
}

/// Our chain at each site equals runtime.CallersFrames'. Returns the
/// number of frames compared.
fn compare_with_callers_frames(binary: &Path, symbols: &GoSymbols) -> usize {
    let mut compared = 0;
    for site in fixture_sites(binary) {
        let physical = &site.frames.last().unwrap().0;
        let function = symbols
            .functions()
            .find(|f| f.name() == physical.as_str())
            .unwrap_or_else(|| panic!("{physical} not in our table"));
        let pc = function.entry() + site.offset;
        let ours: Vec<(String, String, u32)> = symbols
            .frames(pc)
            .unwrap_or_default()
            .into_iter()
            .map(|f| (f.function, f.file.unwrap_or_default(), f.line.unwrap_or(0)))
            .collect();
        assert_eq!(
            ours,
            site.frames,
            "{}: site {} at {pc:#x}: our chain differs from runtime.CallersFrames",
            binary.display(),
            site.name
        );
        compared += ours.len();
    }
    compared
}

/// (name, size, offset from the text start) of every function.
fn function_layout(symbols: &GoSymbols) -> Vec<(String, u64, u64)> {
    symbols
        .functions()
        .map(|f| {
            (
                f.name().into_owned(),
                f.end() - f.entry(),
                f.entry() - symbols.text_start(),
            )
        })
        .collect()
}

/// The binary to give `go tool addr2line`. Go 1.19's addr2line does not
/// look for `.data.rel.ro.gopclntab` (its PIE section): a copy whose
/// section is renamed `.gopclntab` (same bytes otherwise) is readable.
fn addr2line_readable_copy(version: &str, mode: &str, binary: &Path) -> std::path::PathBuf {
    if !(version == "1.19" && mode == "pie") {
        return binary.to_path_buf();
    }
    let mut data = std::fs::read(binary).unwrap();
    let name = b".data.rel.ro.gopclntab\0";
    let at = data
        .windows(name.len())
        .position(|w| w == name)
        .expect("section name in .shstrtab");
    data[at..at + 11].copy_from_slice(b".gopclntab\0");
    let copy = binary.with_extension("addr2line");
    std::fs::write(&copy, data).unwrap();
    copy
}

fn check_toolchain(version: &str) {
    let go = go_toolchain(version);
    let fixture_dir = profiler_tests::agent::workspace_root().join("tests/fixtures/go");
    let mut summary = Vec::new();
    let mut twin_layout = None;
    for &(mode, flags, env) in MODES {
        let binary = build_go_fixture(version, mode, flags, env);
        let symbols =
            GoSymbols::open(&binary).unwrap_or_else(|e| panic!("Go {version} {mode}: {e}"));
        // Debian's 1.19 is a patch release ("go1.19.8"); pip's are exact.
        let reported =
            String::from_utf8(go_command(&go, &fixture_dir, &["env", "GOVERSION"], &[])).unwrap();
        assert_eq!(
            symbols.version(),
            Some(reported.trim()),
            "Go {version} {mode}: version"
        );
        let build_id = go_command(
            &go,
            &fixture_dir,
            &["tool", "buildid", binary.to_str().unwrap()],
            &[],
        );
        assert_eq!(
            symbols.build_id(),
            Some(String::from_utf8_lossy(&build_id).trim()),
            "Go {version} {mode}: build id"
        );
        assert!(
            symbols.has_inline_info(),
            "Go {version} {mode}: no inline trees"
        );
        let layout = function_layout(&symbols);
        let (pcs, inlined) = if mode == "external-pie-stripped" {
            // No section and no symbol names the table: Go's addr2line
            // cannot read this binary. The same program linked without
            // -s -w (checked against addr2line just before) must have the
            // same functions, sizes and offsets from the text start.
            let twin = twin_layout.take().expect("external-pie is checked first");
            assert!(
                layout == twin,
                "Go {version} {mode}: functions differ from external-pie"
            );
            (0, 0)
        } else {
            let readable = addr2line_readable_copy(version, mode, &binary);
            // Go 1.19's addr2line finds no table in an externally linked
            // PIE (symbol only): the next toolchain's reads 1.18 tables.
            let tool = if (version, mode) == ("1.19", "external-pie") {
                go_toolchain("1.21.13")
            } else {
                go.clone()
            };
            compare_with_addr2line(&tool, &readable, &symbols)
        };
        if mode == "external-pie" {
            twin_layout = Some(layout);
        }
        assert!(
            pcs == 0 || inlined > 10,
            "Go {version} {mode}: only {inlined} PCs had inline frames"
        );
        let chain_frames = compare_with_callers_frames(&binary, &symbols);

        // The scan alone finds the same table (as for binaries whose
        // section headers and symbols are gone).
        let data = std::fs::read(&binary).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let scanned = GoSymbols::from_file_with(&file, Strategy::ScanOnly)
            .unwrap_or_else(|e| panic!("Go {version} {mode}: scan: {e}"));
        assert_eq!(scanned.source(), PclntabSource::Scan);
        assert_eq!(scanned.pclntab_address(), symbols.pclntab_address());
        assert_eq!(scanned.text_start(), symbols.text_start());
        let scan_chains = compare_with_callers_frames(&binary, &scanned);
        summary.push(format!(
            "{mode}: {:?} table, {pcs} PCs vs addr2line ({inlined} inlined), \
             {chain_frames}+{scan_chains} frames vs CallersFrames",
            symbols.source()
        ));
    }
    eprintln!("Go {version}:\n  {}", summary.join("\n  "));
}

#[test]
fn go_1_19() {
    check_toolchain("1.19");
}

#[test]
fn go_1_21() {
    check_toolchain("1.21.13");
}

#[test]
fn go_1_23() {
    check_toolchain("1.23.9");
}

#[test]
fn go_1_25() {
    check_toolchain("1.25.5");
}

#[test]
fn go_1_27() {
    check_toolchain("1.27.3");
}

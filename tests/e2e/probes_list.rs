//! `profiler-agent probes list` against ground truth: `readelf -n` (every
//! note: provider, name, location, base, semaphore, arguments), `readelf -l
//! -S` (segments and sections, to compute file offsets independently),
//! `bpftrace -l` (probe names), the bytes at each offset (the probe's nop),
//! and bpftrace's own histogram text for the histogram renderer.
//!
//! Targets: the USDT fixture (tests/fixtures/usdt, -O0 and -O2, and an
//! arm64 cross-build), and Debian's /usr/bin/python3.11.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use profiler_latency::histogram::{Histogram, Layout, Unit, text};
use profiler_tests::{agent::*, fixtures::*, processes::*};

/// One probe site as the agent listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    provider: String,
    name: String,
    address: u64,
    offset: u64,
    semaphore: Option<u64>,
    args: String,
}

/// One note as `readelf -n` shows it.
#[derive(Debug, Clone, Default)]
struct Note {
    provider: String,
    name: String,
    location: u64,
    base: u64,
    semaphore: u64,
    args: String,
}

/// A PT_LOAD or a section: address range and file offset.
#[derive(Debug, Clone)]
struct Region {
    name: String,
    address: u64,
    size: u64,
    offset: u64,
    executable: bool,
}

fn hex(text: &str) -> u64 {
    u64::from_str_radix(text.trim().trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("{text:?} is not hex: {e}"))
}

/// Runs `profiler-agent probes list ARGS` and returns stdout, asserting
/// success.
fn probes_list(args: &[&str]) -> String {
    let mut all = vec!["probes", "list"];
    all.extend(args);
    let output = run_agent(&all);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "profiler-agent {all:?} failed ({}): {stderr}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Parses the text listing: per file, its sites in note order.
fn parse_listing(text: &str) -> Vec<(PathBuf, Vec<Listed>)> {
    let mut files: Vec<(PathBuf, Vec<Listed>)> = Vec::new();
    let mut args_column = 0;
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            let path = line.rsplit_once(" (").expect("FILE (N probe sites)").0;
            files.push((PathBuf::from(path), Vec::new()));
        } else if line.trim_start().starts_with("PROVIDER") {
            args_column = line.find("ARGUMENTS").expect("ARGUMENTS column");
        } else {
            let (head, args) = line.split_at(args_column.min(line.len()));
            let cells: Vec<&str> = head.split_whitespace().collect();
            let semaphore = match cells[4] {
                "no" => None,
                "yes" => Some(hex(cells[5])),
                other => panic!("semaphore column {other:?} in {line:?}"),
            };
            files.last_mut().expect("a file line first").1.push(Listed {
                provider: cells[0].to_string(),
                name: cells[1].to_string(),
                address: hex(cells[2]),
                offset: hex(cells[3]),
                semaphore,
                args: args.trim().to_string(),
            });
        }
    }
    files
}

fn readelf_notes(path: &Path) -> Vec<Note> {
    let text = run_tool("readelf", &["-nW", path.to_str().unwrap()]);
    let mut notes = Vec::new();
    let mut in_stapsdt = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if line.starts_with("Displaying notes found in:") {
            in_stapsdt = line.contains(".note.stapsdt");
        } else if !in_stapsdt {
        } else if trimmed.starts_with("stapsdt") {
            // With -W the provider follows on the same line, after a tab.
            let provider = trimmed.split_once("Provider:").map(|(_, p)| p.trim());
            notes.push(Note {
                provider: provider.unwrap_or_default().to_string(),
                ..Note::default()
            });
        } else if let Some(provider) = trimmed.strip_prefix("Provider:") {
            notes.last_mut().unwrap().provider = provider.trim().to_string();
        } else if let Some(name) = trimmed.strip_prefix("Name:") {
            notes.last_mut().unwrap().name = name.trim().to_string();
        } else if let Some(rest) = trimmed.strip_prefix("Location:") {
            let note = notes.last_mut().unwrap();
            for part in rest.split(',') {
                let part = part.trim();
                if let Some(v) = part.strip_prefix("Base:") {
                    note.base = hex(v);
                } else if let Some(v) = part.strip_prefix("Semaphore:") {
                    note.semaphore = hex(v);
                } else {
                    note.location = hex(part);
                }
            }
        } else if let Some(args) = trimmed.strip_prefix("Arguments:") {
            notes.last_mut().unwrap().args = args.trim().to_string();
        }
    }
    notes
}

fn readelf_loads(path: &Path) -> Vec<Region> {
    let text = run_tool("readelf", &["-lW", path.to_str().unwrap()]);
    text.lines()
        .filter(|l| l.trim_start().starts_with("LOAD "))
        .map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            Region {
                name: "LOAD".into(),
                offset: hex(t[1]),
                address: hex(t[2]),
                size: hex(t[5]),
                executable: t[6..t.len() - 1].concat().contains('E'),
            }
        })
        .collect()
}

fn readelf_sections(path: &Path) -> Vec<Region> {
    let text = run_tool("readelf", &["-SW", path.to_str().unwrap()]);
    text.lines()
        .filter_map(|l| l.trim_start().starts_with('[').then(|| l.split_once(']'))?)
        .filter_map(|(_, rest)| {
            let t: Vec<&str> = rest.split_whitespace().collect();
            (t.len() > 5 && t[0] != "Name").then(|| Region {
                name: t[0].to_string(),
                address: hex(t[2]),
                offset: hex(t[3]),
                size: hex(t[4]),
                executable: false,
            })
        })
        .collect()
}

fn bpftrace_names(path: &Path) -> BTreeSet<String> {
    let spec = format!("usdt:{}:*", path.display());
    let prefix = format!("usdt:{}:", path.display());
    run_tool("bpftrace", &["-l", &spec])
        .lines()
        .map(|l| {
            l.strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("bpftrace -l line {l:?}"))
                .to_string()
        })
        .collect()
}

/// Checks the agent's listing of `path` against readelf (and bpftrace for
/// native binaries); returns the sites.
fn check_against_readelf(path: &Path, nop: &[u8], with_bpftrace: bool) -> Vec<Listed> {
    let listing = parse_listing(&probes_list(&[path.to_str().unwrap()]));
    assert_eq!(listing.len(), 1, "{listing:?}");
    assert_eq!(listing[0].0, path);
    let sites = listing[0].1.clone();
    let notes = readelf_notes(path);
    assert!(
        !notes.is_empty(),
        "readelf shows no stapsdt notes in {}",
        path.display()
    );
    assert_eq!(
        sites.len(),
        notes.len(),
        "one site per note: {sites:#?} {notes:#?}"
    );

    let loads = readelf_loads(path);
    let sections = readelf_sections(path);
    let base_section = sections.iter().find(|s| s.name == ".stapsdt.base");
    let bytes = std::fs::read(path).unwrap();
    for (site, note) in sites.iter().zip(&notes) {
        let what = format!("{}:{} in {}", note.provider, note.name, path.display());
        assert_eq!(
            (&site.provider, &site.name),
            (&note.provider, &note.name),
            "{what}"
        );
        assert_eq!(site.args, note.args, "{what}");
        // sys/sdt.h's base adjustment, computed from readelf's numbers.
        let expected = match base_section {
            Some(s) if note.base != 0 => note.location + s.address - note.base,
            _ => note.location,
        };
        assert_eq!(site.address, expected, "{what}");
        let load = loads
            .iter()
            .find(|l| l.executable && l.address <= expected && expected < l.address + l.size)
            .unwrap_or_else(|| panic!("{what}: no executable LOAD holds {expected:#x}"));
        assert_eq!(site.offset, expected - load.address + load.offset, "{what}");
        // The probe site is the nop sys/sdt.h emits.
        let at = site.offset as usize;
        assert_eq!(&bytes[at..at + nop.len()], nop, "{what}: no nop at {at:#x}");
        assert_eq!(
            site.semaphore,
            (note.semaphore != 0).then_some(note.semaphore),
            "{what}"
        );
    }
    if with_bpftrace {
        let ours: BTreeSet<String> = sites
            .iter()
            .map(|s| format!("{}:{}", s.provider, s.name))
            .collect();
        assert_eq!(ours, bpftrace_names(path), "names vs bpftrace -l");
    }
    sites
}

/// Per site, from the JSON listing read by Python's json module (an
/// independent parser): `provider:name file_offset semaphore_file_offset
/// argument_count argument_error`.
fn json_rows(path: &Path) -> Vec<String> {
    let json = probes_list(&[path.to_str().unwrap(), "--format", "json"]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), json).unwrap();
    let script = "import json,sys\n\
        for f in json.load(open(sys.argv[1])):\n\
        \x20 for p in f['probes']:\n\
        \x20   s = p['semaphore']\n\
        \x20   print(p['provider'] + ':' + p['name'], p['file_offset'],\n\
        \x20         s['file_offset'] if s else '-', len(p['arguments'] or []),\n\
        \x20         p['arguments_error'] or '', sep='\\t')\n";
    run_tool(
        "/usr/bin/python3.11",
        &["-c", script, file.path().to_str().unwrap()],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Semaphore file offsets agree with the section holding the semaphore
/// (readelf -S), and every argument parsed except the ones in `unreadable`.
fn check_json(path: &Path, sites: &[Listed], unreadable: &[(&str, &str)]) {
    let rows = json_rows(path);
    assert_eq!(rows.len(), sites.len());
    let sections = readelf_sections(path);
    for (row, site) in rows.iter().zip(sites) {
        let cells: Vec<&str> = row.split('\t').collect();
        let what = format!("{row:?} in {}", path.display());
        assert_eq!(
            cells[0],
            format!("{}:{}", site.provider, site.name),
            "{what}"
        );
        assert_eq!(cells[1].parse::<u64>().unwrap(), site.offset, "{what}");
        match site.semaphore {
            None => assert_eq!(cells[2], "-", "{what}"),
            Some(address) => {
                let section = sections
                    .iter()
                    .find(|s| s.address <= address && address < s.address + s.size)
                    .unwrap_or_else(|| panic!("{what}: no section holds {address:#x}"));
                let expected = address - section.address + section.offset;
                assert_eq!(cells[2].parse::<u64>().unwrap(), expected, "{what}");
            }
        }
        let expected_error = unreadable
            .iter()
            .find(|(name, _)| *name == cells[0])
            .map(|(_, error)| *error);
        match expected_error {
            None => {
                assert_eq!(cells[4], "", "{what}");
                // One '@' per argument (arm64's `[sp, 8]` holds a space).
                let count = site.args.matches('@').count();
                assert_eq!(cells[3].parse::<usize>().unwrap(), count, "{what}");
            }
            Some(error) => assert!(cells[4].contains(error), "{what}"),
        }
    }
}

const X86_NOP: &[u8] = &[0x90];
/// aarch64 `nop` (0xd503201f), little-endian.
const ARM64_NOP: &[u8] = &[0x1f, 0x20, 0x03, 0xd5];

/// The fixture's probes: names, and which have semaphores.
fn check_fixture_shape(sites: &[Listed]) {
    let names: BTreeSet<String> = sites
        .iter()
        .map(|s| format!("{}:{}", s.provider, s.name))
        .collect();
    let expected: BTreeSet<String> = [
        "fixture:start",
        "fixture:add",
        "fixture:sizes",
        "fixture:constants",
        "fixture:global",
        "fixture:ratio",
        "fixture:twice",
        "fixture_sem:request",
        "fixture_sem:done",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(names, expected);
    assert_eq!(sites.iter().filter(|s| s.name == "twice").count(), 2);
    for site in sites {
        assert_eq!(
            site.semaphore.is_some(),
            site.provider == "fixture_sem",
            "{site:?}"
        );
    }
    let constants = sites.iter().find(|s| s.name == "constants").unwrap();
    // Immediates: `$` on x86_64, bare on arm64.
    assert!(
        ["-4@$8192 -4@$-1", "-4@8192 -4@-1"].contains(&constants.args.as_str()),
        "{constants:?}"
    );
}

#[test]
fn fixture_o2_matches_readelf_and_bpftrace() {
    let binary = build_usdt_fixture("-O2", FixtureArch::Native);
    let sites = check_against_readelf(&binary, X86_NOP, true);
    check_fixture_shape(&sites);
    // -O2 puts arguments in registers, and the global as sym(%rip).
    let add = sites.iter().find(|s| s.name == "add").unwrap();
    assert!(add.args.contains('%') && !add.args.contains('('), "{add:?}");
    let global = sites.iter().find(|s| s.name == "global").unwrap();
    assert!(global.args.contains("(%rip)"), "{global:?}");
    check_json(&binary, &sites, &[]);
}

#[test]
fn fixture_o0_matches_readelf_and_bpftrace() {
    let binary = build_usdt_fixture("-O0", FixtureArch::Native);
    let sites = check_against_readelf(&binary, X86_NOP, true);
    check_fixture_shape(&sites);
    // -O0 keeps arguments in stack slots.
    let add = sites.iter().find(|s| s.name == "add").unwrap();
    assert!(add.args.contains("(%rbp)"), "{add:?}");
    check_json(&binary, &sites, &[]);
}

#[test]
fn arm64_fixture_matches_readelf() {
    for opt in ["-O0", "-O2"] {
        let binary = build_usdt_fixture(opt, FixtureArch::Arm64);
        // bpftrace parses argument specs for the host only: readelf alone.
        let sites = check_against_readelf(&binary, ARM64_NOP, false);
        check_fixture_shape(&sites);
        // aarch64 gcc -O2 addresses the global as [x0, #:lo12:.LANCHOR0], a
        // relocation whose value is not in the note: reported, not guessed.
        let unreadable: &[(&str, &str)] = if opt == "-O2" {
            &[("fixture:global", "link-time relocation")]
        } else {
            &[]
        };
        check_json(&binary, &sites, unreadable);
    }
}

#[test]
fn python311_matches_readelf_and_bpftrace() {
    let python = Path::new("/usr/bin/python3.11");
    assert!(
        python.exists(),
        "{} is missing: install python3.11 with `cargo xtask setup --tests`",
        python.display()
    );
    let sites = check_against_readelf(python, X86_NOP, true);
    for name in [
        "gc__start",
        "gc__done",
        "import__find__load__start",
        "audit",
    ] {
        let site = sites
            .iter()
            .find(|s| s.provider == "python" && s.name == name)
            .unwrap_or_else(|| panic!("python:{name} not listed"));
        assert!(site.semaphore.is_some(), "{site:?}");
    }
    check_json(python, &sites, &[]);
}

#[test]
fn pid_listing_covers_the_running_executable() {
    let binary = build_usdt_fixture("-O2", FixtureArch::Native);
    let running = Running::start(&binary, &["sleep"]);
    let pid = running.pid().to_string();
    let listing = parse_listing(&probes_list(&["--pid", &pid]));
    // libc and the loader have no notes on Debian: only the fixture.
    let paths: Vec<&PathBuf> = listing.iter().map(|(p, _)| p).collect();
    assert_eq!(paths, vec![&binary], "{listing:?}");
    let by_path = parse_listing(&probes_list(&[binary.to_str().unwrap()]));
    assert_eq!(listing[0].1, by_path[0].1);
}

#[test]
fn pid_listing_reads_python_through_its_maps() {
    let python = Path::new("/usr/bin/python3.11");
    let running = Running::start(python, &["-c", "import time; time.sleep(30)"]);
    let pid = running.pid().to_string();
    let listing = parse_listing(&probes_list(&["--pid", &pid]));
    let (path, sites) = listing
        .iter()
        .find(|(p, _)| p == python)
        .unwrap_or_else(|| panic!("{listing:?}"));
    assert_eq!(path, python);
    assert!(sites.iter().any(|s| s.name == "gc__start"));
}

#[test]
fn binary_without_probes_is_a_clear_error() {
    let output = run_agent(&["probes", "list", "/bin/true"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/bin/true has no USDT probes (.note.stapsdt)") && stderr.contains("--pid"),
        "{stderr}"
    );
    let output = run_agent(&["probes", "list", "/nonexistent/libx.so"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot read /nonexistent/libx.so"),
        "{stderr}"
    );
}

#[test]
fn missing_pid_is_named() {
    let pid = (4_000_000..4_194_304)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap()
        .to_string();
    let output = run_agent(&["probes", "list", "--pid", &pid]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("no process with pid {pid}")),
        "{stderr}"
    );
}

/// Deterministic values spread over many magnitudes, with the edges that
/// matter: negatives, 0, 1, exact powers of two and one below them.
fn test_values() -> Vec<i64> {
    let mut values = vec![
        -3, -1, 0, 0, 1, 1, 1, 2, 3, 4, 7, 8, 1023, 1024, 1025, 65535, 65536,
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..120 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Magnitude up to 2^30: bpftrace 0.17's BPF log2 stops at bucket
        // [2G, 4G) for larger values (its loop starts at 2^16), so stay below.
        let bits = (state >> 59) as u32; // 0..31
        let value = (state >> 33) as i64 & ((1i64 << bits.min(30)) - 1);
        values.push(value);
    }
    values
}

#[test]
fn histogram_text_matches_bpftrace() {
    let values = test_values();
    let mut log2 = Histogram::log2(Unit::None);
    let linear_layout = Layout::linear(0, 1000, 100).unwrap();
    let mut linear = Histogram::new(linear_layout, Unit::None);
    let kilo_layout = Layout::linear(0, 10240, 1024).unwrap();
    let mut kilo = Histogram::new(kilo_layout, Unit::None);
    let mut keyed = vec![
        ("1".to_string(), Histogram::log2(Unit::None)),
        ("2".to_string(), Histogram::log2(Unit::None)),
    ];
    let mut program = String::from("BEGIN {\n");
    for (i, &v) in values.iter().enumerate() {
        log2.record(v);
        program.push_str(&format!("  @h = hist({v});\n"));
        // Smaller values for the linear ones so every bucket kind shows.
        let small = v % 1200 - 50;
        linear.record(small);
        program.push_str(&format!("  @l = lhist({small}, 0, 1000, 100);\n"));
        let mid = v % 12000;
        kilo.record(mid);
        program.push_str(&format!("  @m = lhist({mid}, 0, 10240, 1024);\n"));
        // Two keys with different totals (bpftrace orders by total).
        if i % 3 != 0 {
            keyed[0].1.record(v);
            program.push_str(&format!("  @k[1] = hist({v});\n"));
        } else {
            keyed[1].1.record(v);
            program.push_str(&format!("  @k[2] = hist({v});\n"));
        }
    }
    program.push_str("  exit();\n}\n");
    let script = tempfile::Builder::new().suffix(".bt").tempfile().unwrap();
    std::fs::write(script.path(), &program).unwrap();
    let output = run_tool("bpftrace", &[script.path().to_str().unwrap()]);
    // bpftrace prints "Attaching 1 probe...", blank lines, then the maps
    // sorted by name.
    let start = output
        .find("\n@")
        .map(|i| i + 1)
        .expect("bpftrace printed maps");
    let theirs = &output[start..];
    let ours = [
        text::bpftrace_block("@h", &log2),
        text::bpftrace_keyed("@k", &keyed),
        text::bpftrace_block("@l", &linear),
        text::bpftrace_block("@m", &kilo),
    ]
    .concat();
    assert_eq!(ours, theirs, "ours:\n{ours}\nbpftrace:\n{theirs}");
}

#[test]
fn rip_relative_argument_is_resolved_like_nm() {
    // -O2 reads the global `fixture_counter` as `-4@fixture_counter(%rip)`:
    // its address must be the symbol's, as nm prints it.
    use profiler_probes::{Location, read_probes};
    let binary = build_usdt_fixture("-O2", FixtureArch::Native);
    let nm = run_tool("nm", &[binary.to_str().unwrap()]);
    let expected = nm
        .lines()
        .find_map(|l| l.strip_suffix(" D fixture_counter").map(hex))
        .unwrap_or_else(|| panic!("nm shows no fixture_counter:\n{nm}"));
    let probes = read_probes(&binary).unwrap();
    let global = probes.probes.iter().find(|p| p.name == "global").unwrap();
    let arg = global.argument(0).unwrap();
    assert_eq!((arg.size, arg.signed), (4, true));
    match &arg.location {
        Location::Symbol {
            symbol,
            offset,
            address,
        } => {
            assert_eq!((symbol.as_str(), *offset), ("fixture_counter", 0));
            assert_eq!(*address, Some(expected));
        }
        other => panic!("expected a symbol argument, got {other:?}"),
    }
    // One argument: index 1 is refused, naming the probe.
    let error = global.argument(1).unwrap_err().to_string();
    assert!(
        error.contains("fixture:global has 1 argument(s)"),
        "{error}"
    );
}

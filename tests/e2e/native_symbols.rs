//! Native symbolization against ground truth: every instruction address of
//! C and C++ fixtures built `-O2 -g` (so inlining happens) is symbolized by
//! `profiler-agent symbolize` and by binutils `addr2line -f -i -C` (C) or
//! `llvm-symbolizer` (C++: binutils 2.40 names an inlined `atof` frame
//! after its caller), and the inline chains (function, file, line) must be
//! equal. Also through compressed debug sections and separate debug files.

use std::path::{Path, PathBuf};
use std::process::Command;

use profiler_tests::{agent::*, profiles::*};

/// (function, file:line) frames, innermost first, per address.
type Chains = Vec<(u64, Vec<(String, String)>)>;

fn compile(compiler: &str, source: &str, flags: &[&str], out: &Path) {
    let output = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(workspace_root().join("tests/fixtures").join(source))
        .output()
        .unwrap_or_else(|e| panic!("running {compiler} (cargo xtask setup --tests): {e}"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Symbol ranges [start, end) of the named functions, from `nm -S`.
fn function_ranges(binary: &Path, functions: &[&str]) -> Vec<(u64, u64)> {
    let output = Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(binary)
        .output()
        .expect("nm (binutils)");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [start, size, _, name] = fields[..] else {
                return None;
            };
            let wanted = functions
                .iter()
                .any(|f| name == *f || name.starts_with(&format!("{f}.")));
            let start = u64::from_str_radix(start, 16).ok()?;
            let size = u64::from_str_radix(size, 16).ok()?;
            wanted.then_some((start, start + size))
        })
        .collect()
}

/// Every instruction address inside the named functions, from objdump,
/// within each function's symbol size (the padding after it is no one's).
fn instruction_addresses(binary: &Path, functions: &[&str]) -> Vec<u64> {
    let ranges = function_ranges(binary, functions);
    let output = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(binary)
        .output()
        .expect("objdump (binutils)");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut inside = false;
    let mut addresses = Vec::new();
    for line in text.lines() {
        if let Some(name) = line
            .strip_suffix(">:")
            .and_then(|l| l.split_once(" <"))
            .map(|(_, n)| n)
        {
            inside = functions
                .iter()
                .any(|f| name == *f || name.starts_with(&format!("{f}.")));
            continue;
        }
        if inside
            && let Some((address, _)) = line.trim_start().split_once(':')
            && let Ok(address) = u64::from_str_radix(address, 16)
            && ranges
                .iter()
                .any(|&(start, end)| start <= address && address < end)
        {
            addresses.push(address);
        }
    }
    addresses
}

fn location(file: &str, line: &str) -> String {
    // binutils appends " (discriminator N)"; "??" and 0 mean unknown.
    let line = line.split(' ').next().unwrap_or("?");
    let line = if line == "0" { "?" } else { line };
    format!("{file}:{line}")
}

/// A reference symbolizer run in GNU addr2line's output style.
#[derive(Clone, Copy)]
enum Reference {
    Binutils,
    LlvmSymbolizer,
}

fn reference_chains(reference: Reference, binary: &Path, addresses: &[u64]) -> Chains {
    let mut command = match reference {
        Reference::Binutils => {
            let mut c = Command::new("addr2line");
            c.args(["-f", "-i", "-C", "-a", "-e"]).arg(binary);
            c
        }
        Reference::LlvmSymbolizer => {
            let mut c = Command::new("/usr/lib/llvm-22/bin/llvm-symbolizer");
            c.args(["--output-style=GNU", "-f", "-i", "-C", "-a"])
                .arg(format!("--obj={}", binary.display()));
            c
        }
    };
    let output = command
        .args(addresses.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("addr2line (binutils) or llvm-symbolizer (llvm-22): cargo xtask setup --tests");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    let mut chains: Chains = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() {
            continue;
        }
        let address = u64::from_str_radix(line.trim_start_matches("0x"), 16).unwrap();
        let mut frames = Vec::new();
        while let Some(next) = lines.peek() {
            if next.starts_with("0x") || next.is_empty() {
                break;
            }
            let function = lines.next().unwrap().to_string();
            let place = lines.next().unwrap_or("??:0");
            let (file, line) = place.rsplit_once(':').unwrap_or((place, "?"));
            frames.push((function, location(file, line)));
        }
        chains.push((address, frames));
    }
    chains
}

fn our_chains(binary: &Path, addresses: &[u64]) -> Chains {
    let mut args = vec![
        "symbolize".to_string(),
        "--format".into(),
        "json".into(),
        "--binary".into(),
        binary.display().to_string(),
    ];
    args.extend(addresses.iter().map(|a| format!("{a:#x}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run_agent(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json = String::from_utf8_lossy(&output.stdout);
    parse_symbolize_json(&json)
        .into_iter()
        .map(|(address, frames)| {
            let frames = frames
                .into_iter()
                .map(|f| {
                    let file = f.file.unwrap_or_else(|| "??".into());
                    let line = f.line.map_or("?".to_string(), |l| l.to_string());
                    (f.function, location(&file, &line))
                })
                .collect();
            (address, frames)
        })
        .collect()
}

fn assert_same_chains(
    binary: &Path,
    reference_binary: &Path,
    reference: Reference,
    functions: &[&str],
) -> usize {
    let addresses = instruction_addresses(reference_binary, functions);
    assert!(addresses.len() > 10, "too few addresses in {functions:?}");
    let expected = reference_chains(reference, reference_binary, &addresses);
    let ours = our_chains(binary, &addresses);
    assert_eq!(expected.len(), ours.len());
    let mut inlined = 0;
    for ((address, want), (_, got)) in expected.iter().zip(&ours) {
        assert_eq!(got, want, "at {address:#x} in {}", binary.display());
        if want.len() > 1 {
            inlined += 1;
        }
    }
    println!(
        "{}: {} addresses equal to addr2line, {inlined} inside inlined code",
        binary.display(),
        addresses.len()
    );
    inlined
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn c_inline_chains_equal_binutils_addr2line() {
    let dir = scratch();
    let binary = dir.path().join("inlined");
    compile("cc", "c/inlined.c", &["-O2", "-g"], &binary);
    let inlined = assert_same_chains(&binary, &binary, Reference::Binutils, &["checksum", "main"]);
    assert!(inlined > 5, "the fixture should have inlined code");
    let binary = dir.path().join("hot");
    compile("cc", "c/hot.c", &["-O2", "-g"], &binary);
    assert_same_chains(
        &binary,
        &binary,
        Reference::Binutils,
        &["hot_a", "hot_b", "round_trip", "main", "work"],
    );
}

#[test]
fn cpp_inline_chains_equal_binutils_addr2line() {
    let dir = scratch();
    let binary = dir.path().join("shapes");
    compile("c++", "cpp/shapes.cpp", &["-O2", "-g"], &binary);
    assert_same_chains(
        &binary,
        &binary,
        Reference::LlvmSymbolizer,
        &["main", "_ZN8geometry5scaleEdi", "_ZN8geometry5scaleEdd"],
    );
}

#[test]
fn compressed_debug_sections() {
    let dir = scratch();
    let binary = dir.path().join("inlined-gz");
    compile("cc", "c/inlined.c", &["-O2", "-g", "-gz=zlib"], &binary);
    let sections = Command::new("readelf")
        .args(["-S", "-W"])
        .arg(&binary)
        .output()
        .unwrap();
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(
        sections
            .lines()
            .any(|l| l.contains(".debug_info") && l.contains(" C ")),
        "the fixture's .debug_info is not compressed:\n{sections}"
    );
    assert!(assert_same_chains(&binary, &binary, Reference::Binutils, &["checksum"]) > 5);
}

#[test]
fn separate_debug_file_through_gnu_debuglink() {
    let dir = scratch();
    let full = dir.path().join("full");
    compile("cc", "c/inlined.c", &["-O2", "-g"], &full);
    let stripped = dir.path().join("app");
    let debug = dir.path().join("app.debug");
    let objcopy = |args: &[&std::ffi::OsStr]| {
        let status = Command::new("objcopy")
            .args(args)
            .status()
            .expect("objcopy (binutils)");
        assert!(status.success());
    };
    objcopy(&[
        "--only-keep-debug".as_ref(),
        full.as_os_str(),
        debug.as_os_str(),
    ]);
    std::fs::copy(&full, &stripped).unwrap();
    objcopy(&[
        "--strip-all".as_ref(),
        format!("--add-gnu-debuglink={}", debug.display()).as_ref(),
        stripped.as_os_str(),
    ]);
    // The stripped binary alone has neither DWARF nor a symbol table.
    let nm = Command::new("nm").arg(&stripped).output().unwrap();
    assert!(
        !nm.status.success() || nm.stdout.is_empty(),
        "strip left symbols"
    );
    assert!(assert_same_chains(&stripped, &full, Reference::Binutils, &["checksum", "main"]) > 5);
}

#[test]
fn separate_debug_file_by_build_id() {
    use object::Object;
    let dir = scratch();
    let full = dir.path().join("full");
    compile("cc", "c/inlined.c", &["-O2", "-g", "-Wl,--build-id"], &full);
    let data = std::fs::read(&full).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let id: String = file
        .build_id()
        .unwrap()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // A root directory laid out like a distribution's debug packages.
    let root = dir.path().join("root");
    let debug_dir = root.join("usr/lib/debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&debug_dir).unwrap();
    let debug = debug_dir.join(format!("{}.debug", &id[2..]));
    let status = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug)
        .status()
        .unwrap();
    assert!(status.success());
    // The binary as a process inside `root` maps it, with that root held
    // open (as the agent holds a process's) or only named.
    let object = |root: &Path, held: bool| profiler_symbolize::process::ObjectFile {
        id: profiler_symbolize::process::ObjectId {
            dev: (0, 0),
            inode: 1,
        },
        path: PathBuf::from("/usr/bin/app"),
        root: root.to_path_buf(),
        root_dir: held
            .then(|| profiler_symbolize::process::contained::Root::open(root).ok())
            .flatten()
            .map(std::sync::Arc::new),
        file: Err("not needed".into()),
        go_binary: Default::default(),
    };
    for held in [true, false] {
        let found = profiler_symbolize::dwarf::find_debug_file(&file, &object(&root, held))
            .map(|(path, _)| path);
        assert_eq!(found.as_ref(), Some(&debug), "root held open: {held}");
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let found: Option<PathBuf> =
            profiler_symbolize::dwarf::find_debug_file(&file, &object(&empty, held))
                .map(|(path, _)| path);
        assert_eq!(found, None, "root held open: {held}");
    }
}

//! Names for stripped binaries from MiniDebugInfo (`.gnu_debugdata`, as
//! Fedora and RHEL ship them): a fixture is stripped and given the section
//! with Fedora's own recipe (binutils and xz), then named by the agent's
//! `symbolize` and in a profile. Ground truth: gdb and elfutils'
//! eu-addr2line, which read the section, on the same stripped file.

use std::path::{Path, PathBuf};
use std::process::Command;

use profiler_tests::shares::{Share, share_near};
use profiler_tests::{agent::*, fixtures::*, processes::*, profiles::*};

fn run(program: &str, args: &[&str], dir: &Path) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `binary` stripped, with MiniDebugInfo made as Fedora's find-debuginfo
/// does: the function symbols `.dynsym` lacks, in an xz-compressed ELF
/// file in `.gnu_debugdata`. Also returns the plain stripped file.
fn with_minidebuginfo(binary: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::copy(binary, dir.join("full")).unwrap();
    let names = |args: &[&str]| -> Vec<String> {
        let mut names: Vec<String> = run("nm", args, dir)
            .lines()
            .filter_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                (fields.len() >= 2 && matches!(fields[1], "T" | "t")).then(|| fields[0].to_string())
            })
            .collect();
        names.sort();
        names
    };
    let dynamic = names(&["-D", "--format=posix", "--defined-only", "full"]);
    let keep: Vec<String> = names(&["--format=posix", "--defined-only", "full"])
        .into_iter()
        .filter(|n| !dynamic.contains(n))
        .collect();
    std::fs::write(dir.join("keep"), keep.join("\n") + "\n").unwrap();
    run("objcopy", &["--only-keep-debug", "full", "debug"], dir);
    run(
        "objcopy",
        &[
            "-S",
            "--remove-section",
            ".gdb_index",
            "--remove-section",
            ".comment",
            "--keep-symbols=keep",
            "debug",
            "mini_debuginfo",
        ],
        dir,
    );
    run("xz", &["--force", "mini_debuginfo"], dir);
    run("cp", &["full", "stripped"], dir);
    run("strip", &["--strip-all", "-R", ".comment", "stripped"], dir);
    run("cp", &["stripped", "mini"], dir);
    run(
        "objcopy",
        &["--add-section", ".gnu_debugdata=mini_debuginfo.xz", "mini"],
        dir,
    );
    (dir.join("mini"), dir.join("stripped"))
}

/// Start and middle of each of the fixture's own functions, from the
/// unstripped file.
fn function_addresses(full: &Path, functions: &[&str]) -> Vec<(String, u64)> {
    let text = run(
        "nm",
        &["-S", "--defined-only", full.to_str().unwrap()],
        Path::new("/"),
    );
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 4 || !functions.contains(&fields[3]) {
            continue;
        }
        let start = u64::from_str_radix(fields[0], 16).unwrap();
        let size = u64::from_str_radix(fields[1], 16).unwrap();
        out.push((fields[3].to_string(), start));
        out.push((fields[3].to_string(), start + size / 2));
    }
    out
}

/// What gdb says is at `address` of `binary`: "NAME in section" or
/// "NAME + N in section" gives NAME.
/// The function elfutils' `eu-addr2line -f` names at `address`.
fn eu_addr2line(binary: &Path, address: u64) -> String {
    let text = run_tool(
        "eu-addr2line",
        &[
            "-f",
            "-e",
            binary.to_str().unwrap(),
            &format!("{address:#x}"),
        ],
    );
    text.lines().next().unwrap_or("").trim().to_string()
}

fn gdb_symbol(binary: &Path, address: u64) -> String {
    let text = run(
        "gdb",
        &[
            "-nx",
            "-batch",
            "-ex",
            &format!("info symbol {address:#x}"),
            binary.to_str().unwrap(),
        ],
        Path::new("/"),
    );
    text.lines()
        .last()
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("")
        .to_string()
}

fn symbolize(binary: &Path, addresses: &[u64]) -> Vec<String> {
    symbolize_frames(binary, addresses)
        .into_iter()
        .map(|f| f.function)
        .collect()
}

/// The outermost frame `symbolize --format json` gives each address.
fn symbolize_frames(binary: &Path, addresses: &[u64]) -> Vec<SymbolizedFrame> {
    let mut args = vec![
        "symbolize".to_string(),
        "--binary".to_string(),
        binary.display().to_string(),
        "--format".to_string(),
        "json".to_string(),
    ];
    args.extend(addresses.iter().map(|a| format!("{a:#x}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run_agent(&args);
    assert!(
        output.status.success(),
        "symbolize failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse_symbolize_json(String::from_utf8_lossy(&output.stdout).trim())
        .into_iter()
        .map(|(_, frames)| frames.last().cloned().expect("a frame"))
        .collect()
}

const FUNCTIONS: &[&str] = &["hot_a", "hot_b", "work", "round_trip", "main"];

#[test]
fn minidebuginfo_names_stripped_functions_as_gdb_does() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build_c_fixture("hot", C_FRAME_POINTER_FLAGS);
    let (mini, stripped) = with_minidebuginfo(&binary, dir.path());
    let points = function_addresses(&dir.path().join("full"), FUNCTIONS);
    assert!(points.len() >= 2 * FUNCTIONS.len(), "{points:?}");
    let addresses: Vec<u64> = points.iter().map(|(_, a)| *a).collect();

    let frames = symbolize_frames(&mini, &addresses);
    assert!(
        frames.iter().all(|f| f.source == "minidebuginfo"),
        "names not marked as from MiniDebugInfo: {frames:?}"
    );
    let ours: Vec<String> = frames.into_iter().map(|f| f.function).collect();
    for ((function, address), ours) in points.iter().zip(&ours) {
        let gdb = gdb_symbol(&mini, *address);
        let elfutils = eu_addr2line(&mini, *address);
        assert_eq!(
            (ours.as_str(), gdb.as_str(), elfutils.as_str()),
            (function.as_str(), function.as_str(), function.as_str()),
            "{address:#x}: ours {ours}, gdb {gdb}, eu-addr2line {elfutils}, nm of the \
             unstripped file {function}"
        );
    }
    // The names come from the section: without it, none of them.
    let plain = symbolize(&stripped, &addresses);
    let named = plain
        .iter()
        .filter(|n| FUNCTIONS.contains(&n.as_str()))
        .count();
    assert_eq!(named, 0, "the plain stripped file named {plain:?}");
}

#[test]
fn a_profile_of_a_minidebuginfo_binary_names_its_functions() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = build_c_fixture("hot", C_FRAME_POINTER_FLAGS);
    let (mini, _) = with_minidebuginfo(&binary, dir.path());
    let fixture = Running::start(&mini, &["20"]);
    let out = dir.path().join("cpu.pb.gz");
    let pid = fixture.pid().to_string();
    // About 400 samples: the 2:1 split told from 1:1 beyond chance.
    let report = record(&[
        "--pid",
        &pid,
        "--duration",
        "4s",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stacks = stacks(&read_pprof(&out));
    let count = |f: &str| -> i64 { stacks.iter().filter(|s| s.has(f)).map(|s| s.count).sum() };
    let (a, b) = (count("hot_a"), count("hot_b"));
    if let Err(why) = share_near("hot_a", Share::of(a, a + b), 2.0 / 3.0, 0.0, 0.12) {
        panic!("{why} (hot_a does twice hot_b's work)\n{report}");
    }
    let rooted = stacks
        .iter()
        .filter(|s| s.has("main") && s.has("round_trip"))
        .map(|s| s.count)
        .sum::<i64>();
    assert!(
        rooted * 10 >= (a + b) * 9,
        "{rooted} of {} through main",
        a + b
    );
}

#[test]
fn a_hostile_gnu_debugdata_section_is_refused_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build_c_fixture("hot", C_FRAME_POINTER_FLAGS);
    let (_, stripped) = with_minidebuginfo(&binary, dir.path());
    // Garbage, and an xz bomb: 100 MiB of zeros (past the 64 MiB cap).
    std::fs::write(dir.path().join("garbage"), b"\xfd7zXZ\0 not really").unwrap();
    let zeros = std::fs::File::create(dir.path().join("zeros")).unwrap();
    zeros.set_len(100 << 20).unwrap();
    run("xz", &["--force", "-0", "zeros"], dir.path());
    for (name, section) in [("garbage", "garbage"), ("bomb", "zeros.xz")] {
        let target = dir.path().join(name);
        std::fs::copy(&stripped, &target).unwrap();
        run(
            "objcopy",
            &[
                "--add-section",
                &format!(".gnu_debugdata={section}"),
                target.to_str().unwrap(),
            ],
            dir.path(),
        );
        let names = symbolize(&target, &[0x1000]);
        assert_eq!(names.len(), 1, "{name}: {names:?}");
    }
}

/// FDE ranges of `binary` as binutils reads them:
/// "... FDE cie=... pc=START..END".
fn readelf_fdes(binary: &Path) -> Vec<(u64, u64)> {
    let text = run(
        "readelf",
        &["--debug-dump=frames", binary.to_str().unwrap()],
        Path::new("/"),
    );
    let mut fdes: Vec<(u64, u64)> = text
        .lines()
        .filter(|l| l.contains(" FDE "))
        .filter_map(|l| {
            let (start, end) = l.split_once("pc=")?.1.split_once("..")?;
            Some((
                u64::from_str_radix(start.trim(), 16).ok()?,
                u64::from_str_radix(end.trim(), 16).ok()?,
            ))
        })
        .filter(|&(start, end)| start != 0 && end > start)
        .collect();
    fdes.sort_unstable();
    fdes
}

#[test]
fn unnamed_addresses_of_debians_stripped_programs_are_named_by_their_fde_start() {
    for binary in [
        Path::new("/usr/bin/xz"),
        Path::new("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0"),
    ] {
        let fdes = readelf_fdes(binary);
        assert!(fdes.len() > 50, "{}: {} FDEs", binary.display(), fdes.len());
        // Inside every FDE, up to 400 of them spread over the file.
        let step = (fdes.len() / 400).max(1);
        let picked: Vec<(u64, u64)> = fdes.iter().step_by(step).copied().collect();
        let addresses: Vec<u64> = picked.iter().map(|&(s, e)| s + (e - s) / 2).collect();
        let frames = symbolize_frames(binary, &addresses);
        let file = binary.file_name().unwrap().to_str().unwrap();
        let mut unnamed = 0;
        for ((start, _), frame) in picked.iter().zip(&frames) {
            let name = &frame.function;
            let Some(offset) = name.strip_prefix(&format!("{file}+")) else {
                assert_eq!(frame.source, "dynsym", "{name}: named from what?");
                continue;
            };
            unnamed += 1;
            // Marked as grouped: the source, and (as in pprof) the object
            // as the file without a line.
            assert_eq!(frame.source, "cfi-grouped", "{name}");
            assert_eq!(
                (frame.file.as_deref(), frame.line),
                (binary.to_str(), None),
                "{name}"
            );
            assert_eq!(
                offset,
                format!("{start:#x}"),
                "{}: an address of the FDE at {start:#x} named {name}",
                binary.display()
            );
        }
        // xz exports next to nothing; libsqlite3 its whole API.
        assert!(
            unnamed >= 50,
            "{}: only {unnamed} of {} unnamed (a stripped file?)",
            binary.display(),
            picked.len()
        );
    }
}

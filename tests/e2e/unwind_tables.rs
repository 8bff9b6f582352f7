//! The unwind tables themselves, against independent readers of the same
//! information: every CFI row of real objects (our fixtures, Debian's libc
//! and libstdc++, x86_64 and arm64) against binutils' own interpretation
//! (`readelf --debug-dump=frames-interp`), and Go's arm64 rows against the
//! frame sizes in the prologues `go tool objdump` prints. No BPF here: the
//! walker follows these rows as they are (profiler-ebpf/src/unwind.rs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use profiler_common::unwind::{
    RULE_CFA_DEREF_FP, RULE_CFA_FP, RULE_CFA_SP, RULE_FLAG_UNSUPPORTED, RULE_FRAME_POINTER,
    RULE_PLT, RULE_ROOT, RULE_SIGNAL, UnwindRule,
};
use profiler_tests::{agent::*, go::*};
use profiler_unwind::build::build_bytes;
use profiler_unwind::table::ObjectTable;

/// One row of `readelf -wF`: at `loc`, the CFA rule and the rules of the
/// frame pointer and the return address (`None` when the column is absent).
#[derive(Debug, Clone)]
struct ReadelfRow {
    loc: u64,
    cfa: String,
    fp: Option<String>,
    ra: Option<String>,
}

/// A CIE (id, no range) or FDE (its CIE's id, its range) being read, with
/// its rows.
type Entry = (Option<String>, Option<(u64, u64)>, Vec<ReadelfRow>);

/// Parses `readelf -wF` (frames-interp) output into rows per FDE; an FDE
/// printed without a table has the rows of its CIE.
fn readelf_rows(path: &Path, fp_name: &str) -> Vec<(u64, u64, Vec<ReadelfRow>)> {
    // readelf exits 1 on some of Debian's libraries after printing every
    // frame (a complaint about another section); its output is what counts.
    let output = Command::new("readelf")
        .args(["-wF", path.to_str().unwrap()])
        .output()
        .expect("running readelf (binutils)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        text.contains("FDE"),
        "readelf -wF {} printed no frames: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut cies: HashMap<String, Vec<ReadelfRow>> = HashMap::new();
    let mut fdes = Vec::new();
    let mut current: Option<Entry> = None;
    let mut columns: Vec<String> = Vec::new();
    let mut finish = |entry: Option<Entry>, cies: &mut HashMap<String, Vec<ReadelfRow>>| {
        let Some((cie_id, range, rows)) = entry else {
            return;
        };
        match (cie_id, range) {
            (Some(id), None) => {
                cies.insert(id, rows);
            }
            (Some(cie), Some((start, end))) => {
                let rows = if rows.is_empty() {
                    cies.get(&cie)
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|r| ReadelfRow { loc: start, ..r })
                        .collect()
                } else {
                    rows
                };
                fdes.push((start, end, rows));
            }
            _ => {}
        }
    };
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 4 && words[3] == "CIE" {
            finish(current.take(), &mut cies);
            current = Some((Some(words[0].to_string()), None, Vec::new()));
        } else if words.len() >= 5 && words[3] == "FDE" {
            finish(current.take(), &mut cies);
            let cie = words[4].trim_start_matches("cie=").to_string();
            let range = words[5].trim_start_matches("pc=");
            let (start, end) = range.split_once("..").unwrap();
            let parse = |h: &str| u64::from_str_radix(h, 16).unwrap();
            current = Some((Some(cie), Some((parse(start), parse(end))), Vec::new()));
        } else if words.first() == Some(&"LOC") {
            columns = words.iter().map(|w| w.to_string()).collect();
        } else if let Some((_, _, rows)) = current.as_mut()
            && words.len() >= 2
            && words[1] != "ZERO"
            && let Ok(loc) = u64::from_str_radix(words[0], 16)
        {
            // A value naming a register is printed "r10 (r10)": the part
            // in parentheses belongs to the token before it.
            let mut values: Vec<String> = Vec::new();
            for word in &words {
                match values.last_mut() {
                    Some(last) if word.starts_with('(') => {
                        last.push(' ');
                        last.push_str(word);
                    }
                    _ => values.push(word.to_string()),
                }
            }
            let column = |name: &str| {
                let i = columns.iter().position(|c| c == name)?;
                values.get(i).cloned()
            };
            rows.push(ReadelfRow {
                loc,
                cfa: words[1].to_string(),
                fp: column(fp_name),
                ra: column("ra"),
            });
        }
    }
    finish(current.take(), &mut cies);
    fdes
}

fn table_of(path: &Path) -> ObjectTable {
    let data = std::fs::read(path).unwrap();
    build_bytes(&data, profiler_runtimes::unwind_rows())
        .unwrap_or_else(|e| panic!("no table for {}: {e}", path.display()))
        .table
}

fn offset(text: &str) -> Option<i64> {
    text.strip_prefix("c").and_then(|o| o.parse().ok())
}

/// Checks every readelf row against our rule at the same address; returns
/// how many rows were compared.
fn compare_with_readelf(path: &Path, arm64: bool) -> usize {
    let (sp, fp) = if arm64 { ("sp", "x29") } else { ("rsp", "rbp") };
    let table = table_of(path);
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for (start, end, rows) in readelf_rows(path, fp) {
        if start == 0 || end <= start {
            continue; // FDEs of discarded code
        }
        for row in rows {
            let rule = table.rule_at(row.loc).unwrap_or_default();
            compared += 1;
            if let Err(why) = matches(&rule, &row, sp, fp, arm64) {
                mismatches.push(format!(
                    "{:#x}: {why}: readelf {row:?}, ours {rule:?}",
                    row.loc
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{}: {} of {compared} rows differ from readelf:\n{}",
        path.display(),
        mismatches.len(),
        mismatches[..mismatches.len().min(20)].join("\n")
    );
    compared
}

fn matches(
    rule: &UnwindRule,
    row: &ReadelfRow,
    sp: &str,
    fp: &str,
    arm64: bool,
) -> Result<(), String> {
    // Signal trampolines are one rule for the whole FDE, whatever its rows.
    if rule.kind == RULE_SIGNAL {
        return Ok(());
    }
    let ra_undefined = row.ra.as_deref() == Some("u");
    if ra_undefined && !arm64 {
        // x86_64 CIEs always define the return address: "u" is an explicit
        // DW_CFA_undefined, the outermost frame.
        return (rule.kind == RULE_ROOT)
            .then_some(())
            .ok_or_else(|| "return address undefined: expected a root".into());
    }
    if rule.kind == RULE_ROOT {
        // arm64: "u" is also what readelf prints for a return address still
        // in x30, so a root must at least have it undefined there.
        return (arm64 && ra_undefined)
            .then_some(())
            .ok_or_else(|| "root where the return address is defined".into());
    }
    let unsupported = rule.kind == RULE_FRAME_POINTER && rule.flags & RULE_FLAG_UNSUPPORTED != 0;
    // The return address in another register (libc's context switching):
    // not modelled, the frame pointer is the fallback.
    if row
        .ra
        .as_deref()
        .is_some_and(|ra| !ra.starts_with('c') && ra != "u")
    {
        return unsupported
            .then_some(())
            .ok_or_else(|| "return address in a register".into());
    }
    if row.cfa == "exp" {
        return matches!(rule.kind, RULE_PLT | RULE_CFA_DEREF_FP)
            .then_some(())
            .or(
                (rule.kind == RULE_FRAME_POINTER && rule.flags & RULE_FLAG_UNSUPPORTED != 0)
                    .then_some(()),
            )
            .ok_or_else(|| "CFA expression".into());
    }
    let (register, cfa_offset) = row
        .cfa
        .split_once('+')
        .map(|(r, o)| (r, o.parse::<i32>().unwrap()))
        .ok_or_else(|| format!("unparsed CFA {}", row.cfa))?;
    let expected_kind = if register == sp {
        RULE_CFA_SP
    } else if register == fp {
        RULE_CFA_FP
    } else {
        // A CFA in another register (DRAP): frame-pointer fallback, counted.
        return (rule.kind == RULE_FRAME_POINTER && rule.flags & RULE_FLAG_UNSUPPORTED != 0)
            .then_some(())
            .ok_or_else(|| format!("CFA in {register}"));
    };
    if rule.kind != expected_kind || rule.cfa_offset != cfa_offset {
        return Err(format!("CFA {}", row.cfa));
    }
    let ra = match row.ra.as_deref() {
        Some("u") | None if arm64 => 0, // still in x30
        Some(text) => offset(text).ok_or_else(|| format!("unparsed ra {text}"))? as i32,
        None => return Err("no return address rule".into()),
    };
    if rule.ra_offset != ra {
        return Err(format!("return address {:?}", row.ra));
    }
    let fp_offset = match row.fp.as_deref() {
        None | Some("u") | Some("s") => 0,
        Some(text) => match offset(text) {
            Some(o) => o as i32,
            // Saved in a register or by an expression: not restored.
            None => return Ok(()),
        },
    };
    if rule.fp_offset != fp_offset {
        return Err(format!("frame pointer {:?}", row.fp));
    }
    Ok(())
}

fn compile_c(compiler: &str, flags: &[&str], out: &Path) {
    let source = workspace_root().join("tests/fixtures/c/nofp.c");
    let output = Command::new(compiler)
        .arg("-o")
        .arg(out)
        .arg(&source)
        .args(flags)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler} (`cargo xtask setup --tests`): {e}"));
    assert!(
        output.status.success(),
        "{compiler} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn x86_64_cfi_rows_equal_readelfs_interpretation() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("nofp");
    compile_c("cc", &["-O2", "-fomit-frame-pointer"], &fixture);
    let mut objects = vec![fixture];
    for library in [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "/usr/bin/python3.11",
    ] {
        objects.push(PathBuf::from(library));
    }
    for object in &objects {
        let rows = compare_with_readelf(object, false);
        println!("{}: {rows} rows equal readelf's", object.display());
        assert!(rows >= 10, "{}: only {rows} rows", object.display());
    }
}

#[test]
fn arm64_cfi_rows_equal_readelfs_interpretation() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("nofp-arm64");
    compile_c("aarch64-linux-gnu-gcc", &["-O2"], &fixture);
    let objects = [
        fixture,
        PathBuf::from("/usr/aarch64-linux-gnu/lib/libc.so.6"),
    ];
    for object in &objects {
        let rows = compare_with_readelf(object, true);
        println!("{}: {rows} rows equal readelf's", object.display());
        assert!(rows >= 10, "{}: only {rows} rows", object.display());
    }
    // Leaves keep the return address in x30; _start is the root.
    let table = table_of(&objects[0]);
    let symbol = |name: &str| -> u64 {
        let nm = run_tool("aarch64-linux-gnu-nm", &[objects[0].to_str().unwrap()]);
        nm.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .map(|l| u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap())
            .unwrap_or_else(|| panic!("{name} not in the fixture"))
    };
    let crunch = table.rule_at(symbol("crunch")).unwrap();
    assert_eq!(
        (crunch.kind, crunch.cfa_offset, crunch.ra_offset),
        (RULE_CFA_SP, 0, 0),
        "a leaf's return address is in x30"
    );
    assert_eq!(table.rule_at(symbol("_start")).unwrap().kind, RULE_ROOT);
    // A function that calls saved x29/x30 after its first instruction.
    let level4 = symbol("level4");
    let saved = (1..8)
        .filter_map(|i| table.rule_at(level4 + 4 * i))
        .find(|r| r.ra_offset != 0)
        .expect("level4 saves its return address");
    assert!(saved.ra_offset < 0 && saved.fp_offset < 0, "{saved:?}");
    // The PLT has no CFI on arm64; its stubs leave the caller in x30 (a
    // signal can interrupt one: the walk then continues from x30).
    let headers = run_tool(
        "aarch64-linux-gnu-objdump",
        &["-h", objects[0].to_str().unwrap()],
    );
    let plt = headers
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(1) == Some(&".plt"))
        .and_then(|f| u64::from_str_radix(f.get(3)?, 16).ok())
        .expect("the fixture has a .plt");
    assert!(
        !readelf_rows(&objects[0], "x29")
            .iter()
            .any(|(start, end, _)| (*start..*end).contains(&plt)),
        "an FDE covers .plt: this check is moot"
    );
    // The header entry, and the first stub's first and last instruction.
    for at in [plt, plt + 0x20, plt + 0x2c] {
        let rule = table.rule_at(at).unwrap();
        assert_eq!(
            (rule.kind, rule.cfa_offset, rule.ra_offset, rule.fp_offset),
            (RULE_CFA_SP, 0, 0, 0),
            "{at:#x} in .plt: CFA = SP, return address in x30"
        );
    }
}

/// Go on arm64: LR is stored at 0(SP) as the frame is allocated, the
/// caller's FP at -8(SP) (cmd/internal/obj/arm64/obj7.go); our rows must
/// say CFA = SP + frame size there, with the frame size read from the
/// prologue instructions `go tool objdump` prints.
#[test]
fn go_arm64_rows_follow_the_prologues() {
    let go = go_toolchain("1.27.3");
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("go-arm64");
    go_command(
        &go,
        &workspace_root().join("tests/fixtures/go"),
        &["build", "-o", binary.to_str().unwrap(), "."],
        &[("GOARCH", "arm64"), ("CGO_ENABLED", "0")],
    );
    let table = table_of(&binary);
    let listing = go_objdump(&go, &binary, Some("^main\\."));
    // TEXT main.f(SB) file
    //   file:line  0x10a000  eb3063ff  CMP R16, RSP   (stack check first)
    //   file:line  0x10a008  f81b0ffe  MOVD.W R30, -80(RSP)
    let mut checked = 0;
    for GoInstruction {
        address,
        text: instruction,
        ..
    } in &listing
    {
        let address = *address;
        if let Some(size) = instruction
            .strip_prefix("MOVD.W R30, -")
            .and_then(|r| r.strip_suffix("(RSP)"))
            .and_then(|n| n.parse::<i32>().ok())
        {
            // The rule from the next instruction on.
            let rule = table.rule_at(address + 4).unwrap();
            assert_eq!(
                (rule.kind, rule.cfa_offset, rule.ra_offset, rule.fp_offset),
                (RULE_CFA_SP, size, -size, -size - 8),
                "{instruction} at {address:#x}"
            );
            // And before it, the return address is still in LR.
            let entry = table.rule_at(address).unwrap();
            assert_eq!((entry.cfa_offset, entry.ra_offset), (0, 0), "{address:#x}");
            checked += 1;
        }
    }
    assert!(
        checked >= 3,
        "only {checked} Go prologues checked in {} instructions of main.*: {listing:#?}",
        listing.len()
    );
    assert_eq!(
        table
            .rule_at(symbol_of(&go, &binary, "runtime.goexit.abi0"))
            .unwrap()
            .kind,
        RULE_ROOT
    );
}

fn symbol_of(go: &Path, binary: &Path, name: &str) -> u64 {
    let nm = String::from_utf8(go_command(
        go,
        binary.parent().unwrap(),
        &["tool", "nm", binary.to_str().unwrap()],
        &[],
    ))
    .unwrap();
    nm.lines()
        .find(|l| l.ends_with(&format!(" {name}")))
        .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
        .unwrap_or_else(|| panic!("{name} not in {}", binary.display()))
}

//! Hand-built tables in every layout (the formats no installed toolchain
//! produces: Go 1.2–1.15 and 1.16–1.17, and the newer ones too), inline
//! expansion, the unwinder API, and a corruption loop.

use super::table::{Table, TableFormat};
use super::*;

const TEXT: u64 = 0x40_1000;
const TABLE_ADDRESS: u64 = 0x50_0000;
const TREE_ADDRESS: u64 = 0x90_0000;

/// Go's pc-value encoding of `(value, length in bytes)` runs (quantum 1).
fn pcvalue_table(runs: &[(i32, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut previous = -1i32;
    let varint = |out: &mut Vec<u8>, mut v: u32| loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    };
    for &(value, len) in runs {
        let delta = value.wrapping_sub(previous);
        varint(&mut out, ((delta << 1) ^ (delta >> 31)) as u32);
        varint(&mut out, len);
        previous = value;
    }
    out.push(0);
    out
}

/// Two functions: `main.outer` [TEXT, TEXT+0x40) with `main.mid` inlined
/// into it and `main.inner` inlined into `main.mid`, and `main.leaf`
/// [TEXT+0x40, TEXT+0x60), an assembly TOPFRAME function.
struct Built {
    table: Vec<u8>,
    tree: Vec<u8>,
}

fn build(format: TableFormat) -> Built {
    let relative = format >= TableFormat::Go118;
    let mut names = Vec::new();
    let mut name = |n: &str| {
        let off = names.len() as i32;
        names.extend(n.as_bytes());
        names.push(0);
        off
    };
    let outer = name("main.outer");
    let leaf = name("main.leaf");
    let mid = name("main.mid");
    let inner = name("pkg.Inner[go.shape.int]");

    let mut pctab = vec![0u8]; // offset 0 means "no table"
    let mut add = |runs: &[(i32, u32)]| {
        let off = pctab.len() as u32;
        pctab.extend(pcvalue_table(runs));
        off
    };
    let outer_sp = add(&[(0, 4), (16, 0x38), (0, 8)]);
    let outer_file = add(&[(1, 0x40)]);
    let outer_line = add(&[(10, 0x10), (11, 0x10), (12, 0x10), (13, 0x10)]);
    let outer_inl = add(&[(-1, 0x10), (0, 0x10), (1, 0x10), (-1, 0x10)]);
    let leaf_sp = add(&[(0, 0x20)]);
    let leaf_file = add(&[(1, 0x20)]);
    let leaf_line = add(&[(50, 0x20)]);

    // Inline tree: [0] main.mid called at outer+0x30, [1] pkg.Inner
    // called (from mid) at outer+0x18.
    let mut tree: Vec<u8> = Vec::new();
    for (name_off, parent_pc) in [(mid, 0x30i32), (inner, 0x18)] {
        if format == TableFormat::Go120 {
            tree.extend([0u8; 4]);
            tree.extend(name_off.to_le_bytes());
            tree.extend(parent_pc.to_le_bytes());
            tree.extend(7i32.to_le_bytes());
        } else {
            tree.extend(0i16.to_le_bytes());
            tree.extend([0u8, 0]);
            tree.extend(0i32.to_le_bytes());
            tree.extend(0i32.to_le_bytes());
            tree.extend(name_off.to_le_bytes());
            tree.extend(parent_pc.to_le_bytes());
        }
    }

    let header_len = match format {
        TableFormat::Go12 => 16,
        TableFormat::Go116 => 8 + 7 * 8,
        _ => 8 + 8 * 8,
    };
    let magic: u32 = match format {
        TableFormat::Go12 => 0xffff_fffb,
        TableFormat::Go116 => 0xffff_fffa,
        TableFormat::Go118 => 0xffff_fff0,
        TableFormat::Go120 => 0xffff_fff1,
    };
    let mut out = Vec::new();
    out.extend(magic.to_le_bytes());
    out.extend([0, 0, 1, 8]);
    out.resize(header_len, 0);
    let word =
        |out: &mut Vec<u8>, at: usize, v: u64| out[at..at + 8].copy_from_slice(&v.to_le_bytes());

    // Sub-tables (for Go 1.2 everything counts from the table's start).
    let names_at = out.len();
    out.extend(&names);
    let cutab_at = out.len();
    if format == TableFormat::Go12 {
        // File table (debug/gosym go12): entry i at 4*i, entry 0 being
        // the count; entry 1 = offset of "main.go" (patched below).
        out.extend(2u32.to_le_bytes());
        out.extend(0u32.to_le_bytes());
    } else {
        out.extend(u32::MAX.to_le_bytes());
        out.extend(0u32.to_le_bytes());
    }
    let filetab_at = out.len();
    out.extend(b"main.go\0");
    while out.len() % 8 != 0 {
        out.push(0);
    }
    let pctab_at = out.len();
    out.extend(&pctab);
    while out.len() % 8 != 0 {
        out.push(0);
    }
    let functab_at = if format == TableFormat::Go12 {
        16
    } else {
        out.len()
    };
    // Go 1.2: the function table sits right after the header, so move
    // everything written so far behind it.
    let (names_at, pctab_at, mut out) = if format == TableFormat::Go12 {
        let shift = 2 * 16 + 8 + 8; // 2 entries, end word, filetab u32 + pad
        let mut moved = out[..16].to_vec();
        moved.resize(16 + shift, 0);
        let body = &out[16..];
        moved.extend(body);
        // Fix the file entry offset inside the moved file table.
        let ft = cutab_at + shift;
        let name_off = (filetab_at + shift) as u32;
        moved[ft + 4..ft + 8].copy_from_slice(&name_off.to_le_bytes());
        moved[16 + 2 * 16 + 8..16 + 2 * 16 + 12].copy_from_slice(&(ft as u32).to_le_bytes());
        (names_at + shift, pctab_at + shift, moved)
    } else {
        (names_at, pctab_at, out)
    };
    let entry_size = if relative { 8 } else { 16 };
    let records_at = if format == TableFormat::Go12 {
        out.len()
    } else {
        let at = out.len() + 2 * entry_size + 8;
        out.resize(at, 0);
        at
    };
    let func_base = if format == TableFormat::Go12 {
        0
    } else {
        functab_at
    };
    let name_base = if format == TableFormat::Go12 {
        names_at as i32
    } else {
        0
    };
    let pc_base = if format == TableFormat::Go12 {
        (pctab_at) as u32
    } else {
        0
    };

    // Records.
    let mut funcoffs = Vec::new();
    let functions = [
        (
            0u64,
            outer,
            outer_sp,
            outer_file,
            outer_line,
            Some(outer_inl),
            0u8,
            0u8,
        ),
        (0x40, leaf, leaf_sp, leaf_file, leaf_line, None, 21, 1 | 4),
    ];
    for &(entry, name_off, sp, file, line, inl, func_id, flag) in &functions {
        while out.len() % 8 != 0 {
            out.push(0);
        }
        funcoffs.push((out.len() - func_base) as u64);
        if relative {
            out.extend((entry as u32).to_le_bytes());
        } else {
            out.extend((TEXT + entry).to_le_bytes());
        }
        let npcdata = if inl.is_some() { 3u32 } else { 0 };
        let nfuncdata = if inl.is_some() { 4u8 } else { 0 };
        for v in [name_off + name_base, 0, 0] {
            out.extend(v.to_le_bytes());
        }
        for v in [sp, file, line] {
            out.extend((v + pc_base).to_le_bytes());
        }
        out.extend(npcdata.to_le_bytes());
        if format >= TableFormat::Go116 {
            out.extend(0u32.to_le_bytes()); // cuOffset
        }
        if format == TableFormat::Go120 {
            out.extend(1i32.to_le_bytes()); // startLine
        }
        let flag = if format == TableFormat::Go12 { 0 } else { flag };
        out.extend([func_id, flag, 0, nfuncdata]);
        if let Some(inl) = inl {
            for v in [0, 0, inl + pc_base] {
                out.extend(v.to_le_bytes());
            }
            if relative {
                for v in [u32::MAX, u32::MAX, u32::MAX, 0] {
                    out.extend(v.to_le_bytes());
                }
            } else {
                while !(TABLE_ADDRESS as usize + out.len()).is_multiple_of(8) {
                    out.push(0);
                }
                for v in [0u64, 0, 0, TREE_ADDRESS] {
                    out.extend(v.to_le_bytes());
                }
            }
        }
    }
    // Function table.
    for (i, &(entry, ..)) in functions.iter().enumerate() {
        let at = functab_at + i * entry_size;
        if relative {
            out[at..at + 4].copy_from_slice(&(entry as u32).to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&(funcoffs[i] as u32).to_le_bytes());
        } else {
            word(&mut out, at, TEXT + entry);
            word(&mut out, at + 8, funcoffs[i]);
        }
    }
    let end_at = functab_at + 2 * entry_size;
    if relative {
        out[end_at..end_at + 4].copy_from_slice(&0x60u32.to_le_bytes());
    } else {
        word(&mut out, end_at, TEXT + 0x60);
    }
    // Header words.
    word(&mut out, 8, 2);
    match format {
        TableFormat::Go12 => {}
        TableFormat::Go116 => {
            for (i, v) in [1, names_at, cutab_at, filetab_at, pctab_at, functab_at]
                .into_iter()
                .enumerate()
            {
                word(&mut out, 16 + 8 * i, v as u64);
            }
        }
        _ => {
            let values = [
                1,
                TEXT as usize,
                names_at,
                cutab_at,
                filetab_at,
                pctab_at,
                functab_at,
            ];
            for (i, v) in values.into_iter().enumerate() {
                word(&mut out, 16 + 8 * i, v as u64);
            }
        }
    }
    let _ = records_at;
    if format == TableFormat::Go12 {
        // Go 1.2–1.15 name offsets count from the table's start.
        for record in tree.chunks_mut(20) {
            let off = i32::from_le_bytes(record[12..16].try_into().unwrap()) + name_base;
            record[12..16].copy_from_slice(&off.to_le_bytes());
        }
    }
    Built { table: out, tree }
}

fn symbols(format: TableFormat) -> GoSymbols {
    let built = build(format);
    let mut table =
        Table::parse(built.table.into(), TABLE_ADDRESS).expect("hand-built table parses");
    if format >= TableFormat::Go118 {
        table.gofunc = Some(TREE_ADDRESS);
    }
    table.set_extra(TREE_ADDRESS, built.tree.into());
    GoSymbols {
        table,
        source: PclntabSource::Section,
        version: None,
        build_id: None,
    }
}

fn chain(symbols: &GoSymbols, pc: u64) -> Vec<(String, u32, bool)> {
    symbols
        .frames(pc)
        .unwrap_or_default()
        .into_iter()
        .map(|f| {
            assert_eq!(f.file.as_deref(), Some("main.go"));
            (f.function, f.line.unwrap(), f.inlined)
        })
        .collect()
}

const FORMATS: [TableFormat; 4] = [
    TableFormat::Go12,
    TableFormat::Go116,
    TableFormat::Go118,
    TableFormat::Go120,
];

#[test]
fn every_layout_names_functions_files_and_lines() {
    for format in FORMATS {
        let s = symbols(format);
        assert_eq!(s.format(), format);
        assert_eq!(
            chain(&s, TEXT),
            [("main.outer".into(), 10, false)],
            "{format:?}"
        );
        assert_eq!(chain(&s, TEXT + 0x3f), [("main.outer".into(), 13, false)]);
        assert_eq!(chain(&s, TEXT + 0x45), [("main.leaf".into(), 50, false)]);
        assert!(s.frames(TEXT - 1).is_none() && s.frames(TEXT + 0x60).is_none());
    }
}

#[test]
fn inline_chains_innermost_first() {
    for format in FORMATS {
        let s = symbols(format);
        assert_eq!(
            chain(&s, TEXT + 0x14),
            [
                ("main.mid".into(), 11, true),
                ("main.outer".into(), 13, false)
            ],
            "{format:?}"
        );
        assert_eq!(
            chain(&s, TEXT + 0x24),
            [
                ("pkg.Inner[...]".into(), 12, true),
                ("main.mid".into(), 11, true),
                ("main.outer".into(), 13, false)
            ],
            "{format:?}"
        );
        let frames = s.frames(TEXT + 0x24).unwrap();
        assert_eq!(
            frames[0].system_name.as_deref(),
            Some("pkg.Inner[go.shape.int]")
        );
    }
}

#[test]
fn unwinder_api_functions_flags_and_pcsp() {
    for format in FORMATS {
        let s = symbols(format);
        let functions: Vec<_> = s.functions().collect();
        assert_eq!(functions.len(), 2);
        let (outer, leaf) = (functions[0], functions[1]);
        assert_eq!(
            (outer.entry(), outer.end(), outer.name().as_ref()),
            (TEXT, TEXT + 0x40, "main.outer")
        );
        assert_eq!((leaf.entry(), leaf.end()), (TEXT + 0x40, TEXT + 0x60));
        assert_eq!(leaf.func_id(), 21);
        if format == TableFormat::Go12 {
            assert_eq!(leaf.flag(), FuncFlag(0), "no flag byte before 1.17");
        } else {
            assert!(leaf.flag().is_topframe() && leaf.flag().is_asm() && !leaf.flag().is_spwrite());
        }
        assert_eq!(
            outer.pcsp_runs().collect::<Vec<_>>(),
            [
                SpRun {
                    pc_start: TEXT,
                    pc_end: TEXT + 4,
                    sp_delta: 0
                },
                SpRun {
                    pc_start: TEXT + 4,
                    pc_end: TEXT + 0x3c,
                    sp_delta: 16
                },
                SpRun {
                    pc_start: TEXT + 0x3c,
                    pc_end: TEXT + 0x44,
                    sp_delta: 0
                },
            ]
        );
        assert_eq!(s.pcsp(TEXT + 3), Some(0));
        assert_eq!(s.pcsp(TEXT + 4), Some(16));
        assert_eq!(s.pcsp(TEXT + 0x3b), Some(16));
        assert_eq!(s.pcsp(TEXT + 0x50), Some(0));
        assert_eq!(s.pcsp(TEXT + 0x60), None);
        assert_eq!(s.function(TEXT + 0x41).unwrap().name(), "main.leaf");
    }
}

/// The same tables read in place in a memory-mapped file answer as the
/// copied ones, and cost no heap.
#[test]
fn tables_read_in_place_answer_the_same() {
    for format in FORMATS {
        let copied = symbols(format);
        assert_eq!(
            copied.heap_bytes(),
            build(format).table.len() + build(format).tree.len()
        );
        let built = build(format);
        // Misaligned on purpose: the table need not start the file.
        let mut contents = vec![0xaa; 13];
        contents.extend(&built.table);
        contents.extend(&built.tree);
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &contents).unwrap();
        // SAFETY: a private temporary file nothing else writes.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
        let backing = Backing::Mapped(&map);
        let tree_at = 13 + built.table.len();
        let mut table = Table::parse(backing.share(&map[13..tree_at]), TABLE_ADDRESS)
            .expect("hand-built table parses");
        if format >= TableFormat::Go118 {
            table.gofunc = Some(TREE_ADDRESS);
        }
        table.set_extra(TREE_ADDRESS, backing.share(&map[tree_at..]));
        let s = GoSymbols {
            table,
            source: PclntabSource::Section,
            version: None,
            build_id: None,
        };
        assert_eq!(s.heap_bytes(), 0, "{format:?}");
        for pc in TEXT - 1..=TEXT + 0x60 {
            assert_eq!(chain(&s, pc), chain(&copied, pc), "{format:?} {pc:#x}");
            assert_eq!(s.pcsp(pc), copied.pcsp(pc));
        }
        // Bytes from elsewhere are copied.
        let elsewhere = Backing::Mapped(&map).share(&built.table);
        assert_eq!(&*elsewhere, &built.table[..]);
        let table = Table::parse(elsewhere, TABLE_ADDRESS).unwrap();
        assert_eq!(table.heap_bytes(), built.table.len());
    }
}

#[test]
fn bad_headers_are_errors() {
    let good = build(TableFormat::Go120).table;
    let mut wrong_magic = good.clone();
    wrong_magic[0] = 0xf5;
    assert!(matches!(
        Table::parse(wrong_magic.into(), 1),
        Err(GoError::UnknownMagic { .. })
    ));
    let mut out_of_bounds = good.clone();
    out_of_bounds[8 + 8 * 7..8 + 8 * 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let error = Table::parse(out_of_bounds.into(), 0x1234)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("0x1234") && error.contains("out of bounds"),
        "{error}"
    );
    assert!(Table::parse(good[..40].to_vec().into(), 0).is_err());
    assert!(matches!(
        GoSymbols::parse(b"\x7fELF garbage"),
        Err(GoError::Elf(_))
    ));
}

#[test]
fn name_for_print_elides_type_arguments() {
    assert_eq!(name_for_print("main.F"), "main.F");
    assert_eq!(
        name_for_print("p.G[go.shape.int,go.shape.string].m"),
        "p.G[...].m"
    );
    assert_eq!(name_for_print("weird[name"), "weird[name");
}

/// Truncations and byte flips across every layout, deterministically:
/// parsing and every query must return errors or `None`, never panic.
#[test]
fn corrupted_tables_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for format in FORMATS {
        let built = build(format);
        for round in 0..3000 {
            let mut table = built.table.clone();
            let mut tree = built.tree.clone();
            if round % 10 == 0 {
                table.truncate(next() as usize % table.len());
            }
            for _ in 0..1 + next() % 4 {
                let r = next();
                if r % 5 == 0 && !tree.is_empty() {
                    let i = (r >> 8) as usize % tree.len();
                    tree[i] ^= (r >> 32) as u8 | 1;
                } else if !table.is_empty() {
                    let i = (r >> 8) as usize % table.len();
                    table[i] ^= (r >> 32) as u8 | 1;
                }
            }
            let Ok(mut table) = Table::parse(table.into(), TABLE_ADDRESS) else {
                continue;
            };
            table.gofunc = Some(TREE_ADDRESS);
            table.set_extra(TREE_ADDRESS, tree.into());
            let s = GoSymbols {
                table,
                source: PclntabSource::Scan,
                version: None,
                build_id: None,
            };
            for pc in (TEXT - 2..TEXT + 0x62).step_by(3) {
                let _ = s.frames(pc);
                let _ = s.pcsp(pc);
            }
            for f in s.functions().take(16) {
                let _ = (f.name(), f.flag(), f.pcsp_runs().take(1000).count());
            }
        }
    }
    // Whole ELF files that are not Go, truncated and flipped.
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    for len in [0, 16, 64, 4096, exe.len() / 3] {
        assert!(GoSymbols::parse(&exe[..len]).is_err());
    }
}

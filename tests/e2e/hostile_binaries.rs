//! Hostile binaries through every parser they reach in the agent — the
//! symbolizer's ELF reader, the unwind-table builder (with the runtimes'
//! rows) and the USDT note reader together (each crate tests its own
//! parser alone as well).

use std::path::Path;

use profiler_symbolize::{ElfError, ElfObject};

/// Inputs the fuzz targets (fuzz/, `cargo xtask fuzz`) found crashing,
/// replayed exactly as the target ran them.
#[test]
fn fuzz_regressions_elf_object() {
    let inputs: [&[u8]; 1] = [include_bytes!("../testdata/fuzz/elf_object-crash-140b8fa9")];
    for data in inputs {
        if let Ok(object) = ElfObject::parse(data) {
            for address in [0, 0x1000, 0x401000, u64::MAX / 2, u64::MAX] {
                let _ = object.resolve(address);
                let _ = object.offset_to_address(address);
            }
            let _ = profiler_unwind::build::build_bytes(data, profiler_runtimes::unwind_rows());
        }
    }
}

/// Mutated binaries (their section headers, symbol tables, DWARF, USDT
/// notes; truncated) through every parser a hostile file reaches:
/// answers or clean errors, never a panic. Nothing here catches one:
/// the guarded parsers would report `Panicked`, which fails the test.
#[test]
fn mutated_binaries_give_answers_or_clean_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let build = |name: &str, sources: &[&str], flags: &[&str]| {
        let out = dir.path().join(name);
        let status = std::process::Command::new("cc")
            .args(flags)
            .arg("-o")
            .arg(&out)
            .args(sources.iter().map(|s| fixtures.join(s)))
            .status()
            .expect("cc (cargo xtask setup --tests)");
        assert!(status.success());
        std::fs::read(out).unwrap()
    };
    let originals = [
        build("inlined", &["c/inlined.c"], &["-O2", "-g"]),
        build(
            "usdt",
            &["usdt/probes.c", "usdt/semaphores.c"],
            &["-O2", "-g"],
        ),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut answers, mut errors) = (0, 0);
    for round in 0..400 {
        let original = &originals[round % originals.len()];
        let mut bytes = original.clone();
        // Aim at the ELF header and section headers, or anywhere.
        let span = if round % 3 == 0 {
            bytes.len().min(4096)
        } else {
            bytes.len()
        };
        for _ in 0..(1 + next() % 16) {
            let at = (next() as usize) % span;
            bytes[at] ^= (next() >> 24) as u8 | 1;
        }
        if round % 7 == 0 {
            bytes.truncate((next() as usize) % bytes.len());
        }
        match ElfObject::parse(&bytes) {
            Ok(object) => {
                answers += 1;
                for address in [0x1000, 0x1150, 0x11a0, 0x4000, u64::MAX] {
                    let _ = object.resolve(address);
                    let _ = object.offset_to_address(address);
                }
            }
            Err(ElfError::Panicked) => panic!("the ELF parser panicked on round {round}"),
            Err(_) => errors += 1,
        }
        let _ = profiler_probes::usdt::probes_from_elf(&bytes, Path::new("mutated"));
        assert!(
            !matches!(
                profiler_unwind::build::build_bytes(&bytes, profiler_runtimes::unwind_rows()),
                Err(profiler_unwind::build::NoTable::Panicked)
            ),
            "the unwind-table builder panicked on round {round}"
        );
    }
    // Both kinds of outcome happened: the mutations reached the parsers.
    assert!(
        answers > 50 && errors > 10,
        "{answers} answers, {errors} errors"
    );
}

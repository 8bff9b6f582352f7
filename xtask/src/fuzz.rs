//! `cargo xtask fuzz [--seconds N] [TARGET...]`: runs every fuzz target in
//! fuzz/ for a bounded time with cargo-fuzz (libFuzzer, nightly), seeded
//! with real inputs. Like a benchmark, it is not part of `cargo xtask test`;
//! crashing inputs land in fuzz/artifacts/TARGET/ and become regression
//! tests beside the parser they broke.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

use super::shell::{output, run};
use super::workspace_root;

const TARGETS: &[&str] = &[
    "elf_object",
    "go_pclntab",
    "python_frames",
    "go_runtime_state",
    "jvm_structures",
    "usdt_notes",
    "text_parsers",
    "cfi_rows",
    "http_request",
    "auth_header",
];

pub fn fuzz(args: &[String]) -> anyhow::Result<()> {
    let mut seconds = 60u64;
    let mut targets: Vec<&str> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = rest
                    .next()
                    .and_then(|s| s.parse().ok())
                    .context("--seconds takes a whole number")?;
            }
            name if TARGETS.contains(&name) => {
                targets.push(TARGETS[TARGETS.iter().position(|t| *t == name).unwrap()])
            }
            other => bail!("unknown fuzz argument {other:?}; targets are {TARGETS:?}"),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    ensure_cargo_fuzz()?;
    let fuzz_dir = workspace_root().join("fuzz");
    seed_corpus(&fuzz_dir)?;
    let mut crashed = Vec::new();
    for target in targets {
        let status = Command::new("cargo")
            .args(["+nightly", "fuzz", "run", target])
            .arg(fuzz_dir.join("corpus").join(target))
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-max_len=131072",
                "-rss_limit_mb=4096",
                "-print_final_stats=1",
            ])
            .current_dir(workspace_root())
            .status()
            .with_context(|| format!("running cargo fuzz run {target}"))?;
        if !status.success() {
            crashed.push(target);
        }
    }
    if !crashed.is_empty() {
        bail!("fuzz targets found crashes: {crashed:?} (inputs in fuzz/artifacts/)");
    }
    eprintln!("xtask: every fuzz target ran {seconds} s without a crash");
    Ok(())
}

fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    if output(Command::new("cargo").args(["+nightly", "fuzz", "--version"])).is_some() {
        return Ok(());
    }
    run(Command::new("cargo").args(["+nightly", "install", "cargo-fuzz", "--locked"]))
        .context("installing cargo-fuzz from the crate registry")
}

/// Seeds each target's corpus with real inputs: the agent binary and a C
/// fixture (ELF, DWARF), the `.gopclntab` of a Go binary, a USDT fixture,
/// and this machine's /proc text.
fn seed_corpus(fuzz_dir: &Path) -> anyhow::Result<()> {
    let corpus = fuzz_dir.join("corpus");
    let root = workspace_root();
    let dir = |target: &str| -> anyhow::Result<std::path::PathBuf> {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    };
    let scratch = root.join("target/fuzz-seeds");
    std::fs::create_dir_all(&scratch)?;
    // Every target has a corpus directory, seeded or not.
    for target in TARGETS {
        dir(target)?;
    }
    // Runtime memory: a word that picks addresses, then bytes as they lie
    // in a process (a Go heap bucket of 1.21: header, two PCs, four
    // cycles; a JVM line table escaped and packed; a small CPython
    // frame window).
    let mut bucket: Vec<u8> = 0u64.to_le_bytes().to_vec();
    for word in [0u64, 0, 1, 0, 64, 2, 0x401001, 0x402002, 3, 1, 192, 64] {
        bucket.extend_from_slice(&word.to_le_bytes());
    }
    bucket.resize(bucket.len() + 96, 0);
    std::fs::write(dir("go_runtime_state")?.join("bucket"), &bucket)?;
    let mut lines = 7u64.to_le_bytes().to_vec();
    lines.extend_from_slice(&7u64.to_le_bytes());
    lines.extend_from_slice(&[0xff, 0, 60, 17, 57, 65, 0xff, 12, 3, 52, 0]);
    std::fs::write(dir("jvm_structures")?.join("line-table"), &lines)?;
    std::fs::write(dir("python_frames")?.join("zeros"), [0u8; 128])?;

    // Small ELF files: a C fixture with and without debug info.
    let c = scratch.join("hot");
    run(Command::new("cc")
        .args(["-O2", "-g", "-o"])
        .arg(&c)
        .arg(root.join("tests/fixtures/c/inlined.c")))?;
    std::fs::copy(&c, dir("elf_object")?.join("inlined-debug"))?;
    std::fs::copy(&c, dir("usdt_notes")?.join("no-notes"))?;

    // Call-frame information: the fixture's .eh_frame, and the start of
    // libc's (libFuzzer's -max_len keeps inputs small).
    for (name, object) in [
        ("fixture-eh_frame", c.clone()),
        (
            "libc-eh_frame",
            "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
        ),
    ] {
        let out = scratch.join(name);
        let copied = Command::new("objcopy")
            .args(["-O", "binary", "--only-section=.eh_frame"])
            .arg(&object)
            .arg(&out)
            .status()
            .is_ok_and(|s| s.success());
        if copied {
            let bytes = std::fs::read(&out)?;
            std::fs::write(
                dir("cfi_rows")?.join(name),
                &bytes[..bytes.len().min(16_384)],
            )?;
        }
    }

    // A USDT fixture, if the headers are installed (cargo xtask setup --tests).
    let usdt = scratch.join("usdt");
    if Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&usdt)
        .arg(root.join("tests/fixtures/usdt/probes.c"))
        .arg(root.join("tests/fixtures/usdt/semaphores.c"))
        .status()
        .is_ok_and(|s| s.success())
    {
        std::fs::copy(&usdt, dir("usdt_notes")?.join("probes"))?;
    }

    // The .gopclntab of a small Go program (Debian's Go 1.19).
    let go_bin = scratch.join("go-unwind");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&go_bin)
        .arg(".")
        .current_dir(root.join("tests/fixtures/go-unwind"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .status()
        .is_ok_and(|s| s.success());
    if built {
        let table = scratch.join("gopclntab");
        run(Command::new("objcopy")
            .args(["-O", "binary", "--only-section=.gopclntab"])
            .arg(&go_bin)
            .arg(&table))?;
        let bytes = std::fs::read(&table)?;
        // libFuzzer's -max_len: keep the header and the first functions.
        let cut = bytes.len().min(131_072);
        std::fs::write(dir("go_pclntab")?.join("go1.19"), &bytes[..cut])?;
    }

    let http = dir("http_request")?;
    for (name, request) in [
        (
            "pull",
            "GET /debug/pprof/profile?seconds=1&pid=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        (
            "body",
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        ),
        (
            "chunked",
            "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
    ] {
        std::fs::write(http.join(name), request)?;
    }
    let auth = dir("auth_header")?;
    std::fs::write(auth.join("basic"), "Basic c2NyYXBlcjpzM2NyZXQ=")?;
    std::fs::write(auth.join("bearer"), "Bearer abc.def.ghi")?;
    std::fs::write(
        auth.join("web-config"),
        "tls_server_config:\n  cert_file: a\n  key_file: b\nbasic_auth_users:\n  u: $2y$04$x\n",
    )?;

    let text = dir("text_parsers")?;
    for (name, source) in [("maps", "/proc/self/maps"), ("kallsyms", "/proc/kallsyms")] {
        if let Ok(content) = std::fs::read_to_string(source) {
            let cut: String = content.lines().take(200).collect::<Vec<_>>().join("\n");
            std::fs::write(text.join(name), cut)?;
        }
    }
    for (name, spec) in [
        ("arg-reg", "-4@%edi"),
        ("arg-mem", "-4@(%rcx,%rax,4)"),
        ("arg-rip", "-4@40+Sym(%rip)"),
        ("arg-arm", "8@[sp, 16]"),
        ("spec", "usdt:/usr/bin/python3.11:python:gc__start"),
    ] {
        std::fs::write(text.join(name), spec)?;
    }
    Ok(())
}

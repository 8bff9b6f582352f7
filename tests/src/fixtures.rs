//! Fixture programs built from source (C, USDT, the latency fixture).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::agent::{target_dir, workspace_root};
use crate::go::{go_command, go_toolchain};

/// Compiles `tests/fixtures/c/NAME.c` with `flags` (cached per run) and
/// returns the binary's path.
pub fn build_c_fixture(name: &str, flags: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{name} {}", flags.join(" "));
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{}", built.len()));
    let source = workspace_root()
        .join("tests/fixtures/c")
        .join(format!("{name}.c"));
    let output = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&source)
        .output()
        .expect("running cc (install gcc: `cargo xtask setup`)");
    assert!(
        output.status.success(),
        "cc {} failed: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(key, out.clone());
    out
}

/// The flags C fixtures are built with: debug info and frame pointers in
/// every function (at -O0 GCC keeps them even in leaf functions).
pub const C_FRAME_POINTER_FLAGS: &[&str] = &["-O0", "-g", "-fno-omit-frame-pointer"];

/// Target architectures the USDT fixture is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureArch {
    Native,
    /// Cross-built with aarch64-linux-gnu-gcc: read, never run.
    Arm64,
}

/// Builds the USDT fixture (`tests/fixtures/usdt/*.c`, sys/sdt.h probes
/// with and without semaphores) at optimization `opt` (`-O0`, `-O2`).
pub fn build_usdt_fixture(opt: &str, arch: FixtureArch) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{opt} {arch:?}");
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("usdt{opt}-{arch:?}").to_lowercase());
    let sources = workspace_root().join("tests/fixtures/usdt");
    let header = Path::new("/usr/include/x86_64-linux-gnu/sys/sdt.h");
    assert!(
        header.exists(),
        "{} is missing: install systemtap-sdt-dev with `cargo xtask setup --tests`",
        header.display()
    );
    let mut command = match arch {
        FixtureArch::Native => Command::new("cc"),
        FixtureArch::Arm64 => {
            // sys/sdt.h is architecture-neutral, but Debian installs it
            // under the x86_64 multiarch directory only: give the cross
            // compiler just those two headers.
            let include = dir.join("sdt-include");
            std::fs::create_dir_all(include.join("sys")).unwrap();
            for name in ["sdt.h", "sdt-config.h"] {
                std::fs::copy(header.with_file_name(name), include.join("sys").join(name))
                    .unwrap_or_else(|e| panic!("copying sys/{name}: {e}"));
            }
            let mut command = Command::new("aarch64-linux-gnu-gcc");
            command.arg("-isystem").arg(include);
            command
        }
    };
    let output = command
        .args([opt, "-g", "-o"])
        .arg(&out)
        .arg(sources.join("probes.c"))
        .arg(sources.join("semaphores.c"))
        .output()
        .expect("running the C compiler (install it: `cargo xtask setup --tests`)");
    assert!(
        output.status.success(),
        "building the USDT fixture {key} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(key, out.clone());
    out
}

/// Builds the latency fixture (`tests/fixtures/usdt/latency.c` and
/// `latency_sem.c`: `demo:op__start/op__done` around sleeps of 1, 4 and
/// 16 ms, and the same probes with semaphores as `demo_sem`) at `opt`.
pub fn build_latency_fixture(opt: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(opt) {
        return path.clone();
    }
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("latency{opt}"));
    let sources = workspace_root().join("tests/fixtures/usdt");
    let output = Command::new("cc")
        .args([opt, "-g", "-o"])
        .arg(&out)
        .arg(sources.join("latency.c"))
        .arg(sources.join("latency_sem.c"))
        .output()
        .expect("running cc (install it: `cargo xtask setup --tests`)");
    assert!(
        output.status.success(),
        "building the latency fixture {opt} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(opt.to_string(), out.clone());
    out
}

/// Builds `tests/fixtures/go_latency` with Debian's Go 1.19; returns the
/// binary.
pub fn build_go_latency_fixture() -> PathBuf {
    let go = go_toolchain("1.19");
    let dir = target_dir()
        .join("fixtures")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("go-latency");
    go_command(
        &go,
        &workspace_root().join("tests/fixtures/go_latency"),
        &["build", "-o", out.to_str().unwrap(), "."],
        &[],
    );
    out
}

/// The hot fixture copied under `name` (the executable name is the
/// service name).
pub fn hot_named(dir: &Path, name: &str) -> PathBuf {
    let hot = build_c_fixture("hot", C_FRAME_POINTER_FLAGS);
    let path = dir.join(name);
    std::fs::copy(&hot, &path).unwrap();
    path
}

//! The arm64 lane: the real agent on a real arm64 kernel, in
//! `qemu-system-aarch64` (TCG: no KVM needed) with Debian's arm64 kernel
//! and a root made on the fly: an initramfs holding Debian's
//! `busybox-static:arm64`, the arm64 glibc the cross-built agent links
//! against, the cross-built agent and fixtures, and a script. No image comes
//! from outside; nothing inside needs a network. `cargo xtask setup
//! --tests` downloads and unpacks the packages (`arm64_assets`).
//!
//! Everything is built on the host; only the agent and the fixtures run in
//! the guest (TCG is 10-50x slower). The guest prints each scenario's
//! output between markers on its serial console, files base64-encoded; the
//! host parses them back and asserts on them.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::agent::workspace_root;

/// Where setup unpacks the arm64 kernel and packages.
pub fn arm64_cache() -> PathBuf {
    crate::go::go_toolchain_root().join("arm64")
}

/// The unpacked guest pieces: the kernel image and a root holding
/// busybox and the arm64 libraries.
pub struct Assets {
    pub kernel: PathBuf,
    pub root: PathBuf,
}

/// The assets setup prepared; fails the test, naming the setup command,
/// when they are missing.
pub fn arm64_assets() -> Assets {
    let cache = arm64_cache();
    let complete = cache.join(".complete");
    assert!(
        complete.exists(),
        "the arm64 guest (Debian's arm64 kernel, busybox-static:arm64, libc6:arm64) is not \
         unpacked under {}: run `cargo xtask setup --tests`",
        cache.display()
    );
    let kernel = std::fs::read_dir(cache.join("kernel/boot"))
        .expect("kernel/boot of the arm64 kernel package")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .expect("a vmlinuz in the arm64 kernel package");
    for tool in ["qemu-system-aarch64", "cpio"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success()),
            "{tool} is missing: run `cargo xtask setup --tests`"
        );
    }
    Assets {
        kernel,
        root: cache.join("root"),
    }
}

/// The cross-built agent (release, for aarch64): `PROFILER_AGENT_ARM64_BIN`,
/// else the workspace's `target/aarch64-unknown-linux-gnu/release/`.
pub fn arm64_agent() -> PathBuf {
    let path = std::env::var_os("PROFILER_AGENT_ARM64_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace_root().join("target/aarch64-unknown-linux-gnu/release/profiler-agent")
        });
    assert!(
        path.exists(),
        "no arm64 agent at {}: `cargo xtask test` cross-builds it first (or run `cargo build \
         --release -p profiler-agent --target aarch64-unknown-linux-gnu`)",
        path.display()
    );
    path
}

/// What one guest run executes: files to copy in, and a shell script.
#[derive(Default)]
pub struct Guest {
    /// (path in the guest, file on the host); executables keep their mode.
    pub files: Vec<(String, PathBuf)>,
    /// Run by busybox `sh` after the mounts; `scenario NAME` and friends
    /// (see `PRELUDE`) frame its output.
    pub script: String,
    /// The kernel's command line; None: the lane's quiet one
    /// (`LANE_KERNEL_ARGS`). An investigation wants the kernel's own
    /// messages on the console (a higher `loglevel`).
    pub kernel_args: Option<String>,
}

/// The lane's kernel command line: only emergencies on the console, so
/// the scenarios' framed output is all there is to parse. A panic (the
/// guest panics on a soft lockup) replays the whole kernel log first
/// (`panic_print` bit 5), with every CPU's backtrace when a soft lockup
/// caused it: the console then says where each CPU was, which
/// `loglevel=1` alone keeps to the one `BUG: soft lockup` line.
pub const LANE_KERNEL_ARGS: &str =
    "console=ttyAMA0 panic=-1 quiet loglevel=1 softlockup_all_cpu_backtrace=1 panic_print=0x20";

/// Shell helpers the guest script uses. `begin NAME` / `end NAME STATUS`
/// frame a scenario's output; `file PATH` sends a file base64-encoded.
const PRELUDE: &str = r#"
begin() { echo "=== BEGIN $1"; }
end() { echo "=== END $1 $2"; }
file() { echo "=== FILE $1"; base64 "$1"; echo "=== ENDFILE"; }
"#;

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /dev
mount -t devtmpfs dev /dev 2>/dev/null
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs tmp /tmp
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
ulimit -l unlimited
# A CPU stuck in the kernel panics the guest (and qemu exits: -no-reboot)
# instead of leaving the run to its timeout.
echo 1 > /proc/sys/kernel/softlockup_panic
echo "=== GUEST $(uname -m) $(uname -r)"
sh /guest.sh 2>&1
echo "=== POWEROFF"
poweroff -f
"#;

/// One framed scenario of the guest's output.
#[derive(Debug, Clone, Default)]
pub struct Scenario {
    /// Everything it printed (the files' base64 left out).
    pub log: String,
    /// Its exit status as the script reported it.
    pub status: Option<i32>,
    /// Files it sent, by guest path.
    pub files: HashMap<String, Vec<u8>>,
}

/// The guest's run: scenarios by name, the whole console, and how long
/// it took.
#[derive(Debug, Clone)]
pub struct GuestRun {
    pub scenarios: HashMap<String, Scenario>,
    pub console: String,
    pub elapsed: Duration,
}

impl GuestRun {
    /// The scenario `name`; fails the test with the console's end when it
    /// did not run.
    pub fn scenario(&self, name: &str) -> &Scenario {
        self.scenarios.get(name).unwrap_or_else(|| {
            panic!(
                "scenario {name} did not run in the arm64 guest; console:\n{}",
                tail(&self.console, 60)
            )
        })
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Copies the directory `from` into `to`, symlinks resolved into files.
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let into = to.join(path.file_name().unwrap_or_default());
        if path.is_dir() {
            copy_tree(&path, &into)?;
        } else if let Ok(real) = std::fs::canonicalize(&path) {
            std::fs::copy(&real, &into)
                .map_err(|e| format!("copying {} into the guest: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Packs an initramfs with busybox, the arm64 libraries and `guest`, boots
/// it, and collects the framed output. Err with the console's last lines
/// when the guest does not boot or does not finish within `timeout`.
pub fn run_guest(guest: &Guest, timeout: Duration) -> Result<GuestRun, String> {
    let assets = arm64_assets();
    let kept = kept_dir();
    let _ = std::fs::write(kept.join("guest.sh"), &guest.script);
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let tree = work.path().join("root");
    build_tree(&assets, guest, &tree)?;
    let initramfs = work.path().join("initramfs.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc --quiet > '{}'",
            tree.display(),
            initramfs.display()
        ))
        .status()
        .map_err(|e| format!("running cpio: {e}"))?;
    if !status.success() {
        return Err(format!("packing the initramfs failed ({status})"));
    }
    let started = Instant::now();
    let mut child = Command::new("qemu-system-aarch64")
        .args([
            "-M",
            "virt",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "2048",
            "-nographic",
            "-no-reboot",
            "-monitor",
            "none",
            "-serial",
            "stdio",
            // No network card: the guest needs none, and the default
            // virtio one wants a boot ROM (ipxe-qemu) that a fresh
            // machine without qemu's recommended packages lacks.
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(&assets.kernel)
        .arg("-initrd")
        .arg(&initramfs)
        .arg("-append")
        .arg(guest.kernel_args.as_deref().unwrap_or(LANE_KERNEL_ARGS))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting qemu-system-aarch64: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = String::from_utf8_lossy(&reader.join().unwrap_or_default()).replace("\r\n", "\n");
    let elapsed = started.elapsed();
    let _ = std::fs::write(kept.join("console.log"), &console);
    if status.is_none() {
        return Err(format!(
            "the arm64 guest did not finish within {timeout:?}; console:\n{}",
            tail(&console, 60)
        ));
    }
    if !console.contains("=== POWEROFF") {
        return Err(format!(
            "the arm64 guest stopped before its script ended ({status:?}); console:\n{}",
            tail(&console, 60)
        ));
    }
    let run = GuestRun {
        scenarios: parse(&console),
        console,
        elapsed,
    };
    keep(&kept, &run);
    Ok(run)
}

/// The whole console of the last boot (`run_guest` writes it, whether
/// the boot succeeded or not).
pub fn kept_console() -> PathBuf {
    workspace_root().join("target/arm64-guest/console.log")
}

/// `target/arm64-guest/`, emptied: where a run leaves its script, its
/// console and the files the guest sent back, so that a failure can be
/// looked into afterwards (`go tool pprof` on the profiles). Best effort:
/// the tests do not read them.
fn kept_dir() -> PathBuf {
    let dir = workspace_root().join("target/arm64-guest");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// The scenarios' logs and files under `dir`, one folder per scenario
/// (guest paths flattened).
fn keep(dir: &Path, run: &GuestRun) {
    for (name, scenario) in &run.scenarios {
        let folder = dir.join(name);
        if std::fs::create_dir_all(&folder).is_err() {
            continue;
        }
        let _ = std::fs::write(folder.join("log"), &scenario.log);
        for (path, bytes) in &scenario.files {
            let _ = std::fs::write(
                folder.join(path.trim_start_matches('/').replace('/', "_")),
                bytes,
            );
        }
    }
}

fn build_tree(assets: &Assets, guest: &Guest, tree: &Path) -> Result<(), String> {
    let copy = |from: &Path, to: &Path| -> Result<(), String> {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(|e| format!("copying {} into the guest: {e}", from.display()))
    };
    for dir in ["bin", "proc", "sys", "tmp", "dev", "lib"] {
        std::fs::create_dir_all(tree.join(dir)).map_err(|e| e.to_string())?;
    }
    copy(&assets.root.join("bin/busybox"), &tree.join("bin/busybox"))?;
    // The arm64 glibc (and libgcc_s, libstdc++), with the loader's symlink.
    let libs = assets.root.join("lib/aarch64-linux-gnu");
    for entry in std::fs::read_dir(&libs).map_err(|e| format!("{}: {e}", libs.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let to = tree.join("lib/aarch64-linux-gnu").join(&name);
        let path = entry.path();
        if path.is_dir() {
            continue;
        }
        // Resolve symlinks into plain copies (cpio keeps them, but one
        // level of indirection is simpler to reason about).
        copy(
            &std::fs::canonicalize(&path).map_err(|e| e.to_string())?,
            &to,
        )?;
    }
    // Debian's arm64 python3.11 and its minimal standard library, for
    // the Python scenario.
    let python = assets.root.join("usr/bin/python3.11");
    if python.exists() {
        copy(&python, &tree.join("usr/bin/python3.11"))?;
        copy_tree(
            &assets.root.join("usr/lib/python3.11"),
            &tree.join("usr/lib/python3.11"),
        )?;
    }
    std::os::unix::fs::symlink(
        "aarch64-linux-gnu/ld-linux-aarch64.so.1",
        tree.join("lib/ld-linux-aarch64.so.1"),
    )
    .map_err(|e| e.to_string())?;
    for (inside, from) in &guest.files {
        copy(from, &tree.join(inside.trim_start_matches('/')))?;
    }
    std::fs::write(tree.join("init"), INIT).map_err(|e| e.to_string())?;
    std::fs::write(
        tree.join("guest.sh"),
        format!("{PRELUDE}\n{}", guest.script),
    )
    .map_err(|e| e.to_string())?;
    let status = Command::new("chmod")
        .args(["-R", "a+rx"])
        .arg(tree)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("chmod of the guest tree failed".into());
    }
    Ok(())
}

/// Splits the console into scenarios.
fn parse(console: &str) -> HashMap<String, Scenario> {
    use base64::Engine as _;
    let mut scenarios = HashMap::new();
    let mut current: Option<(String, Scenario)> = None;
    let mut file: Option<(String, String)> = None;
    for line in console.lines() {
        if let Some((path, body)) = file.as_mut() {
            if line == "=== ENDFILE" {
                if let Some((_, scenario)) = current.as_mut() {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(body.as_bytes())
                        .unwrap_or_default();
                    scenario.files.insert(path.clone(), bytes);
                }
                file = None;
            } else {
                body.push_str(line.trim());
            }
            continue;
        }
        if let Some(name) = line.strip_prefix("=== BEGIN ") {
            current = Some((name.trim().to_string(), Scenario::default()));
        } else if let Some(rest) = line.strip_prefix("=== END ") {
            let mut words = rest.split_whitespace();
            let name = words.next().unwrap_or_default();
            if let Some((current_name, mut scenario)) = current.take() {
                scenario.status = words.next().and_then(|s| s.parse().ok());
                if current_name == name {
                    scenarios.insert(current_name, scenario);
                }
            }
        } else if let Some(path) = line.strip_prefix("=== FILE ") {
            file = Some((path.trim().to_string(), String::new()));
        } else if let Some((_, scenario)) = current.as_mut() {
            scenario.log.push_str(line);
            scenario.log.push('\n');
        }
    }
    scenarios
}

#[cfg(test)]
mod tests {
    #[test]
    fn console_output_splits_into_scenarios_and_files() {
        let console = "boot noise\n=== BEGIN a\nhello\n=== FILE /tmp/x\naGk=\n=== ENDFILE\n\
                       === END a 0\n=== BEGIN b\nbye\n=== END b 3\n";
        let scenarios = super::parse(console);
        assert_eq!(scenarios["a"].log, "hello\n");
        assert_eq!(scenarios["a"].files["/tmp/x"], b"hi");
        assert_eq!(scenarios["a"].status, Some(0));
        assert_eq!(scenarios["b"].status, Some(3));
    }
}

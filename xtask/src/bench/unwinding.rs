//! Unwind tables: how big and how long to build for real objects, and what
//! the agent costs with many distinct native binaries (each its own table).
//! The per-sample BPF cost of walking with tables is measured in the
//! overhead runs (the no-frame-pointer workload, the agent with and
//! without tables, bpftrace, in one run).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use super::process::Managed;
use super::profilers::start_agent;
use super::{Env, Plan};

/// One object's table, as `profiler-agent tables --format json` reports it.
#[derive(Debug, Clone)]
pub struct TableRow {
    pub path: String,
    pub file_bytes: u64,
    pub source: String,
    pub rows: u64,
    pub bytes: u64,
    pub build_ms: f64,
}

/// The agent system-wide with many distinct native processes running.
#[derive(Debug, Clone, Default)]
pub struct ManyProcesses {
    pub processes: usize,
    pub seconds: f64,
    pub peak_rss_bytes: u64,
    pub cpu_seconds: f64,
    /// The agent's own report lines about unwinding and user stacks.
    pub report: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Unwinding {
    pub tables: Vec<TableRow>,
    pub many: Option<ManyProcesses>,
}

/// Objects whose tables are measured: Debian's libc, libstdc++ and
/// python3.11, and the largest ELF file under /usr.
fn objects() -> Vec<PathBuf> {
    let mut objects: Vec<PathBuf> = [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/bin/python3.11",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect();
    if let Some(largest) = largest_elf(&["/usr/bin", "/usr/lib", "/usr/libexec", "/usr/local/bin"])
    {
        objects.push(largest);
    }
    objects
}

/// The largest ELF file below `roots` (two directory levels deep).
fn largest_elf(roots: &[&str]) -> Option<PathBuf> {
    let mut best: Option<(u64, PathBuf)> = None;
    let mut consider = |path: PathBuf| {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            return;
        };
        if !meta.is_file() || best.as_ref().is_some_and(|(size, _)| *size >= meta.len()) {
            return;
        }
        let mut magic = [0u8; 4];
        let is_elf = std::fs::File::open(&path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && magic == *b"\x7fELF";
        if is_elf {
            best = Some((meta.len(), path));
        }
    };
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                for inner in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    consider(inner.path());
                }
            } else {
                consider(path);
            }
        }
    }
    best.map(|(_, path)| path)
}

pub fn run(env: &Env, plan: &Plan) -> (Unwinding, Vec<String>) {
    let mut result = Unwinding::default();
    let mut errors = Vec::new();
    match tables(env) {
        Ok(rows) => result.tables = rows,
        Err(e) => errors.push(format!("unwind tables: {e:#}")),
    }
    match many_processes(env, plan) {
        Ok(many) => result.many = Some(many),
        Err(e) => errors.push(format!("many distinct processes: {e:#}")),
    }
    (result, errors)
}

fn tables(env: &Env) -> anyhow::Result<Vec<TableRow>> {
    let objects = objects();
    eprintln!("bench: unwind tables of {} objects", objects.len());
    let output = Command::new(&env.agent)
        .args(["tables", "--format", "json"])
        .args(&objects)
        .output()
        .context("running profiler-agent tables")?;
    if !output.status.success() {
        bail!(
            "profiler-agent tables failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let parsed: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let rows = parsed
        .as_array()
        .context("tables JSON is not an array")?
        .iter()
        .map(|t| {
            let path = t["path"].as_str().unwrap_or_default().to_string();
            TableRow {
                file_bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
                path,
                source: t["source"].as_str().unwrap_or_default().to_string(),
                rows: t["rows"].as_u64().unwrap_or(0),
                bytes: t["bytes"].as_u64().unwrap_or(0),
                build_ms: t["build_ms"].as_f64().unwrap_or(0.0),
            }
        })
        .collect();
    Ok(rows)
}

/// Copies of `burst-nofp` with distinct GNU build ids (so no two share a
/// table), each waking every 100 ms: the agent system-wide builds and
/// loads one table per binary.
fn many_processes(env: &Env, plan: &Plan) -> anyhow::Result<ManyProcesses> {
    let count = plan.idle_processes;
    let seconds = if plan.quick { 3.0 } else { 15.0 };
    eprintln!("bench: the agent with {count} distinct native processes");
    let dir = env.out.join("distinct");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let original = std::fs::read(env.bins.join("burst-nofp"))?;
    let build_id = build_id(&env.bins.join("burst-nofp"))?;
    let at = find(&original, &build_id).context("the build id is not in the file")?;
    let mut processes = Vec::with_capacity(count);
    for i in 0..count {
        let mut bytes = original.clone();
        let n = build_id.len();
        bytes[at + n - 2..at + n].copy_from_slice(&(i as u16).to_le_bytes());
        let path = dir.join(format!("burst-{i}"));
        write_executable(&path, &bytes)?;
        processes.push(Managed::spawn(
            Command::new(&path).args([format!("{}", seconds + 10.0), "200".into()]),
            "burst",
        )?);
    }
    std::thread::sleep(Duration::from_millis(500));
    let log = env.out.join("agent-distinct.log");
    let output = env.out.join("agent-distinct.pb.gz");
    let running = start_agent(env, plan.hz, &output, &log, None, &[])?;
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let stopped = running.stop()?;
    drop(processes);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let report = text
        .lines()
        .filter(|l| {
            ["user stacks:", "unwinding:", "objects without"]
                .iter()
                .any(|k| l.contains(k))
        })
        .map(|l| l.trim().to_string())
        .collect();
    Ok(ManyProcesses {
        processes: count,
        seconds,
        peak_rss_bytes: stopped.peak_rss_bytes,
        cpu_seconds: stopped.cpu_seconds,
        report,
    })
}

fn build_id(path: &Path) -> anyhow::Result<Vec<u8>> {
    let notes = crate::shell::output(Command::new("readelf").arg("-n").arg(path))
        .context("readelf -n (binutils)")?;
    let hex = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .context("no GNU build id")?;
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).context("build id hex"))
        .collect()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn write_executable(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

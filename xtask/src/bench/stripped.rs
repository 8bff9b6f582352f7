//! Names for stripped code: the cost of naming addresses in Debian's
//! stripped shared objects (their ELF symbols, the check for a debug file
//! and MiniDebugInfo, and the FDE index that groups unnamed functions),
//! and of fetching and reading a 100 MiB debug file from a local
//! debuginfod server, each against elfutils doing the same job on the same
//! files in the same run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Env, Plan};

/// Bytes the served debug file is padded to (an incompressible section
/// added to the xtask binary's own debug file).
const DEBUG_FILE_BYTES: u64 = 100 << 20;
const TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Default)]
pub struct Stripped {
    pub index: Option<IndexRow>,
    pub fetch: Option<FetchRow>,
    pub errors: Vec<String>,
}

/// One address in each of `objects` stripped objects, one process each.
#[derive(Debug, Clone)]
pub struct IndexRow {
    pub objects: usize,
    pub bytes: u64,
    /// Of the agent's answers: named by a symbol table, grouped by an FDE.
    pub named: usize,
    pub grouped: usize,
    pub agent: Run,
    pub elfutils: Run,
}

/// The debug file of a stripped binary fetched from the server (a fresh
/// cache each time) and `addresses` named with it.
#[derive(Debug, Clone)]
pub struct FetchRow {
    pub bytes: u64,
    pub addresses: usize,
    pub agent: Run,
    /// `debuginfod-find debuginfo ID`, then `eu-addr2line` on the file.
    pub find: Run,
    pub addr2line: Run,
}

/// Wall seconds (summed over the invocations) and the largest peak RSS.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    pub seconds: f64,
    pub peak_kib: u64,
}

impl Run {
    fn add(&mut self, other: Run) {
        self.seconds += other.seconds;
        self.peak_kib = self.peak_kib.max(other.peak_kib);
    }
}

pub fn run(env: &Env, plan: &Plan) -> Stripped {
    let mut result = Stripped::default();
    eprintln!("bench: stripped objects");
    match index(env, plan) {
        Ok(row) => result.index = Some(row),
        Err(e) => result.errors.push(format!("stripped objects: {e:#}")),
    }
    eprintln!("bench: debuginfod fetch");
    match fetch(env, plan) {
        Ok(row) => result.fetch = Some(row),
        Err(e) => result.errors.push(format!("debuginfod fetch: {e:#}")),
    }
    result
}

/// Runs `command` under GNU time for its peak RSS; fails on a non-zero
/// exit. Returns the run and stdout.
fn measured(command: &mut Command, what: &str) -> anyhow::Result<(Run, String)> {
    let report = tempfile_path(what);
    let mut timed = Command::new("/usr/bin/time");
    timed
        .args(["-f", "%M", "-o"])
        .arg(&report)
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => timed.env(key, value),
            None => timed.env_remove(key),
        };
    }
    let started = Instant::now();
    let child = timed
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what} under /usr/bin/time (apt install time)"))?;
    let output = child.wait_with_output()?;
    let seconds = started.elapsed().as_secs_f64();
    if seconds > TIMEOUT.as_secs_f64() {
        bail!("{what} took {seconds:.0} s");
    }
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let peak_kib = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| t.lines().last()?.trim().parse().ok())
        .unwrap_or(0);
    let _ = std::fs::remove_file(&report);
    Ok((
        Run { seconds, peak_kib },
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

fn tempfile_path(what: &str) -> PathBuf {
    let name: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    std::env::temp_dir().join(format!("bench-time-{}-{name}", std::process::id()))
}

fn tool(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Stripped shared objects of the system (no `.symtab`), each with an
/// address in the middle of its `.text`.
fn stripped_objects(count: usize) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir("/usr/lib/x86_64-linux-gnu")
        .context("reading /usr/lib/x86_64-linux-gnu")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(".so"))
                && p.is_file()
                && !p.is_symlink()
        })
        .collect();
    paths.sort();
    let mut found = Vec::new();
    for path in paths {
        if found.len() == count {
            break;
        }
        let Ok(sections) = tool("readelf", &["-S", "-W", path.to_str().unwrap_or("")]) else {
            continue;
        };
        if sections.contains(" .symtab") || sections.contains(" .debug_info") {
            continue;
        }
        let text = sections.lines().find_map(|l| {
            let l = l.split_once(']')?.1;
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&".text")).then(|| {
                let address = u64::from_str_radix(f.get(2)?, 16).ok()?;
                let size = u64::from_str_radix(f.get(4)?, 16).ok()?;
                Some(address + size / 2)
            })?
        });
        if let Some(address) = text {
            found.push((path, address));
        }
    }
    if found.len() < count {
        bail!(
            "only {} stripped objects with a .text under /usr/lib/x86_64-linux-gnu",
            found.len()
        );
    }
    Ok(found)
}

fn index(env: &Env, plan: &Plan) -> anyhow::Result<IndexRow> {
    let count = if plan.quick { 20 } else { 200 };
    let objects = stripped_objects(count)?;
    let mut row = IndexRow {
        objects: objects.len(),
        bytes: 0,
        named: 0,
        grouped: 0,
        agent: Run::default(),
        elfutils: Run::default(),
    };
    for (path, address) in &objects {
        row.bytes += std::fs::metadata(path).map_or(0, |m| m.len());
        let address = format!("{address:#x}");
        let (run, text) = measured(
            Command::new(&env.agent)
                .args(["symbolize", "--format", "json", "--binary"])
                .arg(path)
                .arg(&address)
                .env_remove("DEBUGINFOD_URLS"),
            "profiler-agent symbolize",
        )?;
        row.agent.add(run);
        if text.contains("\"cfi-grouped\"") {
            row.grouped += 1;
        } else if text.contains("\"symtab\"") || text.contains("\"dynsym\"") {
            row.named += 1;
        }
        let (run, _) = measured(
            Command::new("eu-addr2line")
                .args(["-f", "-e"])
                .arg(path)
                .arg(&address)
                .env_remove("DEBUGINFOD_URLS"),
            "eu-addr2line (apt install elfutils)",
        )?;
        row.elfutils.add(run);
    }
    Ok(row)
}

/// elfutils' server, killed when dropped.
struct Server {
    child: std::process::Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fetch(env: &Env, _plan: &Plan) -> anyhow::Result<FetchRow> {
    let dir = env.out.join("debuginfod");
    let _ = std::fs::remove_dir_all(&dir);
    let served = dir.join("served");
    std::fs::create_dir_all(&served)?;
    // This xtask binary is a build with DWARF; its debug file, padded with
    // an incompressible section to 100 MiB, is what the server sends.
    let full = dir.join("xtask-full");
    std::fs::copy(std::env::current_exe()?, &full).context("copying the xtask binary")?;
    let stripped = dir.join("xtask-stripped");
    let debug = served.join("xtask.debug");
    let p = |p: &Path| p.to_str().unwrap_or("").to_string();
    tool("objcopy", &["--only-keep-debug", &p(&full), &p(&debug)])?;
    tool("strip", &["--strip-all", "-o", &p(&stripped), &p(&full)])?;
    let size = std::fs::metadata(&debug)?.len();
    if size < DEBUG_FILE_BYTES {
        let padding = dir.join("padding");
        let mut bytes = vec![0u8; (DEBUG_FILE_BYTES - size) as usize];
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for chunk in bytes.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = chunk.len();
            chunk.copy_from_slice(&state.to_le_bytes()[..n]);
        }
        std::fs::write(&padding, bytes)?;
        tool(
            "objcopy",
            &[
                "--add-section",
                &format!(".bench_padding={}", p(&padding)),
                &p(&debug),
            ],
        )?;
    }
    let bytes = std::fs::metadata(&debug)?.len();
    let notes = tool("readelf", &["-n", &p(&stripped)])?;
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .context("the xtask binary has no GNU build id")?
        .trim()
        .to_string();

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let server = Server {
        child: Command::new("debuginfod")
            .args(["-F", &p(&served), "-p", &port.to_string(), "-d"])
            .arg(dir.join("db.sqlite"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting debuginfod (apt install debuginfod)")?,
        port,
    };
    let url = format!("http://127.0.0.1:{}", server.port);
    // Indexed once debuginfod-find gets the file.
    let probe_cache = dir.join("probe-cache");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let _ = std::fs::remove_dir_all(&probe_cache);
        let got = Command::new("debuginfod-find")
            .args(["debuginfo", &id])
            .env("DEBUGINFOD_URLS", &url)
            .env("DEBUGINFOD_CACHE_PATH", &probe_cache)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if got {
            break;
        }
        if Instant::now() >= deadline {
            bail!("debuginfod did not serve {id} within 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    let functions = super::codec::function_symbols(&full)?;
    let addresses: Vec<String> = super::codec::pick_addresses(&functions, 1000)
        .iter()
        .map(|a| format!("{a:#x}"))
        .collect();
    let agent_cache = dir.join("agent-cache");
    let (agent, text) = measured(
        Command::new(&env.agent)
            .args(["symbolize", "--format", "json", "--binary"])
            .arg(&stripped)
            .args(&addresses)
            .env("DEBUGINFOD_URLS", &url)
            .env("DEBUGINFOD_CACHE_PATH", &agent_cache),
        "profiler-agent symbolize (debuginfod)",
    )?;
    if !text.contains("\"debuginfod\"") {
        bail!("the agent named nothing from the fetched file");
    }
    let find_cache = dir.join("find-cache");
    let (find, path) = measured(
        Command::new("debuginfod-find")
            .args(["debuginfo", &id])
            .env("DEBUGINFOD_URLS", &url)
            .env("DEBUGINFOD_CACHE_PATH", &find_cache),
        "debuginfod-find",
    )?;
    let (addr2line, _) = measured(
        Command::new("eu-addr2line")
            .args(["-f", "-i", "-C", "-e", path.trim()])
            .args(&addresses),
        "eu-addr2line",
    )?;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(FetchRow {
        bytes,
        addresses: addresses.len(),
        agent,
        find,
        addr2line,
    })
}

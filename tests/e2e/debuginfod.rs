//! Debug files fetched by build id from debuginfod servers (elfutils'
//! `DEBUGINFOD_URLS` and friends). elfutils' own `debuginfod` serves the
//! debug file of a stripped fixture: `symbolize` names it as binutils'
//! addr2line names the unstripped binary (and says the names came from
//! debuginfod), a second run is answered by the cache (the server's log
//! shows no request), a profile is named, and the continuous agent names it
//! in the windows after the file arrived. Hostile or absent servers (down,
//! a black hole, a huge body, garbage, a file of another build id) cost a
//! profile those names only: it is written on time and the failure counted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::shares::{Share, share_near};
use profiler_tests::{agent::*, fixtures::*, http::*, processes::*, profiles::*};

#[derive(Clone)]
struct Fixture {
    _dir: std::sync::Arc<tempfile::TempDir>,
    full: PathBuf,
    stripped: PathBuf,
    debug: PathBuf,
    build_id: String,
    served: PathBuf,
    cache: PathBuf,
}

/// hot.c built with DWARF, split into a stripped binary and its debug file.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    std::fs::copy(build_c_fixture("hot", C_FRAME_POINTER_FLAGS), &full).unwrap();
    let debug = dir.path().join("hot.debug");
    let stripped = dir.path().join("hot");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    run_tool("objcopy", &["--only-keep-debug", &p(&full), &p(&debug)]);
    run_tool("strip", &["--strip-all", "-o", &p(&stripped), &p(&full)]);
    let build_id = build_id(&stripped);
    let served = dir.path().join("served");
    let cache = dir.path().join("cache");
    Fixture {
        full,
        stripped,
        debug,
        build_id,
        served,
        cache,
        _dir: std::sync::Arc::new(dir),
    }
}

/// The GNU build id of `binary`, as readelf prints it.
fn build_id(binary: &Path) -> String {
    let notes = run_tool("readelf", &["-n", binary.to_str().unwrap()]);
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{}: no GNU build id", binary.display()))
        .trim()
        .to_string()
}

/// Serves `file` as the debug file of `build_id`.
fn serve_as(fixture: &Fixture, file: &Path) {
    let dir = fixture.served.join("buildid").join(&fixture.build_id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(file, dir.join("debuginfo")).unwrap();
}

/// A server process on a loopback port, killed when dropped.
struct Server {
    child: std::process::Child,
    url: String,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn spawn(mut command: Command, port: u16) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e} (cargo xtask setup --tests)"));
        wait_for(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .expect("the server did not start listening");
        Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
            log,
            _dir: dir,
        }
    }

    /// elfutils' debuginfod over the ELF and debug files under `root`,
    /// once it has indexed `build_ids`.
    fn elfutils(root: &Path, build_ids: &[&str]) -> Server {
        std::fs::create_dir_all(root).unwrap();
        let port = free_port();
        let db = root.with_extension("sqlite");
        let mut command = Command::new("debuginfod");
        command
            .args(["-F", root.to_str().unwrap(), "-p", &port.to_string(), "-d"])
            .arg(&db)
            .arg("-v");
        let server = Server::spawn(command, port);
        for id in build_ids {
            let path = format!("/buildid/{id}/debuginfo");
            let indexed = wait_for(Duration::from_secs(30), || {
                http_get(port, &path, Duration::from_secs(5)).filter(|(status, _)| *status == 200)
            });
            assert!(
                indexed.is_some(),
                "debuginfod did not index {id}:\n{}",
                server.log()
            );
        }
        server
    }

    /// Python's http.server on a directory laid out as debuginfod's URLs.
    fn files(root: &Path) -> Server {
        std::fs::create_dir_all(root).unwrap();
        let port = free_port();
        let mut command = Command::new("python3");
        command
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(root);
        Server::spawn(command, port)
    }

    /// A server that misbehaves on every request (see `HOSTILE`).
    fn hostile(mode: &str, payload: &Path) -> Server {
        let port = free_port();
        let mut command = Command::new("python3");
        command
            .args(["-c", HOSTILE, mode, &port.to_string()])
            .arg(payload);
        Server::spawn(command, port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Requests for debug files in elfutils' log.
    fn buildid_requests(&self) -> usize {
        self.log().matches("GET /buildid/").count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Answers every request in one bad way: `hole` accepts and never
/// answers, `huge` sends an endless body without a length, `garbage` sends
/// 4 KiB of random bytes as the file, `slow` sends the payload file after
/// four seconds.
const HOSTILE: &str = r#"
import http.server, os, sys, time
mode, port, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if mode == "hole":
            time.sleep(3600)
            return
        if mode == "huge":
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(1 << 15):
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass
            return
        if mode == "slow":
            time.sleep(4)
            data = open(payload, "rb").read()
        else:
            data = os.urandom(4096)
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"#;

fn agent(args: &[&str], urls: &str, cache: &Path) -> Output {
    Command::new(agent_bin())
        .args(args)
        .env("DEBUGINFOD_URLS", urls)
        .env("DEBUGINFOD_CACHE_PATH", cache)
        // Long enough that a profile finishing on time shows it did not
        // wait for a server that does not answer.
        .env("DEBUGINFOD_TIMEOUT", "60")
        .env("DEBUGINFOD_MAXSIZE", (64 << 20).to_string())
        .stdin(Stdio::null())
        .output()
        .expect("running profiler-agent")
}

/// Starts and middles of the fixture's functions, from the full binary.
fn addresses(full: &Path) -> Vec<u64> {
    let text = run_tool("nm", &["-S", "--defined-only", full.to_str().unwrap()]);
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && ["hot_a", "hot_b", "work", "round_trip", "main"].contains(&f[3])).then(
                || {
                    let start = u64::from_str_radix(f[0], 16).unwrap();
                    let size = u64::from_str_radix(f[1], 16).unwrap();
                    [start, start + size / 2]
                },
            )
        })
        .flatten()
        .collect()
}

/// What our `symbolize` says of each address: (function, "file:line")
/// of its innermost frame, and where that name came from.
struct Named {
    frames: Vec<(String, String)>,
    sources: Vec<String>,
    stderr: String,
}

fn ours(binary: &Path, addresses: &[u64], urls: &str, cache: &Path) -> Named {
    let mut args = vec![
        "symbolize".to_string(),
        "--binary".into(),
        binary.display().to_string(),
        "--format".into(),
        "json".into(),
    ];
    args.extend(addresses.iter().map(|a| format!("{a:#x}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = agent(&args, urls, cache);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "symbolize failed: {stderr}");
    let innermost: Vec<SymbolizedFrame> =
        parse_symbolize_json(String::from_utf8_lossy(&output.stdout).trim())
            .into_iter()
            .map(|(_, frames)| frames.first().cloned().expect("a frame"))
            .collect();
    let frames = innermost
        .iter()
        .map(|f| {
            let file = f
                .file
                .as_deref()
                .and_then(|p| Path::new(p).file_name()?.to_str());
            let line = match (file, f.line) {
                (Some(file), Some(line)) => format!("{file}:{line}"),
                _ => "??:0".to_string(),
            };
            (f.function.clone(), line)
        })
        .collect();
    Named {
        frames,
        sources: innermost.into_iter().map(|f| f.source).collect(),
        stderr,
    }
}

/// (function, "file:line") per address from binutils' addr2line on the
/// unstripped binary.
fn addr2line(full: &Path, addresses: &[u64]) -> Vec<(String, String)> {
    let mut args = vec!["-f".to_string(), "-e".into(), full.display().to_string()];
    args.extend(addresses.iter().map(|a| format!("{a:#x}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = run_tool("addr2line", &args);
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|pair| {
            let location = pair[1].split(" (").next().unwrap_or("");
            let (file, line) = location.rsplit_once(':').unwrap_or(("??", "0"));
            let file = Path::new(file)
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or("??");
            (pair[0].to_string(), format!("{file}:{line}"))
        })
        .collect()
}

/// Copies the fixture's debug file where elfutils' server indexes it.
fn elfutils_tree(fixture: &Fixture) -> PathBuf {
    let root = fixture.served.join("elfutils");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(&fixture.debug, root.join("hot.debug")).unwrap();
    root
}

fn unnamed(frames: &[(String, String)]) -> bool {
    frames.iter().all(|(f, _)| f != "hot_a" && f != "main")
}

#[test]
fn a_stripped_binary_is_named_from_elfutils_debuginfod_then_from_the_cache() {
    let fixture = fixture();
    let points = addresses(&fixture.full);
    assert!(points.len() >= 10, "{points:?}");
    let truth = addr2line(&fixture.full, &points);

    // Without a server: nothing names the fixture's functions.
    let plain = ours(&fixture.stripped, &points, "", &fixture.cache);
    assert!(unnamed(&plain.frames), "{:?}", plain.frames);

    let server = Server::elfutils(&elfutils_tree(&fixture), &[&fixture.build_id]);
    // A server that does not have it comes first: the next one is asked.
    let empty = Server::elfutils(&fixture.served.join("empty"), &[]);
    let urls = format!("{} {}", empty.url, server.url);
    let before = server.buildid_requests();
    let named = ours(&fixture.stripped, &points, &urls, &fixture.cache);
    assert_eq!(
        named.frames, truth,
        "ours vs addr2line of the unstripped file\n{}",
        named.stderr
    );
    assert!(
        named.sources.iter().all(|s| s == "debuginfod"),
        "names not marked as from debuginfod: {:?}",
        named.sources
    );
    assert_eq!(server.buildid_requests(), before + 1, "{}", server.log());
    let cached = fixture.cache.join(&fixture.build_id).join("debuginfo");
    assert!(cached.is_file(), "nothing cached at {}", cached.display());

    // Again: the cache answers, the server is not asked.
    let again = ours(&fixture.stripped, &points, &urls, &fixture.cache);
    assert_eq!(again.frames, truth, "from the cache\n{}", again.stderr);
    assert_eq!(
        server.buildid_requests(),
        before + 1,
        "the second run asked the server:\n{}",
        server.log()
    );
    // Nor when the servers are gone.
    drop(server);
    drop(empty);
    let offline = ours(&fixture.stripped, &points, &urls, &fixture.cache);
    assert_eq!(offline.frames, truth, "servers gone\n{}", offline.stderr);
}

#[test]
fn a_debug_file_of_another_build_id_is_refused() {
    let fixture = fixture();
    // The server answers the fixture's build id with another binary's file.
    let other = build_c_fixture("syscalls", C_FRAME_POINTER_FLAGS);
    serve_as(&fixture, &other);
    let server = Server::files(&fixture.served);
    let points = addresses(&fixture.full);
    let named = ours(&fixture.stripped, &points, &server.url, &fixture.cache);
    assert!(
        unnamed(&named.frames),
        "named from a file of another build id: {:?}",
        named.frames
    );
    assert!(
        named.stderr.contains("build id"),
        "no warning: {}",
        named.stderr
    );
    assert!(
        !fixture
            .cache
            .join(&fixture.build_id)
            .join("debuginfo")
            .exists(),
        "the wrong file was cached"
    );
}

/// Profiles the stripped fixture for `duration` with `urls` as the
/// servers; returns (hot_a samples, hot_b samples, the report, how long it
/// took).
fn profile_stripped(
    fixture: &Fixture,
    urls: &str,
    duration: &str,
    extra: &[&str],
) -> (i64, i64, String, Duration) {
    let running = Running::start(&fixture.stripped, &["30"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.pb.gz");
    let pid = running.pid().to_string();
    let mut args = vec!["--pid", &pid, "-d", duration, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let output = agent(&args, urls, &fixture.cache);
    let took = started.elapsed();
    let report = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{report}");
    let stacks = stacks(&read_pprof(&out));
    let count = |f: &str| -> i64 { stacks.iter().filter(|s| s.has(f)).map(|s| s.count).sum() };
    (count("hot_a"), count("hot_b"), report, took)
}

#[test]
fn a_profile_of_a_stripped_binary_is_named_through_debuginfod() {
    require_bpf_privileges();
    let fixture = fixture();
    let server = Server::elfutils(&elfutils_tree(&fixture), &[&fixture.build_id]);
    // 4 s, about 400 samples: enough for the 2:1 split to be told from
    // 1:1 beyond chance.
    let (a, b, report, _) = profile_stripped(&fixture, &server.url, "4s", &[]);
    assert!(
        report.contains("debuginfod: 1 debug files fetched"),
        "{report}"
    );
    if let Err(why) = share_near("hot_a", Share::of(a, a + b), 2.0 / 3.0, 0.0, 0.12) {
        panic!("{why} (hot_a does twice hot_b's work)\n{report}");
    }
}

#[test]
fn hostile_or_absent_servers_cost_a_profile_only_their_names() {
    require_bpf_privileges();
    let fixture = fixture();
    // Port 1 (tcpmux): nothing listens there, and no test binds it (an
    // ephemeral port found free could be taken by a parallel test's server).
    let closed = "http://127.0.0.1:1".to_string();
    let hole = Server::hostile("hole", &fixture.debug);
    let huge = Server::hostile("huge", &fixture.debug);
    let garbage = Server::hostile("garbage", &fixture.debug);
    // Each request could take a minute (DEBUGINFOD_TIMEOUT=60 below): the
    // profile waits --debuginfod-wait for them, no longer.
    for (what, url, expected) in [
        ("down", closed.as_str(), "1 failed"),
        ("a black hole", hole.url.as_str(), "1 still downloading"),
        ("an endless body", huge.url.as_str(), "1 failed"),
        ("garbage", garbage.url.as_str(), "1 rejected"),
    ] {
        let cache = tempfile::tempdir().unwrap();
        let fixture = Fixture {
            cache: cache.path().to_path_buf(),
            ..fixture.clone()
        };
        let (a, b, report, took) =
            profile_stripped(&fixture, url, "2s", &["--debuginfod-wait", "3s"]);
        assert!(
            report.contains(expected),
            "server {what}: expected {expected:?} in the report:\n{report}"
        );
        assert_eq!((a, b), (0, 0), "server {what}: named anyway?\n{report}");
        assert!(
            took < Duration::from_secs(45),
            "server {what}: the profile waited for the server ({took:?}):\n{report}"
        );
        assert!(
            !cache
                .path()
                .join(&fixture.build_id)
                .join("debuginfo")
                .exists(),
            "server {what}: something was cached"
        );
    }
    let _ = (hole.port, huge.port, garbage.port);
}

#[test]
fn the_continuous_agent_names_a_stripped_binary_once_its_debug_file_arrives() {
    require_bpf_privileges();
    let fixture = fixture();
    // The file arrives four seconds after it is asked for: the first
    // windows are written without its names, later ones with them.
    let slow = Server::hostile("slow", &fixture.debug);
    let running = Running::start(&fixture.stripped, &["60"]);
    let out = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = running.pid().to_string();
    let mut agent = AgentRun::start(&[
        "--pids",
        &pid,
        "--listen",
        &listen,
        "--window",
        "1s",
        "--directory-path",
        out.path().to_str().unwrap(),
        "--debuginfod-urls",
        &slow.url,
        "--debuginfod-cache",
        fixture.cache.to_str().unwrap(),
    ]);
    agent.wait_ready(port);
    let named = |file: &Path| stacks(&read_pprof(file)).iter().any(|s| s.has("hot_a"));
    let found = wait_for(Duration::from_secs(30), || {
        let files = pprof_files(out.path());
        files.iter().any(|f| named(f)).then_some(files)
    });
    let files = found.unwrap_or_else(|| panic!("no window named hot_a:\n{}", agent.log()));
    assert!(
        !named(&files[0]),
        "the first window was named: it waited for the download\n{}",
        agent.log()
    );
    let (status, body) = http_get(port, "/metrics", Duration::from_secs(5)).expect("/metrics");
    assert_eq!(status, 200);
    let metrics = String::from_utf8(body).unwrap();
    assert!(
        metrics.contains("profiler_agent_debuginfod_lookups_total{result=\"fetched\"} 1"),
        "{metrics}"
    );
}

fn pprof_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = walk(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    // Named by window start: oldest first.
    files.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
    files
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A C++ or Rust fixture built with inlining and DWARF: the full binary,
/// its stripped copy and its debug file.
struct Compiled {
    full: PathBuf,
    stripped: PathBuf,
    debug: PathBuf,
}

fn compile(dir: &Path, name: &str, command: &mut Command) -> Compiled {
    let full = dir.join(format!("{name}-full"));
    let status = command
        .arg("-o")
        .arg(&full)
        .status()
        .unwrap_or_else(|e| panic!("compiling {name}: {e} (cargo xtask setup --tests)"));
    assert!(status.success(), "compiling {name} failed");
    let stripped = dir.join(name);
    let debug = dir.join(format!("{name}.debug"));
    let p = |p: &Path| p.to_str().unwrap().to_string();
    run_tool("objcopy", &["--only-keep-debug", &p(&full), &p(&debug)]);
    run_tool("strip", &["--strip-all", "-o", &p(&stripped), &p(&full)]);
    Compiled {
        full,
        stripped,
        debug,
    }
}

/// Every instruction address of the function whose symbol contains
/// `needle` (mangled: `8checkout`), from objdump of the full binary.
fn instructions_of(full: &Path, needle: &str) -> Vec<u64> {
    let symbols = run_tool("nm", &["-S", "--defined-only", full.to_str().unwrap()]);
    let (start, size) = symbols
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3].contains(needle)).then(|| {
                (
                    u64::from_str_radix(f[0], 16).unwrap(),
                    u64::from_str_radix(f[1], 16).unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("no symbol with {needle} in {}", full.display()));
    let listing = run_tool(
        "objdump",
        &[
            "-d",
            "--no-show-raw-insn",
            &format!("--start-address={start:#x}"),
            &format!("--stop-address={:#x}", start + size),
            full.to_str().unwrap(),
        ],
    );
    listing
        .lines()
        .filter_map(|l| {
            let (address, rest) = l.trim_start().split_once(":\t")?;
            (!rest.is_empty()).then(|| u64::from_str_radix(address, 16).ok())?
        })
        .collect()
}

/// A frame as "function file:line", the file by its base name and an
/// unknown line as 0 (as addr2line prints it).
fn frame_text(function: &str, file: Option<&str>, line: Option<u32>) -> String {
    let file = file
        .and_then(|p| Path::new(p).file_name()?.to_str())
        .unwrap_or("??");
    format!("{function} {file}:{}", line.unwrap_or(0))
}

/// Inline chains, innermost first, from `tool` (binutils' addr2line, or
/// llvm-symbolizer in its GNU output style) with `-f -i -C` on the
/// unstripped binary.
fn symbolizer_chains(tool: &str, full: &Path, addresses: &[u64]) -> Vec<Vec<String>> {
    addresses
        .iter()
        .map(|a| {
            let address = format!("{a:#x}");
            let mut args = vec!["-f", "-i", "-C", "-e", full.to_str().unwrap(), &address];
            if tool.contains("llvm") {
                args.insert(0, "--output-style=GNU");
            }
            let text = run_tool(tool, &args);
            let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
            lines
                .chunks(2)
                .map(|pair| {
                    let location = pair.get(1).copied().unwrap_or("??:0");
                    let location = location.split(" (").next().unwrap_or("");
                    let (file, line) = location.rsplit_once(':').unwrap_or(("??", "0"));
                    frame_text(pair[0], Some(file), line.parse().ok())
                })
                .collect()
        })
        .collect()
}

/// Inline chains from our `symbolize --format json` of the stripped file.
fn our_chains(binary: &Path, addresses: &[u64], urls: &str, cache: &Path) -> Vec<Vec<String>> {
    let mut args = vec![
        "symbolize".to_string(),
        "--binary".into(),
        binary.display().to_string(),
        "--format".into(),
        "json".into(),
    ];
    args.extend(addresses.iter().map(|a| format!("{a:#x}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = agent(&args, urls, cache);
    assert!(
        output.status.success(),
        "symbolize failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    parse_symbolize_json(String::from_utf8_lossy(&output.stdout).trim())
        .into_iter()
        .map(|(_, frames)| {
            assert!(
                frames.iter().all(|f| f.source == "debuginfod"),
                "{frames:?}\n{stderr}"
            );
            frames
                .iter()
                .map(|f| frame_text(&f.function, f.file.as_deref(), f.line))
                .collect()
        })
        .collect()
}

#[test]
fn cpp_and_rust_inline_chains_come_from_debuginfod_as_the_reference_tools_give_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = workspace_root().join("tests/fixtures");
    let cpp = compile(
        dir.path(),
        "inlined-cpp",
        Command::new("g++")
            .args(["-O2", "-g"])
            .arg(root.join("cpp/inlined.cpp")),
    );
    let rust = compile(
        dir.path(),
        "inlined-rust",
        Command::new("rustc")
            .args(["-O", "-g", "--edition", "2021"])
            .arg(root.join("rust/inlined.rs")),
    );
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    for compiled in [&cpp, &rust] {
        let name = compiled.debug.file_name().unwrap();
        std::fs::copy(&compiled.debug, served.join(name)).unwrap();
    }
    let ids = [build_id(&cpp.stripped), build_id(&rust.stripped)];
    let server = Server::elfutils(&served, &[&ids[0], &ids[1]]);
    let cache = dir.path().join("cache");
    // C++: llvm-symbolizer (binutils 2.40 names an inlined static
    // function without a linkage name after its caller; llvm-symbolizer and
    // eu-addr2line name it as we do). Rust: binutils' addr2line
    // (llvm-symbolizer 22 leaves Rust's legacy mangling half-decoded).
    type Oracle = fn(&Path, &[u64]) -> Vec<Vec<String>>;
    let cases: [(&Compiled, Oracle); 2] = [
        (&cpp, |full, a| {
            symbolizer_chains("/usr/lib/llvm-22/bin/llvm-symbolizer", full, a)
        }),
        (&rust, |full, a| symbolizer_chains("addr2line", full, a)),
    ];
    for (compiled, oracle) in cases {
        let needle = "8checkout";
        let addresses = instructions_of(&compiled.full, needle);
        assert!(addresses.len() >= 10, "{addresses:?}");
        let truth = oracle(&compiled.full, &addresses);
        assert!(
            truth.iter().any(|chain| chain.len() >= 2),
            "{}: no inline chain to compare: {truth:?}",
            compiled.full.display()
        );
        let ours = our_chains(&compiled.stripped, &addresses, &server.url, &cache);
        for ((address, ours), truth) in addresses.iter().zip(&ours).zip(&truth) {
            assert_eq!(
                ours,
                truth,
                "{} at {address:#x}: ours vs llvm-symbolizer -i of the unstripped file",
                compiled.full.display()
            );
        }
    }
}

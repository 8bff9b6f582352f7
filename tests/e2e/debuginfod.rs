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

use profiler_tests::*;

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
    let notes = run_tool("readelf", &["-n", &p(&stripped)]);
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a GNU build id")
        .trim()
        .to_string();
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
    /// once it has indexed `build_id` (when given).
    fn elfutils(root: &Path, build_id: Option<&str>) -> Server {
        std::fs::create_dir_all(root).unwrap();
        let port = free_port();
        let db = root.with_extension("sqlite");
        let mut command = Command::new("debuginfod");
        command
            .args(["-F", root.to_str().unwrap(), "-p", &port.to_string(), "-d"])
            .arg(&db)
            .arg("-v");
        let server = Server::spawn(command, port);
        if let Some(id) = build_id {
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
        .env("DEBUGINFOD_MAXSIZE", "1000000")
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

    let server = Server::elfutils(&elfutils_tree(&fixture), Some(&fixture.build_id));
    // A server that does not have it comes first: the next one is asked.
    let empty = Server::elfutils(&fixture.served.join("empty"), None);
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

/// Profiles the stripped fixture for 2 s with `urls` as the servers;
/// returns (hot_a samples, hot_b samples, the report, how long it took).
fn profile_stripped(fixture: &Fixture, urls: &str, extra: &[&str]) -> (i64, i64, String, Duration) {
    let running = Running::start(&fixture.stripped, &["30"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.pb.gz");
    let pid = running.pid().to_string();
    let mut args = vec!["--pid", &pid, "-d", "2s", "-o", out.to_str().unwrap()];
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
    let server = Server::elfutils(&elfutils_tree(&fixture), Some(&fixture.build_id));
    let (a, b, report, _) = profile_stripped(&fixture, &server.url, &[]);
    assert!(
        report.contains("debuginfod: 1 debug files fetched"),
        "{report}"
    );
    let share_a = a as f64 / (a + b).max(1) as f64;
    assert!(
        a + b >= 100 && (0.57..=0.77).contains(&share_a),
        "hot_a {a}, hot_b {b} (expected about 2:1)\n{report}"
    );
}

#[test]
fn hostile_or_absent_servers_cost_a_profile_only_their_names() {
    require_bpf_privileges();
    let fixture = fixture();
    let closed = {
        let port = free_port();
        format!("http://127.0.0.1:{port}")
    };
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
        let (a, b, report, took) = profile_stripped(&fixture, url, &["--debuginfod-wait", "3s"]);
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

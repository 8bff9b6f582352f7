//! Debug files fetched by build id from a debuginfod server (elfutils'
//! `DEBUGINFOD_URLS` and friends): a stripped fixture whose debug file only
//! a local server holds (Python's http.server over the debuginfod layout,
//! `/buildid/ID/debuginfo`) is named as binutils' addr2line names the
//! unstripped binary, from the cache once the server is gone; a file of
//! another build id is refused; a profile of the stripped fixture is named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use profiler_tests::*;

struct Fixture {
    _dir: tempfile::TempDir,
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
        _dir: dir,
    }
}

/// Serves `file` as the debug file of `build_id`.
fn serve_as(fixture: &Fixture, file: &Path) {
    let dir = fixture.served.join("buildid").join(&fixture.build_id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(file, dir.join("debuginfo")).unwrap();
}

/// Python's http.server on the debuginfod tree, until dropped.
struct Server {
    child: std::process::Child,
    url: String,
}

impl Server {
    fn start(root: &Path) -> Server {
        std::fs::create_dir_all(root).unwrap();
        let port = free_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let url = format!("http://127.0.0.1:{port}");
        wait_for(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .expect("http.server did not start");
        Server { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent(args: &[&str], urls: &str, cache: &Path) -> Output {
    Command::new(agent_bin())
        .args(args)
        .env("DEBUGINFOD_URLS", urls)
        .env("DEBUGINFOD_CACHE_PATH", cache)
        .env("DEBUGINFOD_TIMEOUT", "10")
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

/// (function, "file:line") per address from our `symbolize`.
fn ours(
    binary: &Path,
    addresses: &[u64],
    urls: &str,
    cache: &Path,
) -> (Vec<(String, String)>, String) {
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
    let frames = parse_symbolize_json(String::from_utf8_lossy(&output.stdout).trim())
        .into_iter()
        .map(|(_, frames)| {
            let f = frames.first().cloned().expect("a frame");
            let file = f
                .file
                .as_deref()
                .and_then(|p| Path::new(p).file_name()?.to_str());
            let line = match (file, f.line) {
                (Some(file), Some(line)) => format!("{file}:{line}"),
                _ => "??:0".to_string(),
            };
            (f.function, line)
        })
        .collect();
    (frames, stderr)
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

#[test]
fn a_stripped_binary_is_named_from_the_servers_debug_file_then_from_the_cache() {
    let fixture = fixture();
    serve_as(&fixture, &fixture.debug);
    let points = addresses(&fixture.full);
    assert!(points.len() >= 10, "{points:?}");
    let truth = addr2line(&fixture.full, &points);

    // Without a server: nothing names the fixture's functions.
    let (plain, _) = ours(&fixture.stripped, &points, "", &fixture.cache);
    assert!(
        plain.iter().all(|(f, _)| f != "hot_a" && f != "main"),
        "{plain:?}"
    );

    let server = Server::start(&fixture.served);
    // A server that does not have it first: the next one is asked.
    let missing = Server::start(&fixture.served.join("elsewhere"));
    let urls = format!("{} {}", missing.url, server.url);
    let (named, stderr) = ours(&fixture.stripped, &points, &urls, &fixture.cache);
    assert_eq!(
        named, truth,
        "ours vs addr2line of the unstripped file\n{stderr}"
    );
    let cached = fixture.cache.join(&fixture.build_id).join("debuginfo");
    assert!(cached.is_file(), "nothing cached at {}", cached.display());

    // The servers gone: the cache answers.
    drop(server);
    drop(missing);
    let (again, stderr) = ours(&fixture.stripped, &points, &urls, &fixture.cache);
    assert_eq!(again, truth, "from the cache\n{stderr}");
}

#[test]
fn a_debug_file_of_another_build_id_is_refused() {
    let fixture = fixture();
    // The server answers the fixture's build id with another binary's file.
    let other = build_c_fixture("syscalls", C_FRAME_POINTER_FLAGS);
    serve_as(&fixture, &other);
    let server = Server::start(&fixture.served);
    let points = addresses(&fixture.full);
    let (named, stderr) = ours(&fixture.stripped, &points, &server.url, &fixture.cache);
    assert!(
        named.iter().all(|(f, _)| f != "hot_a" && f != "main"),
        "named from a file of another build id: {named:?}"
    );
    assert!(stderr.contains("build id"), "no warning: {stderr}");
    assert!(
        !fixture
            .cache
            .join(&fixture.build_id)
            .join("debuginfo")
            .exists(),
        "the wrong file was cached"
    );
}

#[test]
fn a_profile_of_a_stripped_binary_is_named_through_debuginfod() {
    require_bpf_privileges();
    let fixture = fixture();
    serve_as(&fixture, &fixture.debug);
    let server = Server::start(&fixture.served);
    let running = Running::start(&fixture.stripped, &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.pb.gz");
    let pid = running.pid().to_string();
    let output = agent(
        &["--pid", &pid, "-d", "3s", "-o", out.to_str().unwrap()],
        &server.url,
        &fixture.cache,
    );
    let report = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{report}");
    assert!(
        report.contains("debuginfod: 1 debug files fetched"),
        "{report}"
    );
    let stacks = stacks(&read_pprof(&out));
    let count = |f: &str| -> i64 { stacks.iter().filter(|s| s.has(f)).map(|s| s.count).sum() };
    let (a, b) = (count("hot_a"), count("hot_b"));
    let share_a = a as f64 / (a + b).max(1) as f64;
    assert!(
        a + b >= 150 && (0.57..=0.77).contains(&share_a),
        "hot_a {a}, hot_b {b} (expected about 2:1)\n{report}"
    );
}

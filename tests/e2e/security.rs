//! A hostile pod against the node agent: its listener (connections held
//! open, half-sent, huge declared bodies, garbage, floods of pulls), who may
//! use it (basic auth, bearer tokens, client certificates, Kubernetes token
//! reviews), and files a container controls (links out of its root, sparse
//! debug files, /dev/zero, FIFOs). Loopback only, bounded in count and time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{agent::*, fixtures::*, http::*, processes::*, profiles::*};

/// Sends raw bytes and returns the status code of the answer (None: the
/// connection was closed without one).
fn raw_request(port: u16, request: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .ok()?;
    stream.write_all(request).ok()?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace().nth(1)?.parse().ok()
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn start_run(extra: &[&str]) -> (AgentRun, u16, tempfile::TempDir) {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--listen",
        listen.as_str(),
        "--window",
        "2s",
        "--directory-path",
        dir.path().to_str().unwrap(),
        "--kubernetes-enabled",
        "off",
    ];
    args.extend_from_slice(extra);
    let mut agent = AgentRun::start(&args);
    agent.wait_ready(port);
    (agent, port, dir)
}

#[test]
fn the_listener_survives_a_hostile_client() {
    let _serial = serial();
    require_bpf_privileges();
    let fixture = Running::start(
        &hot_named(tempfile::tempdir().unwrap().path(), "victim"),
        &["60"],
    );
    let (mut agent, port, windows) = start_run(&[]);
    let threads_before = threads_of(agent.pid());

    // Hundreds of idle and half-sent connections.
    let mut held = Vec::new();
    for i in 0..400 {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        if i % 4 == 0 {
            let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
        }
        held.push(stream);
    }
    let started = Instant::now();
    let health = http_get(port, "/healthz", Duration::from_secs(10));
    assert_eq!(
        health.map(|(s, _)| s),
        Some(200),
        "/healthz with 400 connections held:\n{}",
        agent.log()
    );
    println!(
        "/healthz answered in {:?} with 400 connections held",
        started.elapsed()
    );
    // No thread per connection.
    let threads = threads_of(agent.pid());
    assert!(
        threads <= threads_before + 8,
        "{threads} threads with 400 connections held (before: {threads_before})"
    );

    // One request with a huge declared body: answered, never allocated.
    let huge = raw_request(
        port,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nab",
    );
    assert!(matches!(huge, Some(405) | Some(413)), "{huge:?}");
    let huge_get = raw_request(
        port,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nab",
    );
    assert_eq!(huge_get, Some(413));
    // Garbage and a 200 kB header.
    let garbage = raw_request(port, b"\x16\x03\x01 this is not HTTP\r\n\r\n");
    assert!(matches!(garbage, None | Some(400)), "{garbage:?}");
    let mut big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 200_000));
    big.extend(b"\r\n\r\n");
    let big = raw_request(port, &big);
    assert!(matches!(big, None | Some(431) | Some(400)), "{big:?}");
    assert!(agent.alive(), "the agent died:\n{}", agent.log());

    // 20 pulls at once: 200 or 429 each, and what is served reads in
    // go tool pprof.
    let pulls: Vec<_> = (0..20)
        .map(|_| {
            std::thread::spawn(move || {
                http_get(
                    port,
                    "/debug/pprof/profile?seconds=1",
                    Duration::from_secs(30),
                )
            })
        })
        .collect();
    let answers: Vec<(u16, Vec<u8>)> = pulls
        .into_iter()
        .map(|t| t.join().unwrap().expect("a pull got no answer"))
        .collect();
    assert!(
        answers.iter().all(|(s, _)| *s == 200 || *s == 429),
        "{:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    let served: Vec<&Vec<u8>> = answers
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| b)
        .collect();
    assert!(
        !served.is_empty() && served.len() <= 4,
        "{} pulls served",
        served.len()
    );
    let scratch = tempfile::tempdir().unwrap();
    for (i, body) in served.iter().enumerate() {
        let file = scratch.path().join(format!("pull-{i}.pb.gz"));
        std::fs::write(&file, body).unwrap();
        go_pprof(&["-raw"], &file);
    }

    // The window is still written.
    drop(held);
    let written = wait_for(Duration::from_secs(15), || {
        std::fs::read_dir(windows.path())
            .ok()?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
    });
    assert!(written.is_some(), "no window written:\n{}", agent.log());
    let metrics = http_get(port, "/metrics", Duration::from_secs(5)).unwrap();
    let text = String::from_utf8_lossy(&metrics.1);
    assert!(metric_value(&text, "profiler_agent_http_connections_open").is_some());
    assert!(agent.terminate(Duration::from_secs(20)).success());
    drop(fixture);
}

/// A web config with basic auth and a bearer token file: credentials are
/// required, health endpoints stay open.
#[test]
fn basic_auth_and_bearer_tokens_guard_the_endpoints() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  scraper: '{hash}'\n")).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let (mut agent, port, _windows) = start_run(&[
        "--web-config-file",
        web.to_str().unwrap(),
        "--bearer-token-file",
        token.to_str().unwrap(),
    ]);
    let status = |headers: &str, path: &str| {
        raw_request(
            port,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n")
                .as_bytes(),
        )
    };
    assert_eq!(status("", "/metrics"), Some(401));
    assert_eq!(status("", "/debug/pprof/profile?seconds=1"), Some(401));
    assert_eq!(status("", "/healthz"), Some(200));
    assert_eq!(status("", "/readyz"), Some(200));
    // base64("scraper:s3cret"), base64("scraper:wrong")
    assert_eq!(
        status("Authorization: Basic c2NyYXBlcjpzM2NyZXQ=\r\n", "/metrics"),
        Some(200)
    );
    assert_eq!(
        status("Authorization: Basic c2NyYXBlcjp3cm9uZw==\r\n", "/metrics"),
        Some(401)
    );
    assert_eq!(
        status("Authorization: Bearer t0ken\r\n", "/metrics"),
        Some(200)
    );
    assert_eq!(
        status("Authorization: Bearer nope\r\n", "/metrics"),
        Some(401)
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// TLS with client certificates required (mTLS): a certificate signed by
/// the configured CA gets in; no certificate, no handshake.
#[test]
fn client_certificates_are_verified() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = make_certificates(dir.path());
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=scraper",
    ]);
    // An X.509 v3 client certificate (rustls refuses v1 ones).
    std::fs::write(
        dir.path().join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.pem",
        "-days",
        "2",
        "-extfile",
        "client.ext",
    ]);
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: \
             RequireAndVerifyClientCert\n  client_ca_file: {}\n",
            cert.display(),
            key.display(),
            ca.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let windows = tempfile::tempdir().unwrap();
    let mut agent = AgentRun::start(&[
        "--listen",
        &listen,
        "--directory-path",
        windows.path().to_str().unwrap(),
        "--kubernetes-enabled",
        "off",
        "--web-config-file",
        web.to_str().unwrap(),
    ]);
    let curl = |with_cert: bool| -> String {
        let mut command = Command::new("curl");
        command
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "10",
                "--cacert",
            ])
            .arg(&ca);
        if with_cert {
            command
                .arg("--cert")
                .arg(dir.path().join("client.pem"))
                .arg("--key")
                .arg(dir.path().join("client.key"));
        }
        let output = command
            .arg(format!("https://127.0.0.1:{port}/metrics"))
            .stdin(Stdio::null())
            .output()
            .expect("running curl");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let ready = wait_for(Duration::from_secs(30), || {
        (curl(true) == "200").then_some(())
    });
    assert!(
        ready.is_some(),
        "no 200 with a client certificate:\n{}",
        agent.log()
    );
    // Without one the handshake fails: curl reports 000.
    assert_eq!(curl(false), "000");
    assert!(agent.alive());
}

/// A stand-in API server answering TokenReviews and SubjectAccessReviews:
/// `allowed-token` is scraper-a (may get anything), `denied-token` is
/// scraper-b (may not), anything else is not authenticated.
struct FakeReviews {
    port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _thread: std::thread::JoinHandle<()>,
}

fn fake_reviews() -> FakeReviews {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = requests.clone();
    let thread = std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = String::new();
            let _ = request.as_reader().read_to_string(&mut body);
            seen.lock().unwrap().push(body.clone());
            let answer = if request.url().ends_with("/tokenreviews") {
                let user = if body.contains("allowed-token") {
                    Some("scraper-a")
                } else if body.contains("denied-token") {
                    Some("scraper-b")
                } else {
                    None
                };
                match user {
                    Some(user) => format!(
                        r#"{{"status":{{"authenticated":true,"user":{{"username":"{user}","groups":["system:serviceaccounts"]}}}}}}"#
                    ),
                    None => r#"{"status":{"authenticated":false,"error":"invalid bearer token"}}"#
                        .to_string(),
                }
            } else {
                let allowed = body.contains("scraper-a");
                format!(r#"{{"status":{{"allowed":{allowed}}}}}"#)
            };
            let _ = request.respond(tiny_http::Response::from_string(answer).with_status_code(201));
        }
    });
    FakeReviews {
        port,
        requests,
        _thread: thread,
    }
}

#[test]
fn kubernetes_token_reviews_authenticate_and_authorize() {
    let _serial = serial();
    require_bpf_privileges();
    let api = fake_reviews();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("sa-token");
    std::fs::write(&token, "agent-token").unwrap();
    let api_url = format!("http://127.0.0.1:{}", api.port);
    let (mut agent, port, _windows) = start_run(&[
        "--auth-kubernetes",
        "true",
        "--kubernetes-api-url",
        &api_url,
        "--kubernetes-token-file",
        token.to_str().unwrap(),
    ]);
    let status = |bearer: Option<&str>| {
        let header = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        raw_request(
            port,
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n")
                .as_bytes(),
        )
    };
    assert_eq!(status(None), Some(401));
    assert_eq!(status(Some("unknown-token")), Some(401));
    assert_eq!(status(Some("denied-token")), Some(403));
    assert_eq!(status(Some("allowed-token")), Some(200));
    // Answers are cached: a second request does not ask again.
    let asked = api.requests.lock().unwrap().len();
    assert_eq!(status(Some("allowed-token")), Some(200));
    assert_eq!(api.requests.lock().unwrap().len(), asked);
    let requests = api.requests.lock().unwrap().join("\n");
    assert!(
        requests.contains(r#""path":"/metrics""#) && requests.contains(r#""verb":"get""#),
        "{requests}"
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// Builds the hot fixture statically into `out` (for a chroot).
fn static_hot(out: &Path, flags: &[&str]) {
    let output = Command::new("cc")
        .arg("-o")
        .arg(out)
        .arg(workspace_root().join("tests/fixtures/c/hot.c"))
        .args([
            "-static",
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-Wl,--build-id",
        ])
        .args(flags)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn objcopy(args: &[&str]) {
    let output = Command::new("objcopy").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "objcopy {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn build_id_hex(path: &Path) -> String {
    let notes = run_tool("readelf", &["-n", path.to_str().unwrap()]);
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap()
        .to_string()
}

/// Runs `record` on `pid` for 3 s, polling the agent's peak RSS; returns
/// its stderr, the profile and the peak RSS in KiB.
fn record_watched(pid: u32, out: &Path) -> (String, u64, Duration) {
    let watched = profiler_tests::agent::record_watched(&[
        "--pid",
        &pid.to_string(),
        "--duration",
        "3s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    (watched.report, watched.peak_kib, watched.took)
}

/// A "container" (a chroot) whose build-id debug path is an absolute
/// symlink to a file that exists only on the host: resolved inside the
/// container's root, it names nothing; the host file's renamed functions
/// never name a frame.
#[test]
fn links_out_of_a_containers_root_are_not_followed() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let binary = root.join("bin/hot");
    static_hot(&binary, &[]);
    // The host-only debug file: same build id, renamed functions.
    let host_build = dir.path().join("host-build");
    static_hot(
        &host_build,
        &[
            "-Dhot_a=host_only_a",
            "-Dhot_b=host_only_b",
            "-Dwork=host_only_work",
        ],
    );
    let host_debug = dir.path().join("host-only.debug");
    objcopy(&[
        "--only-keep-debug",
        host_build.to_str().unwrap(),
        host_debug.to_str().unwrap(),
    ]);
    objcopy(&["--strip-all", binary.to_str().unwrap()]);
    let id = build_id_hex(&binary);
    let link_dir = root.join("usr/lib/debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&link_dir).unwrap();
    std::os::unix::fs::symlink(&host_debug, link_dir.join(format!("{}.debug", &id[2..]))).unwrap();

    let child = Command::new("chroot")
        .arg(&root)
        .args(["/bin/hot", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chroot (coreutils)");
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id();
    let out = dir.path().join("chroot.pb.gz");
    let (report, _, _) = record_watched(pid, &out);
    let mut child = child;
    let _ = child.kill();
    let _ = child.wait();
    let stacks = stacks(&read_pprof(&out));
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    assert!(total >= 100, "only {total} samples:\n{report}");
    for stack in &stacks {
        assert!(
            !stack.frames.iter().any(|(f, _)| f.contains("host_only")),
            "a frame named from the host's file: {stack:?}"
        );
    }
}

/// Debug links that name a 16 GiB sparse file, /dev/zero, and a FIFO: the
/// agent refuses them without reading, its memory stays bounded and the
/// profile ends on time.
#[test]
fn hostile_debug_files_cost_nothing() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    for (name, plant) in [("sparse", 0), ("zero", 1), ("fifo", 2)] {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let binary = sub.join("victim");
        let output = Command::new("cc")
            .arg("-o")
            .arg(&binary)
            .arg(workspace_root().join("tests/fixtures/c/hot.c"))
            .args(["-O1", "-fno-omit-frame-pointer"])
            .output()
            .unwrap();
        assert!(output.status.success());
        let debug = sub.join("victim.debug");
        std::fs::write(&debug, b"placeholder").unwrap();
        objcopy(&[
            &format!("--add-gnu-debuglink={}", debug.display()),
            binary.to_str().unwrap(),
        ]);
        objcopy(&["--strip-debug", binary.to_str().unwrap()]);
        std::fs::remove_file(&debug).unwrap();
        match plant {
            0 => std::fs::File::create(&debug)
                .unwrap()
                .set_len(16 << 30)
                .unwrap(),
            1 => std::os::unix::fs::symlink("/dev/zero", &debug).unwrap(),
            _ => {
                let status = Command::new("mkfifo").arg(&debug).status().unwrap();
                assert!(status.success());
            }
        }
        let running = Running::start(&binary, &["30"]);
        let out = sub.join("profile.pb.gz");
        let (report, peak_kib, took) = record_watched(running.pid(), &out);
        println!("{name}: peak RSS {} MiB, {:?}", peak_kib / 1024, took);
        assert!(
            peak_kib < 512 * 1024,
            "{name}: the agent grew to {} MiB:\n{report}",
            peak_kib / 1024
        );
        assert!(
            took < Duration::from_secs(30),
            "{name}: a 3 s profile took {took:?}"
        );
        let stacks = stacks(&read_pprof(&out));
        assert!(stacks.iter().any(|s| s.has("hot_a")), "{name}: {report}");
        if plant != 0 {
            assert!(
                report.contains("refused"),
                "{name}: no refusal logged:\n{report}"
            );
        }
    }
}

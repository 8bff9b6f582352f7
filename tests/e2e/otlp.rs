//! The OTLP profiles exporter end to end: the real agent (real BPF)
//! profiling the `hot` fixture exports each window to
//! - an HTTP/protobuf receiver (`POST /v1development/profiles`), and
//! - a real gRPC server (Python grpcio, plain and TLS) that goes down and
//!   comes back, and behind a TCP proxy that counts the connections the
//!   agent opens and cuts them,
//!
//! and every request is decoded with the official generated OTLP messages
//! (the `opentelemetry-proto` crate), then checked for resource attributes,
//! sample types and the fixture's function names.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use profiler_tests::tcp_proxy::TcpProxy;
use profiler_tests::{agent::*, fixtures::*, go::*, http::*, processes::*};
use prost::Message;

/// One resource's profile, resolved through the dictionary.
#[derive(Debug, Clone)]
struct Resource {
    attributes: HashMap<String, String>,
    sample_type: (String, String),
    period_type: (String, String),
    period: i64,
    duration_nano: u64,
    samples: Vec<Sample>,
}

#[derive(Debug, Clone)]
struct Sample {
    /// Function names leaf first, inlined frames expanded.
    frames: Vec<String>,
    /// `profile.frame.type` of each location, leaf first.
    frame_types: Vec<String>,
    /// The mapping file of each location ("" for none), leaf first.
    files: Vec<String>,
    /// Each function with its location's `profile.frame.type`, leaf first.
    typed: Vec<(String, String)>,
    attributes: HashMap<String, String>,
    value: i64,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => format!("int:{i}"),
        other => format!("{other:?}"),
    }
}

fn decode(body: &[u8]) -> Vec<Resource> {
    let request = ExportProfilesServiceRequest::decode(body).expect("an OTLP profiles request");
    let d = request.dictionary.expect("a dictionary");
    assert_eq!(d.string_table[0], "", "string_table[0] must be \"\"");
    for (name, empty) in [
        ("mapping", d.mapping_table[0] == Default::default()),
        ("location", d.location_table[0] == Default::default()),
        ("function", d.function_table[0] == Default::default()),
        ("stack", d.stack_table[0] == Default::default()),
        ("attribute", d.attribute_table[0] == Default::default()),
        ("link", d.link_table[0] == Default::default()),
    ] {
        assert!(empty, "{name}_table[0] must be the zero value");
    }
    let s = |i: i32| d.string_table[i as usize].clone();
    let attribute = |i: i32| {
        let a = &d.attribute_table[i as usize];
        (s(a.key_strindex), text(&a.value))
    };
    let mut out = Vec::new();
    for rp in request.resource_profiles {
        let attributes = rp
            .resource
            .expect("a resource")
            .attributes
            .into_iter()
            .map(|kv| (kv.key, text(&kv.value)))
            .collect();
        for sp in rp.scope_profiles {
            assert_eq!(sp.scope.as_ref().unwrap().name, "profiler-agent");
            for p in sp.profiles {
                let samples = p
                    .samples
                    .iter()
                    .map(|sample| {
                        let stack = &d.stack_table[sample.stack_index as usize];
                        let mut frames = Vec::new();
                        let mut frame_types = Vec::new();
                        let mut files = Vec::new();
                        let mut typed = Vec::new();
                        for &l in &stack.location_indices {
                            let location = &d.location_table[l as usize];
                            let kind = location
                                .attribute_indices
                                .iter()
                                .map(|&i| attribute(i))
                                .find(|(k, _)| k == "profile.frame.type")
                                .map(|(_, v)| v)
                                .unwrap_or_default();
                            for line in &location.lines {
                                let f = &d.function_table[line.function_index as usize];
                                frames.push(s(f.name_strindex));
                                typed.push((s(f.name_strindex), kind.clone()));
                            }
                            frame_types.push(kind);
                            let mapping = &d.mapping_table[location.mapping_index as usize];
                            files.push(s(mapping.filename_strindex));
                        }
                        Sample {
                            frames,
                            frame_types,
                            files,
                            typed,
                            attributes: sample
                                .attribute_indices
                                .iter()
                                .map(|&i| attribute(i))
                                .collect(),
                            value: sample.values.iter().sum(),
                        }
                    })
                    .collect();
                let value_type =
                    |v: Option<opentelemetry_proto::tonic::profiles::v1development::ValueType>| {
                        let v = v.unwrap_or_default();
                        (s(v.type_strindex), s(v.unit_strindex))
                    };
                out.push(Resource {
                    attributes: Default::default(),
                    sample_type: value_type(p.sample_type),
                    period_type: value_type(p.period_type),
                    period: p.period,
                    duration_nano: p.duration_nano,
                    samples,
                });
            }
        }
        if let Some(last) = out.last_mut() {
            last.attributes = attributes;
        }
    }
    out
}

/// Checks one decoded window holds the fixture's profile: what a backend
/// needs to file it under the right service and show its functions.
fn check_window(resources: &[Resource], service: &str, node: &str, pid: u32) {
    let r = resources
        .iter()
        .find(|r| r.attributes.get("service.name").map(String::as_str) == Some(service))
        .unwrap_or_else(|| panic!("no resource with service.name={service}: {resources:#?}"));
    assert_eq!(r.attributes["host.name"], node, "{:?}", r.attributes);
    assert_eq!(r.sample_type, ("samples".to_string(), "count".to_string()));
    assert_eq!(
        r.period_type,
        ("cpu".to_string(), "nanoseconds".to_string())
    );
    assert_eq!(r.period, 10_000_000, "100 Hz is 10 ms per sample");
    assert!(r.duration_nano > 0);
    let hot = r
        .samples
        .iter()
        .find(|s| s.frames.iter().any(|f| f == "hot_a"))
        .unwrap_or_else(|| panic!("no hot_a stack: {:#?}", r.samples));
    assert!(hot.frames.iter().any(|f| f == "main"), "{hot:?}");
    assert!(hot.value >= 1);
    assert_eq!(hot.attributes["process.pid"], format!("int:{pid}"));
    assert!(hot.attributes.contains_key("thread.id"), "{hot:?}");
    assert!(
        !hot.attributes.contains_key("service.name"),
        "resource attributes are not repeated per sample: {hot:?}"
    );
    assert!(
        hot.frame_types
            .iter()
            .all(|t| t == "native" || t == "kernel"),
        "{hot:?}"
    );
    assert!(
        hot.files.iter().any(|f| f.ends_with(service)),
        "the fixture's mapping: {hot:?}"
    );
}

/// Path, lower-cased headers and body of one request.
type Request = (String, HashMap<String, String>, Vec<u8>);

struct HttpReceiver {
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpReceiver {
    fn start(port: u16) -> HttpReceiver {
        let server = tiny_http::Server::http(("127.0.0.1", port)).expect("binding the receiver");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (store, stopped) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                let mut body = Vec::new();
                std::io::Read::read_to_end(request.as_reader(), &mut body).unwrap();
                let headers = request
                    .headers()
                    .iter()
                    .map(|h| {
                        (
                            h.field.to_string().to_ascii_lowercase(),
                            h.value.to_string(),
                        )
                    })
                    .collect();
                store
                    .lock()
                    .unwrap()
                    .push((request.url().to_string(), headers, body));
                // An empty ExportProfilesServiceResponse.
                let _ = request.respond(
                    tiny_http::Response::from_data(Vec::new()).with_header(
                        "Content-Type: application/x-protobuf"
                            .parse::<tiny_http::Header>()
                            .unwrap(),
                    ),
                );
            }
        });
        HttpReceiver {
            requests,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn otlp_over_http_protobuf_carries_resources_attributes_and_symbols() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "otlp-http-svc"), &[]);
    let receiver_port = free_port();
    let receiver = HttpReceiver::start(receiver_port);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--node",
        "node-o",
        "--directory-path",
        "",
        "--otlp-url",
        &format!("http://127.0.0.1:{receiver_port}"),
        "--otlp-basic-auth-username",
        "user",
        "--otlp-basic-auth-password",
        "pass",
    ]);
    agent.wait_ready(port);
    let found = wait_for(Duration::from_secs(30), || {
        let requests = receiver.requests.lock().unwrap();
        requests
            .iter()
            .find(|(_, _, body)| {
                decode(body).iter().any(|r| {
                    r.samples
                        .iter()
                        .any(|s| s.frames.iter().any(|f| f == "hot_a"))
                })
            })
            .cloned()
    })
    .unwrap_or_else(|| {
        panic!(
            "no OTLP request with the fixture's stacks:\n{}",
            agent.log()
        )
    });
    let (path, headers, body) = found;
    assert_eq!(path, "/v1development/profiles");
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["authorization"], "Basic dXNlcjpwYXNz");
    check_window(&decode(&body), "otlp-http-svc", "node-o", fixture.pid());
    let text = http_get(port, "/metrics", Duration::from_secs(5))
        .unwrap()
        .1;
    let text = String::from_utf8(text).unwrap();
    assert!(
        metric_value(
            &text,
            "profiler_agent_export_success_total{exporter=\"otlp\"}"
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// `wall = true`: each window also carries, per service, a profile of
/// sample type `wall/nanoseconds` (besides the CPU one), decoded with the
/// official messages: the `hot` fixture's one thread spins all the time,
/// so its wall-clock time is the window's length.
#[test]
fn otlp_carries_the_wall_clock_profile_beside_the_cpu_one() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "otlp-wall-svc"), &[]);
    let receiver_port = free_port();
    let receiver = HttpReceiver::start(receiver_port);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "3s",
        "--wall",
        "true",
        "--directory-path",
        "",
        "--otlp-url",
        &format!("http://127.0.0.1:{receiver_port}"),
    ]);
    agent.wait_ready(port);
    let is_wall = |r: &Resource| r.sample_type == ("wall".to_string(), "nanoseconds".to_string());
    // A whole window (not the first, which began before the fixture was
    // sampled).
    let resources = wait_for(Duration::from_secs(30), || {
        let requests = receiver.requests.lock().unwrap();
        requests
            .iter()
            .skip(1)
            .map(|(_, _, body)| decode(body))
            .find(|resources| resources.iter().any(is_wall))
    })
    .unwrap_or_else(|| panic!("no OTLP request with a wall profile:\n{}", agent.log()));
    assert!(agent.terminate(Duration::from_secs(20)).success());
    let of_service = |r: &&Resource| {
        r.attributes.get("service.name").map(String::as_str) == Some("otlp-wall-svc")
    };
    let wall = resources
        .iter()
        .filter(of_service)
        .find(|r| is_wall(r))
        .unwrap_or_else(|| panic!("no wall profile of the service: {resources:#?}"));
    assert!(
        resources
            .iter()
            .filter(of_service)
            .any(|r| r.sample_type == ("samples".to_string(), "count".to_string())),
        "the CPU profile is not beside it: {resources:#?}"
    );
    assert!(
        wall.samples
            .iter()
            .any(|s| s.frames.iter().any(|f| f == "hot_a")),
        "{wall:#?}"
    );
    let total: i64 = wall.samples.iter().map(|s| s.value).sum();
    let window = wall.duration_nano as i64;
    assert!(
        (total - window).abs() as f64 <= 0.10 * window as f64,
        "a thread on the CPU all along has {total} ns of a {window} ns window"
    );
}

/// Every frame says what it is, by what named it: a Python process's
/// functions are `cpython`, a Go binary's `go` (its pclntab), C code
/// `native` (the semantic conventions' values; `kernel` is checked with
/// the C fixture above). The same windows reach the directory exporter
/// with their Python frames, as `go tool pprof` reads them.
#[test]
fn otlp_frame_types_tell_python_go_and_native_apart() {
    let _serial = serial();
    require_bpf_privileges();
    let python = Running::start(
        Path::new("/usr/bin/python3.11"),
        &[
            workspace_root()
                .join("tests/fixtures/python/workload.py")
                .to_str()
                .unwrap(),
            "20",
            "tree",
        ],
    );
    let go = Running::start(&build_go_fixture("1.27.3", "otlp-go", &[], &[]), &[]);
    let windows = tempfile::tempdir().unwrap();
    let receiver_port = free_port();
    let receiver = HttpReceiver::start(receiver_port);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &format!("{},{}", python.pid(), go.pid()),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "2s",
        "--directory-path",
        windows.path().to_str().unwrap(),
        "--otlp-url",
        &format!("http://127.0.0.1:{receiver_port}"),
    ]);
    agent.wait_ready(port);
    let typed = |function: &str| {
        let requests = receiver.requests.lock().unwrap();
        requests.iter().find_map(|(_, _, body)| {
            decode(body).iter().find_map(|r| {
                r.samples.iter().find_map(|s| {
                    s.typed
                        .iter()
                        .find(|(f, _)| f == function)
                        .map(|(_, t)| t.clone())
                })
            })
        })
    };
    for (function, expected) in [
        ("leaf_a", "cpython"),
        ("<module>", "cpython"),
        ("main.hot", "go"),
        ("runtime.goexit", "go"),
        ("_start", "native"),
    ] {
        let found = wait_for(Duration::from_secs(30), || typed(function));
        assert_eq!(
            found.as_deref(),
            Some(expected),
            "{function}'s frame type\n{}",
            agent.log()
        );
    }
    assert!(agent.terminate(Duration::from_secs(20)).success());
    let python_window = std::fs::read_dir(windows.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("python3.11"))
        .find(|p| {
            profiler_tests::pprof_raw::raw_stacks(p)
                .iter()
                .any(|s| s.has("leaf_a") && s.has("<module>"))
        });
    assert!(
        python_window.is_some(),
        "no window file of the Python service with its frames"
    );
}

/// The grpcio receiver (tests/fixtures/otlp/grpc_receiver.py) in the venv
/// `cargo xtask setup --tests` makes.
struct GrpcReceiver {
    child: Child,
    out: PathBuf,
}

impl GrpcReceiver {
    fn start(port: u16, out: &Path, tls: Option<(&Path, &Path)>) -> GrpcReceiver {
        let python = go_toolchain_root().join("grpcio/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run `cargo xtask setup --tests`",
            python.display()
        );
        let script = workspace_root().join("tests/fixtures/otlp/grpc_receiver.py");
        let mut command = Command::new(python);
        command.arg(script).arg(port.to_string()).arg(out);
        if let Some((cert, key)) = tls {
            command.arg(cert).arg(key);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the grpcio receiver");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "listening",
            "the grpcio receiver did not start"
        );
        GrpcReceiver {
            child,
            out: out.to_path_buf(),
        }
    }

    /// The requests received so far, in order, with their metadata.
    fn requests(&self) -> Vec<(Vec<u8>, HashMap<String, String>)> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.out)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        names.sort();
        names
            .iter()
            .map(|json| {
                let meta = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
                (std::fs::read(json.with_extension("bin")).unwrap(), meta)
            })
            .collect()
    }
}

impl Drop for GrpcReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn has_hot(body: &[u8]) -> bool {
    decode(body).iter().any(|r| {
        r.samples
            .iter()
            .any(|s| s.frames.iter().any(|f| f == "hot_a"))
    })
}

#[test]
fn otlp_over_grpc_reaches_a_real_grpc_server_and_survives_its_outage() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "otlp-grpc-svc"), &[]);
    let receiver_port = free_port();
    let receiver = GrpcReceiver::start(receiver_port, &dir.path().join("first"), None);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--node",
        "node-g",
        "--directory-path",
        "",
        "--otlp-url",
        &format!("http://127.0.0.1:{receiver_port}"),
        "--otlp-protocol",
        "grpc",
        "--otlp-bearer-token",
        "t0ken",
        "--otlp-tenant-id",
        "team-g",
        "--otlp-timeout",
        "2s",
        "--otlp-queue-size",
        "2",
        "--otlp-max-attempts",
        "2",
    ]);
    agent.wait_ready(port);
    let (body, meta) = wait_for(Duration::from_secs(30), || {
        receiver
            .requests()
            .into_iter()
            .find(|(body, _)| has_hot(body))
    })
    .unwrap_or_else(|| panic!("no gRPC export with the fixture's stacks:\n{}", agent.log()));
    assert_eq!(meta["authorization"], "Bearer t0ken");
    assert_eq!(meta["x-scope-orgid"], "team-g");
    check_window(&decode(&body), "otlp-grpc-svc", "node-g", fixture.pid());

    // Down for several windows: failures and drops are counted, the agent
    // and its sampling go on.
    drop(receiver);
    std::thread::sleep(Duration::from_secs(7));
    assert!(agent.alive(), "the agent died:\n{}", agent.log());
    let text = String::from_utf8(
        http_get(port, "/metrics", Duration::from_secs(5))
            .unwrap()
            .1,
    )
    .unwrap();
    let value = |series: &str| metric_value(&text, series).unwrap_or(-1.0);
    assert!(
        value("profiler_agent_export_failures_total{exporter=\"otlp\"}") >= 2.0,
        "{text}"
    );
    assert!(
        value("profiler_agent_export_dropped_total{exporter=\"otlp\"}") >= 1.0,
        "{text}"
    );
    assert_eq!(value("profiler_agent_export_up{exporter=\"otlp\"}"), 0.0);

    // Back on the same port: later windows arrive, and SIGTERM delivers
    // the partial one.
    let receiver = GrpcReceiver::start(receiver_port, &dir.path().join("second"), None);
    let resumed = wait_for(Duration::from_secs(40), || {
        receiver
            .requests()
            .iter()
            .any(|(body, _)| has_hot(body))
            .then_some(())
    });
    assert!(
        resumed.is_some(),
        "nothing after the receiver came back:\n{}",
        agent.log()
    );
    let log = agent.log();
    assert_eq!(log.matches("export failed").count(), 1, "{log}");
    let before = receiver.requests().len();
    assert!(agent.terminate(Duration::from_secs(20)).success());
    assert!(
        receiver.requests().len() > before,
        "the last window was not exported:\n{}",
        agent.log()
    );
}

/// Windows share one HTTP/2 connection: counted at a TCP proxy in front
/// of the grpcio receiver, many windows arrive over one connection; once
/// the proxy cuts it (the receiver stays up), the next windows arrive over
/// exactly one new connection, without a failed export, and `/metrics`
/// counts one reconnect.
#[test]
fn otlp_over_grpc_keeps_one_connection_across_windows() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "otlp-conn-svc"), &[]);
    let receiver_port = free_port();
    let receiver = GrpcReceiver::start(receiver_port, &dir.path().join("conn"), None);
    let proxy = TcpProxy::start(receiver_port);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--directory-path",
        "",
        "--otlp-url",
        &format!("http://127.0.0.1:{}", proxy.port),
        "--otlp-protocol",
        "grpc",
    ]);
    agent.wait_ready(port);
    let requests_reach = |count: usize| {
        wait_for(Duration::from_secs(30), || {
            (receiver.requests().len() >= count).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{} of {count} windows arrived:\n{}",
                receiver.requests().len(),
                agent.log()
            )
        })
    };
    let metric = |series: &str| {
        let text = String::from_utf8(
            http_get(port, "/metrics", Duration::from_secs(5))
                .unwrap()
                .1,
        )
        .unwrap();
        metric_value(&text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"))
    };
    requests_reach(4);
    assert_eq!(
        proxy.accepted(),
        1,
        "{} windows over {} connections",
        receiver.requests().len(),
        proxy.accepted()
    );
    assert_eq!(
        metric("profiler_agent_export_reconnects_total{exporter=\"otlp\"}"),
        0.0
    );

    proxy.cut();
    let before = receiver.requests().len();
    requests_reach(before + 3);
    assert_eq!(proxy.accepted(), 2, "connections after one cut");
    assert_eq!(
        metric("profiler_agent_export_reconnects_total{exporter=\"otlp\"}"),
        1.0
    );
    assert_eq!(
        metric("profiler_agent_export_failures_total{exporter=\"otlp\"}"),
        0.0,
        "a window failed across the cut:\n{}",
        agent.log()
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

#[test]
fn otlp_over_grpc_with_tls_trusts_the_configured_ca() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = make_certificates(dir.path());
    let fixture = Running::start(&hot_named(dir.path(), "otlp-tls-svc"), &[]);
    let receiver_port = free_port();
    let receiver = GrpcReceiver::start(receiver_port, &dir.path().join("tls"), Some((&cert, &key)));
    let url = format!("https://127.0.0.1:{receiver_port}");
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--directory-path",
        "",
        "--otlp-url",
        &url,
        "--otlp-protocol",
        "grpc",
        "--otlp-ca-file",
        ca.to_str().unwrap(),
    ]);
    agent.wait_ready(port);
    let delivered = wait_for(Duration::from_secs(30), || {
        receiver
            .requests()
            .iter()
            .any(|(body, _)| has_hot(body))
            .then_some(())
    });
    assert!(delivered.is_some(), "nothing over TLS:\n{}", agent.log());
    assert!(agent.terminate(Duration::from_secs(20)).success());

    // Without the CA, the Mozilla roots do not trust the test CA: the
    // handshake fails, is logged once, and nothing is delivered.
    let before = receiver.requests().len();
    let port = free_port();
    let mut untrusting = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--directory-path",
        "",
        "--otlp-url",
        &url,
        "--otlp-protocol",
        "grpc",
    ]);
    untrusting.wait_ready(port);
    let failed = wait_for(Duration::from_secs(20), || {
        untrusting.log().contains("TLS handshake").then_some(())
    });
    assert!(failed.is_some(), "{}", untrusting.log());
    assert_eq!(receiver.requests().len(), before);
}

//! `profiler-agent run` end to end: the real agent (real BPF) against the
//! `hot` fixture, read by the tools users point at it: `go tool pprof` on
//! the pull endpoint, a real Prometheus server scraping `/metrics`, a
//! directory of pprof files, a Pyroscope-protocol receiver, and a process
//! in its own mount and pid namespaces under a kubelet-style cgroup.
//!
//! Every agent here profiles selected pids (`--pids`): a whole-node agent
//! on a shared build machine spends its time symbolizing compilers, which
//! would make the timing of these tests depend on what else runs.
//! All traffic stays on 127.0.0.1; every loop is bounded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use profiler_tests::windows::{self, window_files};
use profiler_tests::{
    agent::*, fixtures::*, go::*, http::*, pprof_raw::*, processes::*, profiles::*,
};

fn pprof_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn metrics(port: u16) -> String {
    let (status, body) =
        http_get(port, "/metrics", Duration::from_secs(5)).expect("/metrics answers");
    assert_eq!(status, 200);
    String::from_utf8(body).unwrap()
}

#[test]
fn go_tool_pprof_reads_the_pull_endpoint() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "pull-svc"), &[]);
    let port = free_port();
    let pid = fixture.pid().to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--pids",
        &pid,
        "--listen",
        &listen,
        "--node",
        "node-a",
        "--directory-path",
        "",
    ]);
    agent.wait_ready(port);

    let started = Instant::now();
    let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=3");
    let home = tempfile::tempdir().unwrap();
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", &url])
        .env("HOME", home.path())
        .env("PPROF_TMPDIR", home.path())
        .stdin(Stdio::null())
        .output()
        .expect("running go tool pprof (Debian golang-go: `cargo xtask setup --tests`)");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "go tool pprof failed: {stderr}\nagent:\n{}",
        agent.log()
    );
    // The profile covers the next 3 seconds, not a past window.
    assert!(
        elapsed >= Duration::from_secs(3),
        "answered after {elapsed:?}"
    );
    assert!(
        stdout.contains("hot_a") && stdout.contains("hot_b"),
        "no hot_a/hot_b in go tool pprof's view:\n{stdout}\n{stderr}"
    );

    // The same endpoint read directly: labels, and the pid filter.
    let (status, body) = http_get(
        port,
        &format!("/debug/pprof/profile?seconds=2&pid={pid}"),
        Duration::from_secs(30),
    )
    .expect("a pull answers");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let stacks = raw_stacks_of(&body);
    assert!(stacks.iter().any(|s| s.has("hot_a")), "{stacks:?}");
    for stack in &stacks {
        assert_eq!(stack.labels["pid"], pid);
        assert_eq!(stack.labels["service_name"], "pull-svc");
        assert_eq!(stack.labels["comm"], "pull-svc");
        assert_eq!(stack.labels["node"], "node-a");
    }
    // About 2 s at 100 Hz of a process that spins one CPU.
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    assert!((100..=260).contains(&total), "{total} samples in 2 s");

    // A filter that matches nothing gives an empty, valid profile.
    let (status, body) = http_get(
        port,
        "/debug/pprof/profile?seconds=1&service=no-such-service",
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(status, 200);
    let empty = RawProfile::of_bytes(&body);
    assert!(empty.samples.is_empty());
    // Bad parameters are refused with the reason.
    let (status, body) = http_get(
        port,
        "/debug/pprof/profile?seconds=0",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("seconds"));
    // Wall-clock pulls need `wall = true`: refused at once, saying so.
    let (status, body) =
        http_get(port, "/debug/pprof/wall?seconds=1", Duration::from_secs(5)).unwrap();
    assert_eq!(status, 503);
    assert!(
        String::from_utf8_lossy(&body).contains("wall = false"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(
        http_get(port, "/healthz", Duration::from_secs(5))
            .unwrap()
            .0,
        200
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

#[test]
fn prometheus_scrapes_the_agents_health() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "scraped"), &[]);
    // A probe from the config: the USDT latency fixture's operations
    // (1, 4 and 16 ms sleeps between demo:op__start and demo:op__done).
    let latency = build_latency_fixture("-O2");
    let operations = Running::start(&latency, &["100000"]);
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[[probes]]\nname = \"demo_op\"\nstart = \"usdt:{path}:demo:op__start\"\n\
             end = \"usdt:{path}:demo:op__done\"\nunit = \"us\"\n\n\
             [[probes]]\nname = \"absent\"\nstart = \"uprobe:/no/such/binary:main\"\n",
            path = latency.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--config",
        config.to_str().unwrap(),
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &listen,
        "--window",
        "2s",
        "--directory-path",
        dir.path().join("out").to_str().unwrap(),
        // Restart the sampler at every window boundary (the memory bound
        // at work): the counters Prometheus sees must keep growing across
        // restarts.
        "--max-processes",
        "0",
    ]);
    agent.wait_ready(port);

    let prometheus_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: profiler-agent\n    static_configs:\n      \
             - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let tsdb = dir.path().join("tsdb");
    let prometheus_log = dir.path().join("prometheus.log");
    let mut prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&prometheus_log).unwrap())
        .spawn()
        .expect("starting prometheus (Debian package `prometheus`: `cargo xtask setup --tests`)");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prometheus = Kill(&mut prometheus);

    let query = |expr: &str| -> Option<f64> {
        let (status, body) = http_get(
            prometheus_port,
            &format!("/api/v1/query?query={expr}"),
            Duration::from_secs(5),
        )?;
        if status != 200 {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let result = json["data"]["result"].as_array()?.first()?.clone();
        assert_eq!(result["metric"]["job"], "profiler-agent");
        result["value"][1].as_str()?.parse().ok()
    };
    // Prometheus has scraped the agent at least twice when the counter
    // has grown between two of its samples.
    let taken = wait_for(Duration::from_secs(60), || {
        query("profiler_agent_kernel_samples_total").filter(|&v| v > 0.0)
    })
    .unwrap_or_else(|| {
        panic!(
            "Prometheus never returned a sample count:\n{}\nagent:\n{}",
            std::fs::read_to_string(&prometheus_log).unwrap_or_default(),
            agent.log()
        )
    });
    let grew = wait_for(Duration::from_secs(30), || {
        query("profiler_agent_kernel_samples_total").filter(|&v| v > taken)
    });
    assert!(grew.is_some(), "the scraped sample counter did not grow");
    // Samples received by user space, and a delivered window, are there too.
    let received = wait_for(Duration::from_secs(30), || {
        query("profiler_agent_samples_received_total").filter(|&v| v > 0.0)
    });
    assert!(received.is_some());
    let exported = wait_for(Duration::from_secs(30), || {
        query("profiler_agent_export_success_total%7Bexporter%3D%22directory%22%7D")
            .filter(|&v| v > 0.0)
    });
    assert!(exported.is_some(), "no successful export scraped");
    // The probe's histogram: operations counted, and the 4 ms ones land
    // in the buckets above 2^12 us (the 1 ms ones below).
    let operations_seen = wait_for(Duration::from_secs(30), || {
        query("profiler_probe_demo_op_latency_seconds_count").filter(|&v| v >= 7.0)
    });
    assert!(
        operations_seen.is_some(),
        "no probe histogram scraped:\n{}",
        metrics(port)
    );
    let below_2ms = query("profiler_probe_demo_op_latency_seconds_bucket%7Ble%3D%220.002048%22%7D")
        .expect("a 2.048 ms bucket");
    let count = query("profiler_probe_demo_op_latency_seconds_count").unwrap();
    assert!(
        below_2ms > 0.0 && below_2ms < count,
        "1 ms operations below 2.048 ms, 4 and 16 ms ones above: {below_2ms} of {count}\n{}",
        metrics(port)
    );
    let text = metrics(port);
    assert_eq!(
        metric_value(&text, "profiler_agent_probes_attached"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&text, "profiler_agent_probes_failed"),
        Some(1.0)
    );
    assert!(
        agent.log().contains("probe not attached"),
        "{}",
        agent.log()
    );
    drop(operations);
    // The agent's own view agrees on what the kernel counted.
    let text = metrics(port);
    assert!(metric_value(&text, "profiler_agent_kernel_samples_total").unwrap() >= taken);
    assert!(metric_value(&text, "profiler_agent_resident_memory_bytes").unwrap() > 1e6);
    assert!(metric_value(&text, "profiler_agent_sampler_restarts_total").unwrap() >= 1.0);
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

#[test]
fn the_directory_gets_one_labelled_profile_per_service_per_window_within_retention() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let alpha = Running::start(&hot_named(dir.path(), "svc-alpha"), &[]);
    let beta = Running::start(&hot_named(dir.path(), "svc-beta"), &[]);
    let out = dir.path().join("profiles");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pids = format!("{},{}", alpha.pid(), beta.pid());
    let mut agent = AgentRun::start(&[
        "--pids",
        &pids,
        "--listen",
        &listen,
        "--window",
        "1s",
        "--node",
        "node-b",
        "--directory-path",
        out.to_str().unwrap(),
        "--directory-max-files",
        "6",
    ]);
    agent.wait_ready(port);

    // Watch the directory for 8 windows: the count bound holds throughout.
    let mut most = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let n = pprof_files(&out).len();
        assert!(n <= 6, "{n} files, more than --directory-max-files 6");
        most = most.max(n);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        most,
        6,
        "retention never filled up: {:?}",
        pprof_files(&out)
    );
    let windows_done = metric_value(&metrics(port), "profiler_agent_windows_total").unwrap();
    assert!(
        windows_done >= 6.0,
        "{windows_done} windows in 8 s of 1 s windows"
    );

    // Stop the agent before reading: retention deletes files meanwhile.
    // The last (partial) window adds its files within the bound.
    assert!(agent.terminate(Duration::from_secs(20)).success());
    // Files are cpu-<service>-<window start>.pb.gz: per window start, one
    // file for each service that ran.
    let files = pprof_files(&out);
    assert!(files.len() <= 6, "{files:?}");
    let mut by_window: HashMap<String, Vec<String>> = HashMap::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let (service, window) = name
            .trim_start_matches("cpu-")
            .trim_end_matches(".pb.gz")
            .rsplit_once('-')
            .unwrap();
        by_window
            .entry(window.to_string())
            .or_default()
            .push(service.to_string());

        let stacks = raw_stacks(file);
        assert!(!stacks.is_empty(), "{name} is empty");
        // The last, partial window may hold a single sample: ask for a
        // frame every sample of the fixture has, not for hot_a.
        assert!(
            stacks.iter().any(|s| s.has("round_trip")),
            "{name}: {stacks:?}"
        );
        let expected_pid = if service == "svc-alpha" {
            alpha.pid()
        } else {
            beta.pid()
        };
        for stack in &stacks {
            assert_eq!(stack.labels["service_name"], service, "{name}");
            assert_eq!(stack.labels["pid"], expected_pid.to_string(), "{name}");
            assert_eq!(stack.labels["comm"], service, "{name}");
            assert_eq!(stack.labels["node"], "node-b", "{name}");
            assert!(stack.labels.contains_key("tid"));
            // Neither fixture runs in a container.
            assert!(!stack.labels.contains_key("container_id"), "{name}");
        }
        // go tool pprof reads each file (the last, partial window may hold
        // a single sample, so again a frame every sample has).
        let top = go_pprof(&["-top"], file);
        assert!(top.contains("round_trip"), "{top}");
    }
    let complete = by_window
        .values()
        .filter(|services| {
            services.len() == 2
                && services.contains(&"svc-alpha".to_string())
                && services.contains(&"svc-beta".to_string())
        })
        .count();
    assert!(
        complete >= 2,
        "windows should each hold one file per service: {by_window:?}"
    );
    assert!(by_window.values().all(|s| s.len() <= 2), "{by_window:?}");
}

#[test]
fn sigterm_delivers_the_partial_window_and_exits_0() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "last-window"), &[]);
    let out = dir.path().join("profiles");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &listen,
        "--window",
        "10m",
        "--directory-path",
        out.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    agent.wait_ready(port);
    std::thread::sleep(Duration::from_secs(3));
    assert!(pprof_files(&out).is_empty(), "no window can have ended yet");
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.success(), "exit status {status}:\n{}", agent.log());
    let files = pprof_files(&out);
    assert_eq!(files.len(), 1, "{files:?}");
    let profile = RawProfile::read(&files[0]);
    let stacks = profile.stacks();
    assert!(stacks.iter().any(|s| s.has("hot_a")), "{stacks:?}");
    // The window is the ~3 s the agent ran, not the 10 minutes configured.
    let seconds = profile.duration.as_secs_f64();
    assert!((2.5..20.0).contains(&seconds), "window of {seconds} s");
    // JSON logs: one object per line.
    let log = agent.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value["fields"]["message"].is_string(), "{line}");
    }
    assert!(log.contains("stopping"), "{log}");
}

/// A cgroup created for a test, removed (after its processes) when dropped.
struct TestCgroup {
    leaf: PathBuf,
    created: Vec<PathBuf>,
}

impl TestCgroup {
    fn create(root: &Path, relative: &str) -> TestCgroup {
        let mut created = Vec::new();
        let mut path = root.to_path_buf();
        for component in relative.split('/') {
            path.push(component);
            if !path.exists() {
                std::fs::create_dir(&path)
                    .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", path.display()));
                created.push(path.clone());
            }
        }
        TestCgroup {
            leaf: path,
            created,
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A cgroup can be removed once its processes are gone.
        let procs = self.leaf.join("cgroup.procs");
        wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(&procs)
                .map_or(true, |p| p.trim().is_empty())
                .then_some(())
        });
        for path in self.created.iter().rev() {
            let _ = std::fs::remove_dir(path);
        }
    }
}

/// Where the cgroup v2 hierarchy is: /sys/fs/cgroup on unified hosts,
/// /sys/fs/cgroup/unified on hybrid ones (this machine).
fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
        })
        .expect("a cgroup2 mount (the container test needs one)")
}

/// A stand-in Kubernetes API server: answers this node's pod list with
/// one pod holding `container_id`, and holds watches open (no events)
/// until dropped. Records each request's path and Authorization header.
struct FakeApiServer {
    port: u16,
    requests: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
}

/// A watch body that sends nothing until the server stops.
struct HeldOpen(Arc<AtomicBool>);

impl std::io::Read for HeldOpen {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        while !self.0.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(0)
    }
}

impl FakeApiServer {
    fn start(node: &str, pod_uid: &str, container_id: &str) -> FakeApiServer {
        let port = free_port();
        let server = tiny_http::Server::http(("127.0.0.1", port)).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        // As `kubectl get pods -o json` shows a Deployment's pod.
        let list = serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "4242"},
            "items": [{
                "metadata": {
                    "name": "checkout-7d4b9c8f6d-x2x9q",
                    "namespace": "shop",
                    "uid": pod_uid,
                    "labels": {"app.kubernetes.io/name": "checkout", "pod-template-hash": "7d4b9c8f6d"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "checkout-7d4b9c8f6d", "uid": "0b9d6f1e-0000-4000-8000-000000000001", "controller": true}]
                },
                "spec": {"nodeName": node, "containers": [{"name": "app", "image": "checkout:1"}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{
                        "name": "app",
                        "containerID": format!("containerd://{container_id}"),
                        "ready": true,
                        "restartCount": 0,
                        "image": "checkout:1",
                        "imageID": "sha256:00",
                        "state": {"running": {"startedAt": "2026-11-22T10:00:00Z"}}
                    }]
                }
            }]
        })
        .to_string();
        let (log, stopped) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok(Some(request)) = server.recv_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                let auth = request
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Authorization"))
                    .map(|h| h.value.to_string())
                    .unwrap_or_default();
                let url = request.url().to_string();
                log.lock().unwrap().push((url.clone(), auth));
                let json = "Content-Type: application/json"
                    .parse::<tiny_http::Header>()
                    .unwrap();
                if url.contains("watch=1") || url.contains("watch=true") {
                    let held = HeldOpen(stopped.clone());
                    std::thread::spawn(move || {
                        let response =
                            tiny_http::Response::new(200.into(), vec![json], held, None, None);
                        let _ = request.respond(response);
                    });
                } else {
                    let _ = request
                        .respond(tiny_http::Response::from_string(list.clone()).with_header(json));
                }
            }
        });
        FakeApiServer {
            port,
            requests,
            stop,
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_process_in_its_own_namespaces_and_kubelet_cgroup_is_attributed_to_its_container() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let hot = build_c_fixture("hot", C_FRAME_POINTER_FLAGS);
    let container_id = format!("{:016x}", std::process::id() as u64 * 7919).repeat(4);
    let pod_uid = format!("5e1c0a7b-2f4d-4c8e-9a6b-{:012x}", std::process::id());
    let cgroup = TestCgroup::create(
        &cgroup2_root(),
        &format!(
            "kubepods.slice/kubepods-pod{}.slice/cri-containerd-{container_id}.scope",
            pod_uid.replace('-', "_")
        ),
    );

    // Inside new mount and pid namespaces: join the cgroup, mount a
    // private tmpfs over an (on the host, empty) directory, copy the
    // binary there and exec it. The host never sees the binary's path.
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let script = format!(
        "echo $$ > {procs} && mount -t tmpfs tmpfs {root} && cp {hot} {root}/ctr-app && exec {root}/ctr-app",
        procs = cgroup.leaf.join("cgroup.procs").display(),
        root = rootfs.display(),
        hot = hot.display(),
    );
    let unshare = Running::start(
        Path::new("/usr/bin/unshare"),
        &[
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ],
    );
    // The containerized process: unshare's child, once it exec'd ctr-app.
    let children = format!("/proc/{}/task/{}/children", unshare.pid(), unshare.pid());
    let app_pid: u32 = wait_for(Duration::from_secs(10), || {
        let pid: u32 = std::fs::read_to_string(&children)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "ctr-app").then_some(pid)
    })
    .expect("the fixture did not start inside its namespaces");
    assert!(
        !rootfs.join("ctr-app").exists(),
        "the binary must exist only inside the container's mount namespace"
    );
    let cgroup_line = std::fs::read_to_string(format!("/proc/{app_pid}/cgroup")).unwrap();
    assert!(cgroup_line.contains(&container_id), "{cgroup_line}");

    // The API server knows the pod: names and the service come from it.
    let api = FakeApiServer::start("node-k", &pod_uid, &container_id);
    let token = dir.path().join("token");
    std::fs::write(&token, "sa-t0ken\n").unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let out = dir.path().join("profiles");
    let mut agent = AgentRun::start(&[
        "--pids",
        &app_pid.to_string(),
        "--listen",
        &listen,
        "--window",
        "2s",
        "--node",
        "node-k",
        "--directory-path",
        out.to_str().unwrap(),
        "--kubernetes-enabled",
        "on",
        "--kubernetes-api-url",
        &format!("http://127.0.0.1:{}", api.port),
        "--kubernetes-token-file",
        token.to_str().unwrap(),
        // Selected by its pod's namespace.
        "--namespaces",
        "shop",
    ]);
    agent.wait_ready(port);
    let pods_known = wait_for(Duration::from_secs(10), || {
        let text = metrics(port);
        (metric_value(&text, "profiler_agent_kubernetes_pods") == Some(1.0)).then_some(())
    });
    assert!(
        pods_known.is_some(),
        "the pod list was not read:\n{}",
        agent.log()
    );
    let (first_url, first_auth) = api.requests.lock().unwrap()[0].clone();
    assert!(
        first_url.starts_with("/api/v1/pods?") && first_url.contains("spec.nodeName%3Dnode-k"),
        "{first_url}"
    );
    assert_eq!(first_auth, "Bearer sa-t0ken");
    let (status, body) = http_get(
        port,
        "/debug/pprof/profile?seconds=3",
        Duration::from_secs(30),
    )
    .expect("a pull answers");
    assert_eq!(status, 200);
    let stacks = raw_stacks_of(&body);
    assert!(
        stacks.iter().any(|s| s.has("hot_a") && s.has("main")),
        "the containerized binary was not symbolized: {stacks:?}\n{}",
        agent.log()
    );
    for stack in &stacks {
        assert_eq!(stack.labels["container_id"], container_id);
        assert_eq!(stack.labels["pod_uid"], pod_uid);
        assert_eq!(stack.labels["namespace"], "shop");
        assert_eq!(stack.labels["pod"], "checkout-7d4b9c8f6d-x2x9q");
        assert_eq!(stack.labels["container"], "app");
        assert_eq!(stack.labels["service_name"], "checkout");
        assert_eq!(stack.labels["pid"], app_pid.to_string());
    }
    // The exported window carries it too, filed under the pod's service.
    let file = wait_for(Duration::from_secs(15), || pprof_files(&out).pop())
        .expect("a window was written");
    assert!(file.to_string_lossy().contains("cpu-checkout-"), "{file:?}");
    let written = stacks_of(&file);
    assert!(
        written
            .iter()
            .all(|s| s.labels["container_id"] == container_id)
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
    drop(unshare);
    // Killing unshare (--kill-child) takes the namespace's init with it.
    let gone = wait_for(Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{app_pid}")).exists()).then_some(())
    });
    assert!(
        gone.is_some(),
        "the containerized fixture outlived the test"
    );
    drop(cgroup);
}

fn stacks_of(file: &Path) -> Vec<Stack> {
    raw_stacks(file)
}

/// A Pyroscope-protocol receiver on 127.0.0.1 that can go down (its
/// listener closed: connection refused) and come back on the same port.
struct Receiver {
    pushes: Arc<Mutex<Vec<Push>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Clone)]
struct Push {
    labels: Vec<Vec<(String, String)>>,
    profiles: Vec<Vec<u8>>,
    ids: Vec<String>,
    headers: HashMap<String, String>,
}

impl Receiver {
    fn start(port: u16, pushes: Arc<Mutex<Vec<Push>>>) -> Receiver {
        let server = tiny_http::Server::http(("127.0.0.1", port)).expect("binding the receiver");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let store = pushes.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                let mut body = Vec::new();
                std::io::Read::read_to_end(request.as_reader(), &mut body).unwrap();
                let ok = request.method() == &tiny_http::Method::Post
                    && request.url() == "/push.v1.PusherService/Push";
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
                if ok {
                    let mut push = decode_push(&body);
                    push.headers = headers;
                    store.lock().unwrap().push(push);
                }
                let _ = request.respond(tiny_http::Response::empty(if ok { 200 } else { 404 }));
            }
        });
        Receiver {
            pushes,
            stop,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.pushes.lock().unwrap().len()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Decodes a push.v1.PushRequest from the wire format directly (not with
/// the agent's own message types), following push.proto's field numbers:
/// series = 1 { labels = 1 { name = 1, value = 2 }, samples = 2
/// { raw_profile = 1, ID = 2 } }.
fn decode_push(body: &[u8]) -> Push {
    let mut push = Push {
        labels: Vec::new(),
        profiles: Vec::new(),
        ids: Vec::new(),
        headers: HashMap::new(),
    };
    for (field, series) in fields(body) {
        assert_eq!(field, 1, "PushRequest has only `series` (1)");
        let mut labels = Vec::new();
        for (field, value) in fields(series) {
            match field {
                1 => {
                    let mut name = String::new();
                    let mut label_value = String::new();
                    for (f, v) in fields(value) {
                        let text = String::from_utf8(v.to_vec()).unwrap();
                        match f {
                            1 => name = text,
                            2 => label_value = text,
                            other => panic!("LabelPair field {other}"),
                        }
                    }
                    labels.push((name, label_value));
                }
                2 => {
                    for (f, v) in fields(value) {
                        match f {
                            1 => push.profiles.push(v.to_vec()),
                            2 => push.ids.push(String::from_utf8(v.to_vec()).unwrap()),
                            other => panic!("RawSample field {other}"),
                        }
                    }
                }
                other => panic!("RawProfileSeries field {other}"),
            }
        }
        push.labels.push(labels);
    }
    push
}

/// The length-delimited fields (wire type 2) of a protobuf message; every
/// field of these messages is one.
fn fields(mut bytes: &[u8]) -> Vec<(u64, &[u8])> {
    fn varint(bytes: &mut &[u8]) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let byte = bytes[0];
            *bytes = &bytes[1..];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes);
        assert_eq!(key & 7, 2, "field {} is not length-delimited", key >> 3);
        let len = varint(&mut bytes) as usize;
        out.push((key >> 3, &bytes[..len]));
        bytes = &bytes[len..];
    }
    out
}

#[test]
fn pyroscope_push_survives_a_backend_outage() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Running::start(&hot_named(dir.path(), "pushed-svc"), &[]);
    let receiver_port = free_port();
    let pushes = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(receiver_port, pushes.clone());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://127.0.0.1:{receiver_port}");
    let mut agent = AgentRun::start(&[
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &listen,
        "--window",
        "1s",
        "--node",
        "node-p",
        "--directory-path",
        "",
        "--pyroscope-url",
        &url,
        "--pyroscope-tenant-id",
        "team-a",
        "--pyroscope-bearer-token",
        "s3cret",
        "--pyroscope-timeout",
        "2s",
        "--pyroscope-queue-size",
        "2",
        "--pyroscope-max-attempts",
        "2",
    ]);
    agent.wait_ready(port);

    let first = wait_for(Duration::from_secs(20), || {
        pushes
            .lock()
            .unwrap()
            .iter()
            .find(|p| !p.profiles.is_empty())
            .cloned()
    })
    .unwrap_or_else(|| panic!("nothing pushed:\n{}", agent.log()));
    assert_eq!(
        first.headers.get("x-scope-orgid").map(String::as_str),
        Some("team-a")
    );
    assert_eq!(
        first.headers.get("authorization").map(String::as_str),
        Some("Bearer s3cret")
    );
    assert_eq!(
        first.headers.get("content-type").map(String::as_str),
        Some("application/proto")
    );
    let labels: HashMap<String, String> = first.labels[0].iter().cloned().collect();
    assert_eq!(labels["__name__"], "process_cpu");
    assert_eq!(labels["service_name"], "pushed-svc");
    assert_eq!(labels["node"], "node-p");
    assert_eq!(first.ids[0].len(), 36, "ID is a UUID: {:?}", first.ids);
    let stacks = raw_stacks_of(&first.profiles[0]);
    assert!(
        stacks.iter().any(|s| s.has("hot_a") && s.has("main")),
        "{stacks:?}"
    );
    assert!(
        stacks
            .iter()
            .all(|s| s.labels["service_name"] == "pushed-svc")
    );

    // Down for ~8 windows: queue of 2, so windows are dropped and counted.
    drop(receiver);
    let down_at = pushes.lock().unwrap().len();
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        agent.alive(),
        "the agent died while the backend was down:\n{}",
        agent.log()
    );
    let text = metrics(port);
    let dropped = metric_value(
        &text,
        "profiler_agent_export_dropped_total{exporter=\"pyroscope\"}",
    )
    .unwrap();
    let failures = metric_value(
        &text,
        "profiler_agent_export_failures_total{exporter=\"pyroscope\"}",
    )
    .unwrap();
    assert!(dropped >= 1.0, "no drop counted:\n{text}");
    assert!(failures >= 2.0, "no failure counted:\n{text}");
    assert_eq!(
        metric_value(&text, "profiler_agent_export_up{exporter=\"pyroscope\"}"),
        Some(0.0)
    );
    // Sampling went on meanwhile.
    assert!(metric_value(&text, "profiler_agent_windows_total").unwrap() >= 6.0);

    // Back on the same port: later windows arrive.
    let receiver = Receiver::start(receiver_port, pushes.clone());
    let resumed = wait_for(Duration::from_secs(40), || {
        (receiver.count() >= down_at + 2).then_some(())
    });
    assert!(
        resumed.is_some(),
        "no delivery after the backend came back:\n{}",
        agent.log()
    );
    let text = metrics(port);
    assert_eq!(
        metric_value(&text, "profiler_agent_export_up{exporter=\"pyroscope\"}"),
        Some(1.0)
    );
    let log = agent.log();
    // One line per state change, not one per failure.
    assert_eq!(log.matches("export failed").count(), 1, "{log}");
    assert_eq!(log.matches("delivering again").count(), 1, "{log}");

    // SIGTERM: the partial window is pushed before the agent exits 0.
    let before = receiver.count();
    assert!(agent.terminate(Duration::from_secs(20)).success());
    assert!(receiver.count() > before, "the last window was not pushed");
}

/// `kubernetes-validate` from the venv `cargo xtask setup --tests` makes.
fn kubernetes_validate() -> PathBuf {
    let bin = go_toolchain_root().join("kubernetes-validate/bin/kubernetes-validate");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask setup --tests`",
        bin.display()
    );
    bin
}

#[test]
fn deploy_manifests_are_valid_kubernetes_objects() {
    let deploy = workspace_root().join("deploy");
    let manifests: Vec<PathBuf> = {
        let mut files: Vec<PathBuf> = std::fs::read_dir(deploy.join("kubernetes"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        files
    };
    assert!(manifests.len() >= 4, "{manifests:?}");
    let validate = |files: &[PathBuf]| {
        Command::new(kubernetes_validate())
            .arg("--strict")
            .args(files)
            .stdin(Stdio::null())
            .output()
            .expect("running kubernetes-validate")
    };
    let output = validate(&manifests);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{report}");
    for kind in [
        "daemonset/profiler-agent",
        "serviceaccount/profiler-agent",
        "clusterrole/profiler-agent",
        "clusterrolebinding/profiler-agent",
        "configmap/profiler-agent",
        "clusterrole/profiler-agent-scraper",
        "networkpolicy/profiler-agent",
    ] {
        assert!(
            report.contains(&format!("passed for resource {kind}")),
            "{kind}: {report}"
        );
    }
    // The validator does reject a misspelt field (so the pass above means
    // something).
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("daemonset.yaml");
    let daemonset = std::fs::read_to_string(deploy.join("kubernetes/daemonset.yaml")).unwrap();
    assert!(daemonset.contains("hostPID: true"));
    std::fs::write(&broken, daemonset.replace("hostPID: true", "hostPid: true")).unwrap();
    assert!(!validate(&[broken]).status.success());

    // What the DaemonSet grants: host PIDs and exactly the capabilities
    // docs/security.md lists; through the API, reading pods, creating reviews of
    // its callers (which store nothing), and for scrapers `get` on the
    // endpoints (metrics, and the CPU, wall-clock and heap pulls).
    for capability in ["- BPF", "- PERFMON", "- SYS_PTRACE", "- SYS_RESOURCE"] {
        assert!(daemonset.contains(capability), "{capability}");
    }
    let rbac = std::fs::read_to_string(deploy.join("kubernetes/rbac.yaml")).unwrap();
    let verbs: Vec<&str> = rbac
        .lines()
        .filter(|l| l.contains("verbs:"))
        .map(str::trim)
        .collect();
    assert_eq!(
        verbs,
        [
            "verbs: [\"get\", \"list\", \"watch\"]",
            "verbs: [\"create\"]",
            "verbs: [\"create\"]",
            "verbs: [\"get\"]"
        ]
    );
    let resources: Vec<&str> = rbac
        .lines()
        .filter(|l| l.contains("resources:") || l.contains("nonResourceURLs:"))
        .map(str::trim)
        .collect();
    assert_eq!(
        resources,
        [
            "resources: [\"pods\"]",
            "resources: [\"tokenreviews\"]",
            "resources: [\"subjectaccessreviews\"]",
            "- nonResourceURLs: [\"/metrics\", \"/debug/pprof/profile\", \"/debug/pprof/wall\", \"/debug/pprof/heap\"]"
        ]
    );

    // The ConfigMap carries the example config (listening on all
    // interfaces, callers reviewed by the Kubernetes API), and the agent
    // accepts it.
    let python = go_toolchain_root().join("kubernetes-validate/bin/python");
    let extracted = Command::new(python)
        .args([
            "-c",
            "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['data']['config.toml'], end='')",
        ])
        .arg(deploy.join("kubernetes/configmap.yaml"))
        .output()
        .expect("running the venv's python");
    assert!(
        extracted.status.success(),
        "{}",
        String::from_utf8_lossy(&extracted.stderr)
    );
    let in_configmap = String::from_utf8(extracted.stdout).unwrap();
    let example = std::fs::read_to_string(deploy.join("config.example.toml")).unwrap();
    assert_eq!(
        in_configmap,
        example
            .replace("listen = \"127.0.0.1:6060\"", "listen = \"0.0.0.0:6060\"")
            .replace("\nkubernetes = false\n", "\nkubernetes = true\n")
    );
    let config = profiler_continuous::Config::from_toml(&in_configmap, Path::new("configmap"))
        .expect("the ConfigMap's config parses");
    config.validate().expect("and is valid");
    assert_eq!(config.listen, "0.0.0.0:6060");
}

#[test]
fn the_systemd_unit_verifies() {
    let deploy = workspace_root().join("deploy/systemd/profiler-agent.service");
    let unit = std::fs::read_to_string(&deploy).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let verify = |text: &str| {
        let path = dir.path().join("profiler-agent.service");
        // The unit names the installed path; point it at the built agent.
        std::fs::write(
            &path,
            text.replace(
                "/usr/local/bin/profiler-agent",
                agent_bin().to_str().unwrap(),
            ),
        )
        .unwrap();
        let output = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .expect("running systemd-analyze (Debian `systemd`: `cargo xtask setup --tests`)");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, stderr) = verify(&unit);
    assert!(ok && stderr.trim().is_empty(), "{stderr}");
    let (_, stderr) = verify(&unit.replace("TimeoutStopSec=", "TimeoutStopSecs="));
    assert!(stderr.contains("Unknown key"), "{stderr}");
}

/// One recorded request: path, headers (lower-case names), body.
type Recorded = (String, HashMap<String, String>, Vec<u8>);

/// A one-request-at-a-time HTTPS receiver (rustls) with a certificate from
/// a throwaway CA: records each request's path, headers and body.
struct TlsReceiver {
    port: u16,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsReceiver {
    fn start(cert: &Path, key: &Path) -> TlsReceiver {
        use rustls_pki_types::pem::PemObject;
        let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(cert)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (store, stopped) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok((tcp, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                tcp.set_nonblocking(false).unwrap();
                tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, tcp);
                // A failed handshake (the agent without our CA) ends here.
                if let Some(request) = read_request(&mut tls) {
                    store.lock().unwrap().push(request);
                    let _ = std::io::Write::write_all(
                        &mut tls,
                        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    tls.conn.send_close_notify();
                    let _ = std::io::Write::flush(&mut tls);
                }
            }
        });
        TlsReceiver {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one HTTP/1.1 request with a Content-Length body.
fn read_request(stream: &mut impl std::io::Read) -> Option<Recorded> {
    let mut data = Vec::new();
    let mut buffer = [0u8; 16384];
    let head_end = loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut buffer).ok().filter(|&n| n > 0)?;
        data.extend_from_slice(&buffer[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split_whitespace().nth(1)?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = data[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut buffer).ok().filter(|&n| n > 0)?;
        body.extend_from_slice(&buffer[..n]);
    }
    Some((path, headers, body))
}

#[test]
fn pyroscope_over_tls_trusts_the_configured_ca_only() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = make_certificates(dir.path());
    let receiver = TlsReceiver::start(&cert, &key);
    let fixture = Running::start(&hot_named(dir.path(), "tls-svc"), &[]);
    let pid = fixture.pid().to_string();
    let url = format!("https://127.0.0.1:{}", receiver.port);
    let run = |extra: &[&str]| {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--pids",
            &pid,
            "--listen",
            &listen,
            "--window",
            "1s",
            "--pyroscope-url",
            &url,
            "--pyroscope-basic-auth-username",
            "user",
            "--pyroscope-basic-auth-password",
            "pa:ss",
        ];
        args.extend(extra);
        let mut agent = AgentRun::start(&args);
        agent.wait_ready(port);
        (agent, port)
    };

    // Without the CA the server's certificate is not trusted: failures,
    // nothing delivered.
    let (mut agent, port) = run(&[]);
    let failed = wait_for(Duration::from_secs(20), || {
        metric_value(
            &metrics(port),
            "profiler_agent_export_failures_total{exporter=\"pyroscope\"}",
        )
        .filter(|&v| v >= 1.0)
    });
    assert!(failed.is_some(), "{}", agent.log());
    assert!(agent.log().contains("export failed"), "{}", agent.log());
    assert_eq!(
        metric_value(
            &metrics(port),
            "profiler_agent_export_success_total{exporter=\"pyroscope\"}"
        ),
        Some(0.0)
    );
    assert!(receiver.requests.lock().unwrap().is_empty());
    assert!(agent.terminate(Duration::from_secs(20)).success());

    // With it: delivered, with basic auth.
    let (mut agent, _port) = run(&["--pyroscope-ca-file", ca.to_str().unwrap()]);
    let request = wait_for(Duration::from_secs(20), || {
        receiver.requests.lock().unwrap().first().cloned()
    })
    .unwrap_or_else(|| panic!("nothing arrived over TLS:\n{}", agent.log()));
    let (path, headers, body) = request;
    assert_eq!(path, "/push.v1.PusherService/Push");
    // base64("user:pa:ss")
    assert_eq!(headers["authorization"], "Basic dXNlcjpwYTpzcw==");
    let push = decode_push(&body);
    let labels: HashMap<String, String> = push.labels[0].iter().cloned().collect();
    assert_eq!(labels["service_name"], "tls-svc");
    assert!(
        raw_stacks_of(&push.profiles[0])
            .iter()
            .any(|s| s.has("hot_a"))
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// Unwind tables of binaries no process maps any more leave the BPF row
/// array at the next window boundary, so a long run over many short-lived
/// Go binaries does not fill it.
#[test]
fn unwind_rows_of_exited_go_processes_are_freed() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("unwind-go");
    go_command(
        &go_toolchain("1.19"),
        &workspace_root().join("tests/fixtures/go-unwind"),
        &["build", "-o", binary.to_str().unwrap(), "."],
        &[],
    );
    let go = Running::start(&binary, &["sha256", "60"]);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &go.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--directory-path",
        "",
        "--unwind-table-mib",
        "8",
    ]);
    agent.wait_ready(port);
    let gauge = |name: &str| metric_value(&metrics(port), name).unwrap_or(-1.0);
    let loaded = wait_for(Duration::from_secs(15), || {
        let rows = gauge("profiler_agent_bpf_unwind_rows_used");
        (rows > 0.0 && gauge("profiler_agent_bpf_unwind_processes") == 1.0).then_some(rows)
    });
    let rows = loaded.unwrap_or_else(|| panic!("no Go table loaded:\n{}", metrics(port)));
    // 8 MiB of 4-byte rows, as configured.
    assert_eq!(
        gauge("profiler_agent_bpf_unwind_rows_capacity"),
        f64::from(2u32 << 20)
    );
    drop(go);
    let freed = wait_for(Duration::from_secs(15), || {
        (gauge("profiler_agent_bpf_unwind_rows_used") == 0.0
            && gauge("profiler_agent_bpf_unwind_processes") == 0.0)
            .then_some(())
    });
    assert!(
        freed.is_some(),
        "{rows} rows still in use after the process exited:\n{}",
        metrics(port)
    );
    assert_eq!(gauge("profiler_agent_unwind_tables_dropped_total"), 0.0);
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// A pull longer than a window keeps what it needs of a process that
/// exited meanwhile: the window boundary evicts exited processes, but not
/// those an open pull still holds stacks of.
#[test]
fn a_long_pull_symbolizes_a_process_that_exited_before_it_ended() {
    let _serial = serial();
    require_bpf_privileges();
    // Built (if it must be) before the short-lived process starts.
    agent_bin();
    let dir = tempfile::tempdir().unwrap();
    let short = Running::start(&hot_named(dir.path(), "short-lived"), &["3"]);
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &short.pid().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--directory-path",
        "",
    ]);
    agent.wait_ready(port);
    // The pull spans several windows; the process exits after ~3 s (the
    // agent is ready well before) and is reaped at once, so /proc forgets
    // it while the pull is open.
    let waiter = std::thread::spawn(move || short.wait());
    let (status, body) = http_get(
        port,
        "/debug/pprof/profile?seconds=6",
        Duration::from_secs(30),
    )
    .expect("the pull answers");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(waiter.join().unwrap().success());
    let stacks = raw_stacks_of(&body);
    assert!(
        stacks.iter().any(|s| s.has("hot_a") && s.has("main")),
        "the exited process's stacks lost their symbols: {stacks:?}\n{}\n{}",
        agent.log(),
        http_get(port, "/metrics", Duration::from_secs(5))
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("profiler_agent_kernel")
                || l.starts_with("profiler_agent_samples"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        stacks
            .iter()
            .all(|s| s.labels["service_name"] == "short-lived"),
        "{stacks:?}"
    );
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// `cgroups` keeps only processes under the given cgroup paths: of two
/// busy processes, the one moved into a test cgroup is profiled, the
/// other's samples are counted as unselected and never symbolized.
#[test]
fn a_cgroup_selection_keeps_only_its_processes() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let inside = Running::start(&hot_named(dir.path(), "in-cgroup"), &[]);
    let outside = Running::start(&hot_named(dir.path(), "out-of-cgroup"), &[]);
    let cgroup = TestCgroup::create(
        &cgroup2_root(),
        &format!("profiler-test-{}.slice/selected.scope", std::process::id()),
    );
    std::fs::write(cgroup.leaf.join("cgroup.procs"), inside.pid().to_string()).unwrap();
    let line = std::fs::read_to_string(format!("/proc/{}/cgroup", inside.pid())).unwrap();
    let path = line
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a unified cgroup line")
        .to_string();
    // The parent slice selects the scope below it.
    let slice = path.rsplit_once('/').unwrap().0.to_string();
    let port = free_port();
    let mut agent = AgentRun::start(&[
        "--pids",
        &format!("{},{}", inside.pid(), outside.pid()),
        "--cgroups",
        &slice,
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "1s",
        "--directory-path",
        "",
    ]);
    agent.wait_ready(port);
    let (status, body) = http_get(
        port,
        "/debug/pprof/profile?seconds=2",
        Duration::from_secs(30),
    )
    .expect("a pull answers");
    assert_eq!(status, 200);
    let stacks = raw_stacks_of(&body);
    assert!(stacks.iter().any(|s| s.has("hot_a")), "{stacks:?}");
    for stack in &stacks {
        assert_eq!(stack.labels["pid"], inside.pid().to_string(), "{stack:?}");
    }
    let unselected = metric_value(&metrics(port), "profiler_agent_samples_unselected_total");
    assert!(unselected.is_some_and(|v| v > 0.0), "{}", metrics(port));
    assert!(agent.terminate(Duration::from_secs(20)).success());
    drop(inside);
    drop(outside);
    drop(cgroup);
}

/// A worker thread of the `lifetimes` fixture: its tid, and when it was
/// born and died (unix nanoseconds, its own clock).
#[derive(Debug, Clone, Copy)]
struct Lifetime {
    tid: u32,
    born: i64,
    died: i64,
}

impl Lifetime {
    /// Nanoseconds of [start, end] it was alive.
    fn overlap(&self, start: i64, end: i64) -> i64 {
        (self.died.min(end) - self.born.max(start)).max(0)
    }
}

/// The fixture's line: "TID:BORN:DIED" per worker.
fn lifetimes(line: &str) -> Vec<Lifetime> {
    line.split_whitespace()
        .map(|worker| {
            let parts: Vec<&str> = worker.split(':').collect();
            assert_eq!(parts.len(), 3, "not TID:BORN:DIED: {line:?}");
            Lifetime {
                tid: parts[0].parse().unwrap(),
                born: parts[1].parse().unwrap(),
                died: parts[2].parse().unwrap(),
            }
        })
        .collect()
}

fn unix_ns(time: std::time::SystemTime) -> i64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn seconds(ns: i64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// How far a window's samples can be from its boundaries: the ring
/// buffer is read every 100 ms, and a sample belongs to the window open
/// when it is read. Windows and pulls are compared with the fixture's
/// threads only where their lifetimes are this far from the edges; the
/// sum over windows has no edges.
const DRAIN_SLACK_NS: i64 = 500_000_000;

/// `wall = true`: each window's `wall` profile gives each thread of the
/// `lifetimes` fixture (workers that alternate 3 ms of CPU and 2 ms
/// asleep, started and ended on a schedule, each reading the wall clock
/// at birth and death) the time it was alive in that window, read with
/// `go tool pprof -raw`: about the whole window for a thread alive
/// throughout it, nothing for one not yet born or dead, its lifetime over
/// all windows; no thread more than the window (the main thread waits in
/// pthread_join for longer than a window: the cap of `profiler-continuous`
/// `wall.rs`). `/debug/pprof/wall` does the same over its seconds,
/// Pyroscope gets a `wall` series, and the CPU profile stays CPU only.
#[test]
fn wall_clock_windows_give_each_thread_its_time_alive() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("lifetimes-svc");
    std::fs::copy(build_c_fixture("lifetimes", C_FRAME_POINTER_FLAGS), &binary).unwrap();
    let mut fixture = Gated::start(&binary, &[]);
    let pid = fixture.pid();
    let receiver_port = free_port();
    let pushes = Arc::new(Mutex::new(Vec::new()));
    let _receiver = Receiver::start(receiver_port, pushes.clone());
    let port = free_port();
    let profiles = dir.path().join("profiles");
    let mut agent = AgentRun::start(&[
        "--pids",
        &pid.to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--window",
        "3s",
        "--wall",
        "true",
        // Every wait of the fixture (2 ms) recorded as it was, none drawn.
        "--off-cpu-period",
        "1ms",
        // Prime to the fixture's 5 ms cycle: CPU samples count its CPU
        // time (at 100 Hz they beat against it).
        "--frequency-hz",
        "997",
        "--directory-path",
        profiles.to_str().unwrap(),
        "--pyroscope-url",
        &format!("http://127.0.0.1:{receiver_port}"),
    ]);
    agent.wait_ready(port);

    // The fixture runs 9 s; a pull of 3 wall-clock seconds starts half a
    // second in: the short-lived worker (1.5 s to 2.7 s) lives inside it.
    let gated = unix_ns(std::time::SystemTime::now());
    let running = std::thread::spawn(move || {
        let line = fixture.run_to_gate();
        (fixture, line)
    });
    std::thread::sleep(Duration::from_millis(500));
    let sent = unix_ns(std::time::SystemTime::now());
    let (status, body) = http_get(
        port,
        &format!("/debug/pprof/wall?seconds=3&pid={pid}"),
        Duration::from_secs(60),
    )
    .expect("the wall-clock pull answers");
    let received = unix_ns(std::time::SystemTime::now());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (fixture, line) = running.join().unwrap();
    let workers = lifetimes(&line);
    assert_eq!(workers.len(), 3, "{line}");
    assert!(agent.terminate(Duration::from_secs(20)).success());
    assert!(fixture.finish().success());
    let log = agent.log();

    // The pull: the long worker alive all along, the short one born and
    // dead within it.
    let pulled = RawProfile::of_bytes(&body);
    assert!(
        pulled
            .sample_types
            .contains(&"wall/nanoseconds".to_string()),
        "{:?}",
        pulled.sample_types
    );
    let by_tid = windows::totals_by(&pulled, "wall/nanoseconds", "tid");
    let span = pulled.duration.as_nanos() as i64;
    let (long, short) = (workers[0], workers[1]);
    assert!(
        long.born < sent && long.died > received,
        "the pull ({}..{}) is not inside the long worker's life {long:?} (gate {gated})",
        sent,
        received
    );
    assert!(
        short.born > sent + DRAIN_SLACK_NS && short.died < received - DRAIN_SLACK_NS,
        "the short worker {short:?} did not live inside the pull ({sent}..{received})"
    );
    for (worker, expected) in [(long, span), (short, short.died - short.born)] {
        let got = by_tid.get(&worker.tid.to_string()).copied().unwrap_or(0);
        assert!(
            (got - expected).abs() as f64 <= 0.10 * expected as f64,
            "pull of {}: thread {} has {} of wall-clock time, alive {} of it\n{by_tid:?}",
            seconds(span),
            worker.tid,
            seconds(got),
            seconds(expected)
        );
    }

    // The windows.
    let windows = window_files(&profiles, "wall", "lifetimes-svc");
    assert!(windows.len() >= 3, "{} wall windows:\n{log}", windows.len());
    let mut covered = 0;
    for window in &windows {
        assert_eq!(
            window.profile.sample_types,
            ["samples/count", "wall/nanoseconds"],
            "{}",
            window.path.display()
        );
        let by_tid = window.totals_by("wall/nanoseconds", "tid");
        let length = window.duration.as_nanos() as i64;
        // No thread (the main one included) has more time than the window.
        for (tid, ns) in &by_tid {
            assert!(
                *ns as f64 <= 1.10 * length as f64,
                "{}: thread {tid} has {} of a {} window",
                window.path.display(),
                seconds(*ns),
                seconds(length)
            );
        }
        for worker in &workers {
            let got = by_tid.get(&worker.tid.to_string()).copied().unwrap_or(0);
            let (start, end) = (window.start_ns, window.end_ns());
            if worker.born < start - DRAIN_SLACK_NS && worker.died > end + DRAIN_SLACK_NS {
                covered += 1;
                assert!(
                    (got - length).abs() as f64 <= 0.10 * length as f64,
                    "{}: thread {}, alive throughout, has {} of a {} window",
                    window.path.display(),
                    worker.tid,
                    seconds(got),
                    seconds(length)
                );
            }
            if worker.died < start - DRAIN_SLACK_NS || worker.born > end + DRAIN_SLACK_NS {
                assert_eq!(
                    got,
                    0,
                    "{}: thread {} has time in a window it did not live in",
                    window.path.display(),
                    worker.tid
                );
            }
        }
    }
    assert!(
        covered >= 1,
        "no window inside a worker's life: {:?}",
        windows
            .iter()
            .map(|w| (w.start_ns, w.end_ns()))
            .collect::<Vec<_>>()
    );
    for worker in &workers {
        let total: i64 = windows
            .iter()
            .map(|w| {
                w.totals_by("wall/nanoseconds", "tid")
                    .get(&worker.tid.to_string())
                    .copied()
                    .unwrap_or(0)
            })
            .sum();
        let lived = worker.died - worker.born;
        assert!(
            (total - lived).abs() as f64 <= 0.10 * lived as f64,
            "thread {} has {} over the windows, alive {}",
            worker.tid,
            seconds(total),
            seconds(lived)
        );
        let windows_alive: i64 = windows
            .iter()
            .map(|w| worker.overlap(w.start_ns, w.end_ns()))
            .sum();
        assert!(windows_alive > 0, "{worker:?} outside every window");
    }

    // The CPU profile beside it stays CPU only.
    for window in window_files(&profiles, "cpu", "lifetimes-svc") {
        assert_eq!(
            window.profile.sample_types,
            ["samples/count", "cpu/nanoseconds"]
        );
        assert!(
            window
                .profile
                .samples
                .iter()
                .all(|s| !s.labels.contains_key("wait")),
            "{}: off-CPU samples in the CPU profile",
            window.path.display()
        );
    }
    // Pyroscope: a `wall` series of the service, holding wall-clock time.
    let pushes = pushes.lock().unwrap();
    let wall = pushes
        .iter()
        .flat_map(|p| p.labels.iter().zip(&p.profiles))
        .find(|(labels, _)| {
            labels.contains(&("__name__".into(), "wall".into()))
                && labels.contains(&("service_name".into(), "lifetimes-svc".into()))
        })
        .unwrap_or_else(|| panic!("no wall series pushed:\n{log}"));
    let pushed = RawProfile::of_bytes(wall.1);
    assert!(
        pushed
            .sample_types
            .contains(&"wall/nanoseconds".to_string())
    );
}

/// `page_faults = true`: beside each service's CPU profile, a
/// `page_faults` profile per window (one sample per 64 faults) that splits
/// the `touch` fixture's first touches 3 to 1 between its two call chains,
/// as the fixture is built to.
#[test]
fn page_fault_windows_show_where_memory_grows() {
    let _serial = serial();
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let touch = build_c_fixture("touch", &["-O2", "-g", "-fomit-frame-pointer"]);
    let running = Running::start(&touch, &["60"]);
    let out = dir.path().join("profiles");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--pids",
        &running.pid().to_string(),
        "--listen",
        &listen,
        "--window",
        "2s",
        "--page-faults",
        "true",
        "--directory-path",
        out.to_str().unwrap(),
    ]);
    agent.wait_ready(port);
    let started = Instant::now();
    let named = |prefix: &str| -> Vec<PathBuf> {
        pprof_files(&out)
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect()
    };
    while named("page_faults-").len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no page-fault windows: {:?}",
            pprof_files(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(agent.terminate(Duration::from_secs(20)).success());
    assert!(!named("cpu-").is_empty(), "the CPU profile is still there");
    let (mut big, mut small, mut total) = (0, 0, 0);
    for file in named("page_faults-") {
        let top = go_pprof(&["-top"], &file);
        assert!(top.contains("Type: page_faults"), "{top}");
        for stack in raw_stacks(&file) {
            total += stack.count;
            if stack.has("grow_big") {
                big += stack.count;
            }
            if stack.has("grow_small") {
                small += stack.count;
            }
        }
    }
    println!("{total} page-fault samples: grow_big {big}, grow_small {small}");
    assert!(total >= 300, "{total} samples");
    assert!(
        big + small >= total * 95 / 100,
        "{big} + {small} of {total}"
    );
    if let Err(why) = profiler_tests::shares::share_near(
        "grow_big",
        profiler_tests::shares::Share::of(big, big + small),
        0.75,
        0.0,
        0.05,
    ) {
        panic!("{why} (grow_big touches 3 MiB for grow_small's 1)");
    }
}

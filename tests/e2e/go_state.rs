//! The Go runtime's own state, read from outside: `profiler-agent heap`
//! and `profiler-agent goroutines` against what the program itself writes
//! at the same instant (`pprof.WriteHeapProfile`, the goroutine profile's
//! `debug=2` dump and `debug=0` profile), on every toolchain the tests
//! install, and on stripped and PIE builds whose runtime variables are
//! found from code alone.
//!
//! The fixture (tests/fixtures/go_state) allocates at known sites, parks
//! goroutines in known states (channel receive, mutex, sleep, select, a
//! system call, locked to its thread, under pprof labels), runs with
//! GOGC=off and one explicit GC so nothing moves, writes its own views,
//! then the file `ready`, and waits.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use profiler_tests::go_state::{by_leaf, dump_by_goroutine, nonzero};
use profiler_tests::pprof_raw::RawProfile;
use profiler_tests::{agent::*, go::*, http::*, processes::*};

/// A build of the fixture: toolchain, flags and environment.
struct Build {
    version: &'static str,
    name: &'static str,
    flags: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// `runtime.MemProfileRate` the program sets (None: Go's default,
    /// 512 KiB).
    rate: Option<&'static str>,
}

const PLAIN: &[&str] = &[];
const STRIPPED: &[&str] = &["-ldflags=-s -w"];
const STRIPPED_PIE: &[&str] = &["-ldflags=-s -w", "-buildmode=pie"];
/// cgo: the runtime's threads are the C library's, the binary linked by
/// the system linker (its own section layout and symbol table).
const CGO: &[&str] = &["-ldflags=-linkmode=external"];
const CGO_STRIPPED: &[&str] = &["-ldflags=-linkmode=external -s -w"];
const NO_ENV: &[(&str, &str)] = &[];
const CGO_ENV: &[(&str, &str)] = &[("CGO_ENABLED", "1")];

const fn build(version: &'static str, rate: Option<&'static str>) -> Build {
    Build {
        version,
        name: "plain",
        flags: PLAIN,
        env: NO_ENV,
        rate,
    }
}

/// Every toolchain, plain; stripped, PIE and cgo builds of the oldest and
/// newest layouts. Some sample every allocation, some at Go's default.
const BUILDS: &[Build] = &[
    build("1.19", None),
    build("1.21.13", Some("1")),
    build("1.22.10", None),
    build("1.23.9", Some("1")),
    build("1.24.11", Some("1")),
    build("1.25.5", None),
    build("1.26.6", Some("1")),
    build("1.27.3", Some("1")),
    Build {
        name: "stripped",
        flags: STRIPPED,
        ..build("1.19", Some("1"))
    },
    Build {
        name: "stripped-pie",
        flags: STRIPPED_PIE,
        ..build("1.27.3", None)
    },
    Build {
        name: "stripped-pie",
        flags: STRIPPED_PIE,
        ..build("1.23.9", Some("1"))
    },
    Build {
        name: "cgo",
        flags: CGO,
        env: CGO_ENV,
        ..build("1.21.13", Some("1"))
    },
    Build {
        name: "cgo-stripped",
        flags: CGO_STRIPPED,
        env: CGO_ENV,
        ..build("1.27.3", Some("1"))
    },
];

/// The fixture, built and settled, with its own views in `dir`.
struct Settled {
    process: Running,
    dir: tempfile::TempDir,
    label: String,
}

impl Settled {
    fn start(build: &Build) -> Settled {
        Settled::start_with(build, &[], &[])
    }

    /// The fixture with more arguments (after its directory) and
    /// environment.
    fn start_with(build: &Build, args: &[&str], env: &[(&str, &str)]) -> Settled {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir
            .path()
            .join(format!("state-{}-{}", build.version, build.name));
        let mut build_args = vec!["build", "-o", binary.to_str().unwrap()];
        build_args.extend(build.flags);
        build_args.push(".");
        go_command(
            &go_toolchain(build.version),
            &workspace_root().join("tests/fixtures/go_state"),
            &build_args,
            build.env,
        );
        let mut command = std::process::Command::new(&binary);
        command
            .arg(dir.path())
            .args(args)
            .env("GOGC", "off")
            .envs(env.iter().copied());
        if let Some(rate) = build.rate {
            command.env("RATE", rate);
        }
        let process = Running::spawn(command);
        let ready = dir.path().join("ready");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "the fixture never wrote {}",
                ready.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Settled {
            process,
            dir,
            label: format!("Go {} {}", build.version, build.name),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pid(&self) -> String {
        self.process.pid().to_string()
    }
}

#[test]
fn heap_profile_matches_the_programs_own() {
    for build in BUILDS {
        let settled = Settled::start(build);
        let ours = settled.path("ours.pb.gz");
        let report = record(&[
            "heap",
            "--pid",
            &settled.pid(),
            "-o",
            ours.to_str().unwrap(),
        ]);
        let theirs = RawProfile::read(&settled.path("heap.pb.gz"));
        let ours_raw = RawProfile::read(&ours);
        let label = &settled.label;
        assert_eq!(
            ours_raw.sample_types, theirs.sample_types,
            "{label}: sample types\n{report}"
        );
        assert_eq!(
            ours_raw.period, theirs.period,
            "{label}: period (MemProfileRate)"
        );
        // alloc_objects, alloc_space, inuse_objects, inuse_space per
        // allocating function of the program: the same numbers (the
        // program's own profile and ours read the same records; GOGC=off
        // keeps them still).
        // At rate 1 every allocation is recorded, and every site must be
        // there. At Go's default rate (one sample per 512 KiB on average)
        // even the largest site goes unsampled now and then (one CI run:
        // main.cacheResponse missing from ours; the program's own profile
        // was not shown), so there a site is required where the program's
        // own profile has it, and at least one must be; the comparison
        // below holds either way.
        let sites = [
            "main.cacheResponse",
            "main.addEntries",
            "main.renderPage",
            "main.newBuffer",
        ];
        for index in 0..4 {
            let (a, b) = (by_leaf(&ours_raw, index), by_leaf(&theirs, index));
            let required: Vec<&str> = sites
                .into_iter()
                .filter(|site| build.rate == Some("1") || b.contains_key(*site))
                .collect();
            assert!(
                !required.is_empty(),
                "{label}: none of {sites:?} in the program's own profile: {b:?}"
            );
            assert!(
                required.iter().all(|site| a.contains_key(*site)),
                "{label}: allocation sites missing from ours: {a:?}\n{report}"
            );
            assert_eq!(
                nonzero(a),
                nonzero(b),
                "{label}: {} by function, ours then the program's",
                theirs.sample_types[index]
            );
        }
        // The inlined allocation keeps its caller as a line of the same
        // location, as in the program's profile.
        if build.rate == Some("1") {
            let inlined = ours_raw
                .lined_stacks()
                .into_iter()
                .find(|s| {
                    s.frames
                        .first()
                        .is_some_and(|(l, _)| l.function == "main.newBuffer")
                })
                .unwrap_or_else(|| panic!("{label}: no stack allocates in main.newBuffer"));
            let names: Vec<&str> = inlined
                .frames
                .iter()
                .map(|(l, _)| l.function.as_str())
                .collect();
            assert_eq!(
                &names[..3],
                ["main.newBuffer", "main.bufferRequests", "main.main"],
                "{label}: the inlined allocation's stack"
            );
        }
        assert!(report.contains("in use"), "{label}: {report}");
    }
}

#[test]
fn goroutine_dump_matches_debug_2() {
    for build in BUILDS {
        let settled = Settled::start(build);
        // Read while it runs, and (two of the builds) stopped.
        let stop = build.version == "1.21.13" || build.name == "stripped-pie";
        let pid = settled.pid();
        let mut args = vec!["goroutines", "--pid", pid.as_str()];
        if stop {
            args.push("--stop");
        }
        let output = run_agent(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{}: {stderr}", settled.label);
        let ours = dump_by_goroutine(&String::from_utf8_lossy(&output.stdout));
        let theirs =
            dump_by_goroutine(&std::fs::read_to_string(settled.path("goroutines.txt")).unwrap());
        let label = &settled.label;
        // Every goroutine but main (which wrote its dump while running and
        // sleeps now) parked for good before the program wrote its dump.
        let mut compared = 0;
        for (id, text) in &theirs {
            if *id == 1 {
                continue;
            }
            let mine = ours.get(id).unwrap_or_else(|| {
                panic!("{label}: goroutine {id} is missing from ours:\n{stderr}")
            });
            assert_eq!(
                mine, text,
                "{label}: goroutine {id}, ours then the program's"
            );
            compared += 1;
        }
        assert_eq!(compared, 9, "{label}: goroutines compared: {theirs:#?}");
        assert!(ours.contains_key(&1), "{label}: the main goroutine");
        assert!(stderr.contains(": 10 goroutines ("), "{label}: {stderr}");
    }
}

#[test]
fn goroutine_profile_counts_as_the_programs() {
    for build in &BUILDS[..1] {
        let settled = Settled::start(build);
        let ours = settled.path("ours-goroutines.pb.gz");
        record(&[
            "goroutines",
            "--pid",
            &settled.pid(),
            "-o",
            ours.to_str().unwrap(),
        ]);
        let count = |profile: &RawProfile,
                     pick: &dyn Fn(&profiler_tests::pprof_raw::LinedStack) -> bool|
         -> i64 {
            profile
                .lined_stacks()
                .iter()
                .filter(|s| pick(s))
                .map(|s| s.count)
                .sum()
        };
        let (ours, theirs) = (
            RawProfile::read(&ours),
            RawProfile::read(&settled.path("goroutines.pb.gz")),
        );
        assert_eq!(ours.sample_types, theirs.sample_types);
        let waiting = |s: &profiler_tests::pprof_raw::LinedStack| {
            s.frames
                .iter()
                .any(|(l, _)| l.function == "main.waitForWork")
        };
        assert_eq!(
            count(&ours, &waiting),
            count(&theirs, &waiting),
            "goroutines in main.waitForWork"
        );
        assert_eq!(count(&ours, &waiting), 5);
        let labelled = |s: &profiler_tests::pprof_raw::LinedStack| {
            s.labels.get("endpoint").map(String::as_str) == Some("/checkout")
                && s.labels.get("tenant").map(String::as_str) == Some("a b")
        };
        assert_eq!(
            count(&ours, &labelled),
            1,
            "the goroutine started under pprof.Do"
        );
        assert_eq!(count(&theirs, &labelled), 1);
        // Runtime frames are kept, as in Go's own goroutine profile.
        let parked = ours
            .lined_stacks()
            .into_iter()
            .find(|s| waiting(s))
            .unwrap();
        assert!(
            parked
                .frames
                .iter()
                .any(|(l, _)| l.function == "runtime.gopark"),
            "{:?}",
            parked.frames
        );
    }
}

#[test]
fn a_program_without_memory_profiling_is_told_so() {
    // The plain Go fixture references no heap profile: the linker turned
    // memory profiling off.
    let binary = build_go_fixture("1.27.3", "nopprof", &[], &[]);
    let process = Running::start(&binary, &[]);
    let output = run_agent(&[
        "heap",
        "--pid",
        &process.pid().to_string(),
        "-o",
        "/tmp/unused.pb.gz",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("memory profiling is disabled in this binary"),
        "{stderr}"
    );
    // Turned on on request, it says what it did, and records from then.
    let output = run_agent(&[
        "heap",
        "--pid",
        &process.pid().to_string(),
        "--set-mem-profile-rate",
        "1",
        "-o",
        "/tmp/unused.pb.gz",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("set runtime.MemProfileRate of process") && stderr.contains("from 0 to 1"),
        "{stderr}"
    );
    assert!(stderr.contains("sampled every 1 B allocated"), "{stderr}");
    // Its goroutines are still there to read.
    let output = run_agent(&["goroutines", "--pid", &process.pid().to_string()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Its main goroutine computes: running, on a thread of the process.
    assert!(stdout.starts_with("goroutine 1 [running]:\n"), "{stdout}");
    let thread = stdout
        .split("(thread ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no thread named: {stdout}"));
    let tasks = format!("/proc/{}/task/{thread}", process.pid());
    assert!(
        Path::new(&tasks).exists(),
        "thread {thread} is not one of the process's: {stdout}"
    );
    // Stopped, its running goroutine's stack comes from its thread's
    // registers; then it runs on (not left in a ptrace stop).
    let output = run_agent(&["goroutines", "--pid", &process.pid().to_string(), "--stop"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("stopped process {}", process.pid())),
        "{stderr}"
    );
    assert!(stdout.starts_with("goroutine 1 [running]:\n"), "{stdout}");
    assert!(
        stdout.contains("main.main(...)\n\t") && stdout.contains("main.hot"),
        "{stdout}"
    );
    std::thread::sleep(Duration::from_millis(200));
    for task in std::fs::read_dir(format!("/proc/{}/task", process.pid())).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let state = status.lines().find(|l| l.starts_with("State:")).unwrap();
        assert!(
            !state.contains("tracing stop"),
            "a thread is left stopped: {state}"
        );
        assert!(status.contains("TracerPid:\t0"), "a thread is left traced");
    }
}

/// A Go program that forges its own runtime state (one parked
/// goroutine's stack bounds claim 4 GiB; Go allows 1 GB): the dump counts
/// it as malformed, not as changed while read, shows the others, and the
/// program lives on. `tests/fixtures/go_forged`.
#[test]
#[cfg(target_arch = "x86_64")]
fn a_goroutine_with_impossible_values_is_counted_as_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("goforged");
    go_command(
        &go_toolchain("1.27.3"),
        &workspace_root().join("tests/fixtures/go_forged"),
        &["build", "-o", binary.to_str().unwrap(), "."],
        &[],
    );
    let mut command = std::process::Command::new(&binary);
    command.arg(dir.path());
    let process = Running::spawn(command);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.path().join("ready").exists() {
        assert!(Instant::now() < deadline, "the fixture never got ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = process.pid().to_string();
    let output = run_agent(&["goroutines", "--pid", &pid]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let dump = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 malformed (impossible values"),
        "{stderr}"
    );
    assert!(!stderr.contains("changed while read"), "{stderr}");
    assert_eq!(dump.matches("main.bystander(").count(), 3, "{dump}");
    assert!(!dump.contains("main.victim("), "{dump}");
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the forging process died"
    );
}

#[test]
fn a_process_that_is_not_go_is_named() {
    let process = Running::start(Path::new("/bin/sleep"), &["30"]);
    let pid = process.pid().to_string();
    for command in ["heap", "goroutines"] {
        let output = run_agent(&[command, "--pid", &pid]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(
            stderr.contains(&format!(
                "process {pid} (/usr/bin/sleep) is not a Go program"
            )),
            "{stderr}"
        );
    }
    // `heap` points at what works for any process.
    let output = run_agent(&["heap", "--pid", &pid]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("--pid {pid} --event page-faults")),
        "{stderr}"
    );
    let output = run_agent(&["heap", "--pid", "999999999"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("process 999999999") && stderr.contains("is the process running?"),
        "{stderr}"
    );
}

#[test]
fn a_run_exports_each_windows_heap_and_serves_the_heap_endpoint() {
    let _serial = serial();
    require_bpf_privileges();
    let build = Build {
        rate: Some("4096"),
        ..build("1.27.3", None)
    };
    let settled = Settled::start_with(&build, &["leak"], &[]);
    let pid = settled.pid();
    let out = settled.path("profiles");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--pids",
        &pid,
        "--listen",
        &listen,
        "--window",
        "2s",
        "--node",
        "node-h",
        "--directory-path",
        out.to_str().unwrap(),
    ]);
    agent.wait_ready(port);

    // The pull: the heap now, as the program's own /debug/pprof/heap
    // gives it (allocations since it started), read by go tool pprof.
    let url = format!("http://127.0.0.1:{port}/debug/pprof/heap?pid={pid}");
    let top =
        profiler_tests::profiles::go_pprof(&["-top", "-sample_index=alloc_space"], Path::new(&url));
    assert!(
        top.contains("main.cacheResponse"),
        "{top}\nagent:\n{}",
        agent.log()
    );
    let (status, body) = http_get(
        port,
        "/debug/pprof/heap?service=no-such-service",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(status, 503);
    assert!(String::from_utf8_lossy(&body).contains("no-such-service"));

    // Windows: a memory profile per window beside the CPU one.
    std::thread::sleep(Duration::from_secs(7));
    assert!(agent.terminate(Duration::from_secs(20)).success());
    let mut memory: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("memory-")
        })
        .collect();
    memory.sort();
    assert!(
        memory.len() >= 3,
        "memory profiles: {memory:?}\n{}",
        agent.log()
    );
    let sum = |profile: &RawProfile, index: usize, function: &str| -> i64 {
        profile
            .lined_stacks()
            .iter()
            .zip(&profile.samples)
            .filter(|(s, _)| {
                s.frames
                    .first()
                    .is_some_and(|(l, _)| l.function == function)
            })
            .map(|(_, sample)| sample.values[index])
            .sum()
    };
    let windows: Vec<RawProfile> = memory.iter().map(|p| RawProfile::read(p)).collect();
    let first = &windows[0];
    assert_eq!(
        first.sample_types,
        [
            "alloc_objects/count",
            "alloc_space/bytes",
            "inuse_objects/count",
            "inuse_space/bytes"
        ]
    );
    // The first window has nothing to compare with: no allocations, the
    // heap in use.
    assert_eq!(sum(first, 1, "main.cacheResponse"), 0);
    assert!(sum(first, 3, "main.cacheResponse") > 1 << 20);
    // Later (whole) windows: what the leak allocated in each (~320 KiB in
    // 2 s), not since the start; in use grows.
    let middle = &windows[1..windows.len() - 1];
    for window in middle {
        let leaked = sum(window, 1, "main.leakSession");
        assert!(
            (100 << 10..1 << 20).contains(&leaked),
            "alloc_space of main.leakSession in a 2 s window: {leaked}"
        );
        assert_eq!(
            sum(window, 1, "main.cacheResponse"),
            0,
            "nothing new from the startup cache"
        );
    }
    let inuse: Vec<i64> = windows
        .iter()
        .map(|w| sum(w, 3, "main.leakSession"))
        .collect();
    assert!(
        inuse.last() > inuse.first(),
        "in use by main.leakSession over windows: {inuse:?}"
    );
    for window in &windows {
        for stack in window.lined_stacks() {
            assert_eq!(stack.labels["pid"], pid);
            assert_eq!(stack.labels["node"], "node-h");
            assert!(stack.labels.contains_key("service_name"));
        }
    }
    let metrics = http_get(port, "/metrics", Duration::from_secs(1));
    drop(metrics);
}

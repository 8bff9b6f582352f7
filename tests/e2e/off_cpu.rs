//! Off-CPU and wall-clock profiles (`--off-cpu`, `--wall`) against what
//! the profiled program measured itself: tests/fixtures/c/offcpu.c times
//! its own waits (wall-clock minus thread CPU time around each call), reads
//! its own run-queue delay from /proc/thread-self/schedstat, and prints
//! them. The agent attaches first; the fixture starts on a line on stdin.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use profiler_profile::pprof::proto;
use profiler_tests::{agent::*, fixtures::*, go::*, http::*, processes::*, profiles::*};

/// The fixture's flags: optimized, without frame pointers (the off-CPU
/// walks use the unwind tables too), and no tail calls, so each
/// `wait_for_*` keeps its frame.
const FLAGS: &[&str] = &["-O2", "-g", "-pthread", "-fno-optimize-sibling-calls"];

struct Run {
    /// The fixture's line of measurements: `name=value` pairs.
    measured: HashMap<String, i64>,
    profile: proto::Profile,
    report: String,
}

/// Runs `offcpu MODE [ARG]` under `profiler-agent --pid ... ARGS`, started
/// before the fixture's work and stopped by its exit.
fn run(mode: &[&str], args: &[&str], out: &Path) -> Run {
    require_bpf_privileges();
    let _serial = serial();
    let binary = build_c_fixture("offcpu", FLAGS);
    let mut fixture = Gated::start(&binary, mode);
    let pid = fixture.pid().to_string();
    let mut agent_args = vec![
        "--pid",
        &pid,
        "--duration",
        "60s",
        "-o",
        out.to_str().unwrap(),
    ];
    agent_args.extend_from_slice(args);
    let mut agent = Background::start(&agent_bin(), &agent_args);
    agent.wait_for("profiling pid");
    let line = fixture.run_to_gate();
    let status = fixture.finish();
    assert!(status.success(), "offcpu {mode:?} failed: {status}");
    let finished = agent.wait_exit(Duration::from_secs(30));
    assert!(
        finished.status.success(),
        "profiler-agent {agent_args:?} failed: {}",
        finished.stderr
    );
    let measured = line
        .split_whitespace()
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect();
    Run {
        measured,
        profile: read_pprof(out),
        report: finished.stderr,
    }
}

/// Index of sample type `name` in the profile.
fn value_index(profile: &proto::Profile, name: &str) -> usize {
    let s = |i: i64| profile.string_table[i as usize].as_str();
    profile
        .sample_type
        .iter()
        .position(|t| s(t.r#type) == name)
        .unwrap_or_else(|| panic!("no sample type {name} in the profile"))
}

/// Sum of sample type `name` over the samples `keep` selects.
fn total(profile: &proto::Profile, name: &str, keep: impl Fn(&Stack) -> bool) -> i64 {
    let index = value_index(profile, name);
    stacks(profile)
        .iter()
        .zip(&profile.sample)
        .filter(|(stack, _)| keep(stack))
        .map(|(_, sample)| sample.value[index])
        .sum()
}

fn assert_within(what: &str, ours: i64, truth: i64, tolerance: f64, report: &str) {
    let error = (ours - truth).abs() as f64 / truth.max(1) as f64;
    assert!(
        error <= tolerance,
        "{what}: the agent recorded {:.3} s, the program measured {:.3} s ({:.1}% apart, \
         {:.0}% allowed)\n{report}",
        ours as f64 / 1e9,
        truth as f64 / 1e9,
        error * 100.0,
        tolerance * 100.0
    );
}

#[test]
fn off_cpu_time_under_each_wait_matches_what_the_program_measured() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("waits.pb.gz");
    // A period below the waits (3 ms sleeps, ~2 ms lock and pipe waits):
    // nearly every interval is recorded as it was.
    // fsync must reach a disk: the workspace's filesystem, not a tmpfs.
    let sync_dir = tempfile::tempdir_in(workspace_root().join("target")).unwrap();
    let sync_dir = sync_dir.path();
    let run = run(
        &["waits", sync_dir.to_str().unwrap()],
        &["--off-cpu", "--off-cpu-period", "200us"],
        &out,
    );
    let stacks = stacks(&run.profile);
    for (function, measured, wait, thread_root) in [
        ("wait_for_sleep", "sleep", "sleep", "sleeper"),
        ("wait_for_lock", "lock", "lock", "waiter"),
        ("wait_for_pipe", "pipe", "other", "reader"),
        ("wait_for_fsync", "fsync", "disk", "syncer"),
    ] {
        let ours = total(&run.profile, "off_cpu", |s| s.has(function));
        assert_within(function, ours, run.measured[measured], 0.10, &run.report);
        // Complete stacks: from the thread's start through the function to
        // the libc wrapper and into the kernel, labelled with the reason.
        let blocked: Vec<&Stack> = stacks
            .iter()
            .filter(|s| s.has(function) && s.labels.get("wait").map(String::as_str) == Some(wait))
            .collect();
        assert!(
            !blocked.is_empty(),
            "no {function} stack labelled wait={wait}: {:?}",
            stacks
                .iter()
                .filter(|s| s.has(function))
                .map(|s| (s.labels.get("wait"), &s.frames))
                .collect::<Vec<_>>()
        );
        for stack in blocked {
            let chain = stack.user_chain();
            assert!(
                chain.first() == Some(&"clone3")
                    && chain.contains(&"start_thread")
                    && chain.contains(&thread_root)
                    && chain.last() != Some(&function),
                "{function}: user stack not complete from clone3 through {thread_root} into \
                 libc: {chain:?}"
            );
            assert!(
                stack.frames.first().is_some_and(|(_, kernel)| *kernel),
                "{function}: no kernel frames at the leaf: {:?}",
                stack.frames
            );
        }
    }
    // go tool pprof reads it, off_cpu the default sample type.
    let top = go_pprof(&["-top", "-sample_index=off_cpu"], &out);
    assert!(top.contains("Type: off_cpu"), "{top}");
    let sliced = go_pprof(&["-top", "-tagfocus=wait=lock"], &out);
    assert!(sliced.contains("futex"), "{sliced}");
    assert!(
        run.report.contains("off-CPU:") && run.report.contains("intervals recorded"),
        "{}",
        run.report
    );
}

#[test]
fn sampled_off_cpu_time_is_unbiased() {
    // ~250 us waits against a 2 ms period: about one in eight intervals is
    // recorded, each standing for 2 ms; the total must still match.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("short.pb.gz");
    let run = run(&["short"], &["--off-cpu", "--off-cpu-period", "2ms"], &out);
    let ours = total(&run.profile, "off_cpu", |s| s.has("wait_for_pipe"));
    assert_within(
        "wait_for_pipe",
        ours,
        run.measured["pipe"],
        0.10,
        &run.report,
    );
    let left_out: u64 = run
        .report
        .split(", ")
        .find(|part| part.ends_with("left out by sampling (the recorded ones stand for them)"))
        .and_then(|part| part.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no sampling count in the report: {}", run.report));
    assert!(
        left_out > 1000,
        "the waits were not sampled: {}",
        run.report
    );
}

#[test]
fn run_queue_time_per_thread_matches_schedstat() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runqueue.pb.gz");
    let run = run(
        &["runqueue"],
        &["--off-cpu", "--off-cpu-period", "200us"],
        &out,
    );
    assert_eq!(run.measured.len(), 2, "{:?}", run.measured);
    for (tid, waited) in &run.measured {
        assert!(
            *waited > 500_000_000,
            "thread {tid} hardly waited ({waited} ns): were both pinned to one CPU?"
        );
        let ours = total(&run.profile, "off_cpu", |s| {
            s.labels.get("tid") == Some(tid)
                && s.labels.get("wait").map(String::as_str) == Some("runqueue")
        });
        assert_within(
            &format!("run-queue time of thread {tid}"),
            ours,
            *waited,
            0.10,
            &run.report,
        );
        // The preempted thread's stack is where it was running.
        let stacks = stacks(&run.profile);
        assert!(
            stacks
                .iter()
                .filter(|s| s.labels.get("tid") == Some(tid) && s.labels.contains_key("wait"))
                .any(|s| s.has("compete_for_cpu") && s.has("start_thread")),
            "no run-queue stack through compete_for_cpu for thread {tid}"
        );
    }
}

#[test]
fn wall_clock_profile_of_a_half_sleeping_thread_is_half_cpu_half_off_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("half.pb.gz");
    // 997 Hz: the thread's 10 ms busy/asleep cycle beats against a
    // 100 Hz clock (its on-CPU samples came out 1.2-1.66 s for 1.5 s of
    // CPU); at a rate prime to the cycle they count its CPU time within
    // a few percent.
    let run = run(
        &["half"],
        &["--wall", "--off-cpu-period", "1ms", "-F", "997"],
        &out,
    );
    let tid = run.measured["tid"].to_string();
    let thread = |s: &Stack| s.labels.get("tid") == Some(&tid);
    let wall = total(&run.profile, "wall", thread);
    let on_cpu = total(&run.profile, "wall", |s| {
        thread(s) && !s.labels.contains_key("wait")
    });
    let asleep = total(&run.profile, "wall", |s| thread(s) && s.has("half_asleep"));
    let parts = format!(
        "on CPU {:.3} s, in half_asleep {:.3} s\n{}",
        on_cpu as f64 / 1e9,
        asleep as f64 / 1e9,
        run.report
    );
    // Each part against what the thread measured itself: its lifetime,
    // its CPU time (thread CPU clock) and the time its naps took.
    assert_within(
        "the thread's wall-clock time",
        wall,
        run.measured["lived"],
        0.10,
        &parts,
    );
    assert_within(
        "the thread's time on the CPU",
        on_cpu,
        run.measured["cpu"],
        0.10,
        &parts,
    );
    assert_within(
        "time in half_asleep",
        asleep,
        run.measured["asleep"],
        0.10,
        &parts,
    );
    let top = go_pprof(&["-top"], &out);
    assert!(top.contains("Type: wall"), "{top}");
}

#[test]
fn off_cpu_options_without_off_cpu_are_refused() {
    for args in [
        &["--off-cpu-min", "10us"][..],
        &["--off-cpu-period", "1ms"][..],
    ] {
        let output = run_agent(&[args, &["-d", "1s", "-o", "/tmp/x.pb.gz"]].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} accepted: {stderr}");
        assert!(
            stderr.contains("--off-cpu") && stderr.contains(args[0]),
            "{args:?}: unclear error: {stderr}"
        );
    }
}

#[test]
fn the_continuous_agent_serves_off_cpu_time_on_pulls_and_metrics() {
    require_bpf_privileges();
    let _serial = serial();
    let binary = build_c_fixture("offcpu", FLAGS);
    let mut fixture = Gated::start(&binary, &["half"]);
    let pid = fixture.pid().to_string();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--pids",
        &pid,
        "--listen",
        &listen,
        "--directory-path",
        "",
        "--off-cpu",
        "true",
        "--off-cpu-period",
        "1ms",
    ]);
    agent.wait_ready(port);
    let pull = std::thread::spawn(move || {
        http_get(
            port,
            "/debug/pprof/profile?seconds=5",
            Duration::from_secs(30),
        )
    });
    // The pull has begun: let the fixture work its 3 s inside it.
    std::thread::sleep(Duration::from_millis(500));
    let line = fixture.run_to_gate();
    let (status, body) = pull.join().unwrap().expect("the pull answers");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let profile = profiler_profile::pprof::decode(&body).expect("valid pprof");
    let measured: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .collect();
    let tid = measured["tid"].to_string();
    let asleep = total(&profile, "off_cpu", |s| {
        s.labels.get("tid") == Some(&tid) && s.has("half_asleep")
    });
    assert_within(
        "time in half_asleep, pulled",
        asleep,
        measured["asleep"].parse().unwrap(),
        0.10,
        &agent.log(),
    );
    assert!(
        total(&profile, "samples", |s| s.has("half_busy")) > 50,
        "the CPU side is missing from the pulled profile"
    );
    let text = http_get(port, "/metrics", Duration::from_secs(5))
        .map(|(_, body)| String::from_utf8_lossy(&body).into_owned())
        .unwrap_or_default();
    for series in [
        "profiler_agent_off_cpu_switches_total",
        "profiler_agent_off_cpu_intervals_total{result=\"recorded\"}",
        "profiler_agent_off_cpu_seconds_total{state=\"blocked\"}",
    ] {
        let value = metric_value(&text, series);
        assert!(
            value.is_some_and(|v| v > 0.0),
            "{series} is {value:?}:\n{text}"
        );
    }
    assert!(fixture.finish().success());
    assert!(agent.terminate(Duration::from_secs(20)).success());
}

/// Builds the Go fixture `tests/fixtures/NAME` with toolchain `version`.
fn build_go(version: &str, name: &str) -> std::path::PathBuf {
    let out_dir = workspace_root()
        .join("target/fixtures")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(format!("{name}-{version}"));
    go_command(
        &go_toolchain(version),
        &workspace_root().join("tests/fixtures").join(name),
        &["build", "-o", binary.to_str().unwrap(), "."],
        &[],
    );
    binary
}

/// Profiles a gated fixture with `--pid` and `args` from before its work
/// to its exit: its pid, its first line of output, the agent's exit, the
/// profile.
fn profile_gated(binary: &Path, args: &[&str]) -> (String, String, Finished, proto::Profile) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("profile.pb.gz");
    let mut fixture = Gated::start(binary, &[]);
    let pid = fixture.pid().to_string();
    let mut agent_args = vec!["--pid", &pid, "--duration", "60s"];
    agent_args.extend_from_slice(args);
    agent_args.extend(["-o", out.to_str().unwrap()]);
    let mut agent = Background::start(&agent_bin(), &agent_args);
    agent.wait_for("profiling pid");
    let line = fixture.run_to_gate();
    assert!(fixture.finish().success());
    let finished = agent.wait_exit(Duration::from_secs(30));
    assert!(finished.status.success(), "{}", finished.stderr);
    let profile = read_pprof(&out);
    (pid, line, finished, profile)
}

/// Outermost user frames of a complete Go stack: a goroutine's
/// `runtime.goexit`, a thread's `runtime.mstart`, the main thread's
/// `runtime.rt0_go` (and the entry symbols before it), and
/// `runtime.mcall` and `runtime.morestack`, where the scheduler runs on a
/// thread's own stack after putting its goroutine away (parked, or
/// preempted at its stack check: the goroutine is no longer the thread's,
/// and Go's own traceback stops there too).
const GO_ROOTS: &[&str] = &[
    "runtime.goexit",
    "runtime.mcall",
    "runtime.morestack",
    "runtime.mstart",
    "runtime.rt0_go",
    "_rt0_amd64",
    "_rt0_amd64_linux",
    "_rt0_arm64_linux",
];

#[test]
fn go_threads_wait_in_the_scheduler_and_netpoller_with_complete_stacks() {
    require_bpf_privileges();
    let _serial = serial();
    for version in ["1.19", "1.27.3"] {
        let binary = build_go(version, "go_offcpu");
        let (pid, line, finished, profile) =
            profile_gated(&binary, &["--wall", "--off-cpu-period", "1ms"]);
        assert_eq!(line.trim(), "done");
        let report = finished.stderr;
        let elapsed: f64 = report
            .split(" in ")
            .nth(1)
            .and_then(|rest| rest.split('s').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no duration in the report: {report}"));
        let wall = value_index(&profile, "wall");
        let stacks = stacks(&profile);
        let samples: Vec<(&Stack, i64)> = stacks
            .iter()
            .zip(&profile.sample)
            .map(|(stack, sample)| (stack, sample.value[wall]))
            .collect();
        let off_cpu: Vec<&(&Stack, i64)> = samples
            .iter()
            .filter(|(s, _)| s.labels.contains_key("wait"))
            .collect();
        // Complete stacks: nearly all off-CPU time under a Go root.
        let total: i64 = off_cpu.iter().map(|(_, v)| v).sum();
        let rooted: i64 = off_cpu
            .iter()
            .filter(|(s, _)| s.user_chain().first().is_some_and(|r| GO_ROOTS.contains(r)))
            .map(|(_, v)| v)
            .sum();
        assert!(
            rooted as f64 >= 0.95 * total as f64,
            "Go {version}: {:.1}% of off-CPU time under a Go root; cut stacks: {:?}\n{report}",
            100.0 * rooted as f64 / total.max(1) as f64,
            off_cpu
                .iter()
                .filter(|(s, _)| !s.user_chain().first().is_some_and(|r| GO_ROOTS.contains(r)))
                .map(|(s, _)| s.user_chain())
                .take(5)
                .collect::<Vec<_>>()
        );
        // Threads wait where Go's runtime parks them.
        for (wait, function) in [
            ("network", "runtime.netpoll"),
            ("lock", "runtime.futexsleep"),
        ] {
            assert!(
                off_cpu
                    .iter()
                    .any(|(s, _)| s.labels["wait"] == wait && s.has(function)),
                "Go {version}: no wait={wait} stack through {function}"
            );
        }
        // The spinning goroutine's CPU time is there too.
        assert!(
            samples
                .iter()
                .any(|(s, v)| *v > 0 && !s.labels.contains_key("wait") && s.has("main.spinner")),
            "Go {version}: no CPU sample in main.spinner"
        );
        // No thread has more wall-clock time than the recording, and the
        // main thread, alive throughout, has about all of it.
        let mut by_thread: HashMap<&str, i64> = HashMap::new();
        for (s, v) in &samples {
            *by_thread.entry(s.labels["tid"].as_str()).or_default() += v;
        }
        for (tid, ns) in &by_thread {
            assert!(
                (*ns as f64) <= elapsed * 1e9 * 1.1,
                "Go {version}: thread {tid} has {:.2} s of a {elapsed:.2} s recording",
                *ns as f64 / 1e9
            );
        }
        let main = by_thread.get(pid.as_str()).copied().unwrap_or(0) as f64 / 1e9;
        assert!(
            main >= elapsed * 0.8,
            "Go {version}: the main thread has {main:.2} s of a {elapsed:.2} s recording"
        );
    }
}

/// A goroutine blocked in a system call stays its thread's current one:
/// that off-CPU time carries its pprof labels, as its CPU samples do. Two
/// labelled goroutines and one without sleep in nanosleep(2) for different
/// shares of 2 s (`tests/fixtures/go_offcpu_labels`); the off-CPU time in
/// the call under each `job` label (and under none) is within 10% of what
/// each goroutine measured itself, on Go 1.19 (labels in a map) and
/// 1.27.3 (a sorted slice).
#[test]
fn go_labels_follow_goroutines_blocked_in_system_calls() {
    require_bpf_privileges();
    let _serial = serial();
    for version in ["1.19", "1.27.3"] {
        let binary = build_go(version, "go_offcpu_labels");
        let (_, line, finished, profile) =
            profile_gated(&binary, &["--off-cpu", "--off-cpu-period", "0"]);
        let own: Vec<i64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [long, short, none] = own[..] else {
            panic!("the fixture printed {line:?}");
        };
        let in_call = |job: Option<&str>| {
            total(&profile, "off_cpu", |s| {
                s.has("main.blocker")
                    && s.has("syscall.Nanosleep")
                    && s.labels.get("job").map(String::as_str) == job
            })
        };
        for (job, measured) in [(Some("long"), long), (Some("short"), short), (None, none)] {
            let ours = in_call(job);
            let ratio = ours as f64 / measured as f64;
            assert!(
                (0.9..=1.1).contains(&ratio),
                "Go {version}, job={job:?}: {ours} ns off-CPU in nanosleep in the profile, \
                 {measured} ns measured by the goroutine (long {long}, short {short}, none \
                 {none}; long/short/none in the profile: {} / {} / {})\n{}",
                in_call(Some("long")),
                in_call(Some("short")),
                in_call(None),
                finished.stderr
            );
        }
    }
}

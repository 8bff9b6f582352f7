//! Java frames against the JVM's own account: the fixture
//! (tests/fixtures/java: a call tree C2 compiles and inlines, a lambda
//! sorter, an interpreted-only method, deep recursion, JNI down and back
//! up) runs under JFR (`settings=profile`) on OpenJDK 17 (the host's), 21
//! and 25 (Debian trixie's, chrooted); the agent profiles it over a window
//! of the same run, with no JVM flag. Compared over that window, on
//! samples whose innermost frame is Java (JFR samples threads running
//! Java only):
//!
//! - each method's share of the innermost Java frames within 5 points
//!   (each of the fixture's threads weighing the same: see `shares`);
//! - the agent's Java stacks (caller order, inlined frames, the callers'
//!   lines) are stacks JFR recorded;
//! - the JNI stacks cross from Java through C back into Java.
//!
//! Known differences, allowed for: JFR hides lambda proxy frames (so do
//! the comparisons); JFR keeps 64 frames (deeper stacks are compared on
//! those); the innermost interpreted frame's line is the one the JVM is
//! at for the agent (its bytecode-pointer register), the last call's for
//! JFR (the frame's saved slot), so innermost lines are not compared.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use profiler_tests::java::{
    Jdk, JfrSample, build_fixture, jdks, jfr_samples, now_ns, wait_exit, wait_ready,
};
use profiler_tests::pprof_raw::RawProfile;
use profiler_tests::{agent::*, processes::*};

/// Whether a frame name is a Java method (not C, C++, kernel, a stub).
fn is_java(name: &str) -> bool {
    name.contains('.')
        && !name.contains("::")
        && !name.contains(['(', ' ', '<', '[', '+'])
        && !name.starts_with('_')
}

/// A Java frame JFR shows (lambda proxies are hidden there).
fn shown_by_jfr(name: &str) -> bool {
    is_java(name) && !name.contains("$$Lambda")
}

/// One agent sample: its Java frames (name, line), innermost first, and
/// whether its innermost frame is Java at all.
struct AgentSample {
    frames: Vec<(String, i64)>,
    count: i64,
    /// The fixture's thread it came from (JFR's name for it).
    thread: String,
}

fn agent_samples(profile: &RawProfile, hidden: &HashSet<String>) -> Vec<AgentSample> {
    profile
        .lined_stacks()
        .into_iter()
        .filter(|s| {
            s.frames
                .first()
                .is_some_and(|(l, kernel)| !kernel && is_java(&l.function))
        })
        .map(|s| AgentSample {
            frames: s
                .frames
                .iter()
                .filter(|(l, kernel)| {
                    !kernel && shown_by_jfr(&l.function) && !hidden.contains(&l.function)
                })
                .map(|(l, _)| (l.function.clone(), i64::from(l.line)))
                .collect(),
            count: s.count,
            // The main thread is "main" to Java, "java" (the launcher's
            // name) to the kernel.
            thread: match s.labels.get("thread").map(String::as_str) {
                Some("java") => "main".into(),
                other => other.unwrap_or("").to_string(),
            },
        })
        .collect()
}

/// The fixture's busy threads.
const THREADS: [&str; 5] = ["main", "sorter", "interp", "deep", "jni"];

/// Shares of the innermost method, each of the fixture's threads weighing
/// the same: the mean over threads of each method's share of the thread's
/// samples. (How much CPU each thread got is not compared: JFR samples
/// threads that are in Java code whether or not they run, an on-CPU
/// sampler those that run, and five busy threads share two CPUs.)
fn shares<'a>(samples: impl Iterator<Item = (&'a str, &'a str, i64)>) -> HashMap<String, f64> {
    let mut by_thread: HashMap<&str, (HashMap<&str, i64>, i64)> = HashMap::new();
    for (thread, method, count) in samples {
        if !THREADS.contains(&thread) {
            continue;
        }
        let (methods, total) = by_thread.entry(thread).or_default();
        *methods.entry(method).or_default() += count;
        *total += count;
    }
    let mut shares: HashMap<String, f64> = HashMap::new();
    for (methods, total) in by_thread.values() {
        for (method, count) in methods {
            *shares.entry(method.to_string()).or_default() +=
                *count as f64 / *total as f64 / THREADS.len() as f64;
        }
    }
    shares
}

/// The comparable form of a stack: names, and lines but the innermost
/// (see the module's documentation); a line JFR or the agent does not
/// know (a native method: -1 or 0) is 0.
fn signature(frames: &[(String, i64)]) -> Vec<(String, i64)> {
    frames
        .iter()
        .enumerate()
        .map(|(i, (name, line))| (name.clone(), if i == 0 { 0 } else { (*line).max(0) }))
        .collect()
}

/// Runs the fixture on `jdk` under JFR with the agent over a window.
fn run(jdk: &Jdk) -> (RawProfile, Vec<JfrSample>, HashSet<String>) {
    let (inside, host) = jdk.scratch("fixture");
    build_fixture(&host);
    let recording = inside.join("rec.jfr");
    let args: Vec<String> = vec![
        format!(
            "-XX:StartFlightRecording=filename={},settings=profile,dumponexit=true",
            recording.display()
        ),
        "-XX:CompileCommand=quiet".into(),
        // JDK 22 on warns when a class loads a native library without it.
        "--enable-native-access=ALL-UNNAMED".into(),
        "-XX:CompileCommand=exclude,Main::interp".into(),
        // leaf() inlined into every compiled caller, as the fixture means:
        // C2 otherwise declines it at times (once it has compiled leaf()
        // on its own into more than InlineSmallCode), and JDK 21's JFR
        // then drops the samples in leaf()'s own compiled code, so the
        // innermost method would depend on the order of compilation.
        "-XX:CompileCommand=inline,Main::leaf".into(),
        "-cp".into(),
        inside.display().to_string(),
        "Main".into(),
        "20".into(),
        inside.join("libnative.so").display().to_string(),
    ];
    let mut java = jdk.start(&args);
    let pid = wait_ready(&mut java);
    // C1 and C2 compile the hot paths first.
    std::thread::sleep(Duration::from_secs(4));
    let output = host.join("agent.pb.gz");
    let started = now_ns();
    let report = record(&[
        "--pid",
        &pid.to_string(),
        "-d",
        "6s",
        "-o",
        output.to_str().unwrap(),
    ]);
    let ended = now_ns();
    wait_exit(&mut java, Duration::from_secs(60));
    assert!(
        report.contains("Java: frames read in 1 JVMs"),
        "JDK {}: {report}",
        jdk.version
    );
    let (jfr, hidden) = jfr_samples(&jdk.host_path(&recording));
    let jfr: Vec<JfrSample> = jfr
        .into_iter()
        .filter(|s| started <= s.time_ns && s.time_ns <= ended)
        .collect();
    (RawProfile::read(&output), jfr, hidden)
}

#[test]
fn java_frames_match_jfr_on_every_jdk() {
    let _serial = serial();
    require_bpf_privileges();
    for jdk in jdks() {
        let (profile, jfr, hidden) = run(&jdk);
        let label = format!("JDK {}", jdk.version);
        let ours = agent_samples(&profile, &hidden);
        let total: i64 = ours.iter().map(|s| s.count).sum();
        assert!(
            total > 300,
            "{label}: {total} samples with a Java frame innermost"
        );
        assert!(
            jfr.len() > 150,
            "{label}: {} JFR samples in the window",
            jfr.len()
        );

        // 1. Shares of the innermost method, within 5 points.
        let our_shares = shares(
            ours.iter()
                .filter_map(|s| Some((s.thread.as_str(), s.frames.first()?.0.as_str(), s.count))),
        );
        let their_shares = shares(
            jfr.iter()
                .filter_map(|s| Some((s.thread.as_str(), s.frames.first()?.0.as_str(), 1))),
        );
        let share = |shares: &HashMap<String, f64>, m: &str| shares.get(m).copied().unwrap_or(0.0);
        // Every method of 2% or more on either side (the sorter's TimSort
        // and Random methods among them), within 5 points.
        let mut methods: Vec<&String> = our_shares
            .iter()
            .chain(&their_shares)
            .filter(|(_, v)| **v >= 0.02)
            .map(|(m, _)| m)
            .collect();
        methods.sort();
        methods.dedup();
        let compared: Vec<String> = methods
            .iter()
            .map(|m| {
                format!(
                    "{m} {:.1} vs {:.1}",
                    share(&our_shares, m) * 100.0,
                    share(&their_shares, m) * 100.0
                )
            })
            .collect();
        // Samples per thread on each side: a side that lost a thread's
        // samples at some PCs (JFR drops a sample whose frame it cannot
        // decode) shows here, where shares alone would hide it.
        let per_thread = |samples: &mut dyn Iterator<Item = (&str, i64)>| {
            let mut counts = std::collections::BTreeMap::<String, i64>::new();
            for (thread, count) in samples {
                *counts.entry(thread.to_string()).or_default() += count;
            }
            counts
        };
        let threads = format!(
            "samples per thread: ours {:?}, JFR's {:?}",
            per_thread(&mut ours.iter().map(|s| (s.thread.as_str(), s.count))),
            per_thread(&mut jfr.iter().map(|s| (s.thread.as_str(), 1))),
        );
        let compared = format!("{compared:#?}\n{threads}");
        eprintln!(
            "{label}: {total} agent samples, {} JFR samples: {compared}",
            jfr.len()
        );
        // Each of the fixture's four busy threads holds one innermost
        // method: every one is a fair part of the samples.
        for method in ["Main.hot", "Main.recurse", "Main.interp", "Main.jniWork"] {
            assert!(
                share(&our_shares, method) > 0.1,
                "{label}: {method} is {:.1}% of ours, {:.1}% of JFR's\n{compared}",
                share(&our_shares, method) * 100.0,
                share(&their_shares, method) * 100.0
            );
        }
        for method in &methods {
            let (a, b) = (share(&our_shares, method), share(&their_shares, method));
            assert!(
                (a - b).abs() <= 0.05,
                "{label}: {method}: {:.1}% of the agent's innermost Java frames, {:.1}% of JFR's\n{compared}",
                a * 100.0,
                b * 100.0
            );
        }
        let sorting = |s: &HashMap<String, f64>| {
            s.iter()
                .filter(|(m, _)| {
                    m.starts_with("java.util.TimSort") || m.starts_with("java.util.Arrays")
                })
                .map(|(_, v)| v)
                .sum::<f64>()
        };
        let (a, b) = (sorting(&our_shares), sorting(&their_shares));
        assert!(
            (a - b).abs() <= 0.05,
            "{label}: sorting {:.1}% vs JFR {:.1}%",
            a * 100.0,
            b * 100.0
        );
        eprintln!("{label}: sorting {:.1} vs {:.1}", a * 100.0, b * 100.0);

        // 2. Our stacks (caller order, inlined frames, callers' lines) are
        // stacks JFR recorded: the whole stack, or (JFR keeps 64 frames,
        // and at times loses the outer ones) JFR's is the innermost part
        // of ours, at least three frames of it.
        let known: HashSet<Vec<(String, i64)>> = jfr.iter().map(|s| signature(&s.frames)).collect();
        let mut matched = 0;
        let mut unmatched: HashMap<Vec<(String, i64)>, i64> = HashMap::new();
        for sample in &ours {
            let ours = signature(&sample.frames);
            let found = (3.min(ours.len())..=ours.len())
                .rev()
                .any(|n| known.contains(&ours[..n]));
            if found {
                matched += sample.count;
            } else {
                *unmatched.entry(ours).or_default() += sample.count;
            }
        }
        let rate = matched as f64 / total as f64;
        let mut worst: Vec<_> = unmatched.into_iter().collect();
        worst.sort_by_key(|(_, n)| -n);
        worst.truncate(3);
        assert!(
            rate >= 0.9,
            "{label}: {:.1}% of the agent's Java stacks are stacks JFR recorded; most common others: {worst:#?}",
            rate * 100.0
        );
        eprintln!(
            "{label}: {:.1}% of the agent's Java stacks are JFR's",
            rate * 100.0
        );

        // 3. JNI: Java calls C, C calls back into Java.
        let jni = profile
            .lined_stacks()
            .into_iter()
            .find(|s| {
                s.frames
                    .first()
                    .is_some_and(|(l, _)| l.function == "Main.jniWork")
            })
            .unwrap_or_else(|| panic!("{label}: no sample in Main.jniWork"));
        let names: Vec<&str> = jni
            .frames
            .iter()
            .map(|(l, _)| l.function.as_str())
            .collect();
        let position = |name: &str| names.iter().position(|n| *n == name);
        let (c, wrapper) = (
            position("Java_Main_nativeSpin"),
            position("Main.nativeSpin"),
        );
        assert!(
            c.is_some() && wrapper.is_some() && c < wrapper,
            "{label}: Main.jniWork's stack does not cross Java -> C -> Java: {names:#?}"
        );
    }
}

#[test]
fn unloaded_code_is_never_named_as_other_code() {
    let _serial = serial();
    require_bpf_privileges();
    let jdk = jdks().into_iter().find(|j| j.version == "21").unwrap();
    let (inside, host) = jdk.scratch("unload");
    build_fixture(&host);
    let args: Vec<String> = vec![
        "--enable-native-access=ALL-UNNAMED".into(),
        "-cp".into(),
        inside.display().to_string(),
        "Main".into(),
        "14".into(),
        inside.join("libnative.so").display().to_string(),
        inside.join("plugins").display().to_string(),
    ];
    let mut java = jdk.start(&args);
    let pid = wait_ready(&mut java);
    std::thread::sleep(Duration::from_secs(2));
    let output = host.join("unload.pb.gz");
    let report = record(&[
        "--pid",
        &pid.to_string(),
        "-d",
        "8s",
        "-o",
        output.to_str().unwrap(),
    ]);
    wait_exit(&mut java, Duration::from_secs(60));
    let profile = RawProfile::read(&output);
    // Plugin's classes came and went while sampled; every frame of the
    // fixture's own classes must be one of their real methods.
    let real: HashSet<&str> = [
        "Main.leaf",
        "Main.mid",
        "Main.top",
        "Main.other",
        "Main.hot",
        "Main.interp",
        "Main.recurse",
        "Main.sorter",
        "Main.main",
        "Main.nativeSpin",
        "Main.jniWork",
        "Main.unloadLoop",
        "Plugin.churn",
        "Plugin.run",
        "Plugin.<init>",
        "Main.<init>",
        "Main$Item.<init>",
    ]
    .into_iter()
    .collect();
    let mut plugin = 0;
    for stack in profile.lined_stacks() {
        for (line, _) in &stack.frames {
            let name = line.function.as_str();
            if name.starts_with("Plugin.") {
                plugin += stack.count;
            }
            if (name.starts_with("Main.") || name.starts_with("Plugin."))
                && !name.contains("lambda$")
            {
                assert!(
                    real.contains(name),
                    "a frame named {name}, no method of the fixture\n{report}"
                );
            }
        }
    }
    assert!(plugin > 0, "no sample in Plugin's code:\n{report}");
}

#[test]
fn a_process_with_a_forged_libjvm_stays_native_and_is_named() {
    let _serial = serial();
    require_bpf_privileges();
    // A program that maps a "libjvm.so" whose VMStructs tables are
    // garbage: the agent says why there are no Java frames, the samples
    // stay native, nothing else suffers.
    let dir = tempfile::tempdir().unwrap();
    let source = workspace_root().join("tests/fixtures/java/fake_libjvm.c");
    let lib = dir.path().join("libjvm.so");
    let status = std::process::Command::new("gcc")
        .args(["-O1", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&source)
        .args(["-DFAKE_LIBRARY"])
        .status()
        .unwrap();
    assert!(status.success());
    let program = dir.path().join("fake-java");
    let status = std::process::Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&program)
        .arg(&source)
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.path().display()))
        .status()
        .unwrap();
    assert!(status.success());
    let process = Running::start(&program, &[]);
    let output = dir.path().join("fake.pb.gz");
    let report = record(&[
        "--pid",
        &process.pid().to_string(),
        "-d",
        "3s",
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(report.contains("no Java frames for pid"), "{report}");
    let stacks = profiler_tests::pprof_raw::raw_stacks(&output);
    assert!(stacks.iter().any(|s| s.has("spin_here")), "{stacks:?}");
}

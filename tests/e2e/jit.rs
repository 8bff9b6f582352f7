//! JIT frames named from the runtime's perf map: a fixture copies two
//! machine-code loops into anonymous executable memory and names them in
//! `/tmp/perf-PID.map` (as Node.js `--perf-basic-prof`, the JVM's
//! perf-map-agent and Python's `-X perf` do); the agent must name its
//! samples from that file, in the fixture's 2:1 split — also when the
//! fixture runs in its own pid namespace, where the file carries the pid
//! the process sees itself as.

use std::path::Path;

use profiler_tests::*;

/// Frame-pointer flags, so the C callers of the JIT code are walkable.
const FLAGS: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer"];

/// Profiles `pid` for 3 s and returns the JIT leaves' sample counts
/// (hot_a, hot_b, unnamed JIT frames) and the agent's report.
fn profile_jit(pid: u32) -> (i64, i64, i64, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("jit.pb.gz");
    let pid = pid.to_string();
    let report = record(&[
        "--pid",
        &pid,
        "--duration",
        "3s",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stacks = stacks(&read_pprof(&out));
    let leaf_count = |keep: &dyn Fn(&str) -> bool| -> i64 {
        stacks
            .iter()
            .filter(|s| s.frames.first().is_some_and(|(name, _)| keep(name)))
            .map(|s| s.count)
            .sum()
    };
    let a = leaf_count(&|n| n == "JIT:hot_a");
    let b = leaf_count(&|n| n == "JIT:hot_b");
    let unnamed = leaf_count(&|n| n.starts_with("[jit]") || n.starts_with("[anon]"));
    (a, b, unnamed, report)
}

fn assert_split(a: i64, b: i64, unnamed: i64, report: &str) {
    let share_a = a as f64 / (a + b).max(1) as f64;
    assert!(
        a + b >= 150 && (0.57..=0.77).contains(&share_a),
        "JIT:hot_a {a}, JIT:hot_b {b} samples (expected about 2:1), {unnamed} unnamed\n{report}"
    );
    // Every sample in the JIT code is named: the map covers it.
    assert!(
        unnamed * 50 <= a + b,
        "{unnamed} JIT samples unnamed against {} named\n{report}",
        a + b
    );
    assert!(
        report.contains("named by the processes' perf maps"),
        "{report}"
    );
}

#[test]
fn jit_frames_are_named_from_the_perf_map() {
    require_bpf_privileges();
    let binary = build_c_fixture("jit", FLAGS);
    let fixture = Running::start(&binary, &["30"]);
    let map = format!("/tmp/perf-{}.map", fixture.pid());
    wait_for_file(&map);
    let (a, b, unnamed, report) = profile_jit(fixture.pid());
    drop(fixture);
    let _ = std::fs::remove_file(&map);
    assert_split(a, b, unnamed, &report);
}

#[test]
fn a_process_in_its_own_pid_namespace_is_named_from_its_own_pids_map() {
    require_bpf_privileges();
    let binary = build_c_fixture("jit", FLAGS);
    // Inside the namespace the fixture is pid 1 and writes
    // /tmp/perf-1.map; the agent knows it by its pid outside.
    let map = "/tmp/perf-1.map";
    let _ = std::fs::remove_file(map);
    let unshare = Running::start(
        Path::new("unshare"),
        &[
            "--pid",
            "--fork",
            "--kill-child",
            binary.to_str().unwrap(),
            "30",
        ],
    );
    wait_for_file(map);
    let inner = children(unshare.pid())
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("unshare {} has no child", unshare.pid()));
    assert_ne!(inner, 1);
    let (a, b, unnamed, report) = profile_jit(inner);
    drop(unshare);
    let _ = std::fs::remove_file(map);
    assert_split(a, b, unnamed, &report);
}

fn wait_for_file(path: &str) {
    for _ in 0..100 {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the JIT fixture did not write {path}");
}

/// Pids whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                // "pid (comm) state ppid ...": comm may hold spaces.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

//! JIT frames named from the runtime's perf map: a fixture copies two
//! machine-code loops into anonymous executable memory and names them in
//! `/tmp/perf-PID.map` (as Node.js `--perf-basic-prof`, the JVM's
//! perf-map-agent and Python's `-X perf` do); the agent must name its
//! samples from that file, in the fixture's 2:1 split — also when the
//! fixture runs in its own pid namespace, where the file carries the pid
//! the process sees itself as.

use std::path::Path;

use profiler_tests::shares::{Share, share_near};
use profiler_tests::{agent::*, fixtures::*, processes::*, profiles::*};

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
        // About 400 samples: the 2:1 split told from 1:1 beyond chance.
        "--duration",
        "4s",
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
    if let Err(why) = share_near("JIT:hot_a", Share::of(a, a + b), 2.0 / 3.0, 0.0, 0.12) {
        panic!("{why} (twice JIT:hot_b's work), {unnamed} unnamed\n{report}");
    }
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

/// A JavaScript program whose time goes to one named function.
const NODE_SCRIPT: &str = r#"
function hotLoop(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 31) + i) | 0;
  }
  return x;
}
const end = Date.now() + Number(process.argv[2]) * 1000;
let sink = 0;
while (Date.now() < end) {
  sink = (sink + hotLoop(1000000)) | 0;
}
console.log(sink);
"#;

/// Starts `node [FLAGS] script SECONDS` (Debian's nodejs, installed by
/// `cargo xtask setup --tests`).
fn start_node(dir: &Path, flags: &[&str], seconds: &str) -> Running {
    let script = dir.join("hot.js");
    std::fs::write(&script, NODE_SCRIPT).unwrap();
    let node = ["/usr/bin/node", "/usr/bin/nodejs"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("Node.js missing: run `cargo xtask setup --tests` (apt install nodejs)");
    let mut args: Vec<&str> = flags.to_vec();
    args.push(script.to_str().unwrap());
    args.push(seconds);
    Running::start_in(dir, Path::new(node), &args)
}

/// The stacks of `pid` over 3 s, and the agent's report.
fn node_profile(pid: u32) -> (Vec<Stack>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("node.pb.gz");
    let pid = pid.to_string();
    let report = record(&[
        "--pid",
        &pid,
        "--duration",
        "3s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    (stacks(&read_pprof(&out)), report)
}

/// Samples with a frame whose name contains `name`, and all samples.
fn samples_naming(stacks: &[Stack], name: &str) -> (i64, i64) {
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let named: i64 = stacks
        .iter()
        .filter(|s| s.frames.iter().any(|(frame, _)| frame.contains(name)))
        .map(|s| s.count)
        .sum();
    (named, total)
}

/// Node.js with `--perf-basic-prof`: its JIT-compiled function is named
/// from the map V8 writes.
#[test]
fn node_functions_are_named_from_its_perf_map() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &["--perf-basic-prof"], "30");
    let map = format!("/tmp/perf-{}.map", node.pid());
    wait_for_file(&map);
    // Let V8 optimize the loop and name the optimized code.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (stacks, report) = node_profile(node.pid());
    let (named, total) = samples_naming(&stacks, "hotLoop");
    drop(node);
    let _ = std::fs::remove_file(&map);
    assert!(
        total > 100 && named * 2 > total,
        "{named} of {total} samples of node name hotLoop\n{report}"
    );
}

/// A perf map written by a hostile process: malformed lines, more than
/// the agent reads, a symlink to an endless device, a FIFO nobody writes
/// (a naive reader blocks on either forever). The profile is still
/// written, promptly, and no line of a bad map names a frame. (Links out
/// of a container's root: tests/e2e/security.rs.)
#[test]
fn a_malformed_oversized_or_linked_perf_map_is_survived() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    // No --perf-basic-prof: the maps below are the only ones it has.
    let node = start_node(dir.path(), &[], "60");
    let map = format!("/tmp/perf-{}.map", node.pid());
    // Past start-up, into its loop.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let garbage = {
        let mut text = String::new();
        for i in 0..20_000u64 {
            text.push_str(match i % 5 {
                0 => "zz not a line\n",
                1 => "0 0 EMPTY_RANGE\n",
                2 => "ffffffffffffffff ffff WRAPS_AROUND\n",
                3 => "\u{0}\u{1}\u{2} binary \u{7f}\n",
                _ => "12 34\n",
            });
        }
        text
    };
    for what in ["malformed", "oversized", "a symlink to /dev/zero", "a FIFO"] {
        let _ = std::fs::remove_file(&map);
        match what {
            "malformed" => std::fs::write(&map, &garbage).unwrap(),
            // Sparse: 80 MiB of NUL bytes, past the 64 MiB the agent reads.
            "oversized" => std::fs::File::create(&map)
                .unwrap()
                .set_len(80 << 20)
                .unwrap(),
            "a FIFO" => assert!(
                std::process::Command::new("mkfifo")
                    .arg(&map)
                    .status()
                    .unwrap()
                    .success()
            ),
            _ => std::os::unix::fs::symlink("/dev/zero", &map).unwrap(),
        }
        let started = std::time::Instant::now();
        let (stacks, report) = node_profile(node.pid());
        let took = started.elapsed();
        for name in ["EMPTY_RANGE", "WRAPS_AROUND", "binary"] {
            let (named, total) = samples_naming(&stacks, name);
            assert!(total > 0, "{what}: no samples\n{report}");
            assert_eq!(
                named, 0,
                "{what}: frames named {name} from the bad map\n{report}"
            );
        }
        // A liveness bound, not a speed target: a stalled agent never
        // finishes a 3 s profile in a minute.
        assert!(
            took < std::time::Duration::from_secs(60),
            "{what}: the 3 s profile took {took:?}"
        );
    }
    let _ = std::fs::remove_file(&map);
    drop(node);
}

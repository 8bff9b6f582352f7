//! Python frames from outside: CPython 3.10 to 3.14, stripped distribution
//! builds and source builds with a shared libpython, on the host and
//! chrooted into another Debian suite's root (another libc), profiled by
//! the agent while py-spy (`--nonblocking`) samples the same process.
//!
//! The fixture (tests/fixtures/python/workload.py) is a call tree whose
//! structure and lines the tests read from the script itself, two leaves
//! with the same loop body run 7:3, a C function calling back into Python
//! (`sorted` with a key function), a method, several threads, and
//! recursion deeper than the walker follows. The oracles: the script (caller
//! order, executing lines), py-spy (leaf shares within 5 points, the same
//! lines), and the threads the kernel names.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use profiler_tests::agent::*;
use profiler_tests::go::go_toolchain_root;
use profiler_tests::pprof_raw::{LinedStack, RawProfile};
use profiler_tests::shares::{Share, share_near, shares_agree};

/// How a test runs one interpreter.
struct Interpreter {
    name: &'static str,
    /// The minor version (Shape.area's name is `area` before 3.11: no
    /// qualified names).
    minor: u32,
    /// The program, run as is, or in `root` with chroot.
    python: PathBuf,
    root: Option<PathBuf>,
}

/// pyenv's source builds (`--enable-shared`: the interpreter is in
/// libpython3.X.so), on this kind of machine from its image.
fn pyenv(version: &str) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".pyenv")
        });
    let minor = version.rsplitn(2, '.').last().unwrap_or(version);
    let python = root
        .join("versions")
        .join(version)
        .join("bin")
        .join(format!("python{minor}"));
    assert!(
        python.exists(),
        "{} is missing: this machine's image has pyenv's CPython {version} (a source build \
         with a shared libpython); without it this test cannot run",
        python.display()
    );
    python
}

/// A Debian suite's CPython, unpacked by `cargo xtask setup --tests`.
fn debian_root(suite: &str, version: &str) -> (PathBuf, PathBuf) {
    let root = go_toolchain_root().join("python").join(suite).join("root");
    let python = PathBuf::from(format!("/usr/bin/python{version}"));
    assert!(
        root.join(python.strip_prefix("/").unwrap()).exists(),
        "Debian {suite}'s python{version} is not unpacked under {}: run `cargo xtask setup --tests`",
        root.display()
    );
    (root, python)
}

/// A running fixture, killed when dropped.
struct Workload {
    child: Child,
    /// Where the script is, as the interpreter names it (co_filename).
    script: String,
}

impl Workload {
    fn start(interpreter: &Interpreter, seconds: u32, mode: &str) -> Workload {
        let source = workspace_root().join("tests/fixtures/python/workload.py");
        let (mut command, script) = match &interpreter.root {
            Some(root) => {
                let name = format!("workload-{}.py", std::process::id());
                std::fs::copy(&source, root.join("tmp").join(&name)).unwrap();
                let inside = format!("/tmp/{name}");
                let mut command = Command::new("chroot");
                command.arg(root).arg(&interpreter.python).arg(&inside);
                (command, inside)
            }
            None => {
                let mut command = Command::new(&interpreter.python);
                command.arg(&source);
                (command, source.display().to_string())
            }
        };
        let mut child = command
            .args([seconds.to_string(), mode.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", interpreter.name));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{} did not start", interpreter.name);
        Workload { child, script }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Line numbers of the fixture, read from the script.
struct ScriptLines {
    text: String,
}

impl ScriptLines {
    fn read() -> ScriptLines {
        let path = workspace_root().join("tests/fixtures/python/workload.py");
        ScriptLines {
            text: std::fs::read_to_string(path).unwrap(),
        }
    }

    /// The line holding `needle` (once in the script).
    fn of(&self, needle: &str) -> u32 {
        let lines: Vec<u32> = self
            .text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .map(|(i, _)| i as u32 + 1)
            .collect();
        assert_eq!(lines.len(), 1, "{needle:?} in workload.py: {lines:?}");
        lines[0]
    }

    /// The lines of function `name`'s body (def to the next blank line).
    fn body_of(&self, name: &str) -> std::ops::RangeInclusive<u32> {
        let start = self.of(&format!("def {name}("));
        let end = self
            .text
            .lines()
            .enumerate()
            .skip(start as usize)
            .find(|(_, l)| l.trim().is_empty())
            .map_or(start, |(i, _)| i as u32);
        start..=end
    }
}

/// A sample's Python frames (a `.py` file), leaf first: (function, line).
fn python_frames(stack: &LinedStack) -> Vec<(String, u32)> {
    stack
        .frames
        .iter()
        .filter(|(line, _)| line.file.ends_with(".py"))
        .map(|(line, _)| (line.function.clone(), line.line))
        .collect()
}

/// py-spy's raw output: (frames root first as (function, line), count).
fn read_py_spy(path: &Path) -> Vec<(Vec<(String, u32)>, u64)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter_map(|line| {
            let (frames, count) = line.rsplit_once(' ')?;
            let frames = frames
                .split(';')
                .filter_map(|frame| {
                    let (function, place) = frame.rsplit_once(" (")?;
                    let line = place
                        .trim_end_matches(')')
                        .rsplit_once(':')?
                        .1
                        .parse()
                        .ok()?;
                    Some((function.to_string(), line))
                })
                .collect();
            Some((frames, count.parse().ok()?))
        })
        .collect()
}

/// Profiles the fixture in `tree` mode with the agent and py-spy at the
/// same time; checks caller order, lines and the 7:3 shares against the
/// script and py-spy.
fn tree_agrees_with_the_script_and_py_spy(interpreter: &Interpreter) {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let workload = Workload::start(interpreter, 16, "tree");
    let pid = workload.pid().to_string();
    let spy_out = dir.path().join("spy.txt");
    let py_spy = go_toolchain_root().join("py-spy/bin/py-spy");
    assert!(
        py_spy.exists(),
        "py-spy is missing at {}: run `cargo xtask setup --tests`",
        py_spy.display()
    );
    let spy = {
        let (py_spy, pid, spy_out) = (py_spy.clone(), pid.clone(), spy_out.clone());
        std::thread::spawn(move || {
            // A rate apart from the agent's (97 Hz) and from round
            // numbers: neither locks onto the other or onto the loop.
            Command::new(&py_spy)
                .args(["record", "--nonblocking", "-f", "raw"])
                .args(["-r", "89", "-d", "10"])
                .args(["-p", &pid, "-o"])
                .arg(&spy_out)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .expect("running py-spy")
        })
    };
    let out = dir.path().join("python.pb.gz");
    let report = record(&[
        "--pid",
        &pid,
        "-F",
        "97",
        "-d",
        "10s",
        "-o",
        out.to_str().unwrap(),
    ]);
    let spy = spy.join().unwrap();
    assert!(
        spy.status.success(),
        "py-spy failed: {}",
        String::from_utf8_lossy(&spy.stderr)
    );

    let script = workload.script.clone();
    drop(workload);
    let lines = ScriptLines::read();
    let stacks = RawProfile::read(&out).lined_stacks();
    // Frames carry the file as the interpreter names it (co_filename).
    assert!(
        stacks
            .iter()
            .flat_map(|s| &s.frames)
            .any(|(line, _)| line.function == "leaf_a" && line.file == script),
        "{}: no leaf_a frame in {script}",
        interpreter.name
    );
    let leaves = ["leaf_a", "leaf_b"];
    let call_of = |leaf: &str| match leaf {
        "leaf_a" => lines.of("leaf_a(700000)"),
        _ => lines.of("leaf_b(300000)"),
    };
    let expected_callers = [
        ("branch", None),
        ("root", Some(lines.of("        branch()"))),
        ("main", Some(lines.of("        root(deadline)"))),
        ("<module>", Some(lines.of("    main()"))),
    ];
    let (mut counts, mut total, mut wrong) = (HashMap::<&str, i64>::new(), 0i64, Vec::new());
    let mut leaf_lines: HashMap<&str, BTreeSet<u32>> = HashMap::new();
    for stack in &stacks {
        let frames = python_frames(stack);
        let Some(leaf) = leaves
            .iter()
            .find(|l| frames.first().is_some_and(|f| f.0 == **l))
        else {
            continue;
        };
        total += stack.count;
        *counts.entry(leaf).or_default() += stack.count;
        let body = lines.body_of(leaf);
        let (_, leaf_line) = frames[0];
        if !body.contains(&leaf_line) {
            wrong.push(format!("{leaf} at line {leaf_line}, outside {body:?}"));
        }
        leaf_lines.entry(leaf).or_default().insert(leaf_line);
        // The callers, in order, each at the line of its call.
        let callers: Vec<(&str, u32)> = frames[1..].iter().map(|(f, l)| (f.as_str(), *l)).collect();
        let expected: Vec<(&str, u32)> = expected_callers
            .iter()
            .map(|&(f, l)| (f, l.unwrap_or_else(|| call_of(leaf))))
            .collect();
        if callers != expected {
            wrong.push(format!(
                "{leaf}: callers {callers:?}, expected {expected:?}"
            ));
        }
    }
    assert!(
        total >= 200,
        "{}: only {total} samples in leaf_a/leaf_b:\n{report}",
        interpreter.name
    );
    assert!(
        wrong.len() as i64 * 100 <= total,
        "{}: {} of {total} samples have Python frames out of the script's order or lines \
         (first: {:?})\n{report}",
        interpreter.name,
        wrong.len(),
        wrong.iter().take(5).collect::<Vec<_>>()
    );

    // py-spy's reading of the same seconds.
    let spied = read_py_spy(&spy_out);
    let mut spy_counts: HashMap<&str, u64> = HashMap::new();
    let mut spy_lines: HashMap<&str, BTreeSet<u32>> = HashMap::new();
    for (frames, count) in &spied {
        if let Some((leaf, line)) = frames.last()
            && let Some(name) = leaves.iter().find(|l| **l == leaf)
        {
            *spy_counts.entry(name).or_default() += count;
            spy_lines.entry(name).or_default().insert(*line);
        }
    }
    let spy_total: u64 = spy_counts.values().sum();
    assert!(spy_total >= 200, "py-spy saw {spy_total} leaf samples");
    let ours = Share::of(counts.get("leaf_a").copied().unwrap_or(0), total);
    let theirs = Share::of(
        spy_counts.get("leaf_a").copied().unwrap_or(0) as i64,
        spy_total as i64,
    );
    eprintln!(
        "{}: leaf_a {:.1}% of {total} agent samples, {:.1}% of {spy_total} py-spy samples",
        interpreter.name,
        ours.value() * 100.0,
        theirs.value() * 100.0
    );
    // Each sampler counts about 900 leaves in 10 s, so either share is off
    // by chance by 1.5 points (one standard error), and their difference by
    // 2: the bands are 4.5 of those, and 2 points more for the script's
    // 7:3 loop counts not being exactly 7:3 of its time.
    for check in [
        shares_agree("leaf_a, agent against py-spy", ours, theirs, 0.0, 0.12),
        share_near("leaf_a against the script's 7:3", ours, 0.7, 0.02, 0.1),
    ] {
        if let Err(why) = check {
            panic!("{}: {why}", interpreter.name);
        }
    }
    // The executing lines: the loop's own (py-spy reads the same ones).
    for leaf in leaves {
        let (ours, theirs) = (&leaf_lines[leaf], &spy_lines[leaf]);
        assert!(
            ours.is_subset(&lines.body_of(leaf).collect()) && !ours.is_disjoint(theirs),
            "{} {leaf}: lines {ours:?}, py-spy's {theirs:?}",
            interpreter.name
        );
    }
}

/// Profiles the fixture in `all` mode: threads keep their own stacks, a
/// C function calls back into Python, the method has its qualified name,
/// and recursion deeper than the walker follows is cut with a mark.
fn threads_callbacks_and_cuts(interpreter: &Interpreter) {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let workload = Workload::start(interpreter, 10, "all");
    let out = dir.path().join("python.pb.gz");
    let report = record(&[
        "--pid",
        &workload.pid().to_string(),
        "-d",
        "4s",
        "-o",
        out.to_str().unwrap(),
    ]);
    drop(workload);
    let stacks = RawProfile::read(&out).lined_stacks();
    let method = if interpreter.minor >= 11 {
        "Shape.area"
    } else {
        "area"
    };
    let mut tids: HashMap<&str, BTreeSet<String>> = HashMap::new();
    let (mut callbacks, mut cut, mut deep) = (0, 0, 0);
    for stack in &stacks {
        let frames = python_frames(stack);
        let names: Vec<&str> = frames.iter().map(|(f, _)| f.as_str()).collect();
        let tid = stack.labels.get("tid").cloned().unwrap_or_default();
        for leaf in ["leaf_a", "key_function", method, "spin"] {
            if names.first() == Some(&leaf) {
                tids.entry(leaf).or_default().insert(tid.clone());
            }
        }
        // sorted() is C: native frames lie between sort_forever and the
        // key function it calls back.
        if names.first() == Some(&"key_function") {
            assert_eq!(names.get(1), Some(&"sort_forever"), "{names:?}");
            let all: Vec<&str> = stack
                .frames
                .iter()
                .map(|(l, _)| l.function.as_str())
                .collect();
            let key = all.iter().position(|f| *f == "key_function").unwrap();
            let caller = all.iter().position(|f| *f == "sort_forever").unwrap();
            assert!(caller > key + 1, "no native frame between them: {all:?}");
            callbacks += stack.count;
        }
        if names.first() == Some(&method) {
            assert!(
                names.contains(&"Thread.run") || names.contains(&"run"),
                "{names:?}"
            );
        }
        let all: Vec<&str> = stack
            .frames
            .iter()
            .map(|(l, _)| l.function.as_str())
            .collect();
        if let Some(mark) = all.iter().position(|f| *f == "[python: deeper frames cut]") {
            cut += stack.count;
            // Below the mark, the recursion (and its leaf).
            let below: BTreeSet<&str> = all[..mark]
                .iter()
                .copied()
                .filter(|f| names.contains(f))
                .collect();
            assert!(
                below.iter().all(|f| *f == "recurse" || *f == "spin"),
                "{below:?}"
            );
        }
        if names.iter().filter(|f| **f == "recurse").count() >= 100 {
            deep += stack.count;
        }
    }
    assert!(
        callbacks >= 10,
        "{}: {callbacks} key_function samples\n{report}",
        interpreter.name
    );
    assert!(
        cut >= 10 && deep >= 10,
        "{}: {cut} cut, {deep} deep\n{report}",
        interpreter.name
    );
    // Each thread's work on its own thread, and four threads.
    let threads: Vec<&BTreeSet<String>> = tids.values().collect();
    assert_eq!(
        tids.len(),
        4,
        "{}: leaves seen {tids:?}\n{report}",
        interpreter.name
    );
    for (i, a) in threads.iter().enumerate() {
        assert_eq!(
            a.len(),
            1,
            "{}: one leaf on several threads: {tids:?}",
            interpreter.name
        );
        for b in &threads[i + 1..] {
            assert!(
                a.is_disjoint(b),
                "{}: two leaves on one thread: {tids:?}",
                interpreter.name
            );
        }
    }
    assert!(
        report.contains("Python: frames read in 1 processes"),
        "{report}"
    );
}

fn check(interpreter: Interpreter) {
    tree_agrees_with_the_script_and_py_spy(&interpreter);
    threads_callbacks_and_cuts(&interpreter);
}

#[test]
fn python_3_10_source_build_with_a_shared_libpython() {
    check(Interpreter {
        name: "pyenv 3.10",
        minor: 10,
        python: pyenv("3.10.13"),
        root: None,
    });
}

#[test]
fn python_3_11_debian_bookworm_stripped() {
    check(Interpreter {
        name: "Debian python3.11",
        minor: 11,
        python: PathBuf::from("/usr/bin/python3.11"),
        root: None,
    });
}

#[test]
fn python_3_12_source_build_with_a_shared_libpython() {
    check(Interpreter {
        name: "pyenv 3.12",
        minor: 12,
        python: pyenv("3.12.1"),
        root: None,
    });
}

#[test]
fn python_3_13_debian_trixie_in_its_own_root() {
    let (root, python) = debian_root("trixie", "3.13");
    check(Interpreter {
        name: "Debian trixie python3.13",
        minor: 13,
        python,
        root: Some(root),
    });
}

#[test]
fn python_3_13_source_build_with_a_shared_libpython() {
    check(Interpreter {
        name: "pyenv 3.13",
        minor: 13,
        python: pyenv("3.13.0"),
        root: None,
    });
}

#[test]
fn python_3_14_debian_sid_in_its_own_root() {
    let (root, python) = debian_root("sid", "3.14");
    check(Interpreter {
        name: "Debian sid python3.14",
        minor: 14,
        python,
        root: Some(root),
    });
}

#[test]
fn a_profile_without_python_frames_when_asked() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let workload = Workload::start(
        &Interpreter {
            name: "Debian python3.11",
            minor: 11,
            python: PathBuf::from("/usr/bin/python3.11"),
            root: None,
        },
        6,
        "tree",
    );
    let out = dir.path().join("native.pb.gz");
    record(&[
        "--pid",
        &workload.pid().to_string(),
        "-d",
        "2s",
        "--runtimes",
        "go,hotspot",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stacks = RawProfile::read(&out).lined_stacks();
    assert!(stacks.iter().map(|s| s.count).sum::<i64>() >= 100);
    assert!(stacks.iter().all(|s| python_frames(s).is_empty()));
}

/// Starts the forged interpreter in `mode` for `seconds`, once it says it
/// is ready.
fn start_fake_cpython(fake: &Path, mode: &str, seconds: &str) -> Child {
    let mut child = Command::new(fake)
        .args([mode, seconds])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "{mode}");
    child
}

/// Builds the forged interpreter (tests/fixtures/python/fake_cpython.c).
fn build_fake_cpython(dir: &Path) -> PathBuf {
    let out = dir.join("fake_cpython");
    let source = workspace_root().join("tests/fixtures/python/fake_cpython.c");
    let output = Command::new("cc")
        .args(["-O1", "-g", "-rdynamic", "-o"])
        .arg(&out)
        .arg(&source)
        .output()
        .expect("running cc (`cargo xtask setup --tests`)");
    assert!(
        output.status.success(),
        "cc {}: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// A process that forges an interpreter's memory (a frame that is its own
/// caller, a name of 100 million characters with a newline and a NUL in
/// it, a garbage line table, debug offsets that point nowhere, a thread
/// list that loops) costs the agent nothing but that process's Python
/// frames: every walk is bounded, cut with a mark or refused with one
/// line, and the profile is written.
#[test]
fn forged_interpreter_memory_is_bounded_and_marked() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fake = build_fake_cpython(dir.path());
    for mode in ["loop", "offsets", "wide", "threads"] {
        let mut child = start_fake_cpython(&fake, mode, "8");
        let out = dir.path().join(format!("{mode}.pb.gz"));
        let report = record(&[
            "--pid",
            &child.id().to_string(),
            "-d",
            "3s",
            "-o",
            out.to_str().unwrap(),
        ]);
        let _ = child.kill();
        let _ = child.wait();
        let stacks = RawProfile::read(&out).lined_stacks();
        let total: i64 = stacks.iter().map(|s| s.count).sum();
        assert!(total >= 150, "{mode}: {total} samples\n{report}");
        let names: BTreeSet<String> = stacks
            .iter()
            .flat_map(|s| s.frames.iter().map(|(l, _)| l.function.clone()))
            .collect();
        match mode {
            "loop" => {
                assert!(
                    report.contains("Python: frames read in 1 processes"),
                    "{report}"
                );
                assert!(names.contains("[python: deeper frames cut]"), "{names:?}");
                // The name, cut at 1024 characters and marked.
                let forged = names
                    .iter()
                    .find(|n| n.starts_with("NNNN"))
                    .unwrap_or_else(|| panic!("no forged name among {names:#?}\n{report}"));
                assert_eq!(forged.chars().count(), 1025, "{forged:.40}…");
                assert!(forged.ends_with('…'));
                // Its newline and NUL (and whatever control bytes follow
                // the 472 characters it holds) shown as '?': the name
                // stays on its line of `go tool pprof -raw`.
                assert!(forged.starts_with(&format!("{}??N", "N".repeat(100))));
                assert!(!forged.chars().any(char::is_control), "{forged:?}");
            }
            "offsets" => {
                assert!(
                    report.contains("no Python frames for pid")
                        && report.contains("is not an offset"),
                    "{report}"
                );
                assert!(names.contains("_PyEval_EvalFrameDefault"), "{names:?}");
            }
            "wide" => {
                // 65536 does not fit the walker's 16 bits: refused, not
                // truncated to 0 (which reads a field the layout never
                // named).
                assert!(
                    report.contains("thread_state.current_frame = 65536 is not an offset"),
                    "{report}"
                );
                assert!(names.contains("_PyEval_EvalFrameDefault"), "{names:?}");
            }
            _ => {
                // The looping list is read once round: one thread.
                assert!(report.contains("1 threads"), "{report}");
            }
        }
    }
}

/// A process that moves its frame over 4096 forged code objects, each
/// claiming a 1 GiB line table (256 KiB of it readable): kept without a
/// bound, what the agent reads of them grows it by hundreds of MiB (1 GiB
/// at 4096 objects before the budget). Within the runtime caches' budget
/// the process evicts its own entries: the agent stays small, the target
/// lives, its frames are named and its native frames kept.
#[test]
fn forged_code_objects_cannot_grow_the_agent() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let fake = build_fake_cpython(dir.path());
    let mut child = start_fake_cpython(&fake, "codes", "20");
    let out = dir.path().join("codes.pb.gz");
    let watched = profiler_tests::agent::record_watched(&[
        "--pid",
        &child.id().to_string(),
        "-F",
        "1000",
        "-d",
        "3s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let report = &watched.report;
    println!(
        "peak RSS {} MiB in {:?}\n{report}",
        watched.peak_kib / 1024,
        watched.took
    );
    assert!(alive, "the forging process died");
    let stacks = RawProfile::read(&out).lined_stacks();
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    assert!(total >= 1000, "{total} samples\n{report}");
    // Its Python frames are named, and its native frames are kept.
    let count = |keep: &dyn Fn(&str) -> bool| -> i64 {
        stacks
            .iter()
            .filter(|s| s.frames.iter().any(|(l, _)| keep(&l.function)))
            .map(|s| s.count)
            .sum()
    };
    let named = count(&|f| f == "forged");
    let native = count(&|f| f == "main");
    assert!(named * 2 >= total, "{named} of {total} named\n{report}");
    assert!(
        native * 10 >= total * 8,
        "{native} of {total} reach main\n{report}"
    );
    // Far more was read than the cache may keep: it evicted, and the
    // report says so.
    let evicted: u64 = report
        .split("cpython code_objects: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no eviction of code objects reported:\n{report}"));
    assert!(evicted > 100, "{evicted} evicted\n{report}");
    assert!(
        watched.peak_kib < 200 * 1024,
        "the agent grew to {} MiB\n{report}",
        watched.peak_kib / 1024
    );
}

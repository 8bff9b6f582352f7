//! Complete Go stacks: the share of samples whose user stack reaches its
//! root (`runtime.goexit`, `runtime.main`, `runtime.mstart`), measured on a
//! workload dominated by crypto/sha256's assembly (which uses BP as a
//! general register, so frame-pointer walks stop inside it) and on a
//! 200-deep recursion. Printed with and without the pcsp unwind tables.

use std::path::{Path, PathBuf};

use profiler_tests::{agent::*, go::*, processes::*, profiles::*};

const ROOTS: &[&str] = &[
    "runtime.goexit",
    "runtime.main",
    "runtime.mstart",
    "runtime.rt0_go",
];

/// The scheduler's switches to a thread's own stack: `runtime.mcall`, and
/// `runtime.morestack` (a goroutine preempted at its stack check).
const SCHEDULER_SWITCHES: &[&str] = &["runtime.mcall", "runtime.morestack"];

/// Whether `stack` reaches its root: one of `ROOTS`, or the scheduler's
/// stack switch (`runtime.mcall`, or `runtime.morestack` when a goroutine
/// was preempted at its stack check) with the runtime function it called
/// on the thread's own stack above it (`schedule`, or on the way there
/// `gopreempt_m`, `park_m`, ...). There the thread has put its goroutine
/// away: the thread's own stack starts at the switch, and Go's own
/// traceback stops there too (about 1% of the samples of a preempted
/// CPU-bound program; under load, when the runtime wakes threads on the
/// way to `schedule`, 11% in one run).
fn reaches_root(stack: &Stack) -> bool {
    let [.., (called, _), (last, _)] = &stack.frames[..] else {
        return stack
            .frames
            .last()
            .is_some_and(|(name, _)| ROOTS.contains(&name.as_str()));
    };
    ROOTS.contains(&last.as_str())
        || (SCHEDULER_SWITCHES.contains(&last.as_str()) && called.starts_with("runtime."))
}

/// The oldest and newest toolchains the project verifies.
const VERSIONS: &[&str] = &["1.19", "1.27.3"];

fn build(version: &str) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("go-unwind")
        .tempdir()
        .unwrap()
        .keep();
    let out = dir.join(format!("unwind-{version}"));
    go_command(
        &go_toolchain(version),
        &workspace_root().join("tests/fixtures/go-unwind"),
        &["build", "-o", out.to_str().unwrap(), "."],
        &[],
    );
    out
}

/// The stacks of a profile of `fixture` for `duration` (with `extra`
/// options), and the agent's report.
fn profile(fixture: &Running, duration: &str, extra: &[&str]) -> (Vec<Stack>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("go.pb.gz");
    let pid = fixture.pid().to_string();
    let mut args = vec!["--pid", &pid, "--duration", duration, "-q", "-o"];
    args.push(out.to_str().unwrap());
    args.extend_from_slice(extra);
    let report = record(&args);
    (stacks(&read_pprof(&out)), report)
}

/// (samples reaching a root, samples, the stacks, the agent's report) for
/// one profile of `workload`.
fn root_share(
    binary: &Path,
    workload: &str,
    frame_pointers_only: bool,
) -> (i64, i64, Vec<Stack>, String) {
    require_bpf_privileges();
    let fixture = Running::start(binary, &[workload, "30"]);
    let extra: &[&str] = if frame_pointers_only {
        &["--frame-pointers-only"]
    } else {
        &[]
    };
    let (stacks, report) = profile(&fixture, "3s", extra);
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let rooted: i64 = stacks
        .iter()
        .filter(|s| reaches_root(s))
        .map(|s| s.count)
        .sum();
    (rooted, total, stacks, report)
}

/// The report's "N Go callers by their frame records".
fn frame_record_callers(report: &str) -> u64 {
    report
        .split(" Go callers by their frame records")
        .next()
        .and_then(|head| head.rsplit(", ").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of Go callers by frame records in:\n{report}"))
}

fn check(workload: &str, hot_function: &str) {
    for version in VERSIONS {
        let binary = build(version);
        let (fp_rooted, fp_total, _, _) = root_share(&binary, workload, true);
        let (rooted, total, stacks, report) = root_share(&binary, workload, false);
        let share = 100.0 * rooted as f64 / total.max(1) as f64;
        let fp_share = 100.0 * fp_rooted as f64 / fp_total.max(1) as f64;
        println!(
            "Go {version} {workload}: {share:.1}% of {total} samples reach a root with unwind \
             tables, {fp_share:.1}% of {fp_total} with frame pointers only"
        );
        assert!(total > 100, "Go {version} {workload}: only {total} samples");
        assert!(
            stacks.iter().any(|s| {
                s.frames.iter().any(|(name, _)| name.contains(hot_function)) && s.has("main.main")
            }),
            "Go {version} {workload}: no stack through {hot_function} and main.main"
        );
        let incomplete: Vec<_> = stacks.iter().filter(|s| !reaches_root(s)).take(5).collect();
        for stack in &incomplete {
            println!("  not rooted: {}", stack.user_chain().join(";"));
        }
        assert!(
            share >= 99.0,
            "Go {version} {workload}: {share:.1}% of samples reach a root (target 99%); \
             some that do not: {incomplete:#?}"
        );
        // Callers are stepped by their frame records (the checks above
        // hold with them; Go 1.19 leaves its frameless callers out, see
        // `go_callers_stepped_by_frame_record_have_one`).
        let by_records = frame_record_callers(&report);
        assert!(by_records > 0, "Go {version} {workload}: {report}");
    }
}

#[test]
fn go_sha256_stacks_reach_their_root() {
    // crypto/sha256.block up to Go 1.23, crypto/internal/fips140/sha256.* after.
    check("sha256", "sha256.block");
}

#[test]
fn go_deep_recursion_stacks_reach_their_root() {
    check("deep", "main.recurse");
}

/// Go's signal handler runs on the signal stack and returns through the
/// restorer Go installs (amd64: `runtime.sigreturn__sigaction`, before Go
/// 1.20 `runtime.sigreturn`) — an address the walker looks up one byte
/// back, in the function before it. The `labels` workload takes its own
/// CPU profile at 500 Hz, so its threads spend a measurable share of their
/// time in `runtime.sigprof`: each such sample must continue through the
/// signal frame into the goroutine it interrupted, down to its root.
#[test]
fn go_signal_handlers_unwind_into_the_interrupted_goroutine() {
    require_bpf_privileges();
    // Built before the fixtures start, so that none runs out while cargo
    // builds the agent.
    agent_bin();
    for version in VERSIONS {
        let binary = build(version);
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own.pprof");
        let fixture = Running::start(&binary, &["labels", "30", own.to_str().unwrap()]);
        let (stacks, report) = profile(&fixture, "6s", &["-F", "997"]);
        let handled: Vec<&Stack> = stacks
            .iter()
            .filter(|s| s.has("runtime.sigtramp"))
            .collect();
        let samples: i64 = handled.iter().map(|s| s.count).sum();
        println!("Go {version}: {samples} samples in the signal handler\n{report}");
        assert!(
            samples >= 5,
            "Go {version}: only {samples} samples in runtime.sigtramp\n{report}"
        );
        for stack in &handled {
            let restorer = stack
                .frames
                .iter()
                .position(|(name, _)| name.starts_with("runtime.sigreturn"));
            let interrupted = restorer.and_then(|i| Some((i + 1, stack.frames.get(i + 1)?)));
            // A root, or where the tables stop on purpose (docs/testing.md, Status):
            // the scheduler's stack switch (runtime.mcall), stack growth
            // (runtime.morestack), or an interrupted runtime function that
            // had moved to the system stack (the vDSO calls nanotime1 and
            // walltime).
            let ended_well = stack.frames.last().is_some_and(|(name, _)| {
                ROOTS.contains(&name.as_str()) || SCHEDULER_SWITCHES.contains(&name.as_str())
            }) || interrupted.is_some_and(|(i, (name, _))| {
                i + 1 == stack.frames.len() && name.starts_with("runtime.")
            });
            assert!(
                interrupted.is_some_and(|(_, (name, _))| !name.starts_with('[')) && ended_well,
                "Go {version}: a handler sample does not continue through the signal frame \
                 into a named, rooted goroutine stack: {stack:?}"
            );
            // The handler runs on the signal goroutine; its samples carry
            // the labels of the goroutine it interrupted, as Go's own
            // profile does.
            // The wide label set's kept labels may leave out its endpoint.
            let endpoint = match stack.labels.get("endpoint").map(String::as_str) {
                None if is_wide_label_set(&stack.labels) => Some("/wide"),
                endpoint => endpoint,
            };
            let expected: &[Option<&str>] = if stack.has("main.heavy") {
                &[Some("/checkout")]
            } else if stack.has("main.medium") {
                &[Some("/search"), Some("/wide")]
            } else if stack.has("main.lightLoop") {
                &[None]
            } else {
                continue;
            };
            assert!(
                expected.contains(&endpoint),
                "Go {version}: a handler sample is labelled {endpoint:?}, not as the work it \
                 interrupted ({expected:?}): {stack:?}"
            );
        }
        assert_signal_frames_walked(&report);
    }
}

/// A fault in Go code enters `runtime.sigpanic` by a call the signal
/// handler fakes from the faulting PC: that PC is exact (here it is
/// `main.load`'s first instruction, so one byte back is another
/// function), and on arm64 the handler saved LR in 16 bytes below SP first
/// (tests/e2e/arm64.rs has that lane). The `faults` workload spins in a
/// deferred function that runs under sigpanic, and writes Go's own stack
/// of it (`runtime.Callers`): every sample there must be that stack, frame
/// for frame.
#[test]
fn go_stacks_through_a_faulting_frame_are_go_s_own() {
    require_bpf_privileges();
    agent_bin();
    for version in VERSIONS {
        let binary = build(version);
        let dir = tempfile::tempdir().unwrap();
        let own_file = dir.path().join("own.txt");
        let fixture = Running::start(&binary, &["faults", "30", own_file.to_str().unwrap()]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let own = loop {
            let text = std::fs::read_to_string(&own_file).unwrap_or_default();
            if let Some(own) = go_own_stack(&text) {
                break own;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Go {version}: the faults workload wrote no stack of its own in 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(
            own.iter().any(|f| f == "runtime.sigpanic") && own.iter().any(|f| f == "main.load"),
            "Go {version}: Go's own stack does not go through the fault: {own:?}"
        );
        let (stacks, _) = profile(&fixture, "3s", &[]);
        // Go 1.19 runs an open-coded defer through these two, and its
        // traceback leaves them out (deferCallSave is marked a wrapper).
        let elided = ["runtime.runOpenDeferFrame", "runtime.deferCallSave"];
        let (agree, total, disagree) = agree_from(&stacks, "main.afterFault", &own, &elided);
        println!(
            "Go {version}: {agree} of {total} samples in main.afterFault are Go's own stack {}",
            own.join(";")
        );
        assert!(
            total > 100,
            "Go {version}: only {total} samples in main.afterFault"
        );
        assert!(
            agree == total,
            "Go {version}: {} of {total} samples in main.afterFault are not Go's own stack \
             {own:?}; some:\n{}",
            total - agree,
            disagree.join("\n")
        );
    }
}

/// Where the walker steps a Go caller by its frame record, the caller has
/// one, as Go's own disassembler shows the code: for every call whose
/// return address (looked up one byte back, as the walker does) lies in
/// the ranges `profiler-agent tables` reports, the calling function set
/// BP to a record before it (`LEAQ n(SP), BP` after saving BP, up to Go
/// 1.20; `PUSHQ BP; MOVQ SP, BP` since). Calls to `runtime.morestack*`
/// come before the frame and are a special step. Before Go 1.21 the
/// compiler gave a frameless nosplit function that calls no record
/// (`runtime.osyield`'s ABI wrapper in Go 1.19): stepped by the callee's
/// record, its caller would vanish from the stack.
#[test]
fn go_callers_stepped_by_frame_record_have_one() {
    for version in VERSIONS {
        let binary = build(version);
        let out = run_agent(&["tables", "--format", "json", binary.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "tables {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let hex =
            |v: &serde_json::Value| u64::from_str_radix(&v.as_str().unwrap()[2..], 16).unwrap();
        let ranges: Vec<(u64, u64)> = report[0]["frame_record_callers"]
            .as_array()
            .unwrap_or_else(|| panic!("Go {version}: no frame-record ranges: {report}"))
            .iter()
            .map(|span| (hex(&span["start"]), hex(&span["end"])))
            .collect();
        let (mut checked, mut covered) = (0u64, 0u64);
        let mut missing: Vec<String> = Vec::new();
        let mut function = String::new();
        let mut framed = false;
        for instruction in go_objdump(&go_toolchain(version), &binary, None) {
            if instruction.function != function {
                function = instruction.function.clone();
                framed = false;
            }
            let text = instruction.text.as_str();
            if text == "MOVQ SP, BP" || (text.starts_with("LEAQ ") && text.ends_with("(SP), BP")) {
                framed = true;
            }
            if !text.starts_with("CALL ") || text.contains("runtime.morestack") {
                continue;
            }
            checked += 1;
            let address = instruction.address;
            let return_address = address + instruction.len;
            let looked_up = return_address - 1;
            if ranges
                .iter()
                .any(|&(start, end)| start <= looked_up && looked_up < end)
            {
                covered += 1;
                if !framed {
                    missing.push(format!("{function} at {address:#x}: {text}"));
                }
            }
        }
        println!(
            "Go {version}: {covered} of {checked} calls in {} frame-record ranges",
            ranges.len()
        );
        assert!(
            missing.is_empty(),
            "Go {version}: callers stepped by a frame record they do not have: {missing:#?}"
        );
        // Most calls are stepped so (the point of the ranges).
        assert!(
            covered * 2 > checked,
            "Go {version}: only {covered} of {checked} calls in the ranges {ranges:x?}"
        );
    }
}

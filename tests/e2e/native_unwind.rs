//! Complete stacks for code built without frame pointers: C and C++ at -O2
//! -fomit-frame-pointer and -O3 through Debian's libc, libstdc++ and
//! libgcc_s, our own shared libraries (one dlopen'ed mid-run), signal
//! handlers, and cgo. `perf record --call-graph dwarf` profiles the same
//! process at the same time and is the ground truth for every caller.

use std::path::{Path, PathBuf};
use std::process::Command;

use profiler_profile::pprof::proto;
use profiler_tests::perf::{self, PerfRecording};
use profiler_tests::{agent::*, go::*, processes::*, profiles::*};

const SECONDS: u32 = 4;

fn compile(compiler: &str, sources: &[PathBuf], flags: &[&str], out: &Path) {
    // Sources before the flags: libraries (-l) must follow what uses them.
    let output = Command::new(compiler)
        .arg("-o")
        .arg(out)
        .args(sources)
        .args(flags)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler} (`cargo xtask setup --tests`): {e}"));
    assert!(
        output.status.success(),
        "{compiler} {flags:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn fixture(path: &str) -> PathBuf {
    workspace_root().join("tests/fixtures").join(path)
}

/// Profiles `pid` with the agent and with perf at the same time; returns
/// the agent's profile, its report, and perf's stacks.
fn profile_with_perf(pid: u32, dir: &Path) -> (proto::Profile, String, Vec<Vec<perf::Frame>>) {
    let perf = PerfRecording::start(pid, SECONDS, dir);
    let out = dir.join("agent.pb.gz");
    let report = record(&[
        "--pid",
        &pid.to_string(),
        "--duration",
        &format!("{SECONDS}s"),
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    let perf_stacks = perf.finish();
    (read_pprof(&out), report, perf_stacks)
}

/// Share (0..=1) of the samples whose user stack goes from `_start` through
/// `main` to the leaf.
fn share_complete_to_main(stacks: &[Stack]) -> (f64, i64) {
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let complete: i64 = stacks
        .iter()
        .filter(|s| {
            let user: Vec<&str> = s
                .frames
                .iter()
                .filter(|(_, kernel)| !kernel)
                .map(|(name, _)| name.as_str())
                .collect();
            user.last() == Some(&"_start") && user.contains(&"main")
        })
        .map(|s| s.count)
        .sum();
    (complete as f64 / total.max(1) as f64, total)
}

fn assert_same_callers_as_perf(
    profile: &proto::Profile,
    pid: u32,
    perf_stacks: &[Vec<perf::Frame>],
    report: &str,
    dir: &Path,
) {
    let ours = perf::agent_stacks(profile, pid);
    assert!(
        perf_stacks.len() >= 100,
        "perf recorded only {} stacks of pid {pid}",
        perf_stacks.len()
    );
    let ours_total: i64 = ours.iter().map(|(_, n)| n).sum();
    assert!(
        ours_total >= 100,
        "the agent recorded only {ours_total} stacks"
    );
    let mut disagreement = perf::compare(&ours, perf_stacks);
    println!(
        "compared with perf: {} agent steps, {} perf steps",
        disagreement.agent_steps, disagreement.perf_steps
    );
    assert!(
        disagreement.agent_steps >= 10,
        "too few caller steps to compare: {disagreement:?}"
    );
    if !disagreement.agrees() && disagreement.missing_steps.is_empty() {
        // Steps only the agent took can be rare paths perf did not happen
        // to catch in the same seconds: a path in 0.05% of the time (inside
        // the exception unwinder) is in about two of perf's samples, and
        // now and then in three of the agent's ten times fewer. A wrong
        // unwinding rule gives steps perf never takes however long it
        // records: record the process again with perf alone, for twice as
        // long, and look the agent's steps up in both recordings. (Steps
        // perf takes often and the agent never did stay judged on the
        // recording made at the same time.)
        println!("first comparison: {disagreement:#?}\nrecording perf again");
        let more = PerfRecording::start(pid, 2 * SECONDS, dir).finish();
        let both: Vec<Vec<perf::Frame>> = perf_stacks.iter().cloned().chain(more).collect();
        let missing = std::mem::take(&mut disagreement.missing_steps);
        disagreement = perf::compare(&ours, &both);
        disagreement.missing_steps = missing;
    }
    assert!(
        disagreement.agrees(),
        "the agent's callers differ from perf --call-graph dwarf: {disagreement:#?}\n{report}"
    );
}

fn check_c_fixture(flags: &[&str]) {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("nofp");
    compile("cc", &[fixture("c/nofp.c")], flags, &binary);
    let running = Running::start(&binary, &["30"]);
    let (profile, report, perf_stacks) = profile_with_perf(running.pid(), dir.path());
    let stacks = stacks(&profile);
    let (complete, total) = share_complete_to_main(&stacks);
    println!(
        "{flags:?}: {total} samples, {:.1}% complete to main\n{report}",
        100.0 * complete
    );
    assert!(
        complete >= 0.99,
        "only {:.1}% of {total} samples reach main through _start:\n{report}",
        100.0 * complete
    );
    // Both hot paths, the comparator under libc's qsort.
    for function in ["crunch", "level1", "by_weight", "sort_round"] {
        assert!(
            stacks.iter().any(|s| s.has(function)),
            "{function} never sampled"
        );
    }
    let under_qsort = stacks.iter().any(|s| {
        let (Some(cmp), Some(sort)) = (s.depth_of("by_weight"), s.depth_of("sort_round")) else {
            return false;
        };
        s.frames[cmp..sort].iter().any(|(f, _)| f.contains("qsort"))
    });
    assert!(under_qsort, "no by_weight stack passes through qsort");
    assert!(report.contains(" 0 did not reach it"), "{report}");
    assert_same_callers_as_perf(&profile, running.pid(), &perf_stacks, &report, dir.path());
}

#[test]
fn c_without_frame_pointers_reaches_main_as_perf_does() {
    check_c_fixture(&["-O2", "-fomit-frame-pointer", "-g"]);
}

#[test]
fn c_at_o3_reaches_main_as_perf_does() {
    check_c_fixture(&["-O3", "-g"]);
}

fn check_cpp_fixture(opt: &str) {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let flags = [opt, "-fomit-frame-pointer", "-g"];
    let lib = dir.path().join("libnofpwork.so");
    let plugin = dir.path().join("libnofpplugin.so");
    let binary = dir.path().join("nofp-cpp");
    let shared: Vec<&str> = flags.iter().copied().chain(["-fPIC", "-shared"]).collect();
    compile("c++", &[fixture("cpp/nofp_work.cpp")], &shared, &lib);
    compile("c++", &[fixture("cpp/nofp_plugin.cpp")], &shared, &plugin);
    let link: Vec<String> = flags
        .iter()
        .map(|f| f.to_string())
        .chain([
            format!("-L{}", dir.path().display()),
            "-lnofpwork".into(),
            "-ldl".into(),
            format!("-Wl,-rpath,{}", dir.path().display()),
        ])
        .collect();
    let link: Vec<&str> = link.iter().map(String::as_str).collect();
    compile("c++", &[fixture("cpp/nofp.cpp")], &link, &binary);
    // The plugin is loaded 1.5 s in: after the agent attached and loaded
    // the tables of everything mapped at the start.
    let running = Running::start(&binary, &[plugin.to_str().unwrap(), "1.5", "30"]);
    let (profile, report, perf_stacks) = profile_with_perf(running.pid(), dir.path());
    let all = stacks(&profile);
    // A sample taken while libgcc installs a handler cannot be unwound by
    // anyone: `_Unwind_RaiseException`'s return address already points at
    // the landing pad in `throw_path` (not at `__cxa_throw`), and its frame
    // is not yet where that address says. perf --call-graph dwarf cuts these
    // samples the same way (19 of 7989 in an 8 s recording of this
    // fixture). They are left out of the share below, and must stay rare:
    // a wrong rule in the unwinder would cut far more (35% of this
    // fixture's samples are under `_Unwind_RaiseException`). The bound is
    // 2%: runs usually catch none, but one CI run caught 5 of 395 (1.3%)
    // with a walker that passed the same test in the runs around it.
    let installing = |s: &Stack| {
        s.frames
            .windows(2)
            .any(|w| w[0].0 == "_Unwind_RaiseException" && w[1].0.starts_with("throw_path"))
    };
    let (caught, stacks): (Vec<Stack>, Vec<Stack>) = all.into_iter().partition(installing);
    let caught: i64 = caught.iter().map(|s| s.count).sum();
    let (complete, total) = share_complete_to_main(&stacks);
    println!(
        "{opt}: {total} samples, {:.1}% complete to main ({caught} caught while the unwinder \
         installed a handler, left out)\n{report}",
        100.0 * complete
    );
    assert!(
        caught * 50 <= total,
        "{caught} of {total} samples caught while the unwinder installed a handler: \
         over 2% (perf: 0.3%), a wrong rule in libgcc?\n{report}"
    );
    // Samples in the plugin between its dlopen and its table reaching the
    // kernel are cut at the plugin (the agent reads the new mapping when
    // the first such sample arrives): on a loaded machine that can be a
    // few samples, and only those may be cut.
    let cut_elsewhere: Vec<Vec<&str>> = stacks
        .iter()
        .filter_map(|s| {
            let user: Vec<&str> = s
                .frames
                .iter()
                .filter(|(_, kernel)| !kernel)
                .map(|(name, _)| name.as_str())
                .collect();
            let complete = user.last() == Some(&"_start") && user.contains(&"main");
            let in_plugin = user
                .first()
                .is_some_and(|leaf| leaf.starts_with("plugin_") || leaf.contains("libnofpplugin"));
            (!complete && !in_plugin).then_some(user)
        })
        .collect();
    assert!(
        complete >= 0.99 || (complete >= 0.95 && cut_elsewhere.is_empty()),
        "only {:.1}% of {total} samples reach main through _start; cut outside the \
         just-loaded plugin: {cut_elsewhere:?}\n{report}",
        100.0 * complete
    );
    // C++ names are demangled with their parameters.
    let has = |s: &Stack, name: &str| {
        s.frames
            .iter()
            .any(|(f, _)| f == name || f.starts_with(&format!("{name}(")))
    };
    for (function, why) in [
        ("compare_items", "std::sort's comparator"),
        ("lib_inner", "our shared library"),
        ("plugin_inner", "the dlopen'ed library"),
        ("thrower", "exceptions in flight"),
    ] {
        assert!(
            stacks.iter().any(|s| has(s, function) && s.has("main")),
            "{function} ({why}) never sampled with a complete stack"
        );
    }
    // Samples inside the unwinder (libgcc_s / libstdc++) while an exception
    // is in flight.
    let in_flight = stacks.iter().any(|s| {
        has(s, "thrower")
            && s.frames
                .iter()
                .any(|(f, _)| f.contains("_Unwind_") || f.contains("__cxa_throw"))
    });
    assert!(in_flight, "no sample inside the exception unwinder");
    assert_same_callers_as_perf(&profile, running.pid(), &perf_stacks, &report, dir.path());
}

#[test]
fn cpp_sort_exceptions_and_libraries_reach_main_as_perf_does() {
    check_cpp_fixture("-O2");
}

#[test]
fn cpp_at_o3_reaches_main_as_perf_does() {
    check_cpp_fixture("-O3");
}

#[test]
fn signal_handlers_unwind_into_the_interrupted_code() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("signals");
    compile(
        "cc",
        &[fixture("c/signals.c")],
        &["-O2", "-fomit-frame-pointer", "-g"],
        &binary,
    );
    let running = Running::start(&binary, &["30"]);
    let (profile, report, perf_stacks) = profile_with_perf(running.pid(), dir.path());
    let stacks = stacks(&profile);
    let (complete, total) = share_complete_to_main(&stacks);
    println!(
        "{total} samples, {:.1}% complete to main\n{report}",
        100.0 * complete
    );
    assert!(
        complete >= 0.99,
        "only {:.1}% of {total} samples reach main:\n{report}",
        100.0 * complete
    );
    // handler_work <- on_alarm <- (signal frame) <- the interrupted chain.
    let through_signal: Vec<&Stack> = stacks.iter().filter(|s| s.has("on_alarm")).collect();
    let in_handler: i64 = through_signal.iter().map(|s| s.count).sum();
    assert!(in_handler >= 20, "only {in_handler} samples in the handler");
    for stack in &through_signal {
        let handler = stack.depth_of("on_alarm").unwrap();
        let outer = stack.depth_of("outer");
        assert!(
            outer.is_some_and(|o| o > handler) && stack.has("main"),
            "a handler sample does not continue into the interrupted code: {stack:?}"
        );
    }
    // Perf's names for the same: the handler's callers are the same
    // functions (perf prints the interrupted PC itself, we one byte back
    // like every caller, so addresses after the signal frame differ).
    let perf_names = perf_function_chains(&perf_stacks, &binary);
    assert!(
        perf_names.iter().any(|chain| {
            chain.contains(&"on_alarm".to_string()) && chain.contains(&"outer".to_string())
        }),
        "perf saw no handler stack reaching the interrupted code: {perf_names:?}"
    );
    assert_signal_frames_walked(&report);
}

/// Function names of perf's stacks, from our own fixture's symbol table
/// (enough to see the shape of a stack).
fn perf_function_chains(stacks: &[Vec<perf::Frame>], binary: &Path) -> Vec<Vec<String>> {
    let nm = run_tool("nm", &["-C", binary.to_str().unwrap()]);
    let mut symbols: Vec<(u64, String)> = nm
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let address = u64::from_str_radix(parts.next()?, 16).ok()?;
            let kind = parts.next()?;
            let name = parts.next()?;
            matches!(kind, "t" | "T").then(|| (address, name.to_string()))
        })
        .collect();
    symbols.sort();
    let binary = binary.to_str().unwrap();
    stacks
        .iter()
        .map(|stack| {
            stack
                .iter()
                .map(|(dso, address)| {
                    if dso != binary {
                        return format!("{dso}+{address:#x}");
                    }
                    let i = symbols.partition_point(|(a, _)| a <= address);
                    symbols
                        .get(i.wrapping_sub(1))
                        .map_or_else(|| format!("{address:#x}"), |(_, n)| n.clone())
                })
                .collect()
        })
        .collect()
}

#[test]
fn frame_pointers_only_keeps_the_old_cut_stacks() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("nofp");
    compile(
        "cc",
        &[fixture("c/nofp.c")],
        &["-O2", "-fomit-frame-pointer", "-g"],
        &binary,
    );
    let running = Running::start(&binary, &["30"]);
    let out = dir.path().join("fp.pb.gz");
    let report = record(&[
        "--pid",
        &running.pid().to_string(),
        "--duration",
        "2s",
        "-q",
        "--frame-pointers-only",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stacks = stacks(&read_pprof(&out));
    let (complete, total) = share_complete_to_main(&stacks);
    assert!(total >= 50, "only {total} samples:\n{report}");
    assert!(
        complete < 0.5,
        "frame pointers alone should not walk this binary ({:.1}% complete):\n{report}",
        100.0 * complete
    );
    assert!(!report.contains("unwinding: tables"), "{report}");
}

/// Go -> C -> libc qsort -> C comparator -> Go, with C built without frame
/// pointers: complete stacks through both kinds of tables and both stack
/// switches (asmcgocall onto the system stack, cgocallback back onto the
/// goroutine's), for the oldest and newest Go we support.
#[test]
fn cgo_stacks_are_complete_through_c_and_go() {
    require_bpf_privileges();
    for version in ["1.19", "1.27.3"] {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join(format!("cgo-{version}"));
        go_command(
            &go_toolchain(version),
            &fixture("cgo"),
            &["build", "-o", binary.to_str().unwrap(), "."],
            &[("CGO_ENABLED", "1")],
        );
        let running = Running::start(&binary, &["30"]);
        let out = dir.path().join("cgo.pb.gz");
        let report = record(&[
            "--pid",
            &running.pid().to_string(),
            "--duration",
            "3s",
            "-q",
            "-o",
            out.to_str().unwrap(),
        ]);
        let stacks = stacks(&read_pprof(&out));
        let total: i64 = stacks.iter().map(|s| s.count).sum();
        let main_thread: Vec<&Stack> = stacks.iter().filter(|s| s.has("main.sortRound")).collect();
        let on_main: i64 = main_thread.iter().map(|s| s.count).sum();
        println!("Go {version}: {total} samples, {on_main} under main.sortRound\n{report}");
        assert!(
            on_main >= 150,
            "Go {version}: only {on_main} samples under sortRound"
        );
        // Everything under sortRound is complete to runtime.goexit.
        let complete: i64 = main_thread
            .iter()
            .filter(|s| {
                s.frames
                    .iter()
                    .rev()
                    .find(|(_, k)| !k)
                    .map(|(f, _)| f.as_str())
                    == Some("runtime.goexit")
            })
            .map(|s| s.count)
            .sum();
        assert!(
            complete as f64 >= 0.99 * on_main as f64,
            "Go {version}: {complete} of {on_main} samples complete to runtime.goexit:\n{report}"
        );
        // C called from Go: c_sort_round under runtime.cgocall.
        let c_under_go = main_thread.iter().any(|s| {
            matches!((s.depth_of("c_sort_round"), s.depth_of("runtime.cgocall")), (Some(c), Some(g)) if c < g)
        });
        assert!(c_under_go, "Go {version}: no C frame under runtime.cgocall");
        // Go called from C called from Go: main.goMix, then the C frames
        // (qsort) it was called back from, then Go again.
        let go_under_c = main_thread.iter().any(|s| {
            let (Some(go), Some(qsort), Some(sort)) = (
                s.depth_of("main.goMix"),
                s.frames.iter().position(|(f, _)| f.contains("qsort")),
                s.depth_of("main.sortRound"),
            ) else {
                return false;
            };
            go < qsort && qsort < sort
        });
        assert!(
            go_under_c,
            "Go {version}: no callback stack Go -> C -> qsort -> Go: {:?}",
            main_thread.iter().find(|s| s.has("main.goMix"))
        );
    }
}

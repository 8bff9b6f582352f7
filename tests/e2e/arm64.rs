//! The agent on arm64, for real: one boot of Debian's arm64 kernel under
//! qemu-system-aarch64 (see `profiler_tests::arm64`) runs the cross-built
//! agent against cross-built fixtures, scenario after scenario; each test
//! below checks one scenario's output with the same assertions as on
//! x86_64, and ground truth from host tools run on the same binaries
//! (`go tool addr2line`, `aarch64-linux-gnu-addr2line`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use profiler_profile::pprof::proto;
use profiler_tests::arm64::{
    Guest, GuestRun, Scenario, arm64_agent, kept_console, run_guest, tail,
};
use profiler_tests::go_state::{by_leaf, dump_by_goroutine};
use profiler_tests::pprof_raw::RawProfile;
use profiler_tests::{agent::*, go::*, profiles::*};

/// Go toolchains the arm64 Go fixture is built with: Debian's and the
/// newest.
const GO_VERSIONS: [&str; 2] = ["1.19", "1.27.3"];
/// The go_state fixture's builds in the guest (stripped): toolchain, name.
const GO_STATE: [(&str, &str); 2] = [("1.19", "go-state-1.19"), ("1.27.3", "go-state-1.27.3")];
const SECONDS: u32 = 3;

fn fixtures_dir() -> PathBuf {
    let dir = workspace_root()
        .join("target/fixtures")
        .join(std::process::id().to_string())
        .join("arm64");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn cross_gcc(out: &Path, sources: &[PathBuf], flags: &[&str]) -> PathBuf {
    let output = Command::new("aarch64-linux-gnu-gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .args(sources)
        .output()
        .expect("running aarch64-linux-gnu-gcc (`cargo xtask setup --tests`)");
    assert!(
        output.status.success(),
        "aarch64-linux-gnu-gcc {flags:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out.to_path_buf()
}

fn c_fixture(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/c").join(name)
}

fn go_fixture(version: &str, stripped: bool) -> PathBuf {
    go_fixture_of("go", version, stripped)
}

/// A Go fixture of `tests/fixtures/DIR` built for arm64.
fn go_fixture_of(dir: &str, version: &str, stripped: bool) -> PathBuf {
    let go = go_toolchain(version);
    let out = fixtures_dir().join(format!(
        "{dir}-{version}{}",
        if stripped { "-s" } else { "" }
    ));
    let mut args = vec!["build", "-o", out.to_str().unwrap()];
    if stripped {
        args.push("-ldflags=-s -w");
    }
    args.push(".");
    go_command(
        &go,
        &workspace_root().join("tests/fixtures").join(dir),
        &args,
        &[("GOARCH", "arm64"), ("CGO_ENABLED", "0")],
    );
    out
}

/// The latency fixture for arm64: sys/sdt.h is architecture-neutral, but
/// Debian installs it under the x86_64 multiarch directory only.
fn latency_fixture(dir: &Path) -> PathBuf {
    let include = dir.join("sdt-include/sys");
    std::fs::create_dir_all(&include).unwrap();
    for name in ["sdt.h", "sdt-config.h"] {
        std::fs::copy(
            Path::new("/usr/include/x86_64-linux-gnu/sys").join(name),
            include.join(name),
        )
        .unwrap_or_else(|e| panic!("copying sys/{name} (systemtap-sdt-dev): {e}"));
    }
    let usdt = workspace_root().join("tests/fixtures/usdt");
    cross_gcc(
        &dir.join("latency"),
        &[usdt.join("latency.c"), usdt.join("latency_sem.c")],
        &[
            "-O2",
            "-g",
            "-isystem",
            dir.join("sdt-include").to_str().unwrap(),
        ],
    )
}

/// The scenarios, their binaries and the guest script, built once.
fn guest() -> (Guest, HashMap<&'static str, PathBuf>) {
    let dir = fixtures_dir();
    let mut binaries: HashMap<&'static str, PathBuf> = HashMap::new();
    binaries.insert(
        "hot",
        cross_gcc(
            &dir.join("hot"),
            &[c_fixture("hot.c")],
            &["-O0", "-g", "-fno-omit-frame-pointer"],
        ),
    );
    binaries.insert(
        "nofp",
        cross_gcc(
            &dir.join("nofp"),
            &[c_fixture("nofp.c")],
            &["-O2", "-g", "-fomit-frame-pointer"],
        ),
    );
    // Signal handlers return through the vDSO's __kernel_rt_sigreturn,
    // which has no CFI in Debian's arm64 kernel.
    binaries.insert(
        "signals",
        cross_gcc(
            &dir.join("signals"),
            &[c_fixture("signals.c")],
            &["-O2", "-g", "-fomit-frame-pointer"],
        ),
    );
    binaries.insert(
        "syscalls",
        cross_gcc(
            &dir.join("syscalls"),
            &[c_fixture("syscalls.c")],
            &["-O2", "-g", "-fno-omit-frame-pointer"],
        ),
    );
    binaries.insert(
        "offcpu",
        cross_gcc(
            &dir.join("offcpu"),
            &[c_fixture("offcpu.c")],
            &["-O2", "-g", "-pthread", "-fno-optimize-sibling-calls"],
        ),
    );
    binaries.insert("latency", latency_fixture(&dir));
    let go_names = [
        ("1.19", false, "go-1.19"),
        ("1.19", true, "go-1.19-s"),
        ("1.27.3", false, "go-1.27.3"),
        ("1.27.3", true, "go-1.27.3-s"),
    ];
    for (version, stripped, name) in go_names {
        binaries.insert(name, go_fixture(version, stripped));
    }
    // Go labels through the g register (X28), the layout from the version
    // table (stripped).
    binaries.insert("go-labels", go_fixture_of("go-unwind", "1.27.3", true));
    // The Go runtime's state read from outside: the oldest and newest
    // layouts, stripped (variables found from arm64 code: ADRP pairs).
    for (version, name) in GO_STATE {
        binaries.insert(name, go_fixture_of("go_state", version, true));
    }

    let mut guest = Guest::default();
    guest
        .files
        .push(("/bin/profiler-agent".into(), arm64_agent()));
    for (name, path) in &binaries {
        guest.files.push((format!("/bin/{name}"), path.clone()));
    }
    guest.files.push((
        "/workload.py".into(),
        workspace_root().join("tests/fixtures/python/workload.py"),
    ));
    let mut script = String::from(
        r#"A=/bin/profiler-agent
# profile NAME SECONDS COMMAND...: the agent on COMMAND's pid.
profile() {
    name=$1; secs=$2; shift 2
    begin $name
    "$@" & P=$!
    sleep 0.5
    $A --pid $P -d ${secs}s -o /tmp/$name.pb.gz
    rc=$?
    kill $P; wait $P 2>/dev/null
    file /tmp/$name.pb.gz
    end $name $rc
}
# wait_for FILE TEXT: up to 60 s.
wait_for() {
    i=0
    while ! grep -q "$2" "$1" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
}
"#,
    );
    script.push_str(&format!(
        "profile c-fp {SECONDS} /bin/hot\n\
         profile c-nofp {SECONDS} /bin/nofp\n\
         profile c-signals {SECONDS} /bin/signals 600\n\
         profile syscalls {SECONDS} /bin/syscalls\n"
    ));
    for (_, _, name) in go_names {
        script.push_str(&format!("profile {name} {SECONDS} /bin/{name}\n"));
    }
    script.push_str(&format!(
        "profile go-labels {SECONDS} /bin/go-labels labels 600 /tmp/own-labels.pprof\n"
    ));
    // Faults that enter runtime.sigpanic by a faked call, after the
    // handler saved LR below SP; Go's own stack of the code under it.
    script.push_str(&format!(
        r#"
begin go-faults
/bin/go-labels faults 600 /tmp/go-faults-own.txt > /dev/null & P=$!
wait_for /tmp/go-faults-own.txt "^end"
$A --pid $P -d {SECONDS}s -o /tmp/go-faults.pb.gz
rc=$?
kill $P; wait $P 2>/dev/null
file /tmp/go-faults-own.txt
file /tmp/go-faults.pb.gz
end go-faults $rc
"#
    ));
    for (_, name) in GO_STATE {
        script.push_str(&format!(
            r#"
begin {name}
mkdir -p /tmp/{name}
GOGC=off RATE=1 /bin/{name} /tmp/{name} > /dev/null 2>&1 & G=$!
wait_for /tmp/{name}/ready "[0-9]"
$A heap --pid $G -o /tmp/{name}/ours.pb.gz 2> /tmp/{name}/heap.err; r1=$?
$A goroutines --pid $G > /tmp/{name}/ours.txt 2> /tmp/{name}/goroutines.err; r2=$?
$A goroutines --pid $G --stop > /tmp/{name}/stopped.txt 2>> /tmp/{name}/goroutines.err; r3=$?
kill $G; wait $G 2>/dev/null
cat /tmp/{name}/heap.err /tmp/{name}/goroutines.err
for f in heap.pb.gz ours.pb.gz goroutines.txt ours.txt stopped.txt; do file /tmp/{name}/$f; done
end {name} $((r1 + r2 + r3))
"#
        ));
    }
    script.push_str(
        r#"
begin probes-list
$A probes list /bin/latency
end probes-list $?

begin latency
mkfifo /tmp/gate
/bin/latency 3 wait < /tmp/gate > /tmp/latency.out & L=$!
exec 3>/tmp/gate
# --budget 0: under emulation each BPF run costs a hundred times what it
# does on hardware, and the measured cost would trip the circuit breaker.
$A latency --budget 0 --pid $L usdt:/bin/latency:demo:op__start usdt:/bin/latency:demo:op__done \
    > /tmp/hist.out 2> /tmp/hist.err & AG=$!
wait_for /tmp/hist.err "attached "
echo go >&3
wait_for /tmp/latency.out "^ops"
kill -INT $AG; wait $AG; rc=$?
echo go >&3; exec 3>&-; wait $L
cat /tmp/latency.out /tmp/hist.out /tmp/hist.err
end latency $rc

begin python
/usr/bin/python3.11 /workload.py 120 tree > /tmp/py.out & P=$!
wait_for /tmp/py.out ready
$A --pid $P -F 97 -d 8s -o /tmp/python.pb.gz 2> /tmp/py.err
rc=$?
kill $P; wait $P 2>/dev/null
cat /tmp/py.err
file /tmp/python.pb.gz
end python $rc

begin off-cpu
mkfifo /tmp/gate2
/bin/offcpu waits /tmp < /tmp/gate2 > /tmp/offcpu.out & O=$!
exec 4>/tmp/gate2
$A --pid $O -d 120s --off-cpu --off-cpu-period 200us -o /tmp/off-cpu.pb.gz 2> /tmp/off.err & AG=$!
wait_for /tmp/off.err "profiling pid"
echo go >&4
wait_for /tmp/offcpu.out "sleep="
echo go >&4; exec 4>&-; wait $O
wait $AG; rc=$?
cat /tmp/offcpu.out /tmp/off.err
file /tmp/off-cpu.pb.gz
end off-cpu $rc
"#,
    );
    // symbolize: addresses chosen on the host (function starts and
    // insides), answered in the guest.
    for name in ["hot", "go-1.27.3"] {
        let addresses = symbolize_addresses(&binaries[name]);
        script.push_str(&format!(
            "\nbegin symbolize-{name}\n$A symbolize --binary /bin/{name} --format json {}\n\
             end symbolize-{name} $?\n",
            addresses
                .iter()
                .map(|a| format!("{a:#x}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    guest.script = script;
    (guest, binaries)
}

/// The guest's run (or why it failed), and the fixtures by name.
type Run = (Result<GuestRun, String>, HashMap<&'static str, PathBuf>);

/// One guest run shared by every test in this file (the tests run one at
/// a time; the first boots the guest).
fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        require_bpf_privileges();
        let (guest, binaries) = guest();
        let mut result = run_guest(&guest, Duration::from_secs(900));
        // Once in about twenty boots here, the emulated guest's kernel
        // reported a CPU stuck for minutes in the latency scenario's agent
        // (a soft lockup; the guest now panics on one). It did not come
        // back in the runs that followed, with or without the same
        // binaries, nor in some 600 runs of that scenario in one boot
        // (`arm64_latency_scenario_soak`), so the guest is booted once
        // more; a second lockup fails the lane. The first boot's console,
        // every CPU's backtrace in it (`LANE_KERNEL_ARGS`), is kept and
        // its lockup printed: where the kernel was is what is unknown.
        if result.is_err()
            && let Ok(console) = std::fs::read_to_string(kept_console())
            && console.contains("soft lockup")
        {
            let kept = workspace_root().join("target/arm64-guest-soft-lockup.log");
            let _ = std::fs::write(&kept, &console);
            let at = console.rfind("BUG: soft lockup").unwrap_or(0);
            let lockup: Vec<&str> = console[at..].lines().take(200).collect();
            eprintln!(
                "arm64 guest: soft lockup (whole console in {}), booting it once more:\n{}",
                kept.display(),
                lockup.join("\n")
            );
            result = run_guest(&guest, Duration::from_secs(900));
        }
        if let Ok(run) = &result {
            eprintln!(
                "arm64 guest: {} scenarios in {:.0} s",
                run.scenarios.len(),
                run.elapsed.as_secs_f64()
            );
        }
        (result, binaries)
    })
}

/// Scenario `name`, which must have exited 0.
fn scenario(name: &str) -> (&'static Scenario, &'static HashMap<&'static str, PathBuf>) {
    let (result, binaries) = run();
    let run = result.as_ref().unwrap_or_else(|e| panic!("{e}"));
    let scenario = run.scenario(name);
    assert_eq!(
        scenario.status,
        Some(0),
        "{name} failed in the arm64 guest:\n{}",
        scenario.log
    );
    (scenario, binaries)
}

fn profile_of(scenario: &Scenario, name: &str) -> proto::Profile {
    let bytes = scenario
        .files
        .get(&format!("/tmp/{name}.pb.gz"))
        .unwrap_or_else(|| panic!("{name}: no profile came back:\n{}", scenario.log));
    profiler_profile::pprof::decode(bytes)
        .unwrap_or_else(|e| panic!("{name}: the profile does not decode: {e}\n{}", scenario.log))
}

fn share(stacks: &[Stack], keep: impl Fn(&Stack) -> bool) -> f64 {
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let kept: i64 = stacks.iter().filter(|s| keep(s)).map(|s| s.count).sum();
    kept as f64 / total.max(1) as f64
}

/// The arm64 build's BPF object fits the verifier's stack budget as the
/// guest's 6.1 kernel adds it up (a program, its loop callback and their
/// calls: 512 bytes, each function's stack rounded up to 32): the answer
/// in a second, and the chain that is too deep, where the guest would
/// only refuse the program minutes into the boot.
#[test]
fn arm64_bpf_programs_fit_the_verifiers_stack_budget() {
    let agent = arm64_agent();
    let build = agent.parent().unwrap().join("build");
    let object = "profiler";
    let newest = std::fs::read_dir(&build)
        .unwrap_or_else(|e| panic!("{}: {e}", build.display()))
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("profiler-bpf-"))
        .map(|e| e.path().join("out").join(object))
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    let path = newest.unwrap_or_else(|| {
        panic!(
            "no arm64 BPF object `{object}` under {}/profiler-bpf-*/out",
            build.display()
        )
    });
    let elf = std::fs::read(&path).unwrap();
    let over = profiler_bpf::stack_budget::over_budget(&elf).unwrap();
    assert!(over.is_empty(), "{}:\n{}", path.display(), over.join("\n"));
}

#[test]
fn arm64_c_with_frame_pointers_has_the_split_and_complete_chains() {
    let (s, _) = scenario("c-fp");
    let stacks = stacks(&profile_of(s, "c-fp"));
    let a: i64 = stacks
        .iter()
        .filter(|s| s.has("hot_a"))
        .map(|s| s.count)
        .sum();
    let b: i64 = stacks
        .iter()
        .filter(|s| s.has("hot_b"))
        .map(|s| s.count)
        .sum();
    let split = a as f64 / (a + b).max(1) as f64;
    assert!(
        (0.58..=0.76).contains(&split) && a + b > 100,
        "hot_a's share {split:.2} of {} samples (expected about 2/3):\n{}",
        a + b,
        s.log
    );
    let complete = share(&stacks, |s| {
        let chain = s.user_chain();
        chain.first() == Some(&"_start")
            && chain.contains(&"main")
            && chain.contains(&"round_trip")
            && chain.last() == Some(&"work")
    });
    assert!(
        complete >= 0.9,
        "{:.0}% of stacks run _start .. main .. round_trip .. work: {:?}",
        complete * 100.0,
        stacks
            .iter()
            .take(5)
            .map(Stack::user_chain)
            .collect::<Vec<_>>()
    );
    // No AArch64 mapping symbol ($x, $d) is taken for a function name.
    for stack in &stacks {
        assert!(
            !stack.frames.iter().any(|(n, _)| n.starts_with('$')),
            "a mapping symbol named a frame: {:?}",
            stack.frames
        );
    }
}

#[test]
fn arm64_c_without_frame_pointers_reaches_main_through_cfi() {
    let (s, _) = scenario("c-nofp");
    let stacks = stacks(&profile_of(s, "c-nofp"));
    let reach = share(&stacks, |s| {
        let chain = s.user_chain();
        chain.first() == Some(&"_start") && chain.contains(&"main")
    });
    assert!(
        reach >= 0.9,
        "{:.0}% of the no-frame-pointer program's stacks reach main: {:?}\n{}",
        reach * 100.0,
        stacks
            .iter()
            .take(5)
            .map(Stack::user_chain)
            .collect::<Vec<_>>(),
        s.log
    );
    assert!(
        // qsort, or qsort_r where qsort is a wrapper of it (arm64 glibc).
        stacks
            .iter()
            .any(|s| s.has("by_weight")
                && s.frames.iter().any(|(n, _)| n == "qsort" || n == "qsort_r")),
        "no comparator called back from libc's qsort: {:?}",
        stacks
            .iter()
            .filter(|s| s.has("by_weight"))
            .take(5)
            .map(Stack::user_chain)
            .collect::<Vec<_>>()
    );
}

#[test]
fn arm64_kernel_frames_sit_under_the_system_call() {
    let (s, _) = scenario("syscalls");
    let stacks = stacks(&profile_of(s, "syscalls"));
    let in_kernel = share(&stacks, |s| {
        s.frames.first().is_some_and(|(_, kernel)| *kernel)
            && s.frames.iter().any(|(n, k)| *k && n.contains("sys_read"))
            && s.user_chain().last() == Some(&"do_reads")
    });
    assert!(
        in_kernel >= 0.5,
        "{:.0}% of samples in the kernel's read under do_reads: {:?}",
        in_kernel * 100.0,
        stacks.iter().take(3).map(|s| &s.frames).collect::<Vec<_>>()
    );
}

/// Go roots: a goroutine's goexit, the scheduler's mcall/morestack, a
/// thread's mstart.
const GO_ROOTS: &[&str] = &[
    "runtime.goexit",
    "runtime.mcall",
    "runtime.morestack",
    "runtime.mstart",
    "runtime.rt0_go",
];

/// `go tool addr2line` of `binary` for `pcs`: the function of each.
fn go_addr2line(binary: &Path, pcs: &[u64]) -> Vec<String> {
    let input: String = pcs.iter().map(|pc| format!("{pc:#x}\n")).collect();
    let mut child = Command::new(go_toolchain("1.27.3"))
        .args(["tool", "addr2line"])
        .arg(binary)
        .env("GOTOOLCHAIN", "local")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("go tool addr2line");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn arm64_go_stacks_are_complete_with_inline_frames_and_match_go_addr2line() {
    for version in GO_VERSIONS {
        for name in [format!("go-{version}"), format!("go-{version}-s")] {
            let (s, binaries) = scenario(&name);
            let profile = profile_of(s, &name);
            let stacks = stacks(&profile);
            let rooted = share(&stacks, |s| {
                s.user_chain().first().is_some_and(|r| GO_ROOTS.contains(r))
            });
            let on_main = share(&stacks, |s| {
                s.user_chain().first() == Some(&"runtime.goexit") && s.has("main.hot")
            });
            assert!(
                rooted >= 0.95 && on_main >= 0.6,
                "{name}: {:.0}% of stacks rooted, {:.0}% through main.hot to goexit: {:?}\n{}",
                rooted * 100.0,
                on_main * 100.0,
                stacks
                    .iter()
                    .take(5)
                    .map(Stack::user_chain)
                    .collect::<Vec<_>>(),
                s.log
            );
            // Inline frames are checked on symbolize-go-* below, every
            // instruction of main.hot: under TCG the timer interrupt is
            // taken only between translation blocks, so sampled PCs are
            // block starts and may never fall inside main.mix's body.
            // Every location in the binary named as go tool addr2line names
            // it (the physical function; callers looked up one byte back).
            let binary = &binaries[name.as_str()];
            let s_of = |i: i64| profile.string_table[i as usize].as_str();
            let functions: HashMap<u64, &str> = profile
                .function
                .iter()
                .map(|f| (f.id, s_of(f.name)))
                .collect();
            let locations: Vec<(u64, &str)> = profile
                .location
                .iter()
                .filter(|l| {
                    profile
                        .mapping
                        .iter()
                        .find(|m| m.id == l.mapping_id)
                        .is_some_and(|m| s_of(m.filename).ends_with(&format!("/{name}")))
                })
                .filter_map(|l| Some((l.address, functions[&l.line.last()?.function_id])))
                .collect();
            assert!(!locations.is_empty(), "{name}: no location in the binary");
            // A sampled PC (the first user frame, under any kernel frames)
            // is named as it is, and so is the PC a signal interrupted (the
            // frame under the sigreturn trampoline: the runtime's
            // preemption may have pointed it at runtime.asyncPreempt's
            // first instruction); a return address one byte back (a PC at
            // a function's first instruction would otherwise be named after
            // the function before it).
            let kernel_mappings: Vec<u64> = profile
                .mapping
                .iter()
                .filter(|m| s_of(m.filename) == "[kernel.kallsyms]")
                .map(|m| m.id)
                .collect();
            let location_function = |l: &proto::Location| {
                l.line
                    .first()
                    .map(|line| functions[&line.function_id])
                    .unwrap_or_default()
            };
            let mut leaves: std::collections::HashSet<u64> = Default::default();
            for sample in &profile.sample {
                let user: Vec<&proto::Location> = sample
                    .location_id
                    .iter()
                    .filter_map(|id| profile.location.iter().find(|l| l.id == *id))
                    .filter(|l| !kernel_mappings.contains(&l.mapping_id))
                    .collect();
                if let Some(leaf) = user.first() {
                    leaves.insert(leaf.address);
                }
                // The trampoline is named, or, as the leaf inside the
                // rt_sigreturn call, the address after its `svc`, which
                // is in no vDSO function.
                for (i, pair) in user.windows(2).enumerate() {
                    let name = location_function(pair[0]);
                    // So is the PC a call the signal handler faked
                    // returns to.
                    if name == "__kernel_rt_sigreturn"
                        || (i == 0 && name.starts_with("[vdso]"))
                        || name == "runtime.asyncPreempt"
                        || name == "runtime.sigpanic"
                    {
                        leaves.insert(pair[1].address);
                    }
                }
            }
            let pcs: Vec<u64> = locations
                .iter()
                .map(|(a, _)| if leaves.contains(a) { *a } else { a - 1 })
                .collect();
            let theirs = go_addr2line(binary, &pcs);
            let differ: Vec<String> = locations
                .iter()
                .zip(&theirs)
                .filter(|((_, ours), theirs)| ours != theirs)
                .map(|((a, ours), theirs)| format!("{a:#x}: ours {ours}, addr2line {theirs}"))
                .collect();
            assert!(
                differ.len() * 50 <= locations.len(),
                "{name}: {} of {} locations named differently from go tool addr2line: {differ:?}",
                differ.len(),
                locations.len()
            );
        }
    }
}

#[test]
fn arm64_probes_list_and_latency_histogram_count_every_operation() {
    let (s, _) = scenario("probes-list");
    for probe in ["demo:op__start", "demo:op__done", "demo_sem:op__start"] {
        let (provider, name) = probe.split_once(':').unwrap();
        assert!(
            s.log.contains(provider) && s.log.contains(name),
            "probes list misses {probe}:\n{}",
            s.log
        );
    }
    let (s, _) = scenario("latency");
    assert!(s.log.contains("ops 21"), "{}", s.log);
    let counts: Vec<u64> = s
        .log
        .lines()
        .filter_map(|l| l.strip_prefix("count "))
        .filter_map(|rest| rest.split(',').next()?.trim().parse().ok())
        .collect();
    assert_eq!(counts, [21], "one histogram of 21 operations:\n{}", s.log);
}

#[test]
fn arm64_off_cpu_time_matches_what_the_program_measured() {
    let (s, _) = scenario("off-cpu");
    let measured: HashMap<&str, i64> = s
        .log
        .split_whitespace()
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k, v.parse().ok()?))
        })
        .collect();
    let profile = profile_of(s, "off-cpu");
    let index = profile
        .sample_type
        .iter()
        .position(|t| profile.string_table[t.r#type as usize] == "off_cpu")
        .expect("an off_cpu sample type");
    let stacks = stacks(&profile);
    // fsync on the guest's tmpfs does not wait: sleep, lock and pipe.
    for (function, key) in [
        ("wait_for_sleep", "sleep"),
        ("wait_for_lock", "lock"),
        ("wait_for_pipe", "pipe"),
    ] {
        let ours: i64 = stacks
            .iter()
            .zip(&profile.sample)
            .filter(|(stack, _)| stack.has(function))
            .map(|(_, sample)| sample.value[index])
            .sum();
        let truth = *measured
            .get(key)
            .unwrap_or_else(|| panic!("no {key}= in the fixture's output:\n{}", s.log));
        let error = (ours - truth).abs() as f64 / truth.max(1) as f64;
        assert!(
            error <= 0.10,
            "{function}: agent {:.3} s, program {:.3} s\n{}",
            ours as f64 / 1e9,
            truth as f64 / 1e9,
            s.log
        );
    }
}

/// Addresses of `binary` to symbolize: every function symbol's start and
/// a point inside it, for the functions the fixtures define.
fn symbolize_addresses(binary: &Path) -> Vec<u64> {
    let output = Command::new("aarch64-linux-gnu-nm")
        .args(["--defined-only", "-S"])
        .arg(binary)
        .output()
        .expect("running aarch64-linux-gnu-nm (binutils-aarch64-linux-gnu)");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut addresses = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 4 || !matches!(fields[2], "T" | "t") {
            continue;
        }
        let name = fields[3];
        let wanted = ["main", "round_trip", "hot_a", "hot_b", "work"].contains(&name)
            || name == "main.hot"
            || name == "main.main";
        if !wanted {
            continue;
        }
        let (Ok(start), Ok(size)) = (
            u64::from_str_radix(fields[0], 16),
            u64::from_str_radix(fields[1], 16),
        ) else {
            continue;
        };
        if name == "main.hot" {
            // Every instruction: the inlined bodies of mix and clamp.
            addresses.extend((start..start + size).step_by(4));
        } else {
            addresses.push(start);
            addresses.push(start + ((size / 2) & !3));
        }
    }
    assert!(!addresses.is_empty(), "no fixture function in {text}");
    addresses
}

#[test]
fn arm64_symbolize_answers_as_addr2line() {
    for name in ["hot", "go-1.27.3"] {
        let (s, binaries) = scenario(&format!("symbolize-{name}"));
        let frames = parse_symbolize_json(s.log.trim());
        let binary = &binaries[name];
        let pcs: Vec<u64> = frames.iter().map(|(pc, _)| *pc).collect();
        assert!(
            !pcs.is_empty(),
            "{name}: symbolize printed nothing:\n{}",
            s.log
        );
        let theirs: Vec<String> = if name.starts_with("go-") {
            go_addr2line(binary, &pcs)
        } else {
            let output = Command::new("aarch64-linux-gnu-addr2line")
                .arg("-f")
                .arg("-e")
                .arg(binary)
                .args(pcs.iter().map(|pc| format!("{pc:#x}")))
                .output()
                .expect("aarch64-linux-gnu-addr2line");
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        for ((pc, ours), theirs) in frames.iter().zip(&theirs) {
            let physical = ours.last().map(|f| f.function.as_str()).unwrap_or("");
            assert_eq!(
                physical, theirs,
                "{name} {pc:#x}: ours {ours:?}, addr2line {theirs}"
            );
        }
        if name.starts_with("go-") {
            // Inline frames: the innermost frame's line is the one `go tool
            // objdump` prints for the instruction, and mix (with clamp
            // inside it) shows up inlined into hot.
            let lines = go_objdump_lines(binary, "main.hot");
            let mut compared = 0;
            for (pc, ours) in &frames {
                let Some(line) = lines.get(pc) else { continue };
                compared += 1;
                let innermost = ours.first().and_then(|f| f.line).unwrap_or(0);
                assert_eq!(
                    innermost, *line,
                    "{name} {pc:#x}: ours {ours:?}, objdump main.go:{line}"
                );
            }
            assert!(compared >= 8, "{name}: {compared} instructions of main.hot");
            let chain = |pc: &u64| {
                frames
                    .iter()
                    .find(|(p, _)| p == pc)
                    .map(|(_, f)| f.iter().map(|f| f.function.as_str()).collect::<Vec<_>>())
            };
            assert!(
                lines
                    .keys()
                    .any(|pc| chain(pc) == Some(vec!["main.clamp", "main.mix", "main.hot"])),
                "{name}: no instruction of main.hot symbolized as clamp in mix in hot"
            );
        }
    }
}

/// `go tool objdump -s FUNCTION` of `binary`: the source line of each
/// instruction (the innermost, inlined one).
fn go_objdump_lines(binary: &Path, function: &str) -> HashMap<u64, u32> {
    let symbols = format!("^{}$", function.replace('.', "\\."));
    go_objdump(&go_toolchain("1.27.3"), binary, Some(&symbols))
        .into_iter()
        .map(|instruction| (instruction.address, instruction.line))
        .collect()
}

/// Go pprof labels on arm64: the goroutine found through X28, the layout
/// of a stripped binary from the version table; the labelled work carries
/// its labels and nothing else does.
#[test]
fn arm64_go_samples_carry_their_goroutines_labels() {
    let (s, _) = scenario("go-labels");
    assert!(
        s.log.contains("Go labels: read in 1 processes"),
        "the report does not say labels were read:\n{}",
        s.log
    );
    let stacks = stacks(&profile_of(s, "go-labels"));
    let label = |st: &Stack, key: &str| st.labels.get(key).cloned();
    let checkout = share(&stacks, |st| {
        label(st, "endpoint").as_deref() == Some("/checkout")
    });
    let search = share(&stacks, |st| {
        label(st, "endpoint").as_deref() == Some("/search")
    });
    assert!(
        checkout > 0.10 && search > 0.05,
        "/checkout {:.1}%, /search {:.1}% of the samples\n{}",
        checkout * 100.0,
        search * 100.0,
        s.log
    );
    for st in &stacks {
        let gold = label(st, "tier").as_deref() == Some("gold");
        let is_checkout = label(st, "endpoint").as_deref() == Some("/checkout");
        assert_eq!(gold, is_checkout, "{:?}", st.labels);
    }
    // Labels do not leak onto other work: no labelled sample is in the
    // work done under another label or under none.
    let describe = |st: &Stack| {
        let names: Vec<&str> = st.frames.iter().map(|(f, _)| f.as_str()).collect();
        format!("{} {:?} {}", st.count, st.labels, names.join(";"))
    };
    let leaked: Vec<String> = stacks
        .iter()
        .filter(|st| match label(st, "endpoint").as_deref() {
            Some("/checkout") => st.has("main.medium") || st.has("main.lightLoop"),
            Some("/search") => st.has("main.heavy") || st.has("main.lightLoop"),
            _ => false,
        })
        .map(describe)
        .collect();
    assert!(
        leaked.is_empty(),
        "labels on other work:\n{}",
        leaked.join("\n")
    );
    // The labelled samples are the labelled work's (a few may fall in
    // pprof.Do around it). Samples in the runtime's signal handler count
    // too: the fixture's own 500 Hz profile makes them a fifth of its time
    // under emulation, and they continue through the vDSO's sigreturn
    // trampoline into the work they interrupted.
    let in_heavy = share(&stacks, |st| {
        label(st, "endpoint").as_deref() == Some("/checkout") && st.has("main.heavy")
    });
    let elsewhere: Vec<String> = stacks
        .iter()
        .filter(|st| label(st, "endpoint").as_deref() == Some("/checkout") && !st.has("main.heavy"))
        .map(describe)
        .collect();
    assert!(
        in_heavy >= 0.95 * checkout,
        "/checkout samples in main.heavy: {:.1}% of {:.1}%; the others:\n{}",
        in_heavy * 100.0,
        checkout * 100.0,
        elsewhere.join("\n")
    );
    // And they are not missed: main.heavy's samples carry the label, from
    // the first sample on (the layout is registered before the perf events
    // are attached).
    let heavy = share(&stacks, |st| st.has("main.heavy"));
    let unlabelled: Vec<String> = stacks
        .iter()
        .filter(|st| st.has("main.heavy") && label(st, "endpoint").is_none())
        .map(describe)
        .collect();
    assert!(
        heavy > 0.05 && in_heavy >= 0.95 * heavy,
        "main.heavy samples labelled /checkout: {:.1}% of {:.1}%; unlabelled:\n{}",
        in_heavy * 100.0,
        heavy * 100.0,
        unlabelled.join("\n")
    );
    // Go's handler returns through the vDSO's sigreturn trampoline (Go
    // sets no sa_restorer on arm64): every sample in it continues into
    // the interrupted goroutine (or the runtime's own thread, sysmon), down
    // to its root. How many there are
    // depends on the host's load (from one to a fifth of the samples), so
    // the minimum is the C scenario's (c-signals), whose handler takes a
    // third of its time.
    // A signal that interrupted the runtime's vDSO calls
    // (runtime.nanotime1, walltime), which run on the system stack, ends
    // there: they are stack switchers the tables stop at.
    let handled: Vec<&Stack> = stacks
        .iter()
        .filter(|st| st.has("runtime.sigtramp") && !delivering_signal(st))
        .collect();
    for st in handled {
        let trampoline = st.depth_of("__kernel_rt_sigreturn");
        let interrupted = trampoline.and_then(|i| Some((i + 1, st.frames.get(i + 1)?)));
        let rooted = st
            .frames
            .last()
            .is_some_and(|(f, _)| GO_ROOTS.contains(&f.as_str()));
        let stopped_at_a_switch = interrupted
            .is_some_and(|(i, (name, _))| i + 1 == st.frames.len() && name.starts_with("runtime."));
        assert!(
            interrupted.is_some_and(|(_, (name, _))| !name.starts_with('['))
                && (rooted || stopped_at_a_switch),
            "a handler sample does not continue through the signal frame into a named, \
             rooted goroutine stack: {}",
            describe(st)
        );
    }
}

/// A fault in Go code on arm64: the signal handler saves the faulting
/// function's LR in 16 bytes below its SP, then fakes a call to
/// `runtime.sigpanic` from the faulting PC. `main.load` has no frame, so
/// its return address is that saved word. Every sample in the deferred
/// function that runs under sigpanic is Go's own stack of it
/// (`runtime.Callers`, written by the fixture in the guest), frame for
/// frame, through the faulting frame to the root (the x86_64 test is
/// `go_stacks_through_a_faulting_frame_are_go_s_own`).
#[test]
fn arm64_go_stacks_through_a_faulting_frame_are_go_s_own() {
    let (s, _) = scenario("go-faults");
    let own = s
        .files
        .get("/tmp/go-faults-own.txt")
        .and_then(|bytes| go_own_stack(&String::from_utf8_lossy(bytes)))
        .unwrap_or_else(|| panic!("the fixture wrote no stack of its own:\n{}", s.log));
    assert!(
        own.iter().any(|f| f == "runtime.sigpanic") && own.iter().any(|f| f == "main.load"),
        "Go's own stack does not go through the fault: {own:?}"
    );
    let stacks = stacks(&profile_of(s, "go-faults"));
    let (agree, total, disagree) = agree_from(&stacks, "main.afterFault", &own, &[]);
    println!(
        "{agree} of {total} samples in main.afterFault are Go's own stack {}",
        own.join(";")
    );
    assert!(
        total >= 20,
        "only {total} samples in main.afterFault\n{}",
        s.log
    );
    assert!(
        agree == total,
        "{} of {total} samples in main.afterFault are not Go's own stack {own:?}; some:\n{}",
        total - agree,
        disagree.join("\n")
    );
}

/// A C program's signal handler (glibc sets no sa_restorer on arm64
/// either), built without frame pointers: samples in the handler continue
/// through the signal frame into the code it interrupted, to main.
#[test]
fn arm64_c_signal_handlers_unwind_into_the_interrupted_code() {
    let (s, _) = scenario("c-signals");
    let stacks = stacks(&profile_of(s, "c-signals"));
    let handled: Vec<&Stack> = stacks
        .iter()
        .filter(|st| st.has("on_alarm") && !delivering_signal(st))
        .collect();
    let samples: i64 = handled.iter().map(|st| st.count).sum();
    assert!(
        samples >= 10,
        "only {samples} samples in the handler:\n{}",
        s.log
    );
    for st in handled {
        let handler = st.depth_of("on_alarm").unwrap();
        assert!(
            st.depth_of("outer").is_some_and(|o| o > handler) && st.has("main"),
            "a handler sample does not continue into the interrupted code: {st:?}"
        );
    }
    assert_signal_frames_walked(&s.log);
}

/// Debian's arm64 python3.11 (stripped, the interpreter in the
/// executable): Python frames in the fixture's call tree order, each
/// caller at the line of its call (read from the script), the 7:3 leaves.
#[test]
fn arm64_python_frames_follow_the_script() {
    let (s, _) = scenario("python");
    assert!(
        s.log.contains("Python: frames read in 1 processes"),
        "{}",
        s.log
    );
    let bytes = s
        .files
        .get("/tmp/python.pb.gz")
        .unwrap_or_else(|| panic!("no profile came back:\n{}", s.log));
    let script =
        std::fs::read_to_string(workspace_root().join("tests/fixtures/python/workload.py"))
            .unwrap();
    let line_of = |needle: &str| {
        script
            .lines()
            .position(|l| l.contains(needle))
            .map(|i| i as u32 + 1)
            .unwrap()
    };
    let (mut a, mut b, mut wrong) = (0i64, 0i64, 0i64);
    for stack in profiler_tests::pprof_raw::RawProfile::of_bytes(bytes).lined_stacks() {
        let python: Vec<(String, u32)> = stack
            .frames
            .iter()
            .filter(|(l, _)| l.file.ends_with(".py"))
            .map(|(l, _)| (l.function.clone(), l.line))
            .collect();
        let call = match python.first().map(|(f, _)| f.as_str()) {
            Some("leaf_a") => {
                a += stack.count;
                line_of("leaf_a(700000)")
            }
            Some("leaf_b") => {
                b += stack.count;
                line_of("leaf_b(300000)")
            }
            _ => continue,
        };
        let callers: Vec<(&str, u32)> = python[1..].iter().map(|(f, l)| (f.as_str(), *l)).collect();
        let expected = [
            ("branch", call),
            ("root", line_of("        branch()")),
            ("main", line_of("        root(deadline)")),
            ("<module>", line_of("    main()")),
        ];
        if callers != expected {
            wrong += stack.count;
        }
    }
    let total = a + b;
    assert!(total >= 200, "{total} leaf samples:\n{}", s.log);
    assert!(
        wrong * 100 <= total,
        "{wrong} of {total} out of the script's order"
    );
    let share = a as f64 / total as f64;
    assert!(
        (share - 0.7).abs() <= 0.08,
        "leaf_a {:.1}% (7:3)",
        share * 100.0
    );
}

#[test]
fn arm64_guest_ran_every_scenario() {
    let (result, _) = run();
    let run = result.as_ref().unwrap_or_else(|e| panic!("{e}"));
    let expected = [
        "c-fp",
        "c-nofp",
        "c-signals",
        "syscalls",
        "go-1.19",
        "go-1.19-s",
        "go-1.27.3",
        "go-1.27.3-s",
        "go-labels",
        "go-state-1.19",
        "go-state-1.27.3",
        "probes-list",
        "latency",
        "off-cpu",
        "python",
        "symbolize-hot",
        "symbolize-go-1.27.3",
    ];
    for name in expected {
        assert!(
            run.scenarios.contains_key(name),
            "{name} missing; console:\n{}",
            tail(&run.console, 40)
        );
    }
    assert!(
        run.console.contains("=== GUEST aarch64"),
        "{}",
        tail(&run.console, 20)
    );
}

/// The Go runtime's heap and goroutines read in the arm64 guest, against
/// what the program wrote itself there (stripped builds: every variable
/// found from arm64 code).
#[test]
fn arm64_go_heap_and_goroutines_match_the_programs_own() {
    for (_, name) in GO_STATE {
        let (s, _) = scenario(name);
        let file = |f: &str| -> &Vec<u8> {
            s.files
                .get(&format!("/tmp/{name}/{f}"))
                .unwrap_or_else(|| panic!("{name}: no {f}:\n{}", s.log))
        };
        let ours = RawProfile::of_bytes(file("ours.pb.gz"));
        let theirs = RawProfile::of_bytes(file("heap.pb.gz"));
        for index in 0..4 {
            let (a, b) = (by_leaf(&ours, index), by_leaf(&theirs, index));
            assert!(
                a.contains_key("main.cacheResponse"),
                "{name}: {a:?}\n{}",
                s.log
            );
            assert_eq!(
                a, b,
                "{name}: {} by function, ours then the program's",
                theirs.sample_types[index]
            );
        }
        let theirs = dump_by_goroutine(&String::from_utf8_lossy(file("goroutines.txt")));
        for dump in ["ours.txt", "stopped.txt"] {
            let ours = dump_by_goroutine(&String::from_utf8_lossy(file(dump)));
            let mut compared = 0;
            for (id, text) in &theirs {
                if *id == 1 {
                    continue;
                }
                assert_eq!(
                    ours.get(id),
                    Some(text),
                    "{name} ({dump}): goroutine {id}, ours then the program's"
                );
                compared += 1;
            }
            assert_eq!(compared, 9, "{name} ({dump})");
        }
    }
}

/// The latency scenario's minutes of soak (`PROFILER_ARM64_SOAK_MINUTES`).
const SOAK_MINUTES: u64 = 25;

/// The kernel's command line of a soak: the kernel's messages on the
/// console (`loglevel=7`), and a soft lockup panics with every CPU's
/// backtrace.
const SOAK_KERNEL_ARGS: &str = "console=ttyAMA0 panic=-1 loglevel=7 softlockup_panic=1 \
                                softlockup_all_cpu_backtrace=1 sysrq_always_enabled=1";

/// The latency scenario, again and again for `minutes`, with a watchdog
/// in the guest that dumps the agent's kernel stacks
/// (`/proc/PID/task/*/stack`), every CPU's (sysrq `l`) and the blocked
/// tasks (sysrq `w`) when one run of the agent lasts over two minutes (it
/// takes seconds). Needs `/bin/latency` and the agent in the guest.
fn latency_soak_script(minutes: u64) -> String {
    format!(
        r#"
soak_wait_for() {{
    w=0
    while ! grep -q "$2" "$1" 2>/dev/null && [ $w -lt 600 ]; do sleep 0.1; w=$((w+1)); done
}}
(
while true; do
    sleep 5
    read AG T < /tmp/agent.now 2>/dev/null || continue
    [ -d /proc/$AG ] || continue
    [ -e /tmp/dumped.$AG ] && continue
    age=$(( $(date +%s) - T ))
    [ $age -gt 120 ] || continue
    touch /tmp/dumped.$AG
    echo "=== WATCHDOG agent $AG running for $age s"
    for t in /proc/$AG/task/*; do
        echo "--- $t $(cat $t/comm) state $(cut -d' ' -f3 $t/stat) wchan $(cat $t/wchan)"
        cat $t/stack
    done
    echo l > /proc/sysrq-trigger
    echo w > /proc/sysrq-trigger
    echo "=== WATCHDOG END"
done
) &
end=$(( $(date +%s) + {seconds} ))
n=0
while [ $(date +%s) -lt $end ]; do
    n=$((n+1))
    rm -f /tmp/soak-gate /tmp/soak.out /tmp/soak-hist.out /tmp/soak-hist.err
    mkfifo /tmp/soak-gate
    /bin/latency 3 wait < /tmp/soak-gate > /tmp/soak.out & L=$!
    exec 5>/tmp/soak-gate
    start=$(date +%s)
    /bin/profiler-agent latency --budget 0 --pid $L \
        usdt:/bin/latency:demo:op__start usdt:/bin/latency:demo:op__done \
        > /tmp/soak-hist.out 2> /tmp/soak-hist.err & AG=$!
    echo "$AG $start" > /tmp/agent.now
    soak_wait_for /tmp/soak-hist.err "attached "
    echo go >&5
    soak_wait_for /tmp/soak.out "^ops"
    kill -INT $AG; wait $AG; rc=$?
    echo go >&5; exec 5>&-; wait $L
    echo "=== SOAK run $n rc $rc seconds $(( $(date +%s) - start )) $(grep -c '^\[' /tmp/soak-hist.out) rows"
done
echo "=== SOAK done $n"
"#,
        seconds = minutes * 60
    )
}

/// Boots `guest` with the soak's kernel command line and fails naming
/// what it saw: a soft lockup or a stuck agent (the console's end), a
/// soak that did not finish, runs that failed. The whole console is kept
/// as target/arm64-guest/console.log.
fn soak(mut guest: Guest, minutes: u64) {
    guest.kernel_args = Some(SOAK_KERNEL_ARGS.into());
    guest.script.push_str(&latency_soak_script(minutes));
    let result = run_guest(&guest, Duration::from_secs(minutes * 60 + 1800));
    let console = match &result {
        Ok(run) => run.console.clone(),
        Err(error) => error.clone(),
    };
    let runs: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("=== SOAK run"))
        .collect();
    let failed: Vec<&&str> = runs.iter().filter(|l| !l.contains(" rc 0 ")).collect();
    eprintln!(
        "arm64 soak: {} runs of the latency scenario in {minutes} min; last: {:?}",
        runs.len(),
        runs.last()
    );
    assert!(
        !console.contains("soft lockup") && !console.contains("=== WATCHDOG"),
        "a stuck agent after {} runs; console:\n{}",
        runs.len(),
        tail(&console, 400)
    );
    assert!(
        result.is_ok() && console.contains("=== SOAK done"),
        "the soak did not finish: {}",
        tail(&console, 100)
    );
    assert!(failed.is_empty(), "runs that failed: {failed:?}");
}

/// The soft lockup the lane saw once in about twenty boots, in the latency
/// scenario (its agent stuck on a CPU in the kernel): one boot that runs
/// only that scenario for `SOAK_MINUTES` (some 600 runs of it), with the
/// kernel's messages on the console, a panic with every CPU's backtrace
/// on a soft lockup, and the watchdog of `latency_soak_script`. Ignored:
/// it holds both CPUs for half an hour (`cargo test -p profiler-tests
/// --test arm64 -- --ignored arm64_latency_scenario_soak`).
#[test]
#[ignore]
fn arm64_latency_scenario_soak() {
    require_bpf_privileges();
    let mut guest = Guest::default();
    guest
        .files
        .push(("/bin/profiler-agent".into(), arm64_agent()));
    guest
        .files
        .push(("/bin/latency".into(), latency_fixture(&fixtures_dir())));
    soak(guest, soak_minutes());
}

/// The same soak after the whole lane's script, in the state the lane
/// leaves the guest in (the lockup came in the lane, after the sampling,
/// Go state and Python scenarios; the latency scenario alone did not
/// reproduce it). Ignored, as above.
#[test]
#[ignore]
fn arm64_latency_scenario_soak_after_the_lane() {
    require_bpf_privileges();
    let (guest, _) = guest();
    soak(guest, soak_minutes());
}

fn soak_minutes() -> u64 {
    std::env::var("PROFILER_ARM64_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(SOAK_MINUTES)
}

/// The lane's kernel command line (`LANE_KERNEL_ARGS`) keeps the console
/// to its framed output, yet a panic (the guest panics on a soft lockup)
/// shows the whole kernel log: a message below the console's level is on
/// it after a crash. A boot of its own (about 8 s here), so a change to
/// the command line that would hide a lockup's trace fails the suite.
#[test]
fn arm64_guest_panic_replays_the_kernel_log() {
    require_bpf_privileges();
    let guest = Guest {
        script: "echo '<6>profiler-agent-test: below the console level' > /dev/kmsg\n\
                 echo '=== CRASHING'\n\
                 echo c > /proc/sysrq-trigger\n"
            .into(),
        ..Guest::default()
    };
    let error = run_guest(&guest, Duration::from_secs(300))
        .expect_err("the guest crashed before its script ended");
    let console = std::fs::read_to_string(kept_console()).unwrap();
    let crash = console.find("=== CRASHING").expect("the script ran");
    assert!(
        console[crash..].contains("profiler-agent-test: below the console level"),
        "the panic did not replay the kernel log:\n{error}"
    );
}

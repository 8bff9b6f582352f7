//! Bad input gets a clear error and a non-zero exit, never a crash.

use profiler_tests::{agent::*, processes::*};

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn missing_pid_is_named() {
    let pid = (4_000_000..4_194_304)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap()
        .to_string();
    let output = run_agent(&["--pid", &pid, "--duration", "1s", "-o", "/tmp/never.pb.gz"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains(&format!("no process with pid {pid}")),
        "{stderr}"
    );
}

#[test]
fn invalid_flags_get_usage_errors() {
    for args in [
        &["--frequency", "0"][..],
        &["--bogus"][..],
        &["--duration", "soon"][..],
        &["--pid", "abc"][..],
        &["--event", "cache-misses"][..],
        &["--event", "page-faults", "--count", "0"][..],
    ] {
        let output = run_agent(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr_of(&output)
        );
        let stderr = stderr_of(&output);
        assert!(
            stderr.starts_with("error:") && stderr.contains("--help"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn unknown_output_extension_says_which_are_known() {
    let output = run_agent(&["-o", "profile.json"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains(".pb.gz") && stderr.contains(".svg"),
        "{stderr}"
    );
}

#[test]
fn pid_that_exits_before_the_first_sample_is_an_error() {
    require_bpf_privileges();
    // `sleep` never runs on a CPU long enough to be sampled at 1 Hz.
    let sleeper = Running::start(std::path::Path::new("/bin/sleep"), &["0.5"]);
    let pid = sleeper.pid().to_string();
    let output = run_agent(&[
        "--pid",
        &pid,
        "-F",
        "1",
        "--duration",
        "3s",
        "-o",
        "/tmp/never.pb.gz",
    ]);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("exited before the first sample"),
        "{stderr}"
    );
}

#[test]
fn unprivileged_run_names_the_missing_capabilities() {
    // Drop to `nobody` (no capabilities) with util-linux's setpriv.
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(agent_bin())
        .args(["--duration", "1s", "-o", "/tmp/never.pb.gz"])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains("CAP_BPF")
            && stderr.contains("CAP_PERFMON")
            && stderr.contains("perf_event_paranoid"),
        "{stderr}"
    );
}

#[test]
fn an_unwritable_output_is_refused_before_profiling() {
    // /proc takes no new files: the run is refused at once, not after its
    // 10 minutes of samples.
    let pid = std::process::id().to_string();
    let output = run_agent(&["--pid", &pid, "-d", "10m", "-o", "/proc/profile.pb.gz"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains("cannot write the profile to /proc/profile.pb.gz")
            && stderr.contains("--output"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("profiling "),
        "it started profiling first: {stderr}"
    );
}

/// Options that do not go together are refused before profiling, naming
/// both: page faults are counted, not timed.
#[test]
fn page_faults_refuse_time_options() {
    for (args, names) in [
        (&["--event", "page-faults", "--off-cpu"][..], "--off-cpu"),
        (&["--event", "page-faults", "--wall"][..], "--wall"),
        (&["--count", "10"][..], "--count"),
    ] {
        let mut all = args.to_vec();
        all.extend(["-d", "1s", "-o", "/tmp/never.pb.gz"]);
        let output = run_agent(&all);
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
}

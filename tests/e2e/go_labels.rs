//! Go pprof labels: the agent profiles a Go workload that runs its work
//! under `pprof.Do` labels while the workload writes its own runtime/pprof
//! CPU profile; the share of samples under each label set must agree
//! within 5 points. Both profiles are read by `go tool pprof -raw` (an
//! independent decoder), on Go 1.19, 1.23 and 1.27, plain and stripped
//! (stripped binaries get their runtime layout from the version table,
//! plain ones from DWARF; `tables` shows that the two agree).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use profiler_tests::{agent::*, go::*, http::*, processes::*, profiles::*};

/// The versions whose labels are compared with runtime/pprof: both label
/// storages (a map until 1.23, a sorted slice from 1.24).
const VERSIONS: [&str; 3] = ["1.19", "1.23.9", "1.27.3"];

/// Builds the go-unwind fixture with toolchain `version`.
fn build(version: &str, stripped: bool, dir: &Path) -> PathBuf {
    let binary = dir.join(format!(
        "labels-{version}{}",
        if stripped { "-stripped" } else { "" }
    ));
    let mut args = vec!["build", "-o", binary.to_str().unwrap()];
    if stripped {
        args.push("-ldflags=-s -w");
    }
    args.push(".");
    go_command(
        &go_toolchain(version),
        &workspace_root().join("tests/fixtures/go-unwind"),
        &args,
        &[],
    );
    binary
}

/// (count, labels) of every sample, as `go tool pprof -raw` prints them:
/// a line "COUNT VALUE...: LOCATIONS", then, indented, "key:[value] ...".
fn raw_samples(profile: &Path) -> Vec<(u64, HashMap<String, String>)> {
    let text = go_pprof(&["-raw"], profile);
    let mut samples: Vec<(u64, HashMap<String, String>)> = Vec::new();
    let mut in_samples = false;
    for line in text.lines() {
        if line.starts_with("Samples:") {
            in_samples = true;
            continue;
        }
        if !in_samples {
            continue;
        }
        if !line.starts_with(' ') {
            if !line.starts_with("samples/") {
                in_samples = false;
            }
            continue;
        }
        let trimmed = line.trim();
        if let Some((values, _locations)) = trimmed.split_once(':')
            && values
                .split_whitespace()
                .all(|v| v.chars().all(|c| c.is_ascii_digit()))
        {
            let count = values.split_whitespace().next().unwrap().parse().unwrap();
            samples.push((count, HashMap::new()));
            continue;
        }
        let Some((_, labels)) = samples.last_mut() else {
            continue;
        };
        for pair in trimmed.split("] ") {
            if let Some((key, value)) = pair.trim_end_matches(']').split_once(":[") {
                labels.insert(key.to_string(), value.to_string());
            }
        }
    }
    samples
}

/// What the fixture ran a sample's code as.
fn kind(labels: &HashMap<String, String>) -> &'static str {
    match labels.get("endpoint").map(String::as_str) {
        Some("/checkout") => "checkout",
        Some("/search") => "search",
        Some("/wide") => "wide",
        Some(_) => "other",
        // The wide label set's kept labels may leave out its endpoint.
        None if is_wide_label_set(labels) => "wide",
        None => "none",
    }
}

/// Percent of samples per kind.
fn shares(samples: &[(u64, HashMap<String, String>)]) -> HashMap<&'static str, f64> {
    let total: u64 = samples.iter().map(|(c, _)| c).sum();
    assert!(total > 0, "no samples");
    let mut shares: HashMap<&'static str, f64> = HashMap::new();
    for (count, labels) in samples {
        *shares.entry(kind(labels)).or_default() += *count as f64 * 100.0 / total as f64;
    }
    shares
}

fn labels_agree_with_runtime_pprof(version: &str, stripped: bool) {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = build(version, stripped, dir.path());
    let own = dir.path().join("own.pprof");
    let fixture = Running::start(&binary, &["labels", "6", own.to_str().unwrap()]);
    let ours = dir.path().join("ours.pb.gz");
    let pid = fixture.pid().to_string();
    // 500 Hz like the fixture's own profile.
    let report = record(&[
        "--pid",
        &pid,
        "-F",
        "500",
        "--duration",
        "5s",
        "-q",
        "-o",
        ours.to_str().unwrap(),
    ]);
    let status = fixture.wait();
    assert!(status.success(), "the fixture failed: {status}");
    let source = if stripped {
        "from the Go version for 1)"
    } else {
        "layout from DWARF for 1 binaries"
    };
    assert!(
        report.contains("Go labels: read in 1 processes") && report.contains(source),
        "Go {version} (stripped: {stripped}): the report does not say labels were read \
         with the layout {source:?}:\n{report}"
    );

    let go = raw_samples(&own);
    let agent = raw_samples(&ours);
    let (go_shares, agent_shares) = (shares(&go), shares(&agent));
    eprintln!(
        "Go {version} stripped={stripped}: runtime/pprof {go_shares:?}, agent {agent_shares:?}"
    );
    for kind in ["checkout", "search", "wide", "none"] {
        let (theirs, mine) = (
            go_shares.get(kind).copied().unwrap_or(0.0),
            agent_shares.get(kind).copied().unwrap_or(0.0),
        );
        assert!(
            (theirs - mine).abs() <= 5.0,
            "Go {version} (stripped: {stripped}): {kind} is {mine:.1}% of the agent's samples \
             and {theirs:.1}% of runtime/pprof's"
        );
    }
    assert!(
        agent_shares.get("checkout").copied().unwrap_or(0.0) > 20.0,
        "the labelled work is missing: {agent_shares:?}"
    );
    for (_, labels) in &agent {
        match kind(labels) {
            "checkout" => assert_eq!(labels.get("tier").map(String::as_str), Some("gold")),
            "search" | "none" => assert!(!labels.contains_key("tier"), "{labels:?}"),
            "wide" => {
                // Twelve labels, eight kept; a value over 96 bytes is cut
                // and marked, whether copied from the heap ("long") or
                // read from the binary ("const").
                let go_labels = labels
                    .keys()
                    .filter(|k| {
                        ["endpoint", "long", "const"].contains(&k.as_str()) || k.starts_with('k')
                    })
                    .count();
                assert_eq!(go_labels, 8, "{labels:?}");
                if let Some(long) = labels.get("long") {
                    assert_eq!(long, &format!("{}…", "x".repeat(96)));
                }
                if let Some(constant) = labels.get("const") {
                    assert_eq!(constant, &format!("{}…", "y".repeat(96)));
                }
            }
            other => panic!("a sample labelled as {other}: {labels:?}"),
        }
    }
    // From Go 1.24 a label set is a list sorted by key: the eight kept
    // are always const, endpoint, k1..k6, so the constant read from the
    // binary must show (a map keeps whichever eight it iterates first).
    let sorted = !["1.19", "1.23"].iter().any(|v| version.starts_with(v));
    if sorted {
        assert!(
            agent.iter().any(|(_, labels)| labels.contains_key("const")),
            "Go {version}: no wide sample has the label read from the binary"
        );
    }
    let cut = report
        .split("samples caught a goroutine, ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the report counts cut labels");
    assert!(
        cut > 0,
        "the wide label set was not counted as cut:\n{report}"
    );
}

#[test]
fn go_1_19_labels_match_runtime_pprof() {
    labels_agree_with_runtime_pprof(VERSIONS[0], false);
}

#[test]
fn go_1_19_stripped_labels_match_runtime_pprof() {
    labels_agree_with_runtime_pprof(VERSIONS[0], true);
}

#[test]
fn go_1_23_labels_match_runtime_pprof() {
    labels_agree_with_runtime_pprof(VERSIONS[1], false);
}

#[test]
fn go_1_23_stripped_labels_match_runtime_pprof() {
    labels_agree_with_runtime_pprof(VERSIONS[1], true);
}

#[test]
fn go_1_27_labels_match_runtime_pprof() {
    labels_agree_with_runtime_pprof(VERSIONS[2], false);
}

#[test]
fn go_1_27_stripped_labels_match_runtime_pprof() {
    labels_agree_with_runtime_pprof(VERSIONS[2], true);
}

/// The table stripped binaries are read with equals what every installed
/// toolchain's DWARF says.
#[test]
fn the_version_table_agrees_with_dwarf() {
    let dir = tempfile::tempdir().unwrap();
    for version in GO_TOOLCHAINS {
        let binary = build(version, false, dir.path());
        let output = run_agent(&["tables", binary.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.contains("from DWARF (the version table agrees)"),
            "Go {version}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Folded stacks start with the labels asked for, goroutine ids included.
#[test]
fn folded_stacks_split_by_labels() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = build("1.27.3", false, dir.path());
    let own = dir.path().join("own.pprof");
    let fixture = Running::start(&binary, &["labels", "4", own.to_str().unwrap()]);
    let folded = dir.path().join("labels.folded");
    let pid = fixture.pid().to_string();
    record(&[
        "--pid",
        &pid,
        "-F",
        "499",
        "--duration",
        "2s",
        "-q",
        "--goroutine-labels",
        "--stack-labels",
        "goroutine,endpoint",
        "-o",
        folded.to_str().unwrap(),
    ]);
    drop(fixture);
    let text = std::fs::read_to_string(&folded).unwrap();
    let count = |prefix: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    // The work runs on the main goroutine (id 1).
    let checkout = count("goroutine=1;endpoint=/checkout;");
    let search = count("goroutine=1;endpoint=/search;");
    let unlabelled = count("goroutine=1;labels-");
    assert!(
        checkout > 0 && search > 0 && unlabelled > 0,
        "checkout {checkout}, search {search}, unlabelled {unlabelled}:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("endpoint=/checkout;") && l.contains("main.heavy")),
        "no /checkout stack through main.heavy:\n{text}"
    );
}

/// The continuous agent's windows carry the labels its `[go_labels]`
/// section keeps: the allowed key, the goroutine id asked for, and not the
/// key left out.
#[test]
fn continuous_windows_keep_the_allowed_labels() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = build("1.27.3", true, dir.path());
    let own = dir.path().join("own.pprof");
    let fixture = Running::start(&binary, &["labels", "30", own.to_str().unwrap()]);
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[go_labels]\nkeys = [\"endpoint\"]\ngoroutine = true\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = AgentRun::start(&[
        "--config",
        config.to_str().unwrap(),
        "--pids",
        &fixture.pid().to_string(),
        "--listen",
        &listen,
        "--window",
        "2s",
        "--directory-path",
        out.to_str().unwrap(),
    ]);
    agent.wait_ready(port);
    let files = wait_for(std::time::Duration::from_secs(30), || {
        let files: Vec<PathBuf> = std::fs::read_dir(&out)
            .ok()?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
            .collect();
        (files.len() >= 2).then_some(files)
    })
    .unwrap_or_else(|| panic!("no windows written:\n{}", agent.log()));
    agent.terminate(std::time::Duration::from_secs(30));
    let mut endpoints: HashMap<String, u64> = HashMap::new();
    for file in &files {
        for (count, labels) in raw_samples(file) {
            assert!(
                !labels.contains_key("tier"),
                "a key not allowed: {labels:?}"
            );
            assert!(!labels.contains_key("k1"), "a key not allowed: {labels:?}");
            if let Some(endpoint) = labels.get("endpoint") {
                assert_eq!(
                    labels.get("goroutine").map(String::as_str),
                    Some("1"),
                    "{labels:?}"
                );
                *endpoints.entry(endpoint.clone()).or_default() += count;
            }
        }
    }
    for endpoint in ["/checkout", "/search"] {
        assert!(
            endpoints.get(endpoint).copied().unwrap_or(0) > 0,
            "no {endpoint} samples in the windows: {endpoints:?}"
        );
    }
}

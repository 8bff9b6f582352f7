//! Profile fidelity: the agent profiles a Go workload while the workload
//! writes its own runtime/pprof CPU profile; every function at 2% flat or
//! 5% cumulative in either profile must agree within ±5 points (missing on
//! one side counts as 0%), and the inlined function must be a frame of its
//! own in both (a `Line` of its own in the leaf `Location`).

use std::collections::HashMap;

use profiler_profile::pprof::proto;
use profiler_tests::{agent::*, go::*, processes::*, profiles::*};

/// Flat share (percent) per function: the innermost line of each sample's
/// innermost user location, as `go tool pprof -top` counts it. Kernel
/// frames are left out: Go's own SIGPROF charges a tick the kernel spent
/// on the way back to the program (`irqentry_exit_to_user_mode`, 12.7%
/// of one clean-clone CI run's samples on a stalling host) to the user PC
/// it returns to, and so does this.
fn flat_shares(profile: &proto::Profile) -> HashMap<String, f64> {
    let strings = |i: i64| profile.string_table[i as usize].clone();
    let functions: HashMap<u64, String> = profile
        .function
        .iter()
        .map(|f| (f.id, strings(f.name)))
        .collect();
    let locations: HashMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| strings(m.filename) == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    let mut flat: HashMap<String, i64> = HashMap::new();
    let mut total = 0;
    for sample in &profile.sample {
        let count = sample.value[0];
        total += count;
        let leaf = sample
            .location_id
            .iter()
            .filter_map(|id| locations.get(id))
            .find(|l| !kernel_mappings.contains(&l.mapping_id));
        if let Some(line) = leaf.and_then(|l| l.line.first()) {
            *flat
                .entry(functions[&line.function_id].clone())
                .or_default() += count;
        }
    }
    flat.into_iter()
        .map(|(name, count)| (name, 100.0 * count as f64 / total.max(1) as f64))
        .collect()
}

/// Cumulative share (percent) per function: the samples whose stack holds
/// it anywhere (inlined frames included), as `go tool pprof -top -cum`.
fn cumulative_shares(profile: &proto::Profile) -> HashMap<String, f64> {
    let strings = |i: i64| profile.string_table[i as usize].clone();
    let functions: HashMap<u64, String> = profile
        .function
        .iter()
        .map(|f| (f.id, strings(f.name)))
        .collect();
    let locations: HashMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let mut cum: HashMap<String, i64> = HashMap::new();
    let mut total = 0;
    for sample in &profile.sample {
        let count = sample.value[0];
        total += count;
        let mut seen = std::collections::HashSet::new();
        for line in sample
            .location_id
            .iter()
            .filter_map(|id| locations.get(id))
            .flat_map(|l| &l.line)
        {
            let name = &functions[&line.function_id];
            if seen.insert(name.clone()) {
                *cum.entry(name.clone()).or_default() += count;
            }
        }
    }
    cum.into_iter()
        .map(|(name, count)| (name, 100.0 * count as f64 / total.max(1) as f64))
        .collect()
}

/// Functions at or above `threshold` percent in either profile, each
/// compared (missing on one side = 0%): within 5 points.
fn assert_shares_agree(
    what: &str,
    go: &HashMap<String, f64>,
    ours: &HashMap<String, f64>,
    threshold: f64,
) {
    let mut names: Vec<&String> = go
        .iter()
        .chain(ours.iter())
        .filter(|(_, share)| **share >= threshold)
        .map(|(name, _)| name)
        .collect();
    // The goroutine's root frame, which Go's own tracebacks leave out and
    // the agent keeps (it is the physical frame the stack walk ends at).
    names.retain(|name| name.as_str() != "runtime.goexit");
    names.sort();
    names.dedup();
    // heavy, medium and light at least (lightLoop's own share is its loop
    // control, 0.5-3% depending on where the compiler puts it).
    assert!(
        names.len() >= 3,
        "{what}: too few functions to compare: {go:?}"
    );
    // Every share printed before any verdict: a failure shows where the
    // missing share went.
    let mut apart = Vec::new();
    for name in names {
        let (theirs, mine) = (
            go.get(name).copied().unwrap_or(0.0),
            ours.get(name).copied().unwrap_or(0.0),
        );
        println!("{what} {name:32} runtime/pprof {theirs:5.1}%   profiler-agent {mine:5.1}%");
        if (mine - theirs).abs() > 5.0 {
            apart.push(format!(
                "{what} {name}: {mine:.1}% in our profile, {theirs:.1}% in Go's own"
            ));
        }
    }
    assert!(apart.is_empty(), "{}", apart.join("\n"));
}

/// Whether some location holds `function` inlined into `caller` (two
/// lines of one location, innermost first).
fn has_inlined_frame(profile: &proto::Profile, function: &str, caller: &str) -> bool {
    let name = |id: u64| {
        let f = profile.function.iter().find(|f| f.id == id).unwrap();
        profile.string_table[f.name as usize].as_str()
    };
    profile.location.iter().any(|l| {
        l.line.len() >= 2
            && name(l.line[0].function_id) == function
            && name(l.line[1].function_id) == caller
    })
}

#[test]
fn go_profile_matches_runtime_pprof() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("split");
    go_command(
        &go_toolchain("1.27.3"),
        &workspace_root().join("tests/fixtures/go-unwind"),
        &["build", "-o", binary.to_str().unwrap(), "."],
        &[],
    );
    let own = dir.path().join("own.pprof");
    // The fixture's own profile covers its last 6 of 10 s, after the
    // agent has started (its start-up competes for the machine and shifts
    // the split while it lasts); the agent stops when the fixture exits,
    // so its profile covers the same end, and its own work after the
    // recording falls outside both.
    let fixture = Running::start(&binary, &["split", "10", own.to_str().unwrap(), "4"]);
    let ours = dir.path().join("ours.pb.gz");
    let pid = fixture.pid().to_string();
    // 500 Hz like the fixture's own profile: ~3,000 samples each, so the
    // sampling error of a share is about one point.
    record(&[
        "--pid",
        &pid,
        "-F",
        "500",
        "--duration",
        "60s",
        "-q",
        "-o",
        ours.to_str().unwrap(),
    ]);
    let status = fixture.wait();
    assert!(status.success(), "the fixture failed: {status}");

    let go = read_pprof(&own);
    let agent = read_pprof(&ours);
    // Both directions: a function only one profile has counts as 0% in
    // the other. Flat shares of the leaves, then cumulative shares of the
    // whole stacks (callers must be right too).
    assert_shares_agree("flat", &flat_shares(&go), &flat_shares(&agent), 2.0);
    assert_shares_agree(
        "cum",
        &cumulative_shares(&go),
        &cumulative_shares(&agent),
        5.0,
    );
    for (name, profile) in [("runtime/pprof", &go), ("profiler-agent", &agent)] {
        assert!(
            has_inlined_frame(profile, "main.light", "main.lightLoop"),
            "{name}: main.light is not an inlined frame of main.lightLoop"
        );
    }
}

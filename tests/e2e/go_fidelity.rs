//! Profile fidelity: the agent profiles a Go workload while the workload
//! writes its own runtime/pprof CPU profile; each top function's flat
//! share must agree within ±5 points, and the inlined function must be a
//! frame of its own in both (a `Line` of its own in the leaf `Location`).

use std::collections::HashMap;

use profiler_tests::*;

/// Flat share (percent) per function: the innermost line of each sample's
/// leaf location, as `go tool pprof -top` counts it.
fn flat_shares(profile: &proto::Profile) -> HashMap<String, f64> {
    let strings = |i: i64| profile.string_table[i as usize].clone();
    let functions: HashMap<u64, String> = profile
        .function
        .iter()
        .map(|f| (f.id, strings(f.name)))
        .collect();
    let locations: HashMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let mut flat: HashMap<String, i64> = HashMap::new();
    let mut total = 0;
    for sample in &profile.sample {
        let count = sample.value[0];
        total += count;
        let leaf = sample.location_id.first().and_then(|id| locations.get(id));
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
    let fixture = Running::start(&binary, &["split", "7", own.to_str().unwrap()]);
    let ours = dir.path().join("ours.pb.gz");
    let pid = fixture.pid().to_string();
    // 500 Hz like the fixture's own profile: ~2,500 samples each, so the
    // sampling error of a share is about one point.
    record(&[
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

    let go = read_pprof(&own);
    let agent = read_pprof(&ours);
    let go_flat = flat_shares(&go);
    let agent_flat = flat_shares(&agent);
    let mut top: Vec<_> = go_flat.iter().filter(|(_, share)| **share >= 2.0).collect();
    top.sort_by(|a, b| b.1.total_cmp(a.1));
    assert!(
        top.len() >= 4,
        "Go's profile has too few top functions: {go_flat:?}"
    );
    for (function, go_share) in top {
        let ours = agent_flat.get(function).copied().unwrap_or(0.0);
        println!("{function:20} runtime/pprof {go_share:5.1}%   profiler-agent {ours:5.1}%");
        assert!(
            (ours - go_share).abs() <= 5.0,
            "{function}: {ours:.1}% in our profile, {go_share:.1}% in Go's own"
        );
    }
    for (name, profile) in [("runtime/pprof", &go), ("profiler-agent", &agent)] {
        assert!(
            has_inlined_frame(profile, "main.light", "main.lightLoop"),
            "{name}: main.light is not an inlined frame of main.lightLoop"
        );
    }
}

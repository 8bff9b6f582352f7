//! The sampler end to end: real BPF on this kernel, real fixture processes,
//! the real agent binary, and assertions on the symbols it wrote.

use profiler_tests::*;

fn hot_fixture() -> std::path::PathBuf {
    build_c_fixture("hot", C_FRAME_POINTER_FLAGS)
}

fn share(part: i64, whole: i64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

#[test]
fn pid_profile_splits_hot_a_and_hot_b_two_to_one() {
    require_bpf_privileges();
    let fixture = Running::start(&hot_fixture(), &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.pb.gz");
    let pid = fixture.pid().to_string();
    record(&[
        "--pid",
        &pid,
        "--duration",
        "3s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);

    let profile = read_pprof(&out);
    let stacks = stacks(&profile);
    assert!(!stacks.is_empty(), "no samples");
    for stack in &stacks {
        assert_eq!(
            stack.labels["pid"], pid,
            "a sample from another process: {stack:?}"
        );
        assert!(stack.labels.contains_key("tid") && stack.labels.contains_key("thread"));
    }
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let in_a: i64 = stacks
        .iter()
        .filter(|s| s.has("hot_a"))
        .map(|s| s.count)
        .sum();
    let in_b: i64 = stacks
        .iter()
        .filter(|s| s.has("hot_b"))
        .map(|s| s.count)
        .sum();
    let share_a = share(in_a, in_a + in_b);
    let share_b = share(in_b, in_a + in_b);
    println!("samples {total}: hot_a {in_a} ({share_a:.1}%), hot_b {in_b} ({share_b:.1}%)");
    // About 3 s at 100 Hz on one busy thread.
    assert!(total >= 150, "only {total} samples in 3 s at 100 Hz");
    assert!(
        (share_a - 66.7).abs() <= 10.0,
        "hot_a share {share_a:.1}% is not 67±10%"
    );
    assert!(
        (share_b - 33.3).abs() <= 10.0,
        "hot_b share {share_b:.1}% is not 33±10%"
    );
    assert!(
        in_a + in_b >= total * 9 / 10,
        "hot_a/hot_b in only {} of {total}",
        in_a + in_b
    );

    // Complete stacks: main → round_trip → hot_a → work, root-most last.
    let complete = stacks.iter().any(|s| {
        matches!(
            (s.depth_of("work"), s.depth_of("hot_a"), s.depth_of("round_trip"), s.depth_of("main")),
            (Some(w), Some(a), Some(r), Some(m)) if w < a && a < r && r < m
        )
    });
    assert!(
        complete,
        "no stack main → round_trip → hot_a → work: {stacks:#?}"
    );
    let with_main: i64 = stacks
        .iter()
        .filter(|s| s.has("main"))
        .map(|s| s.count)
        .sum();
    assert!(
        with_main * 100 >= total * 95,
        "only {with_main} of {total} stacks reach main"
    );

    // Go's own tool reads it and names the functions.
    let top = go_pprof(&["-top"], &out);
    assert!(top.contains("hot_a") || top.contains("work"), "{top}");
    let traces = go_pprof(&["-traces"], &out);
    assert!(
        traces.contains("hot_a") && traces.contains("hot_b") && traces.contains("main"),
        "{traces}"
    );
}

#[test]
fn system_wide_profile_labels_the_fixture() {
    require_bpf_privileges();
    let fixture = Running::start(&hot_fixture(), &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("all.pb.gz");
    record(&["--duration", "2s", "-q", "-o", out.to_str().unwrap()]);

    let pid = fixture.pid().to_string();
    let stacks = stacks(&read_pprof(&out));
    let mine: Vec<_> = stacks.iter().filter(|s| s.labels["pid"] == pid).collect();
    assert!(
        !mine.is_empty(),
        "no sample labelled pid={pid} in a system-wide profile"
    );
    for stack in &mine {
        assert!(
            stack.labels["comm"].starts_with("hot"),
            "comm label: {:?}",
            stack.labels
        );
    }
    assert!(mine.iter().any(|s| s.has("hot_a") && s.has("main")));
    // The idle task is not a process.
    assert!(
        stacks.iter().all(|s| s.labels["pid"] != "0"),
        "idle samples were recorded"
    );
    assert!(
        stacks.iter().all(|s| !s.frames.is_empty()),
        "an empty stack"
    );
    let pids: std::collections::HashSet<_> = stacks.iter().map(|s| &s.labels["pid"]).collect();
    println!(
        "system-wide: {} stacks from {} processes",
        stacks.len(),
        pids.len()
    );

    let top = go_pprof(&["-top"], &out);
    assert!(top.contains("work"), "{top}");
    go_pprof(&["-traces"], &out);
}

#[test]
fn pid_filter_excludes_other_processes() {
    require_bpf_privileges();
    let target = Running::start(&hot_fixture(), &["20"]);
    let other = Running::start(&build_c_fixture("syscalls", C_FRAME_POINTER_FLAGS), &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("filtered.pb.gz");
    let pid = target.pid().to_string();
    let stderr = record(&[
        "--pid",
        &pid,
        "--duration",
        "2s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);

    let stacks = stacks(&read_pprof(&out));
    assert!(stacks.iter().any(|s| s.has("hot_a")));
    let other_pid = other.pid().to_string();
    for stack in &stacks {
        assert_eq!(stack.labels["pid"], pid);
        assert_ne!(stack.labels["pid"], other_pid);
        assert!(
            !stack.has("do_reads"),
            "the other process leaked in: {stack:?}"
        );
    }
    // The kernel dropped the other process's samples before any stack work.
    let outside = stderr
        .split("outside --pid")
        .next()
        .and_then(|head| head.rsplit(", ").next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no 'outside --pid' count in: {stderr}"));
    assert!(
        outside > 50,
        "only {outside} samples filtered out while another process was busy: {stderr}"
    );
}

#[test]
fn syscall_stacks_put_kernel_frames_under_the_calling_user_frame() {
    require_bpf_privileges();
    let fixture = Running::start(&build_c_fixture("syscalls", C_FRAME_POINTER_FLAGS), &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let pprof = dir.path().join("sys.pb.gz");
    let folded = dir.path().join("sys.folded");
    let pid = fixture.pid().to_string();
    record(&[
        "--pid",
        &pid,
        "--duration",
        "2s",
        "-q",
        "-o",
        pprof.to_str().unwrap(),
    ]);
    record(&[
        "--pid",
        &pid,
        "--duration",
        "1s",
        "-q",
        "-o",
        folded.to_str().unwrap(),
    ]);

    let stacks = stacks(&read_pprof(&pprof));
    let in_kernel: Vec<_> = stacks
        .iter()
        .filter(|s| s.frames.first().is_some_and(|(_, kernel)| *kernel))
        .collect();
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let kernel_samples: i64 = in_kernel.iter().map(|s| s.count).sum();
    println!("{kernel_samples} of {total} samples in the kernel");
    assert!(
        kernel_samples * 2 > total,
        "a read loop on /dev/zero should spend most time in the kernel"
    );
    let read_functions = [
        "vfs_read",
        "ksys_read",
        "__x64_sys_read",
        "__arm64_sys_read",
        "read_zero",
    ];
    let mut checked = 0;
    for stack in &in_kernel {
        // Leaf first: every kernel frame, then every user frame.
        let first_user = stack.frames.iter().position(|(_, kernel)| !kernel);
        let Some(first_user) = first_user else {
            continue;
        };
        assert!(
            stack.frames[first_user..].iter().all(|(_, kernel)| !kernel),
            "kernel frames mixed into the user part: {stack:?}"
        );
        if stack.frames[..first_user]
            .iter()
            .any(|(name, _)| read_functions.contains(&name.as_str()))
        {
            let caller = &stack.frames[first_user].0;
            assert!(
                caller == "raw_read" || caller == "do_reads",
                "the read syscall's user frame is {caller}: {stack:?}"
            );
            assert!(stack.has("do_reads") && stack.has("main"), "{stack:?}");
            checked += 1;
        }
    }
    assert!(
        checked > 0,
        "no kernel stack through a read syscall: {in_kernel:#?}"
    );

    let text = std::fs::read_to_string(&folded).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(";do_reads;") && l.contains("vfs_read_[k]"))
        .unwrap_or_else(|| panic!("no folded stack do_reads → vfs_read_[k]:\n{text}"));
    assert!(
        line.starts_with("syscalls"),
        "folded lines start with the process name: {line}"
    );
    let user = line.find(";do_reads;").unwrap();
    let kernel = line.find("_[k]").unwrap();
    assert!(
        user < kernel,
        "folded stacks are root first, kernel frames last: {line}"
    );
}

#[test]
fn flame_graph_and_folded_outputs() {
    require_bpf_privileges();
    let fixture = Running::start(&hot_fixture(), &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("flame.svg");
    let pid = fixture.pid().to_string();
    record(&[
        "--pid",
        &pid,
        "--duration",
        "1s",
        "-q",
        "-o",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("hot_a"),
        "not a flame graph of the fixture"
    );

    let folded = dir.path().join("stacks.txt");
    record(&[
        "--pid",
        &pid,
        "--duration",
        "1s",
        "-q",
        "-o",
        folded.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&folded).unwrap();
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("`stack count`");
        assert!(count.parse::<u64>().is_ok(), "bad count in {line}");
        assert!(stack.starts_with("hot"), "{line}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains(";main;round_trip;hot_a;work ")),
        "{text}"
    );
}

#[test]
fn process_exiting_mid_run_keeps_its_samples() {
    require_bpf_privileges();
    // Runs for two seconds, then exits while the agent is still recording.
    let fixture = Running::start(&hot_fixture(), &["2"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("exited.pb.gz");
    let pid = fixture.pid().to_string();
    let stderr = record(&[
        "--pid",
        &pid,
        "--duration",
        "5s",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(stderr.contains("exited"), "{stderr}");
    let stacks = stacks(&read_pprof(&out));
    assert!(
        stacks.iter().any(|s| s.has("hot_a") && s.has("main")),
        "the exited process was not symbolized: {stacks:#?}"
    );
}

#[test]
fn deleted_binary_is_still_symbolized() {
    require_bpf_privileges();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("hot-deleted");
    std::fs::copy(hot_fixture(), &copy).unwrap();
    let fixture = Running::start(&copy, &["20"]);
    std::fs::remove_file(&copy).unwrap();
    let out = dir.path().join("deleted.pb.gz");
    let pid = fixture.pid().to_string();
    record(&[
        "--pid",
        &pid,
        "--duration",
        "1s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stacks = stacks(&read_pprof(&out));
    assert!(stacks.iter().any(|s| s.has("hot_a")), "{stacks:#?}");
}

#[test]
fn stacks_deeper_than_the_kernels_127_frames_reach_main() {
    require_bpf_privileges();
    let fixture = Running::start(&build_c_fixture("deep", C_FRAME_POINTER_FLAGS), &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("deep.pb.gz");
    let pid = fixture.pid().to_string();
    record(&[
        "--pid",
        &pid,
        "--duration",
        "2s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stacks = stacks(&read_pprof(&out));
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let deep: i64 = stacks
        .iter()
        .filter(|s| s.has("bottom") && s.has("main"))
        .filter(|s| {
            s.frames
                .iter()
                .filter(|(name, _)| name == "descend")
                .count()
                == 301
        })
        .map(|s| s.count)
        .sum();
    println!("{deep} of {total} samples have all 301 descend frames between bottom and main");
    assert!(total > 100);
    assert!(
        deep * 100 >= total * 90,
        "only {deep} of {total} complete deep stacks"
    );
}

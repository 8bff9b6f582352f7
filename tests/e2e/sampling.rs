//! The sampler end to end: real BPF on this kernel, real fixture processes,
//! the real agent binary, and assertions on the symbols it wrote.

use profiler_tests::shares::{Share, share_near};
use profiler_tests::{agent::*, fixtures::*, processes::*, profiles::*};

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
        "4s",
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
    // About 4 s at 100 Hz on one busy thread: 400 samples, enough for the
    // 2:1 split to be told from 1:1 beyond chance.
    assert!(total >= 300, "only {total} samples in 4 s at 100 Hz");
    if let Err(why) = share_near("hot_a", Share::of(in_a, in_a + in_b), 2.0 / 3.0, 0.0, 0.12) {
        panic!("{why} (hot_a does twice hot_b's work)");
    }
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

/// What `go tool pprof -raw` (Go's own decoder, not the agent's structs)
/// prints of a profile: its samples' labels, its locations (address,
/// mapping, innermost function and line) and its mappings (start, limit,
/// offset, file, build id).
struct Raw {
    sample_labels: Vec<std::collections::HashMap<String, String>>,
    locations: Vec<(u64, usize, String, u32)>,
    mappings: std::collections::HashMap<usize, (u64, u64, u64, String, String)>,
}

fn raw_profile(path: &std::path::Path) -> Raw {
    let text = go_pprof(&["-raw"], path);
    let mut raw = Raw {
        sample_labels: Vec::new(),
        locations: Vec::new(),
        mappings: Default::default(),
    };
    let mut section = "";
    for line in text.lines() {
        match line {
            "Samples:" | "Locations" | "Mappings" => {
                section = line;
                continue;
            }
            _ => {}
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match section {
            "Samples:" if line.contains(":[") => {
                raw.sample_labels.push(
                    fields
                        .iter()
                        .filter_map(|f| f.trim_end_matches(']').split_once(":["))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                );
            }
            // "  1: 0x55a34776315f M=1 work /path/hot.c:17 s=0", or with a
            // column, "/path/hot.c:17:0"
            "Locations" if fields.len() >= 4 && fields[0].ends_with(':') => {
                let address = u64::from_str_radix(fields[1].trim_start_matches("0x"), 16).unwrap();
                let Some(mapping) = fields[2].strip_prefix("M=") else {
                    continue;
                };
                // `file:line`, or `file:line:column` (newer pprof).
                let parts: Vec<&str> = fields[4].rsplitn(3, ':').collect();
                let line_no = match parts.as_slice() {
                    [column, line, _] if column.parse::<u32>().is_ok() => line.parse().ok(),
                    [line, ..] => line.parse().ok(),
                    [] => None,
                }
                .unwrap_or(0);
                raw.locations.push((
                    address,
                    mapping.parse().unwrap(),
                    fields[3].to_string(),
                    line_no,
                ));
            }
            // "1: 0x55a347763000/0x55a347764000/0x1000 /tmp/hot BUILDID [FN]..."
            "Mappings" if fields.len() >= 3 && fields[0].ends_with(':') => {
                let id = fields[0].trim_end_matches(':').parse().unwrap();
                let bounds: Vec<u64> = fields[1]
                    .split('/')
                    .map(|n| u64::from_str_radix(n.trim_start_matches("0x"), 16).unwrap())
                    .collect();
                let build_id = fields
                    .get(3)
                    .filter(|f| !f.starts_with('['))
                    .unwrap_or(&"")
                    .to_string();
                raw.mappings.insert(
                    id,
                    (
                        bounds[0],
                        bounds[1],
                        bounds[2],
                        fields[2].to_string(),
                        build_id,
                    ),
                );
            }
            _ => {}
        }
    }
    raw
}

/// The GNU build id of `binary`, as `readelf -n` prints it.
fn readelf_build_id(binary: &std::path::Path) -> String {
    let notes = run_tool("readelf", &["-n", binary.to_str().unwrap()]);
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the fixture has a GNU build id")
        .trim()
        .to_string()
}

/// The profile as Go's own pprof reads it: the fixture's mapping carries
/// its path and the build id readelf finds, every location in it names
/// the function and line binutils' addr2line gives for its address (or
/// the call one byte before a return address), and every sample carries
/// the fixture's pid and name.
#[test]
fn go_tool_pprof_reads_mappings_build_ids_lines_and_labels_as_binutils_does() {
    require_bpf_privileges();
    let binary = hot_fixture();
    let fixture = Running::start(&binary, &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.pb.gz");
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
    drop(fixture);

    let raw = raw_profile(&out);
    assert!(!raw.sample_labels.is_empty(), "no samples");
    let name = binary.file_name().unwrap().to_string_lossy();
    let comm = &name[..name.len().min(15)];
    for labels in &raw.sample_labels {
        assert_eq!(labels.get("pid"), Some(&pid), "{labels:?}");
        assert_eq!(
            labels.get("comm").map(String::as_str),
            Some(comm),
            "{labels:?}"
        );
    }
    let path = binary.to_str().unwrap();
    let (&id, &(start, _, offset, _, ref build_id)) = raw
        .mappings
        .iter()
        .find(|(_, m)| m.3 == path)
        .unwrap_or_else(|| panic!("no mapping of {path}: {:?}", raw.mappings));
    assert_eq!(build_id, &readelf_build_id(&binary), "build id of {path}");
    // The fixture is a PIE: its file offsets are its virtual addresses.
    let ours: Vec<&(u64, usize, String, u32)> =
        raw.locations.iter().filter(|l| l.1 == id).collect();
    assert!(
        ours.len() >= 4,
        "locations in the fixture: {:?}",
        raw.locations
    );
    let addresses: Vec<String> = ours
        .iter()
        .flat_map(|l| {
            let file_address = l.0 - start + offset;
            [file_address, file_address - 1]
        })
        .map(|a| format!("{a:#x}"))
        .collect();
    let mut args = vec!["-f", "-e", path];
    args.extend(addresses.iter().map(String::as_str));
    let answers = run_tool("addr2line", &args);
    let answers: Vec<&str> = answers.lines().collect();
    for (i, (address, _, function, line)) in ours.iter().enumerate() {
        let at = |k: usize| -> (&str, u32) {
            let function = answers[2 * k];
            let line = answers[2 * k + 1]
                .rsplit_once(':')
                .and_then(|(_, l)| l.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            (function, line)
        };
        let (exact, before) = (at(2 * i), at(2 * i + 1));
        assert!(
            (function.as_str(), *line) == exact || (function.as_str(), *line) == before,
            "{address:#x}: pprof reads {function}:{line}, addr2line says {exact:?} at the \
             address and {before:?} one byte before"
        );
    }
}

/// `--event page-faults`: one sample per 64 page faults, with the stack
/// that faulted. The fixture first-touches 3 MiB from `grow_big` for each
/// MiB from `grow_small`, one fault per 4 KiB page (huge pages refused),
/// built without frame pointers: the profile splits 3 to 1, its stacks
/// reach main, and pprof counts page faults (64 per sample), as `perf
/// record -e page-faults -c 64` does.
#[test]
fn page_faults_are_sampled_where_memory_is_first_touched() {
    require_bpf_privileges();
    let fixture = build_c_fixture("touch", &["-O2", "-g", "-fomit-frame-pointer"]);
    let running = Running::start(&fixture, &["20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("faults.pb.gz");
    let report = record(&[
        "--pid",
        &running.pid().to_string(),
        "--event",
        "page-faults",
        "--duration",
        "3s",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    let profile = read_pprof(&out);
    let s = |i: i64| profile.string_table[i as usize].clone();
    let types: Vec<(String, String)> = profile
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("samples".to_string(), "count".to_string()),
            ("page_faults".to_string(), "count".to_string())
        ],
        "{report}"
    );
    assert_eq!(profile.period, 64);
    for sample in &profile.sample {
        assert_eq!(sample.value[1], sample.value[0] * 64, "{sample:?}");
    }
    let stacks = stacks(&profile);
    let total: i64 = stacks.iter().map(|s| s.count).sum();
    let count =
        |name: &str| -> i64 { stacks.iter().filter(|s| s.has(name)).map(|s| s.count).sum() };
    let (big, small) = (count("grow_big"), count("grow_small"));
    println!("{total} samples: grow_big {big}, grow_small {small}\n{report}");
    // Thousands of faults a second: hundreds of samples at the least.
    assert!(total >= 300, "{total} samples\n{report}");
    assert!(
        big + small >= total * 95 / 100,
        "{big} + {small} of {total}"
    );
    if let Err(why) = share_near("grow_big", Share::of(big, big + small), 0.75, 0.0, 0.05) {
        panic!("{why} (grow_big touches 3 MiB for grow_small's 1)\n{report}");
    }
    // Through the CFI: touch ← grow ← grow_big ← big_caller ← main.
    let whole = stacks
        .iter()
        .filter(|s| {
            matches!(
                (s.depth_of("touch"), s.depth_of("grow_big"), s.depth_of("big_caller"), s.depth_of("main")),
                (Some(t), Some(g), Some(c), Some(m)) if t < g && g < c && c < m
            )
        })
        .map(|s| s.count)
        .sum::<i64>();
    assert!(whole * 100 >= big * 95, "{whole} of {big} complete");
    assert!(count("main") * 100 >= total * 95, "stacks that miss main");
    // Go's tool reads the sample type.
    let top = go_pprof(&["-top", "-sample_index=page_faults"], &out);
    assert!(
        top.contains("Type: page_faults") && top.contains("touch"),
        "{top}"
    );
}

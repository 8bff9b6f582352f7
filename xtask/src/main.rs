//! Developer entry points. `cargo xtask run -- ARGS` and `cargo xtask test`
//! are the README's two commands; both install whatever is missing first.

mod bench;
mod fuzz;
mod setup;
mod shell;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use setup::Tier;
use shell::{TestCounts, cargo, run, run_tests};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup [--tests]     install what building (and, with --tests, testing) needs
  build               setup, then build the release agent (BPF object embedded)
  run -- ARGS...      setup, build, then run the agent with ARGS (as root)
  test                setup, then formatting, clippy, the aarch64 cross-build,
                      every test (the arm64 lane in a qemu guest among them):
                      what CI runs
  bench [--quick]     overhead and cost against perf, bpftrace and bcc (as
                      root); writes BENCHMARKS.md (--quick: a smoke run of a
                      few minutes, written to target/bench/ instead)
  fuzz [--seconds N] [TARGET...]
                      run the parsers' fuzz targets (cargo-fuzz, nightly)
                      for N seconds each [default: 60]";

fn main() -> ExitCode {
    // Started from a background shell job or `nohup` (as CI scripts do),
    // this process inherits SIGINT ignored, and so would every tool it
    // starts: the bench stops perf, bpftrace and bcc with SIGINT, and
    // bcc's Python tools never install a handler over an ignored signal.
    // They slept on until killed, 180 s each, and what they print at exit
    // was lost (every bcc `profile` of a full bench run started that way).
    // bpftrace installs its own handler and is not affected. The default
    // disposition is what a terminal gives them.
    // SAFETY: at start-up, before any thread: `signal` with SIG_DFL only
    // restores the default action.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::ensure(if args.iter().any(|a| a == "--tests") {
            Tier::Test
        } else {
            Tier::Build
        }),
        Some("build") => build_release().map(|_| ()),
        Some("run") => run_agent(&args[1..]),
        Some("test") => test(),
        Some("bench") => bench::run(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ has a parent")
        .to_path_buf()
}

fn build_release() -> anyhow::Result<PathBuf> {
    setup::ensure(Tier::Build)?;
    // profiler-bpf's build script compiles the BPF programs (a nested
    // nightly cargo) and prints nothing while it works: say so once.
    eprintln!("xtask: building profiler-agent and its BPF programs (nightly, bpf-linker)");
    run(cargo().args(["build", "--release", "-p", "profiler-agent"]))?;
    Ok(workspace_root().join("target/release/profiler-agent"))
}

fn run_agent(args: &[String]) -> anyhow::Result<()> {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    let agent = build_release()?;
    let status = std::process::Command::new(&agent)
        .args(args)
        .status()
        .with_context(|| format!("starting {}", agent.display()))?;
    if !status.success() {
        bail!("profiler-agent exited with {status}");
    }
    Ok(())
}

fn test() -> anyhow::Result<()> {
    setup::ensure(Tier::Test)?;
    let root = workspace_root();
    run(cargo().args(["fmt", "--all", "--", "--check"]))
        .context("formatting: run `cargo fmt --all`")?;
    run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    run(cargo().args(["build", "-p", "profiler-agent"]))?;
    let agent = root.join("target/debug/profiler-agent");
    // The product promises arm64: the agent and its BPF object are built
    // for it, optimized, and the arm64 lane (tests/e2e/arm64.rs) runs that
    // build in an arm64 guest.
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "profiler-agent",
        "--target",
        "aarch64-unknown-linux-gnu",
    ]))?;
    let arm64_agent = root.join("target/aarch64-unknown-linux-gnu/release/profiler-agent");
    // Unit tests in parallel; the end-to-end tests one at a time, so two
    // profiles never compete for the machine's two CPUs.
    let mut counts = TestCounts::default();
    let unit = run_tests(
        cargo()
            .args([
                "test",
                "--workspace",
                "--exclude",
                "profiler-ebpf",
                "--exclude",
                "profiler-tests",
            ])
            .env("PROFILER_AGENT_BIN", &agent),
        &mut counts,
    );
    let end_to_end = run_tests(
        cargo()
            .args([
                "test",
                "-p",
                "profiler-tests",
                "--no-fail-fast",
                "--",
                "--test-threads=1",
            ])
            .env("PROFILER_AGENT_BIN", &agent)
            .env("PROFILER_AGENT_ARM64_BIN", &arm64_agent),
        &mut counts,
    );
    println!(
        "tests: {} passed, {} failed, {} skipped",
        counts.passed, counts.failed, counts.ignored
    );
    unit?;
    end_to_end?;
    // The benchmark harness, a second or two per scenario, so it cannot
    // rot; its numbers are not checked (the machine is shared).
    bench::run(&[
        "--quick".into(),
        "--agent".into(),
        agent.display().to_string(),
    ])
    .context("cargo xtask bench --quick")?;
    eprintln!("xtask: all checks passed");
    // The test counts again as the last line, where CI looks for them.
    println!(
        "tests: {} passed, {} failed, {} skipped",
        counts.passed, counts.failed, counts.ignored
    );
    Ok(())
}

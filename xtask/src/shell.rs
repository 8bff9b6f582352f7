//! Running commands with their output visible, failing loudly.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The cargo that runs this xtask (so toolchain overrides carry over).
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(super::workspace_root());
    command
}

/// Runs `command`, echoing it first; an unsuccessful exit is an error.
pub fn run(command: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", describe(command));
    let status = command
        .status()
        .with_context(|| format!("starting {}", describe(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(command));
    }
    Ok(())
}

/// Test counts summed over every `test result:` line cargo printed.
#[derive(Debug, Default, Clone, Copy)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

/// Runs a `cargo test` command, passing its output through, and adds up
/// its `test result:` lines. A failing run is an error after the counts
/// are taken, so the caller can still report them.
pub fn run_tests(command: &mut Command, counts: &mut TestCounts) -> anyhow::Result<()> {
    use std::io::{BufRead, BufReader};
    eprintln!("xtask: $ {}", describe(command));
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", describe(command)))?;
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(result) = line.strip_prefix("test result: ") {
            let number = |word: &str| -> u64 {
                result
                    .split(';')
                    .find_map(|part| {
                        part.trim()
                            .trim_start_matches("ok. ")
                            .trim_start_matches("FAILED. ")
                            .strip_suffix(word)
                    })
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            };
            counts.passed += number(" passed");
            counts.failed += number(" failed");
            counts.ignored += number(" ignored");
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(command));
    }
    Ok(())
}

/// Whether `command` runs and exits 0, with its output discarded.
pub fn succeeds(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The command's stdout, if it ran and exited 0.
pub fn output(command: &mut Command) -> Option<String> {
    let output = command.stderr(Stdio::null()).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

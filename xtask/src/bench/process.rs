//! Processes the bench starts: killed when dropped (also on error paths),
//! and watched for CPU time and peak memory while they live.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A child process that is killed and reaped when dropped, so a failing
/// scenario never leaves profilers or workloads running.
pub struct Managed {
    child: Option<Child>,
    pub name: String,
    watch: Option<Watch>,
    /// Set once the child is reaped (by `exited`): its status, and the
    /// kernel's account of its whole life.
    reaped: Option<(ExitStatus, Usage)>,
    /// The bench's own VmHWM when it started the child. Linux carries the
    /// high-water mark of the memory a process replaces at exec into its
    /// ru_maxrss, and a spawned child execs from the bench's memory (vfork
    /// shares it): a ru_maxrss no higher than this may be the bench's.
    spawner_peak_rss_bytes: u64,
}

impl Managed {
    pub fn spawn(command: &mut Command, name: &str) -> anyhow::Result<Self> {
        // Read first: the spawn cannot lower it, only add to it.
        let spawner_peak_rss_bytes =
            status_kib(std::process::id(), "VmHWM:").unwrap_or(u64::MAX / 1024) * 1024;
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self {
            child: Some(child),
            name: name.to_string(),
            watch: None,
            reaped: None,
            spawner_peak_rss_bytes,
        })
    }

    /// Spawns with stdout and stderr going to `log`.
    pub fn spawn_logged(command: &mut Command, name: &str, log: &Path) -> anyhow::Result<Self> {
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        Self::spawn(command, name)
    }

    /// Starts sampling this process's CPU time and peak RSS in the
    /// background until it exits.
    pub fn watch(&mut self) {
        self.watch = Some(Watch::start(self.pid()));
    }

    /// The child's stdout, if it was spawned with `Stdio::piped()`.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if let Some((status, _)) = self.reaped {
            return Ok(Some(status));
        }
        let Some(child) = self.child.as_ref() else {
            bail!("{} was already reaped", self.name);
        };
        // wait4 rather than `Child::try_wait`: the kernel hands over the
        // child's peak RSS and CPU time of its whole life with its status.
        // Polling /proc misses whatever happens in the last poll interval
        // before exit, which for a profiler is writing its output (the
        // agent's peak memory at a high rate was there: 57.2 MiB polled,
        // 63.2 MiB seen by a 20 ms poll of the same run).
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: rusage is plain old data; wait4 fills it in.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child, writing only to the two locals.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == 0 {
            return Ok(None);
        }
        if reaped != pid {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("waiting for {} ({pid})", self.name));
        }
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let whole_life = Usage {
            cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            // Linux gives ru_maxrss in KiB.
            peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
        };
        let status = std::process::ExitStatus::from_raw(status);
        self.reaped = Some((status, whole_life));
        Ok(Some(status))
    }

    /// Sends SIGINT (how every profiler here is told to stop and write).
    pub fn interrupt(&self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-INT", &self.pid().to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -INT {} ({}) failed", self.pid(), self.name);
        }
        Ok(())
    }

    /// Tells a tracer to stop (SIGINT) and waits up to `timeout`. The agent
    /// (`ours`) must stop when told: not exiting is an error. A peer that
    /// hangs on its way out has already been measured, so it is killed and
    /// reported, and `None` is returned: bpftrace 0.17 was seen, now and
    /// then, to print nothing and not exit for minutes after SIGINT, while
    /// the same runs passed before and after (cause unknown; bcc's tools
    /// hung every time while the bench passed them SIGINT ignored, which
    /// `main` now resets).
    /// Also returns the usage seen while it lived.
    pub fn stop_tracer(
        self,
        timeout: Duration,
        ours: bool,
    ) -> anyhow::Result<(Option<ExitStatus>, Usage)> {
        self.interrupt()?;
        let name = self.name.clone();
        let (status, usage) = self.wait_or_kill(timeout)?;
        if status.is_none() {
            if ours {
                bail!("{name} did not exit within {timeout:?} of SIGINT; killed it");
            }
            eprintln!(
                "bench: {name} did not exit within {timeout:?} of SIGINT; killed it \
                 (what it measured stands; what it prints at exit is lost)"
            );
        }
        Ok((status, usage))
    }

    /// Waits up to `timeout` for the process to exit; kills it after that.
    /// Returns its exit status and the last usage seen while it lived.
    pub fn wait(self, timeout: Duration) -> anyhow::Result<(ExitStatus, Usage)> {
        let name = self.name.clone();
        match self.wait_or_kill(timeout)? {
            (Some(status), usage) => Ok((status, usage)),
            (None, _) => bail!("{name} did not exit within {timeout:?}; killed it"),
        }
    }

    /// Like `wait`, but a process still running after `timeout` is killed
    /// and reported as `None` with the usage seen until then, not as an
    /// error.
    pub fn wait_or_kill(
        mut self,
        timeout: Duration,
    ) -> anyhow::Result<(Option<ExitStatus>, Usage)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited()? {
                let usage = self.finish_watch();
                self.child = None;
                return Ok((Some(status), usage));
            }
            if Instant::now() >= deadline {
                if let Some(mut child) = self.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Ok((None, self.finish_watch()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish_watch(&mut self) -> Usage {
        let polled = match self.watch.take() {
            Some(watch) => watch.stop(),
            None => Usage::default(),
        };
        match self.reaped {
            Some((_, whole_life)) => Usage {
                cpu_seconds: polled.cpu_seconds.max(whole_life.cpu_seconds),
                // Above the bench's own peak, ru_maxrss is the child's;
                // at or below it, it may be the bench's (see
                // `spawner_peak_rss_bytes`), and the polls stand alone.
                peak_rss_bytes: if whole_life.peak_rss_bytes > self.spawner_peak_rss_bytes {
                    polled.peak_rss_bytes.max(whole_life.peak_rss_bytes)
                } else {
                    polled.peak_rss_bytes
                },
            },
            None => polled,
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        // A reaped child's pid may belong to another process by now.
        if self.reaped.is_some() {
            self.child = None;
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.finish_watch();
    }
}

/// CPU time (user + system, all threads) and peak resident memory.
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
}

/// Polls /proc/PID every 50 ms, for figures while a process lives. VmHWM
/// is the kernel's own high-water mark, so a poll misses no peak before
/// it; the peak and CPU time after the last poll come from wait4 when the
/// process is reaped (`Managed::exited`).
struct Watch {
    latest: Arc<Mutex<Usage>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    fn start(pid: u32) -> Self {
        let latest = Arc::new(Mutex::new(read_usage(pid).unwrap_or_default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (latest, stop) = (latest.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match read_usage(pid) {
                        Some(usage) => {
                            let mut l = latest.lock().expect("usage lock");
                            l.cpu_seconds = l.cpu_seconds.max(usage.cpu_seconds);
                            l.peak_rss_bytes = l.peak_rss_bytes.max(usage.peak_rss_bytes);
                        }
                        None => break,
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Self {
            latest,
            stop,
            thread: Some(thread),
        }
    }

    fn latest(&self) -> Usage {
        *self.latest.lock().expect("usage lock")
    }

    fn stop(mut self) -> Usage {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.latest()
    }
}

/// CPU seconds and VmHWM of a live process; None once it is gone or a
/// zombie (whose memory numbers have been released).
pub fn read_usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state is the first,
    // utime and stime the 12th and 13th (fields 14 and 15 of proc(5)).
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if matches!(rest.first(), Some(&"Z" | &"X")) {
        return None;
    }
    let ticks: u64 = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    let hwm_kib = status_kib(pid, "VmHWM:")?;
    Some(Usage {
        cpu_seconds: ticks as f64 / clock_ticks_per_second(),
        peak_rss_bytes: hwm_kib * 1024,
    })
}

/// CPU seconds of a live process's threads, to the nanosecond: the sum of
/// the first field (time on a CPU) of each `/proc/PID/task/TID/schedstat`.
/// For windows of a few seconds, where the clock ticks of `/proc/PID/stat`
/// (10 ms) are too coarse for a cost near 1% of a core. Threads that ended
/// are not in it: use it for differences over a window, not whole runs.
pub fn thread_cpu_seconds(pid: u32) -> Option<f64> {
    let mut ns: u64 = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = entry.ok()?.path().join("schedstat");
        let Ok(text) = std::fs::read_to_string(path) else {
            continue; // the thread ended meanwhile
        };
        ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

/// The resident set size of a live process right now, in bytes: VmRSS
/// and its anonymous part, RssAnon (heap, stacks: not page cache of mapped
/// files, which the kernel can reclaim).
pub fn read_rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let rss = status_kib(pid, "VmRSS:")?;
    let anon = status_kib(pid, "RssAnon:")?;
    Some((rss * 1024, anon * 1024))
}

/// A `kB` field of /proc/PID/status, e.g. `VmHWM:`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        crate::shell::output(Command::new("getconf").arg("CLK_TCK"))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Polls `ready` every 50 ms until it is true, the process exits, or
/// `timeout` passes; the error quotes the end of the process's log.
pub fn wait_until(
    process: &mut Managed,
    log: &Path,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(status) = process.exited()? {
            bail!(
                "{} exited ({status}) before it was ready:\n{}",
                process.name,
                log_tail(log)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} was not ready within {timeout:?}:\n{}",
                process.name,
                log_tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last lines of a log file, for error messages.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

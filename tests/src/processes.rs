//! Programs the tests start and stop: fixtures, gated fixtures, tracers
//! in the background.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// A started fixture, killed when dropped.
pub struct Running {
    child: Child,
}

impl Running {
    pub fn start(program: &Path, args: &[&str]) -> Running {
        Running::start_in(Path::new("."), program, args)
    }

    /// Starts `program` in `dir`, for programs that write files into their
    /// working directory (V8 writes its isolate logs there).
    pub fn start_in(dir: &Path, program: &Path, args: &[&str]) -> Running {
        let child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        // Give it time to get past the loader and into its hot loop.
        std::thread::sleep(Duration::from_millis(200));
        let mut child = child;
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{} {args:?} exited at once ({status})", program.display());
        }
        Running { child }
    }

    /// Starts a command as given (arguments, environment), output
    /// discarded.
    pub fn spawn(mut command: Command) -> Running {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        Running { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fixture that waits for a line on stdin before working and another
/// before exiting (the latency fixture's `wait` mode, the Python script of
/// the latency tests), so a tracer can attach first and read it after.
pub struct Gated {
    child: Child,
}

impl Gated {
    pub fn start(program: &Path, args: &[&str]) -> Gated {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        Gated { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it run; returns its first line of output (written when the
    /// work is done).
    pub fn run_to_gate(&mut self) -> String {
        use std::io::{BufRead, BufReader, Write};
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
        let stdout = self.child.stdout.as_mut().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    }

    /// Lets it exit; returns its exit status.
    pub fn finish(mut self) -> std::process::ExitStatus {
        use std::io::Write;
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
        }
        drop(self.child.stdin.take());
        self.child.wait().unwrap()
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tracer (the agent, bpftrace) running in the background, its output
/// collected as it comes.
pub struct Background {
    name: String,
    child: Child,
    stdout: std::sync::Arc<Mutex<String>>,
    stderr: std::sync::Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// What a [`Background`] tracer printed.
#[derive(Debug)]
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Background {
    pub fn start(program: &Path, args: &[&str]) -> Background {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} {args:?}: {e}", program.display()));
        let stdout = std::sync::Arc::new(Mutex::new(String::new()));
        let stderr = std::sync::Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pipes: [(Box<dyn std::io::Read + Send>, _); 2] = [
            (Box::new(child.stdout.take().unwrap()), stdout.clone()),
            (Box::new(child.stderr.take().unwrap()), stderr.clone()),
        ];
        for (mut pipe, sink) in pipes {
            readers.push(std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            }));
        }
        Background {
            name: format!("{} {}", program.display(), args.join(" ")),
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Waits until stdout or stderr contains `text`; fails the test with
    /// everything printed so far if the tracer exits or 30 s pass first.
    pub fn wait_for(&mut self, text: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if self.stdout.lock().unwrap().contains(text)
                || self.stderr.lock().unwrap().contains(text)
            {
                return;
            }
            let exited = self.child.try_wait().unwrap();
            if exited.is_some() || std::time::Instant::now() > deadline {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "{} did not print {text:?} ({}): stdout {:?} stderr {:?}",
                    self.name,
                    match exited {
                        Some(status) => format!("exited: {status}"),
                        None => "timed out".to_string(),
                    },
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for it to exit by itself (killed after that,
    /// failing the test) and collects the output.
    pub fn wait_exit(mut self, timeout: Duration) -> Finished {
        let deadline = std::time::Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {timeout:?}: stderr {:?}",
                    self.name,
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.finished(status)
    }

    /// What the program printed, once it has exited with `status`.
    fn finished(&mut self, status: std::process::ExitStatus) -> Finished {
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        Finished {
            status,
            stdout,
            stderr,
        }
    }

    /// Sends SIGINT (Ctrl-C) and collects the output. The signal is sent
    /// again every 2 s while the program runs: bpftrace once caught one
    /// and slept on in epoll_wait for 18 minutes (the signal landed before
    /// it went to sleep, it seems); a second one ended it at once. After
    /// 60 s it is killed and the test fails.
    pub fn interrupt(mut self) -> Finished {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            let sent = Command::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .status()
                .expect("running kill");
            let waited = std::time::Instant::now() + Duration::from_secs(2);
            while std::time::Instant::now() < waited {
                if self.child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(sent.success(), "kill -INT {} failed", self.child.id());
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within 60 s of SIGINT: stderr {:?}",
                    self.name,
                    self.stderr.lock().unwrap()
                );
            }
        };
        self.finished(status)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The u16 at file offset `file_offset` of `binary` in process `pid`
/// (a USDT semaphore), read through /proc/PID/mem.
pub fn read_mapped_u16(pid: u32, binary: &Path, file_offset: u64) -> u16 {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let canonical = std::fs::canonicalize(binary).unwrap();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || Path::new(fields[5]) != canonical {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let offset = u64::from_str_radix(fields[2], 16).unwrap();
        if offset <= file_offset && file_offset < offset + (end - start) {
            let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
            let mut bytes = [0u8; 2];
            mem.read_exact_at(&mut bytes, start + file_offset - offset)
                .unwrap();
            return u16::from_ne_bytes(bytes);
        }
    }
    panic!(
        "pid {pid} maps no page of {} at file offset {file_offset:#x}",
        binary.display()
    );
}

// ---------------------------------------------------------------------------
// Continuous agent (`profiler-agent run`) helpers.

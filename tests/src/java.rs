//! JVMs for the Java tests: Debian's OpenJDK 17 on the host, and 21 and
//! 25 from Debian trixie in a root of their own (`cargo xtask setup
//! --tests`), run there with `chroot` as a container would run them; the
//! fixture (tests/fixtures/java) built for them; and the JVM's own JFR
//! samples of a run, read with the host's `jfr`.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::agent::workspace_root;
use crate::go::go_toolchain_root;

/// A JDK the tests run.
#[derive(Debug, Clone)]
pub struct Jdk {
    /// "17", "21", "25".
    pub version: &'static str,
    /// The root it runs in (None: the host's).
    pub root: Option<PathBuf>,
    /// Its `java`, as seen inside its root.
    pub java: PathBuf,
}

/// Every JDK the setup provides.
pub fn jdks() -> Vec<Jdk> {
    let root = go_toolchain_root().join("jdk/trixie/root");
    let arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    };
    let mut jdks = vec![Jdk {
        version: "17",
        root: None,
        java: PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64/bin/java"),
    }];
    for version in ["21", "25"] {
        jdks.push(Jdk {
            version,
            root: Some(root.clone()),
            java: PathBuf::from(format!(
                "/usr/lib/jvm/java-{version}-openjdk-{arch}/bin/java"
            )),
        });
    }
    for jdk in &jdks {
        let path = jdk.host_path(&jdk.java);
        assert!(
            path.exists(),
            "JDK {} missing at {}: run `cargo xtask setup --tests`",
            jdk.version,
            path.display()
        );
    }
    jdks
}

impl Jdk {
    /// Where a path inside the JDK's root is on the host.
    pub fn host_path(&self, inside: &Path) -> PathBuf {
        match &self.root {
            Some(root) => root.join(inside.strip_prefix("/").unwrap_or(inside)),
            None => inside.to_path_buf(),
        }
    }

    /// A scratch directory inside the root: (path inside, path on host).
    pub fn scratch(&self, name: &str) -> (PathBuf, PathBuf) {
        let inside = PathBuf::from(format!("/tmp/java-tests-{}-{name}", std::process::id()));
        let host = self.host_path(&inside);
        let _ = std::fs::remove_dir_all(&host);
        std::fs::create_dir_all(&host).unwrap();
        (inside, host)
    }

    /// Starts `java ARGS` (in its root, /proc bound into it); its stdout is
    /// piped.
    pub fn start(&self, args: &[String]) -> Child {
        let mut command = match &self.root {
            Some(root) => {
                mount_proc(root);
                let mut command = Command::new("chroot");
                command.arg(root).arg(&self.java);
                command
            }
            None => Command::new(&self.java),
        };
        command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting JDK {}: {e}", self.version))
    }
}

/// Binds /proc into a root once (the launcher finds its libraries through
/// /proc/self/exe).
fn mount_proc(root: &Path) {
    let proc_dir = root.join("proc");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let target = proc_dir.display().to_string();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&target))
    {
        return;
    }
    let status = Command::new("mount")
        .args(["--bind", "/proc"])
        .arg(&proc_dir)
        .status()
        .expect("running mount");
    assert!(status.success(), "mount --bind /proc {target} failed");
}

/// The fixture built into `dir` (a host path): Main's classes, Plugin's in
/// `plugins/`, and `libnative.so`.
pub fn build_fixture(dir: &Path) {
    let source = workspace_root().join("tests/fixtures/java");
    let javac = |out: &Path, file: &str| {
        let status = Command::new("javac")
            .args(["--release", "17", "-d"])
            .arg(out)
            .arg(source.join(file))
            .status()
            .expect("running javac (Debian's openjdk-17-jdk-headless)");
        assert!(status.success(), "javac {file} failed");
    };
    javac(dir, "Main.java");
    javac(&dir.join("plugins"), "Plugin.java");
    let include = Path::new("/usr/lib/jvm/java-17-openjdk-amd64/include");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-shared", "-fPIC"])
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(include.join("linux"))
        .arg("-o")
        .arg(dir.join("libnative.so"))
        .arg(source.join("native.c"))
        .status()
        .expect("running gcc");
    assert!(status.success(), "building libnative.so failed");
}

/// Reads the child's stdout until its "ready PID" line; returns the pid.
pub fn wait_ready(child: &mut Child) -> u32 {
    let stdout = child.stdout.take().expect("stdout piped");
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap_or_default();
        if let Some(pid) = line.strip_prefix("ready ") {
            // Keep reading in the background so the JVM never blocks.
            std::thread::spawn(move || for _ in lines {});
            return pid.trim().parse().expect("a pid");
        }
    }
    panic!("the Java fixture ended before it was ready");
}

/// One JFR execution sample.
#[derive(Debug, Clone)]
pub struct JfrSample {
    /// Nanoseconds since the Unix epoch.
    pub time_ns: u128,
    pub thread: String,
    /// (dotted class + "." + method, line), innermost first, hidden
    /// frames (lambda proxies) left out.
    pub frames: Vec<(String, i64)>,
    pub truncated: bool,
}

/// The execution samples of a JFR recording, read with the host's `jfr`,
/// and the methods JFR hides (lambda proxies, `@Hidden` methods such as
/// JDK 21's `Thread.runWith`), which its samples leave out.
pub fn jfr_samples(recording: &Path) -> (Vec<JfrSample>, HashSet<String>) {
    let output = Command::new("jfr")
        .args(["print", "--json", "--events", "jdk.ExecutionSample"])
        .arg(recording)
        .output()
        .expect("running jfr (Debian's openjdk-17-jdk-headless)");
    assert!(
        output.status.success(),
        "jfr print {}: {}",
        recording.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("jfr's JSON");
    let events = json["recording"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let name_of = |method: &serde_json::Value| {
        let class = method["type"]["name"]
            .as_str()
            .unwrap_or("?")
            .replace('/', ".");
        let name = method["name"].as_str().unwrap_or("?");
        format!("{class}.{name}")
    };
    let is_hidden = |method: &serde_json::Value| {
        method["hidden"].as_bool().unwrap_or(false)
            || method["type"]["hidden"].as_bool().unwrap_or(false)
    };
    let mut hidden = HashSet::new();
    let samples = events
        .iter()
        .filter_map(|event| {
            let values = &event["values"];
            let time_ns = parse_time(values["startTime"].as_str()?)?;
            let thread = values["sampledThread"]["javaName"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let trace = &values["stackTrace"];
            let mut frames = Vec::new();
            for frame in trace["frames"].as_array()? {
                let method = &frame["method"];
                if is_hidden(method) {
                    hidden.insert(name_of(method));
                } else {
                    frames.push((name_of(method), frame["lineNumber"].as_i64().unwrap_or(-1)));
                }
            }
            Some(JfrSample {
                time_ns,
                thread,
                frames,
                truncated: trace["truncated"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    (samples, hidden)
}

/// "2026-11-26T12:35:21.474010316Z" → nanoseconds since the epoch.
fn parse_time(text: &str) -> Option<u128> {
    let (date, time) = text.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let seconds = days * 86400 + h * 3600 + min * 60 + s;
    let digits: String = fraction.chars().take(9).collect();
    let nanos: u128 = format!("{digits:0<9}").parse().ok()?;
    Some(seconds as u128 * 1_000_000_000 + nanos)
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Waits for the JVM to exit (it writes its recording then).
pub fn wait_exit(child: &mut Child, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            assert!(status.success(), "the Java fixture failed: {status}");
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the Java fixture did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn jfr_times_parse() {
        assert_eq!(
            super::parse_time("1970-01-02T00:00:01.5Z"),
            Some(86_401_500_000_000)
        );
        assert_eq!(
            super::parse_time("2026-11-26T12:35:21.474010316Z"),
            Some(1_795_696_521_474_010_316)
        );
    }
}

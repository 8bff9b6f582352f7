//! A process's JIT symbol map, `/tmp/perf-PID.map`, found inside the
//! process's own root (a container's `/tmp`, not the node's) under the pid
//! the process has in its own pid namespace, which is the one the runtime
//! writes into the file name.
//!
//! The map is read on the first lookup and again, at most once a second,
//! when a lookup misses and the file has grown (runtimes only append to
//! it). It is written by the profiled process: opened inside its root
//! (a link out of it is refused), regular files only, at most
//! `MAX_PERF_MAP_BYTES`, parsed by `symbolize::perf_map` with bounded
//! entries and names.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::contained::Root;
use crate::perf_map::PerfMap;

/// Largest perf map read (a long-running Node.js service with
/// `--perf-basic-prof` writes tens of MiB); a bigger one is reported and
/// left unread.
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

/// How often a grown map may be re-read.
const REREAD_INTERVAL: Duration = Duration::from_secs(1);

/// The perf map of one process.
#[derive(Debug)]
pub struct JitMap {
    root: Arc<Root>,
    /// The path inside the process's root: `/tmp/perf-NSPID.map`.
    pub path: PathBuf,
    /// For messages: the pid as the agent sees it.
    pid: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    map: Arc<PerfMap>,
    /// Size of the file when last read.
    read_len: Option<u64>,
    checked_at: Option<Instant>,
    /// Why the last read failed, until taken for the report.
    problem: Option<String>,
}

impl JitMap {
    /// The map of the process `pid`, `nspid` in its own namespace, whose
    /// root is `root`.
    pub fn new(root: Arc<Root>, pid: u32, nspid: u32) -> JitMap {
        JitMap {
            root,
            path: PathBuf::from(format!("/tmp/perf-{nspid}.map")),
            pid,
            state: Mutex::default(),
        }
    }

    /// The name the runtime gave the code at `address`, if any.
    pub fn lookup(&self, address: u64) -> Option<String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(name) = state.map.lookup(address) {
            return Some(name.to_string());
        }
        let due = state
            .checked_at
            .is_none_or(|at| at.elapsed() >= REREAD_INTERVAL);
        if !due {
            return None;
        }
        state.checked_at = Some(Instant::now());
        self.reread(&mut state);
        state.map.lookup(address).map(str::to_string)
    }

    /// Entries read so far.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why the map could not be read, once.
    pub fn take_problem(&self) -> Option<String> {
        self.lock().problem.take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reread(&self, state: &mut State) {
        use std::io::Read;
        let shown = format!("perf map {} of pid {}", self.path.display(), self.pid);
        let file = match self.root.open_file(&self.path, MAX_PERF_MAP_BYTES) {
            Ok(file) => file,
            // No map: the runtime does not publish one (the common case).
            Err(e) if e.is_not_found() => return,
            Err(e) => {
                state.problem = Some(format!("{shown}: {e}"));
                return;
            }
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if state.read_len == Some(len) {
            return;
        }
        let mut bytes = Vec::new();
        if let Err(e) = file.take(MAX_PERF_MAP_BYTES).read_to_end(&mut bytes) {
            state.problem = Some(format!("{shown}: {e}"));
            return;
        }
        // A line being written as we read is cut: keep whole lines only,
        // and read the file again when it grows.
        let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let text = String::from_utf8_lossy(&bytes[..whole]);
        state.map = Arc::new(PerfMap::parse(&text));
        state.read_len = Some(whole as u64);
    }
}

/// The innermost pid of a process, from the `NSpid:` line of its
/// `/proc/PID/status` (its pid in its own pid namespace).
pub fn namespace_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_innermost_pid_names_the_map() {
        assert_eq!(
            namespace_pid("Name:\tnode\nPid:\t4242\nNSpid:\t4242\t17\t1\n"),
            Some(1)
        );
        assert_eq!(namespace_pid("Pid:\t10\nNSpid:\t10\n"), Some(10));
        assert_eq!(namespace_pid("Pid:\t10\n"), None);
    }

    #[test]
    fn a_map_is_read_inside_the_root_and_again_when_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        let file = dir.path().join("tmp/perf-7.map");
        std::fs::write(&file, "1000 10 first\n2000 10 half").unwrap();
        let root = Arc::new(Root::open(dir.path()).unwrap());
        let jit = JitMap::new(root, 1234, 7);
        assert_eq!(jit.lookup(0x1004).as_deref(), Some("first"));
        // The line being written is not taken until it is whole.
        assert_eq!(jit.lookup(0x2004), None);
        std::fs::write(&file, "1000 10 first\n2000 10 second\n").unwrap();
        // Re-read at most once a second.
        assert_eq!(jit.lookup(0x2004), None);
        jit.lock().checked_at = None;
        assert_eq!(jit.lookup(0x2004).as_deref(), Some("second"));
        assert_eq!(jit.len(), 2);
        assert!(jit.take_problem().is_none());
    }

    #[test]
    fn links_out_of_the_root_and_oversized_maps_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "1000 10 host_only\n").unwrap();
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret"),
            dir.path().join("tmp/perf-1.map"),
        )
        .unwrap();
        let root = Arc::new(Root::open(dir.path()).unwrap());
        let jit = JitMap::new(root.clone(), 99, 1);
        assert_eq!(jit.lookup(0x1004), None);

        let big = std::fs::File::create(dir.path().join("tmp/perf-2.map")).unwrap();
        big.set_len(MAX_PERF_MAP_BYTES + 1).unwrap();
        let jit = JitMap::new(root, 99, 2);
        assert_eq!(jit.lookup(0x1004), None);
        let problem = jit.take_problem().expect("a problem for the oversized map");
        assert!(problem.contains("/tmp/perf-2.map"), "{problem}");
    }
}

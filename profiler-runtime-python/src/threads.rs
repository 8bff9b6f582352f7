//! The thread states of a CPython process, read from outside: the
//! interpreters linked from `_PyRuntime`, each one's list of thread
//! states, and which kernel thread each belongs to.
//!
//! This is how the BPF walker finds a thread's frames without thread-local
//! storage (whose address depends on the libc, static or shared linking,
//! and the TLS model: what broke other agents on musl and on shared
//! builds): user space maps each thread's id to its `PyThreadState*`.
//! 3.11 on, a thread state records `native_thread_id` (its `gettid()`, in
//! the process's pid namespace, mapped here to the host's); 3.10 records
//! only `thread_id` (`pthread_self()`, which is the thread pointer on
//! x86_64 with glibc and musl), so 3.10 threads are keyed by their thread
//! pointer, which the walker reads from the task.
//!
//! Everything is read from the target's memory: lists are bounded, and a
//! list that loops ends where it meets itself.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::layout::Layout;
use profiler_runtime::memory::Memory;

/// Interpreters followed per process (subinterpreters are rare).
const MAX_INTERPRETERS: usize = 16;
/// Thread states followed per interpreter.
const MAX_THREADS: usize = 4096;

/// One thread state and the key the walker finds it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadState {
    /// The host thread id (3.11 on) or the thread pointer (3.10).
    pub key: u64,
    pub address: u64,
}

/// The thread states of process `memory.pid`, its `_PyRuntime` at
/// `runtime`. `host_tids` maps the process's namespace thread ids to the
/// host's (`namespace_tids`).
pub fn thread_states(
    memory: &impl Memory,
    layout: &Layout,
    runtime: u64,
    host_tids: &HashMap<u32, u32>,
) -> std::io::Result<Vec<ThreadState>> {
    let mut states = Vec::new();
    let mut seen_interpreters = HashSet::new();
    let mut interpreter = memory.u64(runtime.wrapping_add(layout.runtime_interpreters_head))?;
    while interpreter != 0
        && seen_interpreters.len() < MAX_INTERPRETERS
        && seen_interpreters.insert(interpreter)
    {
        let mut seen = HashSet::new();
        let mut thread = memory.u64(interpreter.wrapping_add(layout.interpreter_threads_head))?;
        while thread != 0 && seen.len() < MAX_THREADS && seen.insert(thread) {
            let key = match layout.thread_native_id {
                Some(offset) => {
                    let id = memory.u64(thread.wrapping_add(offset))?;
                    u32::try_from(id)
                        .ok()
                        .and_then(|id| host_tids.get(&id).copied())
                        .map(u64::from)
                }
                None => Some(memory.u64(thread.wrapping_add(layout.thread_id))?),
            };
            if let Some(key) = key.filter(|&k| k != 0) {
                states.push(ThreadState {
                    key,
                    address: thread,
                });
            }
            thread = memory.u64(thread.wrapping_add(layout.thread_next))?;
        }
        interpreter = memory.u64(interpreter.wrapping_add(layout.interpreter_next))?;
    }
    Ok(states)
}

/// The process's threads: namespace thread id → host thread id, from
/// `NSpid` in each task's status (the innermost namespace's id is last;
/// outside containers both are the same).
pub fn namespace_tids(proc_root: &Path, pid: u32) -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
        return map;
    };
    for task in tasks.flatten() {
        let Some(host) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let inner = std::fs::read_to_string(task.path().join("status"))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|ids| ids.split_whitespace().last()?.parse::<u32>().ok())
            })
            .unwrap_or(host);
        map.insert(inner, host);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_maps_its_own_threads() {
        let pid = std::process::id();
        let tids = namespace_tids(Path::new("/proc"), pid);
        assert_eq!(tids.get(&pid), Some(&pid));
    }
}

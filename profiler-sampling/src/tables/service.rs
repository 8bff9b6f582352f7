//! The table loader's thread: builds and loads unwind tables off the
//! sampling path, so parsing a 200 MB binary's CFI never delays the drain
//! of samples or the symbolization of a window.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::store::{TableMapping, TableStore, UnwindOccupancy, UnwindTableStats};
use profiler_symbolize::process::{ObjectId, Process};

enum Command {
    Register(u32, Vec<TableMapping>),
    Unregister(u32),
    Sampled(Vec<u32>),
    Retain(HashSet<ObjectId>),
    Flush(mpsc::Sender<()>),
}

#[derive(Default)]
struct Shared {
    stats: UnwindTableStats,
    occupancy: UnwindOccupancy,
}

/// A handle on the loader thread. Dropping it ends the thread (the BPF
/// arrays it holds are released with it).
pub struct UnwindTables {
    sender: Option<mpsc::Sender<Command>>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl UnwindTables {
    pub fn spawn(store: TableStore) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<Command>();
        let shared = Arc::new(Mutex::new(Shared {
            stats: store.stats.clone(),
            occupancy: store.occupancy(),
        }));
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || run(store, receiver, thread_shared))?;
        Ok(UnwindTables {
            sender: Some(sender),
            shared,
            thread: Some(thread),
        })
    }

    fn send(&self, command: Command) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(command);
        }
    }

    /// Loads the tables of `process`'s mappings and registers it with the
    /// walker (again, after its maps were re-read). Returns at once.
    pub fn register(&self, process: &Process) {
        self.send(Command::Register(process.pid, table_mappings(process)));
    }

    /// Stops using tables for `pid` (it exited).
    pub fn unregister(&self, pid: u32) {
        self.send(Command::Unregister(pid));
    }

    /// These processes were sampled: their tables are the last evicted.
    pub fn sampled(&self, pids: Vec<u32>) {
        if !pids.is_empty() {
            self.send(Command::Sampled(pids));
        }
    }

    /// Frees the tables of objects not in `keep` (no live process maps them).
    pub fn retain_objects(&self, keep: HashSet<ObjectId>) {
        self.send(Command::Retain(keep));
    }

    /// Waits until every command sent so far is done.
    pub fn flush(&self) {
        let (done, wait) = mpsc::channel();
        self.send(Command::Flush(done));
        let _ = wait.recv();
    }

    pub fn stats(&self) -> UnwindTableStats {
        self.shared
            .lock()
            .map(|s| s.stats.clone())
            .unwrap_or_default()
    }

    pub fn occupancy(&self) -> UnwindOccupancy {
        self.shared.lock().map(|s| s.occupancy).unwrap_or_default()
    }
}

impl Drop for UnwindTables {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The mappings of `process` that may have a table.
pub fn table_mappings(process: &Process) -> Vec<TableMapping> {
    process
        .mappings
        .iter()
        .filter_map(|m| {
            let object = match (&m.object, m.name.as_str()) {
                (Some(file), _) => super::store::TableObject::File(file.clone()),
                (None, "[vdso]") => super::store::TableObject::Vdso,
                // [vsyscall] lies outside the user address space.
                (None, "[vsyscall]") => return None,
                (None, _) => super::store::TableObject::Anonymous,
            };
            Some(TableMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                object,
            })
        })
        .collect()
}

fn run(mut store: TableStore, commands: mpsc::Receiver<Command>, shared: Arc<Mutex<Shared>>) {
    while let Ok(command) = commands.recv() {
        match command {
            Command::Register(pid, mappings) => {
                store.register(pid, &mappings);
            }
            Command::Unregister(pid) => store.unregister(pid),
            Command::Sampled(pids) => store.sampled(&pids),
            Command::Retain(keep) => {
                store.retain_objects(&keep);
            }
            Command::Flush(done) => {
                publish(&store, &shared);
                let _ = done.send(());
                continue;
            }
        }
        publish(&store, &shared);
    }
}

fn publish(store: &TableStore, shared: &Mutex<Shared>) {
    if let Ok(mut shared) = shared.lock() {
        shared.stats = store.stats.clone();
        shared.occupancy = store.occupancy();
    }
}

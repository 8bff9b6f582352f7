//! The BPF object's globals the runtimes set before it is loaded: which
//! runtimes' walkers are in the chain (`ENABLED_RUNTIMES`), where the
//! kernel keeps a task's thread pointer (Go's g lives at an offset from it
//! on amd64; 3.10 CPython's threads are known by it), and each runtime's
//! own (`Runtime::globals`). Read-only globals: the verifier sees them as
//! constants and drops the paths that are off.

use aya::EbpfLoader;

use profiler_bpf::btf::KernelBtf;

use crate::{Runtime, Selection};

const GLOBAL_ENABLED_RUNTIMES: &str = "ENABLED_RUNTIMES";
const GLOBAL_TASK_THREAD_POINTER_OFFSET: &str = "TASK_THREAD_POINTER_OFFSET";
const GLOBAL_FRAME_POINTERS_ONLY: &str = "FRAME_POINTERS_ONLY";

/// Values the loader writes into the object (they must outlive the
/// loader, which borrows them).
#[derive(Debug, Default)]
pub struct Globals {
    values: Vec<(&'static str, Vec<u8>)>,
}

impl Globals {
    /// The globals of `list`'s runtimes, those `selection` switches on
    /// (those needing unwind tables only with `tables`).
    pub fn for_runtimes(
        list: &[&'static dyn Runtime],
        selection: &Selection,
        tables: bool,
    ) -> Globals {
        let mut globals = Globals::default();
        let thread_pointer = match thread_pointer_offset() {
            Ok(offset) => offset,
            Err(why) => {
                // The g register still finds goroutines in Go code; only
                // samples in C code and system calls go unlabelled, and
                // 3.10 CPython's frames stay native.
                tracing::info!("no thread pointer for the runtimes: {why}");
                0
            }
        };
        globals.set(
            GLOBAL_TASK_THREAD_POINTER_OFFSET,
            &thread_pointer.to_le_bytes(),
        );
        let mut enabled = 0u32;
        for &runtime in list {
            let on = crate::on(runtime, selection, tables);
            if on && runtime.walker().is_some() {
                enabled |= 1 << runtime.id();
            }
            runtime.globals(on, &mut globals);
        }
        globals.set(GLOBAL_ENABLED_RUNTIMES, &enabled.to_le_bytes());
        // Without unwind tables, the walk follows frame records alone.
        globals.set(GLOBAL_FRAME_POINTERS_ONLY, &[u8::from(!tables)]);
        globals
    }

    /// Sets global `name` to `bytes` (its size).
    pub fn set(&mut self, name: &'static str, bytes: &[u8]) {
        self.values.retain(|(n, _)| *n != name);
        self.values.push((name, bytes.to_vec()));
    }

    pub fn apply<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        for (name, bytes) in &self.values {
            loader.override_global(name, bytes.as_slice(), true);
        }
    }
}

/// Offset of `task_struct.thread.fsbase` (x86_64) in the running kernel,
/// from its BTF. Other architectures: arm64 Go keeps g in TLS only in cgo
/// programs, and at an offset the runtime chooses at start-up; the g
/// register (X28) is used there.
fn thread_pointer_offset() -> Result<u32, String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("the g register is used on this architecture".into());
    }
    let btf = KernelBtf::load().map_err(|e| e.to_string())?;
    let in_task = btf
        .member_offset("task_struct", "thread")
        .map_err(|e| e.to_string())?;
    let in_thread = btf
        .member_offset("thread_struct", "fsbase")
        .map_err(|e| e.to_string())?;
    Ok(in_task + in_thread)
}

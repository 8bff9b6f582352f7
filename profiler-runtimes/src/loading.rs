//! The sampling program's globals the runtimes set: whether Go labels are
//! read (a read-only global, so the verifier drops the path when off), and
//! where the kernel keeps a task's thread pointer (Go's g lives at an
//! offset from it on amd64; 3.10 CPython's threads are known by it).

use aya::EbpfLoader;

use profiler_bpf::btf::KernelBtf;

/// Globals of the sampling program (profiler-ebpf/src/runtimes/go/labels.rs
/// and machine.rs).
const GLOBAL_GO_LABELS: &str = "GO_LABELS";
const GLOBAL_TASK_THREAD_POINTER_OFFSET: &str = "TASK_THREAD_POINTER_OFFSET";

/// The values the loader writes (they must outlive the loader).
pub struct Globals {
    enabled: u8,
    thread_pointer: u32,
}

impl Globals {
    pub fn new(go_labels: bool) -> Globals {
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
        let enabled = go_labels;
        Globals {
            enabled: u8::from(enabled),
            thread_pointer,
        }
    }

    pub fn apply<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        loader
            .override_global(GLOBAL_GO_LABELS, &self.enabled, true)
            .override_global(
                GLOBAL_TASK_THREAD_POINTER_OFFSET,
                &self.thread_pointer,
                true,
            );
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

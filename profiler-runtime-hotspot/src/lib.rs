//! HotSpot (OpenJDK's JVM): Java frames in every stack of a Java process,
//! interleaved with the native frames (JNI code, the JVM's C++), read
//! from outside: no JVM flag, agent or restart. The BPF side is
//! `profiler-ebpf/src/runtimes/hotspot.rs`, the types both sides share
//! `profiler-common/src/runtimes/hotspot.rs`; [`HOTSPOT`] is the runtime
//! as the products see it (`profiler_runtime::Runtime`).
//!
//! - [`vmstructs`]: the JVM's own description of its structures
//!   (`gHotSpotVMStructs` and friends), read from the process;
//! - [`layout`]: the offsets the walker and the symbolizer use, and the
//!   code cache's heaps and the interpreter, from those tables;
//! - [`registry`]: the thread that tells the BPF walker about each JVM;
//! - [`code`] and [`stream`]: naming frames: methods, files and lines,
//!   with the methods compiled code inlined.
//!
//! What is known of HotSpot's structures, and how each fact was checked,
//! is in docs/design/hotspot-layouts.md.

pub mod code;
pub mod layout;
pub mod registry;
pub mod stream;
pub mod vmstructs;

use aya::Ebpf;
use profiler_common::runtimes::RUNTIME_HOTSPOT;
use profiler_common::runtimes::hotspot::{
    JVM_ADDRESS_MASK, JVM_CUT_NO_BLOB, JVM_CUT_NO_CALLER, JVM_EXACT, JVM_KIND_COMPILED,
    JVM_KIND_INTERPRETED, JVM_KIND_MASK, JVM_KIND_SHIFT,
};
use profiler_symbolize::{Frame, NameSource};

use code::{JvmCode, Target};
use profiler_runtime::cache::Cache;
use profiler_runtime::memory::ProcessMemory;
use profiler_runtime::{Registry, Runtime, RuntimeError, Shared};
use registry::{JvmInstance, JvmRegistry};

/// HotSpot, as the products see it.
pub struct HotSpot;

/// JVMs and where they keep what the walker reads.
const JVM_PROCESSES: profiler_runtime::ProcessMap<profiler_common::runtimes::hotspot::JvmProcess> =
    profiler_runtime::ProcessMap::new("JVM_PROCESSES");

/// The one instance the runtime list names.
pub static HOTSPOT: HotSpot = HotSpot;

impl Runtime for HotSpot {
    fn name(&self) -> &'static str {
        "hotspot"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["java", "jvm"]
    }

    fn about(&self) -> &'static str {
        "Java methods, interpreted, compiled and inlined, with their files and lines (OpenJDK 17 to 25)"
    }

    fn id(&self) -> u8 {
        RUNTIME_HOTSPOT
    }

    fn maps(&self) -> &'static [&'static str] {
        &["JVM_PROCESSES", "JVM_WALK"]
    }

    fn frame_type(&self) -> &'static str {
        "jvm"
    }

    fn walker(&self) -> Option<&'static str> {
        Some("walk_hotspot")
    }

    /// The native frames between Java frames need them.
    fn needs_tables(&self) -> bool {
        true
    }

    fn start(&self, ebpf: &mut Ebpf, shared: &Shared) -> Result<Box<dyn Registry>, RuntimeError> {
        let registry = JvmRegistry::spawn(JVM_PROCESSES.take(ebpf)?, shared.regions.clone())
            .map_err(|e| RuntimeError::Thread("jvm", e))?;
        Ok(Box::new(registry))
    }
}

/// Java frames of a run's stacks, named per process, within the runtime
/// caches' budget (`profiler_runtime::cache`).
pub struct JvmFrames {
    code: JvmCode,
    /// Compiled frames as named, by their words (which hold the blob's
    /// compile id: a freed and reused blob has other words). Interpreted
    /// frames are not kept: their method is checked again each time.
    compiled: Cache<(u64, u64), Vec<Frame>>,
}

impl Default for JvmFrames {
    fn default() -> Self {
        JvmFrames {
            code: JvmCode::default(),
            compiled: Cache::new("hotspot", "frames", 10),
        }
    }
}

impl JvmFrames {
    /// The frames of a Java frame's two words (a compiled one may hold
    /// several: the methods inlined at its PC, innermost first).
    pub fn frames(&mut self, jvm: Option<&JvmInstance>, payload: u64, second: u64) -> Vec<Frame> {
        let kind = (payload & JVM_KIND_MASK) >> JVM_KIND_SHIFT;
        let exact = payload & JVM_EXACT != 0;
        let address = payload & JVM_ADDRESS_MASK;
        if kind != JVM_KIND_INTERPRETED && kind != JVM_KIND_COMPILED {
            return vec![named(match second {
                JVM_CUT_NO_BLOB => "[java: code not found, frames cut]",
                JVM_CUT_NO_CALLER => "[java: caller not found, frames cut]",
                _ => "[java: frame unreadable, frames cut]",
            })];
        }
        let Some(jvm) = jvm else {
            return vec![named("[java] (process not registered)")];
        };
        if kind == JVM_KIND_COMPILED
            && let Some(frames) = self.compiled.get(jvm.pid, &(payload, second))
        {
            return frames;
        }
        let target = Target {
            pid: jvm.pid,
            layout: &jvm.layout,
        };
        let memory = ProcessMemory::new(jvm.pid);
        if kind == JVM_KIND_INTERPRETED {
            self.code.interpreted(target, &memory, address, second)
        } else {
            let frames = self.code.compiled(
                target,
                &memory,
                address,
                (second >> 32) as u32,
                second as u32,
                exact,
            );
            self.compiled
                .insert(jvm.pid, (payload, second), frames.clone());
            frames
        }
    }

    /// Forgets the processes `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.code.retain(&keep);
        self.compiled.retain_processes(&keep);
    }
}

fn named(text: &str) -> Frame {
    Frame::named(text.to_string()).from_source(NameSource::Runtime("jvm"))
}

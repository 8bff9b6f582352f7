//! The objects a process maps, as the runtimes' registries see them: an
//! executable mapping with its object file, and how an object's virtual
//! addresses become the process's.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use object::{Object, ObjectSegment};
use profiler_symbolize::process::{ObjectFile, ObjectId, Process};

/// The objects a registry's thread has read and found not to hold its
/// runtime, shared with the sampling thread. A process that maps only
/// such objects (most of a node's) is not sent to the thread at all:
/// with a thousand processes first seen, waking the registries' threads
/// to find nothing was a tenth of the agent's time.
#[derive(Clone, Default)]
pub struct NotRuntime(Arc<RwLock<HashSet<ObjectId>>>);

impl NotRuntime {
    pub fn insert(&self, id: ObjectId) {
        if let Ok(mut set) = self.0.write() {
            set.insert(id);
        }
    }

    /// Forgets the objects not in `keep` (no live process maps them), so
    /// that a long run's set follows the live objects.
    pub fn retain(&self, keep: &HashSet<ObjectId>) {
        if let Ok(mut set) = self.0.write() {
            set.retain(|id| keep.contains(id));
        }
    }

    /// True when every object `process` maps is known not to hold the
    /// runtime: registering it would find nothing. A new object (a
    /// `dlopen`ed libpython) makes it false until the thread has read it.
    pub fn covers(&self, process: &Process) -> bool {
        let Ok(set) = self.0.read() else {
            return false;
        };
        process
            .mappings
            .iter()
            .filter_map(|m| m.object.as_ref())
            .all(|object| set.contains(&object.id))
    }
}

/// An executable mapping of an object.
#[derive(Clone)]
pub struct ObjectMapping {
    pub start: u64,
    pub offset: u64,
    pub object: Arc<ObjectFile>,
}

/// A process's mappings that have an object file.
pub fn mappings_of(process: &Process) -> Vec<ObjectMapping> {
    process
        .mappings
        .iter()
        .filter_map(|m| {
            Some(ObjectMapping {
                start: m.start,
                offset: m.offset,
                object: m.object.clone()?,
            })
        })
        .collect()
}

/// An object's `PT_LOAD` segments: (virtual address, file offset, file
/// size).
pub fn segments_of(file: &object::File<'_>) -> Vec<(u64, u64, u64)> {
    file.segments()
        .map(|s| {
            let (offset, size) = s.file_range();
            (s.address(), offset, size)
        })
        .collect()
}

/// The difference between the object's virtual addresses and the
/// process's, from one of its mappings.
pub fn load_bias(segments: &[(u64, u64, u64)], mapping: &ObjectMapping) -> Option<u64> {
    let (address, offset, _) = segments
        .iter()
        .copied()
        .find(|&(_, offset, size)| offset <= mapping.offset && mapping.offset < offset + size)?;
    let virtual_start = address.wrapping_add(mapping.offset - offset);
    Some(mapping.start.wrapping_sub(virtual_start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_symbolize::process::Mapping;

    fn mapping(start: u64, object: Option<Arc<ObjectFile>>) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            offset: 0,
            name: "x".into(),
            path: object.as_ref().map(|o| o.path.clone()),
            object,
        }
    }

    /// A process is left out only when every object it maps was read and
    /// found not to hold the runtime: one object not read yet (a library
    /// loaded since) sends it to the thread. Anonymous code has no object
    /// to read and does not count.
    #[test]
    fn a_process_is_left_out_only_when_all_its_objects_are_known() {
        let dir = tempfile::tempdir().unwrap();
        let object = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, name).unwrap();
            Arc::new(ObjectFile::open_path(&path).unwrap())
        };
        let (exe, libc, libpython) = (object("exe"), object("libc"), object("libpython"));
        let not_runtime = NotRuntime::default();
        let process = |objects: &[&Arc<ObjectFile>]| {
            let mut mappings: Vec<Mapping> = objects
                .iter()
                .enumerate()
                .map(|(i, o)| mapping(0x10000 * (i as u64 + 1), Some(Arc::clone(o))))
                .collect();
            mappings.push(mapping(0x7000_0000, None));
            Process::new(1, "app", mappings)
        };
        let native = process(&[&exe, &libc]);
        assert!(!not_runtime.covers(&native), "nothing read yet");
        not_runtime.insert(exe.id);
        assert!(!not_runtime.covers(&native), "libc not read yet");
        not_runtime.insert(libc.id);
        assert!(not_runtime.covers(&native));
        // The same process after a dlopen of an object not read yet.
        assert!(!not_runtime.covers(&process(&[&exe, &libc, &libpython])));
        // The sampling side's copy sees what the thread's copy inserted.
        let thread_side = not_runtime.clone();
        thread_side.insert(libpython.id);
        assert!(not_runtime.covers(&process(&[&exe, &libpython])));
        // Once no live process maps libc, it is forgotten: a new file
        // with its device and inode would be read again.
        not_runtime.retain(&HashSet::from([exe.id, libpython.id]));
        assert!(!not_runtime.covers(&native));
        assert!(not_runtime.covers(&process(&[&exe, &libpython])));
    }
}

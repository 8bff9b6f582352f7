//! The objects a process maps, as the runtimes' registries see them: an
//! executable mapping with its object file, and how an object's virtual
//! addresses become the process's.

use std::sync::Arc;

use object::{Object, ObjectSegment};
use profiler_symbolize::process::{ObjectFile, Process};

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

//! The unwinder's BPF arrays, written through shared mappings.
//!
//! The arrays are created `BPF_F_MMAPABLE`, so an object's rows and pages
//! are copied into kernel memory with a `memcpy`, not one `bpf()` system
//! call per element (libc's 30,000 rows would be 30,000 calls).

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::{Map, MapData};

/// A BPF array of `T` mapped into this process. `T` must be a plain
/// `#[repr(C)]` type whose size is a multiple of 8: the kernel lays array
/// elements out at a stride of their size rounded up to 8.
pub struct MappedArray<T> {
    /// Keeps the map (and so the mapping's backing memory) alive; None for
    /// an array in this process's own memory (tests, table measurements).
    _map: Option<MapData>,
    memory: memmap2::MmapMut,
    len: usize,
    _element: std::marker::PhantomData<T>,
}

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("the BPF object has no map {0}")]
    Missing(&'static str),
    #[error("map {0} is not an array")]
    NotAnArray(&'static str),
    #[error(
        "map {name} has {found}-byte elements, the agent expects {expected} \
         (the BPF object and the agent were built from different sources)"
    )]
    ElementSize {
        name: &'static str,
        found: u32,
        expected: usize,
    },
    #[error("reading the size of BPF array {0}: {1}")]
    Info(&'static str, aya::maps::MapError),
    #[error("mapping BPF array {0} into memory: {1}")]
    Mmap(&'static str, std::io::Error),
}

impl<T: Copy + aya::Pod> MappedArray<T> {
    /// Maps the array `name`, taken out of `ebpf`.
    pub fn take(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<Self, ArrayError> {
        const {
            assert!(
                std::mem::size_of::<T>().is_multiple_of(8),
                "array stride is 8-byte aligned"
            );
        }
        let map = match ebpf.take_map(name).ok_or(ArrayError::Missing(name))? {
            Map::Array(map) => map,
            _ => return Err(ArrayError::NotAnArray(name)),
        };
        let info = map.info().map_err(|e| ArrayError::Info(name, e))?;
        if info.value_size() as usize != std::mem::size_of::<T>() {
            return Err(ArrayError::ElementSize {
                name,
                found: info.value_size(),
                expected: std::mem::size_of::<T>(),
            });
        }
        let len = info.max_entries() as usize;
        let bytes = len * std::mem::size_of::<T>();
        let page = 4096;
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of a BPF_F_MMAPABLE array's memory, of
        // the array's size rounded to pages; the kernel keeps the memory
        // alive while the map (held in `_map`) or the mapping exists.
        let memory = unsafe {
            memmap2::MmapOptions::new()
                .len(bytes.div_ceil(page) * page)
                .map_mut(fd)
        }
        .map_err(|e| ArrayError::Mmap(name, e))?;
        Ok(MappedArray {
            _map: Some(map),
            memory,
            len,
            _element: std::marker::PhantomData,
        })
    }

    /// An array of `len` zeroed elements in this process's memory, laid out
    /// as the kernel's: the table store without a kernel (tests, and
    /// measuring the tables of objects).
    pub fn anonymous(len: usize) -> std::io::Result<Self> {
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        let memory = memmap2::MmapOptions::new().len(bytes).map_anon()?;
        Ok(MappedArray {
            _map: None,
            memory,
            len,
            _element: std::marker::PhantomData,
        })
    }

    /// Elements the array holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The array as a slice.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: the mapping is at least len * size_of::<T>() bytes,
        // page-aligned, and T is plain data (aya::Pod) for which any bytes
        // are valid. The BPF programs only read these arrays.
        unsafe { std::slice::from_raw_parts_mut(self.memory.as_mut_ptr().cast::<T>(), self.len) }
    }

    /// Writes `values` from index `at` on; false if they do not fit.
    pub fn write(&mut self, at: usize, values: &[T]) -> bool {
        let Some(end) = at.checked_add(values.len()).filter(|&end| end <= self.len) else {
            return false;
        };
        self.as_mut_slice()[at..end].copy_from_slice(values);
        true
    }
}

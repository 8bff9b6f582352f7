//! The unwinder's BPF arrays, written through shared mappings.
//!
//! The arrays are created `BPF_F_MMAPABLE`, so an object's rows and pages
//! are copied into kernel memory with a `memcpy`, not one `bpf()` system
//! call per element (libc's 30,000 rows would be 30,000 calls). Only the
//! pages a write touches are mapped, for the write: the kernel maps a
//! BPF array's pages eagerly, so a mapping of the whole array held open
//! would count its tens of MiB in the agent's resident set (they are kernel
//! memory either way, charged to the agent's cgroup once).

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::{Array, IterableMap, Map, MapData};

/// A BPF array of `T`. `T` must be a plain `#[repr(C)]` type whose size is a
/// multiple of 8: the kernel lays array elements out at a stride of their
/// size rounded up to 8.
pub struct MappedArray<T: aya::Pod> {
    storage: Storage<T>,
    len: usize,
    _element: std::marker::PhantomData<T>,
}

enum Storage<T: aya::Pod> {
    /// The kernel's array; mapped a window at a time.
    Kernel(Array<MapData, T>),
    /// This process's memory (tests, and measuring tables without a kernel).
    Memory(memmap2::MmapMut),
}

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("the BPF object has no map {0}")]
    Missing(&'static str),
    #[error("map {0} is not an array")]
    NotAnArray(&'static str),
    #[error("map {0} is not a hash map of the expected key and value")]
    NotAHashMap(&'static str),
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

const PAGE: usize = 4096;

/// Writes of up to this many elements go through `bpf(BPF_MAP_UPDATE_ELEM)`
/// (aya's `Array::set`),
/// one call each, rather than through a mapping. A process's registration
/// writes a few mappings: mapping a window for them and unmapping it took
/// 18-21 and 11 µs, the four or so updates about 2 µs each (1,000 processes, 73
/// registrations in 7 s: 2.1-2.5 ms of those calls before, 0.65-0.7 ms
/// after). A table's rows, thousands at once, stay with the mapping.
const SMALL_WRITE: usize = 32;

impl<T: Copy + aya::Pod> MappedArray<T> {
    /// The array `name`, taken out of `ebpf`. Checks that it can be mapped.
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
        let array = MappedArray {
            storage: Storage::Kernel(
                Array::try_from(Map::Array(map)).map_err(|_| ArrayError::NotAnArray(name))?,
            ),
            len: info.max_entries() as usize,
            _element: std::marker::PhantomData,
        };
        // A first, one-page window: a kernel built without BPF_F_MMAPABLE
        // support fails here, at start, rather than at the first table.
        array
            .window(0, PAGE.min(array.byte_len()))
            .map_err(|e| ArrayError::Mmap(name, e))?;
        Ok(array)
    }

    /// An array of `len` zeroed elements in this process's memory, laid out
    /// as the kernel's.
    pub fn anonymous(len: usize) -> std::io::Result<Self> {
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        let memory = memmap2::MmapOptions::new().len(bytes).map_anon()?;
        Ok(MappedArray {
            storage: Storage::Memory(memory),
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

    fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// A shared mapping of the kernel array's pages covering
    /// `[start, start + len)` bytes; the offset of `start` in it.
    fn window(&self, start: usize, len: usize) -> std::io::Result<(memmap2::MmapMut, usize)> {
        let Storage::Kernel(map) = &self.storage else {
            return Err(std::io::Error::other("not a kernel array"));
        };
        let first = start / PAGE * PAGE;
        let end = (start + len).div_ceil(PAGE) * PAGE;
        let fd = map.map().fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of pages of a BPF_F_MMAPABLE array,
        // inside its size; the kernel keeps the memory alive while the map
        // (held in `storage`) or the mapping exists, and the BPF programs
        // only read it.
        let mapping = unsafe {
            memmap2::MmapOptions::new()
                .offset(first as u64)
                .len(end - first)
                .map_mut(fd)
        }?;
        Ok((mapping, start - first))
    }

    /// Writes `bytes` at byte offset `start`; false if they do not fit or
    /// the mapping failed.
    pub fn write_bytes(&mut self, start: usize, bytes: &[u8]) -> bool {
        if start
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.byte_len())
        {
            return false;
        }
        if bytes.is_empty() {
            return true;
        }
        match &mut self.storage {
            Storage::Memory(memory) => {
                memory[start..start + bytes.len()].copy_from_slice(bytes);
                true
            }
            Storage::Kernel(_) => match self.window(start, bytes.len()) {
                Ok((mut mapping, at)) => {
                    mapping[at..at + bytes.len()].copy_from_slice(bytes);
                    true
                }
                Err(error) => {
                    tracing::debug!(%error, "mapping an unwind array");
                    false
                }
            },
        }
    }

    /// Writes `values` from index `at` on; false if they do not fit.
    pub fn write(&mut self, at: usize, values: &[T]) -> bool {
        let size = std::mem::size_of::<T>();
        // SAFETY: T is plain data (aya::Pod) without padding-sensitive
        // invariants; its bytes are what the kernel array stores.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        let len = self.len;
        if let Storage::Kernel(array) = &mut self.storage
            && values.len() <= SMALL_WRITE
            && at.checked_add(values.len()).is_some_and(|end| end <= len)
        {
            return values.iter().enumerate().all(|(i, value)| {
                array
                    .set((at + i) as u32, value, 0)
                    .map_err(|error| tracing::debug!(%error, "writing an unwind array element"))
                    .is_ok()
            });
        }
        match at.checked_mul(size) {
            Some(start) => self.write_bytes(start, bytes),
            None => false,
        }
    }

    /// Element `index` as the BPF programs read it (tests and tools).
    pub fn get(&self, index: usize) -> Option<T> {
        if index >= self.len {
            return None;
        }
        let size = std::mem::size_of::<T>();
        let read = |bytes: &[u8]| {
            // SAFETY: `bytes` holds size_of::<T>() bytes of a T (any bytes
            // are a valid aya::Pod value).
            unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
        };
        match &self.storage {
            Storage::Memory(memory) => Some(read(&memory[index * size..(index + 1) * size])),
            Storage::Kernel(_) => {
                let (mapping, at) = self.window(index * size, size).ok()?;
                Some(read(&mapping[at..at + size]))
            }
        }
    }
}

//! Bytes of an object file shared without copying them: a range of the
//! memory-mapped file where they come from it, an owned buffer otherwise
//! (an inflated compressed section, bytes that did not come from the map,
//! a test's `Vec`). Clones share the memory; `Deref` is a slice index.
//!
//! The DWARF resolver reads its sections through it, the Go resolver its
//! pclntab and inline trees: tens of megabytes for a large Go binary that
//! stay in the page cache instead of the agent's heap.

use std::borrow::Cow;
use std::ops::{Deref, Range};
use std::sync::Arc;

use object::ObjectSection;

/// Some bytes of a file, cheap to clone.
#[derive(Clone)]
pub enum SharedBytes {
    /// A range of a memory-mapped file.
    Mapped(Arc<memmap2::Mmap>, Range<usize>),
    /// A copy on the heap.
    Owned(Arc<[u8]>),
    /// A buffer made at run time (a compressed section's bytes, kept in
    /// the buffer they were inflated into: copying them into an
    /// `Arc<[u8]>` would hold two copies at once, megabytes of peak heap
    /// for a large debug file).
    Inflated(Arc<Vec<u8>>),
}

/// Where `part` lies in `whole`, if entirely inside it.
fn range_in(whole: &[u8], part: &[u8]) -> Option<Range<usize>> {
    // Addresses only: no pointer into `whole` is formed unless in bounds.
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

impl SharedBytes {
    pub fn empty() -> Self {
        SharedBytes::Owned(Arc::from(&[][..]))
    }

    /// A copy of `bytes` on the heap.
    pub fn copied(bytes: &[u8]) -> Self {
        SharedBytes::Owned(Arc::from(bytes))
    }

    /// `bytes`, borrowed from `map` (e.g. through an `object::File` parsed
    /// over it), as a range of the map; a copy if they lie outside it.
    pub fn within(map: &Arc<memmap2::Mmap>, bytes: &[u8]) -> Self {
        match range_in(map, bytes) {
            Some(range) => SharedBytes::Mapped(map.clone(), range),
            None => Self::copied(bytes),
        }
    }

    /// A section's (uncompressed) bytes: a range of `map` unless the
    /// section is compressed (`SHF_COMPRESSED`, `.zdebug_*`), then the
    /// inflated buffer; empty if unreadable.
    pub fn of<'data>(section: object::Section<'data, '_>, map: &Arc<memmap2::Mmap>) -> Self {
        let compressed = section
            .compressed_file_range()
            .map(|c| c.format != object::CompressionFormat::None)
            .unwrap_or(false);
        if !compressed
            && let Some((offset, size)) = section.file_range()
            && let (Ok(start), Ok(size)) = (usize::try_from(offset), usize::try_from(size))
            && start.checked_add(size).is_some_and(|end| end <= map.len())
        {
            return SharedBytes::Mapped(map.clone(), start..start + size);
        }
        match section.uncompressed_data() {
            Ok(Cow::Owned(bytes)) => SharedBytes::Inflated(Arc::new(bytes)),
            Ok(Cow::Borrowed(bytes)) => Self::copied(bytes),
            Err(_) => Self::empty(),
        }
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> Self {
        SharedBytes::Owned(bytes.into())
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            SharedBytes::Mapped(map, range) => &map[range.clone()],
            SharedBytes::Owned(bytes) => bytes,
            SharedBytes::Inflated(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            SharedBytes::Mapped(..) => "Mapped",
            SharedBytes::Owned(_) => "Owned",
            SharedBytes::Inflated(_) => "Inflated",
        };
        write!(f, "SharedBytes::{kind}({} bytes)", self.len())
    }
}

// SAFETY (of the StableDeref contract gimli relies on): every variant
// derefs to heap or mmap memory that does not move when the value moves
// (an `Arc<Vec<u8>>`'s buffer is never resized: nothing mutates it).
unsafe impl gimli::StableDeref for SharedBytes {}
// SAFETY: cloning shares the same Arc'd memory, so the slice stays put.
unsafe impl gimli::CloneStableDeref for SharedBytes {}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(bytes: &[u8]) -> Arc<memmap2::Mmap> {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        // SAFETY: a private temporary file nothing else writes.
        Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap())
    }

    #[test]
    fn slices_of_the_map_are_ranges_of_it_others_copies() {
        let map = map_of(b"0123456789");
        let inside = SharedBytes::within(&map, &map[2..7]);
        assert!(matches!(&inside, SharedBytes::Mapped(_, r) if *r == (2..7)));
        assert_eq!(&*inside, b"23456");
        assert!(matches!(
            SharedBytes::within(&map, &map[10..]),
            SharedBytes::Mapped(_, r) if r == (10..10)
        ));
        let elsewhere = b"23456".to_vec();
        let copy = SharedBytes::within(&map, &elsewhere);
        assert!(matches!(copy, SharedBytes::Owned(_)));
        assert_eq!(&*copy, b"23456");
        assert_eq!(&*inside.clone(), b"23456");
        assert_eq!(&*SharedBytes::from(vec![1, 2]), &[1, 2]);
        assert!(SharedBytes::empty().is_empty());
    }
}

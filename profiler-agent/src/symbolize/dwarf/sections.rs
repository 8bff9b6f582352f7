//! Debug section bytes for gimli without copying the file: uncompressed
//! sections are windows into the memory-mapped file; compressed ones
//! (`SHF_COMPRESSED`, `.zdebug_*`) are inflated once into an owned buffer.

use std::borrow::Cow;
use std::ops::{Deref, Range};
use std::sync::Arc;

use object::ObjectSection;

/// One section's bytes, cheap to clone.
#[derive(Clone, Debug)]
pub enum SectionData {
    Mapped(Arc<memmap2::Mmap>, Range<usize>),
    Owned(Arc<[u8]>),
    /// A compressed section's bytes, kept in the buffer they were inflated
    /// into (copying them into an `Arc<[u8]>` would hold two copies at
    /// once: megabytes of peak heap for a large debug file).
    Inflated(Arc<Vec<u8>>),
}

impl SectionData {
    pub fn empty() -> Self {
        SectionData::Owned(Arc::from(&[][..]))
    }

    /// The section's (uncompressed) bytes.
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
            return SectionData::Mapped(map.clone(), start..start + size);
        }
        match section.uncompressed_data() {
            Ok(Cow::Owned(bytes)) => SectionData::Inflated(Arc::new(bytes)),
            Ok(Cow::Borrowed(bytes)) => SectionData::Owned(Arc::from(bytes)),
            Err(_) => SectionData::empty(),
        }
    }
}

impl Deref for SectionData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            SectionData::Mapped(map, range) => &map[range.clone()],
            SectionData::Owned(bytes) => bytes,
            SectionData::Inflated(bytes) => bytes,
        }
    }
}

// SAFETY (of the StableDeref contract gimli relies on): every variant
// derefs to heap or mmap memory that does not move when the value moves
// (an `Arc<Vec<u8>>`'s buffer is never resized: nothing mutates it).
unsafe impl gimli::StableDeref for SectionData {}
// SAFETY: cloning shares the same Arc'd memory, so the slice stays put.
unsafe impl gimli::CloneStableDeref for SectionData {}

pub type SectionReader = gimli::EndianReader<gimli::RunTimeEndian, SectionData>;

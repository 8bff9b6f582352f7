//! Debug section bytes for gimli without copying the file: uncompressed
//! sections are windows into the memory-mapped file; compressed ones
//! (`SHF_COMPRESSED`, `.zdebug_*`) are inflated once into an owned buffer
//! (`SharedBytes::of`).

use crate::shared_bytes::SharedBytes;

/// gimli's reader over one section's bytes, cheap to clone.
pub type SectionReader = gimli::EndianReader<gimli::RunTimeEndian, SharedBytes>;

/// A unit with the sections it reads (lines and units both take one).
pub(super) type UnitRef<'a> = gimli::UnitRef<'a, SectionReader>;

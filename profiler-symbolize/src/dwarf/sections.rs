//! Debug section bytes for gimli without copying the file: uncompressed
//! sections are windows into the memory-mapped file; compressed ones
//! (`SHF_COMPRESSED`, `.zdebug_*`) are inflated once into an owned buffer
//! ([`SectionData::of`]).

/// One section's bytes, cheap to clone.
pub use super::super::shared_bytes::SharedBytes as SectionData;

pub type SectionReader = gimli::EndianReader<gimli::RunTimeEndian, SectionData>;

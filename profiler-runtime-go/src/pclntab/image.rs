//! Reading an ELF file's loaded contents by virtual address: the
//! `PT_LOAD` segments with their file bytes, and where code is.

use object::{Object, ObjectSegment, SegmentFlags};

const PF_X: u32 = 1;

/// A `PT_LOAD` segment's file-backed bytes.
pub(crate) struct Segment<'data> {
    pub address: u64,
    pub bytes: &'data [u8],
    pub executable: bool,
}

/// The loaded segments of one file.
pub(crate) struct Image<'data> {
    pub segments: Vec<Segment<'data>>,
}

impl<'data> Image<'data> {
    pub fn new(file: &object::File<'data>) -> Self {
        let segments = file
            .segments()
            .filter_map(|segment| {
                let executable = match segment.flags() {
                    SegmentFlags::Elf { p_flags } => p_flags & PF_X != 0,
                    _ => false,
                };
                Some(Segment {
                    address: segment.address(),
                    bytes: segment.data().ok()?,
                    executable,
                })
            })
            .collect();
        Image { segments }
    }

    /// The file bytes from `address` to the end of its segment's file data.
    pub fn from(&self, address: u64) -> Option<&'data [u8]> {
        self.segments.iter().find_map(|s| {
            let off = usize::try_from(address.checked_sub(s.address)?).ok()?;
            s.bytes.get(off..).filter(|rest| !rest.is_empty())
        })
    }

    /// `len` bytes at `address`.
    pub fn read(&self, address: u64, len: usize) -> Option<&'data [u8]> {
        self.from(address)?.get(..len)
    }

    /// The segment holding `address`.
    pub fn segment_of(&self, address: u64) -> Option<&Segment<'data>> {
        self.segments
            .iter()
            .find(|s| address >= s.address && address - s.address < s.bytes.len() as u64)
    }

    /// Non-executable segments: where Go's read-only and data tables live.
    pub fn data_segments(&self) -> impl Iterator<Item = &Segment<'data>> {
        self.segments.iter().filter(|s| !s.executable)
    }
}

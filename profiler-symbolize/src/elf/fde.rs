//! Function bounds from call-frame information, for code no symbol names.
//!
//! A stripped object's unnamed addresses would each be a name of their
//! own (`libsqlite3.so.0+0x3732a`), so a flame graph of it is a comb of
//! one-sample towers. Every function a compiler emits has an FDE in
//! `.eh_frame` (or `.debug_frame`) giving its start and length: naming an
//! unnamed address after the start of the FDE that covers it
//! (`libsqlite3.so.0+0x37200`) puts all samples of one function under one
//! name, and a later symbolization (a debug file, debuginfod) can name it
//! by that address. The same FDEs the unwinder turns into rows
//! (`unwind::cfi`); here only their bounds are kept.

use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, UnwindSection};
use object::{Object, ObjectSection};

/// Most FDEs indexed per object (a real libxul has ~300k).
const MAX_FDES: usize = 1 << 22;

/// Sorted, non-empty `[start, end)` ranges of an object's FDEs.
#[derive(Debug, Default)]
pub struct FdeBounds {
    ranges: Vec<(u64, u64)>,
}

impl FdeBounds {
    /// The FDE ranges of `file`: `.eh_frame`, else `.debug_frame`.
    pub fn of(file: &object::File<'_>) -> FdeBounds {
        let mut ranges = Vec::new();
        if let Some((data, bases)) = eh_frame_section(file) {
            let mut eh_frame = EhFrame::new(&data, gimli::LittleEndian);
            eh_frame.set_address_size(8);
            collect(&eh_frame, &bases, &mut ranges);
        }
        if ranges.is_empty()
            && let Some(section) = file
                .section_by_name(".debug_frame")
                .filter(|s| s.size() > 0)
            && let Ok(data) = section.uncompressed_data()
        {
            let mut debug_frame = DebugFrame::new(&data, gimli::LittleEndian);
            debug_frame.set_address_size(8);
            collect(&debug_frame, &BaseAddresses::default(), &mut ranges);
        }
        ranges.sort_unstable();
        ranges.dedup_by_key(|r| r.0);
        FdeBounds { ranges }
    }

    /// The start of the FDE covering `address`.
    pub fn start_of(&self, address: u64) -> Option<u64> {
        let index = self.ranges.partition_point(|&(start, _)| start <= address);
        let &(start, end) = self.ranges.get(index.checked_sub(1)?)?;
        (address < end).then_some(start)
    }

    /// The `[start, end)` of the FDE covering `address`.
    pub fn range_of(&self, address: u64) -> Option<(u64, u64)> {
        let index = self.ranges.partition_point(|&(start, _)| start <= address);
        let &(start, end) = self.ranges.get(index.checked_sub(1)?)?;
        (address < end).then_some((start, end))
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// The bytes of `file`'s `.eh_frame` and the base addresses its pointer
/// encodings are relative to (the section, `.text`, `.got`).
pub fn eh_frame_section<'data>(
    file: &object::File<'data>,
) -> Option<(std::borrow::Cow<'data, [u8]>, BaseAddresses)> {
    let section = file.section_by_name(".eh_frame").filter(|s| s.size() > 0)?;
    let data = section.uncompressed_data().ok()?;
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    Some((data, bases))
}

fn collect<R, S>(section: &S, bases: &BaseAddresses, ranges: &mut Vec<(u64, u64)>)
where
    R: gimli::Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if ranges.len() >= MAX_FDES {
            return;
        }
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        // FDEs of functions the linker discarded point at address 0.
        if let Some(end) = start.checked_add(fde.len())
            && start != 0
            && end > start
        {
            ranges.push((start, end));
        }
    }
}

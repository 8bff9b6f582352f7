//! The pclntab itself: header, function table, `_func` records, names,
//! files and pc-value tables, for every layout since Go 1.2.
//!
//! Layout facts come from Go's `runtime/symtab.go` and `runtime/runtime2.go`
//! (pcHeader, functab, _func) and `debug/gosym/pclntab.go` of the versions
//! named at each item. Nothing is decoded up front beyond the header and a
//! validation pass over the function table: records, names and tables are
//! read when a lookup needs them.

use super::error::GoError;
use super::reader::{Endian, cstr, uvarint32};
use profiler_symbolize::shared_bytes::SharedBytes;

/// The pclntab layouts, one per magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TableFormat {
    /// `0xfffffffb`, Go 1.2–1.15: one table, every offset from its start.
    Go12,
    /// `0xfffffffa`, Go 1.16–1.17: split sub-tables, absolute entry PCs.
    Go116,
    /// `0xfffffff0`, Go 1.18–1.19: 32-bit entry offsets from the text start.
    Go118,
    /// `0xfffffff1`, Go 1.20 and later: `startLine` in `_func`, 16-byte
    /// inline records.
    Go120,
}

impl TableFormat {
    fn from_magic(magic: u32) -> Option<Self> {
        match magic {
            0xffff_fffb => Some(TableFormat::Go12),
            0xffff_fffa => Some(TableFormat::Go116),
            0xffff_fff0 => Some(TableFormat::Go118),
            0xffff_fff1 => Some(TableFormat::Go120),
            _ => None,
        }
    }

    /// Function-table entries are 32-bit offsets from the text start
    /// (Go 1.18+), not absolute pointers.
    fn relative_entries(self) -> bool {
        self >= TableFormat::Go118
    }
}

/// Whether the 8 bytes at `data` look like a pclntab header: magic, two
/// zero pad bytes, a PC quantum of 1, 2 or 4 and a pointer size of 4 or 8.
/// Returns the byte order the magic was written in.
pub(crate) fn header_endian(data: &[u8]) -> Option<Endian> {
    let head = data.get(..8)?;
    if head[4] != 0 || head[5] != 0 || !matches!(head[6], 1 | 2 | 4) || !matches!(head[7], 4 | 8) {
        return None;
    }
    [Endian::Little, Endian::Big]
        .into_iter()
        .find(|e| e.u32(head, 0).and_then(TableFormat::from_magic).is_some())
}

/// `PCDATA_InlTreeIndex` and `FUNCDATA_InlTree` (runtime/funcdata.h; the
/// same numbers since inlining information appeared).
pub(crate) const PCDATA_INL_TREE_INDEX: u32 = 2;
pub(crate) const FUNCDATA_INL_TREE: u8 = 3;

/// The fields of one `_func` record the resolver uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FuncRecord {
    pub entry: u64,
    /// The next function-table entry: where this function's code ends.
    pub end: u64,
    pub name_off: i32,
    pub pcsp: u32,
    pub pcfile: u32,
    pub pcln: u32,
    npcdata: u32,
    cu_offset: u32,
    pub func_id: u8,
    pub flag: u8,
    nfuncdata: u8,
    /// Offset (in the table) of the `pcdata` array following the record.
    tail: usize,
}

/// A parsed, validated pclntab. Holds its bytes (in place in the mapped
/// binary when it can) plus, when the inline trees live outside it, the
/// region holding them.
pub(crate) struct Table {
    data: SharedBytes,
    /// Virtual address of the header.
    pub address: u64,
    pub format: TableFormat,
    endian: Endian,
    pub quantum: u8,
    pub ptr_size: u8,
    nfunc: usize,
    /// Offsets in `data` of the sub-tables (all 0 for Go 1.2–1.15, whose
    /// offsets are from the table's start).
    names: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    functab: usize,
    /// Go 1.2–1.15: the number of file-table entries (including entry 0).
    go12_nfiles: u32,
    /// The header's textStart (Go 1.18–1.25; 0 from 1.26).
    pub header_text_start: u64,
    pub text_start: u64,
    /// Base of the FUNCDATA offsets (Go 1.18+: `moduledata.gofunc`).
    pub gofunc: Option<u64>,
    /// Bytes holding the inline trees when they are outside `data`:
    /// (virtual address, bytes).
    extra: Option<(u64, SharedBytes)>,
}

impl Table {
    /// Parses and validates the table whose header is at the start of
    /// `data`, loaded at `address`. `data` may run past the table's end.
    pub fn parse(data: SharedBytes, address: u64) -> Result<Self, GoError> {
        let bad = |what: &str| GoError::malformed(address, what);
        let endian = header_endian(&data).ok_or_else(|| GoError::UnknownMagic {
            address,
            magic: Endian::Little.u32(&data, 0).unwrap_or(0),
        })?;
        let magic = endian
            .u32(&data, 0)
            .ok_or_else(|| bad("truncated header"))?;
        let format =
            TableFormat::from_magic(magic).ok_or(GoError::UnknownMagic { address, magic })?;
        let quantum = data[6];
        let ptr = data[7];
        let p = usize::from(ptr);
        let word = |index: usize| {
            endian
                .word(&data, 8 + index * p, ptr)
                .ok_or_else(|| bad("truncated header"))
        };
        let offset = |index: usize| -> Result<usize, GoError> {
            let value = word(index)?;
            usize::try_from(value)
                .ok()
                .filter(|&v| v < data.len())
                .ok_or_else(|| {
                    bad(&format!(
                        "header word {index} ({value:#x}) is out of bounds"
                    ))
                })
        };
        let nfunc = usize::try_from(word(0)?).map_err(|_| bad("function count overflows"))?;
        let mut table = Table {
            data: SharedBytes::empty(),
            address,
            format,
            endian,
            quantum,
            ptr_size: ptr,
            nfunc,
            names: 0,
            cutab: 0,
            filetab: 0,
            pctab: 0,
            functab: 0,
            go12_nfiles: 0,
            header_text_start: 0,
            text_start: 0,
            gofunc: None,
            extra: None,
        };
        match format {
            // runtime/symtab.go (go1.15) moduledataverify1 and
            // debug/gosym go12Init: nfunc, then the function table, then a
            // 32-bit offset of the file table after the final entry.
            TableFormat::Go12 => {
                table.functab = 8 + p;
                let after = nfunc
                    .checked_mul(2 * p)
                    .and_then(|n| n.checked_add(table.functab + p))
                    .ok_or_else(|| bad("function count overflows"))?;
                let filetab = endian
                    .u32(&data, after)
                    .ok_or_else(|| bad("function table runs past the end"))?;
                table.filetab = filetab as usize;
                table.go12_nfiles = endian
                    .u32(&data, table.filetab)
                    .ok_or_else(|| bad("file table out of bounds"))?;
            }
            // runtime/symtab.go (go1.16) pcHeader: nfunc, nfiles,
            // funcnameOffset, cuOffset, filetabOffset, pctabOffset, pclnOffset.
            TableFormat::Go116 => {
                table.names = offset(2)?;
                table.cutab = offset(3)?;
                table.filetab = offset(4)?;
                table.pctab = offset(5)?;
                table.functab = offset(6)?;
            }
            // runtime/symtab.go (go1.18) pcHeader: textStart added as word 2.
            TableFormat::Go118 | TableFormat::Go120 => {
                table.header_text_start = word(2)?;
                table.names = offset(3)?;
                table.cutab = offset(4)?;
                table.filetab = offset(5)?;
                table.pctab = offset(6)?;
                table.functab = offset(7)?;
            }
        }
        if format >= TableFormat::Go116
            && !(table.names <= table.cutab
                && table.cutab <= table.filetab
                && table.filetab <= table.pctab
                && table.pctab <= table.functab)
        {
            return Err(bad("sub-table offsets are not in the linker's order"));
        }
        table.text_start = table.header_text_start;
        table.data = data;
        table.validate_functab()?;
        Ok(table)
    }

    /// Checks that the function table fits and is sorted and that every
    /// record offset is in bounds, so lookups can binary-search it.
    fn validate_functab(&self) -> Result<(), GoError> {
        let bad = |what: String| GoError::malformed(self.address, what);
        if self.nfunc == 0 {
            return Err(bad("no functions".into()));
        }
        let needed = self
            .nfunc
            .checked_add(1)
            .and_then(|n| n.checked_mul(self.functab_entry_size()))
            .and_then(|n| n.checked_add(self.functab));
        if needed.is_none_or(|n| n > self.data.len()) {
            return Err(bad(format!(
                "function table of {} entries runs past the end",
                self.nfunc
            )));
        }
        let mut previous = 0u64;
        for i in 0..=self.nfunc {
            let (entry, funcoff) = self
                .functab_raw(i)
                .ok_or_else(|| bad(format!("function table entry {i} unreadable")))?;
            if entry < previous {
                return Err(bad(format!("function table not sorted at entry {i}")));
            }
            previous = entry;
            if i < self.nfunc
                && !self.is_hole(funcoff)
                && self.func_base().saturating_add(funcoff as usize) >= self.data.len()
            {
                return Err(bad(format!(
                    "function {i}: record offset {funcoff:#x} out of bounds"
                )));
            }
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.nfunc
    }

    fn functab_entry_size(&self) -> usize {
        if self.format.relative_entries() {
            8
        } else {
            2 * usize::from(self.ptr_size)
        }
    }

    /// Where `_func` offsets of the function table count from.
    fn func_base(&self) -> usize {
        match self.format {
            TableFormat::Go12 => 0,
            _ => self.functab,
        }
    }

    fn is_hole(&self, funcoff: u64) -> bool {
        match (self.format.relative_entries(), self.ptr_size) {
            (true, _) | (false, 4) => funcoff == u64::from(u32::MAX),
            _ => funcoff == u64::MAX,
        }
    }

    /// Entry `i` as stored: (entry, funcoff), the entry relative to the
    /// text start for Go 1.18+. The final entry (`i == nfunc`) has only
    /// an entry PC.
    fn functab_raw(&self, i: usize) -> Option<(u64, u64)> {
        let at = self.functab + i * self.functab_entry_size();
        if self.format.relative_entries() {
            let entry = self.endian.u32(&self.data, at)?;
            let funcoff = if i < self.nfunc {
                self.endian.u32(&self.data, at + 4)?
            } else {
                0
            };
            Some((u64::from(entry), u64::from(funcoff)))
        } else {
            let p = usize::from(self.ptr_size);
            let entry = self.endian.word(&self.data, at, self.ptr_size)?;
            let funcoff = if i < self.nfunc {
                self.endian.word(&self.data, at + p, self.ptr_size)?
            } else {
                0
            };
            Some((entry, funcoff))
        }
    }

    /// Entry PC of function-table slot `i` (absolute).
    fn entry_pc(&self, i: usize) -> Option<u64> {
        let (entry, _) = self.functab_raw(i)?;
        Some(if self.format.relative_entries() {
            self.text_start.wrapping_add(entry)
        } else {
            entry
        })
    }

    /// The function-table slot holding `pc`, by binary search.
    pub fn find(&self, pc: u64) -> Option<usize> {
        if pc < self.entry_pc(0)? || pc >= self.entry_pc(self.nfunc)? {
            return None;
        }
        // Largest i in [0, nfunc) with entry(i) <= pc.
        let (mut low, mut high) = (0usize, self.nfunc);
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if self.entry_pc(mid)? <= pc {
                low = mid;
            } else {
                high = mid;
            }
        }
        Some(low)
    }

    /// The `_func` record of slot `i`; `None` for holes and bad records.
    pub fn func(&self, i: usize) -> Option<FuncRecord> {
        if i >= self.nfunc {
            return None;
        }
        let (_, funcoff) = self.functab_raw(i)?;
        if self.is_hole(funcoff) {
            return None;
        }
        let entry = self.entry_pc(i)?;
        let end = self.entry_pc(i + 1)?;
        let at = self
            .func_base()
            .checked_add(usize::try_from(funcoff).ok()?)?;
        let e = self.endian;
        let d: &[u8] = &self.data;
        // Fixed part: the entry, then 32-bit fields.
        let (record_entry, fields) = if self.format.relative_entries() {
            (
                self.text_start.wrapping_add(u64::from(e.u32(d, at)?)),
                at + 4,
            )
        } else {
            (
                e.word(d, at, self.ptr_size)?,
                at + usize::from(self.ptr_size),
            )
        };
        if record_entry != entry {
            return None;
        }
        let field = |n: usize| e.u32(d, fields + 4 * n);
        // Go 1.2–1.15: nameoff, args, deferreturn/frame, pcsp, pcfile,
        // pcln, npcdata, then (1.10+) funcID u8, 2 pad bytes, nfuncdata u8.
        // Go 1.16+: cuOffset after npcdata; Go 1.17+: flag after funcID;
        // Go 1.20+: startLine before funcID (runtime2.go of each version).
        let (cu_offset, bytes_at) = match self.format {
            TableFormat::Go12 => (0, fields + 4 * 7),
            TableFormat::Go116 | TableFormat::Go118 => (field(7)?, fields + 4 * 8),
            TableFormat::Go120 => (field(7)?, fields + 4 * 9),
        };
        let byte = |n: usize| d.get(bytes_at + n).copied();
        let flag = if self.format == TableFormat::Go12 {
            0
        } else {
            byte(1)?
        };
        Some(FuncRecord {
            entry,
            end,
            name_off: field(0)? as i32,
            pcsp: field(3)?,
            pcfile: field(4)?,
            pcln: field(5)?,
            npcdata: field(6)?,
            cu_offset,
            func_id: byte(0)?,
            flag,
            nfuncdata: byte(3)?,
            tail: bytes_at + 4,
        })
    }

    /// A function name by its offset in the name table.
    pub fn name(&self, name_off: i32) -> Option<&[u8]> {
        let off = usize::try_from(name_off).ok()?;
        cstr(&self.data, self.names.checked_add(off)?)
    }

    /// The file name a `pcfile` value stands for in function `f`.
    pub fn file(&self, f: &FuncRecord, value: i32) -> Option<&[u8]> {
        let value = u32::try_from(value).ok()?;
        match self.format {
            // debug/gosym go12: entry `value` of the global file table is a
            // 32-bit offset of the name from the table's start.
            TableFormat::Go12 => {
                if value == 0 || value >= self.go12_nfiles {
                    return None;
                }
                let at = self.filetab.checked_add(4 * value as usize)?;
                let off = self.endian.u32(&self.data, at)?;
                cstr(&self.data, off as usize)
            }
            // runtime/symtab.go funcfile: cutab[cuOffset+value] is an offset
            // into filetab; ^0 means no file.
            _ => {
                let index = f.cu_offset.checked_add(value)? as usize;
                let at = self.cutab.checked_add(index.checked_mul(4)?)?;
                let off = self.endian.u32(&self.data, at)?;
                if off == u32::MAX {
                    return None;
                }
                cstr(&self.data, self.filetab.checked_add(off as usize)?)
            }
        }
    }

    /// Go's `pcvalue` (runtime/symtab.go): the value a pc-value table
    /// starting at `table` (an offset into the pc tables) holds at
    /// `target`. `None` for no table (offset 0), a PC the table does not
    /// cover, or malformed data.
    pub fn pcvalue(&self, table: u32, entry: u64, target: u64) -> Option<i32> {
        if table == 0 {
            return None;
        }
        self.runs(table, entry)?
            .find(|run| run.start <= target && target < run.end)
            .map(|run| run.value)
    }

    /// The runs `[start, end) -> value` of a pc-value table, in PC order.
    pub fn runs(&self, table: u32, entry: u64) -> Option<Runs<'_>> {
        if table == 0 {
            return None;
        }
        let pos = self.pctab.checked_add(table as usize)?;
        Some(Runs {
            data: &self.data,
            pos,
            pc: entry,
            entry,
            value: -1,
            quantum: u64::from(self.quantum),
            done: pos >= self.data.len(),
        })
    }

    /// The offset of PCDATA table `index` of `f`, if it has one.
    pub fn pcdata(&self, f: &FuncRecord, index: u32) -> Option<u32> {
        if index >= f.npcdata {
            return None;
        }
        let off = self.endian.u32(&self.data, f.tail + 4 * index as usize)?;
        (off != 0).then_some(off)
    }

    /// The address FUNCDATA slot `index` of `f` points at, if set.
    pub fn funcdata(&self, f: &FuncRecord, index: u8) -> Option<u64> {
        if index >= f.nfuncdata {
            return None;
        }
        let after_pcdata = f.tail.checked_add(4 * f.npcdata as usize)?;
        if self.format.relative_entries() {
            // go1.18 runtime/symtab.go funcdata: 32-bit offsets from
            // moduledata.gofunc right after pcdata; ^0 is nil.
            let off = self
                .endian
                .u32(&self.data, after_pcdata + 4 * usize::from(index))?;
            if off == u32::MAX {
                return None;
            }
            Some(self.gofunc?.checked_add(u64::from(off))?)
        } else {
            // go1.16 funcdata: pointer-sized, pointer-aligned absolute
            // addresses (aligned in memory, so by the table's address).
            let p = usize::from(self.ptr_size);
            let mut at = after_pcdata;
            if p == 8 && (self.address.wrapping_add(at as u64)) & 4 != 0 {
                at += 4;
            }
            let address =
                self.endian
                    .word(&self.data, at + p * usize::from(index), self.ptr_size)?;
            (address != 0).then_some(address)
        }
    }

    /// Offset of the function-name table from the header.
    pub fn names_offset(&self) -> usize {
        self.names
    }

    pub(crate) fn take_extra(&mut self) -> Option<(u64, SharedBytes)> {
        self.extra.take()
    }

    pub(crate) fn restore_extra(&mut self, extra: Option<(u64, SharedBytes)>) {
        self.extra = extra;
    }

    /// Provides the bytes of a region holding inline trees outside the
    /// table (from `address` on).
    pub fn set_extra(&mut self, address: u64, bytes: SharedBytes) {
        self.extra = Some((address, bytes));
    }

    /// How many of the bytes the table reads are held on the heap rather
    /// than in place in the mapped file.
    pub fn heap_bytes(&self) -> usize {
        std::iter::once(&self.data)
            .chain(self.extra.as_ref().map(|(_, bytes)| bytes))
            .filter(|bytes| !matches!(bytes, SharedBytes::Mapped(..)))
            .map(|bytes| bytes.len())
            .sum()
    }

    /// Whether `[address, address+len)` is readable through this table.
    pub fn covers(&self, address: u64, len: usize) -> bool {
        self.read(address, len).is_some()
    }

    /// `len` bytes at virtual address `address`, from the table's bytes or
    /// the extra region.
    pub fn read(&self, address: u64, len: usize) -> Option<&[u8]> {
        let regions = std::iter::once((self.address, &*self.data))
            .chain(self.extra.as_ref().map(|(a, b)| (*a, &**b)));
        for (base, bytes) in regions {
            if let Some(off) = address
                .checked_sub(base)
                .and_then(|o| usize::try_from(o).ok())
                && let Some(slice) = bytes.get(off..off.checked_add(len)?)
            {
                return Some(slice);
            }
        }
        None
    }

    pub fn endian(&self) -> Endian {
        self.endian
    }
}

/// One run of a pc-value table: `value` holds for PCs in `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub end: u64,
    pub value: i32,
}

/// Iterator over the runs of a pc-value table, decoded as Go's `step`
/// (runtime/symtab.go) does: zig-zag value deltas and PC deltas in units
/// of the PC quantum, ended by a zero value delta after the first pair.
/// Stops at the first malformed byte.
pub struct Runs<'a> {
    data: &'a [u8],
    pos: usize,
    pc: u64,
    entry: u64,
    value: i32,
    quantum: u64,
    done: bool,
}

impl Iterator for Runs<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        if self.done {
            return None;
        }
        let step = (|| {
            let value_delta = uvarint32(self.data, &mut self.pos)?;
            // `first` in Go is `pc == entry`, not "first step".
            if value_delta == 0 && self.pc != self.entry {
                return None;
            }
            let delta = (value_delta >> 1) as i32 ^ -((value_delta & 1) as i32);
            let pc_delta = uvarint32(self.data, &mut self.pos)?;
            let start = self.pc;
            let end = start.checked_add(u64::from(pc_delta).checked_mul(self.quantum)?)?;
            self.value = self.value.wrapping_add(delta);
            self.pc = end;
            Some(Run {
                start,
                end,
                value: self.value,
            })
        })();
        if step.is_none() {
            self.done = true;
        }
        step
    }
}

/// One record of a function's inline tree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InlinedCall {
    pub name_off: i32,
    /// Offset from the entry of the physical function of an instruction
    /// whose position is the call site.
    pub parent_pc: i32,
}

impl Table {
    /// Record `index` of the inline tree at `tree`.
    pub fn inlined_call(&self, tree: u64, index: i32) -> Option<InlinedCall> {
        let index = u64::try_from(index).ok()?;
        let e = self.endian;
        if self.format == TableFormat::Go120 {
            // go1.20 runtime/symtabinl.go inlinedCall, 16 bytes:
            // funcID u8, pad [3]u8, nameOff i32, parentPc i32, startLine i32.
            let r = self.read(tree.checked_add(index.checked_mul(16)?)?, 16)?;
            Some(InlinedCall {
                name_off: e.i32(r, 4)?,
                parent_pc: e.i32(r, 8)?,
            })
        } else {
            // go1.12–1.19 runtime/symtab.go inlinedCall, 20 bytes: parent
            // i16, funcID u8, pad u8, file i32, line i32, func_ i32 (name
            // offset), parentPc i32.
            let r = self.read(tree.checked_add(index.checked_mul(20)?)?, 20)?;
            let _parent = e.u16(r, 0)?;
            Some(InlinedCall {
                name_off: e.i32(r, 12)?,
                parent_pc: e.i32(r, 16)?,
            })
        }
    }
}

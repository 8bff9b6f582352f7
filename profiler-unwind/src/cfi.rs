//! Call-frame information (`.eh_frame`, or `.debug_frame` where only that
//! exists) turned into unwind rows.
//!
//! gimli evaluates each FDE's CFA program into rows (`UnwindTable`); each
//! row becomes one `UnwindRule`. What the BPF walker models:
//! - CFA = SP or FP + offset, or `*(FP + offset)` (GCC's DRAP frames, whose
//!   `main` realigns the stack and keeps the CFA in a slot);
//! - the return address at CFA + offset, undefined (the outermost frame:
//!   `_start`, `clone3`), or still in the link register (arm64);
//! - the caller's frame pointer saved at CFA + offset, at FP + offset, or
//!   unchanged;
//! - the x86_64 PLT's CFA expression (CFA depends on the PC in the entry);
//! - signal trampolines (FDEs with the `S` augmentation).
//!
//! Anything else (a CFA in another register, other expressions) becomes a
//! frame-pointer row flagged unsupported, so the walker counts it.
//!
//! The input is untrusted: a malformed FDE is skipped (its code walks
//! frame pointers) and counted; a malformed section ends the walk over it
//! with the rows found so far.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, Reader, RegisterRule, UnwindContext,
    UnwindSection,
};
use object::{Object, ObjectSection};
use profiler_common::unwind::{
    RULE_CFA_DEREF_FP, RULE_CFA_FP, RULE_CFA_SP, RULE_FLAG_FP_FROM_FP, RULE_FLAG_FP_LOST,
    RULE_FLAG_UNSUPPORTED, RULE_FRAME_POINTER, RULE_PLT, RULE_ROOT, RULE_SIGNAL, UnwindRule,
};

use crate::table::{ObjectTable, TableRow};

/// The instruction set whose registers the CFI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    pub fn of(file: &object::File<'_>) -> Option<Arch> {
        match file.architecture() {
            object::Architecture::X86_64 => Some(Arch::X86_64),
            object::Architecture::Aarch64 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// The architecture the agent runs on.
    pub fn native() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// DWARF register numbers: stack pointer, frame pointer, return address.
    fn registers(self) -> (u16, u16, u16) {
        match self {
            // System V AMD64 ABI, figure 3.36: rsp 7, rbp 6, RA 16.
            Arch::X86_64 => (7, 6, 16),
            // DWARF for the Arm 64-bit architecture: sp 31, x29 29, x30 30.
            Arch::Aarch64 => (31, 29, 30),
        }
    }
}

/// What converting one object's CFI found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CfiStats {
    pub fdes: u64,
    /// FDEs that did not parse or evaluate (their code walks frame pointers).
    pub bad_fdes: u64,
    /// Rows the walker does not model (frame-pointer fallback, counted).
    pub unsupported_rows: u64,
    pub plt_rows: u64,
    pub signal_fdes: u64,
    pub root_rows: u64,
    /// The section itself was malformed part-way (rows before it kept).
    pub section_errors: u64,
}

/// Where the rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfiSource {
    EhFrame,
    DebugFrame,
}

/// The unwind rows of `file`'s CFI: `.eh_frame` when it has one, else
/// `.debug_frame`. None when it has neither (or no FDE in them).
pub fn rows_of(file: &object::File<'_>) -> Option<(ObjectTable, CfiStats, CfiSource)> {
    let arch = Arch::of(file)?;
    let plt = plt_without_cfi(file, arch);
    if let Some((data, bases)) = profiler_symbolize::elf::fde::eh_frame_section(file) {
        let mut eh_frame = EhFrame::new(&data, gimli::LittleEndian);
        eh_frame.set_address_size(8);
        let (table, stats) = convert_with(&eh_frame, &bases, arch, plt);
        if !table.is_empty() {
            return Some((table, stats, CfiSource::EhFrame));
        }
    }
    let section = file
        .section_by_name(".debug_frame")
        .filter(|s| s.size() > 0)?;
    let data = section.uncompressed_data().ok()?;
    let mut debug_frame = DebugFrame::new(&data, gimli::LittleEndian);
    debug_frame.set_address_size(8);
    let (table, stats) = convert_with(&debug_frame, &BaseAddresses::default(), arch, plt);
    (!table.is_empty()).then_some((table, stats, CfiSource::DebugFrame))
}

/// arm64's `.plt`, which linkers give no CFI: its stubs (`adrp`, `ldr`,
/// `add`, `br`) touch neither SP nor x30, so a PC in one has its caller
/// in the link register: CFA = SP, return address in x30. It is only ever
/// a leaf, or the code a signal interrupted (x30 then comes from the
/// signal frame). Without this rule such a PC fell back to the frame
/// pointer, whose record skips the stub's caller (and, in code without
/// frame pointers, more).
fn plt_without_cfi(file: &object::File<'_>, arch: Arch) -> Option<(u64, u64)> {
    if arch != Arch::Aarch64 {
        return None;
    }
    let plt = file.section_by_name(".plt")?;
    let end = plt.address().checked_add(plt.size())?;
    (plt.address() > 0 && end > plt.address()).then_some((plt.address(), end))
}

/// The rule of a PC in arm64's `.plt` (`plt_without_cfi`).
const AARCH64_PLT_RULE: UnwindRule = UnwindRule {
    kind: RULE_CFA_SP,
    flags: 0,
    param: 0,
    fp_offset: 0,
    ra_offset: 0,
    cfa_offset: 0,
};

/// One FDE's rows, before FDEs are put in address order.
struct FdeRows {
    start: u64,
    end: u64,
    rows: Vec<TableRow>,
}

/// Most rows one FDE may produce: a function with more CFA changes than
/// this is not compiler output, and an FDE program is untrusted.
const MAX_ROWS_PER_FDE: usize = 1 << 16;

/// Converts every FDE of `section`.
pub fn convert<R, S>(section: &S, bases: &BaseAddresses, arch: Arch) -> (ObjectTable, CfiStats)
where
    R: Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    convert_with(section, bases, arch, None)
}

/// `convert`, with arm64's `.plt` (`plt`: its start and end) covered by
/// `AARCH64_PLT_RULE` where no FDE covers it.
fn convert_with<R, S>(
    section: &S,
    bases: &BaseAddresses,
    arch: Arch,
    plt: Option<(u64, u64)>,
) -> (ObjectTable, CfiStats)
where
    R: Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let mut stats = CfiStats::default();
    let mut fdes: Vec<FdeRows> = Vec::new();
    if let Some((start, end)) = plt {
        fdes.push(FdeRows {
            start,
            end,
            rows: vec![TableRow {
                address: start,
                rule: AARCH64_PLT_RULE,
            }],
        });
    }
    let mut context = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(_) => {
                stats.section_errors += 1;
                break;
            }
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            stats.bad_fdes += 1;
            continue;
        };
        stats.fdes += 1;
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            stats.bad_fdes += 1;
            continue;
        };
        // FDEs of functions the linker discarded point at address 0.
        if start == 0 || end <= start {
            continue;
        }
        if fde.is_signal_trampoline() {
            stats.signal_fdes += 1;
            fdes.push(FdeRows {
                start,
                end,
                rows: vec![TableRow {
                    address: start,
                    rule: UnwindRule {
                        kind: RULE_SIGNAL,
                        ..Default::default()
                    },
                }],
            });
            continue;
        }
        let mut rows = Vec::new();
        let ok = (|| -> gimli::Result<bool> {
            let ra_undefined = undefines_return_address(&fde, section, bases, arch)?;
            let mut table = fde.rows(section, bases, &mut context)?;
            while let Some(row) = table.next_row()? {
                if rows.len() >= MAX_ROWS_PER_FDE {
                    return Ok(false);
                }
                let rule = rule_of(row, section, arch, ra_undefined, &mut stats);
                rows.push(TableRow {
                    address: row.start_address(),
                    rule,
                });
            }
            Ok(true)
        })();
        match ok {
            Ok(true) => fdes.push(FdeRows { start, end, rows }),
            _ => stats.bad_fdes += 1,
        }
    }
    (assemble(fdes), stats)
}

/// FDE rows in address order, with frame-pointer rows in the gaps
/// between FDEs; an FDE overlapping the one before it loses the overlap.
fn assemble(mut fdes: Vec<FdeRows>) -> ObjectTable {
    fdes.sort_by_key(|f| (f.start, f.end));
    let gap = UnwindRule::default();
    let mut rows = Vec::with_capacity(fdes.iter().map(|f| f.rows.len() + 1).sum());
    let mut covered_to = 0u64;
    for fde in &fdes {
        if fde.end <= covered_to {
            continue;
        }
        let start = fde.start.max(covered_to);
        // The rule in effect at `start` (an overlap may cut the first rows).
        let mut first = fde.rows.first().map_or(gap, |r| r.rule);
        for row in fde.rows.iter().filter(|r| r.address <= start) {
            first = row.rule;
        }
        rows.push(TableRow {
            address: start,
            rule: first,
        });
        rows.extend(
            fde.rows
                .iter()
                .filter(|r| start < r.address && r.address < fde.end)
                .copied(),
        );
        rows.push(TableRow {
            address: fde.end,
            rule: gap,
        });
        covered_to = fde.end;
    }
    ObjectTable::from_sorted(rows)
}

/// Whether the FDE's program (or its CIE's) says `DW_CFA_undefined` for
/// the return address: gimli keeps no rule for an undefined register, so
/// its rows cannot tell "undefined" (the outermost frame) from "never
/// set" (arm64: still in the link register).
fn undefines_return_address<R, S>(
    fde: &gimli::FrameDescriptionEntry<R>,
    section: &S,
    bases: &BaseAddresses,
    arch: Arch,
) -> gimli::Result<bool>
where
    R: Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let (_, _, ra) = arch.registers();
    let mut programs = [
        fde.cie().instructions(section, bases),
        fde.instructions(section, bases),
    ];
    for program in &mut programs {
        while let Some(instruction) = program.next()? {
            if let gimli::CallFrameInstruction::Undefined { register } = instruction
                && register.0 == ra
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn rule_of<R, S>(
    row: &gimli::UnwindTableRow<usize>,
    section: &S,
    arch: Arch,
    ra_undefined: bool,
    stats: &mut CfiStats,
) -> UnwindRule
where
    R: Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let (sp, fp, ra) = arch.registers();
    let unsupported = |stats: &mut CfiStats| {
        stats.unsupported_rows += 1;
        UnwindRule {
            kind: RULE_FRAME_POINTER,
            flags: RULE_FLAG_UNSUPPORTED,
            ..Default::default()
        }
    };
    let mut rule = UnwindRule::default();
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(*offset) else {
                return unsupported(stats);
            };
            rule.cfa_offset = offset;
            rule.kind = if register.0 == sp {
                RULE_CFA_SP
            } else if register.0 == fp {
                RULE_CFA_FP
            } else {
                // DRAP before the frame is set up (CFA in r10), or a
                // register we do not track.
                return unsupported(stats);
            };
        }
        CfaRule::Expression(expression) => {
            let Some(bytes) = expression_bytes(expression, section) else {
                return unsupported(stats);
            };
            if let Some((offset, threshold)) = plt_expression(&bytes, arch) {
                stats.plt_rows += 1;
                rule.kind = RULE_PLT;
                rule.cfa_offset = offset;
                rule.param = threshold;
            } else if let Some(offset) = deref_fp_expression(&bytes, arch) {
                rule.kind = RULE_CFA_DEREF_FP;
                rule.cfa_offset = offset;
            } else {
                return unsupported(stats);
            }
        }
    }
    // Only defined rules appear in `registers()`: an absent rule is "same
    // value" for the frame pointer, and for the return address "undefined"
    // if the program said so (a root), else "in the link register" (arm64).
    let mut ra_rule = None;
    let mut fp_rule = None;
    for (register, r) in row.registers() {
        if register.0 == ra {
            ra_rule = Some(r);
        } else if register.0 == fp {
            fp_rule = Some(r);
        }
    }
    match ra_rule {
        None | Some(RegisterRule::Undefined) if ra_undefined => {
            stats.root_rows += 1;
            return UnwindRule {
                kind: RULE_ROOT,
                ..Default::default()
            };
        }
        Some(RegisterRule::Offset(offset)) => match i32::try_from(*offset) {
            Ok(offset) if offset != 0 => rule.ra_offset = offset,
            _ => return unsupported(stats),
        },
        // arm64: still in x30.
        None | Some(RegisterRule::SameValue) if arch == Arch::Aarch64 => rule.ra_offset = 0,
        _ => return unsupported(stats),
    }
    match fp_rule {
        None | Some(RegisterRule::SameValue) => {}
        Some(RegisterRule::Offset(offset)) => match i32::try_from(*offset) {
            Ok(offset) if offset != 0 => rule.fp_offset = offset,
            _ => rule.flags |= RULE_FLAG_FP_LOST,
        },
        Some(RegisterRule::Expression(expression)) => {
            // DRAP frames save the caller's FP at [FP + k]:
            // DW_CFA_expression: r6 (DW_OP_breg6 (rbp): 0).
            let offset = expression_bytes(expression, section).and_then(|bytes| {
                let (offset, rest) = breg_offset(&bytes, fp)?;
                rest.is_empty().then_some(offset)
            });
            match offset.and_then(|offset| i32::try_from(offset).ok()) {
                Some(offset) => {
                    rule.flags |= RULE_FLAG_FP_FROM_FP;
                    rule.fp_offset = offset;
                }
                None => rule.flags |= RULE_FLAG_FP_LOST,
            }
        }
        Some(_) => rule.flags |= RULE_FLAG_FP_LOST,
    }
    rule
}

fn expression_bytes<R, S>(
    expression: &gimli::UnwindExpression<usize>,
    section: &S,
) -> Option<Vec<u8>>
where
    R: Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let gimli::Expression(reader) = expression.get(section).ok()?;
    Some(reader.to_slice().ok()?.into_owned())
}

/// `DW_OP_bregN offset` at the start of `bytes` for register `register`:
/// the offset and the bytes after it.
fn breg_offset(bytes: &[u8], register: u16) -> Option<(i64, &[u8])> {
    const DW_OP_BREG0: u8 = 0x70;
    const DW_OP_BREGX: u8 = 0x92;
    let (&op, mut rest) = bytes.split_first()?;
    let reg = match op {
        DW_OP_BREG0..=0x8f => u64::from(op - DW_OP_BREG0),
        DW_OP_BREGX => read_uleb(&mut rest)?,
        _ => return None,
    };
    if reg != u64::from(register) {
        return None;
    }
    let offset = read_sleb(&mut rest)?;
    Some((offset, rest))
}

/// The PLT's CFA expression, as GNU ld writes it for x86_64 `.plt`:
/// `DW_OP_breg7 (rsp): 8; DW_OP_breg16 (rip): 0; DW_OP_lit15; DW_OP_and;
/// DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`, i.e.
/// CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0). Returns (8, 11).
fn plt_expression(bytes: &[u8], arch: Arch) -> Option<(i32, i16)> {
    if arch != Arch::X86_64 {
        return None;
    }
    let (offset, rest) = breg_offset(bytes, 7)?;
    let (rip_offset, rest) = breg_offset(rest, 16)?;
    const DW_OP_LIT0: u8 = 0x30;
    match rest {
        // lit15, and, litN, ge, lit3, shl, plus
        [0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] if rip_offset == 0 => {
            let threshold = lit.checked_sub(DW_OP_LIT0).filter(|&t| t < 16)?;
            Some((i32::try_from(offset).ok()?, i16::from(threshold)))
        }
        _ => None,
    }
}

/// `DW_OP_bregFP offset; DW_OP_deref`: CFA = *(FP + offset).
fn deref_fp_expression(bytes: &[u8], arch: Arch) -> Option<i32> {
    const DW_OP_DEREF: u8 = 0x06;
    let (_, fp, _) = arch.registers();
    match breg_offset(bytes, fp)? {
        (offset, [DW_OP_DEREF]) => i32::try_from(offset).ok(),
        _ => None,
    }
}

fn read_uleb(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn read_sleb(bytes: &mut &[u8]) -> Option<i64> {
    let mut value = 0i64;
    let mut shift = 0;
    loop {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        if shift >= 64 {
            return None;
        }
        value |= i64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            if shift < 64 && byte & 0x40 != 0 {
                value |= -1i64 << shift;
            }
            return Some(value);
        }
    }
}

/// Converts `bytes` as an `.eh_frame` and as a `.debug_frame` section of
/// `arch` at address `address`, and checks what a walker relies on in the
/// result: rows in address order, and paged tables whose row ranges stay
/// inside their rows with a row at the start of every page. Panics on a
/// violation (the fuzz target and the tests call it; the agent does not).
pub fn check_invariants(bytes: &[u8], address: u64, arch: Arch) {
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut eh_frame = EhFrame::new(bytes, gimli::LittleEndian);
    eh_frame.set_address_size(8);
    let mut debug_frame = DebugFrame::new(bytes, gimli::LittleEndian);
    debug_frame.set_address_size(8);
    for (table, _) in [
        convert(&eh_frame, &bases, arch),
        convert(&debug_frame, &BaseAddresses::default(), arch),
    ] {
        assert!(table.rows.windows(2).all(|w| w[0].address < w[1].address));
        let mut rules = crate::table::RuleSet::default();
        let Some(paged) = crate::table::PagedTable::build(&table, &mut rules) else {
            continue;
        };
        for page in &paged.pages {
            if page.row_count == 0 {
                continue;
            }
            let end = page.first_row as usize + page.row_count as usize;
            assert!(end <= paged.rows.len());
            let rows = &paged.rows[page.first_row as usize..end];
            assert_eq!(rows[0].pc_low, 0);
            assert!(rows.windows(2).all(|w| w[0].pc_low < w[1].pc_low));
            assert!(rows.iter().all(|r| (r.rule as usize) < rules.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libc's .eh_frame, mutated byte by byte: conversion never panics
    /// (nothing here catches a panic) and what it gives keeps the walker's
    /// invariants.
    #[test]
    fn malformed_cfi_never_panics_nor_breaks_the_tables() {
        let data =
            std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6").expect("Debian's libc6 (x86_64)");
        let file = object::File::parse(&*data).unwrap();
        let section = file.section_by_name(".eh_frame").unwrap();
        let original = section.data().unwrap().to_vec();
        // The intact section first: the checks hold on real data.
        check_invariants(&original, section.address(), Arch::X86_64);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let mut bytes = original[..original.len().min(64 << 10)].to_vec();
            for _ in 0..(1 + round % 8) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed as usize) % bytes.len();
                bytes[i] ^= (seed >> 40) as u8 | 1;
            }
            if round % 5 == 0 {
                bytes.truncate((seed as usize) % bytes.len());
            }
            check_invariants(&bytes, section.address(), Arch::X86_64);
            check_invariants(&bytes, section.address(), Arch::Aarch64);
        }
    }

    #[test]
    fn the_plt_expression_is_recognised() {
        // As readelf prints it for /bin/ls's .plt FDE.
        let bytes = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_expression(&bytes, Arch::X86_64), Some((8, 11)));
        assert_eq!(plt_expression(&bytes, Arch::Aarch64), None);
        assert_eq!(plt_expression(&bytes[..10], Arch::X86_64), None);
    }

    #[test]
    fn drap_expressions_are_recognised() {
        // DW_OP_breg6 (rbp): -8; DW_OP_deref
        assert_eq!(
            deref_fp_expression(&[0x76, 0x78, 0x06], Arch::X86_64),
            Some(-8)
        );
        assert_eq!(deref_fp_expression(&[0x76, 0x78], Arch::X86_64), None);
        assert_eq!(deref_fp_expression(&[0x77, 0x78, 0x06], Arch::X86_64), None);
        // DW_OP_bregx 29 -16; DW_OP_deref on arm64.
        assert_eq!(
            deref_fp_expression(&[0x92, 29, 0x70, 0x06], Arch::Aarch64),
            Some(-16)
        );
    }

    #[test]
    fn leb128() {
        assert_eq!(read_sleb(&mut &[0x78][..]), Some(-8));
        assert_eq!(read_sleb(&mut &[0x80, 0x01][..]), Some(128));
        assert_eq!(read_uleb(&mut &[0xe5, 0x8e, 0x26][..]), Some(624485));
        assert_eq!(read_uleb(&mut &[0x80][..]), None);
        assert_eq!(read_sleb(&mut &[0xff; 12][..]), None);
    }
}

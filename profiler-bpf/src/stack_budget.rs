//! The verifier's stack budget, read from a compiled BPF object: a program,
//! the `bpf_loop` callbacks it passes and the functions they call share
//! 512 bytes of stack, and the kernel adds each one's stack rounded up
//! (to 32 bytes on arm64's Debian 6.1 kernel; newer kernels with a JIT
//! round to 16). A walker change that adds a few bytes, or a struct
//! zeroed on the stack that LLVM turns into a call to `memset`, can pass
//! on this machine's kernel and be refused on arm64's: this says so in a
//! unit test instead of a 15-minute emulated boot.
//!
//! Each function's stack is its deepest access below the frame pointer
//! (`r10 - N`, or a pointer `r10 + -N` taken for a helper), which is what
//! the verifier records for the paths it explores (it may explore fewer,
//! so this is an upper bound). Callees are the calls and the functions
//! whose address is taken (`bpf_loop`'s callback), as the verifier counts
//! them.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind, SymbolKind};

/// The verifier's limit for a program and the functions it calls.
pub const MAX_STACK: u32 = 512;

/// The coarsest rounding of one function's stack a supported kernel
/// applies (6.1; later kernels with a JIT use 16).
pub const STRICTEST_ROUNDING: u32 = 32;

/// A program's deepest chain of nested functions and its stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub program: String,
    /// The chain's stack, each function rounded up to `rounding`.
    pub bytes: u32,
    /// The functions in the chain, outermost first, with their own stack.
    pub functions: Vec<(String, u32)>,
}

struct Function {
    name: String,
    section: object::SectionIndex,
    start: u64,
    end: u64,
    depth: u32,
    callees: Vec<usize>,
    program: bool,
}

const INSN: usize = 8;
const FRAME_POINTER: u8 = 10;

/// Every program's deepest chain in the BPF object `elf`, with each
/// function's stack rounded up to `rounding` bytes.
pub fn chains(elf: &[u8], rounding: u32) -> Result<Vec<Chain>, String> {
    let file = object::File::parse(elf).map_err(|e| format!("not an ELF object: {e}"))?;
    let mut functions: Vec<Function> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| {
            let section = s.section_index()?;
            let section_name = file
                .section_by_index(section)
                .ok()?
                .name()
                .ok()?
                .to_string();
            Some(Function {
                name: s.name().unwrap_or("?").to_string(),
                section,
                start: s.address(),
                end: s.address() + s.size(),
                depth: 0,
                callees: Vec::new(),
                // Programs sit in sections of their own; `.text` holds
                // the functions they call.
                program: section_name != ".text",
            })
        })
        .collect();
    let find = |functions: &[Function], section: object::SectionIndex, at: u64| {
        functions
            .iter()
            .position(|f| f.section == section && f.start <= at && at < f.end)
    };
    for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
        let code = section.data().map_err(|e| e.to_string())?;
        // Relocations by the instruction they patch: calls to a function
        // symbol, and addresses of functions (a section symbol plus the
        // instruction's immediate).
        let mut targets: HashMap<u64, (object::SectionIndex, u64)> = HashMap::new();
        for (offset, relocation) in section.relocations() {
            let RelocationTarget::Symbol(index) = relocation.target() else {
                continue;
            };
            let Ok(symbol) = file.symbol_by_index(index) else {
                continue;
            };
            let Some(target_section) = symbol.section_index() else {
                continue;
            };
            let is_code = file
                .section_by_index(target_section)
                .is_ok_and(|s| s.kind() == SectionKind::Text);
            if !is_code {
                continue;
            }
            let at = offset as usize;
            let Some(insn) = code.get(at..at + INSN) else {
                continue;
            };
            let opcode = insn[0];
            let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            let address = match (symbol.kind(), opcode) {
                // A call through a function symbol (`call -1`).
                (SymbolKind::Text, 0x85) => symbol.address(),
                // A function's address (`ld_imm64`): the section symbol
                // plus the offset in the immediate.
                (_, 0x18) => symbol.address().wrapping_add(imm as i64 as u64),
                _ => continue,
            };
            targets.insert(offset, (target_section, address));
        }
        for index in 0..functions.len() {
            if functions[index].section != section.index() {
                continue;
            }
            let (start, end) = (functions[index].start, functions[index].end);
            let mut depth = 0u32;
            let mut callees = Vec::new();
            let mut at = start;
            // Registers holding the frame pointer (copied with `rX = r10`).
            let mut holds_fp = 0u16;
            while at + INSN as u64 <= end {
                let Some(insn) = code.get(at as usize..at as usize + INSN) else {
                    break;
                };
                let opcode = insn[0];
                let (dst, src) = (insn[1] & 0xf, insn[1] >> 4);
                let off = i16::from_le_bytes([insn[2], insn[3]]);
                let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
                let below = |n: i64| if n < 0 { (-n) as u32 } else { 0 };
                match opcode & 0x07 {
                    // LDX: src is the base.
                    0x01 if src == FRAME_POINTER => depth = depth.max(below(off.into())),
                    // ST, STX: dst is the base.
                    0x02 | 0x03 if dst == FRAME_POINTER => depth = depth.max(below(off.into())),
                    _ => {}
                }
                match opcode {
                    // rX = r10
                    0xbf if src == FRAME_POINTER => holds_fp |= 1 << dst,
                    // rX += imm, on a copy of r10: a pointer into the stack.
                    0x07 if holds_fp & (1 << dst) != 0 => {
                        depth = depth.max(below(imm.into()));
                    }
                    // A call clobbers r0-r5.
                    0x85 => holds_fp &= !0x3f,
                    // Any other write to rX ends it holding r10.
                    _ if matches!(opcode & 0x07, 0x01 | 0x04 | 0x07) || opcode == 0x18 => {
                        holds_fp &= !(1 << dst);
                    }
                    _ => {}
                }
                if let Some(&(target_section, address)) = targets.get(&at) {
                    if let Some(callee) = find(&functions, target_section, address) {
                        callees.push(callee);
                    }
                } else if opcode == 0x85 && src == 1 {
                    // A call resolved at link time: relative to the next
                    // instruction.
                    let address = (at as i64 + (i64::from(imm) + 1) * INSN as i64) as u64;
                    if let Some(callee) = find(&functions, section.index(), address) {
                        callees.push(callee);
                    }
                }
                at += if opcode == 0x18 {
                    2 * INSN as u64
                } else {
                    INSN as u64
                };
            }
            callees.sort_unstable();
            callees.dedup();
            functions[index].depth = depth;
            functions[index].callees = callees;
        }
    }
    let rounded = |depth: u32| depth.max(1).div_ceil(rounding) * rounding;
    // The deepest chain below each function (a call cycle, which the
    // verifier refuses anyway, is cut).
    fn deepest(
        functions: &[Function],
        index: usize,
        rounded: &dyn Fn(u32) -> u32,
        on_path: &mut Vec<usize>,
    ) -> (u32, Vec<usize>) {
        on_path.push(index);
        let mut best = (0, Vec::new());
        for &callee in &functions[index].callees {
            if on_path.contains(&callee) {
                continue;
            }
            let below = deepest(functions, callee, rounded, on_path);
            if below.0 > best.0 {
                best = below;
            }
        }
        on_path.pop();
        let mut path = vec![index];
        path.extend(best.1);
        (rounded(functions[index].depth) + best.0, path)
    }
    Ok(functions
        .iter()
        .enumerate()
        .filter(|(_, f)| f.program)
        .map(|(index, f)| {
            let (bytes, path) = deepest(&functions, index, &rounded, &mut Vec::new());
            Chain {
                program: f.name.clone(),
                bytes,
                functions: path
                    .into_iter()
                    .map(|i| (functions[i].name.clone(), functions[i].depth))
                    .collect(),
            }
        })
        .collect())
}

/// The chains of `elf` over the verifier's limit with the strictest
/// rounding, in words (empty when every program fits).
pub fn over_budget(elf: &[u8]) -> Result<Vec<String>, String> {
    Ok(chains(elf, STRICTEST_ROUNDING)?
        .into_iter()
        .filter(|c| c.bytes > MAX_STACK)
        .map(|c| {
            let functions: Vec<String> = c
                .functions
                .iter()
                .map(|(name, depth)| format!("{name} ({depth} bytes)"))
                .collect();
            format!(
                "{}: {} bytes of stack with each function rounded up to {STRICTEST_ROUNDING} \
                 (limit {MAX_STACK}): {}",
                c.program,
                c.bytes,
                functions.join(" -> ")
            )
        })
        .collect())
}

#[cfg(all(test, feature = "objects"))]
mod tests {
    use super::*;

    #[test]
    fn every_program_fits_the_strictest_stack_budget() {
        let over = over_budget(crate::OBJECT).unwrap();
        assert!(over.is_empty(), "{}", over.join("\n"));
    }

    #[test]
    fn the_native_walkers_chain_includes_its_loop_callback() {
        // Not vacuous: the walk's callback (and what it calls) is counted
        // under the program that passes it to bpf_loop.
        let chains = chains(crate::OBJECT, STRICTEST_ROUNDING).unwrap();
        let sampler = chains
            .iter()
            .find(|c| c.program == "walk_native_cpu")
            .expect("walk_native_cpu in the object");
        assert!(sampler.functions.len() >= 2, "{sampler:?}");
        assert!(
            sampler
                .functions
                .iter()
                .any(|(name, _)| name.contains("step")),
            "{sampler:?}"
        );
        assert!(sampler.bytes >= 256, "{sampler:?}");
        // Each function rounded up on its own, then added: with 256-byte
        // rounding the program, its callback and the step the callback
        // calls (a global function, on the same stack) take 768.
        let coarse = super::chains(crate::OBJECT, 256).unwrap();
        let sampler = coarse
            .iter()
            .find(|c| c.program == "walk_native_cpu")
            .unwrap();
        assert_eq!(sampler.bytes, 768, "{sampler:?}");
    }
}

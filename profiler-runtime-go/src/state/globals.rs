//! Where the Go runtime's variables are in a binary, stripped or not.
//!
//! With a symbol table, by name. A stripped binary (`-ldflags=-s -w`) has
//! none, but keeps its pclntab (every function's name and entry) and its
//! section headers: each variable is found in the code of a runtime
//! function that uses it, as the k-th distinct address that function's
//! instructions refer to inside the writable data sections (RIP-relative
//! operands on amd64, ADRP with ADD or a load on arm64). The functions and
//! ordinals were checked on the toolchains 1.19 to 1.27, plain, stripped
//! and PIE, both architectures (every address equal to `go tool nm`'s);
//! the instructions' offsets move between versions, so they are decoded,
//! never assumed. Whatever is found is checked against the process before
//! it is believed (see `heap` and `goroutines`).

use std::collections::HashSet;

use object::{Object, ObjectSection, ObjectSymbol};

use super::super::pclntab::GoSymbols;

/// A runtime variable, and where it is found in a stripped binary: the
/// function that uses it and which distinct data reference it is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Global {
    pub symbol: &'static str,
    pub anchor: &'static str,
    pub ordinal: usize,
}

pub const MBUCKETS: Global = Global {
    symbol: "runtime.mbuckets",
    anchor: "runtime.mProf_FlushLocked",
    ordinal: 0,
};
pub const MPROF_CYCLE: Global = Global {
    symbol: "runtime.mProfCycle",
    anchor: "runtime.mProf_Flush",
    ordinal: 0,
};
pub const MEM_PROFILE_RATE: Global = Global {
    symbol: "runtime.MemProfileRate",
    anchor: "runtime.allocmcache",
    ordinal: 1,
};
pub const ALLGLEN: Global = Global {
    symbol: "runtime.allglen",
    anchor: "runtime.forEachGRace",
    ordinal: 0,
};
pub const ALLGPTR: Global = Global {
    symbol: "runtime.allgptr",
    anchor: "runtime.forEachGRace",
    ordinal: 1,
};
pub const WAIT_REASON_STRINGS: Global = Global {
    symbol: "runtime.waitReasonStrings",
    anchor: "runtime.waitReason.String",
    ordinal: 0,
};

/// Most instructions decoded in one function.
const MAX_INSTRUCTIONS: usize = 4096;

/// A binary's runtime variables, found once.
pub struct Globals<'a> {
    file: &'a object::File<'a>,
    symbols: &'a GoSymbols,
    /// The writable data sections: [start, end) virtual addresses.
    data: Vec<(u64, u64)>,
}

impl<'a> Globals<'a> {
    pub fn new(file: &'a object::File<'a>, symbols: &'a GoSymbols) -> Self {
        let data = [".noptrdata", ".data", ".bss", ".noptrbss"]
            .iter()
            .filter_map(|name| file.section_by_name(name))
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        Globals {
            file,
            symbols,
            data,
        }
    }

    /// The variable's link-time address: its symbol, else its anchor.
    pub fn find(&self, global: Global) -> Option<u64> {
        if let Some(symbol) = self
            .file
            .symbols()
            .find(|s| s.name() == Ok(global.symbol) && s.address() != 0)
        {
            return Some(symbol.address());
        }
        self.references(global.anchor)?
            .into_iter()
            .nth(global.ordinal)
    }

    /// Whether the binary has the function `name` (the pclntab keeps
    /// every function the linker kept).
    pub fn has_function(&self, name: &str) -> bool {
        self.symbols.functions().any(|f| f.name() == name)
    }

    /// The entries in `waitReasonStrings`: the immediate of the compare
    /// that `waitReason.String` begins with (`if w < N`).
    pub fn wait_reason_count(&self) -> Option<usize> {
        let (entry, code) = self.code_of(WAIT_REASON_STRINGS.anchor)?;
        match self.file.architecture() {
            object::Architecture::X86_64 => {
                let mut decoder =
                    iced_x86::Decoder::with_ip(64, code, entry, iced_x86::DecoderOptions::NONE);
                for instruction in decoder.iter().take(16) {
                    if instruction.mnemonic() == iced_x86::Mnemonic::Cmp
                        && instruction.op_count() == 2
                        && instruction.op1_kind() == iced_x86::OpKind::Immediate8
                    {
                        return Some(instruction.immediate8() as usize);
                    }
                }
                None
            }
            object::Architecture::Aarch64 => code.chunks_exact(4).take(16).find_map(|word| {
                let w = u32::from_le_bytes(word.try_into().ok()?);
                // CMP Wn, #imm12 = SUBS WZR, Wn, #imm12 (32-bit, no shift).
                (w & 0xffc0_001f == 0x7100_001f).then_some(((w >> 10) & 0xfff) as usize)
            }),
            _ => None,
        }
    }

    /// The body of function `name` (the largest of several with the same
    /// name: ABI wrappers share their function's name).
    fn code_of(&self, name: &str) -> Option<(u64, &'a [u8])> {
        let function = self
            .symbols
            .functions()
            .filter(|f| f.name() == name)
            .max_by_key(|f| f.end().saturating_sub(f.entry()))?;
        let (entry, end) = (function.entry(), function.end());
        let section = self
            .file
            .sections()
            .find(|s| s.address() <= entry && end <= s.address() + s.size())?;
        let data = section.data().ok()?;
        let start = usize::try_from(entry - section.address()).ok()?;
        let stop = usize::try_from(end - section.address()).ok()?;
        Some((entry, data.get(start..stop)?))
    }

    /// The distinct writable-data addresses function `name` refers to, in
    /// code order.
    fn references(&self, name: &str) -> Option<Vec<u64>> {
        let (entry, code) = self.code_of(name)?;
        let in_data = |a: u64| self.data.iter().any(|&(s, e)| s <= a && a < e);
        let mut seen = HashSet::new();
        let mut targets = Vec::new();
        let mut push = |target: u64| {
            if in_data(target) && seen.insert(target) {
                targets.push(target);
            }
        };
        match self.file.architecture() {
            object::Architecture::X86_64 => {
                let mut decoder =
                    iced_x86::Decoder::with_ip(64, code, entry, iced_x86::DecoderOptions::NONE);
                for instruction in decoder.iter().take(MAX_INSTRUCTIONS) {
                    if instruction.is_ip_rel_memory_operand() {
                        push(instruction.ip_rel_memory_address());
                    }
                }
            }
            object::Architecture::Aarch64 => {
                let words: Vec<u32> = code
                    .chunks_exact(4)
                    .take(MAX_INSTRUCTIONS)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                    .collect();
                for (i, pair) in words.windows(2).enumerate() {
                    let pc = entry + 4 * i as u64;
                    if let Some(target) = adrp_target(pc, pair[0], pair[1]) {
                        push(target);
                    }
                }
            }
            _ => return None,
        }
        Some(targets)
    }
}

/// The address an ADRP and the ADD or load/store after it form, if they
/// use the same register.
fn adrp_target(pc: u64, adrp: u32, next: u32) -> Option<u64> {
    if adrp & 0x9f00_0000 != 0x9000_0000 {
        return None;
    }
    let register = adrp & 0x1f;
    let immhi = ((adrp >> 5) & 0x7_ffff) as u64;
    let immlo = ((adrp >> 29) & 3) as u64;
    let imm = ((immhi << 2) | immlo) as i64;
    // Sign-extend the 21-bit page count.
    let imm = (imm << 43) >> 43;
    let page = (pc & !0xfff).wrapping_add((imm << 12) as u64);
    if (next >> 5) & 0x1f != register {
        return None;
    }
    if next & 0xff80_0000 == 0x9100_0000 {
        // ADD Xd, Xn, #imm12 {, LSL #12}
        let imm12 = ((next >> 10) & 0xfff) as u64;
        let shift = if (next >> 22) & 1 == 1 { 12 } else { 0 };
        return Some(page.wrapping_add(imm12 << shift));
    }
    if next & 0x3b00_0000 == 0x3900_0000 {
        // LDR/STR (unsigned immediate): the offset scales by the size.
        let size = (next >> 30) & 3;
        let imm12 = ((next >> 10) & 0xfff) as u64;
        return Some(page.wrapping_add(imm12 << size));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adrp_pairs_are_decoded() {
        // adrp x1, 0x4c0000 at 0x401000 (+0xbf pages); add x1, x1, #0x120
        let adrp = 0x9000_0000 | (((0xbf >> 2) & 0x7_ffff) << 5) | ((0xbf & 3) << 29) | 1;
        let add = 0x9100_0000 | (0x120 << 10) | (1 << 5) | 1;
        assert_eq!(adrp_target(0x401000, adrp, add), Some(0x4c0120));
        // ldr x0, [x1, #0x18] (size 3: 8-byte units)
        let ldr = 0xf940_0000 | (3 << 10) | (1 << 5);
        assert_eq!(adrp_target(0x401000, adrp, ldr), Some(0x4c0018));
        // Another register: no pair.
        let other = 0x9100_0000 | (0x120 << 10) | (2 << 5) | 2;
        assert_eq!(adrp_target(0x401000, adrp, other), None);
    }
}

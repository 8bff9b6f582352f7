//! Registers as USDT argument specs name them, and where each one lives in
//! the kernel's `struct pt_regs`, which is what a uprobe's BPF program
//! receives.
//!
//! The architecture is a value, not a `cfg!`: the agent reads arm64
//! binaries on x86_64 machines (and the tests check arm64 forms here).

use std::fmt;

use serde::Serialize;

/// The instruction sets whose argument specs we understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    X86_64,
    Arm64,
}

impl Arch {
    /// The architecture of an ELF file, from `e_machine`; `None` for any
    /// other (their notes are still listed, their arguments are not parsed).
    pub fn from_object(architecture: object::Architecture) -> Option<Arch> {
        match architecture {
            object::Architecture::X86_64 => Some(Arch::X86_64),
            object::Architecture::Aarch64 => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// The architecture this agent was built for.
    pub fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// Size of `struct pt_regs` that argument reads must stay inside.
    pub fn pt_regs_size(self) -> u16 {
        match self {
            // 21 slots of 8 bytes, r15 .. ss (arch/x86/include/asm/ptrace.h).
            Arch::X86_64 => 168,
            // user_pt_regs: regs[31], sp, pc, pstate
            // (arch/arm64/include/uapi/asm/ptrace.h).
            Arch::Arm64 => 272,
        }
    }

    /// Looks up a register by the name an argument spec uses, without the
    /// `%` x86 prefix: `rax`, `eax`, `r8d`, `dil`, `x0`, `w3`, `sp`.
    pub fn register(self, name: &str) -> Option<Register> {
        match self {
            Arch::X86_64 => x86_64_register(name),
            Arch::Arm64 => arm64_register(name),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        })
    }
}

/// A register operand: its name as written, the `struct pt_regs` slot
/// holding it, and how many bytes of that slot the name covers (`%eax` is
/// the low 4 bytes of the `ax` slot). Sub-registers are always the low
/// bytes of their slot on both little-endian architectures.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Register {
    pub name: String,
    /// Byte offset of the 8-byte slot in `struct pt_regs`.
    pub pt_regs_offset: u16,
    /// Bytes of the slot this name refers to: 1, 2, 4 or 8.
    pub width: u8,
}

impl fmt::Display for Register {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// x86_64 `struct pt_regs` (arch/x86/include/asm/ptrace.h), slot order
/// r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax ip cs flags
/// sp ss, 8 bytes each. Each row: slot offset, then the names for 8, 4, 2
/// and 1 bytes (gas spellings; `r8l` is AMD's name for `r8b`).
type Names = &'static [&'static str];

const X86_64_SLOTS: &[(u16, Names, Names, Names, Names)] = &[
    (0, &["r15"], &["r15d"], &["r15w"], &["r15b", "r15l"]),
    (8, &["r14"], &["r14d"], &["r14w"], &["r14b", "r14l"]),
    (16, &["r13"], &["r13d"], &["r13w"], &["r13b", "r13l"]),
    (24, &["r12"], &["r12d"], &["r12w"], &["r12b", "r12l"]),
    (32, &["rbp"], &["ebp"], &["bp"], &["bpl"]),
    (40, &["rbx"], &["ebx"], &["bx"], &["bl"]),
    (48, &["r11"], &["r11d"], &["r11w"], &["r11b", "r11l"]),
    (56, &["r10"], &["r10d"], &["r10w"], &["r10b", "r10l"]),
    (64, &["r9"], &["r9d"], &["r9w"], &["r9b", "r9l"]),
    (72, &["r8"], &["r8d"], &["r8w"], &["r8b", "r8l"]),
    (80, &["rax"], &["eax"], &["ax"], &["al"]),
    (88, &["rcx"], &["ecx"], &["cx"], &["cl"]),
    (96, &["rdx"], &["edx"], &["dx"], &["dl"]),
    (104, &["rsi"], &["esi"], &["si"], &["sil"]),
    (112, &["rdi"], &["edi"], &["di"], &["dil"]),
    (128, &["rip"], &["eip"], &["ip"], &[]),
    (152, &["rsp"], &["esp"], &["sp"], &["spl"]),
];

fn x86_64_register(name: &str) -> Option<Register> {
    for (offset, q, d, w, b) in X86_64_SLOTS {
        for (names, width) in [(q, 8), (d, 4), (w, 2), (b, 1)] {
            if names.contains(&name) {
                return Some(Register {
                    name: name.to_string(),
                    pt_regs_offset: *offset,
                    width,
                });
            }
        }
    }
    None
}

/// arm64 `struct user_pt_regs`: x0..x30 at 8*n, sp at 248, pc at 256.
/// `x31` only appears as a base register, where encoding 31 means sp.
fn arm64_register(name: &str) -> Option<Register> {
    let (offset, width) = match name {
        "sp" | "x31" => (248, 8),
        "wsp" => (248, 4),
        "pc" => (256, 8),
        _ => {
            let (width, number) = if let Some(n) = name.strip_prefix('x') {
                (8, n)
            } else if let Some(n) = name.strip_prefix('w') {
                (4, n)
            } else {
                return None;
            };
            // Reject "x", "x01", "x+1": digits only, no leading zero.
            if number.is_empty()
                || !number.bytes().all(|b| b.is_ascii_digit())
                || (number.len() > 1 && number.starts_with('0'))
            {
                return None;
            }
            let n: u16 = number.parse().ok()?;
            if n > 30 {
                return None;
            }
            (8 * n, width)
        }
    };
    Some(Register {
        name: name.to_string(),
        pt_regs_offset: offset,
        width,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(arch: Arch, name: &str) -> (u16, u8) {
        let r = arch
            .register(name)
            .unwrap_or_else(|| panic!("{arch} {name}"));
        (r.pt_regs_offset, r.width)
    }

    #[test]
    fn x86_64_sub_registers_share_a_slot() {
        for (name, offset, width) in [
            ("rax", 80, 8),
            ("eax", 80, 4),
            ("ax", 80, 2),
            ("al", 80, 1),
            ("rdi", 112, 8),
            ("edi", 112, 4),
            ("dil", 112, 1),
            ("rsi", 104, 8),
            ("sil", 104, 1),
            ("rbp", 32, 8),
            ("bpl", 32, 1),
            ("rbx", 40, 8),
            ("rcx", 88, 8),
            ("rdx", 96, 8),
            ("dl", 96, 1),
            ("rsp", 152, 8),
            ("spl", 152, 1),
            ("rip", 128, 8),
            ("r8", 72, 8),
            ("r8d", 72, 4),
            ("r8w", 72, 2),
            ("r8b", 72, 1),
            ("r9", 64, 8),
            ("r10", 56, 8),
            ("r11d", 48, 4),
            ("r12", 24, 8),
            ("r13w", 16, 2),
            ("r14", 8, 8),
            ("r15", 0, 8),
            ("r15b", 0, 1),
        ] {
            assert_eq!(slot(Arch::X86_64, name), (offset, width), "{name}");
        }
    }

    #[test]
    fn arm64_registers() {
        assert_eq!(slot(Arch::Arm64, "x0"), (0, 8));
        assert_eq!(slot(Arch::Arm64, "w0"), (0, 4));
        assert_eq!(slot(Arch::Arm64, "x12"), (96, 8));
        assert_eq!(slot(Arch::Arm64, "x30"), (240, 8));
        assert_eq!(slot(Arch::Arm64, "w30"), (240, 4));
        assert_eq!(slot(Arch::Arm64, "x31"), (248, 8));
        assert_eq!(slot(Arch::Arm64, "sp"), (248, 8));
        assert_eq!(slot(Arch::Arm64, "pc"), (256, 8));
    }

    #[test]
    fn unknown_names_and_cross_arch_names_are_refused() {
        for name in ["x31x", "x32", "x01", "x", "w-1", "eax", "rax", "xmm0"] {
            assert!(Arch::Arm64.register(name).is_none(), "arm64 {name}");
        }
        for name in ["x0", "w0", "xmm0", "ah", "r16", "orig_ax", ""] {
            assert!(Arch::X86_64.register(name).is_none(), "x86_64 {name}");
        }
    }

    #[test]
    fn every_slot_is_inside_pt_regs() {
        for arch in [Arch::X86_64, Arch::Arm64] {
            let names: Vec<String> = match arch {
                Arch::X86_64 => X86_64_SLOTS
                    .iter()
                    .flat_map(|(_, q, d, w, b)| {
                        q.iter()
                            .chain(*d)
                            .chain(*w)
                            .chain(*b)
                            .map(|s| s.to_string())
                    })
                    .collect(),
                Arch::Arm64 => (0..31)
                    .map(|n| format!("x{n}"))
                    .chain(["sp".into(), "pc".into()])
                    .collect(),
            };
            for name in names {
                let r = arch.register(&name).unwrap();
                assert!(r.pt_regs_offset + 8 <= arch.pt_regs_size(), "{arch} {name}");
            }
        }
    }
}

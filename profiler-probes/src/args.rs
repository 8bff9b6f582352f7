//! USDT argument specs: `[-]SIZE[f]@OPERAND`, space separated, as `sys/sdt.h`
//! writes them into each `.note.stapsdt` note (the operand is whatever the
//! compiler chose for the `"nor"` asm constraint, printed in the assembler's
//! syntax).
//!
//! Forms (checked against sdt.h and libbpf's usdt.c):
//! - x86_64 (AT&T syntax): `%reg`, `$imm`, `disp(%base)`, `(%base)`,
//!   `disp(%base,%index,scale)`, `sym(%rip)`, `N+sym(%rip)`.
//! - arm64: `xN`/`wN`/`sp`, `imm`, `[reg]`, `[reg, disp]`.
//!
//! The result tells the BPF side where each value lives: a `struct pt_regs`
//! slot, user memory at a register plus displacement, a constant, or a
//! link-time symbol address (which user space resolves; libbpf rejects
//! `sym(%rip)` and bpftrace 0.17 reads garbage for it).

use std::fmt;

use serde::Serialize;

use super::registers::{Arch, Register};

/// One argument of a probe site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgSpec {
    /// Bytes to read: 1, 2, 4 or 8.
    pub size: u8,
    /// Sign-extend the value to 64 bits (a leading `-` in the spec).
    pub signed: bool,
    /// The value is a float/double (an `f` after the size).
    pub float: bool,
    pub location: Location,
}

/// Where an argument's value is at the probe site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Location {
    /// The value is in a register: read its `pt_regs` slot, keep the low
    /// `size` bytes.
    Register { register: Register },
    /// The value is in user memory at
    /// `base + index * scale + displacement`, each register read from
    /// `pt_regs`; a missing base or index contributes 0.
    Memory {
        base: Option<Register>,
        index: Option<ScaledIndex>,
        displacement: i64,
    },
    /// The value is this constant.
    Immediate { value: i64 },
    /// The value is in user memory at the link-time address of `symbol`
    /// plus `offset` (`sym(%rip)`, `40+sym(%rip)`). `address` is that sum,
    /// filled in from the object's symbol table when the notes are read
    /// from an ELF file (`None` if the symbol is not in .symtab/.dynsym);
    /// at run time add the object's load bias in the process.
    Symbol {
        symbol: String,
        offset: i64,
        address: Option<u64>,
    },
}

/// `%index,scale` of an x86 memory operand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScaledIndex {
    pub register: Register,
    /// 1, 2, 4 or 8.
    pub scale: u8,
}

/// An argument spec that could not be understood, with the text and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("argument spec {text:?} ({arch}): {reason}")]
pub struct ArgSpecError {
    pub text: String,
    pub arch: Arch,
    pub reason: String,
}

impl ArgSpec {
    /// Parses one argument, e.g. `-4@%edi` or `8@[sp, 16]`.
    pub fn parse(text: &str, arch: Arch) -> Result<ArgSpec, ArgSpecError> {
        let fail = |reason: String| ArgSpecError {
            text: text.to_string(),
            arch,
            reason,
        };
        let (head, operand) = text
            .split_once('@')
            .ok_or_else(|| fail("expected SIZE@OPERAND (no '@')".to_string()))?;
        let (signed, head) = match head.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, head),
        };
        let (float, digits) = match head.strip_suffix('f') {
            Some(rest) => (true, rest),
            None => (false, head),
        };
        let size: u8 = match digits {
            "1" => 1,
            "2" => 2,
            "4" => 4,
            "8" => 8,
            _ => {
                return Err(fail(format!(
                    "size {head:?} is not one of 1, 2, 4, 8 (optionally signed with '-', \
                     float with 'f')"
                )));
            }
        };
        if float && size < 4 {
            return Err(fail(format!("a float argument of {size} bytes")));
        }
        let operand = operand.trim();
        if operand.is_empty() {
            return Err(fail("empty operand after '@'".to_string()));
        }
        let location = match arch {
            Arch::X86_64 => x86_64_operand(operand),
            Arch::Arm64 => arm64_operand(operand),
        }
        .map_err(fail)?;
        Ok(ArgSpec {
            size,
            signed,
            float,
            location,
        })
    }

    /// The `pt_regs` offset of the register holding the value, when the
    /// value is in a register.
    pub fn register_offset(&self) -> Option<u16> {
        match &self.location {
            Location::Register { register } => Some(register.pt_regs_offset),
            _ => None,
        }
    }
}

/// Parses a note's whole argument string. Arguments are separated by
/// spaces, except inside brackets: arm64 writes `8@[sp, 16]`.
pub fn parse_args(text: &str, arch: Arch) -> Result<Vec<ArgSpec>, ArgSpecError> {
    split_args(text)
        .into_iter()
        .map(|arg| ArgSpec::parse(arg, arch))
        .collect()
}

/// Splits an argument string at spaces outside `[...]` and `(...)`.
pub fn split_args(text: &str) -> Vec<&str> {
    let mut args = Vec::new();
    let mut depth = 0usize;
    let mut start = None;
    for (i, c) in text.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if c.is_whitespace() && depth == 0 {
            if let Some(s) = start.take() {
                args.push(&text[s..i]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        args.push(&text[s..]);
    }
    args
}

/// Decimal or `0x` hex, optionally negative. Values up to `u64::MAX` are
/// accepted and wrap (an immediate `$0xffffffffffffffff` is -1).
fn parse_int(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => digits.parse::<u64>().ok()?,
    };
    let value = magnitude as i64;
    Some(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

fn x86_register(text: &str) -> Result<Register, String> {
    let name = text
        .strip_prefix('%')
        .ok_or_else(|| format!("expected a register like %rax, found {text:?}"))?;
    if let Some(register) = Arch::X86_64.register(name) {
        return Ok(register);
    }
    Err(match name {
        "ah" | "bh" | "ch" | "dh" => {
            format!("%{name} is the high byte of a register, which is not supported")
        }
        _ if name.starts_with("xmm") || name.starts_with("ymm") || name.starts_with("st") => {
            format!("%{name} is not saved in struct pt_regs")
        }
        _ => format!("unknown x86_64 register %{name}"),
    })
}

fn is_symbol(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '.')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$')
}

/// `sym`, `sym+N`, `sym-N`, `N+sym`: the symbol and the offset.
fn symbol_expression(text: &str) -> Option<(String, i64)> {
    if is_symbol(text) {
        return Some((text.to_string(), 0));
    }
    // N+sym: the number comes first (may itself start with '-', so look
    // for the '+' after the first character).
    if let Some((plus, _)) = text.char_indices().skip(1).find(|&(_, c)| c == '+') {
        let (left, right) = (&text[..plus], &text[plus + 1..]);
        if let (Some(n), true) = (parse_int(left), is_symbol(right)) {
            return Some((right.to_string(), n));
        }
        if let (true, Some(n)) = (is_symbol(left), parse_int(right)) {
            return Some((left.to_string(), n));
        }
    }
    if let Some((left, right)) = text.split_once('-')
        && is_symbol(left)
        && let Some(n) = parse_int(right)
    {
        return Some((left.to_string(), n.wrapping_neg()));
    }
    None
}

fn x86_64_operand(operand: &str) -> Result<Location, String> {
    if let Some(imm) = operand.strip_prefix('$') {
        return parse_int(imm)
            .map(|value| Location::Immediate { value })
            .ok_or_else(|| format!("immediate {operand:?} is not a number"));
    }
    if operand.starts_with('%') {
        if operand.contains(':') {
            return Err(format!(
                "segment-relative operand {operand:?} (thread-local storage) is not supported"
            ));
        }
        return x86_register(operand).map(|register| Location::Register { register });
    }
    let Some(open) = operand.find('(') else {
        // An absolute address: a number or a symbol (non-PIC code).
        if let Some(displacement) = parse_int(operand) {
            return Ok(Location::Memory {
                base: None,
                index: None,
                displacement,
            });
        }
        return symbol_expression(operand)
            .map(|(symbol, offset)| Location::Symbol {
                symbol,
                offset,
                address: None,
            })
            .ok_or_else(|| format!("cannot read operand {operand:?}"));
    };
    let inner = operand[open + 1..]
        .strip_suffix(')')
        .ok_or_else(|| format!("memory operand {operand:?} does not end with ')'"))?;
    let displacement_text = &operand[..open];
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return Err(format!(
            "memory operand {operand:?} has more than base,index,scale"
        ));
    }
    let base = match parts[0] {
        "" => None,
        text => Some(x86_register(text)?),
    };
    if base.as_ref().is_some_and(|b| b.pt_regs_offset == 128) {
        // %rip-relative: the assembler resolved the displacement against
        // the next instruction, so only the symbol form is meaningful here.
        if parts.len() > 1 {
            return Err(format!(
                "%rip cannot be combined with an index in {operand:?}"
            ));
        }
        return symbol_expression(displacement_text)
            .map(|(symbol, offset)| Location::Symbol {
                symbol,
                offset,
                address: None,
            })
            .ok_or_else(|| {
                format!(
                    "%rip-relative operand {operand:?} needs a symbol (a numeric displacement \
                     depends on the instruction's length)"
                )
            });
    }
    let displacement = match displacement_text {
        "" => 0,
        text => parse_int(text)
            .ok_or_else(|| format!("displacement {text:?} of {operand:?} is not a number"))?,
    };
    let index = match parts.get(1) {
        None => None,
        Some(text) => {
            let register = x86_register(text)?;
            let scale = match parts.get(2).copied() {
                None | Some("") => 1,
                Some("1") => 1,
                Some("2") => 2,
                Some("4") => 4,
                Some("8") => 8,
                Some(other) => {
                    return Err(format!(
                        "scale {other:?} of {operand:?} is not 1, 2, 4 or 8"
                    ));
                }
            };
            Some(ScaledIndex { register, scale })
        }
    };
    if base.is_none() && index.is_none() {
        return Err(format!("memory operand {operand:?} has no register"));
    }
    Ok(Location::Memory {
        base,
        index,
        displacement,
    })
}

fn arm64_register(text: &str) -> Result<Register, String> {
    Arch::Arm64.register(text).ok_or_else(|| {
        if text.starts_with(['v', 'd', 's', 'q', 'b', 'h']) {
            format!("{text} is not a general-purpose register (not in struct pt_regs)")
        } else {
            format!("unknown arm64 register {text:?}")
        }
    })
}

fn arm64_operand(operand: &str) -> Result<Location, String> {
    if let Some(inner) = operand.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("memory operand {operand:?} does not end with ']'"))?;
        let mut parts = inner.split(',').map(str::trim);
        let base = arm64_register(parts.next().unwrap_or_default())?;
        let displacement = match parts.next() {
            None => 0,
            Some(text) => {
                let text = text.strip_prefix('#').unwrap_or(text);
                if text.starts_with(':') {
                    // gcc -O2 writes `[x0, #:lo12:.LANCHOR0]` for globals: the
                    // low 12 bits of an assembler-local label's address, a
                    // relocation whose value the note does not contain.
                    return Err(format!(
                        "offset {text:?} of {operand:?} is a link-time relocation whose value \
                         is not recorded in the note; this argument cannot be read"
                    ));
                }
                parse_int(text)
                    .ok_or_else(|| format!("offset {text:?} of {operand:?} is not a number"))?
            }
        };
        if parts.next().is_some() {
            return Err(format!(
                "memory operand {operand:?} has more than a base and an offset"
            ));
        }
        return Ok(Location::Memory {
            base: Some(base),
            index: None,
            displacement,
        });
    }
    let immediate = operand.strip_prefix('#').unwrap_or(operand);
    if let Some(value) = parse_int(immediate) {
        return Ok(Location::Immediate { value });
    }
    if operand == "x31" || operand == "w31" {
        // Register 31 is sp only as an address base; as a value it would be
        // the zero register, which gcc writes as an immediate instead.
        return Err(format!(
            "register {operand} outside [...] is not a valid operand"
        ));
    }
    arm64_register(operand).map(|register| Location::Register { register })
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Register { register } => write!(f, "{register}"),
            Location::Immediate { value } => write!(f, "{value}"),
            Location::Symbol { symbol, offset, .. } => match offset {
                0 => write!(f, "[{symbol}]"),
                _ => write!(f, "[{symbol}{offset:+}]"),
            },
            Location::Memory {
                base,
                index,
                displacement,
            } => {
                let mut terms = Vec::new();
                if let Some(base) = base {
                    terms.push(base.name.clone());
                }
                if let Some(index) = index {
                    terms.push(format!("{}*{}", index.register.name, index.scale));
                }
                let mut text = terms.join("+");
                if *displacement != 0 || text.is_empty() {
                    text.push_str(&format!("{displacement:+}"));
                }
                write!(f, "[{text}]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(arch: Arch, name: &str) -> Register {
        arch.register(name).unwrap()
    }

    fn parse(text: &str, arch: Arch) -> ArgSpec {
        ArgSpec::parse(text, arch).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn x86_64_register_forms() {
        let a = parse("-4@%edi", Arch::X86_64);
        assert_eq!((a.size, a.signed, a.float), (4, true, false));
        assert_eq!(a.register_offset(), Some(112));
        let a = parse("1@%dil", Arch::X86_64);
        assert_eq!((a.size, a.signed), (1, false));
        assert_eq!(a.register_offset(), Some(112));
        let a = parse("8f@%rsi", Arch::X86_64);
        assert_eq!((a.size, a.signed, a.float), (8, false, true));
        assert_eq!(a.register_offset(), Some(104));
        let a = parse("-2@%r8w", Arch::X86_64);
        assert_eq!(a.register_offset(), Some(72));
        let a = parse("8@%rax", Arch::X86_64);
        assert_eq!(a.register_offset(), Some(80));
    }

    #[test]
    fn x86_64_immediates() {
        let a = parse("-4@$8192", Arch::X86_64);
        assert_eq!(a.location, Location::Immediate { value: 8192 });
        assert_eq!(
            parse("-4@$-1", Arch::X86_64).location,
            Location::Immediate { value: -1 }
        );
        assert_eq!(
            parse("8@$0x10", Arch::X86_64).location,
            Location::Immediate { value: 16 }
        );
        assert_eq!(
            parse("8@$0xffffffffffffffff", Arch::X86_64).location,
            Location::Immediate { value: -1 }
        );
    }

    #[test]
    fn x86_64_memory_forms() {
        let x = Arch::X86_64;
        assert_eq!(
            parse("8@-16(%rbp)", x).location,
            Location::Memory {
                base: Some(reg(x, "rbp")),
                index: None,
                displacement: -16
            }
        );
        assert_eq!(
            parse("8@(%rsp)", x).location,
            Location::Memory {
                base: Some(reg(x, "rsp")),
                index: None,
                displacement: 0
            }
        );
        assert_eq!(
            parse("-4@112(%rsp)", x).location,
            Location::Memory {
                base: Some(reg(x, "rsp")),
                index: None,
                displacement: 112
            }
        );
        assert_eq!(
            parse("-4@(%rcx,%rax,4)", x).location,
            Location::Memory {
                base: Some(reg(x, "rcx")),
                index: Some(ScaledIndex {
                    register: reg(x, "rax"),
                    scale: 4
                }),
                displacement: 0
            }
        );
        assert_eq!(
            parse("8@0x10(%rbx,%r12)", x).location,
            Location::Memory {
                base: Some(reg(x, "rbx")),
                index: Some(ScaledIndex {
                    register: reg(x, "r12"),
                    scale: 1
                }),
                displacement: 16
            }
        );
        assert_eq!(
            parse("8@-8(,%rdx,8)", x).location,
            Location::Memory {
                base: None,
                index: Some(ScaledIndex {
                    register: reg(x, "rdx"),
                    scale: 8
                }),
                displacement: -8
            }
        );
    }

    #[test]
    fn x86_64_symbol_forms() {
        let x = Arch::X86_64;
        assert_eq!(
            parse("-8@sym(%rip)", x).location,
            Location::Symbol {
                symbol: "sym".into(),
                offset: 0,
                address: None
            }
        );
        assert_eq!(
            parse("-4@40+Sym(%rip)", x).location,
            Location::Symbol {
                symbol: "Sym".into(),
                offset: 40,
                address: None
            }
        );
        assert_eq!(
            parse("4@counter.lto_priv.0+8(%rip)", x).location,
            Location::Symbol {
                symbol: "counter.lto_priv.0".into(),
                offset: 8,
                address: None
            }
        );
        assert_eq!(
            parse("4@table-4(%rip)", x).location,
            Location::Symbol {
                symbol: "table".into(),
                offset: -4,
                address: None
            }
        );
        assert_eq!(
            parse("4@global_var", x).location,
            Location::Symbol {
                symbol: "global_var".into(),
                offset: 0,
                address: None
            }
        );
    }

    #[test]
    fn arm64_forms() {
        let a = Arch::Arm64;
        let arg = parse("-4@x0", a);
        assert_eq!((arg.size, arg.signed), (4, true));
        assert_eq!(arg.register_offset(), Some(0));
        assert_eq!(parse("4@w7", a).register_offset(), Some(56));
        assert_eq!(parse("4@5", a).location, Location::Immediate { value: 5 });
        assert_eq!(
            parse("-8@-3", a).location,
            Location::Immediate { value: -3 }
        );
        assert_eq!(
            parse("8@[x12]", a).location,
            Location::Memory {
                base: Some(reg(a, "x12")),
                index: None,
                displacement: 0
            }
        );
        let m = parse("-4@[x31,-40]", a);
        assert_eq!(
            m.location,
            Location::Memory {
                base: Some(reg(a, "x31")),
                index: None,
                displacement: -40
            }
        );
        let Location::Memory { base, .. } = &m.location else {
            unreachable!()
        };
        assert_eq!(base.as_ref().unwrap().pt_regs_offset, 248);
        assert_eq!(
            parse("8@[sp, 16]", a).location,
            Location::Memory {
                base: Some(reg(a, "sp")),
                index: None,
                displacement: 16
            }
        );
        assert!(parse("8f@x1", a).float);
    }

    #[test]
    fn whole_argument_strings_split_outside_brackets() {
        assert_eq!(
            split_args("8@[sp, 16] -4@x0  4@5"),
            vec!["8@[sp, 16]", "-4@x0", "4@5"]
        );
        let args = parse_args("8@%rbx 8@%r15", Arch::X86_64).unwrap();
        assert_eq!(args.len(), 2);
        assert_eq!(args[1].register_offset(), Some(0));
        let args = parse_args("-4@[x31,-40] 8@[sp, 16] -4@x0", Arch::Arm64).unwrap();
        assert_eq!(args.len(), 3);
        assert!(parse_args("", Arch::X86_64).unwrap().is_empty());
        assert!(parse_args("  ", Arch::Arm64).unwrap().is_empty());
    }

    #[test]
    fn bad_specs_are_errors_that_say_why() {
        for (text, arch, why) in [
            ("%edi", Arch::X86_64, "no '@'"),
            ("3@%edi", Arch::X86_64, "size"),
            ("-@%edi", Arch::X86_64, "size"),
            ("16@%edi", Arch::X86_64, "size"),
            ("1f@%dil", Arch::X86_64, "float"),
            ("4@", Arch::X86_64, "empty"),
            ("4@%foo", Arch::X86_64, "unknown x86_64 register %foo"),
            ("4@%ah", Arch::X86_64, "high byte"),
            ("8f@%xmm0", Arch::X86_64, "pt_regs"),
            ("4@$abc", Arch::X86_64, "not a number"),
            ("4@8(%rip)", Arch::X86_64, "needs a symbol"),
            ("4@(%rcx,%rax,3)", Arch::X86_64, "scale"),
            ("4@(%rcx", Arch::X86_64, "')'"),
            ("4@%fs:0x28", Arch::X86_64, "segment"),
            ("4@1x", Arch::X86_64, "cannot read"),
            ("4@%edi", Arch::Arm64, "unknown arm64 register"),
            ("4@x31", Arch::Arm64, "register"),
            ("4@[x1, 8", Arch::Arm64, "']'"),
            ("4@[x1, y]", Arch::Arm64, "not a number"),
            ("8@d0", Arch::Arm64, "general-purpose"),
            // Written by aarch64 gcc 12 -O2 for a global (our fixture).
            (
                "-4@[x0, #:lo12:.LANCHOR0]",
                Arch::Arm64,
                "link-time relocation",
            ),
        ] {
            let error = ArgSpec::parse(text, arch).unwrap_err();
            let message = error.to_string();
            assert!(message.contains(why), "{text}: {message}");
            assert!(message.contains(text), "{text}: {message}");
        }
    }

    #[test]
    fn arbitrary_text_never_panics() {
        // Every operand of up to 4 characters over an alphabet of the
        // syntax's own characters (and a multi-byte one).
        let alphabet: Vec<char> = "%$()[],+-:#0x1ré ".chars().collect();
        let mut operands = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = operands
                .iter()
                .flat_map(|o| alphabet.iter().map(move |c| format!("{o}{c}")))
                .collect();
            operands.extend(longer);
            operands.dedup();
        }
        for operand in &operands {
            for arch in [Arch::X86_64, Arch::Arm64] {
                let _ = ArgSpec::parse(&format!("-4@{operand}"), arch);
                let _ = ArgSpec::parse(operand, arch);
                let _ = parse_args(operand, arch);
            }
        }
    }

    #[test]
    fn locations_display_readably() {
        assert_eq!(
            parse("-4@(%rcx,%rax,4)", Arch::X86_64).location.to_string(),
            "[rcx+rax*4]"
        );
        assert_eq!(
            parse("8@-16(%rbp)", Arch::X86_64).location.to_string(),
            "[rbp-16]"
        );
        assert_eq!(
            parse("4@40+Sym(%rip)", Arch::X86_64).location.to_string(),
            "[Sym+40]"
        );
        assert_eq!(
            parse("8@[sp, 16]", Arch::Arm64).location.to_string(),
            "[sp+16]"
        );
    }
}

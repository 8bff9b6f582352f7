//! Field offsets of the running kernel's structs, from its BTF
//! (`/sys/kernel/btf/vmlinux`): what a BPF program that reads a
//! `task_struct` by hand is told at load time, instead of assuming one
//! kernel's layout.
//!
//! The types are read in place from the file's bytes, with an index of
//! where each one starts: a general BTF library that builds every type as
//! an object took 50 MiB for a 6 MiB vmlinux BTF, most of the agent's
//! peak memory at start, for the two or three offsets asked for here.

use std::fmt;

/// Where the running kernel describes its types.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// BTF kinds this reader follows (linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Nested anonymous members followed at most this deep (a loop in a
/// malformed file ends here).
const MAX_NESTING: u32 = 16;

/// The kernel's BTF, parsed once for several lookups.
pub struct KernelBtf {
    data: Vec<u8>,
    /// Byte ranges of the type and string sections in `data`.
    types: (usize, usize),
    strings: (usize, usize),
    /// Where type id `i + 1` starts, relative to the type section.
    starts: Vec<u32>,
}

/// Why an offset is unknown, in words that name the struct and member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BtfError(pub String);

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BtfError {}

/// One type's fixed part: its name, kind, member count, and the size or
/// type it refers to.
#[derive(Clone, Copy)]
struct TypeHeader {
    name: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    size_or_type: u32,
    /// Offset of what follows the fixed part, in the type section.
    rest: usize,
}

impl KernelBtf {
    /// Reads the running kernel's BTF.
    pub fn load() -> Result<KernelBtf, BtfError> {
        let data = std::fs::read(KERNEL_BTF)
            .map_err(|e| BtfError(format!("reading {KERNEL_BTF}: {e}")))?;
        KernelBtf::parse(data).map_err(|e| BtfError(format!("reading {KERNEL_BTF}: {e}")))
    }

    /// BTF from its bytes (the header, types and strings of one object).
    pub fn parse(data: Vec<u8>) -> Result<KernelBtf, String> {
        let u16_at = |at: usize| -> Option<u16> {
            Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
        };
        if u16_at(0) != Some(0xeb9f) {
            return Err("not BTF (no magic 0xeb9f, or not little-endian)".into());
        }
        let word = |at: usize| read_u32(&data, at).ok_or("header cut short");
        let header_len = word(4)? as usize;
        let section = |offset: usize, len: usize| -> Result<(usize, usize), String> {
            let start = header_len
                .checked_add(word(offset)? as usize)
                .ok_or("section offset overflows")?;
            let end = start
                .checked_add(word(len)? as usize)
                .filter(|&end| end <= data.len())
                .ok_or("a section runs past the end of the file")?;
            Ok((start, end))
        };
        let types = section(8, 12)?;
        let strings = section(16, 20)?;
        let mut btf = KernelBtf {
            data,
            types,
            strings,
            starts: Vec::new(),
        };
        let mut at = 0usize;
        let section_len = types.1 - types.0;
        while at < section_len {
            let header = btf
                .header_at(at)
                .ok_or_else(|| format!("type {} cut short", btf.starts.len() + 1))?;
            btf.starts.push(at as u32);
            at = header.rest + extra_bytes(&header)?;
            if at > section_len {
                return Err(format!(
                    "type {} runs past the type section",
                    btf.starts.len()
                ));
            }
        }
        Ok(btf)
    }

    /// Byte offset of `member` in `struct name`, looking into anonymous
    /// structs and unions (kernels built with structure randomization
    /// nest members).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        let found = (1..=self.starts.len() as u32)
            .filter_map(|id| self.header(id))
            .find(|t| t.kind == KIND_STRUCT && self.name(t.name) == Some(name))
            .ok_or_else(|| BtfError(format!("no struct {name} in {KERNEL_BTF}")))?;
        self.nested_offset(&found, member, 0)
            .ok_or_else(|| BtfError(format!("struct {name} has no member `{member}`")))
    }

    fn nested_offset(&self, st: &TypeHeader, name: &str, depth: u32) -> Option<u32> {
        if depth > MAX_NESTING {
            return None;
        }
        for i in 0..st.vlen as usize {
            let at = self.types.0 + st.rest + i * 12;
            let member_name = read_u32(&self.data, at)?;
            let member_type = read_u32(&self.data, at + 4)?;
            let raw_offset = read_u32(&self.data, at + 8)?;
            // With the kind flag, the top byte is a bitfield's size.
            let bits = if st.kind_flag {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            };
            let member_name = self.name(member_name).unwrap_or_default();
            if member_name == name {
                return Some(bits / 8);
            }
            if member_name.is_empty() {
                let Some(nested) = self.resolved(member_type) else {
                    continue;
                };
                if nested.kind != KIND_STRUCT && nested.kind != KIND_UNION {
                    continue;
                }
                if let Some(offset) = self.nested_offset(&nested, name, depth + 1) {
                    return Some(bits / 8 + offset);
                }
            }
        }
        None
    }

    /// Type `id` with typedefs and qualifiers followed.
    fn resolved(&self, mut id: u32) -> Option<TypeHeader> {
        for _ in 0..MAX_NESTING {
            let header = self.header(id)?;
            match header.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = header.size_or_type;
                }
                _ => return Some(header),
            }
        }
        None
    }

    fn header(&self, id: u32) -> Option<TypeHeader> {
        let at = *self.starts.get((id as usize).checked_sub(1)?)?;
        self.header_at(at as usize)
    }

    /// The fixed part of the type at byte `at` of the type section.
    fn header_at(&self, at: usize) -> Option<TypeHeader> {
        let base = self.types.0 + at;
        if base + 12 > self.types.1 {
            return None;
        }
        let info = read_u32(&self.data, base + 4)?;
        Some(TypeHeader {
            name: read_u32(&self.data, base)?,
            kind: (info >> 24) & 0x1f,
            vlen: info & 0xffff,
            kind_flag: info >> 31 != 0,
            size_or_type: read_u32(&self.data, base + 8)?,
            rest: at + 12,
        })
    }

    /// The string at `offset` of the string section.
    fn name(&self, offset: u32) -> Option<&str> {
        let start = self.strings.0.checked_add(offset as usize)?;
        let bytes = self.data.get(start..self.strings.1)?;
        let end = bytes.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&bytes[..end]).ok()
    }
}

/// Bytes a type takes after its fixed part, by kind.
fn extra_bytes(header: &TypeHeader) -> Result<usize, String> {
    let vlen = header.vlen as usize;
    Ok(match header.kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => vlen * 12,
        KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT,
        // TYPE_TAG: nothing more.
        2 | 7..=12 | 16 | KIND_TYPE_TAG => 0,
        other => return Err(format!("unknown BTF kind {other}")),
    })
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        data.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (each its fixed part and extra words) and
    /// `strings` (NUL-separated, starting with the empty one).
    fn blob(types: &[Vec<u32>], strings: &[u8]) -> Vec<u8> {
        let type_bytes: Vec<u8> = types
            .iter()
            .flatten()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let mut data = Vec::new();
        data.extend_from_slice(&0xeb9fu16.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        for word in [
            24,
            0,
            type_bytes.len() as u32,
            type_bytes.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&u32::to_le_bytes(word));
        }
        data.extend_from_slice(&type_bytes);
        data.extend_from_slice(strings);
        data
    }

    fn info(kind: u32, vlen: u32) -> u32 {
        (kind << 24) | vlen
    }

    #[test]
    fn finds_members_directly_and_in_anonymous_unions_through_typedefs() {
        // Strings: 1 "int", 5 "task", 10 "pid", 14 "thread", 21 "anon_t".
        let strings = b"\0int\0task\0pid\0thread\0anon_t\0";
        let types = vec![
            // 1: int
            vec![1, info(KIND_INT, 0), 4, 32],
            // 2: union { int thread at byte 0 } (anonymous)
            vec![0, info(KIND_UNION, 1), 8, 14, 1, 0],
            // 3: typedef anon_t = 2
            vec![21, info(KIND_TYPEDEF, 0), 2],
            // 4: const 3
            vec![0, info(KIND_CONST, 0), 3],
            // 5: struct task { int pid at 8; <anon> at 64 (type 4) }
            vec![5, info(KIND_STRUCT, 2), 80, 10, 1, 8 * 8, 0, 4, 64 * 8],
        ];
        let btf = KernelBtf::parse(blob(&types, strings)).unwrap();
        assert_eq!(btf.member_offset("task", "pid").unwrap(), 8);
        assert_eq!(btf.member_offset("task", "thread").unwrap(), 64);
        assert!(
            btf.member_offset("task", "missing")
                .unwrap_err()
                .0
                .contains("no member `missing`")
        );
        assert!(btf.member_offset("nothing", "pid").is_err());
    }

    #[test]
    fn bitfield_offsets_drop_their_size_byte() {
        let strings = b"\0int\0s\0flags\0";
        let types = vec![
            vec![1, info(KIND_INT, 0), 4, 32],
            // kind flag set: offset word = size 3 << 24 | bit 40
            vec![5, info(KIND_STRUCT, 1) | (1 << 31), 8, 7, 1, (3 << 24) | 40],
        ];
        let btf = KernelBtf::parse(blob(&types, strings)).unwrap();
        assert_eq!(btf.member_offset("s", "flags").unwrap(), 5);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(KernelBtf::parse(Vec::new()).is_err());
        assert!(KernelBtf::parse(vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
        let strings = b"\0s\0";
        // A struct claiming more members than the section holds.
        let mut data = blob(&[vec![1, info(KIND_STRUCT, 500), 8]], strings);
        assert!(KernelBtf::parse(data.clone()).is_err());
        // An unknown kind.
        data = blob(&[vec![1, info(30, 0), 8]], strings);
        assert!(KernelBtf::parse(data).is_err());
        // A typedef loop.
        let loop_types = vec![
            vec![0, info(KIND_TYPEDEF, 0), 2],
            vec![0, info(KIND_TYPEDEF, 0), 1],
            vec![1, info(KIND_STRUCT, 1), 8, 0, 1, 0],
        ];
        let btf = KernelBtf::parse(blob(&loop_types, strings)).unwrap();
        assert!(btf.member_offset("s", "x").is_err());
    }

    #[test]
    fn the_running_kernels_task_struct() {
        if !std::path::Path::new(KERNEL_BTF).exists() {
            // Off CI, a kernel without BTF skips this; CI must have one.
            assert!(
                std::env::var_os("CI").is_none(),
                "{KERNEL_BTF} is missing: the off-CPU profiler and Go labels need it"
            );
            return;
        }
        let btf = KernelBtf::load().unwrap();
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        // pid_t pid; pid_t tgid; sit next to each other in every kernel.
        assert_eq!(tgid, pid + 4);
        assert!(btf.member_offset("task_struct", "thread").unwrap() > tgid);
    }
}

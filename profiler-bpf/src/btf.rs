//! Field offsets of the running kernel's structs, from its BTF
//! (`/sys/kernel/btf/vmlinux`): what a BPF program that reads a
//! `task_struct` by hand is told at load time, instead of assuming one
//! kernel's layout.

use std::fmt;

/// Where the running kernel describes its types.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel's BTF, parsed once for several lookups.
pub struct KernelBtf {
    btf: btf_rs::Btf,
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

impl KernelBtf {
    /// Reads the running kernel's BTF.
    pub fn load() -> Result<KernelBtf, BtfError> {
        btf_rs::Btf::from_file(KERNEL_BTF)
            .map(|btf| KernelBtf { btf })
            .map_err(|e| BtfError(format!("reading {KERNEL_BTF}: {e}")))
    }

    /// Byte offset of `member` in `struct name`, looking into anonymous
    /// structs and unions (kernels built with structure randomization
    /// nest members).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        let found = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| BtfError(format!("no struct {name} in {KERNEL_BTF}: {e}")))?
            .into_iter()
            .find_map(|t| match t {
                btf_rs::Type::Struct(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| BtfError(format!("no struct {name} in {KERNEL_BTF}")))?;
        nested_offset(&self.btf, &found, member)
            .ok_or_else(|| BtfError(format!("struct {name} has no member `{member}`")))
    }
}

fn nested_offset(btf: &btf_rs::Btf, st: &btf_rs::Struct, name: &str) -> Option<u32> {
    for member in &st.members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        if member_name == name {
            return Some(member.bit_offset() / 8);
        }
        if member_name.is_empty() {
            let nested = match btf.resolve_chained_type(member).ok()? {
                btf_rs::Type::Struct(s) | btf_rs::Type::Union(s) => s,
                _ => continue,
            };
            if let Some(offset) = nested_offset(btf, &nested, name) {
                return Some(member.bit_offset() / 8 + offset);
            }
        }
    }
    None
}

//! Every architecture-specific rule of user-space unwinding, for the
//! target the agent is built for. The BPF side's register layout lives in
//! `profiler-ebpf/src/arch.rs`.

/// An address inside the call instruction that returns to
/// `return_address`. x86_64 calls are variable-length, so one byte back is
/// the only safe choice; arm64 instructions are 4 bytes, and the BL is the
/// word before the return address.
#[cfg(target_arch = "x86_64")]
pub fn call_site(return_address: u64) -> u64 {
    return_address.saturating_sub(1)
}

#[cfg(target_arch = "aarch64")]
pub fn call_site(return_address: u64) -> u64 {
    return_address.saturating_sub(4)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("profiler-agent supports x86_64 and aarch64");

//! Every access to the architecture's register and frame layout on the BPF
//! side.
//!
//! The user registers of the current task live in its saved `pt_regs` at the
//! top of its kernel stack (`bpf_task_pt_regs`); that is right both when the
//! sample interrupted user code and when it interrupted a system call.
//! Offsets are those of `struct pt_regs` (x86_64: arch/x86/include/asm/ptrace.h;
//! arm64: `struct user_pt_regs` at the start of arch/arm64's pt_regs).

use aya_ebpf::helpers::{bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs};
use profiler_common::UserRegs;

#[cfg(bpf_target_arch = "x86_64")]
mod layout {
    pub const PC: usize = 16 * 8; // ip
    pub const SP: usize = 19 * 8; // sp
    pub const FP: usize = 4 * 8; // bp
    pub const LR: Option<usize> = None;
    /// End of the user half of the address space (TASK_SIZE_MAX, 4-level).
    pub const USER_LIMIT: u64 = 0x0000_7fff_ffff_f000;
    /// Unwind-table rows follow x86_64 rules (return address at CFA - 8).
    pub const TABLE_UNWINDING: bool = true;
}

#[cfg(bpf_target_arch = "aarch64")]
mod layout {
    pub const PC: usize = 32 * 8; // pc, after regs[31] and sp
    pub const SP: usize = 31 * 8; // sp
    pub const FP: usize = 29 * 8; // x29
    pub const LR: Option<usize> = Some(30 * 8); // x30
    /// End of the user half of the address space (52-bit VAs at most).
    pub const USER_LIMIT: u64 = 1 << 52;
    /// arm64 keeps the return address in LR until a frame saves it; table
    /// rows for arm64 are not produced yet, so only frame pointers walk.
    pub const TABLE_UNWINDING: bool = false;
}

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!(
    "profiler-ebpf supports x86_64 and aarch64 (set by aya-build from the agent's target)"
);

pub use layout::{TABLE_UNWINDING, USER_LIMIT};

/// A frame record, `push rbp; mov rbp, rsp` on x86_64 and
/// `stp x29, x30, [sp, #-16]!; mov x29, sp` on arm64, is the same two
/// words: the caller's frame pointer, then the return address.
pub const FRAME_RECORD_CALLER_FP: u64 = 0;
pub const FRAME_RECORD_RETURN_ADDRESS: u64 = 8;
pub const FRAME_RECORD_SIZE: u64 = 16;

#[inline(always)]
fn read_at(base: *const u8, offset: usize) -> u64 {
    // SAFETY: bpf_probe_read_kernel validates the address; a failed read
    // yields 0, which the unwinder treats as "unknown".
    unsafe { bpf_probe_read_kernel(base.add(offset).cast::<u64>()) }.unwrap_or(0)
}

/// The current task's user-space registers.
#[inline(always)]
pub fn user_regs() -> UserRegs {
    // SAFETY: both helpers take and return kernel pointers the verifier
    // tracks; we only read through bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    if regs.is_null() {
        return UserRegs::default();
    }
    UserRegs {
        pc: read_at(regs, layout::PC),
        sp: read_at(regs, layout::SP),
        fp: read_at(regs, layout::FP),
        lr: match layout::LR {
            Some(offset) => read_at(regs, offset),
            None => 0,
        },
    }
}

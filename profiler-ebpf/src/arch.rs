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
    /// r14: Go's g register (ABIInternal, Go 1.17+).
    pub const GO_G: usize = 8;
    /// End of the user half of the address space (TASK_SIZE_MAX, 4-level).
    pub const USER_LIMIT: u64 = 0x0000_7fff_ffff_f000;
    /// No pointer authentication: return addresses are plain.
    pub const ADDRESS_MASK: u64 = u64::MAX;

    /// orig_ax: the system call number, or negative (an interrupt's
    /// vector, -1) — but a page fault stores its error code there too.
    pub const SYSCALL_NR: usize = 15 * 8;
    /// cx and r11: the `syscall` instruction leaves the return address in
    /// rcx and the flags in r11, and entry_SYSCALL_64 saves both, so a
    /// frame entered by `syscall` has cx == ip and r11 == flags (the
    /// kernel's own test for returning with SYSRET).
    pub const SYSCALL_CX: Option<(usize, usize)> = Some((11 * 8, 6 * 8));
    pub const FLAGS: usize = 18 * 8;

    /// Registers in a signal frame, from the SP of its trampoline frame
    /// (`__restore_rt`): the handler's `ret` popped `rt_sigframe.pretcode`,
    /// so SP points at its `struct ucontext`, whose `uc_mcontext` (struct
    /// sigcontext) starts 40 bytes in (uc_flags, uc_link, uc_stack);
    /// rbp, rsp and rip are its words 10, 15 and 16
    /// (arch/x86/include/uapi/asm/sigcontext.h; glibc's CFI for
    /// `__restore_rt` reads rsp at the same 160).
    pub const SIGNAL_FP: u64 = 40 + 10 * 8;
    pub const SIGNAL_SP: u64 = 40 + 15 * 8;
    pub const SIGNAL_PC: u64 = 40 + 16 * 8;
    pub const SIGNAL_LR: Option<u64> = None;
}

#[cfg(bpf_target_arch = "aarch64")]
mod layout {
    pub const PC: usize = 32 * 8; // pc, after regs[31] and sp
    pub const SP: usize = 31 * 8; // sp
    pub const FP: usize = 29 * 8; // x29
    pub const LR: Option<usize> = Some(30 * 8); // x30
    /// x28: Go's g register.
    pub const GO_G: usize = 28 * 8;
    /// End of the user half of the address space (52-bit VAs at most).
    pub const USER_LIMIT: u64 = 1 << 52;
    /// Pointer authentication signs return addresses in the bits above the
    /// virtual address size; user addresses fit in 48 bits unless a
    /// process asks for more (which the kernel only grants on request).
    pub const ADDRESS_MASK: u64 = (1 << 48) - 1;

    /// syscallno (s32, after orig_x0): NO_SYSCALL (-1) for every entry
    /// from user mode but `svc`.
    pub const SYSCALL_NR: usize = 34 * 8 + 8;
    pub const SYSCALL_CX: Option<(usize, usize)> = None;
    pub const FLAGS: usize = 33 * 8; // pstate

    /// Registers in a signal frame, from the SP of its trampoline frame
    /// (`__kernel_rt_sigreturn`): the handler ran with SP at `struct
    /// rt_sigframe` { siginfo (128 bytes), ucontext }, and the ucontext's
    /// `uc_mcontext` (struct sigcontext, 16-byte aligned) is 176 bytes in:
    /// uc_flags, uc_link, uc_stack (24), uc_sigmask (8), 120 unused bytes.
    /// sigcontext: fault_address, regs[31], sp, pc
    /// (arch/arm64/include/uapi/asm/{ucontext,sigcontext}.h).
    const MCONTEXT: u64 = 128 + 176;
    pub const SIGNAL_FP: u64 = MCONTEXT + 8 + 29 * 8;
    pub const SIGNAL_LR: Option<u64> = Some(MCONTEXT + 8 + 30 * 8);
    pub const SIGNAL_SP: u64 = MCONTEXT + 8 + 31 * 8;
    pub const SIGNAL_PC: u64 = MCONTEXT + 8 + 32 * 8;
}

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!(
    "profiler-ebpf supports x86_64 and aarch64 (set by aya-build from the agent's target)"
);

pub use layout::{SIGNAL_FP, SIGNAL_LR, SIGNAL_PC, SIGNAL_SP, USER_LIMIT};

/// A code address as read from the stack or a register, without
/// pointer-authentication bits.
#[inline(always)]
pub fn strip_pointer_auth(address: u64) -> u64 {
    address & layout::ADDRESS_MASK
}

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

/// Whether the current task entered the kernel by a system call it is
/// still in (not by an interrupt or an exception from user mode), from its
/// saved user registers.
#[inline(always)]
pub fn in_system_call() -> bool {
    // SAFETY: as in user_regs.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    if regs.is_null() {
        return false;
    }
    #[cfg(bpf_target_arch = "x86_64")]
    let nr = read_at(regs, layout::SYSCALL_NR) as i64;
    #[cfg(bpf_target_arch = "aarch64")]
    let nr = read_at(regs, layout::SYSCALL_NR) as u32 as i32 as i64;
    if nr < 0 {
        return false;
    }
    match layout::SYSCALL_CX {
        Some((cx, r11)) => {
            read_at(regs, cx) == read_at(regs, layout::PC)
                && read_at(regs, r11) == read_at(regs, layout::FLAGS)
        }
        None => true,
    }
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
        go_g: read_at(regs, layout::GO_G),
        lr: match layout::LR {
            Some(offset) => read_at(regs, offset),
            None => 0,
        },
    }
}

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
    /// The registers read, as one block of words from `BLOCK_START` bytes
    /// into pt_regs: r15 (word 0) through sp (word 19).
    pub const BLOCK_START: usize = 0;
    pub const BLOCK_WORDS: usize = 20;
    /// Word indices in the block.
    pub const PC: usize = 16; // ip
    pub const SP: usize = 19; // sp
    pub const FP: usize = 4; // bp
    pub const LR: Option<usize> = None;
    /// The callee-saved registers of `UserRegs::callee`: r12, r13, r14,
    /// r15 (pt_regs words 3, 2, 1, 0).
    pub const CALLEE: [usize; profiler_common::CALLEE_REGS] = [3, 2, 1, 0];
    /// End of the user half of the address space (TASK_SIZE_MAX, 4-level).
    pub const USER_LIMIT: u64 = 0x0000_7fff_ffff_f000;
    /// No pointer authentication: return addresses are plain.
    pub const ADDRESS_MASK: u64 = u64::MAX;

    /// orig_ax: the system call number, or negative (an interrupt's
    /// vector, -1) — but a page fault stores its error code there too.
    pub const SYSCALL_NR: usize = 15;
    /// cx and r11: the `syscall` instruction leaves the return address in
    /// rcx and the flags in r11, and entry_SYSCALL_64 saves both, so a
    /// frame entered by `syscall` has cx == ip and r11 == flags (the
    /// kernel's own test for returning with SYSRET).
    pub const SYSCALL_CX: Option<(usize, usize)> = Some((11, 6));
    pub const FLAGS: usize = 18;
    /// cs (pt_regs word 17): its privilege level is 3 in user mode.
    pub const MODE_WORD: usize = 17;
    pub fn user_mode(cs: u64) -> bool {
        cs & 3 == 3
    }
    /// orig_ax is a full word.
    pub const SYSCALL_NR_BITS: u32 = 64;

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

    /// Go's signal handler fakes a call by pushing the interrupted PC as a
    /// return address, as a `call` would (runtime/signal_amd64.go,
    /// `pushCall`): nothing more lies between the callee's CFA and the
    /// interrupted frame.
    pub const GO_INJECTED_CALL_SLOT: u64 = 0;
}

#[cfg(bpf_target_arch = "aarch64")]
mod layout {
    /// The registers read, as one block of words from `BLOCK_START` bytes
    /// into pt_regs: x22 (word 22) through syscallno (word 35, low half).
    pub const BLOCK_START: usize = 22 * 8;
    pub const BLOCK_WORDS: usize = 14;
    /// Word indices in the block.
    pub const PC: usize = 32 - 22; // pc, after regs[31] and sp
    pub const SP: usize = 31 - 22; // sp
    pub const FP: usize = 29 - 22; // x29
    pub const LR: Option<usize> = Some(30 - 22); // x30
    /// The callee-saved registers of `UserRegs::callee`: x22, x26, x27,
    /// x28.
    pub const CALLEE: [usize; profiler_common::CALLEE_REGS] = [22 - 22, 26 - 22, 27 - 22, 28 - 22];
    /// End of the user half of the address space (52-bit VAs at most).
    pub const USER_LIMIT: u64 = 1 << 52;
    /// Pointer authentication signs return addresses in the bits above the
    /// virtual address size; user addresses fit in 48 bits unless a
    /// process asks for more (which the kernel only grants on request).
    pub const ADDRESS_MASK: u64 = (1 << 48) - 1;

    /// syscallno (s32, after orig_x0): NO_SYSCALL (-1) for every entry
    /// from user mode but `svc`.
    pub const SYSCALL_NR: usize = 35 - 22;
    pub const SYSCALL_CX: Option<(usize, usize)> = None;
    pub const FLAGS: usize = 33 - 22; // pstate
    /// pstate (pt_regs word 33): mode bits 0 in EL0 (AArch64 EL0t, and
    /// AArch32 usr with the 32-bit bit above them).
    pub const MODE_WORD: usize = 33;
    pub fn user_mode(pstate: u64) -> bool {
        pstate & 0xf == 0
    }
    /// syscallno is 32 bits wide (the low half of its word).
    pub const SYSCALL_NR_BITS: u32 = 32;

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

    /// Go's signal handler, before it fakes a call, saves the interrupted
    /// LR in bytes it takes below the interrupted SP.
    pub const GO_INJECTED_CALL_SLOT: u64 = profiler_common::unwind::GO_ARM64_INJECTED_CALL_SLOT;
}

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!(
    "profiler-ebpf supports x86_64 and aarch64 (set by profiler-bpf's build script from the agent's target)"
);

pub use layout::{GO_INJECTED_CALL_SLOT, SIGNAL_FP, SIGNAL_LR, SIGNAL_PC, SIGNAL_SP, USER_LIMIT};

/// Where `task_struct.thread`'s thread pointer is (x86_64:
/// `thread.fsbase`), from the kernel's BTF; 0 when unknown. Set by the
/// loader; the runtimes read what a thread keeps at its thread pointer
/// (Go's g, and 3.10 CPython's thread identity, `pthread_self()`).
#[unsafe(no_mangle)]
static TASK_THREAD_POINTER_OFFSET: u32 = 0;

/// The current task's user thread pointer (its FS base on x86_64); None
/// when the loader could not tell where the kernel keeps it.
#[inline(always)]
pub fn thread_pointer() -> Option<u64> {
    // SAFETY: a read-only global the loader initialised.
    let offset = unsafe { core::ptr::read_volatile(&TASK_THREAD_POINTER_OFFSET) };
    if offset == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        bpf_probe_read_kernel(task.add(offset as usize).cast::<u64>()).ok()
    }
}

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

/// The current task's saved user state: its registers, and whether it is
/// inside a system call.
#[derive(Default)]
pub struct SavedUser {
    pub regs: UserRegs,
    /// It entered the kernel by a system call it is still in (not by an
    /// interrupt or an exception from user mode).
    pub in_system_call: bool,
}

/// The registers a perf event interrupted, when it interrupted user mode:
/// then they are the task's user registers (no system call in progress)
/// and its kernel stack is empty. Read straight from the program's context
/// (`bpf_perf_event_data.regs`, loads the verifier rewrites), with no
/// helper call; None in kernel mode (`saved_user` then).
#[inline(always)]
pub fn interrupted_user(regs: *const u64) -> Option<SavedUser> {
    // SAFETY: `regs` is the perf-event context, whose first member is the
    // interrupted pt_regs; the verifier checks every offset read.
    let word = |index: usize| unsafe { core::ptr::read_volatile(regs.add(index)) };
    if !layout::user_mode(word(layout::MODE_WORD)) {
        return None;
    }
    let block = layout::BLOCK_START / 8;
    Some(SavedUser {
        regs: UserRegs {
            pc: word(block + layout::PC),
            sp: word(block + layout::SP),
            fp: word(block + layout::FP),
            lr: layout::LR.map_or(0, |lr| word(block + lr)),
            callee: [
                word(block + layout::CALLEE[0]),
                word(block + layout::CALLEE[1]),
                word(block + layout::CALLEE[2]),
                word(block + layout::CALLEE[3]),
            ],
        },
        in_system_call: false,
    })
}

/// Words of `pt_regs` the registers are read from at once
/// (`saved_user`'s buffer).
pub const REGS_BLOCK_WORDS: usize = layout::BLOCK_WORDS;

/// Reads the current task's saved user registers (its `pt_regs` at the top
/// of its kernel stack, `bpf_task_pt_regs`): right both when the program
/// interrupted user code and when it runs inside a system call. One read
/// of the block that holds them all (each helper call costs more than the
/// bytes it copies), into `block`: map memory, not the program's stack,
/// which arm64's 6.1 verifier counts with the walk's callback and step.
#[inline(always)]
pub fn saved_user(block: &mut [u64; REGS_BLOCK_WORDS]) -> SavedUser {
    // SAFETY: both helpers take and return kernel pointers the verifier
    // tracks; we only read through bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    if regs.is_null() {
        return SavedUser::default();
    }
    // SAFETY: bpf_probe_read_kernel validates the address and writes at
    // most the block's bytes; a failed read leaves nothing to unwind.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            block.as_mut_ptr().cast(),
            (REGS_BLOCK_WORDS * 8) as u32,
            regs.add(layout::BLOCK_START).cast(),
        )
    };
    if read != 0 {
        return SavedUser::default();
    }
    let word = |index: usize| block.get(index).copied().unwrap_or(0);
    let nr = match layout::SYSCALL_NR_BITS {
        32 => word(layout::SYSCALL_NR) as u32 as i32 as i64,
        _ => word(layout::SYSCALL_NR) as i64,
    };
    let in_system_call = nr >= 0
        && match layout::SYSCALL_CX {
            Some((cx, r11)) => word(cx) == word(layout::PC) && word(r11) == word(layout::FLAGS),
            None => true,
        };
    SavedUser {
        regs: UserRegs {
            pc: word(layout::PC),
            sp: word(layout::SP),
            fp: word(layout::FP),
            lr: layout::LR.map_or(0, word),
            callee: [
                word(layout::CALLEE[0]),
                word(layout::CALLEE[1]),
                word(layout::CALLEE[2]),
                word(layout::CALLEE[3]),
            ],
        },
        in_system_call,
    }
}

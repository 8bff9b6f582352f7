//! Reading a USDT argument at a probe site, as user space described it
//! (`profiler_common::latency::ArgReader`, built from the note's argument
//! spec). Registers are `struct pt_regs` byte offsets, so this code is the
//! same for every architecture.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user},
    programs::ProbeContext,
};
use profiler_common::latency::{
    ARG_ABSOLUTE, ARG_IMMEDIATE, ARG_MEMORY, ARG_REGISTER, ArgReader, NO_REGISTER,
};

/// Largest `struct pt_regs` of the supported architectures (arm64: 34
/// slots, x86_64: 21); user space only passes offsets inside the real one.
const PT_REGS_MAX: u16 = 272;

/// The 8-byte `pt_regs` slot at `offset`.
#[inline(always)]
pub fn register(ctx: &ProbeContext, offset: u16) -> Option<u64> {
    if offset > PT_REGS_MAX - 8 {
        return None;
    }
    // The verifier refuses loads from the context at a variable offset, so
    // the slot is read with a helper. SAFETY: bpf_probe_read_kernel checks
    // the address; pt_regs lives on the task's kernel stack.
    unsafe {
        bpf_probe_read_kernel(
            (ctx.as_ptr() as *const u8)
                .add(offset as usize)
                .cast::<u64>(),
        )
    }
    .ok()
}

/// `size` bytes of user memory at `address`, zero-extended.
#[inline(always)]
fn user(address: u64, size: u8) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error.
    unsafe {
        match size {
            1 => bpf_probe_read_user(address as *const u8).map(u64::from),
            2 => bpf_probe_read_user(address as *const u16).map(u64::from),
            4 => bpf_probe_read_user(address as *const u32).map(u64::from),
            _ => bpf_probe_read_user(address as *const u64),
        }
    }
    .ok()
}

/// Keeps the low `size` bytes, sign-extended when `signed`.
#[inline(always)]
fn extend(raw: u64, size: u8, signed: bool) -> u64 {
    match (size, signed) {
        (1, false) => raw & 0xff,
        (1, true) => raw as u8 as i8 as i64 as u64,
        (2, false) => raw & 0xffff,
        (2, true) => raw as u16 as i16 as i64 as u64,
        (4, false) => raw & 0xffff_ffff,
        (4, true) => raw as u32 as i32 as i64 as u64,
        _ => raw,
    }
}

/// The argument's value, or `None` when a register or memory read failed.
#[inline(always)]
pub fn read(
    ctx: &ProbeContext,
    arg: &ArgReader,
    site_address: u64,
    ip_register: u16,
) -> Option<u64> {
    let raw = match arg.kind {
        ARG_REGISTER => register(ctx, arg.base)?,
        ARG_IMMEDIATE => arg.value as u64,
        ARG_MEMORY => {
            let mut address = arg.value as u64;
            if arg.base != NO_REGISTER {
                address = address.wrapping_add(register(ctx, arg.base)?);
            }
            if arg.index != NO_REGISTER {
                let index = register(ctx, arg.index)?;
                address = address.wrapping_add(index.wrapping_mul(u64::from(arg.scale)));
            }
            user(address, arg.size)?
        }
        ARG_ABSOLUTE => {
            // The uprobe reports the site's runtime address in ip; its
            // distance from the link-time address is the object's load
            // bias, the same for the symbol the argument names.
            let ip = register(ctx, ip_register)?;
            let address = (arg.value as u64).wrapping_add(ip.wrapping_sub(site_address));
            user(address, arg.size)?
        }
        _ => return None,
    };
    Some(extend(raw, arg.size, arg.signed != 0))
}

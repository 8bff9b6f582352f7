//! HotSpot in the stack walker: Java frames of the JVM's code cache, one
//! per walk step, written as two words each (see
//! `profiler_common::runtimes::hotspot` for the record and the layout).
//!
//! The native walker asks [`step`] first at every frame; it answers only
//! for PCs inside the code cache of a process user space registered:
//!
//! - in the template interpreter, the frame is the interpreter's: its
//!   `Method*` and bytecode pointer are in slots below the frame pointer
//!   (the innermost frame's bytecode pointer is in a register: the slot
//!   is only written at calls), and its caller is found through the frame
//!   pointer and the sender's saved stack pointer;
//! - elsewhere, the blob holding the PC is found through its heap's
//!   segment map, and its caller through the blob's frame size (compiled
//!   Java code keeps no frame pointer); the innermost frame of a method
//!   still in its prologue is unwound by what the prologue has done;
//! - stubs without a frame size (the call stub under the outermost Java
//!   frame of a call from C++, stubs that call into the VM) keep a frame
//!   pointer; where a C++ caller follows, the native walker goes on.
//!
//! Every read is checked; a frame that cannot be followed ends the walk
//! with a cut mark (counted), never a guess.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::HashMap};
use profiler_common::runtimes::hotspot::{
    BLOB_WINDOW, INTERPRETER_WORDS, JVM_ADDRESS_MASK, JVM_CUT_NO_BLOB, JVM_CUT_NO_CALLER,
    JVM_CUT_READ_FAULT, JVM_EXACT, JVM_FLAG_CODE_OFFSET, JVM_FLAG_FRAME_COMPLETE_16,
    JVM_FLAG_VERIFIED_ENTRY_OFFSET, JVM_FRAME_TAG, JVM_KIND_COMPILED, JVM_KIND_CUT,
    JVM_KIND_INTERPRETED, JVM_KIND_SHIFT, JvmProcess, MAX_COMPILED_FRAME, MAX_JVM_HEAPS,
    MAX_JVM_PROCESSES, MAX_SEGMENT_HOPS,
};
use profiler_common::unwind::UserStackEnd;
use profiler_common::{Counter, Sample};

use crate::walk::{
    Step, WalkState, read_into, read_user, return_to, stack_pair, stack_word, stack_words,
    write_runtime_frame,
};
use crate::{bump, machine, words};

/// JVMs and where they keep what the walker reads, written by user space
/// once a process's VM is up.
#[map]
static JVM_PROCESSES: HashMap<u32, JvmProcess> = HashMap::with_max_entries(MAX_JVM_PROCESSES, 0);

/// `WalkState::jvm_state`: not looked up yet in this walk.
pub(crate) const JVM_UNSTARTED: u32 = 0;
/// The process is a registered JVM.
pub(crate) const JVM_ON: u32 = 1;
/// It is not (or its Java part was cut): every frame is native.
pub(crate) const JVM_OFF: u32 = 2;

/// The frame pointer's word in the interpreter window (`INTERPRETER_WORDS`).
const FP_WORD: usize = 9;

/// The Java frame at `state.pc`, and its caller; None when the PC is not
/// in a registered JVM's code cache (the frame is native).
#[inline(always)]
pub(crate) fn step(state: &mut WalkState, sample: &mut Sample) -> Option<Result<Step, ()>> {
    if state.jvm_state == JVM_UNSTARTED {
        state.jvm_state = JVM_OFF;
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // SAFETY: the value is copied out of the map.
        if let Some(process) = unsafe { JVM_PROCESSES.get(&pid) } {
            words::copy(&mut state.jvm, process);
            state.jvm_state = JVM_ON;
        }
    }
    if state.jvm_state != JVM_ON {
        return None;
    }
    let pc = state.pc;
    if pc < state.jvm.code_low || pc >= state.jvm.code_high {
        return None;
    }
    // The innermost frame (or one a signal interrupted): its PC is where
    // the thread is, not a return address.
    let exact = (state.frames == 0 && state.leaf_in_system_call == 0) || state.exact_pc != 0;
    state.exact_pc = 0;
    let stepped = if state.jvm.interpreter_low <= pc && pc < state.jvm.interpreter_high {
        interpreted(state, sample, exact)
    } else {
        compiled(state, sample, exact)
    };
    Some(match stepped {
        Ok(step) => Ok(step),
        Err(reason) => {
            bump(Counter::JavaCut);
            state.jvm_state = JVM_OFF;
            // No room for the mark: the walk is over all the same.
            let mark = JVM_FRAME_TAG | (JVM_KIND_CUT << JVM_KIND_SHIFT);
            let _ = write_runtime_frame(state, sample, mark, reason);
            Ok(Step::End(UserStackEnd::TableStop))
        }
    })
}

/// An interpreted frame: `Method*` and bytecode pointer from its slots;
/// the caller at the frame pointer, its stack pointer in the sender slot.
#[inline(always)]
fn interpreted(state: &mut WalkState, sample: &mut Sample, exact: bool) -> Result<Step, u64> {
    let fp = state.fp;
    if fp < state.sp || fp & 7 != 0 || fp >= machine::USER_LIMIT {
        return Err(JVM_CUT_NO_CALLER);
    }
    // The frame's slots, from the stack window (one read for the several
    // small frames of an interpreted recursion), else read alone. That
    // copy lives in the walk state, not on this program's stack: zeroing
    // 88 bytes there took a call to `memset`, one nested call too many for
    // arm64's verifier (512 bytes for the program, the loop callback and
    // its calls together).
    let first_slot = fp - (FP_WORD * 8) as u64;
    let at = stack_words(state, first_slot, INTERPRETER_WORDS as u64);
    if at.is_none() {
        let to = state.jvm_frame.as_mut_ptr().cast();
        // SAFETY: `jvm_frame` is INTERPRETER_WORDS words of this CPU's walk
        // state.
        if !unsafe { read_into(to, (INTERPRETER_WORDS * 8) as u64, first_slot) } {
            return Err(JVM_CUT_READ_FAULT);
        }
    }
    let (stack, alone) = (&state.stack_window.words, &state.jvm_frame);
    let word = |index: usize| match at {
        Some(at) => stack.get(at + index).copied().unwrap_or(0),
        None => alone.get(index).copied().unwrap_or(0),
    };
    // A slot further below than the window's first word reads as 0 on
    // both paths (user space gives 1, 3 and 8; 9 on arm64).
    let slot = |below: u8| {
        if below as usize > FP_WORD {
            return 0;
        }
        word(FP_WORD - below as usize)
    };
    let method = slot(state.jvm.method_slot);
    let sender_sp = slot(state.jvm.sender_sp_slot);
    let bcp = if exact {
        state.bcp
    } else {
        slot(state.jvm.bcp_slot)
    };
    let caller_fp = word(FP_WORD);
    let return_address = word(FP_WORD + 1);
    let first = JVM_FRAME_TAG
        | (JVM_KIND_INTERPRETED << JVM_KIND_SHIFT)
        | if exact { JVM_EXACT } else { 0 }
        | (method & JVM_ADDRESS_MASK);
    if !write_runtime_frame(state, sample, first, bcp) {
        return Ok(Step::End(UserStackEnd::Truncated));
    }
    bump(Counter::JavaFrames);
    // The caller's stack is above this frame.
    if sender_sp <= fp || sender_sp >= machine::USER_LIMIT {
        return Err(JVM_CUT_NO_CALLER);
    }
    state.fp = caller_fp;
    state.sp = sender_sp;
    Ok(return_to(state, return_address))
}

/// A frame of a blob in the code cache (compiled method, native wrapper,
/// stub, adapter): the blob through the segment map, the caller through
/// its frame size.
#[inline(always)]
fn compiled(state: &mut WalkState, sample: &mut Sample, exact: bool) -> Result<Step, u64> {
    let pc = state.pc;
    let blob = find_blob(state, pc)?;
    let to = state.jvm_window.as_mut_ptr();
    // SAFETY: `jvm_window` is BLOB_WINDOW bytes of this CPU's walk state.
    if !unsafe { read_into(to, BLOB_WINDOW as u64, blob) } {
        return Err(JVM_CUT_READ_FAULT);
    }
    let jvm = &state.jvm;
    let frame_words = int(&state.jvm_window, jvm.blob_frame_size) as i32;
    let frame_complete = if jvm.flags & JVM_FLAG_FRAME_COMPLETE_16 != 0 {
        int(&state.jvm_window, jvm.blob_frame_complete) as i16 as i64
    } else {
        int(&state.jvm_window, jvm.blob_frame_complete) as i32 as i64
    };
    let code = if jvm.flags & JVM_FLAG_CODE_OFFSET != 0 {
        blob.wrapping_add(int(&state.jvm_window, jvm.blob_code) as i32 as i64 as u64)
    } else {
        word(&state.jvm_window, jvm.blob_code)
    };
    let compile_id = read_user(blob.wrapping_add(u64::from(jvm.nmethod_compile_id)))
        .map_err(|_| JVM_CUT_READ_FAULT)?
        & 0xffff_ffff;
    let offset = pc.wrapping_sub(code);
    let first = JVM_FRAME_TAG
        | (JVM_KIND_COMPILED << JVM_KIND_SHIFT)
        | if exact { JVM_EXACT } else { 0 }
        | (blob & JVM_ADDRESS_MASK);
    if !write_runtime_frame(
        state,
        sample,
        first,
        (compile_id << 32) | (offset & 0xffff_ffff),
    ) {
        return Ok(Step::End(UserStackEnd::Truncated));
    }
    bump(Counter::JavaFrames);
    if frame_words < 0 || frame_words as u64 * 8 > MAX_COMPILED_FRAME {
        return Err(JVM_CUT_NO_CALLER);
    }
    let frame = frame_words as u64 * 8;
    if frame == 0 {
        // A stub without a frame of its own where the thread is: the
        // return address the call left, when it leads back into Java code
        // (a leaf stub called from compiled code).
        if exact {
            if cfg!(bpf_target_arch = "aarch64") {
                if state.jvm.code_low <= state.lr && state.lr < state.jvm.code_high {
                    return leaf_return(state, state.sp);
                }
            } else if let Ok(return_address) = stack_word(state, state.sp)
                && state.jvm.code_low <= return_address
                && return_address < state.jvm.code_high
            {
                state.sp += 8;
                return Ok(return_to(state, return_address));
            }
        }
        // Stubs that call out keep a frame pointer (the call stub under
        // the outermost Java frame, the stubs calling into the VM): their
        // caller is at the frame record.
        let fp = state.fp;
        if fp < state.sp || fp - state.sp > MAX_COMPILED_FRAME {
            return Err(JVM_CUT_NO_CALLER);
        }
        let record = stack_pair(state, fp).map_err(|_| JVM_CUT_READ_FAULT)?;
        state.fp = record[(machine::FRAME_RECORD_CALLER_FP / 8) as usize];
        state.sp = fp + machine::FRAME_RECORD_SIZE;
        return Ok(return_to(
            state,
            record[(machine::FRAME_RECORD_RETURN_ADDRESS / 8) as usize],
        ));
    }
    if exact {
        // Not yet in the frame (at the code's start, or in a compiled
        // method's inline-cache check before its verified entry): the
        // return address is still where the call left it. The verified
        // entry is an nmethod's field; read from another kind of blob it
        // is not between the code's start and its frame's completion, and
        // only the code's start counts.
        let verified = verified_entry(state, blob, code)?;
        let before_frame = if code <= verified && verified - code <= frame_complete.max(0) as u64 {
            pc <= verified
        } else {
            pc == code
        };
        if before_frame {
            return leaf_return(state, entry_caller_sp(state.sp));
        }
        // The frame is allocated but not complete: the caller's frame
        // pointer is still in its register (and, on arm64, the return
        // address in the link register).
        if (offset as i64) < frame_complete {
            return leaf_return(state, state.sp.wrapping_add(frame));
        }
    }
    let caller_sp = state.sp.wrapping_add(frame);
    if caller_sp >= machine::USER_LIMIT {
        return Err(JVM_CUT_NO_CALLER);
    }
    let record = stack_pair(state, caller_sp - 16).map_err(|_| JVM_CUT_READ_FAULT)?;
    state.fp = record[0];
    state.sp = caller_sp;
    Ok(return_to(state, record[1]))
}

/// The caller of a frame whose return address is where the call left it:
/// on the stack just below `caller_sp` (x86_64), or in the link register
/// (arm64); the frame pointer untouched.
#[inline(always)]
fn leaf_return(state: &mut WalkState, caller_sp: u64) -> Result<Step, u64> {
    if cfg!(bpf_target_arch = "aarch64") {
        let lr = state.lr;
        if lr == 0 {
            return Err(JVM_CUT_NO_CALLER);
        }
        state.sp = caller_sp;
        return Ok(return_to(state, lr));
    }
    let return_address =
        stack_word(state, caller_sp.wrapping_sub(8)).map_err(|_| JVM_CUT_READ_FAULT)?;
    state.sp = caller_sp;
    Ok(return_to(state, return_address))
}

/// Where the caller's stack starts for a frame the call just entered
/// (nothing allocated yet): above the return address on x86_64, at SP on
/// arm64 (the return address is in the link register).
#[inline(always)]
fn entry_caller_sp(sp: u64) -> u64 {
    if cfg!(bpf_target_arch = "aarch64") {
        sp
    } else {
        sp.wrapping_add(8)
    }
}

/// The verified entry point of the blob whose code starts at `code`.
#[inline(always)]
fn verified_entry(state: &WalkState, blob: u64, code: u64) -> Result<u64, u64> {
    let at = blob.wrapping_add(u64::from(state.jvm.nmethod_verified_entry));
    let value = read_user(at).map_err(|_| JVM_CUT_READ_FAULT)?;
    Ok(if state.jvm.flags & JVM_FLAG_VERIFIED_ENTRY_OFFSET != 0 {
        code.wrapping_add(value & 0xffff)
    } else {
        value
    })
}

/// The blob holding `pc`: the heap whose range holds it, the segment map
/// followed back to the block's start (each byte says how many segments
/// back; 0 at a block's start, 0xff where no block is), a used block.
#[inline(always)]
fn find_blob(state: &WalkState, pc: u64) -> Result<u64, u64> {
    let jvm = &state.jvm;
    let mut found = None;
    for i in 0..MAX_JVM_HEAPS {
        if i as u32 >= jvm.heap_count {
            break;
        }
        if let Some(heap) = jvm.heaps.get(i)
            && heap.low <= pc
            && pc < heap.high
        {
            found = Some(*heap);
            break;
        }
    }
    let heap = found.ok_or(JVM_CUT_NO_BLOB)?;
    let shift = heap.log2_segment & 63;
    let mut segment = (pc - heap.low) >> shift;
    let mut hop = read_byte(heap.segmap.wrapping_add(segment))?;
    if hop == 0xff {
        return Err(JVM_CUT_NO_BLOB);
    }
    for _ in 0..MAX_SEGMENT_HOPS {
        if hop == 0 {
            break;
        }
        segment = segment.wrapping_sub(u64::from(hop));
        hop = read_byte(heap.segmap.wrapping_add(segment))?;
    }
    if hop != 0 {
        return Err(JVM_CUT_NO_BLOB);
    }
    let block = heap.low.wrapping_add(segment << shift);
    if read_byte(block.wrapping_add(u64::from(jvm.block_used)))? == 0 {
        return Err(JVM_CUT_NO_BLOB);
    }
    Ok(block.wrapping_add(u64::from(jvm.block_header)))
}

#[inline(always)]
fn read_byte(address: u64) -> Result<u8, u64> {
    let mut byte = 0u8;
    // SAFETY: one byte into a local.
    if !unsafe { read_into(&mut byte, 1, address) } {
        return Err(JVM_CUT_READ_FAULT);
    }
    Ok(byte)
}

/// The u32 at byte `offset` of a blob window (0 past its end).
#[inline(always)]
fn int(window: &[u8; BLOB_WINDOW], offset: u16) -> u64 {
    let offset = offset as usize;
    if offset > BLOB_WINDOW - 4 {
        return 0;
    }
    // SAFETY: `offset + 4 <= BLOB_WINDOW`, checked above.
    u64::from(unsafe { core::ptr::read_unaligned(window.as_ptr().add(offset).cast::<u32>()) })
}

/// The u64 at byte `offset` of a blob window (0 past its end).
#[inline(always)]
fn word(window: &[u8; BLOB_WINDOW], offset: u16) -> u64 {
    let offset = offset as usize;
    if offset > BLOB_WINDOW - 8 {
        return 0;
    }
    // SAFETY: `offset + 8 <= BLOB_WINDOW`, checked above.
    unsafe { core::ptr::read_unaligned(window.as_ptr().add(offset).cast::<u64>()) }
}

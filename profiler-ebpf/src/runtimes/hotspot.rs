//! HotSpot in the stack walker: Java frames of the JVM's code cache, one
//! per step, written as two words each (see
//! `profiler_common::runtimes::hotspot` for the record and the layout).
//!
//! A program of the walk's chain (`chain`): the native walker hands the
//! walk over when the PC enters the code cache (a code region the JVM's
//! registry wrote for the process), and this walker steps frames while it
//! stays there:
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
//! with a cut mark (counted), never a guess. A PC in the code cache where
//! no blob is found goes back to the native walker, which steps it by its
//! frame pointer.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_loop,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::runtimes::hotspot::{
    BLOB_WINDOW, INTERPRETER_WORDS, JVM_ADDRESS_MASK, JVM_CUT_NO_BLOB, JVM_CUT_NO_CALLER,
    JVM_CUT_READ_FAULT, JVM_EXACT, JVM_FLAG_CODE_OFFSET, JVM_FLAG_FRAME_COMPLETE_16,
    JVM_FLAG_VERIFIED_ENTRY_OFFSET, JVM_FRAME_TAG, JVM_KIND_COMPILED, JVM_KIND_CUT,
    JVM_KIND_INTERPRETED, JVM_KIND_SHIFT, JvmProcess, MAX_COMPILED_FRAME, MAX_JVM_HEAPS,
    MAX_JVM_PROCESSES, MAX_SEGMENT_HOPS,
};
use profiler_common::runtimes::{CHAIN_NATIVE, RUNTIME_HOTSPOT, RuntimeCounter};
use profiler_common::unwind::UserStackEnd;
use profiler_common::{MAX_USER_FRAMES, Sample};

use crate::walk::{
    self, Step, WalkState, bump_runtime, read_into, read_user, return_to, stack_pair, stack_word,
    stack_words, write_runtime_frame,
};
use crate::{chain, machine, words};

/// JVMs and where they keep what the walker reads, written by user space
/// once a process's VM is up.
#[map]
static JVM_PROCESSES: HashMap<u32, JvmProcess> = HashMap::with_max_entries(MAX_JVM_PROCESSES, 0);

/// What the walker keeps while it walks a JVM's frames, one slot per
/// context (`chain`).
#[repr(C)]
pub(crate) struct JvmWalk {
    /// The process's layout, copied once per walk.
    process: JvmProcess,
    /// The blob header being read.
    window: [u8; BLOB_WINDOW],
    /// The interpreter frame being read, where the stack window could not
    /// hold it.
    frame: [u64; INTERPRETER_WORDS],
    /// `JVM_ON` or `JVM_OFF` for this walk.
    on: u64,
}

#[map]
static JVM_WALK: PerCpuArray<JvmWalk> = PerCpuArray::with_max_entries(3, 0);

crate::walkers!(
    walk,
    walk_hotspot_cpu,
    walk_hotspot_sched,
    walk_hotspot_probe
);

/// `JvmWalk::on`.
const JVM_ON: u64 = 1;
const JVM_OFF: u64 = 2;

/// `WalkState::ready`'s bit: `JvmWalk` holds this walk's process.
const READY: u32 = 1 << RUNTIME_HOTSPOT;

/// The register HotSpot's template interpreter keeps the bytecode
/// pointer in (`UserRegs::callee`: R13 on x86_64, X22 on arm64).
const BCP_REGISTER: usize = if cfg!(bpf_target_arch = "aarch64") {
    0
} else {
    1
};

/// The frame pointer's word in the interpreter window (`INTERPRETER_WORDS`).
const FP_WORD: usize = 9;

#[repr(C)]
struct StepContext {
    state: *mut WalkState,
    sample: *mut Sample,
    jvm: *mut JvmWalk,
}

/// This walker's program run: Java frames while the PC is in the code
/// cache, then back to the native walker (or to the finish, when the walk
/// ended here).
#[inline(always)]
fn walk<C: EbpfContext, const K: u32>(ctx: &C) {
    let (Some(state), Some(sample), Some(jvm)) =
        (walk::state(K), crate::scratch(K), JVM_WALK.get_ptr_mut(K))
    else {
        return;
    };
    // SAFETY: this CPU's walk state, scratch record and JVM state of
    // context K, ours while the chain runs.
    let (state, walk_jvm) = unsafe { (&mut *state, &mut *jvm) };
    if state.ready & READY == 0 {
        state.ready |= READY;
        walk_jvm.on = JVM_OFF;
        // SAFETY: the value is copied out of the map.
        if let Some(process) = unsafe { JVM_PROCESSES.get(&state.pid) } {
            words::copy(&mut walk_jvm.process, process);
            walk_jvm.on = JVM_ON;
        }
    }
    let mut context = StepContext {
        state: &raw mut *state,
        sample,
        jvm: &raw mut *walk_jvm,
    };
    state.next = CHAIN_NATIVE;
    if walk_jvm.on == JVM_ON {
        // SAFETY: the callback and its context live through the call.
        unsafe {
            bpf_loop(
                MAX_USER_FRAMES as u32,
                step as *mut c_void,
                (&mut context as *mut StepContext).cast(),
                0,
            )
        };
    } else {
        state.native_once = 1;
    }
    if state.next == CHAIN_NATIVE {
        chain::call::<C, K>(ctx, state, CHAIN_NATIVE);
        crate::bump(profiler_common::Counter::ChainMissing);
    }
    chain::finish::<C, K>(ctx, state);
}

/// `bpf_loop`'s callback: one frame, by `profiler_hotspot_step`.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `context` is the StepContext on walk's stack.
    let context = unsafe { &*(context as *const StepContext) };
    let stepped = profiler_hotspot_step(context.state, context.sample, context.jvm);
    // SAFETY: a local; see `native::step`.
    if unsafe { core::ptr::read_volatile(&stepped) } == 0 {
        0
    } else {
        1
    }
}

/// One Java frame and its caller (a global function, verified on its own:
/// see `native::profiler_walk_step`). Returns 1 when this walker's turn is
/// over: the PC left the code cache (`state.next` is `CHAIN_NATIVE`), or
/// the walk ended (`state.next` is `CHAIN_FINISH`, `state.end` why).
#[inline(never)]
#[unsafe(no_mangle)]
pub(crate) extern "C" fn profiler_hotspot_step(
    state: *mut WalkState,
    sample: *mut Sample,
    jvm: *mut JvmWalk,
) -> i64 {
    if state.is_null() || sample.is_null() || jvm.is_null() {
        return 1;
    }
    // SAFETY: the StepContext's pointers, ours while the program runs.
    let (state, sample, jvm) = unsafe { (&mut *state, &mut *sample, &mut *jvm) };
    let pc = state.pc;
    if pc < jvm.process.code_low || pc >= jvm.process.code_high {
        return 1; // back to the native walker
    }
    if state.frames as usize >= MAX_USER_FRAMES {
        state.next = profiler_common::runtimes::CHAIN_FINISH;
        return 1; // end stays Truncated
    }
    // The innermost frame (or one a signal interrupted): its PC is where
    // the thread is, not a return address.
    let exact = (state.frames == 0 && state.leaf_in_system_call == 0) || state.exact_pc != 0;
    let stepped = if jvm.process.interpreter_low <= pc && pc < jvm.process.interpreter_high {
        interpreted(state, sample, jvm, exact)
    } else {
        compiled(state, sample, jvm, exact)
    };
    let ended = |state: &mut WalkState, end: UserStackEnd| {
        state.end = end as u32;
        state.next = profiler_common::runtimes::CHAIN_FINISH;
        1
    };
    match stepped {
        Ok(Step::Next) => {
            state.exact_pc = 0;
            state.fp_from_record = 0;
            0
        }
        Ok(Step::End(end)) => ended(state, end),
        // No code here that the JVM knows: the native walker takes this
        // frame (by frame pointer), as code of no runtime.
        Err(JVM_CUT_NO_BLOB) => {
            state.native_once = 1;
            1
        }
        Err(reason) => {
            bump_runtime(RUNTIME_HOTSPOT, RuntimeCounter::Cut);
            // No room for the mark: the walk is over all the same.
            let mark = JVM_FRAME_TAG | (JVM_KIND_CUT << JVM_KIND_SHIFT);
            let _ = write_runtime_frame(state, sample, mark, reason);
            ended(state, UserStackEnd::TableStop)
        }
    }
}

/// An interpreted frame: `Method*` and bytecode pointer from its slots;
/// the caller at the frame pointer, its stack pointer in the sender slot.
#[inline(always)]
fn interpreted(
    state: &mut WalkState,
    sample: &mut Sample,
    jvm: &mut JvmWalk,
    exact: bool,
) -> Result<Step, u64> {
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
        let to = jvm.frame.as_mut_ptr().cast();
        // SAFETY: `jvm_frame` is INTERPRETER_WORDS words of this CPU's walk
        // state.
        if !unsafe { read_into(to, (INTERPRETER_WORDS * 8) as u64, first_slot) } {
            return Err(JVM_CUT_READ_FAULT);
        }
    }
    let (stack, alone) = (&state.stack_window.words, &jvm.frame);
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
    let method = slot(jvm.process.method_slot);
    let sender_sp = slot(jvm.process.sender_sp_slot);
    let bcp = if exact {
        state.callee[BCP_REGISTER]
    } else {
        slot(jvm.process.bcp_slot)
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
    bump_runtime(RUNTIME_HOTSPOT, RuntimeCounter::Frames);
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
fn compiled(
    state: &mut WalkState,
    sample: &mut Sample,
    jvm: &mut JvmWalk,
    exact: bool,
) -> Result<Step, u64> {
    let pc = state.pc;
    let blob = find_blob(&jvm.process, pc)?;
    let to = jvm.window.as_mut_ptr();
    // SAFETY: `jvm_window` is BLOB_WINDOW bytes of this CPU's walk state.
    if !unsafe { read_into(to, BLOB_WINDOW as u64, blob) } {
        return Err(JVM_CUT_READ_FAULT);
    }
    let (process, window) = (&jvm.process, &jvm.window);
    let frame_words = int(window, process.blob_frame_size) as i32;
    let frame_complete = if process.flags & JVM_FLAG_FRAME_COMPLETE_16 != 0 {
        int(window, process.blob_frame_complete) as i16 as i64
    } else {
        int(window, process.blob_frame_complete) as i32 as i64
    };
    let code = if process.flags & JVM_FLAG_CODE_OFFSET != 0 {
        blob.wrapping_add(int(window, process.blob_code) as i32 as i64 as u64)
    } else {
        word(window, process.blob_code)
    };
    let compile_id = read_user(blob.wrapping_add(u64::from(process.nmethod_compile_id)))
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
    bump_runtime(RUNTIME_HOTSPOT, RuntimeCounter::Frames);
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
                if jvm.process.code_low <= state.lr && state.lr < jvm.process.code_high {
                    return leaf_return(state, state.sp);
                }
            } else if let Ok(return_address) = stack_word(state, state.sp)
                && jvm.process.code_low <= return_address
                && return_address < jvm.process.code_high
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
        let verified = verified_entry(&jvm.process, blob, code)?;
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
fn verified_entry(process: &JvmProcess, blob: u64, code: u64) -> Result<u64, u64> {
    let at = blob.wrapping_add(u64::from(process.nmethod_verified_entry));
    let value = read_user(at).map_err(|_| JVM_CUT_READ_FAULT)?;
    Ok(if process.flags & JVM_FLAG_VERIFIED_ENTRY_OFFSET != 0 {
        code.wrapping_add(value & 0xffff)
    } else {
        value
    })
}

/// The blob holding `pc`: the heap whose range holds it, the segment map
/// followed back to the block's start (each byte says how many segments
/// back; 0 at a block's start, 0xff where no block is), a used block.
#[inline(always)]
fn find_blob(jvm: &JvmProcess, pc: u64) -> Result<u64, u64> {
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

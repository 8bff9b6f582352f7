//! Unwind tables: the rows the BPF walker follows, built from what the
//! binaries say about their frames, and which address each frame of a raw
//! stack is looked up as.
//!
//! The BPF walker (profiler-ebpf/src/unwind.rs) is small and generic: for
//! each frame it finds the row covering the PC and applies its rule, or
//! follows the frame pointer where no table covers the code. All the
//! knowledge is produced here, as rows: `cfi` turns `.eh_frame` /
//! `.debug_frame` into rows (native code without frame pointers, PLT
//! entries, signal trampolines, the outermost frames), `build` combines
//! them per object with what a language runtime adds over its own code
//! (`build::RuntimeRows`: Go's pcsp rows, from profiler-runtimes), and
//! `table` pages them. Loading them into the BPF maps is the sampler's
//! (profiler-sampling); this crate reads binaries through
//! profiler-symbolize and knows nothing of BPF.

pub mod build;
pub mod cfi;
pub mod table;

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
compile_error!("profiler-unwind supports x86_64 and aarch64");

/// One frame of a raw stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame {
    /// The address as sampled: the interrupted PC for the leaf, a return
    /// address for every caller.
    pub pc: u64,
    /// The address to symbolize: inside the call instruction for callers,
    /// so the caller's function and line are the call's, not the next
    /// statement's (which may be another function after a noreturn call).
    pub lookup_pc: u64,
}

/// Frames of a leaf-first kernel stack, as `bpf_get_stack` wrote it:
/// callers are return addresses.
pub fn kernel_frames(pcs: &[u64]) -> impl Iterator<Item = RawFrame> + '_ {
    pcs.iter().enumerate().map(|(depth, &pc)| RawFrame {
        pc,
        lookup_pc: if depth == 0 { pc } else { call_site(pc) },
    })
}

/// Native frames of a leaf-first user stack, as the BPF walker wrote it:
/// callers are return addresses, except those the walker marked exact
/// (`FRAME_EXACT_PC`: signal trampolines and the PCs signals interrupted).
/// Runtime frames are left out (see `user_frames`).
pub fn frames(words: &[u64]) -> impl Iterator<Item = RawFrame> + '_ {
    user_frames(words).filter_map(|frame| match frame {
        UserFrame::Native(frame) => Some(frame),
        UserFrame::Runtime { .. } => None,
    })
}

/// One frame of a user stack: native code, or a runtime's frame (an
/// interpreter's, two words the runtime's symbolizer reads; see
/// `profiler_common::runtimes::python::RUNTIME_FRAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserFrame {
    Native(RawFrame),
    Runtime { first: u64, second: u64 },
}

/// Every frame of a leaf-first user stack, native and runtime frames in
/// the order the walker wrote them. Only the first frame is the
/// interrupted PC; a native frame after a runtime frame is a return
/// address (the runtime's frames stood for a native frame the walker
/// unwound).
pub fn user_frames(words: &[u64]) -> impl Iterator<Item = UserFrame> + '_ {
    use profiler_common::runtimes::python::RUNTIME_FRAME;
    use profiler_common::unwind::FRAME_EXACT_PC;
    let mut at = 0;
    std::iter::from_fn(move || {
        let raw = *words.get(at)?;
        let depth = at;
        if raw & RUNTIME_FRAME != 0 && raw & FRAME_EXACT_PC == 0 {
            let second = words.get(at + 1).copied().unwrap_or(0);
            at += 2;
            return Some(UserFrame::Runtime { first: raw, second });
        }
        at += 1;
        let pc = raw & !FRAME_EXACT_PC;
        let exact = depth == 0 || raw & FRAME_EXACT_PC != 0;
        Some(UserFrame::Native(RawFrame {
            pc,
            lookup_pc: if exact { pc } else { call_site(pc) },
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_frames_are_looked_up_as_they_are() {
        use profiler_common::unwind::FRAME_EXACT_PC;
        let frames: Vec<_> = frames(&[
            0x1000,
            0x2005 | FRAME_EXACT_PC,
            0x3010 | FRAME_EXACT_PC,
            0x4000,
        ])
        .collect();
        assert_eq!((frames[1].pc, frames[1].lookup_pc), (0x2005, 0x2005));
        assert_eq!((frames[2].pc, frames[2].lookup_pc), (0x3010, 0x3010));
        assert!(frames[3].lookup_pc < 0x4000);
    }

    #[test]
    fn runtime_frames_take_two_words_and_make_the_next_native_frame_a_caller() {
        use profiler_common::runtimes::python::PY_FRAME_TAG;
        let words = [
            PY_FRAME_TAG | 0x7000,
            0x7100,
            0x2005,
            PY_FRAME_TAG | 0x8000,
            0x8100,
            0x3010,
        ];
        let frames: Vec<_> = user_frames(&words).collect();
        assert_eq!(frames.len(), 4);
        assert_eq!(
            frames[0],
            UserFrame::Runtime {
                first: PY_FRAME_TAG | 0x7000,
                second: 0x7100
            }
        );
        let UserFrame::Native(caller) = frames[1] else {
            panic!("{frames:?}");
        };
        assert_eq!(caller.pc, 0x2005);
        assert!(caller.lookup_pc < 0x2005, "a return address, not the leaf");
        assert_eq!(super::frames(&words).count(), 2);
    }

    #[test]
    fn kernel_addresses_keep_their_high_bits() {
        let frames: Vec<_> =
            kernel_frames(&[0xffff_ffff_8100_0010, 0xffff_ffff_8100_2000]).collect();
        assert_eq!(frames[0].pc, 0xffff_ffff_8100_0010);
        assert_eq!(frames[1].pc, 0xffff_ffff_8100_2000);
        assert_eq!(frames[1].lookup_pc, call_site(0xffff_ffff_8100_2000));
    }

    #[test]
    fn callers_are_looked_up_inside_the_call() {
        let frames: Vec<_> = frames(&[0x1000, 0x2005, 0x3010]).collect();
        assert_eq!(frames[0].lookup_pc, 0x1000);
        assert_eq!(frames[1].pc, 0x2005);
        assert!(frames[1].lookup_pc < 0x2005 && frames[1].lookup_pc >= 0x2005 - 4);
        assert!(frames[2].lookup_pc < 0x3010);
    }
}

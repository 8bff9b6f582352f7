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
/// the order the thread called them. Only the first frame is the
/// interrupted PC; a native frame after a runtime frame is a return
/// address (the runtime's frames stood for a native frame the walker
/// unwound).
///
/// An interpreter's frames come after the native part, in a section per
/// interpreter (`profiler_common::runtimes`: `MARK_SECTION`, each
/// activation's frames ended by `ACTIVATION_LAST` on its last frame or by
/// `MARK_END`), and each takes the place of
/// its activation mark (`MARK_ACTIVATION`) in the native part, in order.
/// A mark whose activation the section does not have (the section was
/// cut, or never written) is the eval loop's native frame it stood for.
pub fn user_frames(words: &[u64]) -> impl Iterator<Item = UserFrame> + '_ {
    splice(words).into_iter()
}

/// One item of the raw stack: a native word at its index, or a runtime
/// frame's two words.
enum Item {
    Native(usize, u64),
    Runtime(u64, u64),
}

fn splice(words: &[u64]) -> Vec<UserFrame> {
    use profiler_common::runtimes::{
        ACTIVATION_LAST, MARK_ACTIVATION, MARK_CUT, MARK_END, MARK_SECTION, RUNTIME_PAYLOAD_MASK,
        is_runtime_frame, runtime_of,
    };
    use profiler_common::unwind::FRAME_EXACT_PC;
    let mut items = Vec::with_capacity(words.len());
    let mut at = 0;
    while let Some(&raw) = words.get(at) {
        if is_runtime_frame(raw) {
            let second = words.get(at + 1).copied().unwrap_or(0);
            items.push(Item::Runtime(raw, second));
            at += 2;
        } else {
            items.push(Item::Native(at, raw));
            at += 1;
        }
    }
    let payload = |first: u64| first & RUNTIME_PAYLOAD_MASK;
    // The native part ends at the first section.
    let native_end = items
        .iter()
        .position(|item| matches!(item, Item::Runtime(first, _) if payload(*first) == MARK_SECTION))
        .unwrap_or(items.len());
    // Each interpreter's activations, in order; the last one may lack its
    // end (a section cut there keeps the frames it has).
    let mut sections: Vec<(u8, Vec<Vec<UserFrame>>)> = Vec::new();
    for item in &items[native_end..] {
        let Item::Runtime(first, second) = *item else {
            continue; // no native word follows the native part
        };
        let runtime = runtime_of(first);
        match payload(first) {
            MARK_SECTION => sections.push((runtime, vec![Vec::new()])),
            MARK_END => {
                if let Some((_, activations)) = sections.last_mut() {
                    activations.push(Vec::new());
                }
            }
            payload => {
                let Some((_, activations)) = sections.last_mut() else {
                    continue;
                };
                let last = payload != MARK_CUT && payload & ACTIVATION_LAST != 0;
                if let Some(frames) = activations.last_mut() {
                    frames.push(UserFrame::Runtime {
                        first: first & !ACTIVATION_LAST,
                        second,
                    });
                }
                if last {
                    activations.push(Vec::new());
                }
            }
        }
    }
    for (_, activations) in &mut sections {
        // An activation opened after the last end holds frames only when
        // the section was cut inside it.
        if activations.last().is_some_and(Vec::is_empty) {
            activations.pop();
        }
        activations.reverse(); // taken from the back, in order
    }
    let mut frames = Vec::with_capacity(items.len());
    for item in &items[..native_end] {
        match *item {
            Item::Native(depth, raw) => {
                let pc = raw & !FRAME_EXACT_PC;
                let exact = depth == 0 || raw & FRAME_EXACT_PC != 0;
                frames.push(UserFrame::Native(RawFrame {
                    pc,
                    lookup_pc: if exact { pc } else { call_site(pc) },
                }));
            }
            Item::Runtime(first, second) if payload(first) == MARK_ACTIVATION => {
                let runtime = runtime_of(first);
                let activation = sections
                    .iter_mut()
                    .find(|(id, _)| *id == runtime)
                    .and_then(|(_, activations)| activations.pop());
                match activation {
                    Some(activation) => frames.extend(activation),
                    None => {
                        let pc = second & !FRAME_EXACT_PC;
                        let exact = second & FRAME_EXACT_PC != 0;
                        frames.push(UserFrame::Native(RawFrame {
                            pc,
                            lookup_pc: if exact { pc } else { call_site(pc) },
                        }));
                    }
                }
            }
            Item::Runtime(first, second) => frames.push(UserFrame::Runtime { first, second }),
        }
    }
    frames
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
        const TAG: u64 = profiler_common::runtimes::runtime_tag(1);
        let words = [TAG | 0x7000, 0x7100, 0x2005, TAG | 0x8000, 0x8100, 0x3010];
        let frames: Vec<_> = user_frames(&words).collect();
        assert_eq!(frames.len(), 4);
        assert_eq!(
            frames[0],
            UserFrame::Runtime {
                first: TAG | 0x7000,
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

    /// Two activations of an interpreter marked in the native part, their
    /// frames in its section: each takes its mark's place, in order; a
    /// third mark the section has no frames for is its native frame.
    #[test]
    fn an_interpreters_section_takes_the_place_of_its_marks() {
        use profiler_common::runtimes::{
            ACTIVATION_LAST, MARK_ACTIVATION, MARK_END, MARK_SECTION, runtime_tag,
        };
        use profiler_common::unwind::FRAME_EXACT_PC;
        let py = runtime_tag(1);
        let words = [
            0x1000, // C leaf, called from Python
            py | MARK_ACTIVATION,
            0x2000, // the eval loop's PC
            0x3000, // C calling back into Python
            py | MARK_ACTIVATION,
            0x4000,
            py | MARK_ACTIVATION,
            0x5000,
            0x6000, // main
            py | MARK_SECTION,
            0,
            py | 0xa0,
            0xa1, // activation 1: two frames, ended by a mark
            py | 0xb0,
            0xb1,
            py | MARK_END,
            0,
            py | 0xc0 | ACTIVATION_LAST,
            0xc1, // activation 2: one frame, the last
        ];
        let frames: Vec<_> = user_frames(&words).collect();
        let runtime = |payload: u64, second: u64| UserFrame::Runtime {
            first: py | payload,
            second,
        };
        let native = |frame: &UserFrame| match frame {
            UserFrame::Native(raw) => raw.pc,
            other => panic!("{other:?}"),
        };
        assert_eq!(frames.len(), 7, "{frames:?}");
        assert_eq!(native(&frames[0]), 0x1000);
        assert_eq!(frames[1], runtime(0xa0, 0xa1));
        assert_eq!(frames[2], runtime(0xb0, 0xb1));
        assert_eq!(native(&frames[3]), 0x3000);
        assert_eq!(frames[4], runtime(0xc0, 0xc1));
        // The third mark: no activation left, so the eval loop itself, a
        // caller (looked up one byte back).
        let UserFrame::Native(eval_loop) = frames[5] else {
            panic!("{frames:?}");
        };
        assert_eq!(eval_loop.pc, 0x5000);
        assert!(eval_loop.lookup_pc < 0x5000);
        assert_eq!(native(&frames[6]), 0x6000);
        // A leaf in the eval loop, no section at all: its exact PC.
        let leaf = [py | MARK_ACTIVATION, 0x7000 | FRAME_EXACT_PC, 0x8000];
        let frames: Vec<_> = user_frames(&leaf).collect();
        let UserFrame::Native(first) = frames[0] else {
            panic!("{frames:?}");
        };
        assert_eq!((first.pc, first.lookup_pc), (0x7000, 0x7000));
        assert_eq!(frames.len(), 2);
    }

    /// A section cut inside an activation keeps the frames it has and its
    /// cut mark; the activations after it are native.
    #[test]
    fn a_cut_section_keeps_what_it_has() {
        use profiler_common::runtimes::{MARK_ACTIVATION, MARK_CUT, MARK_SECTION, runtime_tag};
        let py = runtime_tag(1);
        let words = [
            py | MARK_ACTIVATION,
            0x2000,
            py | MARK_ACTIVATION,
            0x4000,
            py | MARK_SECTION,
            0,
            py | 0xa0,
            0xa1,
            py | MARK_CUT,
            2,
        ];
        let frames: Vec<_> = user_frames(&words).collect();
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!(
            frames[1],
            UserFrame::Runtime {
                first: py | MARK_CUT,
                second: 2
            }
        );
        assert!(matches!(frames[2], UserFrame::Native(raw) if raw.pc == 0x4000));
    }
}

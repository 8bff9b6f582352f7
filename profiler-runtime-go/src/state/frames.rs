//! Naming the code addresses read from a Go process (heap stacks,
//! goroutine stacks) through its pclntab, as profile locations.

use profiler_profile::{FrameType, Function, Location, ProfileBuilder};

pub use profiler_symbolize::Frame;

use super::GoTarget;

/// The frames at a return address `pc` (a process address), innermost
/// first: looked up at `pc − 1`, the call instruction, as the runtime's
/// own tracebacks do. Empty when the pclntab does not cover it.
pub fn at_return_address(target: &GoTarget, pc: u64) -> Vec<Frame> {
    target
        .symbols
        .frames(target.link_address(pc).wrapping_sub(1))
        .unwrap_or_default()
}

/// The frames at `pc` itself (a stopped thread's PC: the instruction it
/// was about to run).
pub fn at(target: &GoTarget, pc: u64) -> Vec<Frame> {
    target
        .symbols
        .frames(target.link_address(pc))
        .unwrap_or_default()
}

/// The location of `address` with `frames` as its lines (innermost
/// first), built once per `key`.
pub fn location<L: std::hash::Hash + Eq, M: std::hash::Hash + Eq>(
    builder: &mut ProfileBuilder<L, M>,
    key: L,
    mapping: usize,
    address: u64,
    frames: &[Frame],
) -> usize {
    builder.location(key, |b| {
        let lines = frames
            .iter()
            .map(|f| {
                b.line(
                    Function {
                        name: f.function.clone(),
                        system_name: f.system_name.clone().unwrap_or_else(|| f.function.clone()),
                        file: f.file.clone().unwrap_or_default(),
                    },
                    f.line.unwrap_or(0),
                )
            })
            .collect();
        Location {
            address,
            mapping: Some(mapping),
            lines,
            frame_type: FrameType::Go,
        }
    })
}

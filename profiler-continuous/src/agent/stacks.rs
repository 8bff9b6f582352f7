//! Stacks on their way to profiles: what an export window or a pull has
//! gathered, and where their symbols come from.

use std::time::{Duration, SystemTime};

use profiler_profile::Profile;
use profiler_sampling::record::{Recorder, Recording, Stacks, Window, build_profile_of};

/// Counted stacks since `started`.
pub(super) struct Accumulator {
    pub(super) started: SystemTime,
    pub(super) stacks: Stacks,
}

impl Accumulator {
    pub(super) fn new() -> Self {
        Accumulator {
            started: SystemTime::now(),
            stacks: Stacks::default(),
        }
    }
}

/// Where symbols come from: the live recorder, or a recording finished
/// at shutdown or before a restart.
pub(super) enum Symbols<'a> {
    Live(&'a mut Recorder),
    Finished(&'a mut Recording),
}

impl Symbols<'_> {
    pub(super) fn poll(&mut self) {
        if let Symbols::Live(recorder) = self {
            recorder.poll(Duration::ZERO);
        }
    }

    pub(super) fn profile(&mut self, window: &Window) -> Profile {
        match self {
            Symbols::Live(recorder) => recorder.profile_of(window, |_| true),
            Symbols::Finished(recording) => build_profile_of(
                window.stacks.iter(),
                &recording.processes,
                &mut recording.symbolizer,
                &mut recording.runtime_frames,
                &window.profile,
            ),
        }
    }
}

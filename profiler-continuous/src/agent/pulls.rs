//! Pulls (`/debug/pprof/profile?seconds=N`, `/wall`): each open pull
//! gathers the stacks of its next N seconds, filtered by pid or service,
//! and is answered with one profile when its time is up.

use std::time::{Instant, SystemTime};

use profiler_profile::ProfileKind;
use profiler_sampling::record::{ProfileWindow, Window};

use super::stacks::{Accumulator, Symbols};
use crate::metadata::MetadataCache;

pub(super) struct Pull {
    pub(super) deadline: Instant,
    /// The CPU profile's kind, or `Wall` (`/debug/pprof/wall`).
    pub(super) kind: ProfileKind,
    pub(super) pid: Option<u32>,
    pub(super) service: Option<String>,
    pub(super) accumulator: Accumulator,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// One pull's profile, every service together (filters applied on merge).
pub(super) fn pull_profile(
    symbols: &mut Symbols<'_>,
    meta: &mut MetadataCache,
    node: &str,
    accumulator: Accumulator,
    frequency_hz: u64,
    kind: ProfileKind,
) -> Result<Vec<u8>, String> {
    let elapsed = SystemTime::now()
        .duration_since(accumulator.started)
        .unwrap_or_default();
    let window = Window {
        profile: ProfileWindow {
            started: accumulator.started,
            elapsed,
            frequency_hz,
            page_fault_period: 0,
            kind,
        },
        stacks: crate::wall::stacks_for(kind, accumulator.stacks, elapsed, frequency_hz),
    };
    let mut profile = symbols.profile(&window);
    meta.label(&mut profile, node);
    profiler_profile::pprof::encode_gzip(&profile).map_err(|e| format!("encoding the profile: {e}"))
}

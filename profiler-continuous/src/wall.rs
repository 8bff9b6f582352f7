//! Which of a window's counted stacks each profile shows: the CPU profile
//! (with or without its off-CPU sample type) and the wall-clock view
//! (`wall = true`), where each CPU sample counts as one sampling period of
//! time and the off-CPU time is added, so a thread's stacks add up to its
//! time alive in the window, as `record --wall`'s do over a recording.
//!
//! One thing differs from a recording: windows follow each other. An
//! off-CPU interval reaches user space whole when its thread runs again,
//! and lands in the window open then; one that began windows earlier (a
//! pool thread in `epoll_wait` for a minute) would put more time under
//! its thread than the window lasted. So in the wall view a thread's
//! off-CPU time is capped at what its CPU time leaves of the window, each
//! of its off-CPU stacks keeping its share. The time such a wait spent in
//! the windows before is in none of them: they were exported before the
//! kernel said the thread was waiting.

use std::collections::HashMap;
use std::time::Duration;

use profiler_profile::ProfileKind;
use profiler_sampling::record::{StackCounts, Stacks};

/// The stacks a profile of `kind` shows, out of a window's (or a pull's)
/// `stacks`, which last `elapsed` sampled at `frequency_hz`.
pub fn stacks_for(
    kind: ProfileKind,
    mut stacks: Stacks,
    elapsed: Duration,
    frequency_hz: u64,
) -> Stacks {
    match kind {
        // Off-CPU time recorded only for the wall view stays out of the
        // CPU profile.
        ProfileKind::Cpu => {
            stacks.retain(|_, counts| {
                *counts = StackCounts::samples(counts.samples);
                counts.samples > 0
            });
        }
        ProfileKind::Wall => cap_to_window(&mut stacks, elapsed, frequency_hz),
        // Page-fault samples alone.
        ProfileKind::PageFaults => {
            stacks.retain(|_, counts| {
                *counts = StackCounts {
                    page_faults: counts.page_faults,
                    ..StackCounts::default()
                };
                counts.page_faults > 0
            });
        }
        _ => {}
    }
    stacks
}

/// Caps each thread's off-CPU time at the window's length less its CPU
/// time (see the module's comment), scaling its off-CPU stacks alike.
fn cap_to_window(stacks: &mut Stacks, elapsed: Duration, frequency_hz: u64) {
    let period_ns = profiler_sampling::sampler::sampling_period(frequency_hz).as_nanos() as u64;
    let window_ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
    // (CPU, off-CPU) nanoseconds per thread.
    let mut threads: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
    for (key, counts) in stacks.iter() {
        let thread = threads.entry((key.pid, key.tid)).or_default();
        thread.0 += counts.samples * period_ns;
        thread.1 += counts.off_cpu_ns();
    }
    for (key, counts) in stacks.iter_mut() {
        let (cpu_ns, off_ns) = threads[&(key.pid, key.tid)];
        let room = window_ns.saturating_sub(cpu_ns);
        if off_ns <= room {
            continue;
        }
        let scale = |ns: u64| (u128::from(ns) * u128::from(room) / u128::from(off_ns)) as u64;
        counts.blocked_ns = scale(counts.blocked_ns);
        counts.runq_ns = scale(counts.runq_ns);
    }
    stacks.retain(|_, counts| counts.samples > 0 || counts.off_cpu_ns() > 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_sampling::record::StackKey;

    fn key(tid: u32, leaf: u64) -> StackKey {
        StackKey {
            pid: 7,
            tid,
            thread: [0; 16],
            user: vec![leaf].into(),
            kernel: Box::default(),
            labels: Default::default(),
        }
    }

    fn counts(samples: u64, blocked_ns: u64, runq_ns: u64) -> StackCounts {
        StackCounts {
            samples,
            blocked_ns,
            runq_ns,
            page_faults: 0,
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn the_cpu_profile_leaves_off_cpu_time_out() {
        let stacks = Stacks::from_iter([
            (key(1, 1), counts(3, 5 * MS, 0)),
            (key(1, 2), counts(0, 9 * MS, MS)),
        ]);
        let cpu = stacks_for(
            ProfileKind::Cpu,
            stacks.clone(),
            Duration::from_secs(1),
            100,
        );
        assert_eq!(cpu, Stacks::from_iter([(key(1, 1), counts(3, 0, 0))]));
        // With the off-CPU sample type, everything stays.
        let off = stacks_for(
            ProfileKind::OffCpu,
            stacks.clone(),
            Duration::from_secs(1),
            100,
        );
        assert_eq!(off, stacks);
    }

    #[test]
    fn a_thread_never_has_more_wall_time_than_the_window() {
        // 1 s at 100 Hz. Thread 1: 300 ms on the CPU, 400 ms waiting:
        // within the window, untouched. Thread 2: 200 ms on the CPU and a
        // wait of 5 s that began windows ago, 4 s blocked then 1 s in the
        // run queue, plus 600 ms of short waits on another stack: its
        // off-CPU stacks share the 800 ms the CPU left, 5000:600.
        let stacks = Stacks::from_iter([
            (key(1, 1), counts(30, 0, 0)),
            (key(1, 2), counts(0, 300 * MS, 100 * MS)),
            (key(2, 1), counts(20, 0, 0)),
            (key(2, 3), counts(0, 4000 * MS, 1000 * MS)),
            (key(2, 4), counts(0, 600 * MS, 0)),
        ]);
        let wall = stacks_for(ProfileKind::Wall, stacks, Duration::from_secs(1), 100);
        assert_eq!(wall[&key(1, 2)], counts(0, 300 * MS, 100 * MS));
        assert_eq!(wall[&key(2, 1)], counts(20, 0, 0));
        let long = wall[&key(2, 3)];
        let short = wall[&key(2, 4)];
        // (Each share rounded down.)
        let total = long.off_cpu_ns() + short.off_cpu_ns();
        assert!((800 * MS - 3..=800 * MS).contains(&total), "{total}");
        assert_eq!(short.blocked_ns, 600 * MS * 800 / 5600);
        // Blocked and run-queue time keep their proportion.
        assert_eq!(long.blocked_ns, 4000 * MS * 800 / 5600);
        assert_eq!(long.runq_ns, 1000 * MS * 800 / 5600);
    }

    #[test]
    fn a_thread_on_the_cpu_all_window_keeps_its_samples_and_no_wait() {
        // CPU samples are what the clock saw: never scaled. A wait next to
        // a whole window of them has no room left and goes.
        let stacks = Stacks::from_iter([
            (key(1, 1), counts(100, 0, 0)),
            (key(1, 2), counts(0, 20 * MS, 0)),
        ]);
        let wall = stacks_for(ProfileKind::Wall, stacks, Duration::from_secs(1), 100);
        assert_eq!(wall, Stacks::from_iter([(key(1, 1), counts(100, 0, 0))]));
    }
}

//! Off-CPU intervals joined to the user stacks their threads left their
//! CPU with. The BPF side walks a thread's user stack at every switch-out
//! (the only moment its memory is readable) but sends it only when it
//! changed (`SAMPLE_KIND_OFF_CPU_STACK`, with an id); the interval, known
//! at the switch-in, names it by that id (`Sample::stack_id`). A stack is
//! sent before any interval that names it, and one ring buffer keeps the
//! order, so the last stack kept for a thread is the one its next
//! intervals name, unless a record was lost on the way (then the ids
//! differ, and the interval keeps its kernel stack alone, counted).

use std::collections::HashMap;

use profiler_common::{
    SAMPLE_FLAG_GO_LABELS, SAMPLE_FLAG_UNKNOWN_MAPPING, Sample, runtimes::go::GoLabels,
};

/// Threads whose last stack is kept at most, and their words (frames and
/// labels) together: 8 MiB, some 40,000 stacks of 25 frames. A process
/// that blocks many threads with deep stacks must not grow the agent
/// without bound. Past either, the stacks of threads that exited are let
/// go, and if that is not enough, all of them: each thread's stack is sent
/// again at its next switch-out after a second (`OFF_CPU_STACK_RESEND_NS`),
/// and the intervals between name a stack no longer here (counted).
const MAX_THREADS: usize = 1 << 16;
const MAX_WORDS: usize = 1 << 20;

/// The last user stack sent for each thread, by thread id.
#[derive(Default)]
pub(super) struct UserStacks {
    by_thread: HashMap<u32, UserStack>,
    /// Words the kept stacks hold (frames, and labels in words).
    words: usize,
    /// Intervals that named a stack not kept here (its record was lost, or
    /// let go): they kept their kernel stack alone.
    missing: u64,
}

struct UserStack {
    id: u32,
    pid: u32,
    user_end: u8,
    /// Its leaf was in code the agent had not seen mapped.
    unknown_mapping: bool,
    frames: Vec<u64>,
    /// Its Go labels block, as the record carried it.
    labels: Vec<u8>,
}

impl UserStacks {
    /// Keeps a `SAMPLE_KIND_OFF_CPU_STACK` record as its thread's stack.
    pub(super) fn keep(&mut self, record: &Sample) {
        if let Some(old) = self.by_thread.remove(&record.tid) {
            self.words -= old.words();
        }
        if self.by_thread.len() >= MAX_THREADS || self.words >= MAX_WORDS {
            self.let_go_of_exited();
        }
        let labels = match record.go_labels() {
            Some(block) => {
                let len = block.len();
                // SAFETY: the block is `len` readable bytes inside the
                // record (`len` is at most a whole block, and the sample's
                // `tail` holds one after any number of frames).
                unsafe { std::slice::from_raw_parts((block as *const GoLabels).cast::<u8>(), len) }
                    .to_vec()
            }
            None => Vec::new(),
        };
        let stack = UserStack {
            id: record.stack_id,
            pid: record.pid,
            user_end: record.user_end,
            unknown_mapping: record.flags & SAMPLE_FLAG_UNKNOWN_MAPPING != 0,
            frames: record.user_stack().to_vec(),
            labels,
        };
        self.words += stack.words();
        self.by_thread.insert(record.tid, stack);
    }

    /// Completes an off-CPU interval with the user stack it names, after
    /// its kernel frames.
    pub(super) fn join(&mut self, interval: &mut Sample) {
        if interval.stack_id == 0 {
            return;
        }
        let stack = match self.by_thread.get(&interval.tid) {
            Some(stack) if stack.id == interval.stack_id && stack.pid == interval.pid => stack,
            _ => {
                self.missing += 1;
                return;
            }
        };
        // Both fit: a record has at most MAX_STACK_DEPTH kernel frames
        // (`copy_record` checks) and a stack MAX_USER_WORDS user words,
        // and MAX_SAMPLE_FRAMES is their sum.
        let kernel = interval.kernel_frames as usize;
        let user = stack.frames.len();
        interval.frames[kernel..kernel + user].copy_from_slice(&stack.frames);
        interval.user_frames = user as u16;
        interval.user_end = stack.user_end;
        if stack.unknown_mapping {
            interval.flags |= SAMPLE_FLAG_UNKNOWN_MAPPING;
        }
        if !stack.labels.is_empty() && stack.labels.len() <= std::mem::size_of::<GoLabels>() {
            // SAFETY: `tail` leaves room for a whole labels block after any
            // number of frames, so these bytes lie inside the sample.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    stack.labels.as_ptr(),
                    (interval as *mut Sample)
                        .cast::<u8>()
                        .add(Sample::record_len(kernel + user)),
                    stack.labels.len(),
                );
            }
            interval.flags |= SAMPLE_FLAG_GO_LABELS;
        }
    }

    /// Intervals that named a stack not kept here.
    pub(super) fn missing(&self) -> u64 {
        self.missing
    }

    fn let_go_of_exited(&mut self) {
        self.by_thread.retain(|tid, stack| {
            std::path::Path::new(&format!("/proc/{}/task/{tid}", stack.pid)).exists()
        });
        self.words = self.by_thread.values().map(UserStack::words).sum();
        if self.by_thread.len() >= MAX_THREADS || self.words >= MAX_WORDS {
            self.by_thread.clear();
            self.words = 0;
        }
    }
}

impl UserStack {
    fn words(&self) -> usize {
        self.frames.len() + self.labels.len().div_ceil(8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{
        MAX_USER_FRAMES, SAMPLE_KIND_OFF_CPU, SAMPLE_KIND_OFF_CPU_STACK, runtimes::go::GoString,
        unwind::UserStackEnd,
    };

    fn record(kind: u8, tid: u32, stack_id: u32) -> Box<Sample> {
        // SAFETY: Sample is plain integers (aya::Pod): zeroes are valid.
        let mut sample: Box<Sample> = Box::new(unsafe { std::mem::zeroed() });
        sample.kind = kind;
        sample.pid = 7;
        sample.tid = tid;
        sample.stack_id = stack_id;
        sample
    }

    fn stack(tid: u32, id: u32, frames: &[u64]) -> Box<Sample> {
        let mut s = record(SAMPLE_KIND_OFF_CPU_STACK, tid, id);
        s.frames[..frames.len()].copy_from_slice(frames);
        s.user_frames = frames.len() as u16;
        s.user_end = UserStackEnd::Root as u8;
        s
    }

    fn interval(tid: u32, id: u32, kernel: &[u64]) -> Box<Sample> {
        let mut s = record(SAMPLE_KIND_OFF_CPU, tid, id);
        s.frames[..kernel.len()].copy_from_slice(kernel);
        s.kernel_frames = kernel.len() as u16;
        s
    }

    #[test]
    fn an_interval_gets_the_user_stack_it_names_after_its_kernel_frames() {
        let mut stacks = UserStacks::default();
        stacks.keep(&stack(10, 3, &[0x401000, 0x402000]));
        stacks.keep(&stack(11, 5, &[0x500000]));
        let mut joined = interval(10, 3, &[0xffff_8000_0000_1000]);
        stacks.join(&mut joined);
        assert_eq!(joined.kernel_stack(), [0xffff_8000_0000_1000]);
        assert_eq!(joined.user_stack(), [0x401000, 0x402000]);
        assert_eq!(joined.user_end, UserStackEnd::Root as u8);
        assert_eq!(stacks.missing(), 0);

        // A newer stack of the thread replaces the old one.
        stacks.keep(&stack(10, 9, &[0x403000]));
        let mut joined = interval(10, 9, &[]);
        stacks.join(&mut joined);
        assert_eq!(joined.user_stack(), [0x403000]);
    }

    #[test]
    fn an_interval_naming_a_lost_stack_keeps_its_kernel_stack_alone() {
        let mut stacks = UserStacks::default();
        stacks.keep(&stack(10, 3, &[0x401000]));
        // Stack 4 of thread 10 never arrived; thread 12 sent none.
        for (tid, id) in [(10, 4), (12, 1)] {
            let mut alone = interval(tid, id, &[0xffff_8000_0000_1000]);
            stacks.join(&mut alone);
            assert_eq!(alone.user_frames, 0);
            assert_eq!(alone.kernel_frames, 1);
        }
        assert_eq!(stacks.missing(), 2);
        // An interval with no stack to name (a kernel thread) is not a miss.
        let mut kernel_thread = interval(13, 0, &[0xffff_8000_0000_1000]);
        stacks.join(&mut kernel_thread);
        assert_eq!(stacks.missing(), 2);
    }

    #[test]
    fn deep_stacks_of_many_threads_stay_within_the_bound() {
        let mut stacks = UserStacks::default();
        let deep: Vec<u64> = (0..MAX_USER_FRAMES as u64).map(|i| 0x400000 + i).collect();
        // Threads of a process that is not there (no pid is that high),
        // so all count as exited when the bound is met.
        for tid in 0..3 * (MAX_WORDS / MAX_USER_FRAMES) as u32 {
            let mut record = stack(tid, 3, &deep);
            record.pid = u32::MAX;
            stacks.keep(&record);
            assert!(
                stacks.words <= MAX_WORDS + MAX_USER_FRAMES,
                "{}",
                stacks.words
            );
        }
        assert_eq!(
            stacks.words,
            stacks
                .by_thread
                .values()
                .map(UserStack::words)
                .sum::<usize>()
        );
        // The newest is kept.
        let last = 3 * (MAX_WORDS / MAX_USER_FRAMES) as u32 - 1;
        let mut joined = interval(last, 3, &[]);
        joined.pid = u32::MAX;
        stacks.join(&mut joined);
        assert_eq!(joined.user_frames as usize, MAX_USER_FRAMES);
    }

    #[test]
    fn the_deepest_kernel_and_user_stacks_fit_together() {
        let mut stacks = UserStacks::default();
        let user: Vec<u64> = (0..MAX_USER_FRAMES as u64).map(|i| 0x400000 + i).collect();
        stacks.keep(&stack(10, 3, &user));
        let kernel: Vec<u64> = (0..profiler_common::MAX_STACK_DEPTH as u64)
            .map(|i| 0xffff_8000_0000_0000 + i)
            .collect();
        let mut joined = interval(10, 3, &kernel);
        stacks.join(&mut joined);
        assert_eq!(joined.kernel_stack(), kernel);
        assert_eq!(joined.user_stack(), user);
        assert_eq!(joined.user_end, UserStackEnd::Root as u8);
    }

    #[test]
    fn go_labels_follow_the_stack_to_its_intervals() {
        let mut stacks = UserStacks::default();
        let mut with_labels = stack(10, 3, &[0x401000, 0x402000]);
        with_labels.flags |= SAMPLE_FLAG_GO_LABELS;
        // SAFETY: the block lies in the sample's tail, after two frames.
        unsafe {
            let block = (&mut *with_labels as *mut Sample)
                .cast::<u8>()
                .add(Sample::record_len(2))
                .cast::<GoLabels>();
            let block = &mut *block;
            block.goid = 42;
            block.count = 0;
            block.entries_len = 0;
            block.push(
                GoString::Copied(b"endpoint"),
                8,
                GoString::InBinary(0x401000),
                4,
            );
        }
        stacks.keep(&with_labels);
        let mut joined = interval(10, 3, &[0xffff_8000_0000_1000]);
        stacks.join(&mut joined);
        let labels = joined.go_labels().expect("the labels block");
        assert_eq!(labels.goid, 42);
        assert_eq!(labels.count, 1);
        let label = labels.labels().next().unwrap();
        assert_eq!(label.key, GoString::Copied(b"endpoint"));
        assert_eq!(label.value, GoString::InBinary(0x401000));
        assert_eq!(joined.wire_len(), with_labels.wire_len() + 8);
        assert_eq!(labels.len(), GoLabels::HEADER_LEN + 24);
    }
}

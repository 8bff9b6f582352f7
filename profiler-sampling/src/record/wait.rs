//! Why a thread was off its CPU: the reason label of off-CPU samples
//! (`wait=lock`, ...), from the kernel functions it blocked in and its task
//! state. Run-queue time (runnable, waiting for a CPU) is measured, not
//! inferred: the BPF side splits each interval at the thread's wakeup.

/// Reasons, as the `wait` label spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitReason {
    /// nanosleep, clock_nanosleep, timers.
    Sleep,
    /// futex (pthread mutexes and condition variables, Go's runtime
    /// locks), kernel mutexes and semaphores.
    Lock,
    /// epoll, poll, select, socket receives, sends, accepts, connects.
    Network,
    /// Waiting for block I/O: page-cache reads, fsync, writeback.
    Disk,
    /// A page fault (reading a mapped file, swapping in).
    PageFault,
    /// Runnable, waiting for a CPU: preempted, or woken and not yet run.
    RunQueue,
    /// Anything else (pipes, wait4, signals, ...).
    Other,
}

impl WaitReason {
    pub const ALL: [WaitReason; 7] = [
        WaitReason::Sleep,
        WaitReason::Lock,
        WaitReason::Network,
        WaitReason::Disk,
        WaitReason::PageFault,
        WaitReason::RunQueue,
        WaitReason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            WaitReason::Sleep => "sleep",
            WaitReason::Lock => "lock",
            WaitReason::Network => "network",
            WaitReason::Disk => "disk",
            WaitReason::PageFault => "page-fault",
            WaitReason::RunQueue => "runqueue",
            WaitReason::Other => "other",
        }
    }
}

/// Kernel functions that say why, by reason, matched as prefixes of the
/// frame's name. Order matters: the first reason with a frame anywhere in
/// the stack wins, so a page fault that waits for the disk is a page
/// fault, and an fsync that waits on a journal lock is disk I/O.
const MARKERS: &[(WaitReason, &[&str])] = &[
    (
        WaitReason::PageFault,
        &[
            "exc_page_fault",
            "asm_exc_page_fault",
            "do_user_addr_fault",
            "handle_mm_fault",
            // arm64
            "do_page_fault",
            "do_translation_fault",
            "el0_da",
            "el0_ia",
        ],
    ),
    (
        WaitReason::Disk,
        &[
            "io_schedule",
            "folio_wait_bit",
            "folio_wait_writeback",
            "wait_on_page_bit",
            "__wait_on_buffer",
            "bit_wait_io",
            "submit_bio_wait",
            "blk_mq_get_tag",
            "jbd2_",
            "ext4_sync_file",
            "xfs_file_fsync",
            "btrfs_sync_file",
            "vfs_fsync",
            "do_fsync",
            "__x64_sys_fsync",
            "__x64_sys_fdatasync",
            "__arm64_sys_fsync",
            "__arm64_sys_fdatasync",
            "file_write_and_wait",
            "filemap_write_and_wait",
            "__filemap_fdatawait",
            "filemap_read",
            "filemap_get_pages",
        ],
    ),
    (
        WaitReason::Lock,
        &[
            "futex_",
            "__futex_",
            "do_futex",
            "__x64_sys_futex",
            "__arm64_sys_futex",
            "__mutex_lock",
            "mutex_lock",
            "rwsem_down_",
            "down_read",
            "down_write",
            "__down",
            "rt_mutex",
            "rtlock_slowlock",
            "percpu_rwsem_wait",
        ],
    ),
    (
        WaitReason::Network,
        &[
            "ep_poll",
            "do_epoll_wait",
            "__x64_sys_epoll",
            "__arm64_sys_epoll",
            "do_sys_poll",
            "do_select",
            "core_sys_select",
            "do_pselect",
            "sk_wait_data",
            "sk_stream_wait",
            "__skb_wait_for_more_packets",
            "__skb_recv_datagram",
            "skb_recv_datagram",
            "tcp_recvmsg",
            "tcp_sendmsg",
            "udp_recvmsg",
            "unix_stream_read_generic",
            "unix_stream_sendmsg",
            "unix_dgram_recvmsg",
            "unix_wait_for_peer",
            "inet_csk_accept",
            "inet_csk_wait_for_connect",
            "inet_accept",
            "__inet_stream_connect",
            "inet_wait_for_connect",
            "sock_recvmsg",
            "sock_sendmsg",
            "__sys_recv",
            "__sys_send",
            "__sys_accept",
            "__sys_connect",
        ],
    ),
    (
        WaitReason::Sleep,
        &[
            "do_nanosleep",
            "hrtimer_nanosleep",
            "common_nsleep",
            "__x64_sys_nanosleep",
            "__x64_sys_clock_nanosleep",
            "__arm64_sys_nanosleep",
            "__arm64_sys_clock_nanosleep",
            "msleep",
            "usleep_range",
            "schedule_timeout_",
            "__x64_sys_pause",
            "__arm64_sys_pause",
        ],
    ),
];

/// How many frames at the leaf end of an off-CPU kernel stack (leaf first)
/// are our tracepoint program and the tracing code that called it (a stack
/// walked at the switch-out starts there).
pub fn tracing_frames(names: &[impl AsRef<str>]) -> usize {
    names
        .iter()
        .take_while(|n| {
            let n = n.as_ref();
            n.starts_with("bpf_")
                || n.starts_with("__bpf_")
                || n.starts_with("__traceiter_")
                || n.starts_with("trace_")
                || n.starts_with("__trace_")
        })
        .count()
}

/// Why a thread whose kernel stack (leaf first, scheduler frames already
/// cut) is `names` waited while blocked (its run-queue time is counted
/// apart).
pub fn classify(names: &[&str]) -> WaitReason {
    for (reason, prefixes) in MARKERS {
        if names
            .iter()
            .any(|name| prefixes.iter().any(|p| name.starts_with(p)))
        {
            return *reason;
        }
    }
    WaitReason::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernel stacks as the agent records them on Linux 6.18 x86_64 (leaf
    /// first), from the C off-CPU fixture.
    #[test]
    fn reasons_from_real_stacks() {
        let cases: &[(&[&str], WaitReason)] = &[
            (
                &[
                    "hrtimer_nanosleep",
                    "common_nsleep",
                    "__x64_sys_clock_nanosleep",
                    "do_syscall_64",
                    "entry_SYSCALL_64_after_hwframe",
                ],
                WaitReason::Sleep,
            ),
            (
                &[
                    "schedule",
                    "futex_wait_queue",
                    "__futex_wait",
                    "futex_wait",
                    "do_futex",
                    "__x64_sys_futex",
                    "do_syscall_64",
                ],
                WaitReason::Lock,
            ),
            (
                &[
                    "schedule",
                    "schedule_hrtimeout_range_clock",
                    "ep_poll",
                    "do_epoll_wait",
                    "__x64_sys_epoll_wait",
                ],
                WaitReason::Network,
            ),
            (
                &[
                    "schedule",
                    "io_schedule",
                    "folio_wait_bit_common",
                    "filemap_fault",
                    "__do_fault",
                    "handle_mm_fault",
                    "do_user_addr_fault",
                    "exc_page_fault",
                ],
                WaitReason::PageFault,
            ),
            (
                &[
                    "schedule",
                    "jbd2_log_wait_commit",
                    "ext4_sync_file",
                    "__x64_sys_fsync",
                ],
                WaitReason::Disk,
            ),
            (
                &[
                    "schedule",
                    "pipe_read",
                    "vfs_read",
                    "ksys_read",
                    "__x64_sys_read",
                ],
                WaitReason::Other,
            ),
        ];
        for (stack, reason) in cases {
            assert_eq!(classify(stack), *reason, "{stack:?}");
        }
    }

    #[test]
    fn tracing_frames_are_cut() {
        let at_switch_out = [
            "bpf_prog_6896d07dd3e1383c_off_cpu_switch",
            "bpf_trace_run4",
            "__schedule",
            "schedule",
            "do_nanosleep",
        ];
        assert_eq!(tracing_frames(&at_switch_out), 2);
        assert_eq!(tracing_frames(&["__schedule", "schedule"]), 0);
    }
}

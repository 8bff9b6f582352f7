//! The Go runtime's structures the heap and goroutine readers use, by Go
//! version (from `.go.buildinfo`, which stripped binaries keep).
//!
//! Read from the DWARF of binaries each toolchain built (1.19, 1.21 to
//! 1.27; amd64 and arm64 identical), the full tables being in
//! docs/design/go-runtime-state.md. Go 1.20 could not be checked (no
//! toolchain): its `g` fields after `lockedm` are unknown, so goroutine
//! dumps refuse it; its heap records are as in every other version.
//! Every read through these offsets is validated against the process
//! (goid 1 exists, a status in range, the stack pointer in the stack).

/// Offsets in `runtime.g`, `runtime.m` and the memory profile's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeLayout {
    pub minor: u32,
    pub g_stack_lo: u64,
    pub g_stack_hi: u64,
    pub g_m: u64,
    pub g_sched_sp: u64,
    pub g_sched_pc: u64,
    pub g_sched_bp: u64,
    pub g_syscall_sp: u64,
    pub g_syscall_pc: u64,
    pub g_status: u64,
    pub g_goid: u64,
    pub g_waitsince: u64,
    pub g_waitreason: u64,
    pub g_lockedm: u64,
    pub g_parent_goid: Option<u64>,
    pub g_gopc: u64,
    pub g_startpc: u64,
    pub g_labels: u64,
    pub m_procid: u64,
    /// `memRecordCycle`: {allocs, frees, alloc_bytes, free_bytes} until
    /// 1.26 (32 bytes), {allocs, frees} from 1.27 (16: bytes are counts
    /// times the bucket's object size).
    pub mem_cycle_bytes: u64,
    /// How `g.labels` holds a label set: a `map[string]string` (1.19 to
    /// 1.23), or a sorted slice of {key, value} (1.24 on).
    pub labels_in_map: bool,
    /// `FuncIDWrapper`: compiler-made wrapper frames, left out of
    /// goroutine stacks.
    pub func_id_wrapper: u8,
}

/// The bucket header (every version): next, allnext, type, hash, object
/// size, stack depth; the stack follows.
pub const BUCKET_ALLNEXT: u64 = 8;
pub const BUCKET_TYPE: u64 = 16;
pub const BUCKET_SIZE: u64 = 32;
pub const BUCKET_NSTK: u64 = 40;
pub const BUCKET_STACK: u64 = 48;
/// `bucketType` of a memory profile bucket.
pub const MEM_PROFILE: u64 = 1;

impl RuntimeLayout {
    /// The layout of Go 1.`minor`; None for versions not known (1.20's
    /// goroutine fields, anything after 1.27).
    pub fn of(minor: u32) -> Option<RuntimeLayout> {
        // (status, goid, waitsince, waitreason, lockedm, parentGoid, gopc,
        //  startpc, labels, sched.bp, syscallsp, syscallpc, m.procid)
        #[allow(clippy::type_complexity)]
        let row: (
            u64,
            u64,
            u64,
            u64,
            u64,
            Option<u64>,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
        ) = match minor {
            19 => (
                144, 152, 168, 176, 232, None, 296, 312, 360, 104, 112, 120, 72,
            ),
            21 | 22 => (
                144,
                152,
                168,
                176,
                208,
                Some(272),
                280,
                296,
                344,
                104,
                112,
                120,
                72,
            ),
            23 | 24 => (
                152,
                160,
                176,
                184,
                216,
                Some(280),
                288,
                304,
                352,
                104,
                112,
                120,
                72,
            ),
            25 => (
                144,
                152,
                168,
                176,
                208,
                Some(272),
                280,
                296,
                344,
                96,
                104,
                112,
                64,
            ),
            26 | 27 => (
                144,
                152,
                168,
                176,
                208,
                Some(280),
                288,
                304,
                352,
                96,
                104,
                112,
                64,
            ),
            _ => return None,
        };
        let (status, goid, waitsince, waitreason, lockedm, parent, gopc, startpc, labels) = (
            row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
        );
        Some(RuntimeLayout {
            minor,
            g_stack_lo: 0,
            g_stack_hi: 8,
            g_m: 48,
            g_sched_sp: 56,
            g_sched_pc: 64,
            g_sched_bp: row.9,
            g_syscall_sp: row.10,
            g_syscall_pc: row.11,
            g_status: status,
            g_goid: goid,
            g_waitsince: waitsince,
            g_waitreason: waitreason,
            g_lockedm: lockedm,
            g_parent_goid: parent,
            g_gopc: gopc,
            g_startpc: startpc,
            g_labels: labels,
            m_procid: row.12,
            mem_cycle_bytes: if minor >= 27 { 16 } else { 32 },
            labels_in_map: minor <= 23,
            func_id_wrapper: match minor {
                ..=21 => 21,
                22..=24 => 22,
                _ => 23,
            },
        })
    }

    /// The memory profile's record layout alone (every version from 1.19;
    /// 1.20 included: its bucket and records are those of 1.19 and 1.21).
    pub fn mem_cycle_bytes_of(minor: u32) -> Option<u64> {
        match minor {
            19..=26 => Some(32),
            27 => Some(16),
            _ => None,
        }
    }
}

/// `gStatusStrings` (runtime/traceback.go), by status with the scan bit
/// cleared.
pub const STATUS_NAMES: [&str; 12] = [
    "idle",
    "runnable",
    "running",
    "syscall",
    "waiting",
    "",
    "dead",
    "",
    "copystack",
    "preempted",
    "leaked",
    "waiting for cgo callback",
];
pub const STATUS_RUNNING: u32 = 2;
pub const STATUS_SYSCALL: u32 = 3;
pub const STATUS_WAITING: u32 = 4;
pub const STATUS_DEAD: u32 = 6;
pub const STATUS_LEAKED: u32 = 10;
/// 1.26: a g kept for cgo callbacks, dead to tracebacks.
pub const STATUS_DEAD_EXTRA: u32 = 11;
pub const STATUS_SCAN: u32 = 0x1000;

/// "goX.Y.Z" (or "goX.Y") → Y.
pub fn minor_of(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_have_their_layouts() {
        assert_eq!(minor_of("go1.27.3"), Some(27));
        assert_eq!(minor_of("go1.21rc2"), Some(21));
        assert_eq!(minor_of("devel"), None);
        assert_eq!(RuntimeLayout::of(23).unwrap().g_goid, 160);
        assert_eq!(RuntimeLayout::of(25).unwrap().g_sched_bp, 96);
        assert_eq!(RuntimeLayout::of(27).unwrap().mem_cycle_bytes, 16);
        assert!(RuntimeLayout::of(20).is_none());
        assert_eq!(RuntimeLayout::mem_cycle_bytes_of(20), Some(32));
        assert!(RuntimeLayout::of(28).is_none());
    }
}

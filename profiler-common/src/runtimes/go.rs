//! Go goroutine labels: what the sampling program copies from a Go
//! process at each CPU sample (the labels `pprof.Do` and
//! `pprof.SetGoroutineLabels` attach to the running goroutine, and its id).
//!
//! User space tells the program where a process's runtime keeps them
//! (`GoProcess`, one per Go process, from the binary's DWARF or a table
//! keyed by its Go version); the program finds the thread's current
//! goroutine (`m.curg`), copies at most `MAX_GO_LABELS` labels with keys
//! and values cut to fixed sizes, and appends them to the sample record
//! after its frames (`SAMPLE_FLAG_GO_LABELS`). What was cut is marked in
//! the record and counted.

/// Labels copied per sample. Go programs attach a handful (an endpoint, a
/// tenant, a job kind); more are cut and the cut counted.
pub const MAX_GO_LABELS: usize = 8;
/// Bytes of a label key kept; longer keys are cut.
pub const GO_LABEL_KEY_BYTES: usize = 32;
/// Bytes of a label value kept; longer values are cut.
pub const GO_LABEL_VALUE_BYTES: usize = 96;

/// `GoProcess::kind`: `g.labels` points at a `*labelMap` variable holding
/// a `map[string]string` (runtime/pprof in Go 1.19 to 1.23).
pub const GO_LABELS_MAP: u8 = 1;
/// `GoProcess::kind`: `g.labels` points at a `labelMap` struct whose first
/// field is a slice of `{key, value string}`, sorted by key (Go 1.24 on).
pub const GO_LABELS_SLICE: u8 = 2;

/// `GoProcess::flags`: `tls_g_offset` is valid (the runtime keeps the
/// current g in thread-local storage at that offset from the thread
/// pointer: every amd64 Go program).
pub const GO_PROCESS_TLS: u8 = 1 << 0;

/// Where one Go process keeps its goroutines and their labels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoProcess {
    /// Offset of the current g from the thread pointer (FS base on amd64),
    /// when `flags` has `GO_PROCESS_TLS`.
    pub tls_g_offset: i64,
    /// Offsets in `runtime.g` of `m`, `goid` and `labels`.
    pub g_m: u16,
    pub g_goid: u16,
    pub g_labels: u16,
    /// Offset in `runtime.m` of `curg` (`g0` is its first field in every
    /// Go version).
    pub m_curg: u16,
    /// `GO_LABELS_MAP` or `GO_LABELS_SLICE`.
    pub kind: u8,
    /// Bit set of `GO_PROCESS_*`.
    pub flags: u8,
    pub _pad: [u8; 6],
    /// The process's addresses of its Go binary's read-only data (string
    /// constants: most label keys and many values), `[start, end)`; 0 and
    /// 0 when unknown. A label string there is not copied: its address
    /// goes in the record (`GoLabels::in_binary`) and user space reads it
    /// from the binary's file once.
    pub strings_start: u64,
    pub strings_end: u64,
}

/// One copied label. `key_len` and `value_len` are the lengths of the Go
/// strings; only the first `GO_LABEL_*_BYTES` bytes of each are kept. A
/// string in the binary's read-only data (`GoLabels::in_binary`) is not
/// copied: the first 8 bytes of `key` or `value` hold its address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GoLabel {
    pub key_len: u32,
    pub value_len: u32,
    pub key: [u8; GO_LABEL_KEY_BYTES],
    pub value: [u8; GO_LABEL_VALUE_BYTES],
}

/// `GoLabels::flags`: the goroutine had more labels than were copied, or
/// a map's entries could not all be reached (a map being grown).
pub const GO_LABELS_CUT: u8 = 1 << 0;

/// The labels of the goroutine a sample caught, as appended to its
/// record: this header, then `count` `GoLabel`s.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GoLabels {
    /// The goroutine's id (`g.goid`).
    pub goid: u64,
    /// Labels copied.
    pub count: u8,
    /// Bit set of `GO_LABELS_*`.
    pub flags: u8,
    pub _pad: [u8; 2],
    /// Bit `2 * i` (key) and `2 * i + 1` (value) of label `i`: that string
    /// lies in the binary's read-only data (`GoProcess::strings_start`),
    /// and its address was written instead of its bytes. Copying a string
    /// was a quarter of a labelled sample's cost in the kernel
    /// (docs/architecture.md, "Measured inside one program").
    pub in_binary: u32,
    pub labels: [GoLabel; MAX_GO_LABELS],
}

/// `GoLabels::in_binary`'s bit for label `index`'s key.
pub const fn key_in_binary(index: usize) -> u32 {
    1 << (2 * index)
}

/// `GoLabels::in_binary`'s bit for label `index`'s value.
pub const fn value_in_binary(index: usize) -> u32 {
    1 << (2 * index + 1)
}

const _: () = assert!(2 * MAX_GO_LABELS <= 32);

impl GoLabels {
    /// Bytes before `labels`.
    pub const HEADER_LEN: usize = core::mem::offset_of!(GoLabels, labels);

    /// Length of a block holding `count` labels.
    pub const fn block_len(count: usize) -> usize {
        Self::HEADER_LEN + count * core::mem::size_of::<GoLabel>()
    }
}

impl GoLabel {
    /// The address written in place of the key's bytes (see
    /// `GoLabels::in_binary`).
    pub fn key_address(&self) -> u64 {
        address_in(&self.key)
    }

    /// The address written in place of the value's bytes.
    pub fn value_address(&self) -> u64 {
        address_in(&self.value)
    }

    /// The kept bytes of the key, and whether it was cut.
    pub fn key(&self) -> (&[u8], bool) {
        kept(&self.key, self.key_len)
    }

    /// The kept bytes of the value, and whether it was cut.
    pub fn value(&self) -> (&[u8], bool) {
        kept(&self.value, self.value_len)
    }
}

fn address_in(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_ne_bytes(word)
}

fn kept(bytes: &[u8], len: u32) -> (&[u8], bool) {
    let len = len as usize;
    if len > bytes.len() {
        (bytes, true)
    } else {
        (&bytes[..len], false)
    }
}

/// Go processes the sampling program knows at once.
pub const MAX_GO_PROCESSES: u32 = 4096;

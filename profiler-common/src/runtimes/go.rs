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

/// Bytes of one label entry at its largest: the two lengths, the key's
/// area and the value's (see `GoLabels::entries`).
pub const GO_LABEL_ENTRY_MAX: usize = 8 + GO_LABEL_KEY_BYTES + GO_LABEL_VALUE_BYTES;

/// The largest offset in `GoLabels::entries` at which an entry starts:
/// after `MAX_GO_LABELS - 1` entries at their largest.
pub const GO_LABELS_LAST_ENTRY: usize = (MAX_GO_LABELS - 1) * GO_LABEL_ENTRY_MAX;

/// What the sampling program masks an entry's offset with before it
/// writes there. The kernel's verifier must see every write in bounds
/// from that offset's range alone, and a mask is a bound it keeps (a
/// comparison, arm64's 6.1 verifier lost: the compiler spilled the value
/// before comparing and computed the address from the spilled copy).
pub const GO_LABELS_OFFSET_MASK: usize = 1023;

/// Bytes of `GoLabels::entries`: an entry at its largest after the
/// largest masked offset, as the verifier bounds it (a key's area taken
/// as up to 63 bytes, and a value's last word, which the program zeroes
/// under a mask too, as ending up to the next power of two).
pub const GO_LABELS_ROOM: usize =
    (GO_LABELS_OFFSET_MASK + 1 + 8 + 63 + GO_LABEL_VALUE_BYTES.next_power_of_two() + 7) & !7;

const _: () = assert!(GO_LABELS_LAST_ENTRY <= GO_LABELS_OFFSET_MASK);
const _: () = assert!((GO_LABELS_OFFSET_MASK + 1).is_power_of_two());
const _: () = assert!(GO_LABELS_ROOM <= u16::MAX as usize && GO_LABELS_ROOM.is_multiple_of(8));

/// `GoLabels::flags`: the goroutine had more labels than were copied, or
/// a map's entries could not all be reached (a map being grown).
pub const GO_LABELS_CUT: u8 = 1 << 0;

/// The labels of the goroutine a sample caught, as appended to its
/// record: this header, then `entries_len` bytes of `entries`. Only those
/// bytes travel: the ring buffer's copy costs about 1 ns a byte, and fixed
/// slots (136 bytes a label, whatever its strings) made a two-label block
/// 288 bytes where these take 48 to 64 (docs/architecture.md).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GoLabels {
    /// The goroutine's id (`g.goid`).
    pub goid: u64,
    /// Labels in `entries`.
    pub count: u8,
    /// Bit set of `GO_LABELS_*`.
    pub flags: u8,
    /// Bytes of `entries` written, a multiple of 8.
    pub entries_len: u16,
    /// Bit `2 * i` (key) and `2 * i + 1` (value) of label `i`: that string
    /// lies in the binary's read-only data (`GoProcess::strings_start`),
    /// and its address was written instead of its bytes. Copying a string
    /// was a quarter of a labelled sample's cost in the kernel
    /// (docs/architecture.md, "Measured inside one program").
    pub in_binary: u32,
    /// `count` entries, one after another, each 8-byte aligned: the key's
    /// and the value's lengths as Go has them (`u32` each), then the key's
    /// area, then the value's. A string in the binary's read-only data has
    /// an 8-byte area, its address; any other has its first bytes, at most
    /// `GO_LABEL_KEY_BYTES` or `GO_LABEL_VALUE_BYTES`, zero-padded to a
    /// multiple of 8 (`area_len`).
    pub entries: [u8; GO_LABELS_ROOM],
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

/// Bytes of a string's area in a label entry: its address (8) when it
/// lies in the binary, else its first `len` bytes, at most `cap`, rounded
/// up to whole words.
pub const fn area_len(in_binary: bool, len: u64, cap: usize) -> usize {
    if in_binary {
        return 8;
    }
    let kept = if len > cap as u64 { cap } else { len as usize };
    (kept + 7) & !7
}

impl GoLabels {
    /// Bytes before `entries`.
    pub const HEADER_LEN: usize = core::mem::offset_of!(GoLabels, entries);

    /// Bytes of the block as sent: the header and the entries written.
    pub fn len(&self) -> usize {
        Self::HEADER_LEN + (self.entries_len as usize).min(GO_LABELS_ROOM)
    }

    /// Whether the block has no labels.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The labels, in the order they were written. Stops early at an
    /// entry that does not fit in `entries_len`.
    pub fn labels(&self) -> GoLabelIter<'_> {
        GoLabelIter {
            block: self,
            index: 0,
            at: 0,
        }
    }

    /// Appends a label: user space's counterpart of the sampling
    /// program's writer, for tests and for the format's own checks. False
    /// when `MAX_GO_LABELS` are there already.
    pub fn push(
        &mut self,
        key: GoString<'_>,
        key_len: u32,
        value: GoString<'_>,
        value_len: u32,
    ) -> bool {
        let index = self.count as usize;
        let at = self.entries_len as usize;
        if index >= MAX_GO_LABELS || at > GO_LABELS_LAST_ENTRY {
            return false;
        }
        let entry = &mut self.entries[at..];
        entry[..4].copy_from_slice(&key_len.to_ne_bytes());
        entry[4..8].copy_from_slice(&value_len.to_ne_bytes());
        let key_area = put(&mut entry[8..], key, key_len, GO_LABEL_KEY_BYTES);
        let value_area = put(
            &mut entry[8 + key_area..],
            value,
            value_len,
            GO_LABEL_VALUE_BYTES,
        );
        if matches!(key, GoString::InBinary(_)) {
            self.in_binary |= key_in_binary(index);
        }
        if matches!(value, GoString::InBinary(_)) {
            self.in_binary |= value_in_binary(index);
        }
        self.entries_len = (at + 8 + key_area + value_area) as u16;
        self.count += 1;
        true
    }
}

/// Writes one string's area at the start of `area`; its length.
fn put(area: &mut [u8], string: GoString<'_>, len: u32, cap: usize) -> usize {
    match string {
        GoString::InBinary(address) => {
            area[..8].copy_from_slice(&address.to_ne_bytes());
            8
        }
        GoString::Copied(bytes) => {
            let n = area_len(false, len as u64, cap);
            area[..n].fill(0);
            let kept = bytes.len().min(n);
            area[..kept].copy_from_slice(&bytes[..kept]);
            n
        }
    }
}

/// One string of a label as the sampling program kept it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoString<'a> {
    /// It lies in the binary's read-only data, at this address.
    InBinary(u64),
    /// Its first bytes, at most `GO_LABEL_KEY_BYTES` or
    /// `GO_LABEL_VALUE_BYTES` (fewer when the string is shorter).
    Copied(&'a [u8]),
}

/// One label of a `GoLabels` block. `key_len` and `value_len` are the Go
/// strings' lengths, which may exceed what was kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoLabel<'a> {
    pub key_len: u32,
    pub value_len: u32,
    pub key: GoString<'a>,
    pub value: GoString<'a>,
}

/// The labels of a block (`GoLabels::labels`).
pub struct GoLabelIter<'a> {
    block: &'a GoLabels,
    index: usize,
    at: usize,
}

impl<'a> Iterator for GoLabelIter<'a> {
    type Item = GoLabel<'a>;

    fn next(&mut self) -> Option<GoLabel<'a>> {
        let block = self.block;
        if self.index >= (block.count as usize).min(MAX_GO_LABELS) {
            return None;
        }
        let written = &block.entries[..(block.entries_len as usize).min(GO_LABELS_ROOM)];
        let entry = written.get(self.at..)?;
        let key_len = u32::from_ne_bytes(entry.get(..4)?.try_into().ok()?);
        let value_len = u32::from_ne_bytes(entry.get(4..8)?.try_into().ok()?);
        let key_in = block.in_binary & key_in_binary(self.index) != 0;
        let value_in = block.in_binary & value_in_binary(self.index) != 0;
        let key_area = area_len(key_in, key_len as u64, GO_LABEL_KEY_BYTES);
        let value_area = area_len(value_in, value_len as u64, GO_LABEL_VALUE_BYTES);
        let key = string(entry.get(8..8 + key_area)?, key_in, key_len);
        let value = string(
            entry.get(8 + key_area..8 + key_area + value_area)?,
            value_in,
            value_len,
        );
        self.index += 1;
        self.at += 8 + key_area + value_area;
        Some(GoLabel {
            key_len,
            value_len,
            key,
            value,
        })
    }
}

/// A string from its area: the address, or the kept bytes (the area
/// without its padding).
fn string(area: &[u8], in_binary: bool, len: u32) -> GoString<'_> {
    if in_binary {
        let mut word = [0u8; 8];
        word.copy_from_slice(&area[..8]);
        return GoString::InBinary(u64::from_ne_bytes(word));
    }
    GoString::Copied(&area[..(len as usize).min(area.len())])
}

/// Go processes the sampling program knows at once.
pub const MAX_GO_PROCESSES: u32 = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> GoLabels {
        GoLabels {
            goid: 7,
            count: 0,
            flags: 0,
            entries_len: 0,
            in_binary: 0,
            entries: [0xaa; GO_LABELS_ROOM],
        }
    }

    #[test]
    fn labels_read_back_as_written_and_take_only_their_bytes() {
        let mut block = empty();
        assert!(block.push(
            GoString::InBinary(0x401000),
            8,
            GoString::Copied(b"gold"),
            4
        ));
        assert!(block.push(
            GoString::Copied(b"zone"),
            4,
            GoString::InBinary(0x402000),
            9
        ));
        let long = [b'y'; 200];
        assert!(block.push(
            GoString::Copied(&long[..32]),
            40,
            GoString::Copied(&long[..96]),
            200
        ));
        // 8 + 8 + 8, 8 + 8 + 8, 8 + 32 + 96.
        assert_eq!(block.entries_len, 24 + 24 + 136);
        assert_eq!(block.len(), GoLabels::HEADER_LEN + 184);
        let labels: [_; 3] = core::array::from_fn(|i| block.labels().nth(i).unwrap());
        assert_eq!(block.labels().count(), 3);
        assert_eq!(labels[0].key, GoString::InBinary(0x401000));
        assert_eq!(labels[0].value, GoString::Copied(b"gold"));
        assert_eq!(labels[1].key, GoString::Copied(b"zone"));
        assert_eq!(labels[1].value, GoString::InBinary(0x402000));
        assert_eq!(labels[2].key, GoString::Copied(&long[..32]));
        assert_eq!(labels[2].value, GoString::Copied(&long[..96]));
        assert_eq!((labels[2].key_len, labels[2].value_len), (40, 200));
        // The padding after "gold" is zeroes, not what the room held.
        assert_eq!(&block.entries[8..24], b"\0\x10@\0\0\0\0\0gold\0\0\0\0");
    }

    #[test]
    fn eight_labels_at_their_largest_fit() {
        let mut block = empty();
        let long = [b'k'; 96];
        for _ in 0..MAX_GO_LABELS {
            assert!(block.push(
                GoString::Copied(&long[..32]),
                32,
                GoString::Copied(&long),
                96
            ));
        }
        assert!(!block.push(GoString::InBinary(1), 1, GoString::InBinary(2), 1));
        assert_eq!(block.labels().count(), MAX_GO_LABELS);
    }

    #[test]
    fn a_forged_block_ends_where_its_bytes_do() {
        let mut block = empty();
        block.push(GoString::Copied(b"tier"), 4, GoString::Copied(b"gold"), 4);
        block.count = 8;
        block.entries_len = 16;
        assert_eq!(block.labels().count(), 0);
        block.entries_len = 24;
        assert_eq!(block.labels().count(), 1);
        block.entries_len = u16::MAX;
        assert!(block.len() <= core::mem::size_of::<GoLabels>());
    }
}

//! Where a CPython interpreter keeps its threads, frames and code objects.
//!
//! 3.13 on, the interpreter says so itself: `_Py_DebugOffsets`, the struct
//! at the start of `_PyRuntime` (cookie `xdebugpy`, its version, then the
//! offsets out-of-process tools need; `Include/internal/pycore_debug_offsets.h`),
//! read from the process. Its own layout grew between 3.13 and 3.14, so it
//! is parsed by its `version`. For 3.10 to 3.12 there is one table per
//! minor version (the offsets did not change between patch releases:
//! checked with each version's headers and live processes, and against
//! others' per-patch data), and the table is checked against what the
//! binary says of itself (`PyCode_Type`'s member table and basic size)
//! before it is used: a build whose layout differs is refused, not
//! guessed at.
//!
//! What the debug offsets do not hold (3.11/3.12's `_PyCFrame`, 3.11's
//! `is_entry`, the frame owner values, 3.14's stack-reference tag, the
//! size of compact strings) is per minor version here too.

use profiler_common::runtimes::python::{PY_LAYOUT_310, PY_LAYOUT_311, PY_LAYOUT_312, PyProcess};

use profiler_runtime::memory::Memory;

/// Every offset the walker and the symbolizer read, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub minor: u8,
    /// Where the offsets came from.
    pub source: LayoutSource,
    // _PyRuntime, interpreters, thread states.
    pub runtime_interpreters_head: u64,
    pub interpreter_next: u64,
    pub interpreter_threads_head: u64,
    pub thread_next: u64,
    /// `native_thread_id` (the thread's `gettid()`), 3.11 on.
    pub thread_native_id: Option<u64>,
    /// `thread_id` (`pthread_self()`).
    pub thread_id: u64,
    /// The current frame, or 3.11/3.12's `cframe`.
    pub thread_frame: u64,
    /// In `_PyCFrame`: `current_frame` (3.11, 3.12).
    pub cframe_frame: Option<u64>,
    // Frames.
    pub frame_layout: u8,
    pub frame_previous: u64,
    pub frame_code: u64,
    pub frame_instr: u64,
    pub frame_owner: Option<u64>,
    pub frame_is_entry: Option<u64>,
    /// Entry frames have an owner at or above this (3.12 on).
    pub owner_entry: u8,
    /// Low bits of the code pointer that are tags (3.14's `_PyStackRef`).
    pub code_tag_bits: u64,
    // Code objects.
    pub code_filename: u64,
    pub code_name: u64,
    pub code_qualname: Option<u64>,
    pub code_firstlineno: u64,
    pub code_linetable: u64,
    /// Where the bytecode starts (3.11 on: `co_code_adaptive`).
    pub code_adaptive: Option<u64>,
    // Strings.
    /// Data of a compact ASCII string (`sizeof(PyASCIIObject)`).
    pub unicode_ascii_data: u64,
    /// Data of a compact non-ASCII string (`sizeof(PyCompactUnicodeObject)`).
    pub unicode_compact_data: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutSource {
    /// The interpreter's `_Py_DebugOffsets` (3.13 on).
    DebugOffsets,
    /// The table for its minor version, checked against the binary.
    VersionTable,
}

/// Why an interpreter's layout is not known: the process's samples keep
/// their native frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("Python 3.{0} is not supported (3.10 to 3.14 are); its frames stay native")]
    UnknownMinor(u8),
    #[error("a free-threaded build (3.{0}t) is not supported; its frames stay native")]
    FreeThreaded(u8),
    #[error("_Py_DebugOffsets: {0}")]
    DebugOffsets(String),
    #[error("the binary disagrees with the 3.{minor} layout ({what}); its frames stay native")]
    Mismatch { minor: u8, what: String },
    #[error("reading the interpreter: {0}")]
    Read(String),
}

/// Offsets in `PyTypeObject` and `PyMemberDef` (every version, LP64).
const TYPE_BASICSIZE: u64 = 32;
const TYPE_MEMBERS: u64 = 240;
const MEMBER_SIZE: u64 = 40;
const MEMBER_OFFSET: u64 = 16;
/// Members of a type's table read at most (`PyCode_Type` has about 16).
const MAX_MEMBERS: usize = 64;

impl Layout {
    /// The table of a minor version without debug offsets (3.10 to 3.12),
    /// or the fallback values of 3.13 and 3.14 (their debug offsets are
    /// read over them).
    pub fn table(minor: u8) -> Result<Layout, LayoutError> {
        let layout = match minor {
            10 => Layout {
                minor,
                source: LayoutSource::VersionTable,
                runtime_interpreters_head: 32,
                interpreter_next: 0,
                interpreter_threads_head: 8,
                thread_next: 8,
                thread_native_id: None,
                thread_id: 176,
                thread_frame: 24,
                cframe_frame: None,
                frame_layout: PY_LAYOUT_310,
                frame_previous: 24,
                frame_code: 32,
                frame_instr: 96,
                frame_owner: None,
                frame_is_entry: None,
                owner_entry: 0,
                code_tag_bits: 0,
                code_filename: 104,
                code_name: 112,
                code_qualname: None,
                code_firstlineno: 40,
                code_linetable: 120,
                code_adaptive: None,
                unicode_ascii_data: 48,
                unicode_compact_data: 72,
            },
            11 => Layout {
                minor,
                source: LayoutSource::VersionTable,
                runtime_interpreters_head: 40,
                interpreter_next: 0,
                interpreter_threads_head: 16,
                thread_next: 8,
                thread_native_id: Some(160),
                thread_id: 152,
                thread_frame: 56,
                cframe_frame: Some(8),
                frame_layout: PY_LAYOUT_311,
                frame_previous: 48,
                frame_code: 32,
                frame_instr: 56,
                frame_owner: Some(69),
                frame_is_entry: Some(68),
                owner_entry: 0,
                code_tag_bits: 0,
                code_filename: 112,
                code_name: 120,
                code_qualname: Some(128),
                code_firstlineno: 72,
                code_linetable: 136,
                code_adaptive: Some(184),
                unicode_ascii_data: 48,
                unicode_compact_data: 72,
            },
            12 => Layout {
                minor,
                source: LayoutSource::VersionTable,
                runtime_interpreters_head: 40,
                interpreter_next: 0,
                interpreter_threads_head: 72,
                thread_next: 8,
                thread_native_id: Some(144),
                thread_id: 136,
                thread_frame: 56,
                cframe_frame: Some(0),
                frame_layout: PY_LAYOUT_312,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                frame_owner: Some(70),
                frame_is_entry: None,
                owner_entry: 3,
                code_tag_bits: 0,
                code_filename: 112,
                code_name: 120,
                code_qualname: Some(128),
                code_firstlineno: 68,
                code_linetable: 136,
                code_adaptive: Some(192),
                unicode_ascii_data: 40,
                unicode_compact_data: 56,
            },
            13 | 14 => Layout {
                minor,
                source: LayoutSource::VersionTable,
                runtime_interpreters_head: if minor == 13 { 632 } else { 808 },
                interpreter_next: if minor == 13 { 7264 } else { 7272 },
                interpreter_threads_head: 7344,
                thread_next: 8,
                thread_native_id: Some(160),
                thread_id: 152,
                thread_frame: 72,
                cframe_frame: None,
                frame_layout: PY_LAYOUT_312,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                frame_owner: Some(if minor == 13 { 70 } else { 74 }),
                frame_is_entry: None,
                // 3.13: FRAME_OWNED_BY_CSTACK = 3; 3.14 adds
                // FRAME_OWNED_BY_INTERPRETER = 3 (what entry frames are)
                // before CSTACK = 4: CPython's own test is owner >= 3.
                owner_entry: 3,
                // 3.14: `f_executable` is a `_PyStackRef`, tagged in its low
                // bits (Py_TAG_BITS = 3 in the GIL build).
                code_tag_bits: if minor == 13 { 0 } else { 3 },
                code_filename: 112,
                code_name: 120,
                code_qualname: Some(128),
                code_firstlineno: 68,
                code_linetable: 136,
                code_adaptive: Some(if minor == 13 { 200 } else { 208 }),
                unicode_ascii_data: 40,
                unicode_compact_data: 56,
            },
            other => return Err(LayoutError::UnknownMinor(other)),
        };
        Ok(layout)
    }

    /// What the BPF walker is given. Each offset must fit the `u16` the
    /// walker stores it in, below `PyProcess::NONE` (which means "no such
    /// field"): a forged 65536 would otherwise become 0 and the walker
    /// read a field the layout never named.
    pub fn for_bpf(&self) -> Result<PyProcess, LayoutError> {
        let field = |name: &str, o: u64| {
            u16::try_from(o)
                .ok()
                .filter(|&o| o < PyProcess::NONE)
                .ok_or_else(|| {
                    LayoutError::DebugOffsets(format!(
                        "{name} = {o} does not fit the walker's 16-bit offsets"
                    ))
                })
        };
        let optional =
            |name: &str, o: Option<u64>| o.map_or(Ok(PyProcess::NONE), |o| field(name, o));
        Ok(PyProcess {
            layout: self.frame_layout,
            owner_entry: self.owner_entry,
            minor: self.minor,
            _pad: 0,
            thread_frame: field("thread_state.current_frame", self.thread_frame)?,
            cframe_frame: optional("cframe.current_frame", self.cframe_frame)?,
            frame_previous: field("interpreter_frame.previous", self.frame_previous)?,
            frame_code: field("interpreter_frame.executable", self.frame_code)?,
            frame_instr: field("interpreter_frame.instr_ptr", self.frame_instr)?,
            frame_owner: optional("interpreter_frame.owner", self.frame_owner)?,
            frame_is_entry: optional("interpreter_frame.is_entry", self.frame_is_entry)?,
            _pad2: 0,
            code_tag_bits: self.code_tag_bits,
        })
    }

    /// Reads `_Py_DebugOffsets` at `runtime` (the address of `_PyRuntime`)
    /// over the table of its minor version.
    pub fn from_debug_offsets(memory: &impl Memory, runtime: u64) -> Result<Layout, LayoutError> {
        let header = memory
            .array::<24>(runtime)
            .map_err(|e| LayoutError::Read(format!("_PyRuntime at {runtime:#x}: {e}")))?;
        if &header[..8] != b"xdebugpy" {
            return Err(LayoutError::DebugOffsets(
                "no \"xdebugpy\" cookie at the start of _PyRuntime".into(),
            ));
        }
        let version = u64::from_le_bytes(header[8..16].try_into().unwrap());
        let free_threaded = u64::from_le_bytes(header[16..24].try_into().unwrap());
        let (major, minor) = ((version >> 24) & 0xff, ((version >> 16) & 0xff) as u8);
        if major != 3 {
            return Err(LayoutError::DebugOffsets(format!(
                "version {version:#x} is not Python 3"
            )));
        }
        if free_threaded != 0 {
            return Err(LayoutError::FreeThreaded(minor));
        }
        // Byte offsets of the fields used, in each version's struct
        // (every member is a u64 but the cookie).
        let fields: &[(usize, &str)] = match minor {
            13 => &[
                (40, "runtime_state.interpreters_head"),
                (64, "interpreter_state.next"),
                (72, "interpreter_state.threads_head"),
                (168, "thread_state.next"),
                (184, "thread_state.current_frame"),
                (192, "thread_state.thread_id"),
                (200, "thread_state.native_thread_id"),
                (232, "interpreter_frame.previous"),
                (240, "interpreter_frame.executable"),
                (248, "interpreter_frame.instr_ptr"),
                (264, "interpreter_frame.owner"),
                (280, "code_object.filename"),
                (288, "code_object.name"),
                (296, "code_object.qualname"),
                (304, "code_object.linetable"),
                (312, "code_object.firstlineno"),
                (344, "code_object.co_code_adaptive"),
                (560, "unicode_object.asciiobject_size"),
            ],
            14 => &[
                (40, "runtime_state.interpreters_head"),
                (64, "interpreter_state.next"),
                (72, "interpreter_state.threads_head"),
                (192, "thread_state.next"),
                (208, "thread_state.current_frame"),
                (216, "thread_state.thread_id"),
                (224, "thread_state.native_thread_id"),
                (256, "interpreter_frame.previous"),
                (264, "interpreter_frame.executable"),
                (272, "interpreter_frame.instr_ptr"),
                (288, "interpreter_frame.owner"),
                (320, "code_object.filename"),
                (328, "code_object.name"),
                (336, "code_object.qualname"),
                (344, "code_object.linetable"),
                (352, "code_object.firstlineno"),
                (384, "code_object.co_code_adaptive"),
                (640, "unicode_object.asciiobject_size"),
            ],
            other => return Err(LayoutError::UnknownMinor(other)),
        };
        let bytes = memory
            .bytes(runtime, 648)
            .map_err(|e| LayoutError::Read(format!("_Py_DebugOffsets: {e}")))?;
        let value = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let values: Vec<u64> = fields.iter().map(|&(at, _)| value(at)).collect();
        // A struct a process forged (or a build we do not know) could hold
        // anything: offsets are inside the structs they name, and each fits
        // the 16 bits the walker keeps it in (`PyProcess::NONE` excluded).
        for (&(_, name), &v) in fields.iter().zip(&values) {
            if v >= u64::from(PyProcess::NONE) {
                return Err(LayoutError::DebugOffsets(format!(
                    "{name} = {v} is not an offset"
                )));
            }
        }
        let mut layout = Layout::table(minor)?;
        layout.source = LayoutSource::DebugOffsets;
        layout.runtime_interpreters_head = values[0];
        layout.interpreter_next = values[1];
        layout.interpreter_threads_head = values[2];
        layout.thread_next = values[3];
        layout.thread_frame = values[4];
        layout.thread_id = values[5];
        layout.thread_native_id = Some(values[6]);
        layout.frame_previous = values[7];
        layout.frame_code = values[8];
        layout.frame_instr = values[9];
        layout.frame_owner = Some(values[10]);
        layout.code_filename = values[11];
        layout.code_name = values[12];
        layout.code_qualname = Some(values[13]);
        layout.code_linetable = values[14];
        layout.code_firstlineno = values[15];
        layout.code_adaptive = Some(values[16]);
        layout.unicode_ascii_data = values[17];
        // A compact non-ASCII string adds `utf8_length` and `utf8`.
        layout.unicode_compact_data = values[17] + 16;
        // The walker reads a frame in one 112-byte window.
        for (name, offset) in [
            ("previous", layout.frame_previous),
            ("executable", layout.frame_code),
            ("instr_ptr", layout.frame_instr),
            ("owner", layout.frame_owner.unwrap_or(0)),
        ] {
            if offset + 8 > 112 {
                return Err(LayoutError::DebugOffsets(format!(
                    "interpreter_frame.{name} at {offset} is beyond what the walker reads"
                )));
            }
        }
        Ok(layout)
    }

    /// Checks a version table against the binary: the offsets
    /// `PyCode_Type`'s member table gives for the code object's fields
    /// (`co_filename`, `co_name`, `co_qualname`, `co_firstlineno`,
    /// `co_linetable`) and, 3.11 on, its basic size (where the bytecode
    /// starts).
    pub fn check(&self, memory: &impl Memory, code_type: u64) -> Result<(), LayoutError> {
        let mismatch = |what: String| LayoutError::Mismatch {
            minor: self.minor,
            what,
        };
        let read = |e: std::io::Error| LayoutError::Read(format!("PyCode_Type: {e}"));
        let members = memory
            .u64(code_type.wrapping_add(TYPE_MEMBERS))
            .map_err(read)?;
        let mut found = std::collections::HashMap::new();
        for index in 0..MAX_MEMBERS as u64 {
            let entry = members.wrapping_add(index * MEMBER_SIZE);
            let name = memory.u64(entry).map_err(read)?;
            if name == 0 {
                break;
            }
            let name = memory.c_string(name, 64).map_err(read)?;
            let offset = memory
                .u64(entry.wrapping_add(MEMBER_OFFSET))
                .map_err(read)?;
            found.insert(name, offset);
        }
        let expected = [
            ("co_filename", Some(self.code_filename)),
            ("co_name", Some(self.code_name)),
            ("co_qualname", self.code_qualname),
            ("co_firstlineno", Some(self.code_firstlineno)),
            ("co_linetable", Some(self.code_linetable)),
        ];
        for (name, offset) in expected {
            let Some(offset) = offset else { continue };
            match found.get(name) {
                Some(&actual) if actual == offset => {}
                Some(&actual) => {
                    return Err(mismatch(format!(
                        "PyCode_Type says {name} is at {actual}, the table {offset}"
                    )));
                }
                None => return Err(mismatch(format!("PyCode_Type has no member {name}"))),
            }
        }
        if let Some(adaptive) = self.code_adaptive {
            let size = memory
                .u64(code_type.wrapping_add(TYPE_BASICSIZE))
                .map_err(read)?;
            if size != adaptive {
                return Err(mismatch(format!(
                    "PyCode_Type's basic size is {size}, the table puts the bytecode at {adaptive}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_minor_has_a_table_the_walker_can_read() {
        for minor in 10..=14 {
            let layout = Layout::table(minor).unwrap();
            let bpf = layout.for_bpf().unwrap();
            assert_eq!(bpf.minor, minor);
            for offset in [bpf.frame_previous, bpf.frame_code, bpf.frame_instr] {
                assert!(offset as usize + 8 <= 112, "3.{minor}: {offset}");
            }
        }
        assert_eq!(Layout::table(15), Err(LayoutError::UnknownMinor(15)));
        assert_eq!(Layout::table(9), Err(LayoutError::UnknownMinor(9)));
    }

    /// 3.13's `_Py_DebugOffsets` with every field 8 but the thread's
    /// `current_frame` (read at byte 184).
    fn debug_offsets(current_frame: u64) -> profiler_runtime::memory::ImageMemory {
        let mut bytes = vec![0u8; 648];
        bytes[..8].copy_from_slice(b"xdebugpy");
        bytes[8..16].copy_from_slice(&0x030d_00f0u64.to_le_bytes());
        for at in (40..648).step_by(8) {
            bytes[at..at + 8].copy_from_slice(&8u64.to_le_bytes());
        }
        bytes[184..192].copy_from_slice(&current_frame.to_le_bytes());
        profiler_runtime::memory::ImageMemory {
            base: 0x1000,
            bytes,
        }
    }

    #[test]
    fn offsets_the_walker_cannot_hold_are_refused_not_truncated() {
        // The largest offset a u16 holds beside `NONE` is kept as it is.
        let layout = Layout::from_debug_offsets(&debug_offsets(65534), 0x1000).unwrap();
        assert_eq!(layout.for_bpf().unwrap().thread_frame, 65534);
        // `NONE` itself, 65536 (which a cast made 0) and beyond are not.
        for forged in [65535, 65536, 1 << 32, u64::MAX] {
            let refused = Layout::from_debug_offsets(&debug_offsets(forged), 0x1000);
            assert!(
                matches!(&refused, Err(LayoutError::DebugOffsets(m)) if m.contains("current_frame")),
                "{forged}: {refused:?}"
            );
        }
        // A layout built any other way is checked again on its way out.
        let mut layout = Layout::table(13).unwrap();
        layout.thread_frame = 65536;
        assert!(layout.for_bpf().is_err());
        layout.thread_frame = 65535;
        assert!(layout.for_bpf().is_err());
        layout.thread_frame = 65534;
        layout.frame_owner = Some(1 << 16);
        assert!(layout.for_bpf().is_err());
    }
}

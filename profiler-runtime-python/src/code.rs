//! Python frames as people read them: the code object's qualified name,
//! its file, and the line being executed, read from the process.
//!
//! The walker wrote a code object's address and the frame's instruction
//! pointer (3.10: `f_lasti`). Here the code object is read once per
//! process and address (its `co_qualname`, `co_filename`,
//! `co_firstlineno` and line table) and each (code, instruction) turned
//! into a line. A code object is checked to be one (`ob_type` is
//! `PyCode_Type`); names are cut at `MAX_NAME` characters and line tables
//! at `MAX_LINE_TABLE` bytes: a process can forge any of it.

use std::sync::Arc;

use profiler_symbolize::{Frame, NameSource};

use super::layout::Layout;
use super::linetable;
use profiler_runtime::cache::{Cache, Weigh};
use profiler_runtime::memory::{Memory, ProcessMemory};

/// Characters of a name or file kept (longer ones end in "…").
pub const MAX_NAME: usize = 1024;
/// Bytes of a line table read (CPython's are a few per line).
pub const MAX_LINE_TABLE: usize = 1 << 18;

/// What a frame needs of one code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObject {
    /// `co_qualname` (`Handler.get`, `<lambda>`), 3.10's `co_name`.
    pub name: String,
    pub file: String,
    pub first_line: i32,
    pub line_table: Vec<u8>,
}

/// Why a frame's code object could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    #[error("{0:#x} is not a code object")]
    NotCode(u64),
    #[error("reading the code object at {address:#x}: {reason}")]
    Read { address: u64, reason: String },
}

/// Where one process's interpreter is, for reading its code objects.
#[derive(Debug, Clone)]
pub struct Interpreter {
    pub pid: u32,
    pub layout: Layout,
    /// The runtime address of `PyCode_Type`.
    pub code_type: Option<u64>,
}

/// `PyObject.ob_type`.
const OB_TYPE: u64 = 8;
/// `PyASCIIObject.length` and `.state`.
const UNICODE_LENGTH: u64 = 16;
const UNICODE_STATE: u64 = 32;
/// `PyBytesObject.ob_size` and `.ob_sval`.
const BYTES_SIZE: u64 = 16;
const BYTES_DATA: u64 = 32;

impl Interpreter {
    /// Reads the code object at `address` of the process.
    pub fn code(&self, address: u64) -> Result<CodeObject, CodeError> {
        self.code_in(&ProcessMemory::new(self.pid), address)
    }

    /// Reads the code object at `address` of `memory`.
    pub fn code_in(&self, memory: &impl Memory, address: u64) -> Result<CodeObject, CodeError> {
        let read = |reason: std::io::Error| CodeError::Read {
            address,
            reason: reason.to_string(),
        };
        if let Some(code_type) = self.code_type
            && memory.u64(address.wrapping_add(OB_TYPE)).map_err(read)? != code_type
        {
            return Err(CodeError::NotCode(address));
        }
        let l = &self.layout;
        let name_at = memory
            .u64(address.wrapping_add(l.code_qualname.unwrap_or(l.code_name)))
            .map_err(read)?;
        let file_at = memory
            .u64(address.wrapping_add(l.code_filename))
            .map_err(read)?;
        let first_line = memory
            .i32(address.wrapping_add(l.code_firstlineno))
            .map_err(read)?;
        let table_at = memory
            .u64(address.wrapping_add(l.code_linetable))
            .map_err(read)?;
        let text = |at: u64| self.string(memory, at).map_err(read);
        Ok(CodeObject {
            name: text(name_at)?,
            file: text(file_at)?,
            first_line,
            line_table: self.bytes(memory, table_at).map_err(read)?,
        })
    }

    /// A `str`: compact ASCII, or compact Latin-1, UCS-2 or UCS-4 (what
    /// code objects' names and files are).
    fn string(&self, memory: &impl Memory, address: u64) -> std::io::Result<String> {
        let length = memory.u64(address.wrapping_add(UNICODE_LENGTH))? as usize;
        let state = memory.u32(address.wrapping_add(UNICODE_STATE))?;
        let kind = ((state >> 2) & 7) as usize;
        let compact = (state >> 5) & 1 != 0;
        let ascii = (state >> 6) & 1 != 0;
        if !compact || !matches!(kind, 1 | 2 | 4) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a str at {address:#x} that is not compact (state {state:#x})"),
            ));
        }
        let kept = length.min(MAX_NAME);
        let data = if ascii {
            address.wrapping_add(self.layout.unicode_ascii_data)
        } else {
            address.wrapping_add(self.layout.unicode_compact_data)
        };
        let raw = memory.bytes(data, kept * kind)?;
        let decoded: String = match kind {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => raw
                .chunks_exact(2)
                .map(|c| {
                    char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]])))
                        .unwrap_or('\u{fffd}')
                })
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .unwrap_or('\u{fffd}')
                })
                .collect(),
        };
        // The process may forge any character: none that splits a line.
        let mut text = profiler_symbolize::printable(&decoded).into_owned();
        if length > kept {
            text.push('…');
        }
        Ok(text)
    }

    /// A `bytes` object's data (at most `MAX_LINE_TABLE` bytes).
    fn bytes(&self, memory: &impl Memory, address: u64) -> std::io::Result<Vec<u8>> {
        let size = memory.u64(address.wrapping_add(BYTES_SIZE))? as usize;
        memory.bytes(address.wrapping_add(BYTES_DATA), size.min(MAX_LINE_TABLE))
    }

    /// The line of a frame of `code` whose second word is `instruction`.
    pub fn line(&self, code_address: u64, code: &CodeObject, instruction: u64) -> Option<i32> {
        match self.layout.code_adaptive {
            // 3.11 on: the instruction pointer, in code units from the
            // start of the bytecode (inside the code object).
            Some(adaptive) => {
                let start = code_address.wrapping_add(adaptive);
                let index = (instruction.wrapping_sub(start) as i64) / 2;
                if !(-1..1 << 24).contains(&index) {
                    return None;
                }
                linetable::line_311(&code.line_table, code.first_line, index)
            }
            // 3.10: `f_lasti`, in code units; the table is keyed by byte.
            None => {
                let lasti = instruction as u32 as i32;
                linetable::line_310(&code.line_table, code.first_line, i64::from(lasti) * 2)
            }
        }
    }
}

/// Python frames of one run, named as they are first seen (while their
/// process lives) and kept for the profiles built later, within the
/// runtime caches' budget (`profiler_runtime::cache`): a process that
/// forges thousands of code objects with huge line tables evicts its own
/// entries, it cannot grow the agent.
pub struct PythonFrames {
    codes: Cache<u64, Option<Arc<CodeObject>>>,
    frames: Cache<(u64, u64), Frame>,
    /// Code objects that could not be read (each named as unreadable).
    pub unreadable: u64,
}

impl Default for PythonFrames {
    fn default() -> Self {
        PythonFrames {
            // Code objects hold the line tables: most of what is kept.
            codes: Cache::new("cpython", "code_objects", 25),
            frames: Cache::new("cpython", "frames", 10),
            unreadable: 0,
        }
    }
}

impl Weigh for CodeObject {
    fn weigh(&self) -> usize {
        self.name.weigh() + self.file.weigh() + self.line_table.weigh()
    }
}

impl PythonFrames {
    /// The frame of a code object and instruction of process `pid`.
    pub fn frame(&mut self, interpreter: &Interpreter, code: u64, instruction: u64) -> Frame {
        let pid = interpreter.pid;
        if let Some(frame) = self.frames.get(pid, &(code, instruction)) {
            return frame;
        }
        let object = self
            .codes
            .get_or_insert_with(pid, code, || match interpreter.code(code) {
                Ok(object) => Some(Arc::new(object)),
                Err(error) => {
                    tracing::debug!(pid, "Python frame: {error}");
                    None
                }
            });
        let frame = match object {
            Some(object) => Frame {
                function: object.name.clone(),
                // Different from the name, as CPython's own perf maps
                // write it: `go tool pprof` demangles a function whose
                // system name equals its name, which empties `<module>`
                // and `<lambda>` (it drops `<...>` as template arguments).
                system_name: Some(format!("py::{}:{}", object.name, object.file)),
                file: Some(object.file.clone()),
                line: interpreter
                    .line(code, &object, instruction)
                    .and_then(|l| u32::try_from(l).ok()),
                inlined: false,
                source: NameSource::Runtime("cpython"),
            },
            None => {
                self.unreadable += 1;
                Frame::named(format!("[python] code {code:#x}"))
                    .from_source(NameSource::Runtime("cpython"))
            }
        };
        self.frames.insert(pid, (code, instruction), frame.clone());
        frame
    }

    /// Forgets the frames of processes `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.codes.retain_processes(&keep);
        self.frames.retain_processes(&keep);
    }

    /// Bytes kept (both caches).
    pub fn kept_bytes(&self) -> usize {
        self.codes.used() + self.frames.used()
    }
}

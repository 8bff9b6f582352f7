//! What the walker and the symbolizer read of a JVM, from its VMStructs:
//! the offsets of every field used, by name, the version-dependent
//! shapes (JDK 23 replaced the code blob's pointers by offsets, JDK 25
//! moved a compiled method's debug information out of the code cache),
//! and the code cache's heaps once the VM has set them up.
//! (The facts and how each was checked: docs/design/hotspot-layouts.md.)

use profiler_common::runtimes::hotspot::{
    JVM_FLAG_BLOCK_LENGTH_32, JVM_FLAG_CODE_OFFSET, JVM_FLAG_FRAME_COMPLETE_16,
    JVM_FLAG_VERIFIED_ENTRY_OFFSET, JvmHeap, JvmProcess, MAX_JVM_HEAPS,
};

use super::stream::Encoding;
use super::vmstructs::VmStructs;
use profiler_runtime::memory::Memory;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("its VMStructs have no {0}")]
    Missing(String),
    #[error("the VM is not initialized yet ({0})")]
    NotReady(&'static str),
    #[error("reading {what} at {address:#x}: {reason}")]
    Read {
        what: &'static str,
        address: u64,
        reason: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Where a blob's code starts: a pointer field (JDK 17 to 22) or an int
/// offset from the blob (JDK 23 on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeStart {
    Pointer(u64),
    Offset(u64),
}

/// Where a compiled method keeps its PC descriptors, scope records and
/// metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugInfo {
    /// JDK 17 to 22: in the blob (offsets from it), the scope records at
    /// a pointer.
    InBlob {
        pcs: u64,
        pcs_end: u64,
        scopes_data: u64,
        metadata: u64,
    },
    /// JDK 23 on: in the C heap: PC descriptors and scope records in the
    /// "immutable data" (offsets from its pointer), metadata after the
    /// relocations in the "mutable data".
    Separate {
        immutable: u64,
        pcs: u64,
        scopes_data: u64,
        mutable: u64,
        relocation_size: u64,
    },
}

/// The offsets in bytes (and the shapes) of what is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JvmLayout {
    /// The JDK's feature release (17, 21, 25).
    pub major: u32,
    pub encoding: Encoding,
    pub blob_name: u64,
    pub blob_frame_size: u64,
    pub blob_frame_complete: u64,
    pub frame_complete_16: bool,
    pub blob_code: CodeStart,
    pub nmethod_method: u64,
    pub nmethod_compile_id: u64,
    /// (offset, whether it is a u16 offset from the code start).
    pub nmethod_verified_entry: (u64, bool),
    pub debug_info: DebugInfo,
    pub method_const: u64,
    pub const_method_size: u64,
    pub const_method_constants: u64,
    pub const_method_code_size: u64,
    pub const_method_name_index: u64,
    pub const_method_signature_index: u64,
    /// (offset, 32 bits wide).
    pub const_method_flags: (u64, bool),
    pub has_line_table_bit: u64,
    pub pool_size: u64,
    pub pool_holder: u64,
    pub pool_length: u64,
    pub pool_source_file: u64,
    pub klass_name: u64,
    pub symbol_length: u64,
    pub symbol_body: u64,
}

/// A field that must be there.
fn need(structs: &VmStructs, type_name: &str, field: &str) -> Result<u64, LayoutError> {
    structs
        .offset(type_name, field)
        .ok_or_else(|| LayoutError::Missing(format!("{type_name}::{field}")))
}

/// The first of several spellings a field has had.
fn first_of(structs: &VmStructs, names: &[(&str, &str)]) -> Result<(u64, usize), LayoutError> {
    names
        .iter()
        .enumerate()
        .find_map(|(i, (t, f))| Some((structs.offset(t, f)?, i)))
        .ok_or_else(|| {
            LayoutError::Missing(
                names
                    .iter()
                    .map(|(t, f)| format!("{t}::{f}"))
                    .collect::<Vec<_>>()
                    .join(" or "),
            )
        })
}

fn size(structs: &VmStructs, type_name: &str) -> Result<u64, LayoutError> {
    structs
        .size(type_name)
        .ok_or_else(|| LayoutError::Missing(format!("sizeof({type_name})")))
}

impl JvmLayout {
    /// The layout `structs` describe; `major` is the JDK's feature release
    /// (read from the VM, see `major_version`).
    pub fn new(structs: &VmStructs, major: u32) -> Result<JvmLayout, LayoutError> {
        let blob_code = match structs.offset("CodeBlob", "_code_offset") {
            Some(offset) => CodeStart::Offset(offset),
            None => CodeStart::Pointer(need(structs, "CodeBlob", "_code_begin")?),
        };
        let frame_complete_16 = structs
            .type_of("CodeBlob", "_frame_complete_offset")
            .is_some_and(|t| t.contains("16"));
        let (verified, verified_index) = first_of(
            structs,
            &[
                ("nmethod", "_verified_entry_offset"),
                ("nmethod", "_verified_entry_point"),
                ("CompiledMethod", "_verified_entry_point"),
            ],
        )?;
        let debug_info = match structs.offset("nmethod", "_immutable_data") {
            Some(immutable) => DebugInfo::Separate {
                immutable,
                pcs: need(structs, "nmethod", "_scopes_pcs_offset")?,
                scopes_data: need(structs, "nmethod", "_scopes_data_offset")?,
                mutable: need(structs, "CodeBlob", "_mutable_data")?,
                relocation_size: need(structs, "CodeBlob", "_relocation_size")?,
            },
            None => DebugInfo::InBlob {
                pcs: need(structs, "nmethod", "_scopes_pcs_offset")?,
                pcs_end: need(structs, "nmethod", "_dependencies_offset")?,
                scopes_data: first_of(
                    structs,
                    &[
                        ("CompiledMethod", "_scopes_data_begin"),
                        ("nmethod", "_scopes_data_begin"),
                    ],
                )?
                .0,
                metadata: need(structs, "nmethod", "_metadata_offset")?,
            },
        };
        let (flags, flags_index) = first_of(
            structs,
            &[("ConstMethod", "_flags._flags"), ("ConstMethod", "_flags")],
        )?;
        let has_line_table_bit = structs
            .ints
            .get("ConstMethodFlags::_misc_has_linenumber_table")
            .or_else(|| structs.ints.get("ConstMethod::_has_linenumber_table"))
            .copied()
            .unwrap_or(1) as u64;
        Ok(JvmLayout {
            major,
            encoding: Encoding::of_major(major),
            blob_name: need(structs, "CodeBlob", "_name")?,
            blob_frame_size: need(structs, "CodeBlob", "_frame_size")?,
            blob_frame_complete: need(structs, "CodeBlob", "_frame_complete_offset")?,
            frame_complete_16,
            blob_code,
            nmethod_method: first_of(
                structs,
                &[("nmethod", "_method"), ("CompiledMethod", "_method")],
            )?
            .0,
            nmethod_compile_id: need(structs, "nmethod", "_compile_id")?,
            nmethod_verified_entry: (verified, verified_index == 0),
            debug_info,
            method_const: need(structs, "Method", "_constMethod")?,
            const_method_size: size(structs, "ConstMethod")?,
            const_method_constants: need(structs, "ConstMethod", "_constants")?,
            const_method_code_size: need(structs, "ConstMethod", "_code_size")?,
            const_method_name_index: need(structs, "ConstMethod", "_name_index")?,
            const_method_signature_index: need(structs, "ConstMethod", "_signature_index")?,
            const_method_flags: (flags, flags_index == 0),
            has_line_table_bit,
            pool_size: size(structs, "ConstantPool")?,
            pool_holder: need(structs, "ConstantPool", "_pool_holder")?,
            pool_length: need(structs, "ConstantPool", "_length")?,
            pool_source_file: need(structs, "ConstantPool", "_source_file_name_index")?,
            klass_name: need(structs, "Klass", "_name")?,
            symbol_length: need(structs, "Symbol", "_length")?,
            symbol_body: need(structs, "Symbol", "_body")?,
        })
    }
}

/// The JDK's feature release, from `Abstract_VM_Version::_vm_major_version`.
pub fn major_version(structs: &VmStructs, memory: &impl Memory) -> Result<u32, LayoutError> {
    let at = structs
        .address("Abstract_VM_Version", "_vm_major_version")
        .ok_or_else(|| LayoutError::Missing("Abstract_VM_Version::_vm_major_version".into()))?;
    let major = read_u32(memory, at, "Abstract_VM_Version::_vm_major_version")?;
    if major == 0 {
        return Err(LayoutError::NotReady("no VM version yet"));
    }
    if !(8..=99).contains(&major) {
        return Err(LayoutError::Invalid(format!(
            "a VM version of {major} is no JDK's"
        )));
    }
    Ok(major)
}

fn read_u64(memory: &impl Memory, address: u64, what: &'static str) -> Result<u64, LayoutError> {
    memory.u64(address).map_err(|e| LayoutError::Read {
        what,
        address,
        reason: e.to_string(),
    })
}

fn read_u32(memory: &impl Memory, address: u64, what: &'static str) -> Result<u32, LayoutError> {
    memory.u32(address).map_err(|e| LayoutError::Read {
        what,
        address,
        reason: e.to_string(),
    })
}

/// What the BPF walker needs (`JvmProcess`), read from the VM: the code
/// cache's bounds and heaps, the interpreter, the call stub. NotReady
/// until the VM has set them up (a JVM starting).
pub fn walker_layout(
    structs: &VmStructs,
    layout: &JvmLayout,
    memory: &impl Memory,
) -> Result<JvmProcess, LayoutError> {
    let static_value = |type_name: &str, field: &str, what: &'static str| {
        let at = structs
            .address(type_name, field)
            .ok_or_else(|| LayoutError::Missing(format!("{type_name}::{field}")))?;
        read_u64(memory, at, what)
    };
    let code_low = static_value("CodeCache", "_low_bound", "CodeCache::_low_bound")?;
    let code_high = static_value("CodeCache", "_high_bound", "CodeCache::_high_bound")?;
    if code_low == 0 || code_high <= code_low {
        return Err(LayoutError::NotReady("no code cache yet"));
    }
    // The heaps: a GrowableArray<CodeHeap*>.
    let array = static_value("CodeCache", "_heaps", "CodeCache::_heaps")?;
    if array == 0 {
        return Err(LayoutError::NotReady("no code heaps yet"));
    }
    let length = read_u32(
        memory,
        array.wrapping_add(need(structs, "GrowableArrayBase", "_len")?),
        "the code heaps' count",
    )?;
    let data = read_u64(
        memory,
        array.wrapping_add(need(structs, "GrowableArray<int>", "_data")?),
        "the code heaps",
    )?;
    if length == 0 || length as usize > MAX_JVM_HEAPS {
        return Err(LayoutError::Invalid(format!(
            "{length} code heaps (at most {MAX_JVM_HEAPS} are read)"
        )));
    }
    let memory_field = need(structs, "CodeHeap", "_memory")?;
    let segmap_field = need(structs, "CodeHeap", "_segmap")?;
    let log2_field = need(structs, "CodeHeap", "_log2_segment_size")?;
    let low_boundary = need(structs, "VirtualSpace", "_low_boundary")?;
    let high_boundary = need(structs, "VirtualSpace", "_high_boundary")?;
    let low = need(structs, "VirtualSpace", "_low")?;
    let mut process = JvmProcess::default();
    for i in 0..length as u64 {
        let heap = read_u64(memory, data.wrapping_add(8 * i), "a code heap")?;
        let log2_segment = read_u32(
            memory,
            heap.wrapping_add(log2_field),
            "a code heap's segment size",
        )?;
        let entry = JvmHeap {
            low: read_u64(
                memory,
                heap.wrapping_add(memory_field + low_boundary),
                "a code heap's start",
            )?,
            high: read_u64(
                memory,
                heap.wrapping_add(memory_field + high_boundary),
                "a code heap's end",
            )?,
            segmap: read_u64(
                memory,
                heap.wrapping_add(segmap_field + low),
                "a code heap's segment map",
            )?,
            log2_segment,
            _pad: 0,
        };
        if !(4..=16).contains(&log2_segment)
            || entry.high <= entry.low
            || entry.low < code_low
            || entry.high > code_high
        {
            return Err(LayoutError::Invalid(format!(
                "code heap {i} is not inside the code cache ({:#x}..{:#x}, segments of 2^{log2_segment})",
                entry.low, entry.high
            )));
        }
        process.heaps[i as usize] = entry;
    }
    process.heap_count = length;
    // The interpreter's code: the StubQueue's buffer.
    let queue = static_value("AbstractInterpreter", "_code", "AbstractInterpreter::_code")?;
    if queue == 0 {
        return Err(LayoutError::NotReady("no interpreter yet"));
    }
    let buffer = read_u64(
        memory,
        queue.wrapping_add(need(structs, "StubQueue", "_stub_buffer")?),
        "the interpreter's code",
    )?;
    let limit = read_u32(
        memory,
        queue.wrapping_add(need(structs, "StubQueue", "_buffer_limit")?),
        "the interpreter's size",
    )?;
    process.code_low = code_low;
    process.code_high = code_high;
    process.interpreter_low = buffer;
    process.interpreter_high = buffer.wrapping_add(u64::from(limit));
    let narrow = |value: u64, what: &str| {
        u16::try_from(value).map_err(|_| LayoutError::Invalid(format!("{what} at {value}")))
    };
    process.block_header = narrow(size(structs, "HeapBlock")?, "sizeof(HeapBlock)")?;
    process.block_used = narrow(
        need(structs, "HeapBlock::Header", "_used")?,
        "HeapBlock::_used",
    )?;
    process.blob_frame_size = narrow(layout.blob_frame_size, "CodeBlob::_frame_size")?;
    process.blob_frame_complete = narrow(
        layout.blob_frame_complete,
        "CodeBlob::_frame_complete_offset",
    )?;
    process.nmethod_compile_id = narrow(layout.nmethod_compile_id, "nmethod::_compile_id")?;
    process.nmethod_verified_entry =
        narrow(layout.nmethod_verified_entry.0, "nmethod's verified entry")?;
    let (code, code_is_offset) = match layout.blob_code {
        CodeStart::Pointer(offset) => (offset, false),
        CodeStart::Offset(offset) => (offset, true),
    };
    process.blob_code = narrow(code, "CodeBlob's code start")?;
    process.flags = if code_is_offset {
        JVM_FLAG_CODE_OFFSET
    } else {
        0
    } | if layout.frame_complete_16 {
        JVM_FLAG_FRAME_COMPLETE_16
    } else {
        0
    } | if layout.nmethod_verified_entry.1 {
        JVM_FLAG_VERIFIED_ENTRY_OFFSET
    } else {
        0
    } | if structs
        .type_of("HeapBlock::Header", "_length")
        .is_some_and(|t| t.contains("32"))
    {
        JVM_FLAG_BLOCK_LENGTH_32
    } else {
        0
    };
    // The walker reads these inside one window of each blob.
    let window = profiler_common::runtimes::hotspot::BLOB_WINDOW as u64;
    for (value, bytes, what) in [
        (process.blob_frame_size, 4, "CodeBlob::_frame_size"),
        (
            process.blob_frame_complete,
            4,
            "CodeBlob::_frame_complete_offset",
        ),
        (process.blob_code, 8, "CodeBlob's code start"),
    ] {
        if u64::from(value) + bytes > window {
            return Err(LayoutError::Invalid(format!(
                "{what} at {value}, past the {window} bytes the walker reads of a blob"
            )));
        }
    }
    // Interpreter frame slots (words below the frame pointer): the same
    // on JDK 17 to 25 (checked on each against live frames).
    process.method_slot = 3;
    process.bcp_slot = if cfg!(target_arch = "aarch64") { 9 } else { 8 };
    process.sender_sp_slot = 1;
    Ok(process)
}

//! Naming Java frames: the walker's two words of a frame, read back in the
//! JVM's memory as the methods, files and lines JFR would print.
//!
//! - An interpreted frame is a `Method*` and a bytecode pointer: the
//!   method's class, name and source file come through its constant pool,
//!   the line from its line-number table at the bytecode index.
//! - A compiled frame is a blob, the blob's compile id (a freed and reused
//!   blob is never named as the method it holds now) and the PC's offset:
//!   the PC descriptor at the offset leads to a chain of scope records,
//!   innermost first, each a method and a bytecode index: the methods C1
//!   or C2 inlined there are frames of their own.
//!
//! Everything is read from a process that controls it: lengths and counts
//! are bounded, chains must move backwards, a method whose bytecode does
//! not hold the frame's bytecode pointer is not believed.

use std::sync::Arc;

use profiler_symbolize::{Frame, NameSource};

use super::layout::{DebugInfo, JvmLayout};
use super::stream::{self, Encoding, Stream};
use profiler_runtime::cache::{Cache, Weigh};
use profiler_runtime::memory::Memory;

/// Inlined methods followed per PC (C2 inlines at most 15 deep).
const MAX_SCOPES: usize = 32;
/// PC descriptors read per compiled method.
const MAX_PCS: u64 = 1 << 16;
/// Bytes of scope records read per compiled method.
const MAX_SCOPES_BYTES: u64 = 4 << 20;
/// Line-table entries kept per method.
const MAX_LINES: usize = 1 << 16;

/// A method as the JVM names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodInfo {
    /// "java/util/TimSort".
    pub class: String,
    pub name: String,
    /// "(II)V".
    pub signature: String,
    /// "TimSort.java".
    pub source: Option<String>,
    /// (bytecode index, line).
    pub lines: Vec<(u32, u32)>,
    /// Where its bytecodes are, and how many.
    pub code_base: u64,
    pub code_size: u64,
    pub const_method: u64,
}

impl MethodInfo {
    /// "java.util.TimSort.mergeHi": dotted, a hidden class's address
    /// suffix cut (`Main$$Lambda+0x…` → `Main$$Lambda`), so that the same
    /// lambda is one function from run to run.
    pub fn display_name(&self) -> String {
        let class = match self.class.find("+0x") {
            Some(at) => &self.class[..at],
            None => &self.class,
        };
        format!("{}.{}", class.replace('/', "."), self.name)
    }

    /// "java/util/TimSort.java": the source file in its package's
    /// directory.
    pub fn file(&self) -> Option<String> {
        let source = self.source.as_ref()?;
        Some(match self.class.rfind('/') {
            Some(at) => format!("{}/{source}", &self.class[..at]),
            None => source.clone(),
        })
    }

    /// The frame of this method at `bci` (None: unknown).
    pub fn frame(&self, bci: Option<i64>, inlined: bool) -> Frame {
        Frame {
            function: self.display_name(),
            system_name: Some(format!("{}.{}{}", self.class, self.name, self.signature)),
            file: self.file(),
            line: bci.and_then(|bci| stream::line_of(&self.lines, bci)),
            inlined,
            source: NameSource::Runtime("jvm"),
        }
    }
}

/// A PC descriptor: where a region of compiled code ends, and its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PcDesc {
    pc_offset: i32,
    scope: i32,
}

/// A compiled method's debug information, read once.
#[derive(Debug, Clone)]
struct Compiled {
    method: u64,
    pcs: Vec<PcDesc>,
    scopes: Vec<u8>,
    /// Where metadata entry 1 is (the index is 1-based).
    metadata: u64,
}

impl Weigh for PcDesc {
    fn weigh(&self) -> usize {
        0
    }
}

impl Weigh for Compiled {
    fn weigh(&self) -> usize {
        self.pcs.weigh() + self.scopes.weigh()
    }
}

impl Weigh for MethodInfo {
    fn weigh(&self) -> usize {
        self.class.weigh()
            + self.name.weigh()
            + self.signature.weigh()
            + self.source.weigh()
            + self.lines.weigh()
    }
}

/// The JVM a frame is of: its pid (the caches' key) and its layout.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub pid: u32,
    pub layout: &'a JvmLayout,
}

/// The JVMs' frames, named and cached within the runtime caches' budget
/// (`profiler_runtime::cache`): a forged JVM with thousands of compiled
/// methods of megabytes of debug information each evicts its own entries.
pub struct JvmCode {
    methods: Cache<u64, Arc<MethodInfo>>,
    compiled: Cache<(u64, u32), Option<Arc<Compiled>>>,
    blob_names: Cache<u64, String>,
}

impl Default for JvmCode {
    fn default() -> Self {
        JvmCode {
            methods: Cache::new("hotspot", "methods", 15),
            // PC descriptors and scope records: the most per entry.
            compiled: Cache::new("hotspot", "compiled_methods", 25),
            blob_names: Cache::new("hotspot", "blob_names", 5),
        }
    }
}

impl JvmCode {
    /// Forgets the processes `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.methods.retain_processes(&keep);
        self.compiled.retain_processes(&keep);
        self.blob_names.retain_processes(&keep);
    }

    /// The method at `method` (cached while its `ConstMethod*` stays the
    /// same: a class unloaded and its memory reused is read again).
    pub fn method(
        &mut self,
        target: Target<'_>,
        memory: &impl Memory,
        method: u64,
    ) -> Option<Arc<MethodInfo>> {
        let const_method = memory
            .u64(method.wrapping_add(target.layout.method_const))
            .ok()?;
        if let Some(info) = self.methods.get(target.pid, &method)
            && info.const_method == const_method
        {
            return Some(info);
        }
        let info = Arc::new(read_method(memory, target.layout, const_method)?);
        self.methods.insert(target.pid, method, info.clone());
        Some(info)
    }

    /// An interpreted frame: `bcp` in the method's bytecodes gives its
    /// index (0 in a native method's frame: no line).
    pub fn interpreted(
        &mut self,
        target: Target<'_>,
        memory: &impl Memory,
        method: u64,
        bcp: u64,
    ) -> Vec<Frame> {
        let Some(info) = self.method(target, memory, method) else {
            return vec![unnamed("[java: method unreadable]")];
        };
        let bci = bcp
            .checked_sub(info.code_base)
            .filter(|&bci| bci < info.code_size)
            .map(|bci| bci as i64);
        vec![info.frame(bci, false)]
    }

    /// A compiled frame: the blob's method and the methods inlined at
    /// `offset`, innermost first. `exact`: the PC where the thread was
    /// (looked up at the next descriptor after it, as JFR does), not a
    /// return address (looked up exactly).
    pub fn compiled(
        &mut self,
        target: Target<'_>,
        memory: &impl Memory,
        blob: u64,
        compile_id: u32,
        offset: u32,
        exact: bool,
    ) -> Vec<Frame> {
        let name = self.blob_name(target, memory, blob);
        let Some(name) = name else {
            return vec![unnamed("[java: code blob unreadable]")];
        };
        if name != "nmethod" && name != "native nmethod" {
            // pprof's views cut what is in parentheses as an argument list
            // ("StubRoutines (1)" would print as "StubRoutines").
            let name: String = name.chars().filter(|c| !matches!(c, '(' | ')')).collect();
            return vec![unnamed(&format!("[jvm] {name}"))];
        }
        let id = memory
            .u32(blob.wrapping_add(target.layout.nmethod_compile_id))
            .ok();
        if id != Some(compile_id) {
            // The blob was freed (and maybe reused) since the sample.
            return vec![unnamed("[java: compiled method unloaded]")];
        }
        let compiled = self
            .compiled
            .get_or_insert_with(target.pid, (blob, compile_id), || {
                read_compiled(memory, target.layout, blob).map(Arc::new)
            });
        let Some(compiled) = compiled else {
            return vec![unnamed("[java: compiled method unreadable]")];
        };
        let scopes = match find_pc(&compiled.pcs, offset, exact) {
            Some(pc) if pc.scope > 0 => {
                scope_chain(&compiled.scopes, pc.scope, target.layout.encoding)
            }
            _ => Vec::new(),
        };
        let mut frames = Vec::new();
        for (i, &(metadata_index, bci)) in scopes.iter().enumerate() {
            let Some(method) = metadata_at(memory, compiled.metadata, metadata_index) else {
                break;
            };
            let Some(info) = self.method(target, memory, method) else {
                break;
            };
            frames.push(info.frame(Some(bci), i + 1 < scopes.len()));
        }
        // No scope at that PC (or one that did not read): the method
        // holding the code, without a line.
        if frames.is_empty() {
            let Some(info) = self.method(target, memory, compiled.method) else {
                return vec![unnamed("[java: method unreadable]")];
            };
            frames.push(info.frame(None, false));
        }
        frames
    }

    /// A blob's name (`CodeBlob::_name`: "nmethod", "StubRoutines (1)",
    /// "I2C/C2I adapters", ...).
    fn blob_name(&mut self, target: Target<'_>, memory: &impl Memory, blob: u64) -> Option<String> {
        let pointer = memory
            .u64(blob.wrapping_add(target.layout.blob_name))
            .ok()?;
        if let Some(name) = self.blob_names.get(target.pid, &pointer) {
            return Some(name);
        }
        let name = memory.c_string(pointer, 128).ok()?;
        self.blob_names.insert(target.pid, pointer, name.clone());
        Some(name)
    }
}

fn unnamed(text: &str) -> Frame {
    Frame::named(text.to_string()).from_source(NameSource::Runtime("jvm"))
}

/// Reads a method's names and line table from its `ConstMethod`.
pub fn read_method(
    memory: &impl Memory,
    layout: &JvmLayout,
    const_method: u64,
) -> Option<MethodInfo> {
    let u16_at = |address: u64| memory.array::<2>(address).ok().map(u16::from_le_bytes);
    let pool = memory
        .u64(const_method.wrapping_add(layout.const_method_constants))
        .ok()?;
    let pool_length = memory.u32(pool.wrapping_add(layout.pool_length)).ok()? as u64;
    let entry = |index: u16| -> Option<String> {
        let index = u64::from(index);
        if index == 0 || index >= pool_length {
            return None;
        }
        let symbol = memory
            .u64(pool.wrapping_add(layout.pool_size).wrapping_add(8 * index))
            .ok()?;
        read_symbol(memory, layout, symbol)
    };
    let name = entry(u16_at(
        const_method.wrapping_add(layout.const_method_name_index),
    )?)?;
    let signature = entry(u16_at(
        const_method.wrapping_add(layout.const_method_signature_index),
    )?)?;
    let holder = memory.u64(pool.wrapping_add(layout.pool_holder)).ok()?;
    let klass_name = memory.u64(holder.wrapping_add(layout.klass_name)).ok()?;
    let class = read_symbol(memory, layout, klass_name)?;
    let source = u16_at(pool.wrapping_add(layout.pool_source_file)).and_then(entry);
    let code_size = u64::from(u16_at(
        const_method.wrapping_add(layout.const_method_code_size),
    )?);
    let code_base = const_method.wrapping_add(layout.const_method_size);
    let (flags_at, wide) = layout.const_method_flags;
    let flags = if wide {
        memory.u32(const_method.wrapping_add(flags_at)).ok()? as u64
    } else {
        u64::from(u16_at(const_method.wrapping_add(flags_at))?)
    };
    let lines = if flags & layout.has_line_table_bit != 0 {
        // The table follows the bytecodes; its end is not recorded, so a
        // bounded piece is read (a page boundary may cut it: what was
        // read is used).
        let table = code_base.wrapping_add(code_size);
        let bytes = read_some(memory, table, 4096);
        stream::line_table(&bytes, layout.encoding, MAX_LINES)
    } else {
        Vec::new()
    };
    Some(MethodInfo {
        class,
        name,
        signature,
        source,
        lines,
        code_base,
        code_size,
        const_method,
    })
}

/// Up to `len` bytes at `address`: fewer where the memory ends.
fn read_some(memory: &impl Memory, address: u64, len: usize) -> Vec<u8> {
    let mut len = len;
    while len >= 16 {
        if let Ok(bytes) = memory.bytes(address, len) {
            return bytes;
        }
        len /= 2;
    }
    Vec::new()
}

/// A `Symbol`'s text (modified UTF-8, read as UTF-8), printable.
fn read_symbol(memory: &impl Memory, layout: &JvmLayout, symbol: u64) -> Option<String> {
    let length = memory
        .array::<2>(symbol.wrapping_add(layout.symbol_length))
        .ok()
        .map(u16::from_le_bytes)?;
    let bytes = memory
        .bytes(symbol.wrapping_add(layout.symbol_body), usize::from(length))
        .ok()?;
    // The JVM's memory is the process's to forge: no control characters.
    Some(profiler_symbolize::printable(&String::from_utf8_lossy(&bytes)).into_owned())
}

/// A compiled method's method, PC descriptors and scope records.
fn read_compiled(memory: &impl Memory, layout: &JvmLayout, blob: u64) -> Option<Compiled> {
    let int = |offset: u64| {
        memory
            .u32(blob.wrapping_add(offset))
            .ok()
            .map(|v| v as i32 as i64 as u64)
    };
    let method = memory.u64(blob.wrapping_add(layout.nmethod_method)).ok()?;
    let (pcs_begin, pcs_end, scopes_begin, scopes_end, metadata) = match layout.debug_info {
        DebugInfo::InBlob {
            pcs,
            pcs_end,
            scopes_data,
            metadata,
        } => {
            let pcs_begin = blob.wrapping_add(int(pcs)?);
            let scopes_begin = memory.u64(blob.wrapping_add(scopes_data)).ok()?;
            // The scope records end where the descriptors begin.
            (
                pcs_begin,
                blob.wrapping_add(int(pcs_end)?),
                scopes_begin,
                pcs_begin,
                blob.wrapping_add(int(metadata)?),
            )
        }
        DebugInfo::Separate {
            immutable,
            pcs,
            scopes_data,
            mutable,
            relocation_size,
        } => {
            let data = memory.u64(blob.wrapping_add(immutable)).ok()?;
            let scopes_begin = data.wrapping_add(int(scopes_data)?);
            let metadata = memory
                .u64(blob.wrapping_add(mutable))
                .ok()?
                .wrapping_add(int(relocation_size)?);
            // The descriptors end where the scope records begin; the
            // records' end is not recorded: a bounded piece is read.
            (
                data.wrapping_add(int(pcs)?),
                scopes_begin,
                scopes_begin,
                scopes_begin.wrapping_add(MAX_SCOPES_BYTES),
                metadata,
            )
        }
    };
    let count = pcs_end.checked_sub(pcs_begin)? / 16;
    if count > MAX_PCS {
        return None;
    }
    let raw = memory.bytes(pcs_begin, (count * 16) as usize).ok()?;
    let pcs = raw
        .chunks_exact(16)
        .map(|r| PcDesc {
            pc_offset: i32::from_le_bytes(r[0..4].try_into().expect("4 bytes")),
            scope: i32::from_le_bytes(r[4..8].try_into().expect("4 bytes")),
        })
        .collect();
    let scopes_len = scopes_end.checked_sub(scopes_begin)?.min(MAX_SCOPES_BYTES);
    let scopes = match layout.debug_info {
        DebugInfo::InBlob { .. } => memory.bytes(scopes_begin, scopes_len as usize).ok()?,
        DebugInfo::Separate { .. } => read_some(memory, scopes_begin, scopes_len as usize),
    };
    Some(Compiled {
        method,
        pcs,
        scopes,
        metadata,
    })
}

/// The descriptor for `offset`: for a return address the one at it (the
/// call), for the PC the thread was at the first one after it (the next
/// call or safepoint, as JFR's sampler resolves it).
fn find_pc(pcs: &[PcDesc], offset: u32, exact: bool) -> Option<PcDesc> {
    let offset = i64::from(offset);
    if !exact && let Some(pc) = pcs.iter().find(|pc| i64::from(pc.pc_offset) == offset) {
        return Some(*pc);
    }
    pcs.iter()
        .filter(|pc| {
            i64::from(pc.pc_offset) > offset || (!exact && i64::from(pc.pc_offset) == offset)
        })
        .min_by_key(|pc| pc.pc_offset)
        .copied()
}

/// The scope chain at `offset` of the records: (metadata index of the
/// method, bytecode index), innermost first. Each record names its
/// sender's record, which lies before it: a chain that does not move
/// backwards is cut.
fn scope_chain(scopes: &[u8], offset: i32, encoding: Encoding) -> Vec<(u32, i64)> {
    let mut chain = Vec::new();
    let mut at = offset;
    while at > 0 && chain.len() < MAX_SCOPES {
        let mut stream = Stream::new(scopes, at as usize, encoding);
        let (Some(sender), Some(method), Some(bci)) =
            (stream.unsigned(), stream.unsigned(), stream.unsigned())
        else {
            break;
        };
        chain.push((method, i64::from(bci) - 1));
        let sender = sender as i32;
        if sender >= at {
            break;
        }
        at = sender;
    }
    chain
}

/// Metadata entry `index` (1-based; 0 is null).
fn metadata_at(memory: &impl Memory, metadata: u64, index: u32) -> Option<u64> {
    if index == 0 || index > 1 << 20 {
        return None;
    }
    memory
        .u64(metadata.wrapping_add(8 * (u64::from(index) - 1)))
        .ok()
        .filter(|&m| m != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_found_as_the_jvm_finds_them() {
        let pcs = [
            PcDesc {
                pc_offset: -1,
                scope: 0,
            },
            PcDesc {
                pc_offset: 20,
                scope: 5,
            },
            PcDesc {
                pc_offset: 48,
                scope: 9,
            },
            PcDesc {
                pc_offset: 100,
                scope: 0,
            },
        ];
        // A return address: exactly.
        assert_eq!(find_pc(&pcs, 48, false).unwrap().scope, 9);
        // The thread's PC: the next descriptor after it.
        assert_eq!(find_pc(&pcs, 30, true).unwrap().scope, 9);
        assert_eq!(find_pc(&pcs, 20, true).unwrap().scope, 9);
        assert_eq!(find_pc(&pcs, 200, true), None);
    }

    #[test]
    fn scope_chains_move_backwards_or_stop() {
        // Record at 1: sender 0, method 3, bci+1 = 5; record at 4: sender
        // 1, method 2, bci+1 = 0 (the entry, bci -1). JDK 17 encoding.
        let scopes = [0u8, 0, 3, 5, 1, 2, 0];
        assert_eq!(
            scope_chain(&scopes, 4, Encoding::Compressed),
            [(2, 0 - 1), (3, 4)]
        );
        // A record naming itself as its sender: cut after it.
        let looping = [0u8, 1, 3, 5];
        assert_eq!(scope_chain(&looping, 1, Encoding::Compressed), [(3, 4)]);
    }

    #[test]
    fn names_read_as_jfr_prints_them() {
        let info = MethodInfo {
            class: "Main$$Lambda+0x00007f2c14001000".into(),
            name: "compare".into(),
            signature: "(Ljava/lang/Object;Ljava/lang/Object;)I".into(),
            source: None,
            lines: vec![],
            code_base: 0,
            code_size: 0,
            const_method: 0,
        };
        assert_eq!(info.display_name(), "Main$$Lambda.compare");
        let sort = MethodInfo {
            class: "java/util/TimSort".into(),
            name: "mergeHi".into(),
            source: Some("TimSort.java".into()),
            lines: vec![(0, 800), (10, 808)],
            ..info
        };
        let frame = sort.frame(Some(12), true);
        assert_eq!(frame.function, "java.util.TimSort.mergeHi");
        assert_eq!(frame.file.as_deref(), Some("java/util/TimSort.java"));
        assert_eq!(frame.line, Some(808));
        assert!(frame.inlined);
    }
}

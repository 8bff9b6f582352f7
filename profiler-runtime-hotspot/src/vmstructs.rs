//! HotSpot's own description of its data structures: the
//! `gHotSpotVMStructs`, `gHotSpotVMTypes`, `gHotSpotVMIntConstants` and
//! `gHotSpotVMLongConstants` tables `libjvm.so` exports for debuggers
//! (the serviceability agent). Every offset the walker and the symbolizer
//! use comes from them: no table per JDK build.
//!
//! They are read from the process, not the file: most field offsets are 0
//! in `libjvm.so` and written by its static initializer at load, and the
//! tables' entry layouts (`gHotSpotVMStructEntry*Offset`, strides) are in
//! `.bss`. The exported symbols' addresses come from the file; everything
//! behind them from memory. A process controls all of it: entries,
//! strings and counts are bounded, and a table that does not read or
//! makes no sense is an error naming what was wrong.

use std::collections::HashMap;

use profiler_runtime::memory::Memory;

/// Entries read per table at most (JDK 17 to 25 have fewer than 1,000).
pub const MAX_ENTRIES: usize = 8192;
/// Longest name read.
const MAX_NAME: usize = 256;

/// The exported symbols the tables are found by: the four table
/// pointers, and the entry-layout globals.
pub const SYMBOLS: &[&str] = &[
    "gHotSpotVMStructs",
    "gHotSpotVMTypes",
    "gHotSpotVMIntConstants",
    "gHotSpotVMLongConstants",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMLongConstantEntryNameOffset",
    "gHotSpotVMLongConstantEntryValueOffset",
    "gHotSpotVMLongConstantEntryArrayStride",
];

/// A field: an instance field's offset, or a static field's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Offset(u64),
    Static(u64),
}

/// The tables, by name.
#[derive(Debug, Clone, Default)]
pub struct VmStructs {
    /// ("CodeBlob", "_frame_size") → field.
    pub fields: HashMap<(String, String), Field>,
    /// ("CodeBlob", "_frame_size") → its C type ("int", "int16_t").
    pub field_types: HashMap<(String, String), String>,
    /// Type name → size in bytes.
    pub types: HashMap<String, u64>,
    pub ints: HashMap<String, i64>,
    pub longs: HashMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmStructsError {
    #[error("libjvm exports no {0} (not HotSpot, or a build without the serviceability tables)")]
    MissingSymbol(&'static str),
    #[error("reading {what} at {address:#x}: {reason}")]
    Read {
        what: String,
        address: u64,
        reason: String,
    },
    #[error("{0}: the entry layout makes no sense (stride {1})")]
    Layout(&'static str, u64),
    #[error("{0} has more than {MAX_ENTRIES} entries")]
    TooMany(&'static str),
    #[error("the VM is not initialized yet ({0} is not set)")]
    NotReady(&'static str),
}

/// The entry layout of one table.
struct TableLayout {
    name_offset: u64,
    stride: u64,
}

impl VmStructs {
    /// Reads the tables from `memory`, the symbols being at `address(name)`
    /// (process addresses of the exported variables).
    pub fn read(
        memory: &impl Memory,
        address: impl Fn(&'static str) -> Option<u64>,
    ) -> Result<VmStructs, VmStructsError> {
        let global = |name: &'static str| -> Result<u64, VmStructsError> {
            let at = address(name).ok_or(VmStructsError::MissingSymbol(name))?;
            memory.u64(at).map_err(|e| VmStructsError::Read {
                what: name.into(),
                address: at,
                reason: e.to_string(),
            })
        };
        let layout = |table: &'static str, name: &'static str, stride: &'static str| {
            let layout = TableLayout {
                name_offset: global(name)?,
                stride: global(stride)?,
            };
            // Entries are a few pointers and numbers: a stride outside
            // 16..256 is not a table.
            if !(16..=256).contains(&layout.stride) || layout.name_offset >= layout.stride {
                return Err(VmStructsError::Layout(table, layout.stride));
            }
            Ok(layout)
        };
        let mut structs = VmStructs::default();
        // The table itself first: its absence says "not HotSpot".
        let first_field = global("gHotSpotVMStructs")?;
        let fields = layout(
            "gHotSpotVMStructs",
            "gHotSpotVMStructEntryTypeNameOffset",
            "gHotSpotVMStructEntryArrayStride",
        )?;
        let field_name = global("gHotSpotVMStructEntryFieldNameOffset")?;
        let type_string = global("gHotSpotVMStructEntryTypeStringOffset")?;
        let is_static = global("gHotSpotVMStructEntryIsStaticOffset")?;
        let offset = global("gHotSpotVMStructEntryOffsetOffset")?;
        let static_address = global("gHotSpotVMStructEntryAddressOffset")?;
        for entry in entries(memory, first_field, &fields, "gHotSpotVMStructs")? {
            let type_name = name_at(memory, entry.wrapping_add(fields.name_offset))?;
            let field = name_at(memory, entry.wrapping_add(field_name))?;
            let value = if read_u32(memory, entry.wrapping_add(is_static))? != 0 {
                Field::Static(read_u64(memory, entry.wrapping_add(static_address))?)
            } else {
                Field::Offset(read_u64(memory, entry.wrapping_add(offset))?)
            };
            // Not every entry names its type (a null string).
            let type_of = match read_u64(memory, entry.wrapping_add(type_string))? {
                0 => String::new(),
                _ => name_at(memory, entry.wrapping_add(type_string))?,
            };
            structs
                .field_types
                .insert((type_name.clone(), field.clone()), type_of);
            structs.fields.insert((type_name, field), value);
        }

        let types = layout(
            "gHotSpotVMTypes",
            "gHotSpotVMTypeEntryTypeNameOffset",
            "gHotSpotVMTypeEntryArrayStride",
        )?;
        let size = global("gHotSpotVMTypeEntrySizeOffset")?;
        for entry in entries(
            memory,
            global("gHotSpotVMTypes")?,
            &types,
            "gHotSpotVMTypes",
        )? {
            let name = name_at(memory, entry.wrapping_add(types.name_offset))?;
            structs
                .types
                .insert(name, read_u64(memory, entry.wrapping_add(size))?);
        }

        let ints = layout(
            "gHotSpotVMIntConstants",
            "gHotSpotVMIntConstantEntryNameOffset",
            "gHotSpotVMIntConstantEntryArrayStride",
        )?;
        let value = global("gHotSpotVMIntConstantEntryValueOffset")?;
        for entry in entries(
            memory,
            global("gHotSpotVMIntConstants")?,
            &ints,
            "gHotSpotVMIntConstants",
        )? {
            let name = name_at(memory, entry.wrapping_add(ints.name_offset))?;
            let v = read_u32(memory, entry.wrapping_add(value))? as i32;
            structs.ints.insert(name, i64::from(v));
        }

        let longs = layout(
            "gHotSpotVMLongConstants",
            "gHotSpotVMLongConstantEntryNameOffset",
            "gHotSpotVMLongConstantEntryArrayStride",
        )?;
        let value = global("gHotSpotVMLongConstantEntryValueOffset")?;
        for entry in entries(
            memory,
            global("gHotSpotVMLongConstants")?,
            &longs,
            "gHotSpotVMLongConstants",
        )? {
            let name = name_at(memory, entry.wrapping_add(longs.name_offset))?;
            structs
                .longs
                .insert(name, read_u64(memory, entry.wrapping_add(value))?);
        }
        Ok(structs)
    }

    /// An instance field's offset.
    pub fn offset(&self, type_name: &str, field: &str) -> Option<u64> {
        match self
            .fields
            .get(&(type_name.to_string(), field.to_string()))?
        {
            Field::Offset(offset) => Some(*offset),
            Field::Static(_) => None,
        }
    }

    /// A static field's address in the process.
    pub fn address(&self, type_name: &str, field: &str) -> Option<u64> {
        match self
            .fields
            .get(&(type_name.to_string(), field.to_string()))?
        {
            Field::Static(address) => Some(*address),
            Field::Offset(_) => None,
        }
    }

    /// A field's C type, as the table names it.
    pub fn type_of(&self, type_name: &str, field: &str) -> Option<&str> {
        self.field_types
            .get(&(type_name.to_string(), field.to_string()))
            .map(String::as_str)
    }

    pub fn size(&self, type_name: &str) -> Option<u64> {
        self.types.get(type_name).copied()
    }
}

/// The addresses of a table's entries, up to the one with a null name.
fn entries(
    memory: &impl Memory,
    first: u64,
    layout: &TableLayout,
    table: &'static str,
) -> Result<Vec<u64>, VmStructsError> {
    let mut entries = Vec::new();
    let mut at = first;
    loop {
        if read_u64(memory, at.wrapping_add(layout.name_offset))? == 0 {
            return Ok(entries);
        }
        if entries.len() >= MAX_ENTRIES {
            return Err(VmStructsError::TooMany(table));
        }
        entries.push(at);
        at = at.wrapping_add(layout.stride);
    }
}

fn read_u64(memory: &impl Memory, address: u64) -> Result<u64, VmStructsError> {
    memory.u64(address).map_err(|e| VmStructsError::Read {
        what: "a table entry".into(),
        address,
        reason: e.to_string(),
    })
}

fn read_u32(memory: &impl Memory, address: u64) -> Result<u32, VmStructsError> {
    memory.u32(address).map_err(|e| VmStructsError::Read {
        what: "a table entry".into(),
        address,
        reason: e.to_string(),
    })
}

/// The C string a pointer at `address` points to.
fn name_at(memory: &impl Memory, address: u64) -> Result<String, VmStructsError> {
    let pointer = read_u64(memory, address)?;
    memory
        .c_string(pointer, MAX_NAME)
        .map_err(|e| VmStructsError::Read {
            what: "a name".into(),
            address: pointer,
            reason: e.to_string(),
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use profiler_runtime::memory::ImageMemory;

    /// A process image with VMStructs tables of the given fields, types
    /// and constants, laid out as JDK 17 to 25 lay them out; returns the
    /// image and the symbol addresses.
    pub(crate) fn image(
        fields: &[(&str, &str, Field)],
        types: &[(&str, u64)],
        ints: &[(&str, i32)],
    ) -> (ImageMemory, HashMap<&'static str, u64>) {
        const BASE: u64 = 0x10000;
        let mut bytes = vec![0u8; 0x10000];
        let mut strings_at = 0x8000usize;
        let mut string = |bytes: &mut Vec<u8>, text: &str| -> u64 {
            let at = strings_at;
            bytes[at..at + text.len()].copy_from_slice(text.as_bytes());
            strings_at += text.len() + 1;
            BASE + at as u64
        };
        let put = |bytes: &mut Vec<u8>, at: usize, value: u64| {
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        let mut symbols = HashMap::new();
        // Layout globals at 0x100.., one word each.
        let globals = [
            ("gHotSpotVMStructEntryTypeNameOffset", 0),
            ("gHotSpotVMStructEntryFieldNameOffset", 8),
            ("gHotSpotVMStructEntryTypeStringOffset", 16),
            ("gHotSpotVMStructEntryIsStaticOffset", 24),
            ("gHotSpotVMStructEntryOffsetOffset", 32),
            ("gHotSpotVMStructEntryAddressOffset", 40),
            ("gHotSpotVMStructEntryArrayStride", 48),
            ("gHotSpotVMTypeEntryTypeNameOffset", 0),
            ("gHotSpotVMTypeEntrySizeOffset", 32),
            ("gHotSpotVMTypeEntryArrayStride", 40),
            ("gHotSpotVMIntConstantEntryNameOffset", 0),
            ("gHotSpotVMIntConstantEntryValueOffset", 8),
            ("gHotSpotVMIntConstantEntryArrayStride", 16),
            ("gHotSpotVMLongConstantEntryNameOffset", 0),
            ("gHotSpotVMLongConstantEntryValueOffset", 8),
            ("gHotSpotVMLongConstantEntryArrayStride", 16),
        ];
        for (i, (name, value)) in globals.iter().enumerate() {
            let at = 0x100 + 8 * i;
            put(&mut bytes, at, *value);
            symbols.insert(*name, BASE + at as u64);
        }
        // Tables at 0x1000 (fields), 0x4000 (types), 0x6000 (ints),
        // 0x7000 (longs, empty); their pointers at 0x200...
        for (i, name) in [
            "gHotSpotVMStructs",
            "gHotSpotVMTypes",
            "gHotSpotVMIntConstants",
            "gHotSpotVMLongConstants",
        ]
        .iter()
        .enumerate()
        {
            let table = [0x1000u64, 0x4000, 0x6000, 0x7000][i];
            put(&mut bytes, 0x200 + 8 * i, BASE + table);
            symbols.insert(*name, BASE + 0x200 + 8 * i as u64);
        }
        for (i, (type_name, field, value)) in fields.iter().enumerate() {
            let at = 0x1000 + 48 * i;
            let t = string(&mut bytes, type_name);
            let f = string(&mut bytes, field);
            put(&mut bytes, at, t);
            put(&mut bytes, at + 8, f);
            match value {
                Field::Offset(offset) => put(&mut bytes, at + 32, *offset),
                Field::Static(address) => {
                    put(&mut bytes, at + 24, 1);
                    put(&mut bytes, at + 40, *address);
                }
            }
        }
        for (i, (name, size)) in types.iter().enumerate() {
            let at = 0x4000 + 40 * i;
            let n = string(&mut bytes, name);
            put(&mut bytes, at, n);
            put(&mut bytes, at + 32, *size);
        }
        for (i, (name, value)) in ints.iter().enumerate() {
            let at = 0x6000 + 16 * i;
            let n = string(&mut bytes, name);
            put(&mut bytes, at, n);
            put(&mut bytes, at + 8, *value as u32 as u64);
        }
        (ImageMemory { base: BASE, bytes }, symbols)
    }

    #[test]
    fn tables_are_read_from_memory() {
        let (memory, symbols) = image(
            &[
                ("CodeBlob", "_frame_size", Field::Offset(28)),
                ("CodeCache", "_heaps", Field::Static(0x7f00_0000_1000)),
            ],
            &[("ConstMethod", 48)],
            &[("InvocationEntryBci", -1)],
        );
        let structs = VmStructs::read(&memory, |name| symbols.get(name).copied()).unwrap();
        assert_eq!(structs.offset("CodeBlob", "_frame_size"), Some(28));
        assert_eq!(
            structs.address("CodeCache", "_heaps"),
            Some(0x7f00_0000_1000)
        );
        assert_eq!(structs.offset("CodeCache", "_heaps"), None);
        assert_eq!(structs.size("ConstMethod"), Some(48));
        assert_eq!(structs.ints["InvocationEntryBci"], -1);
    }

    #[test]
    fn forged_tables_are_refused() {
        let (mut memory, symbols) = image(&[], &[], &[]);
        // No symbol: not HotSpot.
        assert_eq!(
            VmStructs::read(&memory, |_| None).unwrap_err(),
            VmStructsError::MissingSymbol("gHotSpotVMStructs")
        );
        // A stride of 0 would read the same entry forever.
        let stride = (symbols["gHotSpotVMStructEntryArrayStride"] - memory.base) as usize;
        memory.bytes[stride..stride + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            VmStructs::read(&memory, |name| symbols.get(name).copied()),
            Err(VmStructsError::Layout("gHotSpotVMStructs", 0))
        ));
    }
}

//! Bounds-checked reads of little- or big-endian integers, varints and
//! NUL-terminated strings. Every read of binary data goes through here, so
//! a truncated or corrupted table yields `None`, never a panic.

/// Byte order of the target the binary was built for (Go writes its tables
/// in the target's order: s390x and big-endian ppc64 exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endian {
    Little,
    Big,
}

impl Endian {
    pub(crate) fn u16(self, data: &[u8], offset: usize) -> Option<u16> {
        let bytes: [u8; 2] = data.get(offset..offset.checked_add(2)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u16::from_le_bytes(bytes),
            Endian::Big => u16::from_be_bytes(bytes),
        })
    }

    pub(crate) fn u32(self, data: &[u8], offset: usize) -> Option<u32> {
        let bytes: [u8; 4] = data.get(offset..offset.checked_add(4)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u32::from_le_bytes(bytes),
            Endian::Big => u32::from_be_bytes(bytes),
        })
    }

    pub(crate) fn i32(self, data: &[u8], offset: usize) -> Option<i32> {
        self.u32(data, offset).map(|v| v as i32)
    }

    pub(crate) fn u64(self, data: &[u8], offset: usize) -> Option<u64> {
        let bytes: [u8; 8] = data.get(offset..offset.checked_add(8)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u64::from_le_bytes(bytes),
            Endian::Big => u64::from_be_bytes(bytes),
        })
    }

    /// A pointer-sized word (`uintptr`): 4 or 8 bytes.
    pub(crate) fn word(self, data: &[u8], offset: usize, ptr_size: u8) -> Option<u64> {
        match ptr_size {
            4 => self.u32(data, offset).map(u64::from),
            8 => self.u64(data, offset),
            _ => None,
        }
    }
}

/// Go's `readvarint` (runtime/symtab.go): a uvarint of at most 32 bits.
/// Advances `pos` past it.
pub(crate) fn uvarint32(data: &[u8], pos: &mut usize) -> Option<u32> {
    let mut value: u32 = 0;
    let mut shift = 0u32;
    loop {
        let byte = *data.get(*pos)?;
        *pos += 1;
        value |= u32::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > 28 {
            // Go's encoder never writes more than 5 bytes for a uint32.
            return None;
        }
    }
}

/// A standard (64-bit) uvarint, as `encoding/binary` writes it.
pub(crate) fn uvarint64(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        let byte = *data.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

/// The NUL-terminated bytes at `offset` (without the NUL).
pub(crate) fn cstr(data: &[u8], offset: usize) -> Option<&[u8]> {
    let rest = data.get(offset..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded() {
        let data = [1u8, 2, 3, 4, 5];
        assert_eq!(Endian::Little.u32(&data, 0), Some(0x0403_0201));
        assert_eq!(Endian::Big.u32(&data, 1), Some(0x0203_0405));
        assert_eq!(Endian::Little.u32(&data, 2), None);
        assert_eq!(Endian::Little.u32(&data, usize::MAX), None);
        assert_eq!(Endian::Little.word(&data, 0, 3), None);
        assert_eq!(cstr(b"ab\0cd", 0), Some(&b"ab"[..]));
        assert_eq!(cstr(b"ab\0cd", 3), None, "no terminator");
    }

    #[test]
    fn varints() {
        let data = [0xe5, 0x8e, 0x26, 0x80];
        let mut pos = 0;
        assert_eq!(uvarint32(&data, &mut pos), Some(624_485));
        assert_eq!(pos, 3);
        assert_eq!(uvarint32(&data, &mut pos), None, "truncated");
        let long = [0xff; 8];
        assert_eq!(uvarint32(&long, &mut 0), None, "over 5 bytes");
        assert_eq!(uvarint64(&[0x96, 0x01], &mut 0), Some(150));
    }
}

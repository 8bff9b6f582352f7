//! The JVM's compressed number streams: the debug information of compiled
//! methods (scope descriptors) and the line-number tables of methods.
//!
//! HotSpot writes unsigned integers in one to five bytes: a byte below the
//! "low" bound ends the number, higher bytes carry 6 more bits each. JDK
//! 20 changed the encoding to UNSIGNED5 with an excess of 1, so that no
//! byte is 0 (JDK 17 writes small numbers as themselves). Decoding one
//! JDK's streams with the other's rule gives garbage, so the rule is the
//! JVM's version's. Signed numbers are zigzag-coded on top.
//! (HotSpot: `CompressedReadStream`, `UNSIGNED5`; checked on every scope
//! chain and line table of three JDKs, docs/design/hotspot-layouts.md.)

/// How a JVM encodes its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// JDK 19 and earlier: `CompressedReadStream` (bytes below 192 end a
    /// number, no excess).
    Compressed,
    /// JDK 20 on: UNSIGNED5 with excess 1 (each byte is its value plus 1;
    /// bytes below 192 end a number).
    Unsigned5,
}

impl Encoding {
    pub fn of_major(major: u32) -> Encoding {
        if major >= 20 {
            Encoding::Unsigned5
        } else {
            Encoding::Compressed
        }
    }
}

/// Bytes at or above this continue a number.
const LOW: u32 = 192;

/// A position in a stream of bytes.
#[derive(Debug, Clone)]
pub struct Stream<'a> {
    bytes: &'a [u8],
    at: usize,
    encoding: Encoding,
}

impl<'a> Stream<'a> {
    pub fn new(bytes: &'a [u8], at: usize, encoding: Encoding) -> Self {
        Stream {
            bytes,
            at,
            encoding,
        }
    }

    pub fn position(&self) -> usize {
        self.at
    }

    pub fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// An unsigned number (`read_int`); None past the end of the bytes.
    pub fn unsigned(&mut self) -> Option<u32> {
        let excess = match self.encoding {
            Encoding::Compressed => 0,
            Encoding::Unsigned5 => 1,
        };
        let first = u32::from(self.byte()?);
        let value = first.checked_sub(excess)?;
        if first < LOW {
            return Some(value);
        }
        let mut sum = value;
        let mut shift = 6;
        for i in 1..5 {
            let b = u32::from(self.byte()?);
            sum = sum.wrapping_add(b.checked_sub(excess)?.wrapping_shl(shift));
            if b < LOW || i == 4 {
                return Some(sum);
            }
            shift += 6;
        }
        Some(sum)
    }

    /// A zigzag-coded signed number (`read_signed_int`).
    pub fn signed(&mut self) -> Option<i32> {
        let v = self.unsigned()?;
        Some(((v >> 1) as i32) ^ -((v & 1) as i32))
    }
}

/// A method's line-number table as (bytecode index, line) pairs, read from
/// its bytes (which follow the bytecodes): a 0 byte ends it; 0xFF escapes
/// two signed deltas; any other byte holds a 5-bit bci delta and a 3-bit
/// line delta. At most `max` pairs (a forged table ends there).
pub fn line_table(bytes: &[u8], encoding: Encoding, max: usize) -> Vec<(u32, u32)> {
    let mut stream = Stream::new(bytes, 0, encoding);
    let (mut bci, mut line) = (0i64, 0i64);
    let mut pairs = Vec::new();
    while pairs.len() < max {
        let Some(b) = stream.byte() else { break };
        match b {
            0 => break,
            0xff => {
                let (Some(d_bci), Some(d_line)) = (stream.signed(), stream.signed()) else {
                    break;
                };
                bci += i64::from(d_bci);
                line += i64::from(d_line);
            }
            b => {
                bci += i64::from(b >> 3);
                line += i64::from(b & 7);
            }
        }
        if !(0..=i64::from(u32::MAX)).contains(&bci) || !(0..=i64::from(u32::MAX)).contains(&line) {
            break;
        }
        pairs.push((bci as u32, line as u32));
    }
    pairs
}

/// The line of `bci` in a table: an exact entry, else the entry with the
/// largest start at or below it (the table need not be sorted; a later
/// entry wins a tie), as HotSpot's `line_number_from_bci`. A negative bci
/// (a method's entry) is bci 0.
pub fn line_of(table: &[(u32, u32)], bci: i64) -> Option<u32> {
    let bci = bci.max(0) as u32;
    let mut best: Option<(u32, u32)> = None;
    for &(start, line) in table {
        if start == bci {
            return Some(line);
        }
        if start < bci && best.is_none_or(|(b, _)| start >= b) {
            best = Some((start, line));
        }
    }
    best.map(|(_, line)| line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_decode_in_both_encodings() {
        // Small values: themselves (17), plus one (21 on).
        assert_eq!(
            Stream::new(&[5], 0, Encoding::Compressed).unsigned(),
            Some(5)
        );
        assert_eq!(
            Stream::new(&[6], 0, Encoding::Unsigned5).unsigned(),
            Some(5)
        );
        // 0 is never a 0 byte in UNSIGNED5.
        assert_eq!(Stream::new(&[0], 0, Encoding::Unsigned5).unsigned(), None);
        // 300 = 192 + (108 - 64·0)... two bytes: 192 + r, then the rest.
        // Compressed: b0 = 192 + (300 - 192) % 64 = 236, b1 = (300 - 236) / 64 = 1.
        assert_eq!(
            Stream::new(&[236, 1], 0, Encoding::Compressed).unsigned(),
            Some(300)
        );
        // UNSIGNED5: b0 - 1 = 236 - 1 ... value = (b0-1) + ((b1-1) << 6).
        assert_eq!(
            Stream::new(&[237, 2], 0, Encoding::Unsigned5).unsigned(),
            Some(300)
        );
        // Zigzag: 1 → -1, 2 → 1.
        assert_eq!(
            Stream::new(&[1], 0, Encoding::Compressed).signed(),
            Some(-1)
        );
        assert_eq!(Stream::new(&[3], 0, Encoding::Unsigned5).signed(), Some(1));
        // Past the end: None.
        assert_eq!(
            Stream::new(&[236], 0, Encoding::Compressed).unsigned(),
            None
        );
    }

    #[test]
    fn line_tables_read_as_javap_prints_them() {
        // Main.interp (same on 17, 21, 25): [(0,30),(2,31),(9,32),(17,33),
        // (23,31),(29,35)]: an escape first (bci 0, line 30), then packed
        // deltas, and a backwards line delta escaped.
        let table_17 = [
            0xff,
            0,
            60,
            (2 << 3) | 1,
            (7 << 3) | 1,
            (8 << 3) | 1,
            0xff,
            12,
            3,
            (6 << 3) | 4,
            0,
        ];
        let pairs = line_table(&table_17, Encoding::Compressed, 64);
        assert_eq!(
            pairs,
            [(0, 30), (2, 31), (9, 32), (17, 33), (23, 31), (29, 35)]
        );
        // 21 on: the escaped numbers carry the excess.
        let table_21 = [
            0xff,
            1,
            61,
            (2 << 3) | 1,
            (7 << 3) | 1,
            (8 << 3) | 1,
            0xff,
            13,
            4,
            (6 << 3) | 4,
            0,
        ];
        assert_eq!(line_table(&table_21, Encoding::Unsigned5, 64), pairs);
        assert_eq!(line_of(&pairs, 6), Some(31));
        assert_eq!(line_of(&pairs, 25), Some(31));
        assert_eq!(line_of(&pairs, -1), Some(30));
        assert_eq!(line_of(&[], 3), None);
        // A forged table ends at the bound.
        assert_eq!(line_table(&[8; 100], Encoding::Compressed, 10).len(), 10);
    }
}

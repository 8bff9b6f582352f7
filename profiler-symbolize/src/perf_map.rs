//! JIT symbol maps: `/tmp/perf-PID.map`, the text file in which Node.js
//! (`--perf-basic-prof`), the JVM (perf-map-agent), .NET
//! (`DOTNET_PerfMapEnabled=1`), Python ≥ 3.12 (`-X perf`) and others name
//! the code they generate, one line per function:
//!
//! ```text
//! START SIZE NAME        hex start and size (an optional 0x), then the
//! 7f31a8c01040 2c LazyCompile:*fib /app/fib.js:3   rest of the line
//! ```
//!
//! perf and bcc read it for addresses in anonymous executable mappings.
//! The file is written by the profiled process, so it is untrusted input:
//! lines that do not parse are skipped (counted), names and the number of
//! entries are bounded, and the file is read through the process's root
//! with a size cap (see `process::JitMap`). When a JIT writes the same
//! address twice (code freed and reused), the later line wins, as in perf.

/// Longest name kept, in bytes (longer ones are cut at a char boundary).
pub const MAX_NAME_BYTES: usize = 1024;

/// Most entries kept from one file; lines past it are counted, not kept.
pub const MAX_ENTRIES: usize = 1 << 21;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: Box<str>,
}

/// The functions of one perf map, sorted by start address.
#[derive(Debug, Clone, Default)]
pub struct PerfMap {
    entries: Vec<Entry>,
    /// Lines that did not parse (or past `MAX_ENTRIES`).
    pub skipped: usize,
}

impl PerfMap {
    /// Parses the text of a perf map.
    pub fn parse(text: &str) -> PerfMap {
        let mut entries: Vec<(usize, Entry)> = Vec::new();
        let mut skipped = 0;
        for (line_no, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            if entries.len() >= MAX_ENTRIES {
                skipped += 1;
                continue;
            }
            match parse_line(line) {
                Some(entry) => entries.push((line_no, entry)),
                None => skipped += 1,
            }
        }
        // By start; for one start, the last line written wins.
        entries.sort_by(|(a_line, a), (b_line, b)| a.start.cmp(&b.start).then(b_line.cmp(a_line)));
        entries.dedup_by(|later, earlier| later.1.start == earlier.1.start);
        PerfMap {
            entries: entries.into_iter().map(|(_, e)| e).collect(),
            skipped,
        }
    }

    /// The name of the function containing `address`. Where entries
    /// overlap, the one starting closest below the address is taken.
    pub fn lookup(&self, address: u64) -> Option<&str> {
        let index = self.entries.partition_point(|e| e.start <= address);
        let entry = self.entries.get(index.checked_sub(1)?)?;
        (address < entry.end).then_some(&*entry.name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn parse_line(line: &str) -> Option<Entry> {
    let line = line.trim_start();
    let (start, rest) = line.split_once(|c: char| c.is_ascii_whitespace())?;
    let rest = rest.trim_start();
    let (size, name) = rest
        .split_once(|c: char| c.is_ascii_whitespace())
        .unwrap_or((rest, ""));
    let start = hex(start)?;
    let size = hex(size)?;
    let name = name.trim();
    if size == 0 || name.is_empty() {
        return None;
    }
    let end = start.checked_add(size)?;
    let mut cut = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let name = crate::printable(&name[..cut]).into_owned();
    Some(Entry {
        start,
        end,
        name: name.into_boxed_str(),
    })
}

fn hex(text: &str) -> Option<u64> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_jvm_and_python_lines_are_read() {
        let map = PerfMap::parse(
            "7f31a8c01040 2c LazyCompile:*fib /app/fib.js:3\n\
             0x7f31a8c02000 0x100 Interpreted:java.lang.String.hashCode()I\n\
             7f31a8c03000 40 py::main:/srv/app.py\n",
        );
        assert_eq!(map.len(), 3);
        assert_eq!(map.skipped, 0);
        assert_eq!(
            map.lookup(0x7f31a8c01040),
            Some("LazyCompile:*fib /app/fib.js:3")
        );
        assert_eq!(
            map.lookup(0x7f31a8c0106b),
            Some("LazyCompile:*fib /app/fib.js:3")
        );
        assert_eq!(map.lookup(0x7f31a8c0106c), None);
        assert_eq!(
            map.lookup(0x7f31a8c020ff),
            Some("Interpreted:java.lang.String.hashCode()I")
        );
        assert_eq!(map.lookup(0x7f31a8c03010), Some("py::main:/srv/app.py"));
        assert_eq!(map.lookup(0x1000), None);
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted() {
        let map = PerfMap::parse(
            "not a line\n\
             zz 10 bad_start\n\
             1000 zz bad_size\n\
             1000 10\n\
             1000 0 empty\n\
             ffffffffffffffff 10 overflows\n\
             11112222333344445 10 too_long\n\
             \n\
             2000 10 good\n",
        );
        assert_eq!(map.len(), 1);
        assert_eq!(map.skipped, 7);
        assert_eq!(map.lookup(0x2008), Some("good"));
    }

    #[test]
    fn a_rewritten_address_takes_the_later_name() {
        let map = PerfMap::parse("1000 100 old\n1000 80 new\n");
        assert_eq!(map.len(), 1);
        assert_eq!(map.lookup(0x1010), Some("new"));
        assert_eq!(map.lookup(0x1090), None);
    }

    #[test]
    fn names_are_bounded_and_made_printable() {
        let long = "é".repeat(MAX_NAME_BYTES);
        let map = PerfMap::parse(&format!("1000 10 {long}\n2000 10 a\tb\u{1b}[31m\n"));
        let name = map.lookup(0x1000).unwrap();
        assert!(name.len() <= MAX_NAME_BYTES && name.chars().all(|c| c == 'é'));
        assert_eq!(map.lookup(0x2000), Some("a?b?[31m"));
    }
}

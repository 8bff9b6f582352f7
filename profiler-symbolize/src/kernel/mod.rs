//! Kernel symbols from `/proc/kallsyms`.

use std::path::Path;

/// Kernel text symbols sorted by address.
pub struct KernelSymbols {
    addresses: Vec<u64>,
    /// Each address's name: a range of `text`.
    names: Vec<(u32, u32)>,
    text: String,
    /// `__sched_text_start..__sched_text_end`: the scheduler's functions
    /// and those marked `__sched` (schedule, do_nanosleep, io_schedule,
    /// the mutex slow paths), which the kernel's own stack traces of
    /// sleeping tasks leave out.
    sched_text: Option<(u64, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum KernelSymbolsError {
    #[error("could not read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} lists every address as 0: kernel.kptr_restrict hides them from this process \
         (run as root, or set kernel.kptr_restrict=0)"
    )]
    Hidden { path: String },
}

impl KernelSymbols {
    /// Reads `path` (`/proc/kallsyms`) a line at a time: the whole text is
    /// about 5 MB, read into one string it was 8 MiB of heap at once, the
    /// top of `record`'s peak memory when it came on top of the profile
    /// being built.
    pub fn load(path: &Path) -> Result<Self, KernelSymbolsError> {
        let read_error = |source| KernelSymbolsError::Read {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let symbols = Self::read(std::io::BufReader::new(file)).map_err(read_error)?;
        if symbols.addresses.is_empty() {
            return Err(KernelSymbolsError::Hidden {
                path: path.display().to_string(),
            });
        }
        Ok(symbols)
    }

    /// Parses kallsyms text: `ADDRESS TYPE NAME [MODULE]`, keeping code
    /// symbols (types t/T and weak w/W) with a non-zero address.
    pub fn parse(text: &str) -> Self {
        Self::read(text.as_bytes()).expect("reading from memory does not fail")
    }

    fn read(mut input: impl std::io::BufRead) -> std::io::Result<Self> {
        let (mut sched_start, mut sched_end) = (None, None);
        // (address, where its name is in `text`): one string for every
        // name, not an allocation each (about 100,000 of them).
        let mut symbols: Vec<(u64, u32, u32)> = Vec::new();
        let mut text = String::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            if input.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            // kallsyms is ASCII; a line that is not UTF-8 is not a symbol.
            let Ok(line) = std::str::from_utf8(&line) else {
                continue;
            };
            let mut fields = line.split_ascii_whitespace();
            let (Some(address), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(address) = u64::from_str_radix(address, 16) else {
                continue;
            };
            match name {
                "__sched_text_start" => sched_start = Some(address),
                "__sched_text_end" => sched_end = Some(address),
                _ => {}
            }
            let is_code = matches!(kind, "t" | "T" | "w" | "W");
            if !is_code || address == 0 {
                continue;
            }
            // Offsets are u32: names past 4 GiB are not a kallsyms.
            let (start, end) = (text.len(), text.len() + name.len());
            let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) else {
                break;
            };
            text.push_str(name);
            symbols.push((address, start, end));
        }
        symbols.sort_by_key(|(address, ..)| *address);
        symbols.dedup_by_key(|(address, ..)| *address);
        let addresses = symbols.iter().map(|(address, ..)| *address).collect();
        let names = symbols
            .iter()
            .map(|&(_, start, end)| (start, end))
            .collect();
        text.shrink_to_fit();
        let sched_text = match (sched_start, sched_end) {
            (Some(start), Some(end)) if start != 0 && start < end => Some((start, end)),
            _ => None,
        };
        Ok(KernelSymbols {
            addresses,
            names,
            text,
            sched_text,
        })
    }

    /// Whether `address` is in the scheduler's text section.
    pub fn in_scheduler(&self, address: u64) -> bool {
        self.sched_text
            .is_some_and(|(start, end)| start <= address && address < end)
    }

    /// The function containing `address`: the nearest symbol at or below.
    pub fn lookup(&self, address: u64) -> Option<&str> {
        let index = self.addresses.partition_point(|&a| a <= address);
        let (start, end) = self.names[index.checked_sub(1)?];
        self.text.get(start as usize..end as usize)
    }

    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_enclosing_function() {
        let symbols = KernelSymbols::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81001000 t do_syscall_64\n\
             ffffffff81002000 D some_data\n\
             ffffffff81003000 T vfs_read\n\
             ffffffffc0000000 t ext4_read [ext4]\n",
        );
        assert_eq!(symbols.len(), 4);
        assert_eq!(symbols.lookup(0xffffffff81001234), Some("do_syscall_64"));
        // Data symbols do not end a function.
        assert_eq!(symbols.lookup(0xffffffff81002100), Some("do_syscall_64"));
        assert_eq!(symbols.lookup(0xffffffff81003000), Some("vfs_read"));
        assert_eq!(symbols.lookup(0xffffffffc0000010), Some("ext4_read"));
        assert_eq!(symbols.lookup(0x1000), None);
    }

    #[test]
    fn reads_a_file_line_by_line_and_skips_lines_that_are_not_symbols() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kallsyms");
        let mut text = b"ffffffff81000000 T _stext\n".to_vec();
        text.extend_from_slice(b"ffffffff81000800 t bad\xff\n");
        text.extend_from_slice(b"short line\nffffffff81001000 T schedule\n");
        text.extend_from_slice(b"ffffffff81001000 t schedule_alias\nffffffff81002000 T last");
        std::fs::write(&path, text).unwrap();
        let symbols = KernelSymbols::load(&path).unwrap();
        // Same address twice: the first name listed stays.
        assert_eq!(symbols.len(), 3);
        assert_eq!(symbols.lookup(0xffffffff81000900), Some("_stext"));
        assert_eq!(symbols.lookup(0xffffffff81001004), Some("schedule"));
        // The last line needs no newline.
        assert_eq!(symbols.lookup(0xffffffff81002000), Some("last"));
    }

    #[test]
    fn hidden_addresses_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kallsyms");
        std::fs::write(&path, "0000000000000000 T _stext\n0000000000000000 t foo\n").unwrap();
        let error = KernelSymbols::load(&path).err().unwrap();
        assert!(error.to_string().contains("kptr_restrict"), "{error}");
    }
}

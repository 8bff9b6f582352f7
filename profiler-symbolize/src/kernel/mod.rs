//! Kernel symbols from `/proc/kallsyms`.

use std::path::Path;

/// Kernel text symbols sorted by address.
pub struct KernelSymbols {
    addresses: Vec<u64>,
    names: Vec<Box<str>>,
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
    pub fn load(path: &Path) -> Result<Self, KernelSymbolsError> {
        let text = std::fs::read_to_string(path).map_err(|source| KernelSymbolsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let symbols = Self::parse(&text);
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
        let (mut sched_start, mut sched_end) = (None, None);
        let mut symbols: Vec<(u64, Box<str>)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_ascii_whitespace();
                let address = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                match name {
                    "__sched_text_start" => sched_start = Some(address),
                    "__sched_text_end" => sched_end = Some(address),
                    _ => {}
                }
                let is_code = matches!(kind, "t" | "T" | "w" | "W");
                (is_code && address != 0).then(|| (address, Box::from(name)))
            })
            .collect();
        symbols.sort_by_key(|(address, _)| *address);
        symbols.dedup_by_key(|(address, _)| *address);
        let (addresses, names) = symbols.into_iter().unzip();
        let sched_text = match (sched_start, sched_end) {
            (Some(start), Some(end)) if start != 0 && start < end => Some((start, end)),
            _ => None,
        };
        KernelSymbols {
            addresses,
            names,
            sched_text,
        }
    }

    /// Whether `address` is in the scheduler's text section.
    pub fn in_scheduler(&self, address: u64) -> bool {
        self.sched_text
            .is_some_and(|(start, end)| start <= address && address < end)
    }

    /// The function containing `address`: the nearest symbol at or below.
    pub fn lookup(&self, address: u64) -> Option<&str> {
        let index = self.addresses.partition_point(|&a| a <= address);
        Some(&self.names[index.checked_sub(1)?])
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
    fn hidden_addresses_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kallsyms");
        std::fs::write(&path, "0000000000000000 T _stext\n0000000000000000 t foo\n").unwrap();
        let error = KernelSymbols::load(&path).err().unwrap();
        assert!(error.to_string().contains("kptr_restrict"), "{error}");
    }
}

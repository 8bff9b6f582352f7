//! Library names resolved as the dynamic loader does: through
//! `/etc/ld.so.cache`, so `usdt:libstdc++:...` and `uprobe:libc:malloc`
//! find `/lib/x86_64-linux-gnu/libstdc++.so.6` and `libc.so.6` without a
//! path, as bpftrace does.
//!
//! The file is glibc's "new" format (`glibc-ld.so.cache1.1`, the only one
//! glibc writes since 2.32): a 48-byte header (magic and version, the entry
//! count, the string table's length, flags, the extension offset), then one
//! 24-byte entry per library (flags, offsets of its soname and path in the
//! file, OS version, hwcaps). Flags name the library's ABI, so a 32-bit
//! library of the same name is not taken for the host's.

use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const HEADER: usize = 48;
const ENTRY: usize = 24;

/// `FLAG_ELF_LIBC6` with the architecture's `FLAG_*_LIB64` (glibc's
/// sysdeps/generic/ldconfig.h): the flags of a 64-bit library of the host.
#[cfg(target_arch = "x86_64")]
const HOST_FLAGS: i32 = 0x0303;
#[cfg(target_arch = "aarch64")]
const HOST_FLAGS: i32 = 0x0a03;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const HOST_FLAGS: i32 = -1;

/// One library of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedLibrary {
    pub soname: String,
    pub path: PathBuf,
    pub flags: i32,
}

/// Every entry of a cache file's bytes; empty for anything that is not
/// the new format (an old-format or damaged file names nothing).
pub fn parse(bytes: &[u8]) -> Vec<CachedLibrary> {
    if !bytes.starts_with(MAGIC) || bytes.len() < HEADER {
        return Vec::new();
    }
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let string_at = |at: u32| -> Option<String> {
        let rest = bytes.get(at as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    let count = u32_at(20).unwrap_or(0) as usize;
    // Every entry must fit in the file: a damaged count reads nothing past it.
    let count = count.min(bytes.len().saturating_sub(HEADER) / ENTRY);
    (0..count)
        .filter_map(|i| {
            let at = HEADER + i * ENTRY;
            let flags = u32_at(at)? as i32;
            Some(CachedLibrary {
                soname: string_at(u32_at(at + 4)?)?,
                path: PathBuf::from(string_at(u32_at(at + 8)?)?),
                flags,
            })
        })
        .collect()
}

/// The host library `name` names in `/etc/ld.so.cache`: its soname
/// exactly (`libc.so.6`), else the first whose soname is `name` followed
/// by a `.` or `-` (`libc` → `libc.so.6`, `libstdc++` → `libstdc++.so.6`).
pub fn lookup(name: &str) -> Option<PathBuf> {
    lookup_in(Path::new("/etc/ld.so.cache"), name)
}

pub fn lookup_in(cache: &Path, name: &str) -> Option<PathBuf> {
    // A few hundred kilobytes on a full system; refuse anything absurd.
    let metadata = std::fs::metadata(cache).ok()?;
    if metadata.len() > 64 << 20 {
        return None;
    }
    let libraries = parse(&std::fs::read(cache).ok()?);
    let host: Vec<&CachedLibrary> = libraries.iter().filter(|l| l.flags == HOST_FLAGS).collect();
    host.iter()
        .find(|l| l.soname == name)
        .or_else(|| {
            host.iter().find(|l| {
                l.soname
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(['.', '-']))
            })
        })
        .map(|l| l.path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machines_cache_agrees_with_ldconfig() {
        // Debian (this project's machines) always has both.
        let bytes = std::fs::read("/etc/ld.so.cache").expect("/etc/ld.so.cache");
        let ours = parse(&bytes);
        let output = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .expect("running ldconfig -p");
        let text = String::from_utf8_lossy(&output.stdout);
        // "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"
        let theirs: Vec<(String, String)> = text
            .lines()
            .skip(1)
            .filter_map(|l| {
                let (soname, rest) = l.trim().split_once(' ')?;
                let (_, path) = rest.split_once(" => ")?;
                Some((soname.to_string(), path.to_string()))
            })
            .collect();
        assert!(!theirs.is_empty());
        let ours: Vec<(String, String)> = ours
            .iter()
            .map(|l| (l.soname.clone(), l.path.display().to_string()))
            .collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn names_resolve_by_soname_then_prefix() {
        let libc = lookup("libc").expect("libc in /etc/ld.so.cache");
        assert!(libc.to_string_lossy().contains("libc.so"), "{libc:?}");
        assert_eq!(lookup("libc.so.6"), Some(libc));
        assert_eq!(lookup("libnosuchlibrary"), None);
    }

    #[test]
    fn damaged_files_name_nothing() {
        assert!(parse(b"").is_empty());
        assert!(parse(b"ld.so-1.7.0\0garbage").is_empty());
        let mut header = MAGIC.to_vec();
        header.resize(HEADER, 0);
        header[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        // A count far beyond the file: no entry read past its end.
        assert!(parse(&header).is_empty());
        header.extend_from_slice(&[0x03, 0x03, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0]);
        header.extend_from_slice(&[0; 12]);
        assert!(parse(&header).is_empty());
    }
}

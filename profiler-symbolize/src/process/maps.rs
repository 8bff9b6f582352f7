//! `/proc/PID/maps` parsing.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// Device (major, minor) and inode of the file; (0, 0) and 0 when anonymous.
    pub dev: (u32, u32),
    pub inode: u64,
    pub backing: Backing,
}

/// What backs a mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// A file, by the path the process sees.
    File(PathBuf),
    /// A file that was deleted (or replaced) after it was mapped; the path
    /// is without the ` (deleted)` suffix. Still readable through
    /// `/proc/PID/map_files`.
    Deleted(PathBuf),
    /// Anonymous memory (JIT code, for instance).
    Anonymous,
    /// A kernel-provided region such as `[vdso]`, `[heap]` or `[stack]`.
    Special(String),
}

impl MapEntry {
    /// The name people know this mapping by: the file's base name, or the
    /// special name, or `[anon]`.
    pub fn display_name(&self) -> String {
        match &self.backing {
            Backing::File(path) | Backing::Deleted(path) => path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            Backing::Anonymous => "[anon]".to_string(),
            Backing::Special(name) => name.clone(),
        }
    }

    pub fn contains(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }
}

/// Parses the text of `/proc/PID/maps`. Lines that do not parse are
/// skipped: the kernel's format is stable, so a bad line means a
/// truncated read, not a new format.
///
/// Bytes, not a `str`: a path is whatever bytes the file was named with
/// (the kernel escapes only the newline), and one name that is not UTF-8
/// must not cost the whole process its mappings.
pub fn parse_maps(text: impl AsRef<[u8]>) -> Vec<MapEntry> {
    lines(text.as_ref()).filter_map(parse_line).collect()
}

/// The executable lines of `/proc/PID/maps` only, parsed. The others
/// (data, heap, stacks: two thirds of a typical process's lines) are
/// passed over before their paths are copied.
pub fn parse_executable_maps(text: &[u8]) -> impl Iterator<Item = MapEntry> + '_ {
    lines(text)
        .filter(|line| perms_of(line).is_some_and(|perms| perms.get(2) == Some(&b'x')))
        .filter_map(parse_line)
}

fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|&b| b == b'\n').filter(|line| !line.is_empty())
}

/// The second field of a maps line (its permissions).
fn perms_of(line: &[u8]) -> Option<&[u8]> {
    line.split(|&b| b == b' ').filter(|f| !f.is_empty()).nth(1)
}

fn parse_line(line: &[u8]) -> Option<MapEntry> {
    // address perms offset dev inode [path]; the path may contain spaces.
    let mut rest = line;
    let mut field = || {
        rest = rest.trim_ascii_start();
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (head, tail) = rest.split_at(end);
        rest = tail;
        head
    };
    let range = field();
    let perms = field();
    let offset = field();
    let dev = field();
    let inode = field();
    let path = rest.trim_ascii();
    // The fixed fields are ASCII; a line whose are not is garbage.
    fn text(bytes: &[u8]) -> Option<&str> {
        std::str::from_utf8(bytes).ok()
    }
    let hex = |bytes: &[u8]| u64::from_str_radix(text(bytes)?, 16).ok();

    let (start, end) = text(range)?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if perms.len() < 4 {
        return None;
    }
    let offset = hex(offset)?;
    let (major, minor) = text(dev)?.split_once(':')?;
    let dev = (
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    let inode: u64 = text(inode)?.parse().ok()?;

    let file = |bytes: &[u8]| PathBuf::from(OsStr::from_bytes(bytes));
    let name = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let backing = if path.is_empty() {
        Backing::Anonymous
    } else if path.starts_with(b"[") {
        Backing::Special(name(path))
    } else if let Some(deleted) = path.strip_suffix(b" (deleted)") {
        Backing::Deleted(file(deleted))
    } else if inode == 0 && !path.starts_with(b"/") {
        // e.g. "anon_inode:..." or "/memfd:..." variants without an inode.
        Backing::Special(name(path))
    } else {
        Backing::File(file(path))
    };
    Some(MapEntry {
        start,
        end,
        readable: perms[0] == b'r',
        writable: perms[1] == b'w',
        executable: perms[2] == b'x',
        offset,
        dev,
        inode,
        backing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c6a00000-55d0c6a02000 r--p 00000000 fe:01 1311207                    /usr/bin/cat
55d0c6a02000-55d0c6a07000 r-xp 00002000 fe:01 1311207                    /usr/bin/cat
55d0c7b9e000-55d0c7bbf000 rw-p 00000000 00:00 0                          [heap]
7f1c2a000000-7f1c2a021000 rwxp 00000000 00:00 0 
7f1c2b028000-7f1c2b1bd000 r-xp 00028000 fe:01 1316190                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b300000-7f1c2b301000 r-xp 00001000 00:2d 42                         /tmp/my lib.so (deleted)
7ffd1c5f0000-7ffd1c5f2000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_files_specials_anonymous_and_deleted() {
        let maps = parse_maps(SAMPLE);
        assert_eq!(maps.len(), 8);

        let text = &maps[1];
        assert_eq!((text.start, text.end), (0x55d0c6a02000, 0x55d0c6a07000));
        assert!(text.readable && text.executable && !text.writable);
        assert_eq!(text.offset, 0x2000);
        assert_eq!(text.dev, (0xfe, 0x01));
        assert_eq!(text.inode, 1311207);
        assert_eq!(text.backing, Backing::File("/usr/bin/cat".into()));
        assert_eq!(text.display_name(), "cat");

        assert_eq!(maps[2].backing, Backing::Special("[heap]".into()));
        // An anonymous executable mapping (a JIT's code): trailing space, no path.
        assert_eq!(maps[3].backing, Backing::Anonymous);
        assert!(maps[3].executable && maps[3].writable);
        assert_eq!(maps[3].display_name(), "[anon]");

        assert_eq!(maps[4].offset, 0x28000);
        // A deleted file whose name has a space in it.
        assert_eq!(maps[5].backing, Backing::Deleted("/tmp/my lib.so".into()));
        assert_eq!(maps[5].dev, (0, 0x2d));
        assert_eq!(maps[5].display_name(), "my lib.so");
        assert_eq!(maps[6].backing, Backing::Special("[vdso]".into()));
        assert_eq!(maps[7].start, 0xffffffffff600000);
        assert!(maps[7].contains(0xffffffffff600010));
        assert!(!maps[7].contains(0xffffffffff601000));
    }

    /// A path that is not UTF-8 is kept byte for byte, and the lines
    /// around it parse: a file named so costs nothing else.
    #[test]
    fn a_path_that_is_not_utf8_is_kept_as_bytes() {
        let mut text = SAMPLE.as_bytes().to_vec();
        text.extend_from_slice(b"7f00-7f01 r-xp 00000000 fe:01 9 /tmp/\xff\xfeodd.so\n");
        let maps = parse_maps(&text);
        assert_eq!(maps.len(), 9);
        assert_eq!(
            maps[8].backing,
            Backing::File(PathBuf::from(OsStr::from_bytes(b"/tmp/\xff\xfeodd.so")))
        );
        assert_eq!(maps[0].backing, Backing::File("/usr/bin/cat".into()));
    }

    /// The executable lines only, parsed as `parse_maps` parses them.
    #[test]
    fn executable_lines_alone() {
        let all: Vec<MapEntry> = parse_maps(SAMPLE)
            .into_iter()
            .filter(|e| e.executable)
            .collect();
        let executable: Vec<MapEntry> = parse_executable_maps(SAMPLE.as_bytes()).collect();
        assert_eq!(executable, all);
        assert_eq!(executable.len(), 6);
    }

    #[test]
    fn skips_garbage_lines() {
        let maps = parse_maps("not a maps line\n\n0-1 r-xp zz 00:00 0\n");
        assert!(maps.is_empty());
    }
}

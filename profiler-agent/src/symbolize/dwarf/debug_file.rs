//! Finding separate debug files, as gdb does: by GNU build id under
//! `/usr/lib/debug/.build-id/xx/rest.debug`, then by `.gnu_debuglink`
//! (name + CRC32) next to the binary, in its `.debug/` folder, and under
//! `/usr/lib/debug/<binary's directory>`. Paths are searched inside the
//! root the binary was found in (a container's `/proc/PID/root`).

use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

/// The separate debug file for the object `file` at `path` (as its process
/// sees it) below `root`, if one exists and matches.
pub fn find_debug_file(file: &object::File<'_>, root: &Path, path: &Path) -> Option<PathBuf> {
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    if let Ok(Some(id)) = file.build_id()
        && id.len() >= 2
    {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let candidate = inside(
            &Path::new("/usr/lib/debug/.build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..])),
        );
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    let (name, crc) = debuglink(file)?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(&name),
        dir.join(".debug").join(&name),
        Path::new("/usr/lib/debug")
            .join(dir.strip_prefix("/").unwrap_or(dir))
            .join(&name),
    ];
    candidates
        .iter()
        .map(|c| inside(c))
        // The debuglink names a file; do not pick the binary itself.
        .filter(|c| c.as_path() != inside(path).as_path())
        .find(|c| std::fs::read(c).is_ok_and(|bytes| crc32(&bytes) == crc))
}

/// `.gnu_debuglink`: a NUL-terminated file name, padding to 4 bytes, then
/// the CRC32 of the debug file.
fn debuglink(file: &object::File<'_>) -> Option<(String, u32)> {
    let data = file.section_by_name(".gnu_debuglink")?.data().ok()?;
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?.to_string();
    let crc_at = (end + 1).next_multiple_of(4);
    let crc = data.get(crc_at..crc_at + 4)?;
    let crc = if file.is_little_endian() {
        u32::from_le_bytes(crc.try_into().ok()?)
    } else {
        u32::from_be_bytes(crc.try_into().ok()?)
    };
    (!name.is_empty() && !name.contains('/')).then_some((name, crc))
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    crc.sum()
}

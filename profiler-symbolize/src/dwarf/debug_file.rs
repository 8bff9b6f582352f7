//! Finding separate debug files, as gdb does: by GNU build id under
//! `/usr/lib/debug/.build-id/xx/rest.debug`, then by `.gnu_debuglink`
//! (name + CRC32) next to the binary, in its `.debug/` folder, and under
//! `/usr/lib/debug/<binary's directory>`. Paths are resolved inside the
//! root the binary was found in (a container's `/proc/PID/root`: see
//! `process::contained`, which also refuses anything but regular files of
//! bounded size), and a debuglink's CRC is computed streaming, over at most
//! `MAX_CRC_BYTES`.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

use crate::process::{ObjectFile, contained};

/// Largest debuglink candidate whose CRC is computed (a debug file larger
/// than this is not used; a sparse terabyte named by a hostile binary costs
/// nothing).
const MAX_CRC_BYTES: u64 = 4 << 30;

/// The separate debug file for the object `file`, mapped from `object`,
/// if one exists inside the root its process sees and matches: its path
/// (for messages) and the open file. The root held open in `object` is
/// used when there is one (it outlives the process).
pub fn find_debug_file(file: &object::File<'_>, object: &ObjectFile) -> Option<(PathBuf, File)> {
    if let Some(found) = find_by_build_id(file, object) {
        return Some(found);
    }
    let (root, path) = (&object.root, &object.path);
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let open = |p: &Path| match &object.root_dir {
        Some(dir) => contained::open_in(dir, p),
        None => contained::open(&inside(p)),
    };
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
        // The debuglink names a file; do not pick the binary itself.
        .filter(|c| c.as_path() != path.as_path())
        .find_map(|c| {
            let mut opened = open(c).ok()?;
            let size = opened.metadata().ok()?.len();
            if size > MAX_CRC_BYTES || crc32_of(&mut opened)? != crc {
                return None;
            }
            // The CRC read moved the file position; mappings ignore it.
            Some((inside(c), opened))
        })
}

/// The debug file under `/usr/lib/debug/.build-id/` for `file`'s GNU build
/// id, inside its root: one open, no read (cheap enough for the thread
/// that drains samples).
pub fn find_by_build_id(file: &object::File<'_>, object: &ObjectFile) -> Option<(PathBuf, File)> {
    let id = file.build_id().ok().flatten().filter(|id| id.len() >= 2)?;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let candidate = Path::new("/usr/lib/debug/.build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    let opened = match &object.root_dir {
        Some(dir) => contained::open_in(dir, &candidate),
        None => contained::open(
            &object
                .root
                .join(candidate.strip_prefix("/").unwrap_or(&candidate)),
        ),
    }
    .ok()?;
    Some((
        object
            .root
            .join(candidate.strip_prefix("/").unwrap_or(&candidate)),
        opened,
    ))
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

/// CRC32 of a whole file, read in 1 MiB pieces (never held whole).
fn crc32_of(file: &mut File) -> Option<u32> {
    let mut crc = flate2::Crc::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Some(crc.sum()),
            Ok(n) => crc.update(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

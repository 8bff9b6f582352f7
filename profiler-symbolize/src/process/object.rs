//! Object files (executables and shared libraries) mapped by processes.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::contained::Root;
use super::maps::MapEntry;

/// Identity of a mapped file within one run: the device and inode the
/// kernel reports in `/proc/PID/maps`. Two processes mapping the same
/// library share one `ObjectFile`, so it is read and parsed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectId {
    pub dev: (u32, u32),
    pub inode: u64,
}

/// A mapped file, opened when first seen.
#[derive(Debug)]
pub struct ObjectFile {
    pub id: ObjectId,
    /// The path as the mapping process sees it.
    pub path: PathBuf,
    /// The process's root directory (`/proc/PID/root`): where `path`, and
    /// separate debug files, are found.
    pub root: PathBuf,
    /// That root held open (a directory fd), so debug files can still be
    /// found inside it once the process has exited (symbolization happens
    /// after the run, or at the end of a window).
    pub root_dir: Option<Arc<Root>>,
    /// The open file, or why it could not be opened.
    pub file: Result<File, String>,
    /// Whether the file is a Go binary, once a runtime reader has looked
    /// (an ELF parse): here, beside the file, because every process that
    /// maps the same file shares this object, and with it the answer.
    pub go_binary: OnceLock<bool>,
}

impl ObjectFile {
    /// Opens a file given by path on this machine (`symbolize --binary`).
    pub fn open_path(path: &Path) -> std::io::Result<Self> {
        let file = super::contained::open(path)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let meta = file.metadata()?;
        let dev = meta.dev();
        Ok(ObjectFile {
            id: ObjectId {
                // The kernel's dev_t encoding (major 12 bits, minor 20).
                dev: (
                    ((dev >> 8) & 0xfff) as u32,
                    ((dev & 0xff) | ((dev >> 12) & 0xfff00)) as u32,
                ),
                inode: meta.ino(),
            },
            path: path.to_path_buf(),
            root: PathBuf::from("/"),
            root_dir: Root::open(Path::new("/")).ok().map(Arc::new),
            file: Ok(file),
            go_binary: OnceLock::new(),
        })
    }

    /// Opens the file behind `entry` of the process at `proc_dir`: first
    /// through the process's root (`/proc/PID/root/PATH`, resolved inside
    /// that root: see `contained`), checked against the inode in the maps
    /// line; else through `/proc/PID/map_files/START-END`, the kernel's link
    /// to the mapped file itself, which also reaches deleted files.
    pub(super) fn open(
        proc_dir: &Path,
        root_dir: Option<Arc<Root>>,
        entry: &MapEntry,
        path: &Path,
        id: ObjectId,
    ) -> Self {
        let root = proc_dir.join("root");
        let via_root = root.join(path.strip_prefix("/").unwrap_or(path));
        let via_map_files = proc_dir
            .join("map_files")
            .join(format!("{:x}-{:x}", entry.start, entry.end));
        let mut errors = Vec::new();
        let opened = super::contained::open(&via_root).map_err(|e| e.to_string());
        match opened.and_then(|file| Ok((file.metadata().map_err(|e| e.to_string())?.ino(), file)))
        {
            Ok((inode, file)) if inode == id.inode => {
                return ObjectFile {
                    id,
                    path: path.to_path_buf(),
                    root,
                    root_dir,
                    file: Ok(file),
                    go_binary: OnceLock::new(),
                };
            }
            Ok(_) => errors.push(format!(
                "{}: a different file (replaced since it was mapped)",
                via_root.display()
            )),
            Err(e) => errors.push(e),
        }
        // map_files is the mapped file itself, whatever its path says now
        // (overlay filesystems may report another inode through the path).
        match super::contained::open(&via_map_files) {
            Ok(file) => {
                return ObjectFile {
                    id,
                    path: path.to_path_buf(),
                    root,
                    root_dir,
                    file: Ok(file),
                    go_binary: OnceLock::new(),
                };
            }
            Err(e) => errors.push(e.to_string()),
        }
        ObjectFile {
            id,
            path: path.to_path_buf(),
            root,
            root_dir,
            file: Err(errors.join("; ")),
            go_binary: OnceLock::new(),
        }
    }
}

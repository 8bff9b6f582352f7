//! Opening files on behalf of a process, inside that process's root.
//!
//! A container controls every file its processes map: binaries, libraries,
//! their debug files, perf maps, and the symlinks, FIFOs and sparse files
//! among them. The agent is privileged, so a path it opens must never lead
//! out of the container's root, block, or make it read without bound:
//!
//! - The path is resolved by the kernel *inside* the root: `openat2` with
//!   `RESOLVE_IN_ROOT` on a directory fd of `/proc/PID/root` treats `/` and
//!   `..` as that root and resolves absolute symlinks against it (a plain
//!   `open("/proc/PID/root/...")` resolves an absolute symlink against the
//!   agent's own root: CWE-59). `RESOLVE_NO_MAGICLINKS` refuses
//!   `/proc/*/fd`-style links. Where `openat2` is missing (Linux < 5.6, or a
//!   seccomp profile that refuses it), the path is walked component by
//!   component with `O_NOFOLLOW`, symlinks resolved by hand and clamped to
//!   the root the same way.
//! - `O_NONBLOCK`, so a FIFO cannot hang the open; then `fstat` must say a
//!   regular file, no larger than the caller's cap.
//!
//! Callers map what they open rather than read it whole.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Most bytes of any file the agent maps for a process: a binary or a debug
/// file beyond this is not read (the largest real debug files, Chromium's,
/// are a few GiB; a sparse terabyte is an attack).
pub const MAX_FILE_BYTES: u64 = 8 << 30;

/// Symlinks followed in one path by the fallback walk (the kernel's limit
/// is 40 as well).
const MAX_SYMLINKS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum ContainedError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a regular file ({kind}); refused")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: {size} bytes, more than the {max} the agent reads; refused")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path}: more than {MAX_SYMLINKS} symlinks; refused")]
    TooManyLinks { path: PathBuf },
}

impl ContainedError {
    /// The file is not there (nothing to report).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ContainedError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// Refused for what the file is (not a failure to find it): counted and
    /// named once in the log.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, ContainedError::Io { .. })
            || matches!(self, ContainedError::Io { source, .. }
                if source.raw_os_error() == Some(libc::ELOOP)
                    || source.raw_os_error() == Some(libc::EXDEV))
    }
}

/// Files refused (not a regular file, too large, a link out of bounds)
/// since the agent started, for `/metrics`.
pub static REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Paths already named in the log as refused (each once; bounded).
static LOGGED: std::sync::Mutex<Option<std::collections::HashSet<PathBuf>>> =
    std::sync::Mutex::new(None);

fn note_refusal(error: &ContainedError) {
    if !error.is_refusal() {
        return;
    }
    REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = match error {
        ContainedError::Io { path, .. }
        | ContainedError::NotRegular { path, .. }
        | ContainedError::TooLarge { path, .. }
        | ContainedError::TooManyLinks { path } => path.clone(),
    };
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    let logged = logged.get_or_insert_with(Default::default);
    if logged.len() < 1024 && logged.insert(path) {
        tracing::warn!("refused to read a file for a process: {error}");
    }
}

/// Opens `path` for the agent to read on behalf of a process: a path under
/// `/proc/PID/root/` is resolved inside that process's root; any other
/// (`/proc/PID/map_files/...`, the kernel's link to a mapped file, or a
/// file of this machine the user named) is opened as it is. Either way only
/// a regular file of at most `MAX_FILE_BYTES`, without blocking. Refusals
/// are counted and named once in the log.
pub fn open(path: &Path) -> Result<File, ContainedError> {
    let result = match split_proc_root(path) {
        Some((root, inside)) => {
            Root::open(&root).and_then(|root| root.open_file(&inside, MAX_FILE_BYTES))
        }
        None => {
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
                .open(path)
                .map_err(|source| ContainedError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            opened.and_then(|file| check_regular(file, path, MAX_FILE_BYTES))
        }
    };
    if let Err(error) = &result {
        note_refusal(error);
    }
    result
}

/// Opens `path` (as the process sees it) inside a root held open, like
/// `open` does for `/proc/PID/root/...` paths; works after the process has
/// exited, as long as its root exists.
pub fn open_in(root: &Root, path: &Path) -> Result<File, ContainedError> {
    let result = root.open_file(path, MAX_FILE_BYTES);
    if let Err(error) = &result {
        note_refusal(error);
    }
    result
}

/// `open`, then the file mapped read-only (not read whole).
pub fn map(path: &Path) -> Result<memmap2::Mmap, ContainedError> {
    let file = open(path)?;
    // SAFETY: a read-only private mapping of a regular file we only read;
    // if the file is truncated underneath us, reads fault (the risk every
    // profiler reading live binaries takes).
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ContainedError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `/proc/PID/root/REST` as (`/proc/PID/root`, `/REST`).
fn split_proc_root(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return None;
    }
    let proc_dir = components.next()?;
    let pid = components.next()?;
    let root = components.next()?;
    if proc_dir.as_os_str() != "proc"
        || root.as_os_str() != "root"
        || !pid
            .as_os_str()
            .to_str()?
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let root_dir = Path::new("/proc").join(pid.as_os_str()).join("root");
    Some((root_dir, Path::new("/").join(components.as_path())))
}

/// A process's root directory, held open: paths are resolved inside it.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    /// For messages: `/proc/PID/root`, or `/`.
    shown: PathBuf,
}

impl Root {
    /// Opens `dir` (normally `/proc/PID/root`, a link the kernel resolves
    /// to the process's root as it sees it) as the root for later opens.
    pub fn open(dir: &Path) -> Result<Root, ContainedError> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ContainedError::Io {
            path: dir.to_path_buf(),
            source: e.into(),
        })?;
        Ok(Root {
            dir: fd,
            shown: dir.to_path_buf(),
        })
    }

    /// Opens `path` (as the process sees it) for reading, resolved inside
    /// this root, and checks it is a regular file of at most `max_bytes`.
    pub fn open_file(&self, path: &Path, max_bytes: u64) -> Result<File, ContainedError> {
        let shown = self.shown.join(path.strip_prefix("/").unwrap_or(path));
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let fd = match rustix::fs::openat2(
            &self.dir,
            path,
            flags,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            // openat2 missing (old kernel) or refused by a seccomp filter.
            Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
                self.walk(path, flags, &shown)?
            }
            Err(e) => {
                return Err(ContainedError::Io {
                    path: shown,
                    source: e.into(),
                });
            }
        };
        check_regular(File::from(fd), &shown, max_bytes)
    }

    /// Whether `path` names a regular file inside this root.
    pub fn is_file(&self, path: &Path) -> bool {
        self.open_file(path, u64::MAX).is_ok()
    }

    /// The fallback of `open_file`: one component at a time, never
    /// following a link in the kernel; a symlink's target is spliced into
    /// the rest of the path (absolute ones from the root), and `..` never
    /// goes above the root.
    fn walk(&self, path: &Path, flags: OFlags, shown: &Path) -> Result<OwnedFd, ContainedError> {
        let io = |e: rustix::io::Errno| ContainedError::Io {
            path: shown.to_path_buf(),
            source: e.into(),
        };
        // Components still to resolve, in order; directories resolved so far.
        let mut todo: Vec<PathBuf> = components(path);
        todo.reverse();
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut links = 0;
        while let Some(name) = todo.pop() {
            let parent = stack.last().map_or(self.dir.as_fd(), |d| d.as_fd());
            if name.as_os_str() == ".." {
                stack.pop();
                continue;
            }
            let last = todo.is_empty();
            let open_flags = if last {
                flags | OFlags::NOFOLLOW
            } else {
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
            };
            match rustix::fs::openat(parent, &name, open_flags, Mode::empty()) {
                Ok(fd) if last => return Ok(fd),
                Ok(fd) => stack.push(fd),
                // ELOOP (a symlink at the end with O_NOFOLLOW), ENOTDIR (a
                // symlink in the middle opened with O_DIRECTORY|O_NOFOLLOW):
                // read it and splice its target in.
                Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => {
                    let target = rustix::fs::readlinkat(parent, &name, Vec::new()).map_err(io)?;
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(ContainedError::TooManyLinks {
                            path: shown.to_path_buf(),
                        });
                    }
                    let target = {
                        use std::os::unix::ffi::OsStrExt;
                        PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()))
                    };
                    if target.is_absolute() {
                        stack.clear();
                    }
                    let mut spliced = components(&target);
                    spliced.reverse();
                    todo.extend(spliced);
                }
                Err(e) => return Err(io(e)),
            }
        }
        Err(ContainedError::Io {
            path: shown.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::IsADirectory),
        })
    }
}

/// The normal components of `path`, `..` kept, `/` and `.` dropped.
fn components(path: &Path) -> Vec<PathBuf> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(PathBuf::from(name)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect()
}

/// Checks that `file` is a regular file of at most `max_bytes`.
pub fn check_regular(file: File, shown: &Path, max_bytes: u64) -> Result<File, ContainedError> {
    let meta = file.metadata().map_err(|source| ContainedError::Io {
        path: shown.to_path_buf(),
        source,
    })?;
    let kind = meta.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let kind = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(ContainedError::NotRegular {
            path: shown.to_path_buf(),
            kind,
        });
    }
    if meta.len() > max_bytes {
        return Err(ContainedError::TooLarge {
            path: shown.to_path_buf(),
            size: meta.len(),
            max: max_bytes,
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake container root with a host file outside it.
    fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let host = dir.path().join("host-secret");
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::write(&host, b"host only").unwrap();
        std::fs::write(root.join("usr/lib/libreal.so"), b"inside").unwrap();
        // Relative and absolute links that stay inside.
        symlink("libreal.so", root.join("usr/lib/librel.so")).unwrap();
        symlink("/usr/lib/libreal.so", root.join("usr/lib/libabs.so")).unwrap();
        // Links that would leave the root if resolved on the host.
        symlink(&host, root.join("usr/lib/escape-abs")).unwrap();
        symlink("../../../host-secret", root.join("usr/lib/escape-dotdot")).unwrap();
        symlink("/dev/zero", root.join("usr/lib/zero")).unwrap();
        (dir, root, host)
    }

    fn read(root: &Root, path: &str) -> Result<String, ContainedError> {
        let file = root.open_file(Path::new(path), 1 << 20)?;
        Ok(std::io::read_to_string(file).unwrap())
    }

    fn check(root: &Root) {
        assert_eq!(read(root, "/usr/lib/libreal.so").unwrap(), "inside");
        assert_eq!(read(root, "/usr/lib/librel.so").unwrap(), "inside");
        assert_eq!(read(root, "/usr/lib/libabs.so").unwrap(), "inside");
        // Absolute links and .. resolve inside the root: the host file
        // is never read.
        for escape in [
            "/usr/lib/escape-abs",
            "/usr/lib/escape-dotdot",
            "/../host-secret",
        ] {
            let result = read(root, escape);
            assert!(
                result.as_deref().map_or(true, |text| text != "host only"),
                "{escape} read the host's file"
            );
        }
        // /dev/zero inside the root does not exist here; the host's would
        // not be a regular file anyway.
        assert!(read(root, "/usr/lib/zero").is_err());
    }

    #[test]
    fn proc_root_paths_are_split_at_the_root() {
        assert_eq!(
            split_proc_root(Path::new("/proc/42/root/usr/lib/libc.so.6")),
            Some((
                PathBuf::from("/proc/42/root"),
                PathBuf::from("/usr/lib/libc.so.6")
            ))
        );
        assert_eq!(split_proc_root(Path::new("/proc/42/map_files/1-2")), None);
        assert_eq!(split_proc_root(Path::new("/proc/self/root/x")), None);
        assert_eq!(split_proc_root(Path::new("/usr/lib/x")), None);
    }

    #[test]
    fn paths_resolve_inside_the_root() {
        let (_dir, root_path, _host) = fixture();
        check(&Root::open(&root_path).unwrap());
    }

    #[test]
    fn the_fallback_walk_resolves_inside_the_root_too() {
        let (_dir, root_path, _host) = fixture();
        let root = Root::open(&root_path).unwrap();
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
        for (path, expected) in [
            ("/usr/lib/libreal.so", Some("inside")),
            ("/usr/lib/librel.so", Some("inside")),
            ("/usr/lib/libabs.so", Some("inside")),
            ("/usr/lib/escape-abs", None),
            ("/usr/lib/escape-dotdot", None),
            ("/../../host-secret", None),
        ] {
            let got = root
                .walk(Path::new(path), flags, Path::new(path))
                .ok()
                .map(|fd| std::io::read_to_string(File::from(fd)).unwrap());
            assert_eq!(got.as_deref(), expected, "{path}");
        }
    }

    #[test]
    fn fifos_devices_and_big_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let big = dir.path().join("sparse");
        File::create(&big).unwrap().set_len(1 << 40).unwrap();
        let root = Root::open(Path::new("/")).unwrap();
        let err = root.open_file(&fifo, 1 << 20).unwrap_err();
        assert!(
            matches!(err, ContainedError::NotRegular { kind: "a FIFO", .. }),
            "{err}"
        );
        let err = root.open_file(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(matches!(err, ContainedError::NotRegular { .. }), "{err}");
        let err = root.open_file(&big, 1 << 30).unwrap_err();
        assert!(matches!(err, ContainedError::TooLarge { .. }), "{err}");
        assert!(err.is_refusal());
    }
}

//! The object files a running process maps (its executable and shared
//! libraries), where USDT probes of that process live, opened the way the
//! rest of the agent opens them: through `/proc/PID/root` so a process in
//! another mount namespace (a container) gets its own files, and through
//! `/proc/PID/map_files` for files deleted since they were mapped.

use std::path::{Path, PathBuf};

use profiler_symbolize::process::{Backing, parse_maps};

/// One object file mapped executable by a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedObject {
    /// The path as the process sees it.
    pub path: PathBuf,
    /// Where this machine reads it: `/proc/PID/root/PATH`, or
    /// `/proc/PID/map_files/START-END` when the file was deleted.
    pub open_path: PathBuf,
    pub deleted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("no process with pid {pid} (is it still running?)")]
    NoProcess { pid: u32 },
    #[error("cannot read {path}: {reason} (run as root, or as the process's user)")]
    Maps { path: PathBuf, reason: String },
}

/// Every file the process `pid` maps with execute permission, once each
/// (by device and inode), in address order: the executable first.
/// `proc_root` is `/proc` (a parameter for tests).
pub fn mapped_objects(proc_root: &Path, pid: u32) -> Result<Vec<MappedObject>, TargetError> {
    let proc_dir = proc_root.join(pid.to_string());
    if !proc_dir.exists() {
        return Err(TargetError::NoProcess { pid });
    }
    let maps_path = proc_dir.join("maps");
    // Bytes: a path need not be UTF-8.
    let text = std::fs::read(&maps_path).map_err(|error| TargetError::Maps {
        path: maps_path.clone(),
        reason: error.to_string(),
    })?;
    let mut seen = std::collections::HashSet::new();
    let mut objects = Vec::new();
    for entry in parse_maps(&text) {
        if !entry.executable || !seen.insert((entry.dev, entry.inode)) {
            continue;
        }
        let (path, open_path, deleted) = match &entry.backing {
            Backing::File(path) => (
                path.clone(),
                proc_dir
                    .join("root")
                    .join(path.strip_prefix("/").unwrap_or(path)),
                false,
            ),
            Backing::Deleted(path) => (
                path.clone(),
                proc_dir
                    .join("map_files")
                    .join(format!("{:x}-{:x}", entry.start, entry.end)),
                true,
            ),
            Backing::Anonymous | Backing::Special(_) => continue,
        };
        objects.push(MappedObject {
            path,
            open_path,
            deleted,
        });
    }
    Ok(objects)
}

/// Finds a mapped object by a bare name as a probe spec may give it: the
/// exact file name (`libc.so.6`), or the name followed by a version or
/// suffix (`libpython3.11` finds `libpython3.11.so.1.0`, `libc` finds
/// `libc.so.6`).
pub fn find_by_name<'a>(objects: &'a [MappedObject], name: &str) -> Option<&'a MappedObject> {
    let file_name = |o: &MappedObject| {
        o.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    objects.iter().find(|o| file_name(o) == name).or_else(|| {
        objects.iter().find(|o| {
            file_name(o)
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['.', '-']))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(maps: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("77")).unwrap();
        std::fs::write(dir.path().join("77/maps"), maps).unwrap();
        dir
    }

    #[test]
    fn executable_file_mappings_once_each() {
        let proc = fake_proc(
            "00400000-00401000 r--p 00000000 08:01 100 /usr/bin/python3.11\n\
             00401000-00800000 r-xp 00001000 08:01 100 /usr/bin/python3.11\n\
             00a00000-00a10000 rw-p 00600000 08:01 100 /usr/bin/python3.11\n\
             01000000-01100000 rw-p 00000000 00:00 0 [heap]\n\
             7f0000000000-7f0000100000 r-xp 00000000 08:01 200 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
             7f0000200000-7f0000300000 r--p 00000000 08:01 300 /usr/lib/locale/locale-archive\n\
             7f0000400000-7f0000500000 r-xp 00000000 08:01 400 /tmp/libgone.so (deleted)\n\
             7f0000600000-7f0000601000 rwxp 00000000 00:00 0 \n\
             7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0 [vdso]\n",
        );
        let objects = mapped_objects(proc.path(), 77).unwrap();
        let root = proc.path().join("77");
        assert_eq!(
            objects,
            vec![
                MappedObject {
                    path: "/usr/bin/python3.11".into(),
                    open_path: root.join("root/usr/bin/python3.11"),
                    deleted: false
                },
                MappedObject {
                    path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                    open_path: root.join("root/usr/lib/x86_64-linux-gnu/libc.so.6"),
                    deleted: false
                },
                MappedObject {
                    path: "/tmp/libgone.so".into(),
                    open_path: root.join("map_files/7f0000400000-7f0000500000"),
                    deleted: true
                },
            ]
        );
        assert_eq!(
            find_by_name(&objects, "libc").unwrap().path,
            Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert!(!find_by_name(&objects, "python3.11").unwrap().deleted);
        assert!(
            find_by_name(&objects, "python3")
                .unwrap()
                .path
                .ends_with("python3.11")
        );
        assert!(find_by_name(&objects, "libgo").is_none());
    }

    #[test]
    fn missing_process_is_named() {
        let proc = fake_proc("");
        assert_eq!(
            mapped_objects(proc.path(), 12345).unwrap_err().to_string(),
            "no process with pid 12345 (is it still running?)"
        );
    }

    #[test]
    fn this_process_maps_its_own_executable() {
        let objects = mapped_objects(Path::new("/proc"), std::process::id()).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(objects[0].path, exe);
        assert!(objects[0].open_path.exists());
    }
}

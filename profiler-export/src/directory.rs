//! A directory of pprof files, one per profile and service per window
//! (`cpu-<service>-<ms>.pb.gz`, `wall-<service>-<ms>.pb.gz`,
//! `memory-<service>-<ms>.pb.gz`, `probe_<name>-<service>-<ms>.pb.gz`),
//! with bounded retention: after
//! each write the oldest files go until at most `max_files` files and
//! `max_bytes` bytes remain.

use serde::Deserialize;

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::{Batch, ExportError, Exporter};

/// Files this exporter owns (retention never touches anything else):
/// `cpu-...` (the CPU profile), `wall-...` (its wall-clock view),
/// `memory-...` (Go heaps) and `probe_<name>-...` (a probe's stacks).
const PREFIXES: [&str; 4] = ["cpu-", "wall-", "memory-", "probe_"];
const SUFFIX: &str = ".pb.gz";

pub struct DirectoryExporter {
    dir: PathBuf,
    max_files: usize,
    max_bytes: u64,
}

impl DirectoryExporter {
    /// Creates `dir` if needed.
    pub fn new(dir: &Path, max_files: usize, max_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("creating the profile directory {}: {e}", dir.display()),
            )
        })?;
        Ok(DirectoryExporter {
            dir: dir.to_path_buf(),
            max_files,
            max_bytes,
        })
    }

    /// Deletes the oldest of our files until both bounds hold.
    fn enforce_retention(&self) -> std::io::Result<()> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(&self.dir)?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                (PREFIXES.iter().any(|p| name.starts_with(p)) && name.ends_with(SUFFIX))
                    .then(|| Some((name, entry.metadata().ok()?.len())))?
            })
            .collect();
        // Names carry the window's start time, zero-padded: name order is
        // age order.
        files.sort_by(|a, b| sort_key(&a.0).cmp(&sort_key(&b.0)));
        let mut total: u64 = files.iter().map(|(_, len)| len).sum();
        let mut count = files.len();
        for (name, len) in files {
            if count <= self.max_files && total <= self.max_bytes {
                break;
            }
            match std::fs::remove_file(self.dir.join(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            count -= 1;
            total -= len;
        }
        Ok(())
    }
}

/// `<profile>-<service>-<unix ms>.pb.gz` sorts by time, then profile and
/// service.
fn sort_key(name: &str) -> (&str, &str) {
    let stem = name.trim_end_matches(SUFFIX);
    match stem.rsplit_once('-') {
        Some((rest, ms)) => (ms, rest),
        None => ("", stem),
    }
}

/// A service name as a file-name component: no path separators, no dots
/// at the start, nothing a shell trips on.
fn file_component(service: &str) -> String {
    let cleaned: String = service
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cleaned = cleaned.trim_start_matches('.');
    if cleaned.is_empty() {
        "unknown".into()
    } else {
        cleaned.to_string()
    }
}

impl Exporter for DirectoryExporter {
    fn name(&self) -> &str {
        "directory"
    }

    fn export(&mut self, batch: &Batch) -> Result<(), ExportError> {
        let ms = batch
            .started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        for profile in &batch.profiles {
            let name = format!(
                "{}-{}-{ms:016}{SUFFIX}",
                file_component(&profile.name),
                file_component(&profile.service)
            );
            // Write then rename: a reader never sees half a file.
            let tmp = self.dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, profile.pprof.as_slice())
                .and_then(|()| std::fs::rename(&tmp, self.dir.join(&name)))
                .map_err(|e| {
                    let _ = std::fs::remove_file(&tmp);
                    std::io::Error::new(
                        e.kind(),
                        format!("writing {}: {e}", self.dir.join(&name).display()),
                    )
                })?;
        }
        self.enforce_retention()?;
        Ok(())
    }
}

/// Writes each window's profiles as files, oldest deleted first.
#[derive(serde::Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DirectoryConfig {
    /// Where to write; empty disables this exporter.
    pub path: PathBuf,
    /// Keep at most this many profile files...
    pub max_files: usize,
    /// ...and at most this many bytes of them.
    pub max_bytes: u64,
    /// Windows waiting to be written before the oldest is dropped.
    pub queue_size: usize,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            path: PathBuf::new(),
            max_files: 1000,
            max_bytes: 256 << 20,
            queue_size: 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::ServiceProfile;

    fn batch(at_ms: u64, services: &[&str], size: usize) -> Batch {
        let started = UNIX_EPOCH + Duration::from_millis(at_ms);
        Batch {
            started,
            ended: started + Duration::from_secs(15),
            profiles: services
                .iter()
                .map(|s| ServiceProfile {
                    name: crate::CPU_PROFILE.into(),
                    service: s.to_string(),
                    labels: Vec::new(),
                    pprof: Arc::new(vec![0u8; size]),
                    profile: Arc::default(),
                })
                .collect(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn one_file_per_service_and_the_oldest_go_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not ours").unwrap();
        let mut exporter = DirectoryExporter::new(dir.path(), 3, 1 << 20).unwrap();
        exporter
            .export(&batch(1000, &["nginx", "../etc"], 10))
            .unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "cpu-_etc-0000000000001000.pb.gz",
                "cpu-nginx-0000000000001000.pb.gz",
                "notes.txt"
            ]
        );
        exporter
            .export(&batch(2000, &["nginx", "redis"], 10))
            .unwrap();
        exporter.export(&batch(3000, &["nginx"], 10)).unwrap();
        let left = names(dir.path());
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left.contains(&"notes.txt".to_string()));
        assert!(
            !left.iter().any(|n| n.contains("-0000000000001000")),
            "{left:?}"
        );
    }

    #[test]
    fn the_byte_bound_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut exporter = DirectoryExporter::new(dir.path(), 100, 250).unwrap();
        for i in 0..10 {
            exporter.export(&batch(i * 1000, &["a"], 100)).unwrap();
        }
        let left = names(dir.path());
        assert_eq!(
            left,
            [
                "cpu-a-0000000000008000.pb.gz",
                "cpu-a-0000000000009000.pb.gz"
            ]
        );
    }

    #[test]
    fn wall_profiles_are_ours_and_count_toward_retention() {
        let dir = tempfile::tempdir().unwrap();
        let mut exporter = DirectoryExporter::new(dir.path(), 2, 1 << 20).unwrap();
        let mut window = batch(1000, &["shop"], 10);
        let mut wall = window.profiles[0].clone();
        wall.name = crate::WALL_PROFILE.into();
        window.profiles.push(wall);
        exporter.export(&window).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "cpu-shop-0000000000001000.pb.gz",
                "wall-shop-0000000000001000.pb.gz"
            ]
        );
        // The next window's two files push both of the first one's out.
        exporter.export(&window_at(2000, &window)).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "cpu-shop-0000000000002000.pb.gz",
                "wall-shop-0000000000002000.pb.gz"
            ]
        );
    }

    fn window_at(at_ms: u64, window: &Batch) -> Batch {
        let started = UNIX_EPOCH + Duration::from_millis(at_ms);
        Batch {
            started,
            ended: started + Duration::from_secs(15),
            profiles: window.profiles.clone(),
        }
    }

    #[test]
    fn a_probe_profile_gets_its_own_file_and_counts_toward_retention() {
        let dir = tempfile::tempdir().unwrap();
        let mut exporter = DirectoryExporter::new(dir.path(), 2, 1 << 20).unwrap();
        let mut window = batch(1000, &["shop"], 10);
        let mut probe = window.profiles[0].clone();
        probe.name = crate::probe_profile_name("checkout");
        window.profiles.push(probe);
        exporter.export(&window).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "cpu-shop-0000000000001000.pb.gz",
                "probe_checkout-shop-0000000000001000.pb.gz"
            ]
        );
        exporter.export(&batch(2000, &["shop"], 10)).unwrap();
        // Three files, two allowed: the oldest window's first.
        assert_eq!(
            names(dir.path()),
            [
                "cpu-shop-0000000000002000.pb.gz",
                "probe_checkout-shop-0000000000001000.pb.gz"
            ]
        );
    }
}

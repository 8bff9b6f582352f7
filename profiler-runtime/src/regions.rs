//! The code regions of processes' runtimes (`RUNTIME_REGIONS`): JIT code
//! no object file describes (HotSpot's code cache), where the native
//! walker hands the walk to the runtime's walker. Each runtime's registry
//! sets its own regions of a process; this writes every runtime's of the
//! process as one entry.
//!
//! A region is the target's word: a forged runtime could claim all of
//! user space, and every PC of the process would then be the runtime's,
//! its native frames lost. So a region is taken only when it is
//! plausible: inside user space, at most `MAX_REGION_BYTES`, holding
//! anonymous executable memory, and overlapping none of the process's
//! file-backed executable mappings (code an object describes is walked
//! by that object's tables).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aya::Ebpf;
use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::runtimes::{CodeRegion, MAX_CODE_REGIONS, ProcessRegions};

use crate::RuntimeError;

/// The regions' map: pid to `ProcessRegions`.
const REGIONS: crate::ProcessMap<ProcessRegions> = crate::ProcessMap::new("RUNTIME_REGIONS");

/// The largest region taken (HotSpot's code cache is at most 2 GiB; V8's
/// code space a few).
pub const MAX_REGION_BYTES: u64 = 8 << 30;

/// The end of user space on both targets (4-level x86_64 and 48-bit
/// arm64 addresses).
const USER_END: u64 = 0x0000_7fff_ffff_f000;

/// Why a region was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    #[error("code region {0:#x}..{1:#x} is empty or outside user space")]
    OutOfRange(u64, u64),
    #[error("code region {0:#x}..{1:#x} spans {2} MiB, more than any runtime's code")]
    TooLarge(u64, u64, u64),
    #[error("code region {0:#x}..{1:#x} overlaps {2} (file-backed code)")]
    OverlapsFile(u64, u64, String),
    #[error("code region {0:#x}..{1:#x} holds no anonymous executable memory")]
    NotCode(u64, u64),
    #[error("reading the process's maps: {0}")]
    Maps(String),
    #[error("more than {MAX_CODE_REGIONS} code regions in one process")]
    TooMany,
}

/// One mapping of `/proc/PID/maps`, as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapLine {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    /// The file it maps (None for anonymous memory, `[heap]`, `[stack]`,
    /// `[anon:...]`, `/dev/zero (deleted)`...).
    pub file: Option<String>,
}

/// Parses `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Vec<MapLine> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let (_offset, _device, inode) = (fields.next()?, fields.next()?, fields.next()?);
            let path: Vec<&str> = fields.collect();
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            let path = path.join(" ");
            let file = (inode != "0" && path.starts_with('/') && !path.starts_with("/dev/zero"))
                .then_some(path);
            Some(MapLine {
                start,
                end,
                executable: perms.as_bytes().get(2) == Some(&b'x'),
                file,
            })
        })
        .collect()
}

/// Checks region [low, high) against a process's mappings.
pub fn check(low: u64, high: u64, maps: &[MapLine]) -> Result<(), RegionError> {
    if low >= high || high > USER_END || low < 0x1000 {
        return Err(RegionError::OutOfRange(low, high));
    }
    if high - low > MAX_REGION_BYTES {
        return Err(RegionError::TooLarge(low, high, (high - low) >> 20));
    }
    if let Some(file) = maps
        .iter()
        .find(|m| m.executable && m.file.is_some() && m.start < high && low < m.end)
    {
        return Err(RegionError::OverlapsFile(
            low,
            high,
            file.file.clone().unwrap_or_default(),
        ));
    }
    if !maps
        .iter()
        .any(|m| m.executable && m.file.is_none() && m.start < high && low < m.end)
    {
        return Err(RegionError::NotCode(low, high));
    }
    Ok(())
}

/// The writer of `RUNTIME_REGIONS`, shared by the runtimes' registries.
#[derive(Clone, Default)]
pub struct Regions(Option<Arc<Mutex<Inner>>>);

struct Inner {
    map: BpfHashMap<MapData, u32, ProcessRegions>,
    /// Each process's regions, by runtime id.
    processes: HashMap<u32, Vec<(u8, CodeRegion)>>,
}

impl Regions {
    /// Takes the map from the loaded object.
    pub fn take(ebpf: &mut Ebpf) -> Result<Regions, RuntimeError> {
        let map = REGIONS.take(ebpf)?;
        Ok(Regions(Some(Arc::new(Mutex::new(Inner {
            map,
            processes: HashMap::new(),
        })))))
    }

    /// Sets runtime `runtime`'s code regions in process `pid`, each
    /// checked against the process's mappings (`maps`); none is set when
    /// one is refused.
    pub fn set(
        &self,
        pid: u32,
        runtime: u8,
        regions: &[(u64, u64)],
        maps: &[MapLine],
    ) -> Result<(), RegionError> {
        for &(low, high) in regions {
            check(low, high, maps)?;
        }
        let Some(inner) = &self.0 else {
            return Ok(());
        };
        let Ok(mut inner) = inner.lock() else {
            return Ok(());
        };
        let entry = inner.processes.entry(pid).or_default();
        entry.retain(|(id, _)| *id != runtime);
        entry.extend(regions.iter().map(|&(low, high)| {
            (
                runtime,
                CodeRegion {
                    low,
                    high,
                    runtime: runtime.into(),
                    _pad: 0,
                },
            )
        }));
        if entry.len() > MAX_CODE_REGIONS {
            entry.retain(|(id, _)| *id != runtime);
            return Err(RegionError::TooMany);
        }
        inner.write(pid);
        Ok(())
    }

    /// Sets regions in process `pid` after reading its maps.
    pub fn set_for_process(
        &self,
        pid: u32,
        runtime: u8,
        regions: &[(u64, u64)],
    ) -> Result<(), RegionError> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_err(|e| RegionError::Maps(e.to_string()))?;
        self.set(pid, runtime, regions, &parse_maps(&text))
    }

    /// Forgets runtime `runtime`'s regions in `pid`.
    pub fn clear(&self, pid: u32, runtime: u8) {
        let Some(inner) = &self.0 else {
            return;
        };
        let Ok(mut inner) = inner.lock() else {
            return;
        };
        if let Some(entry) = inner.processes.get_mut(&pid) {
            entry.retain(|(id, _)| *id != runtime);
        }
        inner.write(pid);
    }
}

impl Inner {
    fn write(&mut self, pid: u32) {
        let regions = self.processes.get(&pid).cloned().unwrap_or_default();
        if regions.is_empty() {
            self.processes.remove(&pid);
            let _ = self.map.remove(&pid);
            return;
        }
        let mut value = ProcessRegions::default();
        for (slot, (_, region)) in value.regions.iter_mut().zip(&regions) {
            *slot = *region;
        }
        value.count = regions.len().min(MAX_CODE_REGIONS) as u32;
        if let Err(e) = self.map.insert(pid, value, 0) {
            tracing::debug!(pid, "RUNTIME_REGIONS: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 1234 /usr/bin/java
55d0c0001000-55d0c0002000 r-xp 00001000 fe:01 1234 /usr/bin/java
7f0000000000-7f0000100000 rwxp 00000000 00:00 0
7f0000100000-7f0010000000 ---p 00000000 00:00 0
7f1000000000-7f1000200000 r-xp 00000000 fe:01 99 /usr/lib/jvm/lib/server/libjvm.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn a_code_cache_is_taken_and_forged_regions_are_not() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 6);
        assert_eq!(
            maps[4].file.as_deref(),
            Some("/usr/lib/jvm/lib/server/libjvm.so")
        );
        // HotSpot's reserved code cache: committed rwx, the rest reserved.
        assert_eq!(check(0x7f00_0000_0000, 0x7f00_1000_0000, &maps), Ok(()));
        // All of user space: too large, and over libjvm's code.
        assert!(matches!(
            check(0x1000, 0x7fff_ffff_f000, &maps),
            Err(RegionError::TooLarge(..))
        ));
        // Over a file's code.
        assert!(matches!(
            check(0x7f0f_0000_0000, 0x7f10_0010_0000, &maps),
            Err(RegionError::OverlapsFile(..))
        ));
        // Only reserved, never executable memory.
        assert!(matches!(
            check(0x7f00_0010_0000, 0x7f00_0020_0000, &maps),
            Err(RegionError::NotCode(..))
        ));
        assert!(matches!(
            check(0x2000, 0x1000, &maps),
            Err(RegionError::OutOfRange(..))
        ));
    }
}

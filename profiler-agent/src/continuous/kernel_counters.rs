//! Reads the sampler's in-kernel counters while it runs, for `/metrics`.
//!
//! `Recorder` reads them only in `finish()`; until it offers a live
//! accessor, the agent opens its own handle on the same BPF map: the
//! per-CPU array named `COUNTERS` among the maps this process holds open
//! (found through `/proc/self/fdinfo`, so another agent on the machine is
//! never read by mistake).

use aya::maps::{Map, MapData, MapInfo, MapType, PerCpuArray};
use profiler_common::Counter;

use crate::sampling::KernelCounters;

pub struct KernelCounterReader {
    map: PerCpuArray<MapData, u64>,
}

impl KernelCounterReader {
    /// Finds the newest `COUNTERS` map this process holds; None if there is
    /// none (or it cannot be opened: the metrics then read 0).
    pub fn open() -> Option<Self> {
        let mut ids: Vec<u32> = own_map_ids();
        ids.sort_unstable();
        ids.dedup();
        let id = ids.into_iter().rev().find(|&id| {
            MapInfo::from_id(id).is_ok_and(|info| {
                info.name_as_str() == Some("COUNTERS")
                    && matches!(info.map_type(), Ok(MapType::PerCpuArray))
            })
        })?;
        let data = MapData::from_id(id).ok()?;
        let map = PerCpuArray::try_from(Map::PerCpuArray(data)).ok()?;
        Some(KernelCounterReader { map })
    }

    /// Totals over CPUs, as `Sampler::counters` sums them.
    pub fn read(&self) -> KernelCounters {
        let value = |counter: Counter| {
            self.map
                .get(&(counter as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0)
        };
        KernelCounters {
            fired: value(Counter::Fired),
            idle: value(Counter::Idle),
            filtered_out: value(Counter::FilteredOut),
            sent: value(Counter::Sent),
            ring_buffer_full: value(Counter::RingBufferFull),
            user_stack_failed: value(Counter::UserStackFailed),
            kernel_stack_failed: value(Counter::KernelStackFailed),
            user_stack_truncated: value(Counter::UserStackTruncated),
            frames_from_tables: value(Counter::FramesFromTables),
        }
    }
}

/// Ids of the BPF maps behind this process's file descriptors.
fn own_map_ids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.ok()?.path()).ok()?;
            text.lines()
                .find_map(|line| line.strip_prefix("map_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect()
}

/// `a + b`, field by field: totals carried over sampler restarts.
pub fn add(a: &KernelCounters, b: &KernelCounters) -> KernelCounters {
    KernelCounters {
        fired: a.fired + b.fired,
        idle: a.idle + b.idle,
        filtered_out: a.filtered_out + b.filtered_out,
        sent: a.sent + b.sent,
        ring_buffer_full: a.ring_buffer_full + b.ring_buffer_full,
        user_stack_failed: a.user_stack_failed + b.user_stack_failed,
        kernel_stack_failed: a.kernel_stack_failed + b.kernel_stack_failed,
        user_stack_truncated: a.user_stack_truncated + b.user_stack_truncated,
        frames_from_tables: a.frames_from_tables + b.frames_from_tables,
    }
}

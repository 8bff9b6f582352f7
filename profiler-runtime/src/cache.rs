//! Caches of what the agent read from processes' memory, bounded in bytes.
//!
//! A process controls the memory the runtimes read: a forged CPython can
//! claim thousands of code objects with 256 KiB line tables, a forged JVM
//! thousands of compiled methods with megabytes of debug information each.
//! Kept without a bound, one pod could grow the agent until the node
//! killed it, and every pod would lose its profiles. So everything a
//! runtime keeps of a process's memory goes in a [`Cache`]:
//!
//! - a cache holds at most its share of one budget (`--runtime-cache-mib`,
//!   [`DEFAULT_BUDGET_BYTES`] by default), and all caches together at most
//!   the budget;
//! - one process fills at most half of a cache: a forger evicts its own
//!   entries first, and at most half of the others';
//! - the least recently used entries go first, from the process that holds
//!   the most;
//! - a value that does not fit is used once and not kept: it is read again
//!   when next needed (a process that exited by then has that frame
//!   unnamed).
//!
//! The budget counts the bytes of the values (strings, tables) plus a
//! fixed cost per entry for its key and the maps' slots; the allocator's
//! own overhead is not counted. `/metrics` and the record report show
//! each cache's bytes, entries and evictions.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// The budget when no setting says otherwise.
pub const DEFAULT_BUDGET_BYTES: u64 = 64 << 20;

/// Bytes an entry costs beyond its value's own data: its key, its value's
/// inline size, the slots of the map and of the recency order.
pub const ENTRY_COST: usize = 96;

/// The agent's budget for every cache: one setting for the process, set
/// at start, before any runtime starts (caches are made deep in the
/// runtimes' threads, so it is not passed down).
static BUDGET: AtomicU64 = AtomicU64::new(DEFAULT_BUDGET_BYTES);
/// Bytes kept over every cache.
static USED: AtomicU64 = AtomicU64::new(0);
/// Each cache's counters, by runtime and name, kept over restarts.
static STATS: Mutex<Vec<Arc<CacheStats>>> = Mutex::new(Vec::new());

/// Sets the budget (bytes) of every cache made after.
pub fn set_budget(bytes: u64) {
    BUDGET.store(bytes, Relaxed);
}

/// The budget, in bytes.
pub fn budget() -> u64 {
    BUDGET.load(Relaxed)
}

/// Bytes kept now over every cache.
pub fn used() -> u64 {
    USED.load(Relaxed)
}

/// Every cache's counters, in the order they were first made.
pub fn stats() -> Vec<Arc<CacheStats>> {
    STATS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The report's line on the caches, when they kept anything: what they
/// hold against the budget, and which gave entries up.
pub fn report() -> Option<String> {
    let all = stats();
    if all
        .iter()
        .all(|s| s.used() == 0 && s.evicted() == 0 && s.refused() == 0)
    {
        return None;
    }
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    let mut line = format!(
        "runtime caches: {:.1} MiB kept of a {:.0} MiB budget (--runtime-cache-mib)",
        mib(used()),
        mib(budget())
    );
    for s in all.iter().filter(|s| s.evicted() > 0 || s.refused() > 0) {
        line.push_str(&format!(
            "; {} {}: {} evicted, {} not kept",
            s.runtime,
            s.name,
            s.evicted(),
            s.refused()
        ));
    }
    Some(line)
}

/// What one cache (of one runtime) keeps and gave up.
#[derive(Debug)]
pub struct CacheStats {
    pub runtime: &'static str,
    pub name: &'static str,
    used: AtomicU64,
    entries: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
}

impl CacheStats {
    /// Bytes kept now.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }
    /// Entries kept now.
    pub fn entries(&self) -> u64 {
        self.entries.load(Relaxed)
    }
    /// Entries evicted to make room, ever.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }
    /// Values not kept because they did not fit, ever.
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }
}

fn stats_for(runtime: &'static str, name: &'static str) -> Arc<CacheStats> {
    let mut all = STATS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = all.iter().find(|s| s.runtime == runtime && s.name == name) {
        return found.clone();
    }
    let stats = Arc::new(CacheStats {
        runtime,
        name,
        used: AtomicU64::new(0),
        entries: AtomicU64::new(0),
        evicted: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    });
    all.push(stats.clone());
    stats
}

/// What a kept value costs: the heap bytes it owns (the fixed cost of an
/// entry is added to it).
pub trait Weigh {
    fn weigh(&self) -> usize;
}

impl Weigh for String {
    fn weigh(&self) -> usize {
        self.capacity()
    }
}

/// Plain values own no heap bytes.
macro_rules! inline_only {
    ($($t:ty),*) => {
        $(impl Weigh for $t {
            fn weigh(&self) -> usize {
                0
            }
        })*
    };
}
inline_only!(u8, u16, u32, u64, i32, i64);

impl<A: Weigh, B: Weigh> Weigh for (A, B) {
    fn weigh(&self) -> usize {
        self.0.weigh() + self.1.weigh()
    }
}

impl<T: Weigh> Weigh for Option<T> {
    fn weigh(&self) -> usize {
        self.as_ref().map_or(0, T::weigh)
    }
}

impl<T: Weigh> Weigh for Vec<T> {
    fn weigh(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>() + self.iter().map(T::weigh).sum::<usize>()
    }
}

/// An `Arc` is counted whole in each cache that holds it: what a cache
/// keeps alive is at most that.
impl<T: Weigh + ?Sized> Weigh for Arc<T> {
    fn weigh(&self) -> usize {
        std::mem::size_of_val::<T>(self) + T::weigh(self)
    }
}

impl Weigh for profiler_symbolize::Frame {
    fn weigh(&self) -> usize {
        self.function.weigh() + self.system_name.weigh() + self.file.weigh()
    }
}

/// One process's entries, least recently used first in `order`.
struct Part<K, V> {
    entries: HashMap<K, Entry<V>>,
    order: BTreeMap<u64, K>,
    used: usize,
}

struct Entry<V> {
    value: V,
    cost: usize,
    tick: u64,
}

impl<K, V> Default for Part<K, V> {
    fn default() -> Self {
        Part {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            used: 0,
        }
    }
}

/// A least-recently-used cache of values read from processes, keyed by
/// process and `K`, bounded in bytes (see the module's documentation).
pub struct Cache<K, V> {
    stats: Arc<CacheStats>,
    limit: usize,
    processes: HashMap<u32, Part<K, V>>,
    used: usize,
    entries: usize,
    tick: u64,
}

impl<K: Hash + Eq + Clone, V: Clone + Weigh> Cache<K, V> {
    /// A cache that holds at most `percent` of the budget, counted as
    /// `runtime`'s cache `name`.
    pub fn new(runtime: &'static str, name: &'static str, percent: u64) -> Self {
        let limit = budget().saturating_mul(percent) / 100;
        Self::with_limit(runtime, name, usize::try_from(limit).unwrap_or(usize::MAX))
    }

    /// A cache that holds at most `limit` bytes.
    pub fn with_limit(runtime: &'static str, name: &'static str, limit: usize) -> Self {
        Cache {
            stats: stats_for(runtime, name),
            limit,
            processes: HashMap::new(),
            used: 0,
            entries: 0,
            tick: 0,
        }
    }

    /// Bytes one process may keep.
    fn process_limit(&self) -> usize {
        self.limit / 2
    }

    /// The value kept for `key` of `pid`, now the most recently used.
    pub fn get(&mut self, pid: u32, key: &K) -> Option<V> {
        let part = self.processes.get_mut(&pid)?;
        let entry = part.entries.get_mut(key)?;
        self.tick += 1;
        if let Some(key) = part.order.remove(&entry.tick) {
            part.order.insert(self.tick, key);
        }
        entry.tick = self.tick;
        Some(entry.value.clone())
    }

    /// The value for `key` of `pid`: kept, or made by `read` and kept if
    /// it fits.
    pub fn get_or_insert_with(&mut self, pid: u32, key: K, read: impl FnOnce() -> V) -> V {
        if let Some(value) = self.get(pid, &key) {
            return value;
        }
        let value = read();
        self.insert(pid, key, value.clone());
        value
    }

    /// Keeps `value` for `key` of `pid`, evicting what it must; false when
    /// it does not fit at all (it is not kept).
    pub fn insert(&mut self, pid: u32, key: K, value: V) -> bool {
        self.remove(pid, &key);
        let cost = value.weigh() + ENTRY_COST;
        if cost > self.process_limit() {
            self.stats.refused.fetch_add(1, Relaxed);
            return false;
        }
        // The process's own entries first: it may hold half the cache.
        while self
            .processes
            .get(&pid)
            .is_some_and(|p| p.used + cost > self.process_limit())
        {
            self.evict_from(pid);
        }
        // Then the cache's limit, and the budget over every cache: the
        // process that holds the most gives up its oldest entry.
        while self.used + cost > self.limit || used() + cost as u64 > budget() {
            let Some(largest) = self
                .processes
                .iter()
                .filter(|(_, p)| !p.entries.is_empty())
                .max_by_key(|(_, p)| p.used)
                .map(|(&pid, _)| pid)
            else {
                // Every byte of the budget is in other caches.
                self.stats.refused.fetch_add(1, Relaxed);
                return false;
            };
            self.evict_from(largest);
        }
        self.tick += 1;
        let part = self.processes.entry(pid).or_default();
        part.order.insert(self.tick, key.clone());
        part.entries.insert(
            key,
            Entry {
                value,
                cost,
                tick: self.tick,
            },
        );
        part.used += cost;
        self.charge(cost as i64, 1);
        true
    }

    /// Forgets `key` of `pid`.
    pub fn remove(&mut self, pid: u32, key: &K) {
        let Some(part) = self.processes.get_mut(&pid) else {
            return;
        };
        let Some(entry) = part.entries.remove(key) else {
            return;
        };
        part.order.remove(&entry.tick);
        part.used -= entry.cost;
        if part.entries.is_empty() {
            self.processes.remove(&pid);
        }
        self.charge(-(entry.cost as i64), -1);
    }

    /// Evicts `pid`'s least recently used entry.
    fn evict_from(&mut self, pid: u32) {
        let Some(part) = self.processes.get_mut(&pid) else {
            return;
        };
        let Some((_, key)) = part.order.pop_first() else {
            return;
        };
        let cost = part.entries.remove(&key).map_or(0, |entry| entry.cost);
        part.used -= cost;
        if part.entries.is_empty() {
            self.processes.remove(&pid);
        }
        self.charge(-(cost as i64), -1);
        self.stats.evicted.fetch_add(1, Relaxed);
    }

    /// Forgets the processes `keep` says are gone.
    pub fn retain_processes(&mut self, keep: impl Fn(u32) -> bool) {
        let gone: Vec<u32> = self
            .processes
            .keys()
            .copied()
            .filter(|&pid| !keep(pid))
            .collect();
        for pid in gone {
            if let Some(part) = self.processes.remove(&pid) {
                self.charge(-(part.used as i64), -(part.entries.len() as i64));
            }
        }
    }

    /// Forgets the entries of `pid` that `keep` refuses.
    pub fn retain(&mut self, pid: u32, keep: impl Fn(&K, &V) -> bool) {
        let Some(part) = self.processes.get_mut(&pid) else {
            return;
        };
        let gone: Vec<K> = part
            .entries
            .iter()
            .filter(|(k, e)| !keep(k, &e.value))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.remove(pid, &key);
        }
    }

    /// Bytes kept.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The most this cache keeps.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn charge(&mut self, bytes: i64, entries: i64) {
        self.used = self.used.wrapping_add_signed(bytes as isize);
        self.entries = self.entries.wrapping_add_signed(entries as isize);
        USED.fetch_add(bytes as u64, Relaxed);
        self.stats.used.fetch_add(bytes as u64, Relaxed);
        self.stats.entries.fetch_add(entries as u64, Relaxed);
    }
}

impl<K, V> Drop for Cache<K, V> {
    fn drop(&mut self) {
        USED.fetch_sub(self.used as u64, Relaxed);
        self.stats.used.fetch_sub(self.used as u64, Relaxed);
        self.stats.entries.fetch_sub(self.entries as u64, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: usize) -> String {
        "x".repeat(bytes)
    }

    #[test]
    fn a_cache_never_holds_more_than_its_limit() {
        let mut cache = Cache::with_limit("test", "bound", 100_000);
        for i in 0..10_000u64 {
            cache.insert((i % 7) as u32, i, text(1000));
            assert!(cache.used() <= 100_000, "{}", cache.used());
        }
        assert!(
            cache.len() > 50,
            "it still keeps what fits: {}",
            cache.len()
        );
        assert!(cache.stats.evicted() > 9000);
    }

    #[test]
    fn a_forger_evicts_its_own_entries_before_others() {
        let mut cache = Cache::with_limit("test", "forger", 100_000);
        for i in 0..40u64 {
            assert!(cache.insert(1, i, text(1000)));
        }
        // Process 2 claims far more than the cache: it never holds more
        // than half, and process 1 keeps all it had (40 entries of 1096
        // bytes fit the other half).
        for i in 0..10_000u64 {
            cache.insert(2, i, text(1000));
        }
        for i in 0..40u64 {
            assert!(cache.get(1, &i).is_some(), "{i}");
        }
        assert!(cache.processes[&2].used <= 50_000);
        assert!(cache.used() <= 100_000);
    }

    #[test]
    fn least_recently_used_goes_first() {
        let mut cache = Cache::with_limit("test", "lru", 4 * (ENTRY_COST + 1000) * 2);
        for i in 0..4u64 {
            cache.insert(1, i, text(1000));
        }
        assert!(cache.get(1, &0).is_some());
        cache.insert(1, 4, text(1000));
        assert!(cache.get(1, &0).is_some(), "touched, so kept");
        assert!(cache.get(1, &1).is_none(), "the oldest went");
    }

    #[test]
    fn a_value_larger_than_a_process_may_hold_is_used_not_kept() {
        let mut cache = Cache::with_limit("test", "huge", 10_000);
        let read = cache.get_or_insert_with(1, 1u64, || text(20_000));
        assert_eq!(read.len(), 20_000);
        assert!(cache.is_empty());
        assert_eq!(cache.stats.refused(), 1);
    }

    #[test]
    fn gone_processes_and_dropped_caches_give_their_bytes_back() {
        let stats = {
            let mut cache = Cache::with_limit("test", "gone", 1 << 20);
            for i in 0..10u64 {
                cache.insert(i as u32, i, text(100));
            }
            cache.retain_processes(|pid| pid < 5);
            assert_eq!(cache.len(), 5);
            assert_eq!(cache.stats.entries(), 5);
            assert_eq!(cache.used(), 5 * (100 + ENTRY_COST));
            cache.stats.clone()
        };
        assert_eq!(stats.used(), 0);
        assert_eq!(stats.entries(), 0);
    }
}

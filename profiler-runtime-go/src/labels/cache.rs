//! Label sets decoded once per distinct raw block, not once per sample.
//!
//! A Go service's samples carry a handful of label sets, and every sample
//! of one set carries the same block: the same lengths, the same copied
//! bytes, the same addresses of strings in the binary. Decoding a block
//! (`labels_of`) reads each string sent by address from `GoStrings` under
//! its mutex, then copies and sorts them: at 6400 samples/s this was a
//! fifth of the agent's time (`perf record -g` on `record -F 3200` with
//! the bench's labelled Go service: `GoStrings::read` 12%, the decoding
//! around it 5%, most of the copies after). Here the block's meaningful
//! bytes are the key, and its labels are decoded on the first sample only.

use std::sync::Arc;

use profiler_common::Sample;
use profiler_common::runtimes::go::{GoLabels, GoString};

use super::{GoLabelsConfig, GoStrings, labels_of};

/// Decoded label sets kept at most; a process whose labels change at
/// every sample (a request id) empties the cache rather than grows it.
const MAX_SETS: usize = 4096;

/// A sample's labels, as `labels_of` gives them.
pub type LabelSet = Arc<[(String, String)]>;

/// Label sets by the raw block they were decoded from (and its pid).
#[derive(Default)]
pub struct LabelCache {
    sets: hashbrown::HashMap<Box<[u8]>, LabelSet>,
    /// `GoStrings::generation` when `sets` was filled: a binary
    /// registered or forgotten since (an exec, a pid reused, a process
    /// whose binary was not yet read at its first samples) may read a
    /// block's addresses differently, so the sets are decoded anew.
    generation: u64,
    /// The key of the sample at hand (no allocation per sample).
    key: Vec<u8>,
    empty: LabelSet,
}

impl LabelCache {
    /// No labels (shared: a sample without labels allocates nothing).
    pub fn none(&self) -> LabelSet {
        self.empty.clone()
    }

    /// `sample`'s labels: decoded at the first sample of its block (in
    /// its process), shared after.
    pub fn labels(
        &mut self,
        sample: &Sample,
        config: &GoLabelsConfig,
        strings: Option<&GoStrings>,
    ) -> LabelSet {
        let Some(block) = sample.go_labels() else {
            return self.none();
        };
        // Read before decoding: a binary registered while this block is
        // decoded leaves the cache a generation behind, emptied next time.
        let generation = strings.map_or(0, GoStrings::generation);
        if generation != self.generation {
            self.sets.clear();
            self.generation = generation;
        }
        block_key(&mut self.key, sample.pid, block, config.goroutine);
        if let Some(set) = self.sets.get(self.key.as_slice()) {
            return set.clone();
        }
        let set: LabelSet = labels_of(sample, config, strings).into();
        if self.sets.len() >= MAX_SETS {
            self.sets.clear();
        }
        self.sets.insert(self.key.as_slice().into(), set.clone());
        set
    }
}

/// What `labels_of` reads of a block, as bytes: the pid, which strings
/// were sent by address, the count, the goroutine id when it is a label,
/// and the entries written (lengths, addresses, kept bytes; the sampling
/// program zeroes their padding), so one label set is one key.
fn block_key(key: &mut Vec<u8>, pid: u32, block: &GoLabels, goroutine: bool) {
    key.clear();
    key.extend_from_slice(&pid.to_ne_bytes());
    key.extend_from_slice(&block.in_binary.to_ne_bytes());
    key.push(block.count);
    if goroutine {
        key.extend_from_slice(&block.goid.to_ne_bytes());
    }
    for label in block.labels() {
        key.extend_from_slice(&label.key_len.to_ne_bytes());
        key.extend_from_slice(&label.value_len.to_ne_bytes());
        for string in [label.key, label.value] {
            match string {
                GoString::InBinary(address) => key.extend_from_slice(&address.to_ne_bytes()),
                GoString::Copied(bytes) => key.extend_from_slice(bytes),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::fixtures::{block, labelled_sample, register};

    /// A sample of `pid`'s goroutine 7 whose block holds `tier` copied
    /// (its bytes past the length `junk`) and a value sent by address,
    /// 0x401100.
    fn sample(pid: u32, tier: &[u8], junk: u8) -> Box<Sample> {
        with_goroutine(pid, tier, junk, 7)
    }

    fn with_goroutine(pid: u32, tier: &[u8], junk: u8, goid: u64) -> Box<Sample> {
        let mut sample = labelled_sample(pid);
        let block = block(&mut sample);
        block.goid = goid;
        block.push(
            GoString::Copied(b"tier"),
            4,
            GoString::Copied(tier),
            tier.len() as u32,
        );
        block.push(
            GoString::Copied(b"zone"),
            4,
            GoString::InBinary(0x401100),
            4,
        );
        // The first value's padding (its area starts after the lengths and
        // "tier"'s word).
        block.entries[16 + tier.len()..24].fill(junk);
        sample
    }

    fn pairs(set: &LabelSet) -> Vec<(&str, &str)> {
        set.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    /// One block is decoded once: its later samples (whatever bytes lie
    /// past its strings) share the set; another block, pid or goroutine
    /// (when it is a label) is another set; and a binary registered after
    /// a block was first met decodes it anew, with the strings it holds.
    #[test]
    fn a_block_is_decoded_once_and_again_when_its_binary_arrives() {
        let config = GoLabelsConfig::default();
        let strings = GoStrings::default();
        let mut cache = LabelCache::default();

        // The binary is not registered yet: the label sent by address is
        // left out.
        let first = cache.labels(&sample(42, b"gold", 0), &config, Some(&strings));
        assert_eq!(pairs(&first), [("tier", "gold")]);
        let again = cache.labels(&sample(42, b"gold", 0xee), &config, Some(&strings));
        assert!(Arc::ptr_eq(&first, &again));
        let silver = cache.labels(&sample(42, b"silver", 0), &config, Some(&strings));
        assert_eq!(pairs(&silver), [("tier", "silver")]);
        let other_pid = cache.labels(&sample(43, b"gold", 0), &config, Some(&strings));
        assert!(!Arc::ptr_eq(&first, &other_pid));
        assert_eq!(cache.sets.len(), 3);

        // Its binary arrives: the block reads whole.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("service");
        let mut bytes = vec![0u8; 0x2000];
        bytes[0x1100..0x1104].copy_from_slice(b"east");
        std::fs::write(&path, &bytes).unwrap();
        register(&strings, &path, 42, 0x2000);
        let whole = cache.labels(&sample(42, b"gold", 0), &config, Some(&strings));
        assert_eq!(pairs(&whole), [("tier", "gold"), ("zone", "east")]);
        assert_eq!(cache.sets.len(), 1);

        // The goroutine as a label: one set per goroutine.
        let config = GoLabelsConfig {
            goroutine: true,
            keys: Vec::new(),
        };
        let set = cache.labels(&sample(42, b"gold", 0), &config, Some(&strings));
        assert_eq!(
            pairs(&set),
            [("goroutine", "7"), ("tier", "gold"), ("zone", "east")]
        );
        let other_goroutine = with_goroutine(42, b"gold", 0, 8);
        let set = cache.labels(&other_goroutine, &config, Some(&strings));
        assert_eq!(pairs(&set)[0], ("goroutine", "8"));

        // Not a labelled sample: no labels.
        let mut plain = sample(42, b"gold", 0);
        plain.flags = 0;
        assert!(cache.labels(&plain, &config, Some(&strings)).is_empty());
    }
}

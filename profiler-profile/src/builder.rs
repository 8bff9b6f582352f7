//! Builds a `Profile` while deduplicating functions, locations and
//! mappings, so a symbol shared by many stacks is stored once.

use std::collections::HashMap;
use std::hash::Hash;

use super::{Function, Line, Location, Mapping, Profile, Sample};

/// Builds a profile; `L` is the caller's key for one location (e.g. pid
/// and address) and `M` the key for one mapping.
pub struct ProfileBuilder<L, M> {
    profile: Profile,
    functions: HashMap<Function, usize>,
    locations: HashMap<L, usize>,
    mappings: HashMap<M, usize>,
}

impl<L: Hash + Eq, M: Hash + Eq> ProfileBuilder<L, M> {
    pub fn new(start_unix_ns: i64, duration_ns: i64, period_ns: i64) -> Self {
        ProfileBuilder {
            profile: Profile {
                start_unix_ns,
                duration_ns,
                period_ns,
                ..Profile::default()
            },
            functions: HashMap::new(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
        }
    }

    /// What the profile's samples measure (CPU by default).
    pub fn kind(&mut self, kind: super::ProfileKind) {
        self.profile.kind = kind;
    }

    pub fn function(&mut self, function: Function) -> usize {
        let functions = &mut self.profile.functions;
        *self.functions.entry(function).or_insert_with_key(|f| {
            functions.push(f.clone());
            functions.len() - 1
        })
    }

    /// The index of the mapping known by `key`, made by `make` on first use.
    pub fn mapping(&mut self, key: M, make: impl FnOnce() -> Mapping) -> usize {
        let mappings = &mut self.profile.mappings;
        *self.mappings.entry(key).or_insert_with(|| {
            mappings.push(make());
            mappings.len() - 1
        })
    }

    /// Marks a mapping as having symbolized functions.
    pub fn mapping_has_functions(&mut self, mapping: usize) {
        self.profile.mappings[mapping].has_functions = true;
    }

    /// Widens a mapping to cover `address` (used for the kernel, whose
    /// extent is only known from the addresses seen).
    pub fn widen_mapping(&mut self, mapping: usize, address: u64) {
        let m = &mut self.profile.mappings[mapping];
        if m.start == 0 || address < m.start {
            m.start = address;
        }
        if address >= m.limit {
            m.limit = address + 1;
        }
    }

    /// The index of the location known by `key`; `make` builds it (and
    /// may call back into the builder) only on first use.
    pub fn location(&mut self, key: L, make: impl FnOnce(&mut Self) -> Location) -> usize {
        if let Some(&index) = self.locations.get(&key) {
            return index;
        }
        let location = make(self);
        self.profile.locations.push(location);
        let index = self.profile.locations.len() - 1;
        self.locations.insert(key, index);
        index
    }

    pub fn line(&mut self, function: Function, line: u32) -> Line {
        Line {
            function: self.function(function),
            line,
        }
    }

    /// Room for `additional` more samples at once: a profile of tens of
    /// thousands of stacks would otherwise grow its sample list by
    /// doubling, up to twice the memory it needs at the end.
    pub fn reserve_samples(&mut self, additional: usize) {
        self.profile.samples.reserve_exact(additional);
    }

    pub fn sample(&mut self, sample: Sample) {
        self.profile.samples.push(sample);
    }

    pub fn comment(&mut self, comment: impl Into<String>) {
        self.profile.comments.push(comment.into());
    }

    pub fn finish(self) -> Profile {
        self.profile
    }
}

//! Contiguous ranges of the unwinder's BPF arrays.

/// Hands out contiguous ranges of a BPF array (rows, pages, mappings):
/// first fit from freed ranges (kept sorted and coalesced), else from the
/// never-used tail. A table's ranges are only freed once no registered
/// process maps its object; a walk already in flight on another CPU at
/// that moment may read entries being rewritten, which costs that one
/// sample's stack, never safety (the BPF walker bounds-checks every entry
/// it reads).
#[derive(Debug)]
pub struct RangeAllocator {
    capacity: u32,
    /// Start of the never-allocated tail.
    next: u32,
    /// Freed ranges below `next`: (first row, count), sorted, disjoint, not
    /// adjacent to each other.
    free: Vec<(u32, u32)>,
}

impl RangeAllocator {
    pub fn new(capacity: u32) -> Self {
        RangeAllocator {
            capacity,
            next: 0,
            free: Vec::new(),
        }
    }

    pub fn allocate(&mut self, count: u32) -> Option<u32> {
        if count == 0 {
            return None;
        }
        if let Some(i) = self.free.iter().position(|&(_, len)| len >= count) {
            let (start, len) = self.free[i];
            if len == count {
                self.free.remove(i);
            } else {
                self.free[i] = (start + count, len - count);
            }
            return Some(start);
        }
        let start = self.next;
        if start.checked_add(count)? > self.capacity {
            return None;
        }
        self.next = start + count;
        Some(start)
    }

    pub fn free(&mut self, start: u32, count: u32) {
        if count == 0 {
            return;
        }
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, count));
        // Coalesce with the following range, then with the preceding one.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        // A free range that reaches the tail gives it back.
        if let Some(&(s, len)) = self.free.last()
            && s + len == self.next
        {
            self.next = s;
            self.free.pop();
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries in use.
    pub fn used(&self) -> u32 {
        self.next - self.free.iter().map(|&(_, len)| len).sum::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_ranges_are_reused_and_coalesced() {
        let mut a = RangeAllocator::new(100);
        let x = a.allocate(30).unwrap();
        let y = a.allocate(30).unwrap();
        let z = a.allocate(30).unwrap();
        assert_eq!((x, y, z), (0, 30, 60));
        assert_eq!(a.allocate(20), None, "only 10 rows left");
        a.free(y, 30);
        // First fit inside the hole.
        assert_eq!(a.allocate(10), Some(30));
        assert_eq!(a.allocate(20), Some(40));
        assert_eq!(a.used(), 90);
        a.free(x, 30);
        a.free(30, 10);
        a.free(40, 20);
        // 0..60 coalesced into one range.
        assert_eq!(a.free, vec![(0, 60)]);
        assert_eq!(a.allocate(55), Some(0));
        a.free(0, 55);
        a.free(z, 30);
        // Everything free: the tail is back at 0.
        assert_eq!((a.next, a.free.len(), a.used()), (0, 0, 0));
        assert_eq!(a.allocate(100), Some(0));
    }

    #[test]
    fn a_churn_of_tables_never_runs_out() {
        // Many short-lived binaries, at most 4 alive at a time: without
        // freeing, 1000 tables of 500 rows would need 500k rows.
        let mut a = RangeAllocator::new(4 * 500 + 499);
        let mut live = std::collections::VecDeque::new();
        for i in 0..1000u32 {
            let count = 400 + (i * 37) % 100;
            let start = a.allocate(count).expect("space for a live set of 4");
            live.push_back((start, count));
            if live.len() == 4 {
                let (s, c) = live.pop_front().unwrap();
                a.free(s, c);
            }
        }
        assert!(a.used() <= 4 * 500);
    }
}

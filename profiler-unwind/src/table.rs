//! An object's unwind table in user space, and its paged form for the
//! BPF walker (see `profiler_common::unwind`).

use std::collections::HashMap;

use profiler_common::unwind::{
    MAX_UNWIND_RULES, RULE_FRAME_POINTER, UNWIND_PAGE_SHIFT, UnwindPage, UnwindRow, UnwindRule,
};

/// From `address` (an ELF virtual address of the object) up to the next
/// row's address, `rule` finds the caller. A `RULE_FRAME_POINTER` row
/// ends the code before it (a gap between functions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRow {
    pub address: u64,
    pub rule: UnwindRule,
}

/// The rows of one object, sorted by address, no two consecutive rows
/// with the same rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectTable {
    pub rows: Vec<TableRow>,
}

impl ObjectTable {
    /// Builds a table from rows sorted by address: a later row at the same
    /// address replaces an earlier one, and repeats of the rule before are
    /// dropped.
    pub fn from_sorted(rows: impl IntoIterator<Item = TableRow>) -> Self {
        let mut table = ObjectTable { rows: Vec::new() };
        for row in rows {
            table.push(row);
        }
        table.compact();
        table
    }

    fn push(&mut self, row: TableRow) {
        match self.rows.last_mut() {
            Some(last) if last.address == row.address => *last = row,
            Some(last) if last.address > row.address => {}
            _ => self.rows.push(row),
        }
    }

    /// Drops rows that repeat the rule before them, and leading gap rows.
    fn compact(&mut self) {
        let mut previous: Option<UnwindRule> = None;
        self.rows.retain(|row| {
            let keep = match previous {
                None => row.rule.kind != RULE_FRAME_POINTER || row.rule.flags != 0,
                Some(rule) => rule != row.rule,
            };
            if keep {
                previous = Some(row.rule);
            }
            keep
        });
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rule for `address`, as the walker finds it (tests and tools).
    pub fn rule_at(&self, address: u64) -> Option<UnwindRule> {
        let index = self.rows.partition_point(|r| r.address <= address);
        Some(self.rows.get(index.checked_sub(1)?)?.rule)
    }

    /// This table's rows where `other` has none: `other` wins inside
    /// [start, end) (Go's pcsp over its text, CFI elsewhere).
    pub fn overlay(&self, other: &ObjectTable, start: u64, end: u64) -> ObjectTable {
        let mut rows = Vec::with_capacity(self.rows.len() + other.rows.len() + 2);
        rows.extend(self.rows.iter().filter(|r| r.address < start).copied());
        rows.extend(
            other
                .rows
                .iter()
                .filter(|r| start <= r.address && r.address < end)
                .copied(),
        );
        // The rule in effect at `end` in this table carries on after it.
        let after = self.rule_at(end).unwrap_or_default();
        rows.push(TableRow {
            address: end,
            rule: after,
        });
        rows.extend(self.rows.iter().filter(|r| r.address > end).copied());
        ObjectTable::from_sorted(rows)
    }
}

/// Rules deduplicated node-wide; index 0 is the frame-pointer rule.
#[derive(Debug)]
pub struct RuleSet {
    rules: Vec<UnwindRule>,
    index: HashMap<UnwindRule, u16>,
}

impl Default for RuleSet {
    fn default() -> Self {
        let walk_frame_pointers = UnwindRule::default();
        RuleSet {
            rules: vec![walk_frame_pointers],
            index: HashMap::from([(walk_frame_pointers, 0)]),
        }
    }
}

impl RuleSet {
    /// The index of `rule`, adding it when new; None when the set is full.
    pub fn intern(&mut self, rule: UnwindRule) -> Option<u16> {
        if let Some(&i) = self.index.get(&rule) {
            return Some(i);
        }
        if self.rules.len() >= MAX_UNWIND_RULES as usize {
            return None;
        }
        let i = self.rules.len() as u16;
        self.rules.push(rule);
        self.index.insert(rule, i);
        Some(i)
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rules from index `from` on (to write the new ones to the kernel).
    pub fn since(&self, from: usize) -> &[UnwindRule] {
        &self.rules[from.min(self.rules.len())..]
    }
}

/// A table cut into pages (`UNWIND_PAGE_SHIFT`): what is written to the
/// BPF arrays.
/// Page and row indices are relative to this table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PagedTable {
    /// ELF virtual address of page 0.
    pub base: u64,
    /// ELF virtual address just past the last row's start.
    pub end: u64,
    pub pages: Vec<UnwindPage>,
    pub rows: Vec<UnwindRow>,
    /// Rows whose rule did not fit in the rule set (they walk frame
    /// pointers instead).
    pub rules_full: u64,
}

/// Most pages one table may span (4 GiB of address space).
const MAX_PAGES_PER_TABLE: u64 = 1 << 20;

impl PagedTable {
    /// Cuts `table` into pages, interning its rules into `rules`. None for
    /// an empty table or one spanning more than 4 GiB.
    pub fn build(table: &ObjectTable, rules: &mut RuleSet) -> Option<PagedTable> {
        let first = table.rows.first()?;
        let last = table.rows.last()?;
        let base = first.address & !((1u64 << UNWIND_PAGE_SHIFT) - 1);
        let page_count = ((last.address - base) >> UNWIND_PAGE_SHIFT) + 1;
        if page_count > MAX_PAGES_PER_TABLE {
            return None;
        }
        let mut paged = PagedTable {
            base,
            end: last.address + 1,
            pages: vec![UnwindPage::default(); page_count as usize],
            rows: Vec::with_capacity(table.rows.len() + page_count as usize),
            rules_full: 0,
        };
        let mut carried: u16 = 0;
        let mut i = 0;
        for page in 0..page_count {
            let page_start = base + (page << UNWIND_PAGE_SHIFT);
            let page_end = page_start + (1 << UNWIND_PAGE_SHIFT);
            let first_row = paged.rows.len();
            let mut page_rows: Vec<UnwindRow> = Vec::new();
            // Every page with rows starts with one at offset 0.
            let starts_on_page = table.rows.get(i).is_some_and(|r| r.address == page_start);
            if !starts_on_page {
                page_rows.push(UnwindRow {
                    pc_low: 0,
                    rule: carried,
                });
            }
            while let Some(row) = table.rows.get(i).filter(|r| r.address < page_end) {
                let rule = rules.intern(row.rule).unwrap_or_else(|| {
                    paged.rules_full += 1;
                    0
                });
                page_rows.push(UnwindRow {
                    pc_low: (row.address - page_start) as u16,
                    rule,
                });
                carried = rule;
                i += 1;
            }
            // A page that only walks frame pointers needs no rows.
            if page_rows.iter().all(|r| r.rule == 0) {
                continue;
            }
            paged.rows.extend(page_rows);
            paged.pages[page as usize] = UnwindPage {
                first_row: first_row as u32,
                row_count: (paged.rows.len() - first_row) as u32,
            };
        }
        Some(paged)
    }

    /// The rule index for an ELF virtual address, found the way the BPF
    /// walker finds it (tests).
    pub fn rule_index_at(&self, address: u64) -> u16 {
        let Some(offset) = address.checked_sub(self.base) else {
            return 0;
        };
        let Some(page) = self.pages.get((offset >> UNWIND_PAGE_SHIFT) as usize) else {
            return 0;
        };
        if page.row_count == 0 {
            return 0;
        }
        let rows = &self.rows[page.first_row as usize..(page.first_row + page.row_count) as usize];
        let low = (offset & ((1 << UNWIND_PAGE_SHIFT) - 1)) as u16;
        let i = rows.partition_point(|r| r.pc_low <= low);
        rows[i.saturating_sub(1)].rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::unwind::{RULE_CFA_SP, RULE_ROOT};

    fn sp(offset: i32) -> UnwindRule {
        UnwindRule {
            kind: RULE_CFA_SP,
            cfa_offset: offset,
            ra_offset: -8,
            ..Default::default()
        }
    }

    fn row(address: u64, rule: UnwindRule) -> TableRow {
        TableRow { address, rule }
    }

    #[test]
    fn repeated_rules_and_leading_gaps_are_dropped() {
        let gap = UnwindRule::default();
        let table = ObjectTable::from_sorted([
            row(0x1000, gap),
            row(0x1010, sp(8)),
            row(0x1011, sp(8)),
            row(0x1012, sp(16)),
            row(0x1012, sp(24)),
            row(0x1020, gap),
        ]);
        assert_eq!(
            table.rows,
            vec![row(0x1010, sp(8)), row(0x1012, sp(24)), row(0x1020, gap)]
        );
        assert_eq!(table.rule_at(0x1011), Some(sp(8)));
        assert_eq!(table.rule_at(0x100f), None);
    }

    #[test]
    fn pages_carry_the_rule_across_their_boundary() {
        // Addresses as page P + offset.
        const P: u64 = 1 << UNWIND_PAGE_SHIFT;
        let at = |page: u64, offset: u64| page * P + offset;
        let gap = UnwindRule::default();
        let table = ObjectTable::from_sorted([
            row(at(1, P - 16), sp(8)),
            row(at(1, P - 12), sp(16)),
            // Nothing starts on page 2: sp(16) carries over.
            row(at(2, 0x100), sp(8)),
            row(at(2, 0x200), gap),
            // Page 3 walks frame pointers only: no rows.
            row(at(4, 8), row_root()),
            row(at(4, 16), gap),
        ]);
        let mut rules = RuleSet::default();
        let paged = PagedTable::build(&table, &mut rules).unwrap();
        assert_eq!(paged.base, P);
        assert_eq!(paged.pages.len(), 4);
        assert_eq!(paged.pages[2].row_count, 0, "{paged:?}");
        for (address, expected) in [
            (at(1, 0), 0u16),
            (at(1, P - 16), rules.intern(sp(8)).unwrap()),
            (at(1, P - 1), rules.intern(sp(16)).unwrap()),
            (at(2, 0), rules.intern(sp(16)).unwrap()),
            (at(2, 0x150), rules.intern(sp(8)).unwrap()),
            (at(2, 0x200), 0),
            (at(3, 0x123), 0),
            (at(4, 0), 0),
            (at(4, 9), rules.intern(row_root()).unwrap()),
            (at(4, 16), 0),
            (at(9, 0), 0),
        ] {
            assert_eq!(paged.rule_index_at(address), expected, "{address:#x}");
        }
        // Rules are shared: interning again adds nothing.
        assert_eq!(rules.len(), 4);
    }

    fn row_root() -> UnwindRule {
        UnwindRule {
            kind: RULE_ROOT,
            ..Default::default()
        }
    }

    #[test]
    fn overlay_replaces_a_range() {
        let gap = UnwindRule::default();
        let cfi =
            ObjectTable::from_sorted([row(0x100, sp(8)), row(0x200, sp(16)), row(0x400, gap)]);
        let go = ObjectTable::from_sorted([row(0x180, sp(40)), row(0x300, gap)]);
        let merged = cfi.overlay(&go, 0x180, 0x300);
        assert_eq!(
            merged.rows,
            vec![
                row(0x100, sp(8)),
                row(0x180, sp(40)),
                row(0x300, sp(16)),
                row(0x400, gap)
            ]
        );
    }
}

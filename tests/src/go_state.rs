//! Comparing what the agent reads of a Go runtime (`heap`, `goroutines`)
//! with what the program itself writes (tests/e2e/go_state.rs, and the
//! arm64 lane).

use std::collections::{BTreeMap, HashMap};

use crate::pprof_raw::RawProfile;

/// Per leaf function of the program (`main.*`), the sum of sample value
/// `index`.
pub fn by_leaf(profile: &RawProfile, index: usize) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    for (stack, sample) in profile.lined_stacks().iter().zip(&profile.samples) {
        let Some((leaf, _)) = stack.frames.first() else {
            continue;
        };
        if leaf.function.starts_with("main.") {
            *sums.entry(leaf.function.clone()).or_default() += sample.values[index];
        }
    }
    sums
}

/// `by_leaf` without the sites that count nothing: a record that holds
/// nothing yet (its bucket made after the program wrote its own profile,
/// its counts not yet published by a collection) shows in no view.
pub fn nonzero(mut sums: BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    sums.retain(|_, sum| *sum != 0);
    sums
}

/// A `debug=2` dump as goroutine id → its text, with each frame's
/// arguments (run-specific values that we do not read) reduced to
/// `(...)`.
pub fn dump_by_goroutine(text: &str) -> HashMap<u64, String> {
    let mut goroutines = HashMap::new();
    for block in text.split("\n\n") {
        let Some(id) = block
            .strip_prefix("goroutine ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|id| id.parse().ok())
        else {
            continue;
        };
        let lines: Vec<String> = block
            .lines()
            .map(|line| {
                if line.starts_with('\t')
                    || line.starts_with("goroutine ")
                    || line.starts_with("created by")
                {
                    return line.to_string();
                }
                match arguments_start(line) {
                    Some(open) => format!("{}(...)", &line[..open]),
                    None => line.to_string(),
                }
            })
            .collect();
        goroutines.insert(id, lines.join("\n").trim_end().to_string());
    }
    goroutines
}

/// Where a frame line's argument list begins: the '(' matching its last
/// ')'.
fn arguments_start(line: &str) -> Option<usize> {
    if !line.ends_with(')') {
        return None;
    }
    let mut depth = 0;
    for (i, c) in line.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

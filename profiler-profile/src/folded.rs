//! Folded stacks: `comm;root;...;leaf count`, the input of flamegraph.pl,
//! inferno and speedscope. Kernel frames carry perf's `_[k]` suffix. The
//! count is samples in a CPU profile, and microseconds in off-CPU and
//! wall-clock profiles (`ProfileKind::view_unit`), as bcc's offcputime
//! writes them.

use std::collections::BTreeMap;

use super::{Profile, Sample};

/// One folded line's stack part for `sample` (without the count).
pub fn stack_line(profile: &Profile, sample: &Sample) -> String {
    let mut line = String::new();
    for key in &profile.stack_labels {
        if let Some(value) = sample.label(key) {
            push_clean(&mut line, &format!("{key}={value}"));
            line.push(';');
        }
    }
    push_clean(&mut line, sample.label("comm").unwrap_or("[unknown]"));
    for (name, kernel) in profile.stack_names(sample) {
        line.push(';');
        push_clean(&mut line, name);
        if kernel {
            line.push_str("_[k]");
        }
    }
    line
}

/// Appends `text` to a folded line: ';' (which separates frames) as ':',
/// and control characters (a newline would end the line; a process sets
/// its own comm and may forge its runtime's names) as '?'. The count's
/// space is found from the right by every reader, so spaces stay.
fn push_clean(line: &mut String, text: &str) {
    line.extend(text.chars().map(|c| match c {
        ';' => ':',
        c if c.is_control() => '?',
        c => c,
    }));
}

/// The whole profile as folded text, identical stacks merged, sorted;
/// stacks that round to nothing left out.
pub fn encode(profile: &Profile) -> String {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for sample in &profile.samples {
        let value = profile.view_value(sample);
        if value > 0 {
            *merged.entry(stack_line(profile, sample)).or_default() += value;
        }
    }
    let mut text = String::new();
    for (stack, total) in merged {
        let count = profile.view_units(total);
        if count == 0 {
            continue;
        }
        text.push_str(&stack);
        text.push(' ');
        text.push_str(&count.to_string());
        text.push('\n');
    }
    text
}

//! SVG flame graphs through inferno, from the folded view.

use super::{Profile, folded};

pub fn encode(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let text = folded::encode(profile);
    let mut options = inferno::flamegraph::Options::default();
    options.title = "CPU profile".to_string();
    options.count_name = "samples".to_string();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg)
        .map_err(std::io::Error::other)?;
    Ok(svg)
}

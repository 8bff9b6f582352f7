//! SVG flame graphs through inferno, from the folded view.

use inferno::flamegraph::color::{BasicPalette, Palette};

use super::{Profile, ProfileKind, folded};

pub fn encode(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let text = folded::encode(profile);
    let mut options = inferno::flamegraph::Options::default();
    options.count_name = profile.kind.view_unit().to_string();
    match profile.kind {
        ProfileKind::Cpu => options.title = "CPU profile".to_string(),
        ProfileKind::OffCpu => {
            options.title = "Off-CPU time (blocked and waiting for a CPU)".to_string();
            // Blue, as flamegraph.pl --colors=io draws off-CPU graphs.
            options.colors = Palette::Basic(BasicPalette::Io);
        }
        ProfileKind::Wall => {
            options.title = "Wall-clock time (on-CPU and off-CPU)".to_string();
        }
        ProfileKind::Latency => {
            options.title = "Latency by where operations began".to_string();
            options.colors = Palette::Basic(BasicPalette::Io);
        }
        ProfileKind::Heap => {
            options.title = "Heap in use by where it was allocated".to_string();
            options.colors = Palette::Basic(BasicPalette::Mem);
        }
        ProfileKind::Goroutine => options.title = "Goroutines".to_string(),
        ProfileKind::PageFaults => {
            options.title = "Page faults: where memory is first touched".to_string();
            options.colors = Palette::Basic(BasicPalette::Mem);
        }
    }
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg)
        .map_err(std::io::Error::other)?;
    Ok(svg)
}

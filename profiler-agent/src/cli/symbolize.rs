//! `profiler-agent symbolize`: addresses → frames, through the same
//! symbolizer the profiler uses.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;

use profiler_symbolize::process::{ObjectFile, ProcessTable};
use profiler_symbolize::{Symbolized, Symbolizer};

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:\n  \
    profiler-agent symbolize --binary ./server 0x4a2f10 0x4a3000\n  \
    profiler-agent symbolize --pid 1234 0x7f3a12b4c5d6 --format json")]
pub struct SymbolizeArgs {
    /// The binary the addresses belong to; addresses are its ELF virtual
    /// addresses (as `nm`, `objdump` and `addr2line` use).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "pid",
        required_unless_present = "pid"
    )]
    pub binary: Option<PathBuf>,

    /// A running process; addresses are runtime addresses in it.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,

    #[command(flatten)]
    pub debuginfod: super::DebuginfodArgs,

    /// Addresses in hex (0x prefix optional).
    #[arg(required = true, value_name = "ADDR", value_parser = parse_address)]
    pub addresses: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

pub(super) fn parse_address(text: &str) -> Result<u64, String> {
    let hex = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u64::from_str_radix(hex, 16).map_err(|_| format!("{text:?} is not a hex address"))
}

#[derive(Serialize)]
struct AddressFrames {
    address: String,
    frames: Vec<JsonFrame>,
}

#[derive(Serialize)]
struct JsonFrame {
    function: String,
    file: Option<String>,
    line: Option<u32>,
    inlined: bool,
    /// Where the name came from: symtab, dynsym, dwarf, debuginfod,
    /// minidebuginfo, cfi-grouped, go-pclntab, kallsyms, perf-map, vdso,
    /// or none.
    source: &'static str,
}

/// Resolves `addresses` in ascending order (neighbouring addresses share
/// a compilation unit, which the DWARF resolver then parses once), and
/// answers in the order given.
fn in_address_order(
    addresses: &[u64],
    mut resolve: impl FnMut(u64) -> Symbolized,
) -> Vec<(u64, Symbolized)> {
    let mut order: Vec<usize> = (0..addresses.len()).collect();
    order.sort_by_key(|&i| addresses[i]);
    let mut results: Vec<Option<Symbolized>> = vec![None; addresses.len()];
    for i in order {
        results[i] = Some(resolve(addresses[i]));
    }
    addresses
        .iter()
        .zip(results)
        .filter_map(|(&a, r)| Some((a, r?)))
        .collect()
}

pub fn run(args: &SymbolizeArgs) -> anyhow::Result<()> {
    args.debuginfod.configure();
    let mut symbolizer = profiler_runtimes::symbolizer();
    symbolizer.fetch_deadline = Some(std::time::Instant::now() + args.debuginfod.debuginfod_wait);
    let results = symbolize(args, &mut symbolizer)?;
    // Debug files a server could not give are warnings: the names come
    // from what else there is.
    for problem in symbolizer.debuginfod.iter().flat_map(|d| d.problems()) {
        eprintln!("warning: {problem}");
    }
    print(args, &results)
}

fn symbolize(
    args: &SymbolizeArgs,
    symbolizer: &mut Symbolizer,
) -> anyhow::Result<Vec<(u64, Symbolized)>> {
    let results: Vec<(u64, Symbolized)> = match (&args.binary, args.pid) {
        (Some(path), _) => {
            let file = ObjectFile::open_path(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let results =
                in_address_order(&args.addresses, |a| symbolizer.object_address(&file, a));
            if let Some(problem) = symbolizer.problems.first() {
                bail!("{problem}");
            }
            results
        }
        (None, Some(pid)) => {
            let mut processes = ProcessTable::default();
            processes.observe(pid, &[]);
            let process = processes.get(pid).filter(|p| p.captured).with_context(|| {
                format!(
                    "cannot read /proc/{pid}/maps: no such process, or not permitted (run as root)"
                )
            })?;
            in_address_order(&args.addresses, |a| symbolizer.user(Some(process), a, a))
        }
        (None, None) => bail!("give --binary PATH or --pid PID"),
    };
    Ok(results)
}

fn print(args: &SymbolizeArgs, results: &[(u64, Symbolized)]) -> anyhow::Result<()> {
    match args.format {
        OutputFormat::Text => {
            // One buffered writer: a line-buffered stdout costs a write
            // per frame, more than symbolizing it.
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for (address, symbolized) in results {
                for frame in &symbolized.frames {
                    let location = match (&frame.file, frame.line) {
                        (Some(file), Some(line)) => format!("{file}:{line}"),
                        (Some(file), None) => format!("{file}:?"),
                        _ => "??:?".to_string(),
                    };
                    let inlined = if frame.inlined { " (inlined)" } else { "" };
                    writeln!(out, "{address:#x} {} {location}{inlined}", frame.function)?;
                }
            }
            out.flush()?;
        }
        OutputFormat::Json => {
            let json: Vec<AddressFrames> = results
                .iter()
                .map(|(address, symbolized)| AddressFrames {
                    address: format!("{address:#x}"),
                    frames: symbolized
                        .frames
                        .iter()
                        .map(|f| JsonFrame {
                            function: f.function.clone(),
                            file: f.file.clone(),
                            line: f.line,
                            inlined: f.inlined,
                            source: f.source.as_str(),
                        })
                        .collect(),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
    }
    Ok(())
}

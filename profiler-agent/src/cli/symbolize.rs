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
    profiler-agent symbolize --pid 1234 0x7f3a12b4c5d6 --format json\n  \
    nm -S ./server | awk '{print $1}' | profiler-agent symbolize --binary ./server")]
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

    /// Addresses in hex (0x prefix optional). Without any, they are read
    /// from standard input, separated by white space (as addr2line reads
    /// them).
    #[arg(value_name = "ADDR", value_parser = parse_address)]
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
fn in_address_order<T>(addresses: &[u64], mut resolve: impl FnMut(u64) -> T) -> Vec<T> {
    let mut order: Vec<usize> = (0..addresses.len()).collect();
    order.sort_unstable_by_key(|&i| addresses[i]);
    let mut results: Vec<Option<T>> = (0..addresses.len()).map(|_| None).collect();
    for i in order {
        results[i] = Some(resolve(addresses[i]));
    }
    results.into_iter().flatten().collect()
}

pub fn run(args: &SymbolizeArgs) -> anyhow::Result<()> {
    args.debuginfod.configure();
    let mut symbolizer = profiler_runtimes::symbolizer();
    symbolizer.fetch_deadline = Some(std::time::Instant::now() + args.debuginfod.debuginfod_wait);
    let from_stdin;
    let addresses = if args.addresses.is_empty() {
        from_stdin = read_addresses(std::io::stdin().lock())?;
        &from_stdin
    } else {
        &args.addresses
    };
    // Text is formatted as each address is resolved, into one buffer: a
    // few bytes an address, where holding every address's frames until
    // all are resolved, then reading them in the order given, cost more
    // than resolving them (memory scattered over tens of MiB), and a
    // buffer of its own per address cost a tenth of the run in malloc
    // and free.
    let mut text = Vec::new();
    let printed = match args.format {
        OutputFormat::Text => symbolize(args, addresses, &mut symbolizer, |a, s| {
            let start = text.len();
            text_lines(&mut text, a, s);
            start..text.len()
        })
        .map(|lines| print_text(&text, &lines)),
        OutputFormat::Json => symbolize(args, addresses, &mut symbolizer, |a, s| (a, s))
            .map(|results| print_json(&results)),
    }?;
    // Debug files a server could not give are warnings: the names come
    // from what else there is.
    for problem in symbolizer.debuginfod.iter().flat_map(|d| d.problems()) {
        eprintln!("warning: {problem}");
    }
    match printed {
        // The reader went away (`| head`): what it wanted was written.
        Err(error)
            if error
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Hex addresses separated by white space, as `addr2line` reads them.
fn read_addresses(mut input: impl std::io::Read) -> anyhow::Result<Vec<u64>> {
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .context("reading addresses from standard input")?;
    let addresses = text
        .split_whitespace()
        .map(|word| parse_address(word).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<u64>>>()?;
    if addresses.is_empty() {
        bail!("no addresses: give them as arguments or on standard input");
    }
    Ok(addresses)
}

/// Resolves `addresses` and hands each result to `keep`; what it keeps,
/// in the order given.
fn symbolize<T>(
    args: &SymbolizeArgs,
    addresses: &[u64],
    symbolizer: &mut Symbolizer,
    mut keep: impl FnMut(u64, Symbolized) -> T,
) -> anyhow::Result<Vec<T>> {
    let results = match (&args.binary, args.pid) {
        (Some(path), _) => {
            let file = ObjectFile::open_path(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let results =
                in_address_order(addresses, |a| keep(a, symbolizer.object_address(&file, a)));
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
            in_address_order(addresses, |a| keep(a, symbolizer.user(Some(process), a, a)))
        }
        (None, None) => bail!("give --binary PATH or --pid PID"),
    };
    Ok(results)
}

/// Appends an address's lines of text output to `out`: one per frame,
/// innermost first.
fn text_lines(out: &mut Vec<u8>, address: u64, symbolized: Symbolized) {
    for frame in &symbolized.frames {
        // Strings written as bytes: through `{}` each one is padded and
        // measured, a fifth of the run.
        let _ = write!(out, "{address:#x} ");
        out.extend_from_slice(frame.function.as_bytes());
        out.push(b' ');
        match (&frame.file, frame.line) {
            (Some(file), line) => {
                out.extend_from_slice(file.as_bytes());
                match line {
                    Some(line) => {
                        let _ = write!(out, ":{line}");
                    }
                    None => out.extend_from_slice(b":?"),
                }
            }
            _ => out.extend_from_slice(b"??:?"),
        }
        out.extend_from_slice(if frame.inlined {
            b" (inlined)\n"
        } else {
            b"\n"
        });
    }
}

/// Writes each address's lines (`lines`, ranges of `text`) in the order
/// the addresses were given.
fn print_text(text: &[u8], lines: &[std::ops::Range<usize>]) -> anyhow::Result<()> {
    // One buffered writer: a line-buffered stdout costs a write per
    // frame, more than symbolizing it.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in lines {
        out.write_all(&text[line.clone()])?;
    }
    out.flush()?;
    Ok(())
}

fn print_json(results: &[(u64, Symbolized)]) -> anyhow::Result<()> {
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
    // Serialized first, so that writing fails as an io::Error (a closed
    // pipe is then quiet, as for text).
    let mut text = serde_json::to_string_pretty(&json)?;
    text.push('\n');
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_on_standard_input_are_read_as_addr2line_reads_them() {
        let read = read_addresses("0x401000\n401a2f  0X10\t\n".as_bytes()).unwrap();
        assert_eq!(read, [0x401000, 0x401a2f, 0x10]);
        let error = read_addresses("0x401000 main\n".as_bytes()).unwrap_err();
        assert!(error.to_string().contains("\"main\""), "{error}");
        let error = read_addresses("\n".as_bytes()).unwrap_err();
        assert!(error.to_string().contains("no addresses"), "{error}");
    }
}

//! `profiler-agent probes list PATH | --pid N`: the USDT probes of a binary,
//! or of everything a running process maps.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use profiler_probes::functions::FunctionTable;
use profiler_probes::target::mapped_objects;
use profiler_probes::{ArgSpec, Semaphore, UsdtError, UsdtProbes, read_probes, read_probes_as};

#[derive(Debug, Args)]
pub struct ProbesArgs {
    #[command(subcommand)]
    command: ProbesCommand,
}

#[derive(Debug, Subcommand)]
enum ProbesCommand {
    /// List the USDT probes (.note.stapsdt) of a binary or of a running
    /// process's executable and shared libraries.
    #[command(after_help = "Examples:\n  \
        profiler-agent probes list /usr/bin/python3.11\n  \
        profiler-agent probes list --functions 'shop::Register::*' ./server\n  \
        profiler-agent probes list --pid 1234 --format json")]
    List(ListArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["path", "pid"])))]
struct ListArgs {
    /// The executable or shared library to read.
    #[arg(value_name = "PATH")]
    path: Option<PathBuf>,

    /// Read the executable and every shared object this process maps
    /// (through /proc/PID/root, so containers work).
    #[arg(short, long, value_name = "PID")]
    pid: Option<u32>,

    /// List the functions matching PATTERN instead (what a
    /// `uprobe:PATH:PATTERN` spec would attach to): a glob or a name,
    /// compared with mangled and demangled names (`'shop::Register::*'`),
    /// from the symbol tables, or a Go binary's pclntab (stripped too).
    #[arg(long, value_name = "PATTERN", conflicts_with = "pid")]
    functions: Option<String>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

pub fn run(args: &ProbesArgs) -> anyhow::Result<()> {
    match &args.command {
        ProbesCommand::List(list) => run_list(list),
    }
}

fn run_list(args: &ListArgs) -> anyhow::Result<()> {
    if let Some(pattern) = &args.functions {
        let path = args
            .path
            .as_deref()
            .context("--functions needs the binary's PATH")?;
        return list_functions(path, pattern, args.format);
    }
    let files = match (&args.path, args.pid) {
        (Some(path), _) => vec![read_path(path)?],
        (None, Some(pid)) => read_process(pid)?,
        (None, None) => bail!("name a binary (PATH) or a process (--pid N)"),
    };
    for file in &files {
        for skipped in &file.skipped {
            eprintln!("warning: {skipped}");
        }
    }
    let mut stdout = std::io::stdout().lock();
    match args.format {
        Format::Text => write_text(&mut stdout, &files)?,
        Format::Json => {
            let listing: Vec<JsonFile> = files.iter().map(JsonFile::from).collect();
            serde_json::to_writer_pretty(&mut stdout, &listing)?;
            writeln!(stdout)?;
        }
    }
    Ok(())
}

fn read_path(path: &Path) -> anyhow::Result<UsdtProbes> {
    read_probes(path).map_err(|error| match error {
        UsdtError::NoNotes { .. } => anyhow::anyhow!(
            "{error}; probes are compiled in from <sys/sdt.h> macros: if they are in a library \
             the program loads, list the library's path, or the running process with \
             `profiler-agent probes list --pid PID`"
        ),
        other => anyhow::Error::new(other),
    })
}

fn read_process(pid: u32) -> anyhow::Result<Vec<UsdtProbes>> {
    let objects = mapped_objects(Path::new("/proc"), pid)?;
    let mut files = Vec::new();
    let mut unreadable = Vec::new();
    for object in &objects {
        match read_probes_as(&object.open_path, &object.path) {
            Ok(probes) => files.push(probes),
            Err(UsdtError::NoNotes { .. }) => {}
            Err(error) => unreadable.push(error),
        }
    }
    for error in &unreadable {
        eprintln!("warning: pid {pid}: {error}");
    }
    if files.is_empty() {
        let names: Vec<String> = objects
            .iter()
            .map(|o| o.path.display().to_string())
            .collect();
        bail!(
            "pid {pid} maps no object with USDT probes (.note.stapsdt); checked {} file(s): {}",
            objects.len(),
            names.join(", ")
        );
    }
    Ok(files)
}

fn write_text(out: &mut impl Write, files: &[UsdtProbes]) -> anyhow::Result<()> {
    for (i, file) in files.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        writeln!(
            out,
            "{} ({} probe sites)",
            file.path.display(),
            file.probes.len()
        )?;
        let header = [
            "PROVIDER",
            "NAME",
            "ADDRESS",
            "OFFSET",
            "SEMAPHORE",
            "ARGUMENTS",
        ];
        let rows: Vec<[String; 6]> = file
            .probes
            .iter()
            .map(|p| {
                [
                    p.provider.clone(),
                    p.name.clone(),
                    format!("{:#x}", p.address),
                    format!("{:#x}", p.file_offset),
                    match p.semaphore {
                        Some(s) => format!("yes {:#x}", s.address),
                        None => "no".to_string(),
                    },
                    p.args.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: [&str; 6]| {
            let mut text = String::from(" ");
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    text.push_str(&format!(" {cell}"));
                } else {
                    text.push_str(&format!(" {cell:<w$}", w = widths[i]));
                }
            }
            text.trim_end().to_string()
        };
        writeln!(out, "{}", line(header))?;
        for row in &rows {
            writeln!(out, "{}", line(row.each_ref().map(String::as_str)))?;
        }
    }
    out.flush().context("writing the listing")
}

/// `probes list --functions PATTERN PATH`.
fn list_functions(path: &Path, pattern: &str, format: Format) -> anyhow::Result<()> {
    let table = FunctionTable::read(path, path)?;
    let functions = table.list(pattern)?;
    let mut stdout = std::io::stdout().lock();
    match format {
        Format::Text => {
            writeln!(
                stdout,
                "{} ({} functions match {pattern:?})",
                path.display(),
                functions.len()
            )?;
            writeln!(stdout, "  {:<18} {:>8}  NAME", "ADDRESS", "SIZE")?;
            for f in &functions {
                let stored = if f.name == f.demangled {
                    String::new()
                } else {
                    format!("  ({})", f.name)
                };
                writeln!(
                    stdout,
                    "  {:<18} {:>8}  {}{stored}",
                    format!("{:#x}", f.address),
                    f.size,
                    f.demangled
                )?;
            }
        }
        Format::Json => {
            let listing: Vec<JsonFunction> = functions
                .iter()
                .map(|f| JsonFunction {
                    name: &f.demangled,
                    symbol: &f.name,
                    address: f.address,
                    size: f.size,
                    file_offset: f.file_offset,
                })
                .collect();
            serde_json::to_writer_pretty(&mut stdout, &listing)?;
            writeln!(stdout)?;
        }
    }
    stdout.flush().context("writing the listing")
}

#[derive(Serialize)]
struct JsonFunction<'a> {
    /// Demangled, with parameters.
    name: &'a str,
    /// As stored in the symbol table.
    symbol: &'a str,
    address: u64,
    size: u64,
    file_offset: u64,
}

#[derive(Serialize)]
struct JsonFile<'a> {
    path: String,
    arch: Option<profiler_probes::Arch>,
    probes: Vec<JsonProbe<'a>>,
    skipped: Vec<String>,
}

#[derive(Serialize)]
struct JsonProbe<'a> {
    provider: &'a str,
    name: &'a str,
    args: &'a str,
    address: u64,
    file_offset: u64,
    semaphore: Option<Semaphore>,
    arguments: Option<&'a [ArgSpec]>,
    arguments_error: Option<String>,
}

impl<'a> From<&'a UsdtProbes> for JsonFile<'a> {
    fn from(file: &'a UsdtProbes) -> Self {
        JsonFile {
            path: file.path.display().to_string(),
            arch: file.arch,
            probes: file
                .probes
                .iter()
                .map(|p| JsonProbe {
                    provider: &p.provider,
                    name: &p.name,
                    args: &p.args,
                    address: p.address,
                    file_offset: p.file_offset,
                    semaphore: p.semaphore,
                    arguments: p.arguments.as_deref().ok(),
                    arguments_error: p.arguments.as_ref().err().map(ToString::to_string),
                })
                .collect(),
            skipped: file.skipped.iter().map(ToString::to_string).collect(),
        }
    }
}

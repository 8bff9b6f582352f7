//! `profiler-agent tables`: the unwind tables the profiler would load for
//! binaries, and the rule at an address (what `readelf --debug-dump=frames-interp`
//! shows for CFI, as the BPF walker will follow it).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use profiler_common::unwind::{
    RULE_CFA_DEREF_FP, RULE_CFA_FP, RULE_CFA_SP, RULE_FLAG_FP_FROM_FP, RULE_FLAG_FP_LOST,
    RULE_FLAG_GO_INJECTED_CALL, RULE_FLAG_UNSUPPORTED, RULE_FRAME_POINTER, RULE_GO_CGOCALL,
    RULE_GO_CGOCALLBACK, RULE_PLT, RULE_ROOT, RULE_SIGNAL, RULE_STOP, UnwindPage, UnwindRow,
    UnwindRule,
};
use serde::Serialize;

use super::symbolize::OutputFormat;
use profiler_unwind::build::{TableSource, build_bytes};
use profiler_unwind::table::{PagedTable, RuleSet};

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:\n  \
    profiler-agent tables /usr/lib/x86_64-linux-gnu/libc.so.6\n  \
    profiler-agent tables ./server --at 0x4a2f10 --at 0x4a3000\n  \
    profiler-agent tables --format json /usr/bin/python3.11")]
pub struct TablesArgs {
    /// Binaries or shared libraries.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Also print the rule at this ELF virtual address (hex; repeat).
    #[arg(long = "at", value_name = "ADDR", value_parser = super::symbolize::parse_address)]
    pub at: Vec<u64>,

    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

#[derive(Serialize)]
struct TableReport {
    path: String,
    source: String,
    fdes: u64,
    rows: u64,
    pages: u64,
    rules: u64,
    /// Kernel memory the table takes: 4 bytes a row, 8 a page (rules are
    /// shared node-wide and not counted).
    bytes: u64,
    build_ms: f64,
    unsupported_rows: u64,
    bad_fdes: u64,
    rules_at: Vec<RuleAt>,
    /// Go binaries on x86-64: where a caller (a return address) is stepped
    /// by its frame record instead of its rule, [start, end).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    frame_record_callers: Vec<CodeSpan>,
    /// Go binaries: where the runtime keeps goroutines and their pprof
    /// labels, as the sampling program will read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    go_runtime: Option<GoRuntime>,
}

#[derive(Serialize)]
struct GoRuntime {
    version: Option<String>,
    g_m: u16,
    g_goid: u16,
    g_labels: u16,
    m_curg: u16,
    labels: &'static str,
    tls_g_offset: Option<i64>,
    source: &'static str,
    /// Read from DWARF: whether the table for binaries without DWARF has
    /// the same offsets for this version (None: no row for it).
    version_table_agrees: Option<bool>,
}

fn go_runtime(data: &[u8]) -> Option<GoRuntime> {
    use profiler_runtimes::go::labels::{LabelStorage, LayoutSource};
    let layout = profiler_runtimes::go::labels::read_layout(data).ok()?;
    Some(GoRuntime {
        version: layout.version.clone(),
        g_m: layout.offsets.g_m,
        g_goid: layout.offsets.g_goid,
        g_labels: layout.offsets.g_labels,
        m_curg: layout.offsets.m_curg,
        labels: match layout.storage {
            LabelStorage::Map => "map",
            LabelStorage::Slice => "sorted slice",
        },
        tls_g_offset: layout.tls_g_offset,
        source: match layout.source {
            LayoutSource::Dwarf => "DWARF",
            LayoutSource::VersionTable => "Go version table",
        },
        version_table_agrees: match layout.source {
            LayoutSource::Dwarf => profiler_runtimes::go::labels::table_agrees(&layout),
            LayoutSource::VersionTable => None,
        },
    })
}

#[derive(Serialize)]
struct CodeSpan {
    start: String,
    end: String,
}

#[derive(Serialize)]
struct RuleAt {
    address: String,
    rule: String,
}

pub fn run(args: &TablesArgs) -> anyhow::Result<()> {
    let mut reports = Vec::new();
    for path in &args.paths {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let started = Instant::now();
        let built = build_bytes(&data, profiler_runtimes::unwind_rows())
            .with_context(|| format!("{}", path.display()))?;
        let mut rules = RuleSet::default();
        let paged = PagedTable::build(&built.table, &mut rules)
            .with_context(|| format!("{}: the table spans more than 4 GiB", path.display()))?;
        let build_ms = started.elapsed().as_secs_f64() * 1e3;
        let rules_at = args
            .at
            .iter()
            .map(|&address| RuleAt {
                address: format!("{address:#x}"),
                rule: describe(&built.table.rule_at(address).unwrap_or_default()),
            })
            .collect();
        reports.push(TableReport {
            path: path.display().to_string(),
            source: source_name(built.source).into(),
            fdes: built.cfi.fdes,
            rows: paged.rows.len() as u64,
            pages: paged.pages.len() as u64,
            rules: rules.len() as u64,
            bytes: (paged.rows.len() * size_of::<UnwindRow>()
                + paged.pages.len() * size_of::<UnwindPage>()) as u64,
            build_ms,
            unsupported_rows: built.cfi.unsupported_rows,
            bad_fdes: built.cfi.bad_fdes,
            rules_at,
            frame_record_callers: built
                .frame_record_callers
                .iter()
                .map(|&(start, end)| CodeSpan {
                    start: format!("{start:#x}"),
                    end: format!("{end:#x}"),
                })
                .collect(),
            go_runtime: go_runtime(&data),
        });
    }
    match args.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
        OutputFormat::Text => {
            for r in &reports {
                println!(
                    "{}: {} ({} FDEs), {} rows in {} pages, {} distinct rules, {:.1} KiB, \
                     built in {:.1} ms; {} rows the walker does not model, {} malformed FDEs",
                    r.path,
                    r.source,
                    r.fdes,
                    r.rows,
                    r.pages,
                    r.rules,
                    r.bytes as f64 / 1024.0,
                    r.build_ms,
                    r.unsupported_rows,
                    r.bad_fdes
                );
                for at in &r.rules_at {
                    println!("  {}: {}", at.address, at.rule);
                }
                if !r.frame_record_callers.is_empty() {
                    let spans: Vec<String> = r
                        .frame_record_callers
                        .iter()
                        .map(|span| format!("[{}, {})", span.start, span.end))
                        .collect();
                    println!(
                        "  Go callers stepped by their frame records in: {}",
                        spans.join(" ")
                    );
                }
                if let Some(go) = &r.go_runtime {
                    let agrees = match go.version_table_agrees {
                        Some(true) => " (the version table agrees)",
                        Some(false) => " (the version table DISAGREES)",
                        None => "",
                    };
                    let tls = match go.tls_g_offset {
                        Some(offset) => format!("g at TLS{offset:+}"),
                        None => "g from its register".into(),
                    };
                    println!(
                        "  Go runtime {}: g.m={} g.goid={} g.labels={} m.curg={}, labels in a {}, \
                         {tls}; from {}{agrees}",
                        go.version.as_deref().unwrap_or("of unknown version"),
                        go.g_m,
                        go.g_goid,
                        go.g_labels,
                        go.m_curg,
                        go.labels,
                        go.source,
                    );
                }
            }
        }
    }
    Ok(())
}

fn source_name(source: TableSource) -> &'static str {
    match source {
        TableSource::EhFrame => ".eh_frame",
        TableSource::DebugFrame => ".debug_frame",
        TableSource::DebugFileFrame => ".debug_frame of the separate debug file",
        TableSource::GoPcsp => "Go pclntab (pcsp)",
        TableSource::GoPcspAndCfi => "Go pclntab (pcsp) and .eh_frame",
        TableSource::CfiWithInterpreter => ".eh_frame, CPython's eval loop marked",
    }
}

/// A rule in readelf's terms: `CFA=sp+16 ra=[CFA-8] fp=[CFA-16]`.
pub fn describe(rule: &UnwindRule) -> String {
    let fp = if rule.flags & RULE_FLAG_FP_LOST != 0 {
        "fp=lost".to_string()
    } else if rule.flags & RULE_FLAG_FP_FROM_FP != 0 {
        format!("fp=[fp{:+}]", rule.fp_offset)
    } else if rule.fp_offset != 0 {
        format!("fp=[CFA{:+}]", rule.fp_offset)
    } else {
        "fp=unchanged".to_string()
    };
    let ra = if rule.ra_offset == 0 {
        "ra=lr".to_string()
    } else {
        format!("ra=[CFA{:+}]", rule.ra_offset)
    };
    let o = rule.cfa_offset;
    let described: String = match rule.kind {
        RULE_FRAME_POINTER if rule.flags & RULE_FLAG_UNSUPPORTED != 0 => {
            "frame pointer (the CFI here is not modelled)".into()
        }
        RULE_FRAME_POINTER => "frame pointer (no table rule)".into(),
        RULE_CFA_SP => format!("CFA=sp{o:+} {ra} {fp}"),
        RULE_CFA_FP => format!("CFA=fp{o:+} {ra} {fp}"),
        RULE_CFA_DEREF_FP => format!("CFA=[fp{o:+}] {ra} {fp}"),
        RULE_PLT => format!(
            "PLT entry: CFA=sp{o:+}, +8 from byte {} of the entry",
            rule.param
        ),
        RULE_SIGNAL => "signal trampoline: registers from the signal frame".into(),
        RULE_STOP => "stop (a stack switch the walker cannot follow)".into(),
        RULE_ROOT => "root (outermost frame)".into(),
        RULE_GO_CGOCALL => "Go asmcgocall: back onto the goroutine's stack".into(),
        RULE_GO_CGOCALLBACK => format!("Go cgocallback: CFA=sp{o:+} on the system stack"),
        other => format!("unknown rule kind {other}"),
    };
    if rule.flags & RULE_FLAG_GO_INJECTED_CALL != 0 {
        format!("{described}; entered by a call Go's signal handler faked")
    } else {
        described
    }
}

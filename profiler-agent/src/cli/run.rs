//! `profiler-agent run`: the continuous agent. Parses the config file and
//! its overrides (flags, then `PROFILER_AGENT_*` variables), sets up
//! logging, runs `continuous::Agent` until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

use profiler_continuous::settings::{self, Kind, Setting};
use profiler_continuous::{Agent, LogFormat};
use profiler_export::Metrics;
use profiler_sampling::sampler::check_privileges;

/// `run`'s arguments: `--config FILE`, and every key of the config file
/// as a flag and an environment variable, generated from the config types
/// (`profiler_continuous::settings`): a flag beats its variable, which
/// beats the file, which beats the default.
#[derive(Debug, Clone, Default)]
pub struct RunArgs {
    /// TOML configuration file (see deploy/config.example.toml).
    pub config: Option<PathBuf>,
    /// The settings given by flag or variable, with their values.
    pub given: Vec<(&'static Setting, Vec<String>)>,
}

const CONFIG: &str = "config";

const EXAMPLES: &str = "Example:\n  \
    profiler-agent run --config deploy/config.example.toml --listen 0.0.0.0:6060\n  \
    PROFILER_AGENT_PYROSCOPE_URL=http://pyroscope:4040 profiler-agent run --directory-path ''\n  \
    go tool pprof -top 'http://127.0.0.1:6060/debug/pprof/profile?seconds=10'";

impl Args for RunArgs {
    fn augment_args(command: Command) -> Command {
        // The flags come from the config types' JSON schema, which takes
        // half a millisecond to build: deferred until `run` itself is
        // parsed, so that every other command starts without it.
        command.after_help(EXAMPLES).defer(run_flags)
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

/// `run`'s flags: `--config`, and one per setting of the config file.
fn run_flags(command: Command) -> Command {
    let mut command = command.arg(
        Arg::new(CONFIG)
            .long(CONFIG)
            .env("PROFILER_AGENT_CONFIG")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help("TOML configuration file (see deploy/config.example.toml)"),
    );
    for setting in settings::settings() {
        let mut arg = Arg::new(setting.flag.as_str())
            .long(setting.flag.as_str())
            .env(setting.env.as_str())
            .value_name(setting.value_name)
            .help(setting.help.clone())
            .hide_env_values(setting.secret)
            .action(ArgAction::Set);
        if matches!(setting.kind, Kind::List(_)) {
            arg = arg
                .value_delimiter(',')
                .num_args(0..)
                .action(ArgAction::Append);
        }
        command = command.arg(arg);
    }
    command
}

impl FromArgMatches for RunArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = RunArgs {
            config: matches.get_one::<PathBuf>(CONFIG).cloned(),
            given: Vec::new(),
        };
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        if let Some(config) = matches.get_one::<PathBuf>(CONFIG) {
            self.config = Some(config.clone());
        }
        for setting in settings::settings() {
            if let Some(values) = matches.get_many::<String>(setting.flag.as_str()) {
                self.given.push((setting, values.cloned().collect()));
            }
        }
        Ok(())
    }
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let config = settings::load(args.config.as_deref(), &args.given)?;
    // The process-wide subscriber is already set (warn, text); this
    // command's threads log through their own, at info, in the chosen
    // format.
    let dispatch = log_dispatch(config.log_format);
    let _log = tracing::dispatcher::set_default(&dispatch);
    check_privileges()?;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    profiler_symbolize::debuginfod::configure(&config.debuginfod.settings());
    let metrics = Arc::new(Metrics::default());
    let agent = Agent::start(config, metrics)?;
    let summary = agent.run(&stop)?;
    tracing::info!(
        windows = summary.windows,
        profiles = summary.profiles,
        exporters_unfinished = summary.exporters_unfinished,
        "stopped"
    );
    Ok(())
}

fn log_dispatch(format: LogFormat) -> tracing::Dispatch {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROFILER_AGENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    match format {
        LogFormat::Text => tracing::Dispatch::new(builder.finish()),
        LogFormat::Json => tracing::Dispatch::new(builder.json().finish()),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::super::{Cli, Command};

    #[test]
    fn run_flags_are_there_once_run_is_parsed() {
        // The flags are added when `run` is built (deferred): every
        // command's definition still passes clap's own checks, and a
        // setting given by flag reaches `given`.
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "profiler-agent",
            "run",
            "--listen",
            "127.0.0.1:7070",
            "--frame-pointers-only",
            "true",
        ])
        .unwrap();
        let Some(Command::Run(args)) = cli.command else {
            panic!("not run: {cli:?}");
        };
        let given: Vec<(&str, &[String])> = args
            .given
            .iter()
            .map(|(setting, values)| (setting.flag.as_str(), values.as_slice()))
            .collect();
        assert_eq!(
            given,
            [
                ("listen", &["127.0.0.1:7070".to_string()][..]),
                ("frame-pointers-only", &["true".to_string()][..]),
            ]
        );
        let error = Cli::try_parse_from(["profiler-agent", "run", "--no-such-flag"]).unwrap_err();
        assert!(error.to_string().contains("--no-such-flag"), "{error}");
    }
}

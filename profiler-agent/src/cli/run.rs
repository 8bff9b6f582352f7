//! `profiler-agent run`: the continuous agent. Parses the config file and
//! its overrides (flags, then `PROFILER_AGENT_*` variables), sets up
//! logging, runs `continuous::Agent` until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use profiler_continuous::config::{KubernetesMode, OtlpProtocol};
use profiler_continuous::{Agent, Config, LogFormat, Overrides};
use profiler_export::Metrics;
use profiler_sampling::sampler::check_privileges;

/// Every key of the config file (deploy/config.example.toml) as a flag and
/// an environment variable; a flag beats the variable, which beats the file.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Example:\n  \
    profiler-agent run --config deploy/config.example.toml --listen 0.0.0.0:6060\n  \
    PROFILER_AGENT_PYROSCOPE_URL=http://pyroscope:4040 profiler-agent run --directory-path ''\n  \
    go tool pprof -top 'http://127.0.0.1:6060/debug/pprof/profile?seconds=10'")]
pub struct RunArgs {
    /// TOML configuration file (see deploy/config.example.toml).
    #[arg(long, env = "PROFILER_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Samples per second on each CPU [default: 100].
    #[arg(long, env = "PROFILER_AGENT_FREQUENCY_HZ", value_name = "HZ")]
    pub frequency_hz: Option<u64>,
    /// Window length; each window is one profile per service [default: 15s].
    #[arg(long, env = "PROFILER_AGENT_WINDOW", value_parser = humantime::parse_duration)]
    pub window: Option<Duration>,
    /// Processes to profile, comma-separated [default: the whole node].
    #[arg(
        long,
        env = "PROFILER_AGENT_PIDS",
        value_delimiter = ',',
        value_name = "PID,..."
    )]
    pub pids: Option<Vec<u32>>,
    /// Only processes in these cgroups (path prefixes), comma-separated.
    #[arg(
        long,
        env = "PROFILER_AGENT_CGROUPS",
        value_delimiter = ',',
        value_name = "PATH,..."
    )]
    pub cgroups: Option<Vec<String>>,
    /// Only pods in these Kubernetes namespaces, comma-separated.
    #[arg(
        long,
        env = "PROFILER_AGENT_NAMESPACES",
        value_delimiter = ',',
        value_name = "NS,..."
    )]
    pub namespaces: Option<Vec<String>>,
    /// The `node` label [default: $NODE_NAME, else the hostname].
    #[arg(long, env = "PROFILER_AGENT_NODE")]
    pub node: Option<String>,
    /// Address of /debug/pprof/profile, /metrics, /healthz, /readyz, or
    /// "off" [default: 127.0.0.1:6060].
    #[arg(long, env = "PROFILER_AGENT_LISTEN", value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Longest pull (`?seconds=`) accepted [default: 300].
    #[arg(long, env = "PROFILER_AGENT_MAX_PULL_SECONDS")]
    pub max_pull_seconds: Option<u64>,
    /// Time to deliver the last window after SIGTERM [default: 10s].
    #[arg(long, env = "PROFILER_AGENT_GRACE_PERIOD", value_parser = humantime::parse_duration)]
    pub grace_period: Option<Duration>,
    /// text or json [default: text]. The level: PROFILER_AGENT_LOG (info).
    #[arg(long, env = "PROFILER_AGENT_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Frame-pointer walks only, no unwind tables [default: false].
    #[arg(long, env = "PROFILER_AGENT_FRAME_POINTERS_ONLY", value_name = "BOOL")]
    pub frame_pointers_only: Option<bool>,
    /// Kernel memory for unwind tables, MiB [default: 64].
    #[arg(long, env = "PROFILER_AGENT_UNWIND_TABLE_MIB", value_name = "MIB")]
    pub unwind_table_mib: Option<u64>,
    /// Also record off-CPU time: where threads wait [default: false].
    #[arg(long, env = "PROFILER_AGENT_OFF_CPU", value_name = "BOOL")]
    pub off_cpu: Option<bool>,
    /// Off-CPU intervals shorter than this are not recorded [default: 1us].
    #[arg(long, env = "PROFILER_AGENT_OFF_CPU_MIN", value_parser = humantime::parse_duration)]
    pub off_cpu_min: Option<Duration>,
    /// Off-CPU sampling period [default: 10ms].
    #[arg(long, env = "PROFILER_AGENT_OFF_CPU_PERIOD", value_parser = humantime::parse_duration)]
    pub off_cpu_period: Option<Duration>,
    /// Restart the sampler above this many tracked processes [default: 4096].
    #[arg(long, env = "PROFILER_AGENT_MAX_PROCESSES")]
    pub max_processes: Option<usize>,
    /// Restart the sampler above this many open object files [default: 4096].
    #[arg(long, env = "PROFILER_AGENT_MAX_OBJECTS")]
    pub max_objects: Option<usize>,
    /// Directory exporter: where to write pprof files ("" = off).
    #[arg(long, env = "PROFILER_AGENT_DIRECTORY_PATH", value_name = "DIR", value_parser = any_path)]
    pub directory_path: Option<PathBuf>,
    /// Directory exporter: files kept [default: 1000].
    #[arg(long, env = "PROFILER_AGENT_DIRECTORY_MAX_FILES")]
    pub directory_max_files: Option<usize>,
    /// Directory exporter: bytes kept [default: 268435456].
    #[arg(long, env = "PROFILER_AGENT_DIRECTORY_MAX_BYTES")]
    pub directory_max_bytes: Option<u64>,
    /// Directory exporter: windows queued [default: 8].
    #[arg(long, env = "PROFILER_AGENT_DIRECTORY_QUEUE_SIZE")]
    pub directory_queue_size: Option<usize>,
    /// Pyroscope base URL ("" = off).
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_URL", value_name = "URL")]
    pub pyroscope_url: Option<String>,
    /// Pyroscope tenant, sent as X-Scope-OrgID.
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_TENANT_ID")]
    pub pyroscope_tenant_id: Option<String>,
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_BASIC_AUTH_USERNAME")]
    pub pyroscope_basic_auth_username: Option<String>,
    #[arg(
        long,
        env = "PROFILER_AGENT_PYROSCOPE_BASIC_AUTH_PASSWORD",
        hide_env_values = true
    )]
    pub pyroscope_basic_auth_password: Option<String>,
    #[arg(
        long,
        env = "PROFILER_AGENT_PYROSCOPE_BEARER_TOKEN",
        hide_env_values = true
    )]
    pub pyroscope_bearer_token: Option<String>,
    /// PEM CA certificates to trust for https.
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_CA_FILE", value_name = "FILE", value_parser = any_path)]
    pub pyroscope_ca_file: Option<PathBuf>,
    /// Per request [default: 10s].
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_TIMEOUT", value_parser = humantime::parse_duration)]
    pub pyroscope_timeout: Option<Duration>,
    /// Windows queued while Pyroscope is slow or down [default: 8].
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_QUEUE_SIZE")]
    pub pyroscope_queue_size: Option<usize>,
    /// Attempts per window [default: 5].
    #[arg(long, env = "PROFILER_AGENT_PYROSCOPE_MAX_ATTEMPTS")]
    pub pyroscope_max_attempts: Option<u32>,
    /// OTLP profiles receiver URL ("" = off), e.g. http://collector:4318.
    #[arg(long, env = "PROFILER_AGENT_OTLP_URL", value_name = "URL")]
    pub otlp_url: Option<String>,
    /// grpc or http/protobuf [default: http/protobuf].
    #[arg(long, env = "PROFILER_AGENT_OTLP_PROTOCOL")]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// OTLP tenant, sent as X-Scope-OrgID.
    #[arg(long, env = "PROFILER_AGENT_OTLP_TENANT_ID")]
    pub otlp_tenant_id: Option<String>,
    #[arg(long, env = "PROFILER_AGENT_OTLP_BASIC_AUTH_USERNAME")]
    pub otlp_basic_auth_username: Option<String>,
    #[arg(
        long,
        env = "PROFILER_AGENT_OTLP_BASIC_AUTH_PASSWORD",
        hide_env_values = true
    )]
    pub otlp_basic_auth_password: Option<String>,
    #[arg(long, env = "PROFILER_AGENT_OTLP_BEARER_TOKEN", hide_env_values = true)]
    pub otlp_bearer_token: Option<String>,
    /// PEM CA certificates to trust for https.
    #[arg(long, env = "PROFILER_AGENT_OTLP_CA_FILE", value_name = "FILE", value_parser = any_path)]
    pub otlp_ca_file: Option<PathBuf>,
    /// Per request [default: 10s].
    #[arg(long, env = "PROFILER_AGENT_OTLP_TIMEOUT", value_parser = humantime::parse_duration)]
    pub otlp_timeout: Option<Duration>,
    /// Windows queued while the receiver is slow or down [default: 8].
    #[arg(long, env = "PROFILER_AGENT_OTLP_QUEUE_SIZE")]
    pub otlp_queue_size: Option<usize>,
    /// Attempts per window [default: 5].
    #[arg(long, env = "PROFILER_AGENT_OTLP_MAX_ATTEMPTS")]
    pub otlp_max_attempts: Option<u32>,
    /// Pod names from the Kubernetes API: auto, on or off [default: auto].
    #[arg(long, env = "PROFILER_AGENT_KUBERNETES_ENABLED")]
    pub kubernetes_enabled: Option<KubernetesMode>,
    /// API server URL [default: from KUBERNETES_SERVICE_HOST/PORT].
    #[arg(long, env = "PROFILER_AGENT_KUBERNETES_API_URL", value_name = "URL")]
    pub kubernetes_api_url: Option<String>,
    /// Service account token [default: /var/run/secrets/kubernetes.io/serviceaccount/token].
    #[arg(long, env = "PROFILER_AGENT_KUBERNETES_TOKEN_FILE", value_name = "FILE", value_parser = any_path)]
    pub kubernetes_token_file: Option<PathBuf>,
    /// Cluster CA [default: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt].
    #[arg(long, env = "PROFILER_AGENT_KUBERNETES_CA_FILE", value_name = "FILE", value_parser = any_path)]
    pub kubernetes_ca_file: Option<PathBuf>,
    /// Per request [default: 10s].
    #[arg(long, env = "PROFILER_AGENT_KUBERNETES_TIMEOUT", value_parser = humantime::parse_duration)]
    pub kubernetes_timeout: Option<Duration>,
    /// Prometheus exporter-toolkit web config (TLS, client certificates,
    /// basic_auth_users with bcrypt hashes) for the listener [default: none].
    #[arg(long, env = "PROFILER_AGENT_WEB_CONFIG_FILE", value_name = "FILE", value_parser = any_path)]
    pub web_config_file: Option<PathBuf>,
    /// A file with the bearer token callers must send [default: none].
    #[arg(long, env = "PROFILER_AGENT_BEARER_TOKEN_FILE", value_name = "FILE", value_parser = any_path)]
    pub bearer_token_file: Option<PathBuf>,
    /// Check callers' bearer tokens with the Kubernetes API (TokenReview and
    /// SubjectAccessReview, as kube-rbac-proxy) [default: false].
    #[arg(long, env = "PROFILER_AGENT_AUTH_KUBERNETES", value_name = "BOOL")]
    pub auth_kubernetes: Option<bool>,
    /// debuginfod servers for debug files of stripped binaries,
    /// comma-separated [default: $DEBUGINFOD_URLS, else off].
    #[arg(
        long,
        env = "PROFILER_AGENT_DEBUGINFOD_URLS",
        value_delimiter = ',',
        value_name = "URL,..."
    )]
    pub debuginfod_urls: Option<Vec<String>>,
    /// Where fetched debug files are kept [default: $DEBUGINFOD_CACHE_PATH,
    /// else $XDG_CACHE_HOME/debuginfod_client].
    #[arg(long, env = "PROFILER_AGENT_DEBUGINFOD_CACHE", value_name = "DIR", value_parser = any_path)]
    pub debuginfod_cache: Option<PathBuf>,
    /// Per debuginfod request [default: $DEBUGINFOD_TIMEOUT seconds, else 10s].
    #[arg(long, env = "PROFILER_AGENT_DEBUGINFOD_TIMEOUT", value_parser = humantime::parse_duration)]
    pub debuginfod_timeout: Option<Duration>,
    /// Largest debug file accepted, in bytes [default: $DEBUGINFOD_MAXSIZE, else 1 GiB].
    #[arg(
        long,
        env = "PROFILER_AGENT_DEBUGINFOD_MAX_BYTES",
        value_name = "BYTES"
    )]
    pub debuginfod_max_bytes: Option<u64>,
}

/// A path that may be empty ("" switches an exporter off), which clap's
/// own PathBuf parser refuses.
fn any_path(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(text))
}

impl RunArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            frequency_hz: self.frequency_hz,
            window: self.window,
            pids: self.pids.clone(),
            cgroups: self.cgroups.clone(),
            namespaces: self.namespaces.clone(),
            node: self.node.clone(),
            listen: self.listen.clone(),
            max_pull_seconds: self.max_pull_seconds,
            grace_period: self.grace_period,
            log_format: self.log_format,
            frame_pointers_only: self.frame_pointers_only,
            unwind_table_mib: self.unwind_table_mib,
            off_cpu: self.off_cpu,
            off_cpu_min: self.off_cpu_min,
            off_cpu_period: self.off_cpu_period,
            max_processes: self.max_processes,
            max_objects: self.max_objects,
            directory_path: self.directory_path.clone(),
            directory_max_files: self.directory_max_files,
            directory_max_bytes: self.directory_max_bytes,
            directory_queue_size: self.directory_queue_size,
            pyroscope_url: self.pyroscope_url.clone(),
            pyroscope_tenant_id: self.pyroscope_tenant_id.clone(),
            pyroscope_basic_auth_username: self.pyroscope_basic_auth_username.clone(),
            pyroscope_basic_auth_password: self.pyroscope_basic_auth_password.clone(),
            pyroscope_bearer_token: self.pyroscope_bearer_token.clone(),
            pyroscope_ca_file: self.pyroscope_ca_file.clone(),
            pyroscope_timeout: self.pyroscope_timeout,
            pyroscope_queue_size: self.pyroscope_queue_size,
            pyroscope_max_attempts: self.pyroscope_max_attempts,
            otlp_url: self.otlp_url.clone(),
            otlp_protocol: self.otlp_protocol,
            otlp_tenant_id: self.otlp_tenant_id.clone(),
            otlp_basic_auth_username: self.otlp_basic_auth_username.clone(),
            otlp_basic_auth_password: self.otlp_basic_auth_password.clone(),
            otlp_bearer_token: self.otlp_bearer_token.clone(),
            otlp_ca_file: self.otlp_ca_file.clone(),
            otlp_timeout: self.otlp_timeout,
            otlp_queue_size: self.otlp_queue_size,
            otlp_max_attempts: self.otlp_max_attempts,
            kubernetes_enabled: self.kubernetes_enabled,
            kubernetes_api_url: self.kubernetes_api_url.clone(),
            kubernetes_token_file: self.kubernetes_token_file.clone(),
            kubernetes_ca_file: self.kubernetes_ca_file.clone(),
            kubernetes_timeout: self.kubernetes_timeout,
            web_config_file: self.web_config_file.clone(),
            bearer_token_file: self.bearer_token_file.clone(),
            auth_kubernetes: self.auth_kubernetes,
            debuginfod_urls: self.debuginfod_urls.clone(),
            debuginfod_cache: self.debuginfod_cache.clone(),
            debuginfod_timeout: self.debuginfod_timeout,
            debuginfod_max_bytes: self.debuginfod_max_bytes,
        }
    }
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), &args.overrides())?;
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

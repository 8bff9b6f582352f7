//! The configuration of `profiler-agent run`: a TOML file, every key of
//! which a flag or a `PROFILER_AGENT_<KEY>` environment variable overrides,
//! all three defined once, by the fields below (`settings`).
//!
//! `deploy/config.example.toml` documents every key; a unit test parses it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use super::kubernetes::{KubernetesConfig, KubernetesMode};
pub use super::probes::ProbeConfig;
// Each exporter owns its section's type.
pub use profiler_export::directory::DirectoryConfig;
pub use profiler_export::http_client::HttpConfig;
pub use profiler_export::otlp::{OtlpConfig, OtlpProtocol};
pub use profiler_export::pyroscope::PyroscopeConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "config file {path}: {message} (see deploy/config.example.toml for every key and its format)"
    )]
    Parse { path: PathBuf, message: String },
    #[error("{key}: {message}")]
    Invalid { key: &'static str, message: String },
    #[error("--{flag} (or {env}): {message}")]
    Flag {
        flag: String,
        env: String,
        message: String,
    },
}

/// The whole configuration, defaults filled in.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Samples per second on each CPU.
    pub frequency_hz: u64,
    /// Length of one window: each window becomes one profile per service.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub window: Duration,
    /// Processes to profile; empty profiles the whole node.
    pub pids: Vec<u32>,
    /// Only processes in these cgroups (path prefixes as in
    /// `/proc/PID/cgroup`, whole components); empty: any.
    pub cgroups: Vec<String>,
    /// Only processes of pods in these Kubernetes namespaces; empty: any.
    pub namespaces: Vec<String>,
    /// The `node` label; empty means `$NODE_NAME`, else the hostname.
    pub node: String,
    /// Address of the pull endpoints (`/debug/pprof/profile`, `/metrics`,
    /// `/healthz`, `/readyz`); empty or "off" disables them.
    pub listen: String,
    /// Longest `seconds=` a pull may ask for.
    pub max_pull_seconds: u64,
    /// After SIGTERM: how long to deliver the last window.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub grace_period: Duration,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// Walk user stacks with frame pointers only (no unwind tables).
    pub frame_pointers_only: bool,
    /// Kernel memory for unwind-table rows, in MiB (allocated at start;
    /// beyond it the least recently sampled tables are evicted).
    pub unwind_table_mib: u64,
    /// Memory for what the runtimes keep of processes' memory (Python
    /// code objects and line tables, Java methods and their debug
    /// information), in MiB over every process; a process that forges
    /// its runtime's state evicts its own entries first.
    pub runtime_cache_mib: u64,
    /// Also record off-CPU time (see `sampling::OffCpuConfig`).
    pub off_cpu: bool,
    /// Also export a wall-clock profile per service per window (`wall`;
    /// pulls: `/debug/pprof/wall`): CPU samples as time plus off-CPU time,
    /// each thread's stacks adding up to its time alive in the window.
    ///
    /// Off-CPU time is recorded for it as for `off_cpu` (`off_cpu_min` and
    /// `off_cpu_period` apply); without `off_cpu` the CPU profile stays
    /// CPU only.
    pub wall: bool,
    /// Also export a page-fault profile per service per window
    /// (`page_faults`): one sample per `page_fault_period` page faults, with
    /// the stack that first touched the page, where resident memory grows.
    pub page_faults: bool,
    /// Page faults per sample of the page-fault profile.
    pub page_fault_period: u64,
    /// Off-CPU intervals shorter than this are not recorded.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub off_cpu_min: Duration,
    /// Off-CPU intervals shorter than this are recorded with probability
    /// interval / period, each then standing for one period; empty: one
    /// CPU sampling period (1 / frequency_hz), as `record` takes it.
    #[serde(with = "optional_duration")]
    #[schemars(with = "String")]
    pub off_cpu_period: Option<Duration>,
    /// Above this many tracked processes (or `max_objects` open object
    /// files), the sampler is restarted at the next window boundary so
    /// every cache starts empty again: a bound on memory.
    pub max_processes: usize,
    /// Open object files above which the sampler is restarted (see
    /// `max_processes`).
    pub max_objects: usize,
    pub directory: DirectoryConfig,
    pub pyroscope: PyroscopeConfig,
    pub otlp: OtlpConfig,
    pub kubernetes: KubernetesConfig,
    pub debuginfod: DebuginfodSection,
    pub go_labels: GoLabelsSection,
    /// The language runtimes read from processes' memory: `go`
    /// (goroutines' pprof labels), `cpython` (Python frames with files
    /// and lines), `hotspot` (Java frames, inlined methods too), or `all`
    /// or `none`.
    pub runtimes: Vec<String>,
    /// Go services' heap profiles, read from their memory each window
    /// (allocations in the window, memory in use at its end): the
    /// `memory` profile, and `/debug/pprof/heap`.
    pub go_heap: bool,
    /// Who may use the listener (see `export::auth`).
    pub auth: profiler_export::auth::AuthConfig,
    /// Probes whose latency histograms `/metrics` exports (`[[probes]]`;
    /// in the file only).
    #[schemars(skip)]
    pub probes: Vec<ProbeConfig>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{s:?} is not a log format: use text or json")),
        }
    }
}

/// Debug files of stripped binaries fetched by build id from debuginfod
/// servers, in the background (names appear in the windows after the file
/// arrived). Each key set wins over elfutils' variable of the same meaning
/// (`DEBUGINFOD_URLS`, `DEBUGINFOD_CACHE_PATH`, `DEBUGINFOD_TIMEOUT`,
/// `DEBUGINFOD_MAXSIZE`).
#[derive(
    Debug, Clone, PartialEq, Eq, Deserialize, Default, serde::Serialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields, default)]
pub struct DebuginfodSection {
    /// Servers, tried in order; empty: `DEBUGINFOD_URLS`, else off.
    pub urls: Vec<String>,
    /// Cache directory; empty: `DEBUGINFOD_CACHE_PATH`, else
    /// `$XDG_CACHE_HOME/debuginfod_client`.
    pub cache: PathBuf,
    /// Per request; empty: `DEBUGINFOD_TIMEOUT`, else 10s.
    #[serde(with = "optional_duration")]
    #[schemars(with = "String")]
    pub timeout: Option<Duration>,
    /// Largest debug file accepted, in bytes; 0: `DEBUGINFOD_MAXSIZE`,
    /// else 1 GiB.
    pub max_bytes: u64,
}

impl DebuginfodSection {
    pub fn settings(&self) -> profiler_symbolize::debuginfod::DebuginfodSettings {
        profiler_symbolize::debuginfod::DebuginfodSettings {
            urls: self.urls.clone(),
            cache: (!self.cache.as_os_str().is_empty()).then(|| self.cache.clone()),
            timeout: self.timeout,
            max_bytes: (self.max_bytes > 0).then_some(self.max_bytes),
        }
    }
}

/// Go pprof labels on samples (see profiler-runtime-go's `labels`), read
/// when `go` is among the runtimes.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields, default)]
pub struct GoLabelsSection {
    /// Keys kept (`*` globs); empty: every key.
    pub keys: Vec<String>,
    /// Also label samples with the goroutine id.
    pub goroutine: bool,
}

impl GoLabelsSection {
    /// The sampler's setting (used when `go` is among the runtimes).
    pub fn config(&self) -> profiler_runtimes::go::labels::GoLabelsConfig {
        profiler_runtimes::go::labels::GoLabelsConfig {
            goroutine: self.goroutine,
            keys: self.keys.clone(),
        }
    }
}

impl Config {
    /// The off-CPU sampling period: `off_cpu_period`, else one CPU
    /// sampling period.
    pub fn off_cpu_period(&self) -> Duration {
        self.off_cpu_period
            .unwrap_or_else(|| profiler_sampling::sampler::sampling_period(self.frequency_hz))
    }

    /// The runtimes selected (`runtimes`), checked against the known ones.
    pub fn runtime_selection(&self) -> Result<profiler_runtimes::Selection, ConfigError> {
        profiler_runtimes::selection(&self.runtimes.join(",")).map_err(|message| {
            ConfigError::Invalid {
                key: "runtimes",
                message,
            }
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            frequency_hz: profiler_sampling::sampler::DEFAULT_FREQUENCY_HZ,
            window: Duration::from_secs(15),
            pids: Vec::new(),
            cgroups: Vec::new(),
            namespaces: Vec::new(),
            node: String::new(),
            listen: "127.0.0.1:6060".into(),
            max_pull_seconds: 300,
            grace_period: Duration::from_secs(10),
            log_format: LogFormat::Text,
            frame_pointers_only: false,
            unwind_table_mib: profiler_sampling::sampler::DEFAULT_UNWIND_TABLE_BYTES >> 20,
            runtime_cache_mib: profiler_runtimes::cache::DEFAULT_BUDGET_BYTES >> 20,
            off_cpu: false,
            wall: false,
            page_faults: false,
            page_fault_period: profiler_sampling::sampler::DEFAULT_PAGE_FAULT_PERIOD,
            off_cpu_min: profiler_sampling::sampler::DEFAULT_OFF_CPU_MIN,
            off_cpu_period: None,
            max_processes: 4096,
            max_objects: 4096,
            directory: DirectoryConfig::default(),
            pyroscope: PyroscopeConfig::default(),
            otlp: OtlpConfig::default(),
            kubernetes: KubernetesConfig::default(),
            debuginfod: DebuginfodSection::default(),
            go_labels: GoLabelsSection::default(),
            runtimes: vec!["all".into()],
            go_heap: true,
            auth: Default::default(),
            probes: Vec::new(),
        }
    }
}

impl Config {
    /// Parses a TOML document.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Whether the sampler records off-CPU time: for the CPU profile's
    /// off-CPU sample type, for the wall-clock profile, or both.
    pub fn records_off_cpu(&self) -> bool {
        self.off_cpu || self.wall
    }

    /// What each window's CPU profile shows.
    pub fn profile_kind(&self) -> profiler_profile::ProfileKind {
        if self.off_cpu {
            profiler_profile::ProfileKind::OffCpu
        } else {
            profiler_profile::ProfileKind::Cpu
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if !(1..=10_000).contains(&self.frequency_hz) {
            return invalid("frequency_hz", "must be between 1 and 10000");
        }
        if self.window < Duration::from_secs(1) {
            return invalid("window", "must be at least 1s");
        }
        if !(1..=1_000_000_000).contains(&self.page_fault_period) {
            return invalid("page_fault_period", "must be between 1 and 1000000000");
        }
        if !(1..=65536).contains(&self.runtime_cache_mib) {
            return invalid("runtime_cache_mib", "must be between 1 and 65536");
        }
        if self.off_cpu_period() > Duration::from_secs(3600) {
            return invalid("off_cpu_period", "must be at most 1h");
        }
        if self.listen_addr().is_err() {
            return invalid(
                "listen",
                "must be HOST:PORT (e.g. 127.0.0.1:6060, 0.0.0.0:6060), or \"off\"",
            );
        }
        if self.cgroups.iter().any(|c| !c.starts_with('/')) {
            return invalid(
                "cgroups",
                "each entry is a cgroup path as /proc/PID/cgroup shows it, starting with /",
            );
        }
        if !self.namespaces.is_empty() && self.kubernetes.enabled == KubernetesMode::Off {
            return invalid(
                "namespaces",
                "selecting Kubernetes namespaces needs [kubernetes] enabled (auto or on)",
            );
        }
        if self.max_pull_seconds == 0 {
            return invalid("max_pull_seconds", "must be at least 1");
        }
        if self.directory.queue_size == 0
            || self.pyroscope.queue_size == 0
            || self.otlp.queue_size == 0
        {
            return invalid("queue_size", "must be at least 1");
        }
        if self.directory.max_files == 0 {
            return invalid("directory.max_files", "must be at least 1");
        }
        for (key, url, http, max_attempts) in [
            (
                "pyroscope",
                &self.pyroscope.url,
                &self.pyroscope.http,
                self.pyroscope.max_attempts,
            ),
            (
                "otlp",
                &self.otlp.url,
                &self.otlp.http,
                self.otlp.max_attempts,
            ),
        ] {
            let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
            if !url.is_empty() && !scheme_ok {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!("url must start with http:// or https://, not {url:?}"),
                });
            }
            if !http.bearer_token.is_empty() && !http.basic_auth_username.is_empty() {
                return invalid(
                    key,
                    "set bearer_token or basic_auth_username/password, not both",
                );
            }
            if max_attempts == 0 {
                return invalid(key, "max_attempts must be at least 1");
            }
        }
        self.runtime_selection()?;
        super::probes::validate(&self.probes).map_err(|e| ConfigError::Invalid {
            key: "probes",
            message: e.to_string(),
        })?;
        Ok(())
    }

    /// The cgroup and namespace selection.
    pub fn selection(&self) -> super::metadata::Selection {
        super::metadata::Selection {
            cgroups: self.cgroups.clone(),
            namespaces: self.namespaces.clone(),
        }
    }

    /// The listen address; None when the endpoints are off.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, std::net::AddrParseError> {
        match self.listen.trim() {
            "" | "off" => Ok(None),
            addr => addr.parse().map(Some),
        }
    }

    /// The `node` label: the configured name, `$NODE_NAME` (the Downward
    /// API in the DaemonSet), else the hostname.
    pub fn node_name(&self) -> String {
        if !self.node.is_empty() {
            return self.node.clone();
        }
        if let Ok(name) = std::env::var("NODE_NAME")
            && !name.is_empty()
        {
            return name;
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    }
}

/// Durations in the file are humantime strings ("15s", "500ms", "2m"),
/// read by humantime-serde; this one also takes an empty string for none
/// (which humantime-serde's `Option` support does not).
mod optional_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// The config-keys test and the settings' defaults read the keys from
    /// the model.
    pub fn serialize<S: serde::Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let text = value.map(|d| humantime::format_duration(d).to_string());
        s.serialize_str(&text.unwrap_or_default())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        humantime::parse_duration(&text).map(Some).map_err(|e| {
            serde::de::Error::custom(format!("{text:?} is not a duration like 15s or 500ms: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn example_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config.example.toml")
    }

    #[test]
    fn the_example_config_parses_and_is_valid() {
        let text = std::fs::read_to_string(example_path()).expect("deploy/config.example.toml");
        let config = Config::from_toml(&text, &example_path()).unwrap();
        config.validate().unwrap();
        assert_eq!(config.frequency_hz, 100);
        assert_eq!(config.window, Duration::from_secs(15));
        assert!(!config.directory.path.as_os_str().is_empty());
    }

    /// The keys of each section as the model names them: read from the
    /// config types themselves (serialized, so renames and flattened
    /// sections count), with one `[[probes]]` entry so its keys appear.
    fn model_keys() -> BTreeMap<String, BTreeSet<String>> {
        let mut config = Config::default();
        config
            .probes
            .push(toml::from_str("name = \"x\"\nstart = \"uprobe:/bin/true:main\"").unwrap());
        let serde_json::Value::Object(top) = serde_json::to_value(&config).unwrap() else {
            panic!("the config does not serialize to a table");
        };
        let mut sections: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (key, value) in top {
            let table = match &value {
                serde_json::Value::Object(table) => Some(table),
                serde_json::Value::Array(items) => items.first().and_then(|v| v.as_object()),
                _ => None,
            };
            match table {
                Some(table) => {
                    let keys = table.keys().cloned().collect();
                    sections.insert(key, keys);
                }
                None => {
                    sections.entry(String::new()).or_default().insert(key);
                }
            }
        }
        sections
    }

    /// The keys the example sets or shows (commented), per section header
    /// (`[name]`, `[[name]]`, commented or not); "" before the first.
    fn documented_keys(text: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut sections: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut section = String::new();
        sections.insert(section.clone(), BTreeSet::new());
        for line in text.lines() {
            let line = line.trim_start_matches('#').trim();
            if let Some(name) = line.strip_prefix('[') {
                section = name.trim_matches(|c| c == '[' || c == ']').to_string();
                sections.entry(section.clone()).or_default();
            } else if let Some((key, _)) = line.split_once(" =")
                && !key.is_empty()
                && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            {
                sections.get_mut(&section).unwrap().insert(key.to_string());
            }
        }
        sections
    }

    #[test]
    fn the_example_config_sets_every_key() {
        // Documented "key by key": every key of the model appears in its
        // section of the example, so a new key cannot be added without
        // documenting it, and the example names no key the model lacks.
        let text = std::fs::read_to_string(example_path()).unwrap();
        let model = model_keys();
        let documented = documented_keys(&text);
        assert!(model.len() > 5 && model[""].len() > 10, "{model:?}");
        for (section, keys) in &model {
            let Some(shown) = documented.get(section) else {
                panic!("section [{section}] is not in the example");
            };
            let missing: Vec<_> = keys.difference(shown).collect();
            let unknown: Vec<_> = shown.difference(keys).collect();
            assert!(
                missing.is_empty() && unknown.is_empty(),
                "[{section}]: not documented {missing:?}; documented but not in the model {unknown:?}"
            );
        }
        let sections: BTreeSet<_> = model.keys().collect();
        assert_eq!(sections, documented.keys().collect::<BTreeSet<_>>());
    }

    #[test]
    fn bad_values_name_the_key() {
        let error = Config::from_toml("windw = \"1s\"", Path::new("c.toml")).unwrap_err();
        assert!(error.to_string().contains("windw"), "{error}");
        let error = Config::from_toml("window = \"soon\"", Path::new("c.toml")).unwrap_err();
        assert!(error.to_string().contains("soon"), "{error}");
        let config = Config {
            listen: "localhost".into(),
            ..Config::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("listen")
        );
        let config = Config {
            listen: "off".into(),
            ..Config::default()
        };
        assert_eq!(config.listen_addr().unwrap(), None);
    }
}

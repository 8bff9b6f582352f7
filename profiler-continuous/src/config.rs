//! The configuration of `profiler-agent run`: a TOML file, every key of
//! which a flag or a `PROFILER_AGENT_<KEY>` environment variable overrides
//! (the CLI maps both onto [`Overrides`]). Keys of a section are flattened
//! with an underscore: `[pyroscope] url` is `--pyroscope-url` and
//! `PROFILER_AGENT_PYROSCOPE_URL`.
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
}

/// The whole configuration, defaults filled in.
#[cfg_attr(test, derive(serde::Serialize))]
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Samples per second on each CPU.
    pub frequency_hz: u64,
    /// Length of one window: each window becomes one profile per service.
    #[serde(with = "humantime_serde")]
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
    pub grace_period: Duration,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// Walk user stacks with frame pointers only (no unwind tables).
    pub frame_pointers_only: bool,
    /// Kernel memory for unwind-table rows, in MiB (allocated at start;
    /// beyond it the least recently sampled tables are evicted).
    pub unwind_table_mib: u64,
    /// Also record off-CPU time (see `sampling::OffCpuConfig`).
    pub off_cpu: bool,
    #[serde(with = "humantime_serde")]
    pub off_cpu_min: Duration,
    #[serde(with = "humantime_serde")]
    pub off_cpu_period: Duration,
    /// Above this many tracked processes (or `max_objects` open object
    /// files), the sampler is restarted at the next window boundary so
    /// every cache starts empty again: a bound on memory.
    pub max_processes: usize,
    pub max_objects: usize,
    pub directory: DirectoryConfig,
    pub pyroscope: PyroscopeConfig,
    pub otlp: OtlpConfig,
    pub kubernetes: KubernetesConfig,
    pub debuginfod: DebuginfodSection,
    pub go_labels: GoLabelsSection,
    /// Who may use the listener (see `export::auth`).
    pub auth: profiler_export::auth::AuthConfig,
    /// Probes whose latency histograms `/metrics` exports (`[[probes]]`;
    /// in the file only).
    pub probes: Vec<ProbeConfig>,
}

#[cfg_attr(test, derive(serde::Serialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
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
#[cfg_attr(test, derive(serde::Serialize))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DebuginfodSection {
    /// Servers, tried in order; empty: `DEBUGINFOD_URLS`, else off.
    pub urls: Vec<String>,
    /// Cache directory; empty: `DEBUGINFOD_CACHE_PATH`, else
    /// `$XDG_CACHE_HOME/debuginfod_client`.
    pub cache: PathBuf,
    /// Per request; empty: `DEBUGINFOD_TIMEOUT`, else 10s.
    #[serde(with = "optional_duration")]
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

/// Go pprof labels on samples (see profiler-runtimes' `go::labels`).
#[cfg_attr(test, derive(serde::Serialize))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GoLabelsSection {
    pub enabled: bool,
    /// Keys kept (`*` globs); empty: every key.
    pub keys: Vec<String>,
    /// Also label samples with the goroutine id.
    pub goroutine: bool,
}

impl Default for GoLabelsSection {
    fn default() -> Self {
        GoLabelsSection {
            enabled: true,
            keys: Vec::new(),
            goroutine: false,
        }
    }
}

impl GoLabelsSection {
    /// The sampler's setting; None when switched off.
    pub fn config(&self) -> Option<profiler_runtimes::go::labels::GoLabelsConfig> {
        self.enabled
            .then(|| profiler_runtimes::go::labels::GoLabelsConfig {
                goroutine: self.goroutine,
                keys: self.keys.clone(),
            })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            frequency_hz: 100,
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
            off_cpu: false,
            off_cpu_min: profiler_sampling::sampler::DEFAULT_OFF_CPU_MIN,
            off_cpu_period: Duration::from_millis(10),
            max_processes: 4096,
            max_objects: 4096,
            directory: DirectoryConfig::default(),
            pyroscope: PyroscopeConfig::default(),
            otlp: OtlpConfig::default(),
            kubernetes: KubernetesConfig::default(),
            debuginfod: DebuginfodSection::default(),
            go_labels: GoLabelsSection::default(),
            auth: Default::default(),
            probes: Vec::new(),
        }
    }
}

/// Values given by flag or environment variable; each one set replaces the
/// file's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub frequency_hz: Option<u64>,
    pub window: Option<Duration>,
    pub pids: Option<Vec<u32>>,
    pub cgroups: Option<Vec<String>>,
    pub namespaces: Option<Vec<String>>,
    pub node: Option<String>,
    pub listen: Option<String>,
    pub max_pull_seconds: Option<u64>,
    pub grace_period: Option<Duration>,
    pub log_format: Option<LogFormat>,
    pub frame_pointers_only: Option<bool>,
    pub unwind_table_mib: Option<u64>,
    pub off_cpu: Option<bool>,
    pub off_cpu_min: Option<Duration>,
    pub off_cpu_period: Option<Duration>,
    pub max_processes: Option<usize>,
    pub max_objects: Option<usize>,
    pub directory_path: Option<PathBuf>,
    pub directory_max_files: Option<usize>,
    pub directory_max_bytes: Option<u64>,
    pub directory_queue_size: Option<usize>,
    pub pyroscope_url: Option<String>,
    pub pyroscope_tenant_id: Option<String>,
    pub pyroscope_basic_auth_username: Option<String>,
    pub pyroscope_basic_auth_password: Option<String>,
    pub pyroscope_bearer_token: Option<String>,
    pub pyroscope_ca_file: Option<PathBuf>,
    pub pyroscope_timeout: Option<Duration>,
    pub pyroscope_queue_size: Option<usize>,
    pub pyroscope_max_attempts: Option<u32>,
    pub otlp_url: Option<String>,
    pub otlp_protocol: Option<OtlpProtocol>,
    pub otlp_tenant_id: Option<String>,
    pub otlp_basic_auth_username: Option<String>,
    pub otlp_basic_auth_password: Option<String>,
    pub otlp_bearer_token: Option<String>,
    pub otlp_ca_file: Option<PathBuf>,
    pub otlp_timeout: Option<Duration>,
    pub otlp_queue_size: Option<usize>,
    pub otlp_max_attempts: Option<u32>,
    pub kubernetes_enabled: Option<KubernetesMode>,
    pub kubernetes_api_url: Option<String>,
    pub kubernetes_token_file: Option<PathBuf>,
    pub kubernetes_ca_file: Option<PathBuf>,
    pub kubernetes_timeout: Option<Duration>,
    pub web_config_file: Option<PathBuf>,
    pub bearer_token_file: Option<PathBuf>,
    pub auth_kubernetes: Option<bool>,
    pub debuginfod_urls: Option<Vec<String>>,
    pub debuginfod_cache: Option<PathBuf>,
    pub debuginfod_timeout: Option<Duration>,
    pub debuginfod_max_bytes: Option<u64>,
}

impl Config {
    /// Parses a TOML document.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// The file at `path` (or the defaults without one), then the
    /// overrides, then validation.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let mut config = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                Config::from_toml(&text, path)?
            }
            None => Config::default(),
        };
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    pub fn apply(&mut self, o: &Overrides) {
        fn set<T: Clone>(slot: &mut T, value: &Option<T>) {
            if let Some(value) = value {
                *slot = value.clone();
            }
        }
        set(&mut self.frequency_hz, &o.frequency_hz);
        set(&mut self.window, &o.window);
        set(&mut self.pids, &o.pids);
        set(&mut self.cgroups, &o.cgroups);
        set(&mut self.namespaces, &o.namespaces);
        set(&mut self.node, &o.node);
        set(&mut self.listen, &o.listen);
        set(&mut self.max_pull_seconds, &o.max_pull_seconds);
        set(&mut self.grace_period, &o.grace_period);
        set(&mut self.log_format, &o.log_format);
        set(&mut self.frame_pointers_only, &o.frame_pointers_only);
        set(&mut self.unwind_table_mib, &o.unwind_table_mib);
        set(&mut self.off_cpu, &o.off_cpu);
        set(&mut self.off_cpu_min, &o.off_cpu_min);
        set(&mut self.off_cpu_period, &o.off_cpu_period);
        set(&mut self.max_processes, &o.max_processes);
        set(&mut self.max_objects, &o.max_objects);
        let d = &mut self.directory;
        set(&mut d.path, &o.directory_path);
        set(&mut d.max_files, &o.directory_max_files);
        set(&mut d.max_bytes, &o.directory_max_bytes);
        set(&mut d.queue_size, &o.directory_queue_size);
        let p = &mut self.pyroscope;
        set(&mut p.url, &o.pyroscope_url);
        set(&mut p.http.tenant_id, &o.pyroscope_tenant_id);
        set(
            &mut p.http.basic_auth_username,
            &o.pyroscope_basic_auth_username,
        );
        set(
            &mut p.http.basic_auth_password,
            &o.pyroscope_basic_auth_password,
        );
        set(&mut p.http.bearer_token, &o.pyroscope_bearer_token);
        set(&mut p.http.ca_file, &o.pyroscope_ca_file);
        set(&mut p.http.timeout, &o.pyroscope_timeout);
        set(&mut p.queue_size, &o.pyroscope_queue_size);
        set(&mut p.max_attempts, &o.pyroscope_max_attempts);
        let t = &mut self.otlp;
        set(&mut t.url, &o.otlp_url);
        set(&mut t.protocol, &o.otlp_protocol);
        set(&mut t.http.tenant_id, &o.otlp_tenant_id);
        set(&mut t.http.basic_auth_username, &o.otlp_basic_auth_username);
        set(&mut t.http.basic_auth_password, &o.otlp_basic_auth_password);
        set(&mut t.http.bearer_token, &o.otlp_bearer_token);
        set(&mut t.http.ca_file, &o.otlp_ca_file);
        set(&mut t.http.timeout, &o.otlp_timeout);
        set(&mut t.queue_size, &o.otlp_queue_size);
        set(&mut t.max_attempts, &o.otlp_max_attempts);
        let k = &mut self.kubernetes;
        set(&mut k.enabled, &o.kubernetes_enabled);
        set(&mut k.api_url, &o.kubernetes_api_url);
        set(&mut k.token_file, &o.kubernetes_token_file);
        set(&mut k.ca_file, &o.kubernetes_ca_file);
        set(&mut k.timeout, &o.kubernetes_timeout);
        let d = &mut self.debuginfod;
        set(&mut d.urls, &o.debuginfod_urls);
        set(&mut d.cache, &o.debuginfod_cache);
        if o.debuginfod_timeout.is_some() {
            d.timeout = o.debuginfod_timeout;
        }
        set(&mut d.max_bytes, &o.debuginfod_max_bytes);
        let a = &mut self.auth;
        set(&mut a.web_config_file, &o.web_config_file);
        set(&mut a.bearer_token_file, &o.bearer_token_file);
        set(&mut a.kubernetes, &o.auth_kubernetes);
    }

    /// What each window's profiles show.
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
        if self.off_cpu_period > Duration::from_secs(3600) {
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

    /// For the config-keys test, which reads the keys from the model.
    #[cfg(test)]
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
    fn overrides_replace_file_values() {
        let mut config = Config::from_toml(
            "window = \"30s\"\n[directory]\npath = \"/a\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        config.apply(&Overrides {
            window: Some(Duration::from_secs(5)),
            directory_path: Some("/b".into()),
            pyroscope_url: Some("http://127.0.0.1:4040".into()),
            ..Overrides::default()
        });
        assert_eq!(config.window, Duration::from_secs(5));
        assert_eq!(config.directory.path, PathBuf::from("/b"));
        assert_eq!(config.pyroscope.url, "http://127.0.0.1:4040");
        config.validate().unwrap();
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

//! The `[kubernetes]` section of the agent's configuration.

use super::*;

#[cfg_attr(test, derive(serde::Serialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KubernetesMode {
    /// On when `KUBERNETES_SERVICE_HOST` is set (or `api_url` is); a
    /// cluster without a usable token or CA is then logged once, not an
    /// error.
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for KubernetesMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(KubernetesMode::Auto),
            "on" => Ok(KubernetesMode::On),
            "off" => Ok(KubernetesMode::Off),
            _ => Err(format!("{s:?} is not a mode: use auto, on or off")),
        }
    }
}

/// The `[kubernetes]` section.
#[cfg_attr(test, derive(serde::Serialize))]
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    pub enabled: KubernetesMode,
    /// API server URL; empty means
    /// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`.
    pub api_url: String,
    /// Bearer token, re-read before every request: bound service account
    /// tokens rotate about hourly. Empty sends none (e.g. `kubectl proxy`).
    pub token_file: PathBuf,
    /// CA of the API server, for https only; empty uses the system roots.
    pub ca_file: PathBuf,
    /// Connecting, the answer's headers, and reading a whole list. A watch
    /// may last `WATCH_SECONDS` plus this.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: KubernetesMode::Auto,
            api_url: String::new(),
            token_file: "/var/run/secrets/kubernetes.io/serviceaccount/token".into(),
            ca_file: "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt".into(),
            timeout: Duration::from_secs(10),
        }
    }
}

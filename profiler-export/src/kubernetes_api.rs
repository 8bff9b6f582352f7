//! The connection to the Kubernetes API server, shared by the pod watcher
//! (the agent's `continuous::kubernetes`) and the listener's TokenReview
//! authentication: the `[kubernetes]` section, the API server's URL, the
//! service account's token and CA (through the same PEM reader as the push
//! exporters' `ca_file`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use ureq::tls::Certificate;

// The config types derive Serialize for the agent's config-keys test,
// which reads every key from the types.
#[derive(
    serde::Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default,
)]
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
#[derive(serde::Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Pod names from the Kubernetes API: auto (in a cluster), on or off.
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
    #[schemars(with = "String")]
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

#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error(
        "no API server: KUBERNETES_SERVICE_HOST is not set and [kubernetes] api_url is empty (set api_url, or enabled = \"off\" outside a cluster)"
    )]
    NoApiUrl,
    #[error("[kubernetes] api_url {url:?} is not an http:// or https:// URL")]
    BadApiUrl { url: String },
    #[error(
        "reading the service account token {path}: {source} (mount one with automountServiceAccountToken, set [kubernetes] token_file, or enabled = \"off\")"
    )]
    ReadToken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "reading the CA file {path}: {source} (set [kubernetes] ca_file, empty for the system roots)"
    )]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the CA file {path} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: PathBuf },
}

/// The API server's URL: `[kubernetes] api_url`, else the in-cluster one.
pub fn api_url(config: &KubernetesConfig) -> Result<String, KubernetesError> {
    api_url_with_env(config, &|name| std::env::var(name).ok())
}

/// [`api_url`] with the environment injected (tests, the pod watcher).
pub fn api_url_with_env(
    config: &KubernetesConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, KubernetesError> {
    let api = if config.api_url.is_empty() {
        api_url_from_env(env).ok_or(KubernetesError::NoApiUrl)?
    } else {
        config.api_url.clone()
    };
    if !api.starts_with("https://") && !api.starts_with("http://") {
        return Err(KubernetesError::BadApiUrl { url: api });
    }
    Ok(api)
}

/// `https://HOST:PORT` of the in-cluster service, IPv6 hosts bracketed.
pub fn api_url_from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let host = env("KUBERNETES_SERVICE_HOST")?;
    let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Some(format!("https://{host}:{port}"))
}

pub fn read_token(path: &Path) -> Result<String, KubernetesError> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|source| KubernetesError::ReadToken {
            path: path.to_path_buf(),
            source,
        })
}

pub fn read_ca_certificates(path: &Path) -> Result<Vec<Certificate<'static>>, KubernetesError> {
    read_ca(path)
}

pub fn read_ca(path: &Path) -> Result<Vec<Certificate<'static>>, KubernetesError> {
    use crate::http_client::{ClientError, pem_certificates};
    let certs = pem_certificates(path).map_err(|e| match e {
        ClientError::ReadCa { path, source } => KubernetesError::ReadCa { path, source },
        _ => KubernetesError::NoCertificate {
            path: path.to_path_buf(),
        },
    })?;
    Ok(certs
        .iter()
        .map(|der| Certificate::from_der(der).to_owned())
        .collect())
}

/// Query-string encoding: everything but RFC 3986's unreserved characters.
pub fn percent_encode(text: &str) -> String {
    const QUERY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, QUERY).to_string()
}

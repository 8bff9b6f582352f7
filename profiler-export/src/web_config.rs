//! Prometheus exporter-toolkit's web config (`web_config_file`, YAML), the
//! parts the agent implements: `tls_server_config` and `basic_auth_users`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::access::AuthError;

/// exporter-toolkit's web config, the parts the agent implements.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct WebConfig {
    pub tls_server_config: Option<TlsServerConfig>,
    /// user name -> bcrypt hash of the password.
    pub basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TlsServerConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// NoClientCert (default), RequestClientCert, RequireAnyClientCert,
    /// VerifyClientCertIfGiven, RequireAndVerifyClientCert.
    pub client_auth_type: String,
    pub client_ca_file: PathBuf,
    /// TLS12 (default) or TLS13.
    pub min_version: String,
}

impl WebConfig {
    /// Parses the YAML text of a web config at `path` (relative file names
    /// in it are relative to its directory, as in exporter-toolkit).
    pub fn parse(text: &str, path: &Path) -> Result<WebConfig, AuthError> {
        let mut config: WebConfig =
            serde_yaml_ng::from_str(text).map_err(|e| AuthError::WebConfig {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(tls) = &mut config.tls_server_config {
            for file in [
                &mut tls.cert_file,
                &mut tls.key_file,
                &mut tls.client_ca_file,
            ] {
                if !file.as_os_str().is_empty() && file.is_relative() {
                    *file = dir.join(&*file);
                }
            }
            if tls.cert_file.as_os_str().is_empty() || tls.key_file.as_os_str().is_empty() {
                return Err(AuthError::WebConfig {
                    path: path.to_path_buf(),
                    reason: "tls_server_config needs cert_file and key_file".into(),
                });
            }
        }
        for (user, hash) in &config.basic_auth_users {
            if !hash.starts_with("$2") {
                return Err(AuthError::WebConfig {
                    path: path.to_path_buf(),
                    reason: format!("basic_auth_users.{user} is not a bcrypt hash ($2y$...)"),
                });
            }
        }
        Ok(config)
    }
}

//! The blocking HTTP client push exporters share: rustls, a custom CA when
//! configured, basic or bearer auth, `X-Scope-OrgID`, one timeout per
//! request. Each exporter owns one on its own thread.

use base64::Engine as _;
use serde::Deserialize;
use std::path::PathBuf;

use std::time::Duration;

use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use crate::ExportError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading the CA file {path}: {source}")]
    ReadCa {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the CA file {path} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: std::path::PathBuf },
    #[error("starting the exporter's I/O runtime: {source}")]
    Runtime { source: std::io::Error },
}

pub struct HttpClient {
    agent: ureq::Agent,
    headers: Vec<(String, String)>,
}

impl HttpClient {
    pub fn new(config: &HttpConfig) -> Result<HttpClient, ClientError> {
        let mut tls = TlsConfig::builder();
        if let Some(certs) = ca_certificates(config)? {
            let certs: Vec<Certificate<'static>> = certs
                .iter()
                .map(|der| Certificate::from_der(der).to_owned())
                .collect();
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout.max(Duration::from_millis(1))))
            .http_status_as_error(false)
            .tls_config(tls.build())
            .build()
            .into();
        Ok(HttpClient {
            agent,
            headers: auth_headers(config),
        })
    }

    /// POSTs `body`; any 2xx is success, anything else an error carrying
    /// the start of the answer (backends explain themselves there).
    pub fn post(
        &self,
        url: &str,
        content_type: &str,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), ExportError> {
        let mut request = self.agent.post(url).header("Content-Type", content_type);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let mut response = request.send(body).map_err(|e| ExportError::Http {
            url: url.to_string(),
            message: e.to_string(),
        })?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let body = response
            .body_mut()
            .with_config()
            .limit(1024)
            .read_to_string()
            .unwrap_or_default();
        Err(ExportError::Status {
            url: url.to_string(),
            status,
            body,
        })
    }
}

/// The DER certificates of the configured CA file; None when no file is
/// configured (the Mozilla roots are trusted then).
pub fn ca_certificates(config: &HttpConfig) -> Result<Option<Vec<Vec<u8>>>, ClientError> {
    if config.ca_file.as_os_str().is_empty() {
        return Ok(None);
    }
    pem_certificates(&config.ca_file).map(Some)
}

/// The DER certificates of a PEM file; an error names the file when it
/// cannot be read or holds none.
pub fn pem_certificates(path: &std::path::Path) -> Result<Vec<Vec<u8>>, ClientError> {
    let pem = std::fs::read(path).map_err(|source| ClientError::ReadCa {
        path: path.to_path_buf(),
        source,
    })?;
    let certs: Vec<Vec<u8>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(cert)) => Some(cert.der().to_vec()),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(ClientError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// `X-Scope-OrgID` and `Authorization` (bearer, else basic) as configured.
pub fn auth_headers(config: &HttpConfig) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    if !config.tenant_id.is_empty() {
        headers.push(("X-Scope-OrgID".into(), config.tenant_id.clone()));
    }
    if !config.bearer_token.is_empty() {
        headers.push((
            "Authorization".into(),
            format!("Bearer {}", config.bearer_token),
        ));
    } else if !config.basic_auth_username.is_empty() {
        let credentials = format!(
            "{}:{}",
            config.basic_auth_username, config.basic_auth_password
        );
        headers.push((
            "Authorization".into(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials)
            ),
        ));
    }
    headers
}

/// How a push exporter talks HTTP.
#[derive(serde::Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Sent as `X-Scope-OrgID` (multi-tenant Pyroscope, Grafana Cloud).
    pub tenant_id: String,
    /// HTTP basic authentication's user (with `basic_auth_password`).
    pub basic_auth_username: String,
    /// HTTP basic authentication's password.
    pub basic_auth_password: String,
    /// Sent as `Authorization: Bearer ...`.
    pub bearer_token: String,
    /// PEM file of CA certificates to trust instead of the Mozilla roots.
    pub ca_file: PathBuf,
    /// Per request, connect to last byte.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            tenant_id: String::new(),
            basic_auth_username: String::new(),
            basic_auth_password: String::new(),
            bearer_token: String::new(),
            ca_file: PathBuf::new(),
            timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").unwrap();
        let config = HttpConfig {
            ca_file: path,
            ..HttpConfig::default()
        };
        let error = HttpClient::new(&config).err().unwrap();
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
    }

    #[test]
    fn basic_auth_is_the_rfc7617_header_and_a_bearer_token_wins() {
        let mut config = HttpConfig {
            tenant_id: "team-a".into(),
            basic_auth_username: "Aladdin".into(),
            basic_auth_password: "open sesame".into(),
            ..HttpConfig::default()
        };
        // RFC 7617's own example.
        assert_eq!(
            auth_headers(&config),
            [
                ("X-Scope-OrgID".to_string(), "team-a".to_string()),
                (
                    "Authorization".to_string(),
                    "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==".to_string()
                ),
            ]
        );
        config.bearer_token = "t0k3n".into();
        assert_eq!(
            auth_headers(&config)[1],
            ("Authorization".to_string(), "Bearer t0k3n".to_string())
        );
    }
}

//! The listener's TLS: rustls from an exporter-toolkit `tls_server_config`,
//! with client certificates (mTLS) when asked.

use std::sync::Arc;

use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

use crate::access::AuthError;
use crate::web_config::TlsServerConfig;

fn tls_error(path: &std::path::Path, reason: impl std::fmt::Display) -> AuthError {
    AuthError::Tls {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// A TLS acceptor for `config` (files read now).
pub fn acceptor(config: &TlsServerConfig) -> Result<tokio_rustls::TlsAcceptor, AuthError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&config.cert_file)
        .map_err(|e| tls_error(&config.cert_file, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error(&config.cert_file, e))?;
    if certs.is_empty() {
        return Err(tls_error(&config.cert_file, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&config.key_file)
        .map_err(|e| tls_error(&config.key_file, format!("no usable private key: {e}")))?;
    let versions: &[&rustls::SupportedProtocolVersion] = match config.min_version.as_str() {
        "" | "TLS12" => &[&rustls::version::TLS12, &rustls::version::TLS13],
        "TLS13" => &[&rustls::version::TLS13],
        other => {
            return Err(tls_error(
                &config.cert_file,
                format!("min_version {other:?}: use TLS12 or TLS13"),
            ));
        }
    };
    let builder =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .map_err(|e| tls_error(&config.cert_file, e))?;
    let builder = match config.client_auth_type.as_str() {
        "" | "NoClientCert" => builder.with_no_client_auth(),
        kind @ ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven") => {
            let mut roots = RootCertStore::empty();
            let ca_certs = CertificateDer::pem_file_iter(&config.client_ca_file)
                .map_err(|e| tls_error(&config.client_ca_file, e))?;
            for cert in ca_certs {
                roots
                    .add(cert.map_err(|e| tls_error(&config.client_ca_file, e))?)
                    .map_err(|e| tls_error(&config.client_ca_file, e))?;
            }
            if roots.is_empty() {
                return Err(tls_error(
                    &config.client_ca_file,
                    "no CA certificate in the file",
                ));
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            let verifier = if kind == "VerifyClientCertIfGiven" {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| tls_error(&config.client_ca_file, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        other => {
            return Err(tls_error(
                &config.cert_file,
                format!(
                    "client_auth_type {other:?} is not supported: use NoClientCert, \
                     VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                ),
            ));
        }
    };
    let mut server = builder
        .with_single_cert(certs, key)
        .map_err(|e| tls_error(&config.key_file, e))?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
}

//! The vocabulary of the listener's access control, shared by its parts
//! (the web config, TLS, the Kubernetes reviews): what a request may do,
//! and what can go wrong setting it up.

use std::path::PathBuf;

/// What a request may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// No credentials, or credentials nobody accepts: 401.
    Unauthenticated(String),
    /// Authenticated, but not allowed this path: 403.
    Forbidden(String),
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid web config: {reason}")]
    WebConfig { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Tls { path: PathBuf, reason: String },
    #[error("{path} holds no token")]
    EmptyToken { path: PathBuf },
    #[error("[auth] kubernetes = true: {0}")]
    Kubernetes(String),
}

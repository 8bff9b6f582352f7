//! Who may pull profiles and metrics from the agent's listener.
//!
//! In the conventions people already use:
//! - Prometheus exporter-toolkit's web config (`web_config_file`, YAML):
//!   `tls_server_config` (`cert_file`, `key_file`, `client_auth_type`,
//!   `client_ca_file`, `min_version`) and `basic_auth_users` (user: bcrypt
//!   hash). The file is re-read when it changes, so rotated certificates and
//!   users apply to the next connection.
//! - A bearer token read from a file (`bearer_token_file`).
//! - kube-rbac-proxy's model without the sidecar (`kubernetes = true`): the
//!   caller's bearer token is checked with a TokenReview and the request
//!   authorized with a SubjectAccessReview (`get` on the request's path as a
//!   non-resource URL), both answers cached for `cache_seconds`, so
//!   Prometheus, Parca or Pyroscope scrape with their own service accounts.
//!
//! A request passes if any configured method accepts it (a verified client
//! certificate counts as one). `/healthz` and `/readyz` stay open: the
//! kubelet probes them, and they reveal nothing. With nothing configured,
//! everything is open (the listener then should be on loopback, or behind a
//! NetworkPolicy: docs/security.md).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use serde::Deserialize;

use crate::kubernetes_api::KubernetesConfig;
use crate::web_config::WebConfig;

use crate::access::{AuthError, Decision};

/// `[auth]` of the agent's configuration.
// Serialize: the agent's config-keys test reads every key from the types.
#[derive(
    serde::Serialize, schemars::JsonSchema, Debug, Clone, Default, PartialEq, Eq, Deserialize,
)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Prometheus exporter-toolkit web config (TLS, client certificates,
    /// basic_auth_users with bcrypt hashes) for the listener; empty: none.
    // The flag's name predates the section rule (`--auth-...`).
    #[schemars(extend("x-flag" = "web-config-file"))]
    pub web_config_file: PathBuf,
    /// A file holding the bearer token callers must present; empty: none.
    #[schemars(extend("x-flag" = "bearer-token-file"))]
    pub bearer_token_file: PathBuf,
    /// Check bearer tokens with the Kubernetes API (TokenReview, then
    /// SubjectAccessReview on the path); uses `[kubernetes]`'s connection.
    pub kubernetes: bool,
    /// How long a review's answer is reused, in seconds [default: 60].
    pub cache_seconds: u64,
}

/// A file re-read when its modification time changes.
struct Watched<T> {
    path: PathBuf,
    modified: Option<SystemTime>,
    value: Arc<T>,
}

impl<T> Watched<T> {
    fn load(
        path: &Path,
        parse: &dyn Fn(&str, &Path) -> Result<T, AuthError>,
    ) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Watched {
            path: path.to_path_buf(),
            modified: std::fs::metadata(path).and_then(|m| m.modified()).ok(),
            value: Arc::new(parse(&text, path)?),
        })
    }

    /// The current value, re-read if the file changed; a file that no
    /// longer parses keeps the last good value (and is logged).
    fn current(&mut self, parse: &dyn Fn(&str, &Path) -> Result<T, AuthError>) -> Arc<T> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified != self.modified {
            self.modified = modified;
            match Watched::load(&self.path, parse) {
                Ok(fresh) => self.value = fresh.value,
                Err(error) => {
                    tracing::warn!("keeping the previous {}: {error}", self.path.display())
                }
            }
        }
        self.value.clone()
    }
}

type Parser<T> = fn(&str, &Path) -> Result<T, AuthError>;

fn parse_token(text: &str, path: &Path) -> Result<String, AuthError> {
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(AuthError::EmptyToken {
            path: path.to_path_buf(),
        });
    }
    Ok(token)
}

/// Most cached answers (reviews and bcrypt checks); beyond, the oldest go.
const MAX_CACHED: usize = 1024;

pub struct Auth {
    web: Option<Mutex<Watched<WebConfig>>>,
    token: Option<Mutex<Watched<String>>>,
    reviewer: Option<crate::token_review::Reviewer>,
    cache_for: Duration,
    /// (kind, credential) -> (when, decision).
    cache: Mutex<HashMap<(u8, String), (Instant, Decision)>>,
    tls: Mutex<Option<(Arc<WebConfig>, Option<tokio_rustls::TlsAcceptor>)>>,
}

impl Auth {
    /// No authentication: everything open.
    pub fn open() -> Auth {
        Auth {
            web: None,
            token: None,
            reviewer: None,
            cache_for: Duration::from_secs(60),
            cache: Mutex::new(HashMap::new()),
            tls: Mutex::new(None),
        }
    }

    /// Reads every configured file once (a mistake fails the start, with
    /// the file named).
    pub fn new(config: &AuthConfig, kubernetes: &KubernetesConfig) -> Result<Auth, AuthError> {
        let mut auth = Auth::open();
        if config.cache_seconds > 0 {
            auth.cache_for = Duration::from_secs(config.cache_seconds);
        }
        if !config.web_config_file.as_os_str().is_empty() {
            let parse: Parser<WebConfig> = WebConfig::parse;
            let web = Watched::load(&config.web_config_file, &parse)?;
            // A TLS configuration that does not load fails now.
            if let Some(tls) = &web.value.tls_server_config {
                crate::tls::acceptor(tls)?;
            }
            auth.web = Some(Mutex::new(web));
        }
        if !config.bearer_token_file.as_os_str().is_empty() {
            let parse: Parser<String> = parse_token;
            auth.token = Some(Mutex::new(Watched::load(
                &config.bearer_token_file,
                &parse,
            )?));
        }
        if config.kubernetes {
            auth.reviewer = Some(
                crate::token_review::Reviewer::new(kubernetes).map_err(AuthError::Kubernetes)?,
            );
        }
        Ok(auth)
    }

    /// Whether any method is configured (else every request is allowed).
    pub fn enabled(&self) -> bool {
        self.web_config()
            .is_some_and(|w| !w.basic_auth_users.is_empty() || requires_client_cert(&w))
            || self.token.is_some()
            || self.reviewer.is_some()
    }

    fn web_config(&self) -> Option<Arc<WebConfig>> {
        let parse: Parser<WebConfig> = WebConfig::parse;
        self.web
            .as_ref()
            .map(|w| w.lock().unwrap_or_else(|e| e.into_inner()).current(&parse))
    }

    /// The TLS acceptor for new connections, rebuilt when the web config
    /// changed; None for plain HTTP.
    pub fn tls_acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        let web = self.web_config()?;
        let mut cached = self.tls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((config, acceptor)) = cached.as_ref()
            && Arc::ptr_eq(config, &web)
        {
            return acceptor.clone();
        }
        let acceptor = match &web.tls_server_config {
            Some(tls) => match crate::tls::acceptor(tls) {
                Ok(acceptor) => Some(acceptor),
                Err(error) => {
                    // Keep serving with the last good one.
                    tracing::warn!("TLS configuration not reloaded: {error}");
                    return cached.as_ref().and_then(|(_, a)| a.clone());
                }
            },
            None => None,
        };
        *cached = Some((web, acceptor.clone()));
        acceptor
    }

    /// Decides on a request to `path` with the `Authorization` header
    /// `authorization`; `client_certificate` says whether the TLS handshake
    /// verified a client certificate. May block (bcrypt, the API server):
    /// call it off the accept loop.
    pub fn decide(
        &self,
        path: &str,
        authorization: Option<&str>,
        client_certificate: bool,
    ) -> Decision {
        if !self.enabled() || client_certificate {
            return Decision::Allow;
        }
        let Some(header) = authorization else {
            return Decision::Unauthenticated("credentials required".into());
        };
        match parse_authorization(header) {
            Some(Credentials::Basic { user, password }) => self.basic(&user, &password),
            Some(Credentials::Bearer(token)) => self.bearer(path, &token),
            None => Decision::Unauthenticated("unsupported Authorization header".into()),
        }
    }

    fn cached(&self, kind: u8, key: &str, compute: impl FnOnce() -> Decision) -> Decision {
        let now = Instant::now();
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, decision)) = cache.get(&(kind, key.to_string()))
                && now.duration_since(*at) < self.cache_for
            {
                return decision.clone();
            }
        }
        let decision = compute();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, (at, _)| now.duration_since(*at) < self.cache_for);
        if cache.len() >= MAX_CACHED
            && let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
        {
            cache.remove(&oldest);
        }
        cache.insert((kind, key.to_string()), (now, decision.clone()));
        decision
    }

    fn basic(&self, user: &str, password: &str) -> Decision {
        let Some(web) = self.web_config() else {
            return Decision::Unauthenticated("basic authentication is not configured".into());
        };
        let Some(hash) = web.basic_auth_users.get(user) else {
            return Decision::Unauthenticated("unknown user or wrong password".into());
        };
        // bcrypt is slow on purpose (tens of ms): a correct password is
        // checked once per cache period, as exporter-toolkit does.
        let key = format!("{user}\u{0}{password}\u{0}{hash}");
        self.cached(0, &key, || match bcrypt::verify(password, hash) {
            Ok(true) => Decision::Allow,
            _ => Decision::Unauthenticated("unknown user or wrong password".into()),
        })
    }

    fn bearer(&self, path: &str, token: &str) -> Decision {
        if let Some(expected) = &self.token {
            let parse: Parser<String> = parse_token;
            let expected = expected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .current(&parse);
            if constant_time_eq(expected.as_bytes(), token.as_bytes()) {
                return Decision::Allow;
            }
        }
        let Some(reviewer) = &self.reviewer else {
            return Decision::Unauthenticated("invalid bearer token".into());
        };
        let key = format!("{path}\u{0}{token}");
        self.cached(1, &key, || reviewer.review(token, path))
    }
}

fn requires_client_cert(web: &WebConfig) -> bool {
    web.tls_server_config.as_ref().is_some_and(|t| {
        matches!(
            t.client_auth_type.as_str(),
            "RequireAndVerifyClientCert" | "RequireAnyClientCert"
        )
    })
}

/// Credentials of an `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials {
    Basic { user: String, password: String },
    Bearer(String),
}

/// Parses `Basic base64(user:password)` and `Bearer token` (schemes are
/// case-insensitive, RFC 9110). Anything else is None.
pub fn parse_authorization(header: &str) -> Option<Credentials> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    let rest = rest.trim();
    if rest.is_empty() || rest.len() > 8192 {
        return None;
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (user, password) = text.split_once(':')?;
        Some(Credentials::Basic {
            user: user.to_string(),
            password: password.to_string(),
        })
    } else if scheme.eq_ignore_ascii_case("bearer") {
        rest.bytes()
            .all(|b| b.is_ascii_graphic())
            .then(|| Credentials::Bearer(rest.to_string()))
    } else {
        None
    }
}

/// Equality in time that does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_headers() {
        // base64("user:pa:ss")
        assert_eq!(
            parse_authorization("Basic dXNlcjpwYTpzcw=="),
            Some(Credentials::Basic {
                user: "user".into(),
                password: "pa:ss".into()
            })
        );
        assert_eq!(
            parse_authorization("bearer abc.def"),
            Some(Credentials::Bearer("abc.def".into()))
        );
        for bad in [
            "",
            "Basic",
            "Basic !!!",
            "Basic dXNlcg==", // no colon
            "Bearer ",
            "Bearer a\u{7f}b",
            "Digest x",
        ] {
            assert_eq!(parse_authorization(bad), None, "{bad:?}");
        }
        assert!(parse_authorization(&format!("Bearer {}", "a".repeat(9000))).is_none());
    }

    #[test]
    fn web_configs() {
        let path = Path::new("/etc/agent/web.yml");
        let config = WebConfig::parse(
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: /abs/tls.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n\
             basic_auth_users:\n  prometheus: $2y$10$X0h1gDsPszWURQaxFN.fiO2/P6vdvOdWvW0CX8jmz2j5j4vZjWvHm\n",
            path,
        )
        .unwrap();
        let tls = config.tls_server_config.as_ref().unwrap();
        assert_eq!(tls.cert_file, Path::new("/etc/agent/tls.crt"));
        assert_eq!(tls.key_file, Path::new("/abs/tls.key"));
        assert!(requires_client_cert(&config));
        assert!(WebConfig::parse("basic_auth_users:\n  a: plain\n", path).is_err());
        assert!(WebConfig::parse("tls_server_config:\n  cert_file: x\n", path).is_err());
        assert!(WebConfig::parse("[not a map", path).is_err());
    }

    #[test]
    fn basic_and_bearer_decisions() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let web = dir.path().join("web.yml");
        std::fs::write(&web, format!("basic_auth_users:\n  scraper: '{hash}'\n")).unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t0ken\n").unwrap();
        let auth = Auth::new(
            &AuthConfig {
                web_config_file: web,
                bearer_token_file: token.clone(),
                ..Default::default()
            },
            &KubernetesConfig::default(),
        )
        .unwrap();
        assert!(auth.enabled());
        let basic = |user: &str, password: &str| {
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            auth.decide("/metrics", Some(&format!("Basic {encoded}")), false)
        };
        assert_eq!(basic("scraper", "s3cret"), Decision::Allow);
        assert!(matches!(
            basic("scraper", "wrong"),
            Decision::Unauthenticated(_)
        ));
        assert!(matches!(
            basic("nobody", "s3cret"),
            Decision::Unauthenticated(_)
        ));
        assert_eq!(
            auth.decide("/metrics", Some("Bearer t0ken"), false),
            Decision::Allow
        );
        assert!(matches!(
            auth.decide("/metrics", Some("Bearer other"), false),
            Decision::Unauthenticated(_)
        ));
        assert!(matches!(
            auth.decide("/metrics", None, false),
            Decision::Unauthenticated(_)
        ));
        // A verified client certificate is enough.
        assert_eq!(auth.decide("/metrics", None, true), Decision::Allow);
        // The token file is re-read when it changes.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&token, "rotated").unwrap();
        assert_eq!(
            auth.decide("/metrics", Some("Bearer rotated"), false),
            Decision::Allow
        );
    }

    #[test]
    fn nothing_configured_is_open() {
        let auth = Auth::open();
        assert!(!auth.enabled());
        assert_eq!(
            auth.decide("/debug/pprof/profile", None, false),
            Decision::Allow
        );
    }
}

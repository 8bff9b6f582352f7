//! Bearer tokens checked by the Kubernetes API, as kube-rbac-proxy does:
//! a TokenReview (`authentication.k8s.io/v1`) says who the token belongs
//! to, a SubjectAccessReview (`authorization.k8s.io/v1`) whether that user
//! may `get` the request's path as a non-resource URL. The agent's own
//! service account needs `create` on both (deploy/kubernetes/rbac.yaml).

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::access::Decision;
use crate::kubernetes_api::{KubernetesConfig, api_url, read_ca_certificates, read_token};

pub struct Reviewer {
    agent: ureq::Agent,
    api: String,
    token_file: std::path::PathBuf,
}

#[derive(Deserialize)]
struct Review<S> {
    status: Option<S>,
}

#[derive(Deserialize)]
struct TokenStatus {
    #[serde(default)]
    authenticated: bool,
    #[serde(default)]
    user: UserInfo,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize, Default)]
struct UserInfo {
    #[serde(default)]
    username: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Deserialize)]
struct AccessStatus {
    #[serde(default)]
    allowed: bool,
    #[serde(default)]
    reason: String,
}

impl Reviewer {
    pub fn new(config: &KubernetesConfig) -> Result<Reviewer, String> {
        let api = api_url(config).map_err(|e| e.to_string())?;
        let mut tls = ureq::tls::TlsConfig::builder();
        if api.starts_with("https://") && !config.ca_file.as_os_str().is_empty() {
            let roots = read_ca_certificates(&config.ca_file).map_err(|e| e.to_string())?;
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&roots));
        }
        let timeout = config.timeout.max(Duration::from_millis(1));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .user_agent("profiler-agent")
            .tls_config(tls.build())
            .build()
            .into();
        Ok(Reviewer {
            agent,
            api: api.trim_end_matches('/').to_string(),
            token_file: config.token_file.clone(),
        })
    }

    fn post<S: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<S, String> {
        let url = format!("{}{path}", self.api);
        let mut request = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json");
        if !self.token_file.as_os_str().is_empty() {
            let token = read_token(&self.token_file).map_err(|e| e.to_string())?;
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let response = request
            .send(body.to_string())
            .map_err(|e| format!("POST {url}: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .into_body()
            .with_config()
            .limit(64 << 10)
            .read_to_string()
            .map_err(|e| format!("POST {url}: {e}"))?;
        if !(200..300).contains(&status) {
            let hint = if status == 401 || status == 403 {
                " (the agent's service account needs create on tokenreviews and \
                 subjectaccessreviews: deploy/kubernetes/rbac.yaml)"
            } else {
                ""
            };
            return Err(format!("POST {url}: HTTP {status}: {}{hint}", text.trim()));
        }
        let review: Review<S> =
            serde_json::from_str(&text).map_err(|e| format!("POST {url}: {e}"))?;
        review
            .status
            .ok_or_else(|| format!("POST {url}: no status in the answer"))
    }

    /// Who `token` belongs to, and whether they may `get` `path`.
    pub fn review(&self, token: &str, path: &str) -> Decision {
        let who: TokenStatus = match self.post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": { "token": token },
            }),
        ) {
            Ok(status) => status,
            Err(error) => {
                tracing::warn!("TokenReview failed: {error}");
                return Decision::Unauthenticated("the token could not be reviewed".into());
            }
        };
        if !who.authenticated {
            let why = if who.error.is_empty() {
                "token not authenticated".to_string()
            } else {
                format!("token not authenticated: {}", who.error)
            };
            return Decision::Unauthenticated(why);
        }
        let access: AccessStatus = match self.post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": who.user.username,
                    "uid": who.user.uid,
                    "groups": who.user.groups,
                    "nonResourceAttributes": { "path": path, "verb": "get" },
                },
            }),
        ) {
            Ok(status) => status,
            Err(error) => {
                tracing::warn!("SubjectAccessReview failed: {error}");
                return Decision::Forbidden("access could not be reviewed".into());
            }
        };
        if access.allowed {
            Decision::Allow
        } else {
            Decision::Forbidden(format!(
                "{} may not get {path}{}",
                who.user.username,
                if access.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", access.reason)
                }
            ))
        }
    }
}

//! HTTP to the API server: the service account's token and CA, lists and
//! watches of this node's pods.

use super::*;

pub(super) struct Client {
    pub(super) agent: ureq::Agent,
    /// `{api}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}`
    pub(super) pods_url: String,
    pub(super) token_file: PathBuf,
    pub(super) timeout: Duration,
}

impl Client {
    pub(super) fn new(
        config: &KubernetesConfig,
        node: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Client, WatcherError> {
        let api = api_url_with_env(config, env)?;
        let https = api.starts_with("https://");
        if node.is_empty() {
            return Err(WatcherError::NoNode);
        }
        if !config.token_file.as_os_str().is_empty() {
            read_token(&config.token_file)?;
        }
        let mut tls = TlsConfig::builder();
        if https && !config.ca_file.as_os_str().is_empty() {
            tls = tls.root_certs(RootCerts::new_with_certs(&read_ca(&config.ca_file)?));
        }
        let timeout = config.timeout.max(Duration::from_millis(1));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .http_status_as_error(false)
            .user_agent("profiler-agent")
            .tls_config(tls.build())
            .build()
            .into();
        let pods_url = format!(
            "{}/api/v1/pods?fieldSelector={}",
            api.trim_end_matches('/'),
            percent_encode(&format!("spec.nodeName={node}"))
        );
        Ok(Client {
            agent,
            pods_url,
            token_file: config.token_file.clone(),
            timeout,
        })
    }

    /// GET with a fresh token; non-200 answers become failures, 410 Gone
    /// its own kind.
    pub(super) fn get(&self, url: &str, body_timeout: Duration) -> Result<ureq::Body, Failure> {
        let mut request = self.agent.get(url).header("Accept", "application/json");
        if !self.token_file.as_os_str().is_empty() {
            let token = read_token(&self.token_file).map_err(|e| Failure::Other(e.to_string()))?;
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let response = request
            .config()
            .timeout_recv_body(Some(body_timeout))
            .build()
            .call()
            .map_err(|e| Failure::Other(format!("GET {url}: {e}")))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        match status {
            200 => Ok(body),
            410 => Err(Failure::Gone),
            _ => {
                let text = body
                    .with_config()
                    .limit(512)
                    .read_to_string()
                    .unwrap_or_default();
                let hint = if status == 401 || status == 403 {
                    " (the service account needs get, list and watch on pods: deploy/kubernetes/rbac.yaml)"
                } else {
                    ""
                };
                Err(Failure::Other(format!(
                    "GET {url}: HTTP {status}: {}{hint}",
                    text.trim()
                )))
            }
        }
    }
}

//! Pod, namespace and container names from the Kubernetes API server. The
//! cgroup path only gives a container id and a pod uid; people look for
//! `checkout` in namespace `shop`, not for 64 hex digits.
//!
//! One thread lists this node's pods (`fieldSelector=spec.nodeName=NODE`,
//! so memory and API load stay those of one node however large the
//! cluster) and then follows them with a watch, as the kubelet and
//! client-go's informers do: the first list is served from the API server's
//! cache (`resourceVersion=0`), a closed watch resumes from the last
//! resource version, and only a 410 Gone (that version compacted away)
//! costs a new, consistent list. The agent reads the [`PodIndex`] each
//! window; an unreachable API server means profiles without pod names,
//! never a failing agent.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

/// The server ends each watch after this long; the next one resumes.
const WATCH_SECONDS: u64 = 300;
/// How long a deleted pod stays known: its last window is labelled after
/// the fact, up to a window plus the exporters' delay later.
const DELETED_GRACE: Duration = Duration::from_secs(120);
/// Bound on one watch event (etcd refuses objects above 1.5 MiB).
const MAX_EVENT_BYTES: u64 = 16 << 20;

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
    #[serde(with = "humantime_serde_compat")]
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
        "no node name to select this node's pods: set NODE_NAME from the downward API (fieldRef spec.nodeName) or the `node` key"
    )]
    NoNode,
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
    #[error("starting the Kubernetes watcher thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// What a container id (or pod uid) resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    /// Empty when only the pod is known.
    pub container: String,
    /// See `service_name`: the app label, else the owning workload.
    pub service: String,
}

/// This node's pods, shared between the watcher (writer) and the agent.
#[derive(Clone, Default)]
pub struct PodIndex {
    inner: Arc<RwLock<Index>>,
}

impl PodIndex {
    /// By the 64-hex container id (as in `ContainerInfo::id`).
    pub fn by_container(&self, container_id: &str) -> Option<PodContainer> {
        let index = self.read();
        let (uid, name) = index.containers.get(container_id)?;
        let pod = index.pods.get(uid)?;
        Some(PodContainer {
            container: name.clone(),
            ..pod.info.clone()
        })
    }

    /// Pod-level labels (container "") for a container the pod status does
    /// not list yet: a process can start before the kubelet reports its id.
    pub fn by_pod_uid(&self, uid: &str) -> Option<PodContainer> {
        self.read().pods.get(uid).map(|pod| pod.info.clone())
    }

    /// Pods known, deleted ones still in their grace period included.
    pub fn len(&self) -> usize {
        self.read().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct Index {
    pods: HashMap<String, PodEntry>,
    /// Container id → (pod uid, container name).
    containers: HashMap<String, (String, String)>,
}

struct PodEntry {
    info: PodContainer,
    container_ids: Vec<String>,
    deleted_at: Option<Instant>,
}

impl Index {
    fn upsert(&mut self, pod: Pod) {
        let uid = pod.info.pod_uid.clone();
        if uid.is_empty() {
            return;
        }
        if let Some(old) = self.pods.remove(&uid) {
            self.forget_containers(&uid, &old.container_ids);
        }
        let mut container_ids = Vec::with_capacity(pod.containers.len());
        for (id, name) in pod.containers {
            self.containers.insert(id.clone(), (uid.clone(), name));
            container_ids.push(id);
        }
        let entry = PodEntry {
            info: pod.info,
            container_ids,
            deleted_at: None,
        };
        self.pods.insert(uid, entry);
    }

    fn delete(&mut self, uid: &str, now: Instant) {
        if let Some(pod) = self.pods.get_mut(uid) {
            pod.deleted_at.get_or_insert(now);
        }
    }

    /// A full list: pods it lacks were deleted while we were not watching.
    fn replace_all(&mut self, pods: Vec<Pod>, now: Instant) {
        let listed: HashSet<String> = pods.iter().map(|p| p.info.pod_uid.clone()).collect();
        for (uid, pod) in &mut self.pods {
            if !listed.contains(uid) {
                pod.deleted_at.get_or_insert(now);
            }
        }
        for pod in pods {
            self.upsert(pod);
        }
    }

    fn prune(&mut self, now: Instant, grace: Duration) {
        let expired: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| {
                p.deleted_at
                    .is_some_and(|at| now.duration_since(at) >= grace)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in expired {
            if let Some(pod) = self.pods.remove(&uid) {
                self.forget_containers(&uid, &pod.container_ids);
            }
        }
    }

    fn forget_containers(&mut self, uid: &str, ids: &[String]) {
        for id in ids {
            if self
                .containers
                .get(id)
                .is_some_and(|(owner, _)| owner == uid)
            {
                self.containers.remove(id);
            }
        }
    }

    fn live_pods(&self) -> usize {
        self.pods
            .values()
            .filter(|p| p.deleted_at.is_none())
            .count()
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct WatcherStats {
    /// Watch events received (bookmarks and errors included).
    pub events: AtomicU64,
    /// Full lists: the first one, then one per 410 Gone.
    pub relists: AtomicU64,
    /// Failed lists and watches (each followed by a backoff).
    pub errors: AtomicU64,
    /// The last list or watch was answered.
    pub connected: AtomicBool,
}

/// The running watcher. Its thread ends when the agent's stop flag (given
/// to [`start`]) or [`Watcher::stop`] is set, without being joined: a watch
/// blocked in a read ends by itself within `WATCH_SECONDS`, so shutdown
/// never waits on the API server. Dropping the `Watcher` does not stop it.
pub struct Watcher {
    pub index: PodIndex,
    pub stats: Arc<WatcherStats>,
    own_stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Watcher {
    /// Asks the thread to end; returns at once.
    pub fn stop(&self) {
        self.own_stop.store(true, Ordering::Relaxed);
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// Starts the watcher when enabled (`on`, or `auto` in a cluster). Ok(None)
/// when disabled or outside a cluster; errors only for `on` with a config
/// that cannot work (no API URL, node name, token or CA).
pub fn start(
    config: &KubernetesConfig,
    node: &str,
    stop: Arc<AtomicBool>,
) -> Result<Option<Watcher>, KubernetesError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    start_with_env(config, node, stop, &env)
}

/// [`start`] with the environment injected, for tests.
fn start_with_env(
    config: &KubernetesConfig,
    node: &str,
    stop: Arc<AtomicBool>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Watcher>, KubernetesError> {
    let wanted = match config.enabled {
        KubernetesMode::Off => false,
        KubernetesMode::On => true,
        KubernetesMode::Auto => {
            env("KUBERNETES_SERVICE_HOST").is_some() || !config.api_url.is_empty()
        }
    };
    if !wanted {
        return Ok(None);
    }
    let client = match Client::new(config, node, env) {
        Ok(client) => client,
        Err(error) if config.enabled == KubernetesMode::Auto => {
            tracing::info!(
                "kubernetes: pod names disabled: {error} (set [kubernetes] enabled = \"off\" to silence this)"
            );
            return Ok(None);
        }
        Err(error) => return Err(error),
    };
    let index = PodIndex::default();
    let stats = Arc::new(WatcherStats::default());
    let own_stop = Arc::new(AtomicBool::new(false));
    let watch_loop = WatchLoop {
        client,
        index: index.clone(),
        stats: stats.clone(),
        stops: [stop, own_stop.clone()],
        node: node.to_string(),
        grace: DELETED_GRACE,
        healthy: None,
    };
    let thread = std::thread::Builder::new()
        .name("kubernetes".into())
        .spawn(move || watch_loop.run())
        .map_err(KubernetesError::Spawn)?;
    Ok(Some(Watcher {
        index,
        stats,
        own_stop,
        thread,
    }))
}

/// `https://HOST:PORT` of the in-cluster service, IPv6 hosts bracketed.
/// The API server's URL: `[kubernetes] api_url`, else the in-cluster one.
pub(crate) fn api_url(config: &KubernetesConfig) -> Result<String, KubernetesError> {
    let api = if config.api_url.is_empty() {
        api_url_from_env(&|name| std::env::var(name).ok()).ok_or(KubernetesError::NoApiUrl)?
    } else {
        config.api_url.clone()
    };
    if !api.starts_with("https://") && !api.starts_with("http://") {
        return Err(KubernetesError::BadApiUrl { url: api });
    }
    Ok(api)
}

fn api_url_from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let host = env("KUBERNETES_SERVICE_HOST")?;
    let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Some(format!("https://{host}:{port}"))
}

struct Client {
    agent: ureq::Agent,
    /// `{api}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}`
    pods_url: String,
    token_file: PathBuf,
    timeout: Duration,
}

impl Client {
    fn new(
        config: &KubernetesConfig,
        node: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Client, KubernetesError> {
        let api = if config.api_url.is_empty() {
            api_url_from_env(env).ok_or(KubernetesError::NoApiUrl)?
        } else {
            config.api_url.clone()
        };
        let https = api.starts_with("https://");
        if !https && !api.starts_with("http://") {
            return Err(KubernetesError::BadApiUrl { url: api });
        }
        if node.is_empty() {
            return Err(KubernetesError::NoNode);
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
    fn get(&self, url: &str, body_timeout: Duration) -> Result<ureq::Body, Failure> {
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

pub(crate) fn read_token(path: &Path) -> Result<String, KubernetesError> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|source| KubernetesError::ReadToken {
            path: path.to_path_buf(),
            source,
        })
}

pub(crate) fn read_ca_certificates(
    path: &Path,
) -> Result<Vec<Certificate<'static>>, KubernetesError> {
    read_ca(path)
}

fn read_ca(path: &Path) -> Result<Vec<Certificate<'static>>, KubernetesError> {
    use crate::export::http_client::{ClientError, pem_certificates};
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
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

enum Failure {
    /// The resource version is too old: list again.
    Gone,
    Other(String),
}

enum Progress {
    Listed(String),
    Watched {
        events: u64,
    },
    /// 410 Gone, after `events` events of this watch.
    Gone {
        events: u64,
    },
    Stopped,
}

struct WatchLoop {
    client: Client,
    index: PodIndex,
    stats: Arc<WatcherStats>,
    /// The agent's shutdown flag and the [`Watcher`]'s own.
    stops: [Arc<AtomicBool>; 2],
    node: String,
    grace: Duration,
    /// Last state logged: one line per change, not per failure.
    healthy: Option<bool>,
}

impl WatchLoop {
    fn run(mut self) {
        // Empty: list first.
        let mut rv = String::new();
        let mut consistent = false;
        let mut backoff = Duration::from_secs(1);
        while !self.stopped() {
            let started = Instant::now();
            let result = if rv.is_empty() {
                self.list(consistent)
            } else {
                self.watch(&mut rv)
            };
            // A watch that ends at once with nothing must not spin.
            let quick = started.elapsed() < Duration::from_secs(1);
            let mut pause = false;
            match result {
                Ok(Progress::Listed(new_rv)) => {
                    rv = new_rv;
                    consistent = false;
                    backoff = Duration::from_secs(1);
                }
                Ok(Progress::Watched { events }) => pause = events == 0 && quick,
                Ok(Progress::Gone { events }) => {
                    tracing::debug!("kubernetes: resource version {rv} gone, listing again");
                    rv.clear();
                    consistent = true;
                    // Right after a list: do not alternate list and 410
                    // without a pause.
                    pause = events == 0 && quick;
                }
                Ok(Progress::Stopped) => break,
                Err(failure) => {
                    let message = match failure {
                        Failure::Gone => "HTTP 410 Gone".to_string(),
                        Failure::Other(message) => message,
                    };
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    self.set_healthy(false, &message);
                    pause = true;
                }
            }
            if pause {
                self.sleep(jitter(backoff));
                backoff = (backoff * 2).min(Duration::from_secs(60));
            } else if !rv.is_empty() {
                backoff = Duration::from_secs(1);
            }
        }
        tracing::debug!("kubernetes: watcher stopped");
    }

    fn stopped(&self) -> bool {
        self.stops.iter().any(|s| s.load(Ordering::Relaxed))
    }

    /// Sleeps in small steps so a stop is noticed within 100ms.
    fn sleep(&self, duration: Duration) {
        let until = Instant::now() + duration;
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    fn set_healthy(&mut self, ok: bool, detail: &str) {
        self.stats.connected.store(ok, Ordering::Relaxed);
        if self.healthy == Some(ok) {
            if !ok {
                tracing::debug!("kubernetes: still failing: {detail}");
            }
            return;
        }
        self.healthy = Some(ok);
        if ok {
            let pods = self.index.read().live_pods();
            let hint = if pods == 0 {
                " (none: is NODE_NAME the node's spec.nodeName?)"
            } else {
                ""
            };
            tracing::info!(
                "kubernetes: watching pods on node {} ({pods} pods){hint}",
                self.node
            );
        } else {
            tracing::warn!(
                "kubernetes: API server failing: {detail}; retrying with backoff, profiles lack pod names meanwhile"
            );
        }
    }

    fn list(&mut self, consistent: bool) -> Result<Progress, Failure> {
        // resourceVersion=0 lets the API server answer from its cache
        // instead of etcd (one list per node); after a 410 the cache may
        // be behind, so that list is a consistent read.
        let url = if consistent {
            self.client.pods_url.clone()
        } else {
            format!("{}&resourceVersion=0", self.client.pods_url)
        };
        let body = self.client.get(&url, self.client.timeout)?;
        let list: RawPodList = serde_json::from_reader(BufReader::new(body.into_reader()))
            .map_err(|e| Failure::Other(format!("GET {url}: not a pod list: {e}")))?;
        let rv = list.metadata.resource_version;
        if rv.is_empty() {
            return Err(Failure::Other(format!(
                "GET {url}: the pod list has no resourceVersion"
            )));
        }
        let pods = list.items.into_iter().map(Pod::from_raw).collect();
        let now = Instant::now();
        {
            let mut index = self.index.write();
            index.replace_all(pods, now);
            index.prune(now, self.grace);
        }
        self.stats.relists.fetch_add(1, Ordering::Relaxed);
        self.set_healthy(true, "");
        Ok(Progress::Listed(rv))
    }

    fn watch(&mut self, rv: &mut String) -> Result<Progress, Failure> {
        let url = format!(
            "{}&watch=1&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}",
            self.client.pods_url,
            percent_encode(rv)
        );
        let limit = Duration::from_secs(WATCH_SECONDS) + self.client.timeout;
        let body = match self.client.get(&url, limit) {
            Err(Failure::Gone) => return Ok(Progress::Gone { events: 0 }),
            result => result?,
        };
        self.set_healthy(true, "");
        let mut reader = BufReader::new(body.into_reader());
        let mut line = String::new();
        let mut events = 0;
        while !self.stopped() {
            line.clear();
            let read = (&mut reader)
                .take(MAX_EVENT_BYTES)
                .read_line(&mut line)
                .map_err(|e| Failure::Other(format!("reading the watch {url}: {e}")))?;
            if read == 0 {
                return Ok(Progress::Watched { events });
            }
            if !line.ends_with('\n') && read as u64 == MAX_EVENT_BYTES {
                return Err(Failure::Other(format!(
                    "{url}: a watch event above {MAX_EVENT_BYTES} bytes"
                )));
            }
            if line.trim().is_empty() {
                continue;
            }
            events += 1;
            self.stats.events.fetch_add(1, Ordering::Relaxed);
            match self.apply(&line, rv) {
                // Counts only the events before the ERROR.
                Err(Failure::Gone) => return Ok(Progress::Gone { events: events - 1 }),
                result => result?,
            }
        }
        Ok(Progress::Stopped)
    }

    /// Applies one watch event, advancing `rv`.
    fn apply(&mut self, line: &str, rv: &mut String) -> Result<(), Failure> {
        let RawEvent { kind, object } = serde_json::from_str(line)
            .map_err(|e| Failure::Other(format!("a watch event is not JSON: {e}")))?;
        let bad = |e: serde_json::Error| Failure::Other(format!("a {kind} event: {e}"));
        let now = Instant::now();
        match kind.as_str() {
            "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" => {
                let raw: RawPod = serde_json::from_value(object).map_err(bad)?;
                if !raw.metadata.resource_version.is_empty() {
                    rv.clone_from(&raw.metadata.resource_version);
                }
                let mut index = self.index.write();
                match kind.as_str() {
                    // The final object of a deleted pod may have lost its
                    // statuses: keep the ids we knew for the grace period.
                    "DELETED" => index.delete(&raw.metadata.uid, now),
                    "BOOKMARK" => {}
                    _ => index.upsert(Pod::from_raw(raw)),
                }
                index.prune(now, self.grace);
                Ok(())
            }
            "ERROR" => {
                let status: RawStatus = serde_json::from_value(object).map_err(bad)?;
                if status.code == 410 {
                    return Err(Failure::Gone);
                }
                Err(Failure::Other(format!(
                    "watch error {} {}: {}",
                    status.code, status.reason, status.message
                )))
            }
            other => {
                tracing::debug!("kubernetes: ignoring a watch event of type {other:?}");
                Ok(())
            }
        }
    }
}

/// 75% to 125% of `duration`, so agents restarted together do not retry
/// together.
fn jitter(duration: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    duration.mul_f64(0.75 + (random % 1000) as f64 / 2000.0)
}

/// One pod as the index keeps it.
struct Pod {
    /// Container "".
    info: PodContainer,
    /// (container id, container name).
    containers: Vec<(String, String)>,
}

impl Pod {
    fn from_raw(raw: RawPod) -> Pod {
        let service = service_name(&raw.metadata);
        let status = &raw.status;
        let mut containers = Vec::new();
        for container in status
            .container_statuses
            .iter()
            .chain(&status.init_container_statuses)
            .chain(&status.ephemeral_container_statuses)
        {
            // The previous instance of a restarted container too: its
            // last window is labelled after it died.
            let previous = container.last_state.terminated.as_ref();
            for id in
                std::iter::once(&container.container_id).chain(previous.map(|t| &t.container_id))
            {
                if let Some(id) = strip_scheme(id) {
                    containers.push((id, container.name.clone()));
                }
            }
        }
        let meta = raw.metadata;
        Pod {
            info: PodContainer {
                namespace: meta.namespace,
                pod: meta.name,
                pod_uid: meta.uid,
                container: String::new(),
                service,
            },
            containers,
        }
    }
}

/// `containerd://ID`, `cri-o://ID`, `docker://ID` → `ID` (lowercase, as
/// the cgroup path gives it); None before the container has started.
fn strip_scheme(container_id: &str) -> Option<String> {
    let id = container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id);
    (!id.is_empty()).then(|| id.to_ascii_lowercase())
}

/// The `service_name` of a pod's processes, the first of: the labels
/// `app.kubernetes.io/name`, `app`, `k8s-app`; the controlling workload (a
/// ReplicaSet's Deployment name, a DaemonSet, StatefulSet or Job); the pod
/// name. Stable across rollouts, unlike the pod name.
fn service_name(meta: &RawMeta) -> String {
    for key in ["app.kubernetes.io/name", "app", "k8s-app"] {
        if let Some(value) = meta.labels.get(key).filter(|v| !v.is_empty()) {
            return value.clone();
        }
    }
    let owner = meta
        .owner_references
        .iter()
        .find(|o| o.controller)
        .or(meta.owner_references.first());
    if let Some(owner) = owner {
        match owner.kind.as_str() {
            "ReplicaSet" => {
                return strip_template_hash(&owner.name, meta.labels.get("pod-template-hash"));
            }
            "DaemonSet" | "StatefulSet" | "Job" => return owner.name.clone(),
            _ => {}
        }
    }
    meta.name.clone()
}

/// `web-7d4b9c8f6d` → `web`: the `pod-template-hash` label when the name
/// ends with it, else a last segment made of the alphabet Kubernetes
/// encodes hashes in (consonants and digits without 0, 1, 3).
fn strip_template_hash(replica_set: &str, hash: Option<&String>) -> String {
    if let Some(hash) = hash.filter(|h| !h.is_empty()) {
        if let Some(base) = replica_set
            .strip_suffix(hash.as_str())
            .and_then(|b| b.strip_suffix('-'))
        {
            return base.to_string();
        }
    }
    match replica_set.rsplit_once('-') {
        Some((base, suffix))
            if !base.is_empty()
                && (1..=10).contains(&suffix.len())
                && suffix
                    .bytes()
                    .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)) =>
        {
            base.to_string()
        }
        _ => replica_set.to_string(),
    }
}

// The API's JSON: only the fields used; everything else is skipped.

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPodList {
    metadata: RawMeta,
    items: Vec<RawPod>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPod {
    metadata: RawMeta,
    status: RawPodStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawMeta {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
    labels: HashMap<String, String>,
    owner_references: Vec<RawOwner>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawOwner {
    kind: String,
    name: String,
    controller: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawPodStatus {
    container_statuses: Vec<RawContainerStatus>,
    init_container_statuses: Vec<RawContainerStatus>,
    ephemeral_container_statuses: Vec<RawContainerStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawContainerStatus {
    name: String,
    #[serde(rename = "containerID")]
    container_id: String,
    last_state: RawContainerState,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawContainerState {
    terminated: Option<RawTerminated>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawTerminated {
    #[serde(rename = "containerID")]
    container_id: String,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: serde_json::Value,
}

/// The `object` of an ERROR event (a `metav1.Status`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawStatus {
    code: u16,
    reason: String,
    message: String,
}

mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!("{text:?} is not a duration like 10s or 500ms: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;
    use std::sync::mpsc;

    use super::*;

    fn id(byte: &str) -> String {
        byte.repeat(32)
    }

    fn running(name: &str, container_id: &str) -> String {
        format!(
            r#"{{"containerID":"{container_id}","image":"docker.io/library/{name}:1","imageID":"sha256:{}","lastState":{{}},"name":"{name}","ready":true,"restartCount":0,"started":true,"state":{{"running":{{"startedAt":"2024-05-01T10:00:00Z"}}}}}}"#,
            id("9f")
        )
    }

    /// A pod as `kubectl get pod -o json` shows it, trimmed.
    fn pod(
        rv: &str,
        ns: &str,
        name: &str,
        uid: &str,
        labels: &str,
        owner: &str,
        status: &str,
    ) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"creationTimestamp":"2024-05-01T09:59:58Z","labels":{labels},"name":"{name}","namespace":"{ns}","ownerReferences":[{owner}],"resourceVersion":"{rv}","uid":"{uid}"}},"spec":{{"containers":[{{"image":"x","name":"x"}}],"nodeName":"node-a"}},"status":{{"phase":"Running","podIP":"10.244.1.7",{status}}}}}"#
        )
    }

    fn owner(kind: &str, name: &str) -> String {
        format!(
            r#"{{"apiVersion":"apps/v1","blockOwnerDeletion":true,"controller":true,"kind":"{kind}","name":"{name}","uid":"0c7e5a43-1b8e-4c5e-9a51-3f0c2d6e8b11"}}"#
        )
    }

    const API_UID: &str = "5d3b3c2e-7f1a-4b7e-8d62-0a9f4e6b1c01";
    const WEB_UID: &str = "8e2f6a10-3c4d-4e5f-9a0b-1c2d3e4f5a02";
    const DB_UID: &str = "1a2b3c4d-5e6f-4a8b-9c0d-e1f2a3b4c503";

    fn api_pod(rv: &str) -> String {
        let status = format!(
            r#""containerStatuses":[{}]"#,
            running("api", &format!("containerd://{}", id("a1")))
        );
        let labels =
            r#"{"app.kubernetes.io/name":"api","statefulset.kubernetes.io/pod-name":"api-0"}"#;
        pod(
            rv,
            "shop",
            "api-0",
            API_UID,
            labels,
            &owner("StatefulSet", "api-v2"),
            &status,
        )
    }

    fn web_pod(rv: &str, sidecar: bool) -> String {
        let mut containers = running("nginx", &format!("containerd://{}", id("b2")));
        if sidecar {
            containers.push(',');
            containers.push_str(&running("istio-proxy", &format!("cri-o://{}", id("d4"))));
        }
        let status = format!(
            r#""containerStatuses":[{containers}],"initContainerStatuses":[{{"containerID":"containerd://{}","name":"wait","ready":true,"restartCount":0,"state":{{"terminated":{{"exitCode":0,"reason":"Completed"}}}}}}]"#,
            id("c3")
        );
        let labels = r#"{"pod-template-hash":"7d4b9c8f6d"}"#;
        let owner = owner("ReplicaSet", "web-7d4b9c8f6d");
        pod(
            rv,
            "default",
            "web-7d4b9c8f6d-x2x9q",
            WEB_UID,
            labels,
            &owner,
            &status,
        )
    }

    fn db_pod() -> String {
        let status = format!(
            r#""containerStatuses":[{}]"#,
            running("postgres", &format!("docker://{}", id("e5")))
        );
        pod(
            "1999",
            "shop",
            "db-0",
            DB_UID,
            "{}",
            &owner("StatefulSet", "db"),
            &status,
        )
    }

    fn list(rv: &str, pods: &[String]) -> String {
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":[{}]}}"#,
            pods.join(",")
        )
    }

    fn event(kind: &str, object: &str) -> String {
        format!(r#"{{"type":"{kind}","object":{object}}}"#)
    }

    /// A fake API server: answers lists in order, streams the test's
    /// events on the first watch (up to a 410), holds later watches open.
    struct FakeApi {
        url: String,
        /// (path and query, Authorization header) of each request.
        requests: Arc<Mutex<Vec<(String, String)>>>,
        events: mpsc::Sender<String>,
        done: Arc<AtomicBool>,
    }

    impl Drop for FakeApi {
        fn drop(&mut self) {
            self.done.store(true, Ordering::Relaxed);
        }
    }

    fn fake_api(lists: Vec<String>) -> FakeApi {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let url = format!("http://{}", server.server_addr().to_ip().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(AtomicBool::new(false));
        let (events, receiver) = mpsc::channel::<String>();
        let (recorded, finished) = (requests.clone(), done.clone());
        std::thread::spawn(move || {
            let mut lists = lists.into_iter();
            let mut first_watch = Some(receiver);
            while !finished.load(Ordering::Relaxed) {
                let Ok(Some(request)) = server.recv_timeout(Duration::from_millis(20)) else {
                    continue;
                };
                let path = request.url().to_string();
                let auth = request
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Authorization"))
                    .map(|h| h.value.as_str().to_string())
                    .unwrap_or_default();
                recorded.lock().unwrap().push((path.clone(), auth));
                if !path.contains("watch=1") {
                    let body = lists.next().unwrap_or_else(|| list("9999", &[]));
                    let _ = request.respond(tiny_http::Response::from_string(body));
                    continue;
                }
                let events = first_watch.take();
                let finished = finished.clone();
                std::thread::spawn(move || {
                    // Raw chunked HTTP: tiny_http's own responses buffer
                    // 8 KiB before sending a chunk.
                    let mut out = request.into_writer();
                    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                                Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
                    let _ = out.write_all(head.as_bytes()).and_then(|_| out.flush());
                    match events {
                        Some(events) => {
                            for event in events {
                                let line = format!("{event}\n");
                                let _ = write!(out, "{:x}\r\n{line}\r\n", line.len())
                                    .and_then(|_| out.flush());
                                if event.contains(r#""code":410"#) {
                                    break;
                                }
                            }
                        }
                        None => {
                            while !finished.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                        }
                    }
                    let _ = out.write_all(b"0\r\n\r\n").and_then(|_| out.flush());
                });
            }
        });
        FakeApi {
            url,
            requests,
            events,
            done,
        }
    }

    fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn lists_watches_and_relists_this_nodes_pods() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first-token\n").unwrap();
        let relist = list("2000", &[web_pod("1990", true), db_pod()]);
        let api = fake_api(vec![
            list("1000", &[api_pod("900"), web_pod("950", false)]),
            relist,
        ]);
        let config = KubernetesConfig {
            enabled: KubernetesMode::On,
            api_url: api.url.clone(),
            token_file: token.clone(),
            ca_file: dir.path().join("no-ca-needed-for-http"),
            ..KubernetesConfig::default()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = start_with_env(&config, "node-a", stop, &|_| None)
            .unwrap()
            .expect("enabled");
        let index = watcher.index.clone();

        // The list: services from a label and from a ReplicaSet.
        wait_for("the first list", || index.len() == 2);
        assert_eq!(
            index.by_container(&id("a1")),
            Some(PodContainer {
                namespace: "shop".into(),
                pod: "api-0".into(),
                pod_uid: API_UID.into(),
                container: "api".into(),
                service: "api".into(),
            })
        );
        let web = index.by_container(&id("b2")).unwrap();
        assert_eq!(
            (web.pod.as_str(), web.container.as_str()),
            ("web-7d4b9c8f6d-x2x9q", "nginx")
        );
        assert_eq!(web.service, "web");
        assert_eq!(index.by_container(&id("c3")).unwrap().container, "wait");
        assert_eq!(index.by_pod_uid(WEB_UID).unwrap().container, "");
        assert_eq!(index.by_container(&id("d4")), None);

        // MODIFIED: a sidecar's status appears.
        api.events
            .send(event("MODIFIED", &web_pod("1001", true)))
            .unwrap();
        wait_for("the sidecar", || index.by_container(&id("d4")).is_some());
        let sidecar = index.by_container(&id("d4")).unwrap();
        assert_eq!(
            (sidecar.container.as_str(), sidecar.service.as_str()),
            ("istio-proxy", "web")
        );

        // DELETED: still known during the grace period.
        api.events.send(event("DELETED", &api_pod("1002"))).unwrap();
        wait_for("the deletion", || {
            index
                .read()
                .pods
                .get(API_UID)
                .is_some_and(|p| p.deleted_at.is_some())
        });
        assert_eq!(index.by_container(&id("a1")).unwrap().pod, "api-0");

        // 410 Gone: a consistent relist, with the rotated token.
        std::fs::write(&token, "rotated-token\n").unwrap();
        let gone = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1000 (1500)","reason":"Expired","code":410}"#;
        api.events.send(event("ERROR", gone)).unwrap();
        wait_for("the relist", || index.by_container(&id("e5")).is_some());
        let db = index.by_container(&id("e5")).unwrap();
        assert_eq!((db.pod.as_str(), db.service.as_str()), ("db-0", "db"));
        assert_eq!(
            index.by_container(&id("d4")).unwrap().container,
            "istio-proxy"
        );
        // The deleted pod is absent from the relist but within its grace.
        assert!(index.by_pod_uid(API_UID).is_some());
        wait_for("the watch after the relist", || {
            api.requests.lock().unwrap().len() >= 4
        });

        let requests = api.requests.lock().unwrap().clone();
        let base = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a";
        assert_eq!(requests[0].0, format!("{base}&resourceVersion=0"));
        let watch = "&watch=1&resourceVersion=1000&allowWatchBookmarks=true&timeoutSeconds=300";
        assert_eq!(requests[1].0, format!("{base}{watch}"));
        assert_eq!(requests[2].0, base, "after a 410 the list is consistent");
        assert!(
            requests[3].0.contains("&watch=1&resourceVersion=2000&"),
            "{requests:?}"
        );
        let tokens: Vec<&str> = requests.iter().map(|(_, auth)| auth.as_str()).collect();
        assert_eq!(tokens[..2], ["Bearer first-token"; 2]);
        assert_eq!(tokens[2..4], ["Bearer rotated-token"; 2]);
        assert_eq!(watcher.stats.relists.load(Ordering::Relaxed), 2);
        assert_eq!(watcher.stats.events.load(Ordering::Relaxed), 3);
        assert_eq!(watcher.stats.errors.load(Ordering::Relaxed), 0);
        assert!(watcher.stats.connected.load(Ordering::Relaxed));

        // Stopping: the held watch ends with the server, the thread with it.
        watcher.stop();
        drop(api);
        wait_for("the thread to end", || watcher.is_finished());
    }

    fn env_in_cluster(name: &str) -> Option<String> {
        match name {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
            "KUBERNETES_SERVICE_PORT" => Some("443".into()),
            _ => None,
        }
    }

    #[test]
    fn off_outside_a_cluster_or_when_asked() {
        let stop = Arc::new(AtomicBool::new(false));
        let auto = KubernetesConfig::default();
        assert!(
            start_with_env(&auto, "node-a", stop.clone(), &|_| None)
                .unwrap()
                .is_none()
        );
        let off = KubernetesConfig {
            enabled: KubernetesMode::Off,
            ..KubernetesConfig::default()
        };
        assert!(
            start_with_env(&off, "node-a", stop.clone(), &env_in_cluster)
                .unwrap()
                .is_none()
        );
        // In a cluster without a mounted token, auto quietly stays off.
        let dir = tempfile::tempdir().unwrap();
        let no_token = KubernetesConfig {
            token_file: dir.path().join("token"),
            ..KubernetesConfig::default()
        };
        assert!(
            start_with_env(&no_token, "node-a", stop, &env_in_cluster)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn on_with_an_unusable_config_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let token = dir.path().join("token");
        let on = KubernetesConfig {
            enabled: KubernetesMode::On,
            token_file: token.clone(),
            ..KubernetesConfig::default()
        };
        let error = start_with_env(&on, "node-a", stop.clone(), &env_in_cluster)
            .err()
            .unwrap();
        assert!(
            matches!(error, KubernetesError::ReadToken { .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains(&token.display().to_string()),
            "{error}"
        );

        let error = start_with_env(&on, "node-a", stop.clone(), &|_| None)
            .err()
            .unwrap();
        assert!(
            error.to_string().contains("KUBERNETES_SERVICE_HOST"),
            "{error}"
        );
        std::fs::write(&token, "t").unwrap();
        let error = start_with_env(&on, "", stop.clone(), &env_in_cluster)
            .err()
            .unwrap();
        assert!(error.to_string().contains("NODE_NAME"), "{error}");
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "not a certificate").unwrap();
        let bad_ca = KubernetesConfig { ca_file: ca, ..on };
        let error = start_with_env(&bad_ca, "node-a", stop, &env_in_cluster)
            .err()
            .unwrap();
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
    }

    #[test]
    fn api_url_and_config() {
        assert_eq!(
            api_url_from_env(&env_in_cluster).unwrap(),
            "https://10.96.0.1:443"
        );
        let v6 =
            |name: &str| (name == "KUBERNETES_SERVICE_HOST").then(|| "fd00:10:96::1".to_string());
        assert_eq!(
            api_url_from_env(&v6).unwrap(),
            "https://[fd00:10:96::1]:443"
        );
        let config: KubernetesConfig =
            toml::from_str("enabled = \"on\"\ntimeout = \"5s\"").unwrap();
        assert_eq!(config.enabled, KubernetesMode::On);
        assert_eq!(config.timeout, Duration::from_secs(5));
        assert_eq!(config.token_file, KubernetesConfig::default().token_file);
        assert!(toml::from_str::<KubernetesConfig>("enabled = \"maybe\"").is_err());
        assert!(toml::from_str::<KubernetesConfig>("namespace = \"x\"").is_err());
        assert_eq!("off".parse::<KubernetesMode>(), Ok(KubernetesMode::Off));
    }

    /// `kubectl get pod -o json` of a restarted pod with an init container,
    /// an ephemeral debug container and a container still waiting.
    const KUBECTL_POD: &str = r#"{
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "creationTimestamp": "2024-05-01T09:59:58Z",
            "generateName": "checkout-6b7f9d4c5d-",
            "labels": {"app": "checkout", "pod-template-hash": "6b7f9d4c5d"},
            "name": "checkout-6b7f9d4c5d-q8w2n",
            "namespace": "shop",
            "ownerReferences": [{"apiVersion": "apps/v1", "blockOwnerDeletion": true,
                "controller": true, "kind": "ReplicaSet", "name": "checkout-6b7f9d4c5d",
                "uid": "3f0c2d6e-8b11-4c5e-9a51-0c7e5a431b8e"}],
            "resourceVersion": "48213",
            "uid": "9b8a7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "checkout", "image": "shop/checkout:2.1"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"containerID": "containerd://AABBCCDDEEFF00112233445566778899AABBCCDDEEFF00112233445566778899",
                 "image": "shop/checkout:2.1", "imageID": "shop/checkout@sha256:00",
                 "lastState": {"terminated": {"containerID": "containerd://1111111111111111111111111111111111111111111111111111111111111111",
                     "exitCode": 137, "finishedAt": "2024-05-01T10:05:00Z", "reason": "OOMKilled",
                     "startedAt": "2024-05-01T10:00:01Z"}},
                 "name": "checkout", "ready": true, "restartCount": 1, "started": true,
                 "state": {"running": {"startedAt": "2024-05-01T10:05:01Z"}}},
                {"image": "shop/cache:1", "imageID": "", "lastState": {}, "name": "cache", "ready": false,
                 "restartCount": 0, "started": false,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
            "ephemeralContainerStatuses": [
                {"containerID": "cri-o://2222222222222222222222222222222222222222222222222222222222222222",
                 "image": "busybox", "imageID": "", "lastState": {}, "name": "debugger-x7k2p",
                 "ready": false, "restartCount": 0, "state": {"running": {"startedAt": "2024-05-01T11:00:00Z"}}}
            ],
            "hostIP": "192.168.1.10",
            "phase": "Running",
            "podIP": "10.244.1.7",
            "qosClass": "Burstable",
            "startTime": "2024-05-01T09:59:58Z"
        }
    }"#;

    #[test]
    fn container_ids_from_real_pod_json() {
        let pod = Pod::from_raw(serde_json::from_str(KUBECTL_POD).unwrap());
        assert_eq!(pod.info.service, "checkout");
        assert_eq!(pod.info.namespace, "shop");
        assert_eq!(pod.info.pod_uid, "9b8a7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d");
        let containers: Vec<(&str, &str)> = pod
            .containers
            .iter()
            .map(|(id, name)| (id.as_str(), name.as_str()))
            .collect();
        assert_eq!(
            containers,
            [
                (
                    "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899",
                    "checkout"
                ),
                (&*"1".repeat(64), "checkout"),
                (&*"2".repeat(64), "debugger-x7k2p"),
            ]
        );
        assert_eq!(strip_scheme("docker://ABC"), Some("abc".into()));
        assert_eq!(strip_scheme("containerd://"), None);
        assert_eq!(strip_scheme(""), None);
    }

    #[test]
    fn service_names() {
        let meta = |json: &str| -> RawMeta { serde_json::from_str(json).unwrap() };
        let name = |json: &str| service_name(&meta(json));
        let labelled = r#"{"name":"p","labels":{"k8s-app":"kube-dns","app":"dns","app.kubernetes.io/name":"coredns"}}"#;
        assert_eq!(name(labelled), "coredns");
        assert_eq!(
            name(r#"{"name":"p","labels":{"k8s-app":"kube-dns","app":"dns"}}"#),
            "dns"
        );
        assert_eq!(
            name(r#"{"name":"p","labels":{"k8s-app":"kube-dns"}}"#),
            "kube-dns"
        );
        let rs = |rs: &str, labels: &str| {
            name(&format!(
                r#"{{"name":"p","labels":{labels},"ownerReferences":[{{"kind":"ReplicaSet","name":"{rs}","controller":true}}]}}"#
            ))
        };
        assert_eq!(
            rs("web-7d4b9c8f6d", r#"{"pod-template-hash":"7d4b9c8f6d"}"#),
            "web"
        );
        assert_eq!(
            rs("web-7d4b9c8f6d", "{}"),
            "web",
            "the hash recognised without its label"
        );
        assert_eq!(rs("my-app", "{}"), "my-app", "vowels: not a hash");
        assert_eq!(rs("frontend", "{}"), "frontend");
        let owned = |kind: &str| {
            name(&format!(
                r#"{{"name":"pod-1","ownerReferences":[{{"kind":"{kind}","name":"owner-28391234"}}]}}"#
            ))
        };
        assert_eq!(owned("DaemonSet"), "owner-28391234");
        assert_eq!(owned("StatefulSet"), "owner-28391234");
        assert_eq!(owned("Job"), "owner-28391234");
        assert_eq!(owned("Node"), "pod-1", "static pods: the pod name");
        assert_eq!(name(r#"{"name":"bare"}"#), "bare");
    }

    #[test]
    fn deleted_pods_are_forgotten_after_the_grace_period() {
        let mut index = Index::default();
        let t0 = Instant::now();
        let pod = |uid: &str, container: &str| Pod {
            info: PodContainer {
                namespace: "ns".into(),
                pod: format!("pod-{uid}"),
                pod_uid: uid.into(),
                container: String::new(),
                service: "s".into(),
            },
            containers: vec![(container.into(), "c".into())],
        };
        index.upsert(pod("u1", "c1"));
        index.upsert(pod("u2", "c2"));
        index.delete("u1", t0);
        // A relist without u2: deleted too, a minute later.
        index.replace_all(vec![pod("u3", "c3")], t0 + Duration::from_secs(60));
        index.prune(t0 + Duration::from_secs(90), DELETED_GRACE);
        assert_eq!(index.pods.len(), 3);
        index.prune(t0 + Duration::from_secs(150), DELETED_GRACE);
        assert!(!index.pods.contains_key("u1") && !index.containers.contains_key("c1"));
        assert!(index.pods.contains_key("u2"));
        index.prune(t0 + Duration::from_secs(181), DELETED_GRACE);
        assert_eq!(index.pods.keys().collect::<Vec<_>>(), ["u3"]);
        assert_eq!(index.containers.len(), 1);
        // An update replaces the container ids.
        index.upsert(pod("u3", "c4"));
        assert_eq!(index.containers.keys().collect::<Vec<_>>(), ["c4"]);
    }
}

//! The watcher's thread: list, then watch from the last resource version,
//! relisting only on 410 Gone; backoff with jitter.

use super::*;

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
    pub(super) own_stop: Arc<AtomicBool>,
    pub(super) thread: JoinHandle<()>,
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
) -> Result<Option<Watcher>, WatcherError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    start_with_env(config, node, stop, &env)
}

/// [`start`] with the environment injected, for tests.
pub(super) fn start_with_env(
    config: &KubernetesConfig,
    node: &str,
    stop: Arc<AtomicBool>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Watcher>, WatcherError> {
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
        .map_err(WatcherError::Spawn)?;
    Ok(Some(Watcher {
        index,
        stats,
        own_stop,
        thread,
    }))
}

pub(super) enum Failure {
    /// The resource version is too old: list again.
    Gone,
    Other(String),
}

pub(super) enum Progress {
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

pub(super) struct WatchLoop {
    pub(super) client: Client,
    pub(super) index: PodIndex,
    pub(super) stats: Arc<WatcherStats>,
    /// The agent's shutdown flag and the [`Watcher`]'s own.
    pub(super) stops: [Arc<AtomicBool>; 2],
    pub(super) node: String,
    pub(super) grace: Duration,
    /// Last state logged: one line per change, not per failure.
    pub(super) healthy: Option<bool>,
}

impl WatchLoop {
    pub(super) fn run(mut self) {
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

    pub(super) fn stopped(&self) -> bool {
        self.stops.iter().any(|s| s.load(Ordering::Relaxed))
    }

    /// Sleeps in small steps so a stop is noticed within 100ms.
    pub(super) fn sleep(&self, duration: Duration) {
        let until = Instant::now() + duration;
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    pub(super) fn set_healthy(&mut self, ok: bool, detail: &str) {
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

    pub(super) fn list(&mut self, consistent: bool) -> Result<Progress, Failure> {
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

    pub(super) fn watch(&mut self, rv: &mut String) -> Result<Progress, Failure> {
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
    pub(super) fn apply(&mut self, line: &str, rv: &mut String) -> Result<(), Failure> {
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
pub(super) fn jitter(duration: Duration) -> Duration {
    duration.mul_f64(0.75 + fastrand::f64() / 2.0)
}

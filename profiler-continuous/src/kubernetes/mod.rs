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

mod client;
mod index;
mod pod;
#[cfg(test)]
mod tests;
mod watch;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;
use ureq::tls::{RootCerts, TlsConfig};

// The API connection (config, URL, token, CA) is the export crate's: the
// listener's TokenReview uses it too.
pub use self::index::{PodContainer, PodIndex};
pub use self::watch::{Watcher, WatcherStats, start};
use self::{client::*, pod::*, watch::*};
pub use profiler_export::kubernetes_api::{
    KubernetesConfig, KubernetesError, KubernetesMode, api_url, api_url_from_env, api_url_with_env,
    percent_encode, read_ca, read_ca_certificates, read_token,
};

/// Why the pod watcher could not start: the API connection's settings, or
/// what only the watcher needs.
#[derive(Debug, thiserror::Error)]
pub enum WatcherError {
    #[error(transparent)]
    Api(#[from] KubernetesError),
    #[error(
        "no node name to select this node's pods: set NODE_NAME from the downward API (fieldRef spec.nodeName) or the `node` key"
    )]
    NoNode,
    #[error("starting the Kubernetes watcher thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// The server ends each watch after this long; the next one resumes.
const WATCH_SECONDS: u64 = 300;
/// How long a deleted pod stays known: its last window is labelled after
/// the fact, up to a window plus the exporters' delay later.
const DELETED_GRACE: Duration = Duration::from_secs(120);
/// Bound on one watch event (etcd refuses objects above 1.5 MiB).
const MAX_EVENT_BYTES: u64 = 16 << 20;

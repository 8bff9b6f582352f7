//! One pod as the API returns it and as the index keeps it, and the
//! service name of its processes.

use super::*;

/// One pod as the index keeps it.
pub(super) struct Pod {
    /// Container "".
    pub(super) info: PodContainer,
    /// (container id, container name).
    pub(super) containers: Vec<(String, String)>,
}

impl Pod {
    pub(super) fn from_raw(raw: RawPod) -> Pod {
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
pub(super) fn strip_scheme(container_id: &str) -> Option<String> {
    let id = container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id);
    (!id.is_empty()).then(|| id.to_ascii_lowercase())
}

/// The `service_name` of a pod's processes, the first of: the labels
/// `app.kubernetes.io/name`, `app`, `k8s-app`; the controlling workload (a
/// ReplicaSet's Deployment name, a DaemonSet, StatefulSet or Job); the pod
/// name. Stable across rollouts, unlike the pod name.
pub(super) fn service_name(meta: &RawMeta) -> String {
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
pub(super) fn strip_template_hash(replica_set: &str, hash: Option<&String>) -> String {
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
pub(super) struct RawPodList {
    pub(super) metadata: RawMeta,
    pub(super) items: Vec<RawPod>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawPod {
    pub(super) metadata: RawMeta,
    pub(super) status: RawPodStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct RawMeta {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) uid: String,
    pub(super) resource_version: String,
    pub(super) labels: HashMap<String, String>,
    pub(super) owner_references: Vec<RawOwner>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawOwner {
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) controller: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct RawPodStatus {
    pub(super) container_statuses: Vec<RawContainerStatus>,
    pub(super) init_container_statuses: Vec<RawContainerStatus>,
    pub(super) ephemeral_container_statuses: Vec<RawContainerStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct RawContainerStatus {
    pub(super) name: String,
    #[serde(rename = "containerID")]
    pub(super) container_id: String,
    pub(super) last_state: RawContainerState,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawContainerState {
    pub(super) terminated: Option<RawTerminated>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawTerminated {
    #[serde(rename = "containerID")]
    pub(super) container_id: String,
}

#[derive(Deserialize)]
pub(super) struct RawEvent {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) object: serde_json::Value,
}

/// The `object` of an ERROR event (a `metav1.Status`).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawStatus {
    pub(super) code: u16,
    pub(super) reason: String,
    pub(super) message: String,
}

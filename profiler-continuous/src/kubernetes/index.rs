//! This node's pods by container id and pod uid, as the windows read them.

use super::*;

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
    pub(super) inner: Arc<RwLock<Index>>,
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

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
pub(super) struct Index {
    pub(super) pods: HashMap<String, PodEntry>,
    /// Container id → (pod uid, container name).
    pub(super) containers: HashMap<String, (String, String)>,
}

pub(super) struct PodEntry {
    pub(super) info: PodContainer,
    pub(super) container_ids: Vec<String>,
    pub(super) deleted_at: Option<Instant>,
}

impl Index {
    pub(super) fn upsert(&mut self, pod: Pod) {
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

    pub(super) fn delete(&mut self, uid: &str, now: Instant) {
        if let Some(pod) = self.pods.get_mut(uid) {
            pod.deleted_at.get_or_insert(now);
        }
    }

    /// A full list: pods it lacks were deleted while we were not watching.
    pub(super) fn replace_all(&mut self, pods: Vec<Pod>, now: Instant) {
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

    pub(super) fn prune(&mut self, now: Instant, grace: Duration) {
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

    pub(super) fn forget_containers(&mut self, uid: &str, ids: &[String]) {
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

    pub(super) fn live_pods(&self) -> usize {
        self.pods
            .values()
            .filter(|p| p.deleted_at.is_none())
            .count()
    }
}

//! What the agent knows about each sampled process beyond its stacks: the
//! service it belongs to, its container, and in Kubernetes its pod. The
//! /proc part is read once per process and forgotten when the process has
//! exited and its last window is out; the pod is looked up in the watched
//! pod index at each use, because a container's id reaches the API server
//! (and so the index) a moment after its first process starts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::kubernetes::{PodContainer, PodIndex};
use profiler_profile::{LabelText, Labels, Profile};
use profiler_symbolize::process::{self, ContainerInfo};

/// One process's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMeta {
    /// The executable's file name, `kernel` for kernel threads: the
    /// `service_name` outside Kubernetes.
    pub service: String,
    pub container: Option<ContainerInfo>,
    /// The paths of `/proc/PID/cgroup` (the unified one first), for the
    /// `cgroups` selection.
    pub cgroups: Vec<String>,
}

/// Per-pid metadata, read on first sight.
pub struct MetadataCache {
    proc_root: PathBuf,
    entries: HashMap<u32, ProcessMeta>,
    pods: Option<PodIndex>,
}

impl Default for MetadataCache {
    fn default() -> Self {
        MetadataCache::new("/proc", None)
    }
}

impl MetadataCache {
    pub fn new(proc_root: impl Into<PathBuf>, pods: Option<PodIndex>) -> Self {
        MetadataCache {
            proc_root: proc_root.into(),
            entries: HashMap::new(),
            pods,
        }
    }

    /// The pod and container of `pid`, when it runs in a pod the API server
    /// told us about: by container id, else (a container not yet in the
    /// pod's status) by the pod uid of its cgroup, container name unknown.
    pub fn pod(&mut self, pid: u32) -> Option<PodContainer> {
        let pods = self.pods.clone()?;
        let container = self.get(pid).container.as_ref()?;
        pods.by_container(&container.id).or_else(|| {
            container
                .pod_uid
                .as_deref()
                .and_then(|uid| pods.by_pod_uid(uid))
        })
    }

    /// The `service_name` of `pid`: its pod's (app labels, else the
    /// workload's name) in Kubernetes, else its executable's name.
    pub fn service(&mut self, pid: u32) -> String {
        match self.pod(pid) {
            Some(pod) if !pod.service.is_empty() => pod.service,
            _ => self.get(pid).service.clone(),
        }
    }

    pub fn get(&mut self, pid: u32) -> &ProcessMeta {
        let root = &self.proc_root;
        self.entries.entry(pid).or_insert_with(|| {
            let cgroup = std::fs::read_to_string(root.join(pid.to_string()).join("cgroup"))
                .unwrap_or_default();
            ProcessMeta {
                service: service_name(root, pid),
                container: process::parse_cgroup(&cgroup),
                cgroups: process::cgroup_paths(&cgroup),
            }
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets processes that no longer exist; returns how many.
    /// Processes for which `still_needed` is true stay (an open pull holds
    /// their stacks).
    pub fn evict_exited(&mut self, still_needed: impl Fn(u32) -> bool) -> usize {
        let before = self.entries.len();
        let root = &self.proc_root;
        self.entries.retain(|&pid, _| {
            still_needed(pid) || root.join(pid.to_string()).join("stat").exists()
        });
        before - self.entries.len()
    }

    /// Adds `service_name`, `node`, `container_id` and `pod_uid` (when
    /// known), and in Kubernetes `namespace`, `pod` and `container`, to
    /// every sample, next to the `pid`, `comm`, `tid` and `thread` labels
    /// it has, so `go tool pprof -tagfocus` and backends can slice by them.
    pub fn label(&mut self, profile: &mut Profile, node: &str) {
        // One set of shared strings per process: the samples of a process
        // all carry the same ones.
        let node: LabelText = node.into();
        let mut by_pid: HashMap<u32, Vec<(LabelText, LabelText)>> = HashMap::new();
        // Samples with the same labels share one longer list (the list
        // has the pid in it, so it has one longer form).
        let mut extended: HashMap<Labels, Labels> = HashMap::new();
        for sample in &mut profile.samples {
            if let Some(longer) = extended.get(&*sample.labels) {
                sample.labels = longer.clone();
                continue;
            }
            let Some(pid) = sample.label("pid").and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let labels = by_pid
                .entry(pid)
                .or_insert_with(|| self.labels_of(pid, &node));
            let original = sample.labels.clone();
            sample.add_labels(labels.iter().cloned());
            extended.insert(original, sample.labels.clone());
        }
    }

    fn labels_of(&mut self, pid: u32, node: &LabelText) -> Vec<(LabelText, LabelText)> {
        let service = self.service(pid);
        let pod = self.pod(pid);
        let meta = self.get(pid);
        let mut labels: Vec<(LabelText, LabelText)> = vec![
            ("service_name".into(), service.into()),
            ("node".into(), node.clone()),
        ];
        if let Some(container) = &meta.container {
            labels.push(("container_id".into(), container.id.as_str().into()));
            if let Some(uid) = &container.pod_uid {
                labels.push(("pod_uid".into(), uid.as_str().into()));
            }
        }
        if let Some(pod) = pod {
            labels.push(("namespace".into(), pod.namespace.into()));
            labels.push(("pod".into(), pod.pod.into()));
            if !pod.container.is_empty() {
                labels.push(("container".into(), pod.container.into()));
            }
        }
        labels
    }
}

/// Which processes a continuous run keeps, beyond the in-kernel pid
/// filter: any of the cgroup path prefixes, and any of the Kubernetes
/// namespaces; an empty list selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub cgroups: Vec<String>,
    pub namespaces: Vec<String>,
}

impl Selection {
    pub fn is_everything(&self) -> bool {
        self.cgroups.is_empty() && self.namespaces.is_empty()
    }
}

impl MetadataCache {
    /// Whether `pid` is in `selection`. A cgroup prefix matches whole path
    /// components (`/system.slice/nginx` does not select
    /// `/system.slice/nginx-exporter.service`); a namespace needs the pod
    /// known from the API server.
    pub fn selected(&mut self, pid: u32, selection: &Selection) -> bool {
        if selection.is_everything() {
            return true;
        }
        if !selection.cgroups.is_empty() {
            let paths = &self.get(pid).cgroups;
            let in_cgroup = selection.cgroups.iter().any(|prefix| {
                let prefix = prefix.trim_end_matches('/');
                paths.iter().any(|path| {
                    prefix.is_empty()
                        || path == prefix
                        || path
                            .strip_prefix(prefix)
                            .is_some_and(|rest| rest.starts_with('/'))
                })
            });
            if !in_cgroup {
                return false;
            }
        }
        if !selection.namespaces.is_empty() {
            let namespace = self.pod(pid).map(|p| p.namespace);
            if !namespace.is_some_and(|n| selection.namespaces.contains(&n)) {
                return false;
            }
        }
        true
    }
}

/// The executable's file name (from `/proc/PID/exe`, as seen in the
/// process's own mount namespace), else `comm` (a process that already
/// exited and awaits its parent has no executable link any more); `kernel`
/// for kernel threads (PF_KTHREAD in `/proc/PID/stat`), so that hundreds
/// of kworkers make one group, not hundreds.
pub fn service_name(proc_root: &Path, pid: u32) -> String {
    let dir = proc_root.join(pid.to_string());
    if let Ok(exe) = std::fs::read_link(dir.join("exe")) {
        let exe = exe.to_string_lossy();
        let exe = exe.trim_end_matches(" (deleted)");
        if let Some(name) = exe.rsplit('/').next().filter(|n| !n.is_empty()) {
            return name.to_string();
        }
    }
    if std::fs::read_to_string(dir.join("stat")).is_ok_and(|stat| is_kernel_thread(&stat)) {
        return "kernel".into();
    }
    let comm = std::fs::read_to_string(dir.join("comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default();
    if comm.is_empty() {
        "unknown".into()
    } else {
        comm
    }
}

/// Whether a `/proc/PID/stat` line is a kernel thread's: PF_KTHREAD in
/// its flags (field 9; the command, field 2, may hold spaces and
/// parentheses, so fields are counted after its last `)`).
fn is_kernel_thread(stat: &str) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    // rest: " S ppid pgrp session tty_nr tpgid flags ..." (fields 3..).
    rest.split_ascii_whitespace()
        .nth(6)
        .and_then(|flags| flags.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_profile::Sample;
    use std::sync::Arc;

    fn fake_proc() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let p = |pid: u32| root.path().join(pid.to_string());
        // 10: a containerized nginx (exe link), 11: a kernel thread,
        // 12: a process whose exe cannot be read.
        std::fs::create_dir_all(p(10)).unwrap();
        std::os::unix::fs::symlink("/usr/sbin/nginx (deleted)", p(10).join("exe")).unwrap();
        std::fs::write(p(10).join("stat"), "10 (nginx) S").unwrap();
        std::fs::write(
            p(10).join("cgroup"),
            format!("0::/system.slice/docker-{}.scope\n", "ab".repeat(32)),
        )
        .unwrap();
        std::fs::create_dir_all(p(11)).unwrap();
        std::fs::write(p(11).join("cmdline"), "").unwrap();
        std::fs::write(p(11).join("comm"), "kworker/0:1\n").unwrap();
        // Real kworker and zombie stat lines (flags 69238880 = PF_KTHREAD
        // | PF_WQ_WORKER | ...; 4227084 = PF_EXITING | ...).
        std::fs::write(
            p(11).join("stat"),
            "11 (kworker/0:1-events) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 9 0 0",
        )
        .unwrap();
        std::fs::create_dir_all(p(12)).unwrap();
        std::fs::write(p(12).join("cmdline"), "app\0").unwrap();
        std::fs::write(p(12).join("comm"), "app\n").unwrap();
        std::fs::create_dir_all(p(13)).unwrap();
        std::fs::write(p(13).join("cmdline"), "").unwrap();
        std::fs::write(p(13).join("comm"), "short) lived\n").unwrap();
        std::fs::write(
            p(13).join("stat"),
            "13 (short) lived) Z 1 13 13 0 -1 4227084 100 0 0 0 150 0 0 0 20 0 1 0 5 0 0",
        )
        .unwrap();
        root
    }

    #[test]
    fn service_names() {
        let root = fake_proc();
        assert_eq!(service_name(root.path(), 10), "nginx");
        assert_eq!(service_name(root.path(), 11), "kernel");
        assert_eq!(service_name(root.path(), 12), "app");
        // A zombie: no exe link, empty cmdline, but not a kernel thread.
        assert_eq!(service_name(root.path(), 13), "short) lived");
        assert_eq!(service_name(root.path(), 99), "unknown");
    }

    #[test]
    fn samples_sharing_a_label_list_share_its_longer_form() {
        let root = fake_proc();
        let mut cache = MetadataCache::new(root.path(), None);
        let shared: Labels = vec![("pid".into(), "10".into())].into();
        let other: Labels = vec![("pid".into(), "12".into())].into();
        let sample = |labels: &Labels| Sample {
            labels: labels.clone(),
            ..Sample::default()
        };
        let mut profile = Profile {
            samples: vec![sample(&shared), sample(&other), sample(&shared)],
            ..Profile::default()
        };
        cache.label(&mut profile, "node-1");
        let [a, b, c] = &profile.samples[..] else {
            panic!("three samples");
        };
        assert!(Arc::ptr_eq(&a.labels, &c.labels));
        assert!(!Arc::ptr_eq(&a.labels, &b.labels));
        assert_eq!(a.label("service_name"), Some("nginx"));
        assert_eq!(b.label("service_name"), Some("app"));
        assert_eq!(b.label("pid"), Some("12"));
        // The list they started from is not changed.
        assert_eq!(shared.len(), 1);
    }

    #[test]
    fn labels_and_eviction() {
        let root = fake_proc();
        let mut cache = MetadataCache::new(root.path(), None);
        let mut profile = Profile {
            samples: vec![Sample {
                labels: vec![("pid".into(), "10".into())].into(),
                ..Sample::default()
            }],
            ..Profile::default()
        };
        cache.label(&mut profile, "node-1");
        let sample = &profile.samples[0];
        assert_eq!(sample.label("service_name"), Some("nginx"));
        assert_eq!(sample.label("node"), Some("node-1"));
        assert_eq!(sample.label("container_id"), Some("ab".repeat(32).as_str()));
        assert_eq!(sample.label("pod_uid"), None);
        cache.get(12);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(12).cgroups.is_empty());
        // Selection by cgroup: pid 10 is in system.slice.
        let by = |cgroups: &[&str]| Selection {
            cgroups: cgroups.iter().map(|c| c.to_string()).collect(),
            namespaces: Vec::new(),
        };
        assert!(cache.selected(10, &by(&[])));
        assert!(cache.selected(10, &by(&["/system.slice"])));
        assert!(cache.selected(10, &by(&["/system.slice/"])));
        assert!(!cache.selected(10, &by(&["/system.sl"])));
        assert!(!cache.selected(10, &by(&["/kubepods.slice"])));
        // A namespace needs the API server's pod: none here.
        let namespaced = Selection {
            cgroups: Vec::new(),
            namespaces: vec!["shop".into()],
        };
        assert!(!cache.selected(10, &namespaced));
        // Pid 12 has no stat file: it counts as exited, unless an open pull
        // still needs it.
        assert_eq!(cache.evict_exited(|pid| pid == 12), 0);
        assert_eq!(cache.evict_exited(|_| false), 1);
        assert_eq!(cache.len(), 1);
    }
}

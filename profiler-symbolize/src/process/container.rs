//! Which container (and Kubernetes pod) a process runs in, from the cgroup
//! path in `/proc/PID/cgroup`.
//!
//! Container runtimes name the leaf cgroup of a container after its id, and
//! the kubelet names the pod's cgroup after the pod uid; both schemes come
//! in two flavours, the systemd cgroup driver (`.slice`/`.scope` units,
//! dashes in the pod uid turned into underscores) and the cgroupfs driver
//! (plain directories). Peers' users report empty container ids when one of
//! these is missed, so every scheme seen in the wild is tested below.

use std::path::Path;

/// The runtime whose naming scheme the cgroup path matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerRuntime {
    Containerd,
    CriO,
    Docker,
    Podman,
    /// A bare 64-hex id under `kubepods` or `docker` (cgroupfs driver):
    /// the runtime is not named in the path.
    Unknown,
}

/// A process's container, as far as its cgroup path tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The full container id (64 hex digits for every runtime above).
    pub id: String,
    pub runtime: ContainerRuntime,
    /// The Kubernetes pod uid, dashes restored, when the path is a
    /// kubelet's.
    pub pod_uid: Option<String>,
}

/// Reads `/proc/PID/cgroup` (under `proc_root`) and finds the container;
/// None for a process outside containers or one that is gone.
pub fn container_of(proc_root: &Path, pid: u32) -> Option<ContainerInfo> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    parse_cgroup(&text)
}

/// Parses the contents of `/proc/PID/cgroup` (cgroup v1, v2 or hybrid).
/// The unified (v2, `0::`) line is preferred; v1 lines are consulted when
/// it names no container, as on hybrid hosts where the runtime only
/// manages the v1 hierarchies.
pub fn parse_cgroup(text: &str) -> Option<ContainerInfo> {
    cgroup_paths(text).iter().find_map(|path| parse_path(path))
}

/// The paths of a `/proc/PID/cgroup` text: the unified (`0::`) one first,
/// then the v1 ones in file order, each once. (The one parser of that
/// file: the container is found in them, and the continuous agent's
/// `cgroups` selection matches them.)
pub fn cgroup_paths(text: &str) -> Vec<String> {
    let mut lines: Vec<(bool, String)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let unified = fields.next()? == "0";
            let _controllers = fields.next()?;
            Some((unified, fields.next()?.to_string()))
        })
        .collect();
    lines.sort_by_key(|(unified, _)| !unified);
    lines.dedup_by(|a, b| a.1 == b.1);
    lines.into_iter().map(|(_, path)| path).collect()
}

/// Finds the container id and pod uid in one cgroup path. The innermost
/// component naming a container wins: a container running systemd adds
/// its own units (`.../cri-containerd-ID.scope/init.scope`) below it.
pub fn parse_path(path: &str) -> Option<ContainerInfo> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let (index, id, mut runtime) = components
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, c)| container_component(c).map(|(id, rt)| (i, id, rt)))?;
    let parents = &components[..index];
    // Only trust a bare hex directory under a container manager's tree:
    // elsewhere 64 hex digits could be anything.
    if runtime == ContainerRuntime::Unknown
        && !parents
            .iter()
            .any(|p| p.starts_with("kubepods") || *p == "docker" || p.contains("kubelet"))
    {
        return None;
    }
    if runtime == ContainerRuntime::Unknown && parents.contains(&"docker") {
        runtime = ContainerRuntime::Docker;
    }
    let pod_uid = parents.iter().rev().find_map(|c| pod_uid(c));
    Some(ContainerInfo {
        id: id.to_string(),
        runtime,
        pod_uid,
    })
}

/// A component naming a container: `cri-containerd-ID.scope`,
/// `crio-ID.scope`, `docker-ID.scope`, `libpod-ID.scope`, or a bare `ID`
/// (cgroupfs driver). `crio-conmon-ID.scope` is CRI-O's monitor process,
/// not the container, and is not matched.
fn container_component(component: &str) -> Option<(&str, ContainerRuntime)> {
    const PREFIXES: &[(&str, ContainerRuntime)] = &[
        ("cri-containerd-", ContainerRuntime::Containerd),
        ("crio-", ContainerRuntime::CriO),
        ("docker-", ContainerRuntime::Docker),
        ("libpod-", ContainerRuntime::Podman),
    ];
    let unit = component.strip_suffix(".scope");
    for (prefix, runtime) in PREFIXES {
        if let Some(id) = unit.and_then(|u| u.strip_prefix(prefix))
            && is_container_id(id)
        {
            return Some((id, *runtime));
        }
    }
    // cgroupfs driver: containerd and docker name the directory by the id;
    // CRI-O with cgroupfs uses `crio-ID`.
    if let Some(id) = component.strip_prefix("crio-")
        && is_container_id(id)
    {
        return Some((id, ContainerRuntime::CriO));
    }
    is_container_id(component).then_some((component, ContainerRuntime::Unknown))
}

fn is_container_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod uid of a kubelet pod cgroup: `kubepods-burstable-pod<uid>.slice`
/// (systemd driver, uid with underscores) or `pod<uid>` (cgroupfs driver).
fn pod_uid(component: &str) -> Option<String> {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    // cgroupfs: the whole component; systemd: after the last dash (the
    // uid's own dashes are underscores there).
    let uid = name
        .strip_prefix("pod")
        .filter(|uid| is_uid(uid))
        .map(str::to_string)
        .or_else(|| {
            let uid = name.rsplit('-').next()?.strip_prefix("pod")?;
            Some(uid.replace('_', "-"))
        })?;
    is_uid(&uid).then_some(uid)
}

/// A Kubernetes object uid: 8-4-4-4-12 hex digits.
fn is_uid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_put_the_unified_hierarchy_first() {
        let hybrid = "12:cpu,cpuacct:/system.slice/a.service\n0::/system.slice/a.service\n";
        assert_eq!(cgroup_paths(hybrid), ["/system.slice/a.service"]);
        let v1 = "5:memory:/kubepods/burstable/pod1/abc\n4:pids:/kubepods/burstable/pod1/abc\n";
        assert_eq!(cgroup_paths(v1), ["/kubepods/burstable/pod1/abc"]);
        assert!(cgroup_paths("").is_empty());
    }

    const ID: &str = "7d7fc43c2e0f7c7d0e3b3a9e1b5f1c6a8e2f0b4d9c3a7e6f5d4c3b2a1f0e9d8c";
    const UID: &str = "0f3b6f0e-3c1d-4b9a-8e1f-2a7c5d9e4b60";

    fn parsed(text: &str) -> ContainerInfo {
        parse_cgroup(text).unwrap_or_else(|| panic!("no container in {text:?}"))
    }

    // Every sample below is the shape of a real /proc/PID/cgroup line on
    // that setup; only the ids differ.

    #[test]
    fn containerd_systemd_driver_cgroup_v2() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        let info = parsed(&text);
        assert_eq!(info.id, ID);
        assert_eq!(info.runtime, ContainerRuntime::Containerd);
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn guaranteed_pod_has_no_qos_slice() {
        let text = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        let info = parsed(&text);
        assert_eq!(info.id, ID);
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn crio_systemd_driver_and_conmon_is_not_the_container() {
        let text = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{ID}.scope\n",
            UID.replace('-', "_")
        );
        let info = parsed(&text);
        assert_eq!(info.runtime, ContainerRuntime::CriO);
        assert_eq!(info.id, ID);
        assert_eq!(info.pod_uid.as_deref(), Some(UID));

        let conmon = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-conmon-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(parse_cgroup(&conmon), None);
    }

    #[test]
    fn docker_systemd_driver() {
        let info = parsed(&format!("0::/system.slice/docker-{ID}.scope\n"));
        assert_eq!(info.runtime, ContainerRuntime::Docker);
        assert_eq!(info.id, ID);
        assert_eq!(info.pod_uid, None);
    }

    #[test]
    fn docker_cgroupfs_driver_cgroup_v1() {
        let text = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        let info = parsed(&text);
        assert_eq!(info.runtime, ContainerRuntime::Docker);
        assert_eq!(info.id, ID);
    }

    #[test]
    fn kubelet_cgroupfs_driver_cgroup_v1() {
        let text = format!(
            "12:hugetlb:/kubepods/burstable/pod{UID}/{ID}\n\
             11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n\
             1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        let info = parsed(&text);
        assert_eq!(info.id, ID);
        assert_eq!(info.runtime, ContainerRuntime::Unknown);
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn kind_nested_kubelet_slice() {
        // kind / nested kubelets prefix every unit with `kubelet-`.
        let text = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        let info = parsed(&text);
        assert_eq!(info.id, ID);
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn systemd_inside_the_container_keeps_the_container_id() {
        let text = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope/init.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(parsed(&text).id, ID);
    }

    #[test]
    fn podman() {
        let text = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n"
        );
        let info = parsed(&text);
        assert_eq!(info.runtime, ContainerRuntime::Podman);
        assert_eq!(info.id, ID);
    }

    #[test]
    fn hybrid_host_unified_line_names_no_container_but_v1_does() {
        let text = format!(
            "4:memory:/kubepods/besteffort/pod{UID}/{ID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{ID}\n0::/\n"
        );
        assert_eq!(parsed(&text).id, ID);
    }

    #[test]
    fn processes_outside_containers() {
        for text in [
            "0::/init.scope\n",
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/system.slice/containerd.service\n",
            "9:name=systemd:/\n0::/\n",
            "",
            // 64 hex digits outside a container manager's tree.
            &format!("0::/system.slice/{ID}\n"),
        ] {
            assert_eq!(parse_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn short_or_malformed_ids_are_not_containers() {
        assert_eq!(
            parse_cgroup("0::/kubepods.slice/cri-containerd-abc.scope\n"),
            None
        );
        assert_eq!(parse_path("/kubepods/burstable/podnot-a-uid/xyz"), None);
    }
}

//! The watcher against a fake API server; the index, naming and parsing.
use std::io::Write;
use std::sync::Mutex;
use std::sync::mpsc;

use super::index::Index;
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
    let labels = r#"{"app.kubernetes.io/name":"api","statefulset.kubernetes.io/pod-name":"api-0"}"#;
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
        matches!(error, WatcherError::Api(KubernetesError::ReadToken { .. })),
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
    let v6 = |name: &str| (name == "KUBERNETES_SERVICE_HOST").then(|| "fd00:10:96::1".to_string());
    assert_eq!(
        api_url_from_env(&v6).unwrap(),
        "https://[fd00:10:96::1]:443"
    );
    let config: KubernetesConfig = toml::from_str("enabled = \"on\"\ntimeout = \"5s\"").unwrap();
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

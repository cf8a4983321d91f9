//! The process kubelet: a bound Pod whose every container image is mapped to a local
//! executable ([`crate::SimConfig::run_images`]) runs as real child processes, one per
//! container, and its status follows them. Every other pod stays with the simulated kubelet.
//!
//! Pure: `spec` resolves what a container runs, `volumes` its files, `rewrite` the paths and
//! listeners a host process needs instead, `status` the pod status; `probes` and `backoff`
//! are kubelet's probe and restart rules. `supervisor` runs one pod, `logs` keeps and serves
//! the container logs. This file watches the store and starts and
//! stops supervisors; it never holds the store lock across I/O or an await.

pub(crate) mod backoff;
pub(crate) mod logs;
pub(crate) mod probes;
pub(crate) mod rewrite;
pub(crate) mod spec;
pub(crate) mod status;
mod supervisor;
pub(crate) mod volumes;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::cluster::ClusterShared;
use crate::store::{Store, deleting};
use crate::util::{get_path, meta_str};

pub use crate::cluster::ImageMap;

/// Between SIGTERM and SIGKILL when the simulator stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// After a pod change, how long to gather more before looking.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// How often to look without a change (a missed event, a lagging receiver).
const RESYNC: Duration = Duration::from_secs(5);

/// An image reference without its `:tag` and `@digest`.
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(r, _)| r);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

/// The executables of a pod's containers, when every container's image is mapped; `None`:
/// the pod is simulated. (Init containers are not run.)
pub fn programs(pod: &Value, images: &ImageMap) -> Option<Vec<PathBuf>> {
    if images.is_empty() {
        return None;
    }
    let containers = get_path(pod, "spec.containers")?.as_array()?;
    if containers.is_empty() {
        return None;
    }
    containers
        .iter()
        .map(|c| {
            let image = c.get("image").and_then(Value::as_str)?;
            images.get(repository(image)).cloned()
        })
        .collect()
}

/// Whether `path` is a regular file this user may execute.
pub fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A supervised pod.
struct Running {
    stop: watch::Sender<Option<Duration>>,
    /// The pod's `terminationGracePeriodSeconds`.
    grace: Duration,
    task: JoinHandle<()>,
}

fn terminal(p: &Value) -> bool {
    matches!(
        get_path(p, "status.phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// The node's InternalIP, as the simulated kubelet reports it.
fn host_ip(store: &Store, node: &str) -> String {
    store
        .get("/nodes", "", node)
        .and_then(|n| get_path(n, "status.addresses")?.as_array().cloned())
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str().map(str::to_string))
        .unwrap_or_else(|| "127.0.0.1".into())
}

/// A process pod to start: the pod, its executables, its IP and its node's.
type Start = (crate::store::Obj, Vec<PathBuf>, String, String);

/// Under the store lock, without I/O: the uids of the process pods that should run, and
/// those of them to start (bound, not ended, not running yet), with their addresses.
fn scan(c: &ClusterShared, live: &HashMap<String, Running>) -> (HashSet<String>, Vec<Start>) {
    let mut start = Vec::new();
    let mut present = HashSet::new();
    let mut store = c.store();
    let pods: Vec<_> = store.list("/pods", None).cloned().collect();
    for p in pods {
        let Some(programs) = programs(&p, &c.config.run_images) else {
            continue;
        };
        if deleting(&p) {
            continue;
        }
        let uid = meta_str(&p, "uid").unwrap_or_default().to_string();
        present.insert(uid.clone());
        let node = get_path(&p, "spec.nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if node.is_empty() || live.contains_key(&uid) || terminal(&p) {
            continue;
        }
        let Some(ip) = store.pod_ip(&uid) else {
            tracing::warn!(pod = meta_str(&p, "name"), "no pod IP left");
            continue;
        };
        let host_ip = host_ip(&store, node);
        start.push((p, programs, ip.to_string(), host_ip));
    }
    (present, start)
}

/// One look at the store: supervisors for new process pods, stop for pods gone or being
/// deleted.
fn reconcile(
    c: &Arc<ClusterShared>,
    dir: &Path,
    live: &mut HashMap<String, Running>,
    stopping: &mut Vec<JoinHandle<()>>,
) {
    let (present, start) = scan(c, live);
    let gone: Vec<String> = live
        .keys()
        .filter(|uid| !present.contains(*uid))
        .cloned()
        .collect();
    for r in gone.iter().filter_map(|uid| live.remove(uid)) {
        let _ = r.stop.send(Some(r.grace));
        stopping.push(r.task);
    }
    stopping.retain(|t| !t.is_finished());
    for (pod, programs, pod_ip, host_ip) in start {
        let uid = meta_str(&pod, "uid").unwrap_or_default().to_string();
        let grace = grace_of(&pod);
        let ns = meta_str(&pod, "namespace").unwrap_or_default();
        let name = meta_str(&pod, "name").unwrap_or_default();
        let run = supervisor::PodRun {
            c: c.clone(),
            dir: logs::pod_dir(dir, ns, name),
            pod,
            programs,
            pod_ip,
            host_ip,
            start_time: c.now(),
        };
        let (stop, rx) = watch::channel(None);
        let task = tokio::spawn(supervisor::supervise(run, rx));
        live.insert(uid, Running { stop, grace, task });
    }
}

/// The grace a deleted pod gets between SIGTERM and SIGKILL.
fn grace_of(pod: &Value) -> Duration {
    Duration::from_secs(
        get_path(pod, "spec.terminationGracePeriodSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(30),
    )
}

/// Waits for a pod change (or the resync period); `false` when the simulator stops.
async fn changed(
    c: &ClusterShared,
    rx: &mut broadcast::Receiver<Arc<crate::store::Event>>,
) -> bool {
    let deadline = tokio::time::sleep(RESYNC);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = c.shutdown_token().cancelled() => return false,
            _ = &mut deadline => return true,
            ev = rx.recv() => match ev {
                Ok(ev) if &*ev.res != "/pods" => continue,
                Err(broadcast::error::RecvError::Closed) => return false,
                _ => break,
            },
        }
    }
    tokio::select! {
        _ = c.shutdown_token().cancelled() => return false,
        _ = tokio::time::sleep(DEBOUNCE) => {}
    }
    while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = rx.try_recv() {}
    true
}

/// Runs the process kubelet of one cluster until the simulator stops; `dir` holds the
/// cluster's pod directories. Then stops every process (SIGTERM, [`SHUTDOWN_GRACE`],
/// SIGKILL) and waits for them.
pub(crate) async fn run(c: Arc<ClusterShared>, dir: PathBuf) {
    let mut rx = c.store().subscribe();
    let mut live: HashMap<String, Running> = HashMap::new();
    let mut stopping = Vec::new();
    loop {
        reconcile(&c, &dir, &mut live, &mut stopping);
        if !changed(&c, &mut rx).await {
            break;
        }
    }
    for r in live.values() {
        let _ = r.stop.send(Some(SHUTDOWN_GRACE));
    }
    let tasks = live.into_values().map(|r| r.task).chain(stopping);
    for t in tasks {
        let _ = t.await;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::json;

    use super::{ImageMap, programs, repository};

    #[test]
    fn repositories_drop_tags_and_digests_but_keep_registry_ports() {
        assert_eq!(
            repository("ghcr.io/kedge-dev/kedge-hub:0.3.0"),
            "ghcr.io/kedge-dev/kedge-hub"
        );
        assert_eq!(
            repository("ghcr.io/kedge-dev/kedge-hub"),
            "ghcr.io/kedge-dev/kedge-hub"
        );
        assert_eq!(repository("localhost:5000/app"), "localhost:5000/app");
        assert_eq!(repository("localhost:5000/app:v1"), "localhost:5000/app");
        assert_eq!(repository("busybox@sha256:abc"), "busybox");
        assert_eq!(repository("busybox:1.36@sha256:abc"), "busybox");
    }

    #[test]
    fn a_pod_runs_only_when_every_container_image_is_mapped() {
        let map: ImageMap = [("test/sh".to_string(), PathBuf::from("/bin/sh"))].into();
        let pod = |images: &[&str]| {
            let cs: Vec<_> = images
                .iter()
                .map(|i| json!({"name": i, "image": i}))
                .collect();
            json!({"spec": {"containers": cs}})
        };
        assert_eq!(
            programs(&pod(&["test/sh:1"]), &map),
            Some(vec![PathBuf::from("/bin/sh")])
        );
        assert_eq!(programs(&pod(&["test/sh", "nginx"]), &map), None);
        assert_eq!(programs(&pod(&["nginx"]), &map), None);
        assert_eq!(programs(&pod(&["test/sh"]), &ImageMap::new()), None);
    }
}

//! Simulated cluster behaviour: scheduler and kubelet, ReplicaSet, Deployment,
//! StatefulSet and Job controllers, garbage collector, namespace deletion.
//!
//! Controllers run inside the process on the store directly; their writes go
//! through the same code path as API writes and produce the same watch events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{ANN_OUTCOME, ANN_RUN_SECONDS, ClusterShared, SimConfig};
use crate::quantity::parse_quantity;
use crate::resources::ResourceDef;
use crate::selector::{LabelSelector, labels_of};
use crate::store::{FOREGROUND, Obj, Propagation, Store, WriteScope, finalizers, owner_uids};
use crate::util::{get_path, meta_mut, meta_str, parse_rfc3339, rfc3339};

const PODS: &str = "/pods";
const NODES: &str = "/nodes";
const NAMESPACES: &str = "/namespaces";
const DEPLOYMENTS: &str = "apps/deployments";
const REPLICASETS: &str = "apps/replicasets";
const STATEFULSETS: &str = "apps/statefulsets";
const JOBS: &str = "batch/jobs";
/// Pods one controller creates for one workload per reconcile pass.
const MAX_CREATES_PER_PASS: usize = 500;

/// Adds the configured Ready nodes to a fresh store.
pub fn add_nodes(store: &mut Store, cfg: &SimConfig, now: i64) {
    let ts = rfc3339(now);
    for i in 0..cfg.nodes {
        let name = format!("node-{i}");
        let cap = json!({"cpu": cfg.node_cpu, "memory": cfg.node_memory, "pods": cfg.node_pods.to_string(), "ephemeral-storage": "100Gi"});
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "sim.standard",
            }},
            "spec": {"podCIDR": format!("10.244.{i}.0/24")},
            "status": {
                "capacity": cap, "allocatable": cap,
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": ts, "lastTransitionTime": ts, "message": "kubelet has sufficient memory available"},
                    {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "lastHeartbeatTime": ts, "lastTransitionTime": ts, "message": "kubelet has no disk pressure"},
                    {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "lastHeartbeatTime": ts, "lastTransitionTime": ts, "message": "kubelet has sufficient PID available"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": ts, "lastTransitionTime": ts, "message": "kubelet is posting ready status"},
                ],
                "addresses": [{"type": "InternalIP", "address": format!("172.18.0.{}", i + 2)}, {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": "v1.33.0-kedge-sim", "containerRuntimeVersion": "sim://1.0", "operatingSystem": "linux", "architecture": "amd64",
                    "osImage": "kedge-sim", "kernelVersion": "6.0.0", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
            },
        });
        let _ = store.create_internal(NODES, node, now);
    }
}

/// Runs the controllers of one cluster until shutdown.
pub async fn run(c: Arc<ClusterShared>) {
    let mut keda = crate::keda::KedaState::default();
    let mut next_due: Option<i64> = None;
    loop {
        let speed = c.clock.speed();
        let now = c.now();
        let sleep = match next_due {
            Some(due) if speed > 0.0 => {
                let real_ms = ((due - now).max(0) as f64 / speed) as u64;
                Duration::from_millis(real_ms.clamp(5, 1000))
            }
            _ => Duration::from_secs(1),
        };
        tokio::select! {
            _ = c.shutdown_token().cancelled() => return,
            _ = c.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
        let now = c.now();
        let metrics = c.metrics.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut store = c.store();
        let due = next_due.is_some_and(|d| d <= now);
        if !store.dirty && !due && !keda.has_work() {
            continue;
        }
        // A few rounds let controllers react to each other's writes without
        // waiting for the next wake-up; the bound keeps a bug from spinning.
        let mut timers = Timers::default();
        for _ in 0..8 {
            store.dirty = false;
            timers = Timers::default();
            reconcile(&mut store, &c.config, now, &mut timers);
            crate::keda::reconcile(&mut store, &mut keda, &metrics, now, &mut timers);
            if !store.dirty {
                break;
            }
        }
        next_due = timers.0;
    }
}

/// The earliest simulated time a controller wants to look again.
#[derive(Debug, Default)]
pub(crate) struct Timers(pub(crate) Option<i64>);

impl Timers {
    pub(crate) fn at(&mut self, t: i64) {
        self.0 = Some(self.0.map_or(t, |x| x.min(t)));
    }
}

fn reconcile(store: &mut Store, cfg: &SimConfig, now: i64, timers: &mut Timers) {
    expire_events(store, now, timers);
    garbage_collect(store, now);
    namespaces(store, now);
    deployments(store, now);
    replicasets(store, now);
    statefulsets(store, now);
    jobs(store, cfg, now, timers);
    schedule(store, now);
    kubelet(store, cfg, now, timers);
}

fn def(store: &Store, key: &str) -> Option<Arc<ResourceDef>> {
    store.def(key)
}

fn snapshot(store: &Store, key: &str) -> Vec<Obj> {
    store.list(key, None).cloned().collect()
}

fn name_of(o: &Value) -> String {
    meta_str(o, "name").unwrap_or_default().to_string()
}

fn ns_name(o: &Value) -> String {
    meta_str(o, "namespace").unwrap_or_default().to_string()
}

fn uid_of(o: &Value) -> String {
    meta_str(o, "uid").unwrap_or_default().to_string()
}

fn deleting(o: &Value) -> bool {
    o.get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some()
}

fn write(store: &mut Store, key: &str, new: Value, now: i64) {
    let Some(d) = def(store, key) else { return };
    let (ns, name) = (ns_name(&new), name_of(&new));
    let mut new = new;
    meta_mut(&mut new).remove("resourceVersion");
    if let Err(e) = store.update(&d, &ns, &name, new, WriteScope::Internal, now) {
        tracing::debug!(error = %e, key, name, "controller write failed");
    }
}

fn delete(store: &mut Store, key: &str, ns: &str, name: &str, now: i64) {
    let Some(d) = def(store, key) else { return };
    let _ = store.delete(&d, ns, name, Propagation::Background, None, now);
}

fn owner_ref(api_version: &str, kind: &str, owner: &Value) -> Value {
    json!({
        "apiVersion": api_version, "kind": kind, "name": name_of(owner), "uid": uid_of(owner),
        "controller": true, "blockOwnerDeletion": true,
    })
}

fn owned_by<'a>(objs: &'a [Obj], uid: &'a str) -> impl Iterator<Item = &'a Obj> + 'a {
    objs.iter().filter(move |o| owner_uids(o).any(|u| u == uid))
}

/// `objs` by the uid of each of their owners: one pass instead of one per owner, so that a
/// cluster with thousands of Jobs and pods is not quadratic.
fn by_owner(objs: &[Obj]) -> HashMap<&str, Vec<&Obj>> {
    let mut owned: HashMap<&str, Vec<&Obj>> = HashMap::new();
    for o in objs {
        for uid in owner_uids(o) {
            owned.entry(uid).or_default().push(o);
        }
    }
    owned
}

/// Deletes objects whose owners are all gone, and finishes foreground deletions.
fn garbage_collect(store: &mut Store, now: i64) {
    let uids: HashSet<String> = store.all_objects().map(|(_, o)| uid_of(o)).collect();
    let fg_owners: HashSet<String> = store
        .all_objects()
        .filter(|(_, o)| deleting(o) && finalizers(o).iter().any(|f| f == FOREGROUND))
        .map(|(_, o)| uid_of(o))
        .collect();
    let mut doomed = Vec::new();
    let mut has_dependents: HashSet<String> = HashSet::new();
    for (key, o) in store.all_objects() {
        let owners: Vec<&str> = owner_uids(o).collect();
        if owners.is_empty() {
            continue;
        }
        for u in &owners {
            has_dependents.insert((*u).to_string());
        }
        let orphaned = owners.iter().all(|u| !uids.contains(*u));
        let fg = owners.iter().any(|u| fg_owners.contains(*u));
        if (orphaned || fg) && !deleting(o) {
            doomed.push((key.clone(), ns_name(o), name_of(o)));
        }
    }
    for (key, ns, name) in doomed {
        delete(store, &key, &ns, &name, now);
    }
    // Foreground owners without remaining dependents lose their finalizer.
    let finished: Vec<(Arc<str>, Obj)> = store
        .all_objects()
        .filter(|(_, o)| fg_owners.contains(&uid_of(o)) && !has_dependents.contains(&uid_of(o)))
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect();
    for (key, o) in finished {
        let mut new = (*o).clone();
        let fins: Vec<String> = finalizers(&o)
            .into_iter()
            .filter(|f| f != FOREGROUND)
            .collect();
        meta_mut(&mut new).insert("finalizers".into(), json!(fins));
        write(store, &key, new, now);
    }
}

/// Terminating namespaces: delete their content, then the namespace. Active
/// namespaces get their `default` ServiceAccount, like the real controller.
fn namespaces(store: &mut Store, now: i64) {
    let active: Vec<String> = store
        .list(NAMESPACES, None)
        .filter(|n| !deleting(n))
        .map(|n| name_of(n))
        .collect();
    for ns in active {
        if store.get("/serviceaccounts", &ns, "default").is_none() {
            let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
            let _ = store.create_internal("/serviceaccounts", sa, now);
        }
    }
    let terminating: Vec<String> = store
        .list(NAMESPACES, None)
        .filter(|n| deleting(n))
        .map(|n| name_of(n))
        .collect();
    for ns in terminating {
        let content: Vec<(Arc<str>, String)> = store
            .all_objects()
            .filter(|(_, o)| ns_name(o) == ns && !deleting(o))
            .map(|(k, o)| (k.clone(), name_of(o)))
            .collect();
        for (key, name) in &content {
            delete(store, key, &ns, name, now);
        }
        let remaining = store.all_objects().any(|(_, o)| ns_name(o) == ns);
        if !remaining && let Some(d) = def(store, NAMESPACES) {
            store.remove(&d, "", &ns, None);
        }
    }
}

/// Core v1 Events live this long (kube-apiserver's default `--event-ttl`).
const EVENT_TTL_MS: i64 = 3_600_000;
const EVENTS: &str = "/events";

/// Records a core v1 Event about `obj`, as the real controllers do.
fn record_event(
    store: &mut Store,
    obj: &Value,
    warning: bool,
    reason: &str,
    message: &str,
    component: &str,
    now: i64,
) {
    let ts = rfc3339(now);
    let name = format!("{}.{:016x}", name_of(obj), crate::util::random_u64());
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns_name(obj)},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "name": name_of(obj), "namespace": ns_name(obj), "uid": uid_of(obj),
            "resourceVersion": meta_str(obj, "resourceVersion").unwrap_or_default(),
        },
        "reason": reason, "message": message,
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": "",
        "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        "type": if warning { "Warning" } else { "Normal" },
    });
    let _ = store.create_internal(EVENTS, ev, now);
}

/// Deletes Events older than the TTL.
fn expire_events(store: &mut Store, now: i64, timers: &mut Timers) {
    let mut expired = Vec::new();
    for e in store.list(EVENTS, None) {
        let created = meta_str(e, "creationTimestamp")
            .and_then(parse_rfc3339)
            .unwrap_or(now);
        if now >= created + EVENT_TTL_MS {
            expired.push((ns_name(e), name_of(e)));
        } else {
            timers.at(created + EVENT_TTL_MS);
        }
    }
    for (ns, name) in expired {
        delete(store, EVENTS, &ns, &name, now);
    }
}

/// FNV-1a of the pod template, as the `pod-template-hash` label.
fn template_hash(t: &Value) -> String {
    let s = serde_json::to_string(t).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::new();
    let mut x = h;
    for _ in 0..10 {
        out.push(ALPHA[(x % ALPHA.len() as u32) as usize] as char);
        x /= ALPHA.len() as u32;
        if x == 0 {
            break;
        }
    }
    out
}

fn int(v: &Value, path: &str) -> i64 {
    get_path(v, path).and_then(Value::as_i64).unwrap_or(0)
}

fn pod_ready(p: &Value) -> bool {
    get_path(p, "status.conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

fn phase(p: &Value) -> &str {
    get_path(p, "status.phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

fn terminal(p: &Value) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

fn set_status(store: &mut Store, key: &str, obj: &Value, status: Value, now: i64) {
    if obj.get("status") == Some(&status) {
        return;
    }
    let mut new = obj.clone();
    new["status"] = status;
    write(store, key, new, now);
}

fn condition(t: &str, ok: bool, reason: &str, msg: &str, now: i64, old: Option<&Value>) -> Value {
    let status = if ok { "True" } else { "False" };
    // Keep transition times stable while the status does not change.
    let prev = old
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(t))
        });
    let ts = match prev {
        Some(p) if p.get("status").and_then(Value::as_str) == Some(status) => p
            .get("lastTransitionTime")
            .cloned()
            .unwrap_or(json!(rfc3339(now))),
        _ => json!(rfc3339(now)),
    };
    let update_ts = match prev {
        Some(p)
            if p.get("status").and_then(Value::as_str) == Some(status)
                && p.get("reason").and_then(Value::as_str) == Some(reason) =>
        {
            p.get("lastUpdateTime").cloned().unwrap_or(ts.clone())
        }
        _ => json!(rfc3339(now)),
    };
    json!({"type": t, "status": status, "reason": reason, "message": msg, "lastTransitionTime": ts, "lastUpdateTime": update_ts})
}

fn new_pod(
    owner_kind: &str,
    owner_api: &str,
    owner: &Value,
    template: &Value,
    name: String,
    extra_labels: &[(&str, String)],
) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or(json!({})),
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
    });
    let meta = meta_mut(&mut pod);
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns_name(owner)));
    meta.insert(
        "ownerReferences".into(),
        json!([owner_ref(owner_api, owner_kind, owner)]),
    );
    let labels = meta.entry("labels").or_insert(json!({}));
    if let Some(l) = labels.as_object_mut() {
        for (k, v) in extra_labels {
            l.insert((*k).to_string(), json!(v));
        }
    }
    pod
}

fn deployments(store: &mut Store, now: i64) {
    let rss = snapshot(store, REPLICASETS);
    for d in snapshot(store, DEPLOYMENTS) {
        if deleting(&d) {
            continue;
        }
        let Some(template) = get_path(&d, "spec.template").cloned() else {
            continue;
        };
        let hash = template_hash(&template);
        let replicas = int(&d, "spec.replicas");
        let uid = uid_of(&d);
        let owned: Vec<&Obj> = owned_by(&rss, &uid).collect();
        let rs_name = format!("{}-{hash}", name_of(&d));
        let mut current = None;
        for rs in &owned {
            if name_of(rs) == rs_name {
                current = Some((*rs).clone());
            } else if int(rs, "spec.replicas") != 0 {
                let mut new = (***rs).clone();
                new["spec"]["replicas"] = json!(0);
                write(store, REPLICASETS, new, now);
            }
        }
        match &current {
            Some(rs) if int(rs, "spec.replicas") != replicas => {
                let old = int(rs, "spec.replicas");
                let mut new = (**rs).clone();
                new["spec"]["replicas"] = json!(replicas);
                write(store, REPLICASETS, new, now);
                let dir = if replicas > old { "up" } else { "down" };
                let msg = format!("Scaled {dir} replica set {rs_name} from {old} to {replicas}");
                record_event(
                    store,
                    &d,
                    false,
                    "ScalingReplicaSet",
                    &msg,
                    "deployment-controller",
                    now,
                );
            }
            Some(_) => {}
            None => {
                let mut selector = get_path(&d, "spec.selector").cloned().unwrap_or(json!({}));
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let mut tmpl = template.clone();
                tmpl["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut labels = get_path(&template, "metadata.labels")
                    .cloned()
                    .unwrap_or(json!({}));
                labels["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs_name, "namespace": ns_name(&d), "labels": labels,
                        "annotations": {"deployment.kubernetes.io/revision": "1", "deployment.kubernetes.io/desired-replicas": replicas.to_string()},
                        "ownerReferences": [owner_ref("apps/v1", "Deployment", &d)]},
                    "spec": {"replicas": replicas, "selector": selector, "template": tmpl},
                });
                let _ = store.create_internal(REPLICASETS, rs, now);
                let msg = format!("Scaled up replica set {rs_name} from 0 to {replicas}");
                record_event(
                    store,
                    &d,
                    false,
                    "ScalingReplicaSet",
                    &msg,
                    "deployment-controller",
                    now,
                );
            }
        }
        // Status from the ReplicaSets as they are now.
        let rss_now: Vec<Obj> = store
            .list(REPLICASETS, Some(&ns_name(&d)))
            .cloned()
            .collect();
        let owned: Vec<&Obj> = owned_by(&rss_now, &uid).collect();
        let sum = |p: &str| owned.iter().map(|rs| int(rs, p)).sum::<i64>();
        let updated = owned
            .iter()
            .find(|rs| name_of(rs) == rs_name)
            .map(|rs| int(rs, "status.replicas"))
            .unwrap_or(0);
        let total = sum("status.replicas");
        let available = sum("status.availableReplicas");
        let ready = sum("status.readyReplicas");
        let old = d.get("status");
        let avail_ok = available >= replicas;
        let progressing_done = updated == replicas && available >= replicas;
        let mut status = json!({
            "observedGeneration": int(&d, "metadata.generation"),
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "conditions": [
                condition("Available", avail_ok,
                    if avail_ok { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                    if avail_ok { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }, now, old),
                condition("Progressing", true,
                    if progressing_done { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                    &format!("ReplicaSet \"{rs_name}\" {}", if progressing_done { "has successfully progressed." } else { "is progressing." }), now, old),
            ],
        });
        if total - available > 0 {
            status["unavailableReplicas"] = json!(total - available);
        }
        strip_zero(
            &mut status,
            &[
                "readyReplicas",
                "availableReplicas",
                "updatedReplicas",
                "replicas",
            ],
        );
        set_status(store, DEPLOYMENTS, &d, status, now);
    }
}

/// The real API server omits zero-valued optional integers.
fn strip_zero(status: &mut Value, fields: &[&str]) {
    if let Some(m) = status.as_object_mut() {
        for f in fields {
            if m.get(*f).and_then(Value::as_i64) == Some(0) {
                m.remove(*f);
            }
        }
    }
}

fn replicasets(store: &mut Store, now: i64) {
    let pods = snapshot(store, PODS);
    for rs in snapshot(store, REPLICASETS) {
        if deleting(&rs) {
            continue;
        }
        let uid = uid_of(&rs);
        let mut mine: Vec<&Obj> = owned_by(&pods, &uid)
            .filter(|p| !deleting(p) && !terminal(p))
            .collect();
        let want = int(&rs, "spec.replicas").max(0) as usize;
        let template = get_path(&rs, "spec.template").cloned().unwrap_or(json!({}));
        // Bounded per pass so a huge replica count cannot stall the cluster.
        for _ in mine.len()..want.min(mine.len() + MAX_CREATES_PER_PASS) {
            let name = format!("{}-{}", name_of(&rs), crate::util::name_suffix(5));
            let pod = new_pod("ReplicaSet", "apps/v1", &rs, &template, name.clone(), &[]);
            if store.create_internal(PODS, pod, now).is_ok() {
                let msg = format!("Created pod: {name}");
                record_event(
                    store,
                    &rs,
                    false,
                    "SuccessfulCreate",
                    &msg,
                    "replicaset-controller",
                    now,
                );
            }
        }
        if mine.len() > want {
            // Not-ready and unscheduled pods go first, like the real controller.
            mine.sort_by_key(|p| (pod_ready(p), get_path(p, "spec.nodeName").is_some()));
            for p in mine.iter().take(mine.len() - want) {
                delete(store, PODS, &ns_name(p), &name_of(p), now);
                let msg = format!("Deleted pod: {}", name_of(p));
                record_event(
                    store,
                    &rs,
                    false,
                    "SuccessfulDelete",
                    &msg,
                    "replicaset-controller",
                    now,
                );
            }
        }
        let pods_now: Vec<Obj> = store.list(PODS, Some(&ns_name(&rs))).cloned().collect();
        let live: Vec<&Obj> = owned_by(&pods_now, &uid)
            .filter(|p| !deleting(p) && !terminal(p))
            .collect();
        let ready = live.iter().filter(|p| pod_ready(p)).count() as i64;
        let mut status = json!({
            "replicas": live.len(), "fullyLabeledReplicas": live.len(), "readyReplicas": ready,
            "availableReplicas": ready, "observedGeneration": int(&rs, "metadata.generation"),
        });
        strip_zero(
            &mut status,
            &["readyReplicas", "availableReplicas", "fullyLabeledReplicas"],
        );
        set_status(store, REPLICASETS, &rs, status, now);
    }
}

fn statefulsets(store: &mut Store, now: i64) {
    let pods = snapshot(store, PODS);
    for s in snapshot(store, STATEFULSETS) {
        if deleting(&s) {
            continue;
        }
        let uid = uid_of(&s);
        let name = name_of(&s);
        let want = int(&s, "spec.replicas").max(0);
        let parallel =
            get_path(&s, "spec.podManagementPolicy").and_then(Value::as_str) == Some("Parallel");
        let template = get_path(&s, "spec.template").cloned().unwrap_or(json!({}));
        let mine: HashMap<i64, &Obj> = owned_by(&pods, &uid)
            .filter(|p| !deleting(p))
            .filter_map(|p| {
                let n = name_of(p);
                let ord = n.strip_prefix(&format!("{name}-"))?.parse::<i64>().ok()?;
                Some((ord, p))
            })
            .collect();
        let hash = template_hash(&template);
        for ord in 0..want.min(mine.len() as i64 + MAX_CREATES_PER_PASS as i64) {
            if mine.contains_key(&ord) {
                continue;
            }
            let all_lower_ready = (0..ord).all(|o| mine.get(&o).is_some_and(|p| pod_ready(p)));
            if !parallel && !all_lower_ready {
                break;
            }
            let pod_name = format!("{name}-{ord}");
            let mut pod = new_pod(
                "StatefulSet",
                "apps/v1",
                &s,
                &template,
                pod_name.clone(),
                &[
                    ("statefulset.kubernetes.io/pod-name", pod_name),
                    ("apps.kubernetes.io/pod-index", ord.to_string()),
                    ("controller-revision-hash", format!("{name}-{hash}")),
                ],
            );
            pod["spec"]["hostname"] = json!(format!("{name}-{ord}"));
            if store.create_internal(PODS, pod, now).is_ok() {
                let msg = format!("create Pod {name}-{ord} in StatefulSet {name} successful");
                record_event(
                    store,
                    &s,
                    false,
                    "SuccessfulCreate",
                    &msg,
                    "statefulset-controller",
                    now,
                );
            }
            if !parallel {
                break;
            }
        }
        let mut extra: Vec<i64> = mine.keys().copied().filter(|o| *o >= want).collect();
        extra.sort_unstable_by(|a, b| b.cmp(a));
        let take = if parallel {
            extra.len()
        } else {
            extra.len().min(1)
        };
        for ord in extra.into_iter().take(take) {
            delete(store, PODS, &ns_name(&s), &format!("{name}-{ord}"), now);
        }
        let pods_now: Vec<Obj> = store.list(PODS, Some(&ns_name(&s))).cloned().collect();
        let live: Vec<&Obj> = owned_by(&pods_now, &uid).filter(|p| !deleting(p)).collect();
        let ready = live.iter().filter(|p| pod_ready(p)).count() as i64;
        let mut status = json!({
            "observedGeneration": int(&s, "metadata.generation"),
            "replicas": live.len(), "readyReplicas": ready, "currentReplicas": live.len(),
            "updatedReplicas": live.len(), "availableReplicas": ready,
            "currentRevision": format!("{name}-{hash}"), "updateRevision": format!("{name}-{hash}"),
            "collisionCount": 0,
        });
        strip_zero(
            &mut status,
            &[
                "readyReplicas",
                "availableReplicas",
                "currentReplicas",
                "updatedReplicas",
            ],
        );
        set_status(store, STATEFULSETS, &s, status, now);
    }
}

fn job_finished(j: &Value) -> bool {
    get_path(j, "status.conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                matches!(
                    c.get("type").and_then(Value::as_str),
                    Some("Complete" | "Failed")
                ) && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

fn jobs(store: &mut Store, _cfg: &SimConfig, now: i64, timers: &mut Timers) {
    let pods = snapshot(store, PODS);
    let pods_by_job = by_owner(&pods);
    for j in snapshot(store, JOBS) {
        if deleting(&j) {
            continue;
        }
        let old = j.get("status").cloned().unwrap_or(json!({}));
        if job_finished(&j) {
            // ttlSecondsAfterFinished: the TTL controller deletes finished Jobs.
            if let (Some(ttl), Some(done)) = (
                get_path(&j, "spec.ttlSecondsAfterFinished").and_then(Value::as_i64),
                old.get("completionTime")
                    .or_else(|| {
                        old.get("conditions")
                            .and_then(Value::as_array)
                            .and_then(|cs| cs.last())
                            .and_then(|c| c.get("lastTransitionTime"))
                    })
                    .and_then(Value::as_str)
                    .and_then(parse_rfc3339),
            ) {
                let at = done.saturating_add(ttl.saturating_mul(1000));
                if now >= at {
                    delete(store, JOBS, &ns_name(&j), &name_of(&j), now);
                } else {
                    timers.at(at);
                }
            }
            continue;
        }
        let uid = uid_of(&j);
        let mine: Vec<&Obj> = pods_by_job.get(uid.as_str()).cloned().unwrap_or_default();
        let succeeded = mine.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
        let failed = mine.iter().filter(|p| phase(p) == "Failed").count() as i64;
        let active: Vec<&&Obj> = mine
            .iter()
            .filter(|p| !terminal(p) && !deleting(p))
            .collect();
        let ready = active.iter().filter(|p| pod_ready(p)).count() as i64;
        let completions = get_path(&j, "spec.completions")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let parallelism = get_path(&j, "spec.parallelism")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let backoff = get_path(&j, "spec.backoffLimit")
            .and_then(Value::as_i64)
            .unwrap_or(6);
        let suspended = get_path(&j, "spec.suspend").and_then(Value::as_bool) == Some(true);
        let start = old
            .get("startTime")
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut status = old.clone();
        if !status.is_object() {
            status = json!({});
        }
        let mut conditions: Vec<Value> = old
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let deadline_hit = match (
            get_path(&j, "spec.activeDeadlineSeconds").and_then(Value::as_i64),
            start.as_deref().and_then(parse_rfc3339),
        ) {
            (Some(d), Some(s)) => {
                timers.at(s + d * 1000);
                now >= s + d * 1000
            }
            _ => false,
        };
        let fail_reason = if failed > backoff {
            Some((
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ))
        } else if deadline_hit {
            Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            ))
        } else {
            None
        };
        if let Some((reason, msg)) = fail_reason {
            for p in &active {
                delete(store, PODS, &ns_name(p), &name_of(p), now);
            }
            conditions.push(condition("FailureTarget", true, reason, msg, now, None));
            conditions.push(condition("Failed", true, reason, msg, now, None));
            record_event(store, &j, true, reason, msg, "job-controller", now);
            strip_update_time(&mut conditions);
            status["conditions"] = json!(conditions);
            status["active"] = json!(0);
            status["failed"] = json!(failed);
            status["ready"] = json!(0);
        } else if succeeded >= completions {
            conditions.push(condition(
                "SuccessCriteriaMet",
                true,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
                None,
            ));
            conditions.push(condition(
                "Complete",
                true,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
                None,
            ));
            strip_update_time(&mut conditions);
            record_event(
                store,
                &j,
                false,
                "Completed",
                "Job completed",
                "job-controller",
                now,
            );
            status["conditions"] = json!(conditions);
            status["completionTime"] = json!(rfc3339(now));
            status["active"] = json!(0);
            status["succeeded"] = json!(succeeded);
            status["ready"] = json!(0);
        } else if !suspended {
            if start.is_none() {
                status["startTime"] = json!(rfc3339(now));
            }
            let want = parallelism.min(completions - succeeded).max(0) - active.len() as i64;
            let template = get_path(&j, "spec.template").cloned().unwrap_or(json!({}));
            let job_ann = get_path(&j, "metadata.annotations")
                .cloned()
                .unwrap_or(json!({}));
            for _ in 0..want.clamp(0, MAX_CREATES_PER_PASS as i64) {
                let name = format!("{}-{}", name_of(&j), crate::util::name_suffix(5));
                let mut pod = new_pod("Job", "batch/v1", &j, &template, name.clone(), &[]);
                for k in [ANN_RUN_SECONDS, ANN_OUTCOME] {
                    if let Some(v) = job_ann.get(k)
                        && get_path(&pod, &format!("metadata.annotations.{k}")).is_none()
                    {
                        let meta = meta_mut(&mut pod);
                        let anns = meta.entry("annotations").or_insert(json!({}));
                        anns[k] = v.clone();
                    }
                }
                if store.create_internal(PODS, pod, now).is_ok() {
                    let msg = format!("Created pod: {name}");
                    record_event(
                        store,
                        &j,
                        false,
                        "SuccessfulCreate",
                        &msg,
                        "job-controller",
                        now,
                    );
                }
            }
            status["active"] =
                json!(active.len() as i64 + want.clamp(0, MAX_CREATES_PER_PASS as i64));
            status["succeeded"] = json!(succeeded);
            status["failed"] = json!(failed);
            status["ready"] = json!(ready);
            status["terminating"] = json!(0);
            status["uncountedTerminatedPods"] = json!({});
        }
        strip_zero(&mut status, &["active", "succeeded", "failed"]);
        set_status(store, JOBS, &j, status, now);
    }
}

fn strip_update_time(conds: &mut [Value]) {
    for c in conds {
        if let Some(m) = c.as_object_mut() {
            m.insert(
                "lastProbeTime".into(),
                m.get("lastTransitionTime").cloned().unwrap_or(Value::Null),
            );
            m.remove("lastUpdateTime");
        }
    }
}

fn requests(p: &Value) -> (i128, i128) {
    let mut cpu = 0;
    let mut mem = 0;
    for c in get_path(p, "spec.containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let req = c
            .get("resources")
            .and_then(|r| r.get("requests").or_else(|| r.get("limits")));
        if let Some(q) = req.and_then(|r| r.get("cpu")).and_then(Value::as_str) {
            cpu += parse_quantity(q).unwrap_or(0);
        }
        if let Some(q) = req.and_then(|r| r.get("memory")).and_then(Value::as_str) {
            mem += parse_quantity(q).unwrap_or(0);
        }
    }
    (cpu, mem)
}

fn alloc(n: &Value, res: &str) -> i128 {
    get_path(n, &format!("status.allocatable.{res}"))
        .and_then(Value::as_str)
        .and_then(|q| parse_quantity(q).ok())
        .unwrap_or(0)
}

fn node_ready(n: &Value) -> bool {
    get_path(n, "status.conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
        && get_path(n, "spec.unschedulable").and_then(Value::as_bool) != Some(true)
}

/// Binds pending pods to nodes where their requests fit.
fn schedule(store: &mut Store, now: i64) {
    let pods = snapshot(store, PODS);
    let pending: Vec<&Obj> = pods
        .iter()
        .filter(|p| {
            get_path(p, "spec.nodeName")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
                && !deleting(p)
                && !terminal(p)
        })
        .collect();
    if pending.is_empty() {
        return;
    }
    let nodes = snapshot(store, NODES);
    // Used resources per node.
    let mut used: HashMap<String, (i128, i128, i128)> = HashMap::new();
    for p in pods.iter().filter(|p| !terminal(p)) {
        if let Some(n) = get_path(p, "spec.nodeName").and_then(Value::as_str) {
            let (c, m) = requests(p);
            let e = used.entry(n.to_string()).or_default();
            e.0 += c;
            e.1 += m;
            e.2 += 1000;
        }
    }
    for p in pending {
        let (cpu, mem) = requests(p);
        let node_selector = get_path(p, "spec.nodeSelector").and_then(Value::as_object);
        let mut best: Option<(i128, String)> = None;
        let mut insufficient_cpu = 0;
        let mut insufficient_mem = 0;
        let mut too_many = 0;
        let mut not_ready = 0;
        for n in &nodes {
            if !node_ready(n) {
                not_ready += 1;
                continue;
            }
            let labels = labels_of(n);
            if let Some(sel) = node_selector
                && !sel
                    .iter()
                    .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
            {
                not_ready += 1;
                continue;
            }
            let name = name_of(n);
            let u = used.get(&name).copied().unwrap_or_default();
            let free_cpu = alloc(n, "cpu") - u.0;
            let free_mem = alloc(n, "memory") - u.1;
            let free_pods = alloc(n, "pods") - u.2;
            let mut fits = true;
            if free_cpu < cpu {
                insufficient_cpu += 1;
                fits = false;
            }
            if free_mem < mem {
                insufficient_mem += 1;
                fits = false;
            }
            if free_pods < 1000 {
                too_many += 1;
                fits = false;
            }
            if fits && best.as_ref().is_none_or(|(f, _)| free_cpu > *f) {
                best = Some((free_cpu, name));
            }
        }
        let old_status = p.get("status").cloned().unwrap_or(json!({}));
        let mut new = (**p).clone();
        match best {
            Some((_, node)) => {
                let e = used.entry(node.clone()).or_default();
                e.0 += cpu;
                e.1 += mem;
                e.2 += 1000;
                new["spec"]["nodeName"] = json!(node);
                let mut status = old_status.clone();
                status["phase"] = json!("Pending");
                status["conditions"] =
                    json!([condition_pod("PodScheduled", true, None, None, now)]);
                status["containerStatuses"] = container_statuses(
                    p,
                    json!({"waiting": {"reason": "ContainerCreating"}}),
                    false,
                );
                new["status"] = status;
                write(store, PODS, new, now);
                let msg = format!(
                    "Successfully assigned {}/{} to {node}",
                    ns_name(p),
                    name_of(p)
                );
                record_event(store, p, false, "Scheduled", &msg, "default-scheduler", now);
            }
            None => {
                let mut reasons = Vec::new();
                if insufficient_cpu > 0 {
                    reasons.push(format!("{insufficient_cpu} Insufficient cpu"));
                }
                if insufficient_mem > 0 {
                    reasons.push(format!("{insufficient_mem} Insufficient memory"));
                }
                if too_many > 0 {
                    reasons.push(format!("{too_many} Too many pods"));
                }
                if not_ready > 0 {
                    reasons.push(format!("{not_ready} node(s) didn't match Pod's node affinity/selector or were not ready"));
                }
                let msg = format!(
                    "0/{} nodes are available: {}. preemption: 0/{} nodes are available: {} No preemption victims found for incoming pod.",
                    nodes.len(),
                    reasons.join(", "),
                    nodes.len(),
                    nodes.len()
                );
                let already = old_status
                    .get("conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.first())
                    .is_some_and(|c| {
                        c.get("message").and_then(Value::as_str) == Some(msg.as_str())
                    });
                if !already {
                    let mut status = old_status.clone();
                    status["phase"] = json!("Pending");
                    status["conditions"] = json!([condition_pod(
                        "PodScheduled",
                        false,
                        Some("Unschedulable"),
                        Some(&msg),
                        now
                    )]);
                    new["status"] = status;
                    write(store, PODS, new, now);
                    record_event(
                        store,
                        p,
                        true,
                        "FailedScheduling",
                        &msg,
                        "default-scheduler",
                        now,
                    );
                }
            }
        }
    }
}

fn condition_pod(t: &str, ok: bool, reason: Option<&str>, msg: Option<&str>, now: i64) -> Value {
    let mut c = json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": rfc3339(now)});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    if let Some(m) = msg {
        c["message"] = json!(m);
    }
    c
}

fn transition_time(p: &Value, t: &str) -> Option<i64> {
    get_path(p, "status.conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(t))?
        .get("lastTransitionTime")?
        .as_str()
        .and_then(parse_rfc3339)
}

fn container_statuses(p: &Value, state: Value, ready: bool) -> Value {
    let cs: Vec<Value> = get_path(p, "spec.containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            json!({
                "name": c.get("name").cloned().unwrap_or(json!("main")),
                "image": c.get("image").cloned().unwrap_or(json!("")),
                "imageID": "", "containerID": "sim://0",
                "ready": ready, "started": ready, "restartCount": 0, "state": state,
            })
        })
        .collect();
    json!(cs)
}

/// The kubelet: starts bound pods after the start-up delay, ends Job pods.
fn kubelet(store: &mut Store, cfg: &SimConfig, now: i64, timers: &mut Timers) {
    let delay = cfg.pod_start_delay.as_millis() as i64;
    for p in snapshot(store, PODS) {
        if deleting(&p) || terminal(&p) {
            continue;
        }
        let Some(node) = get_path(&p, "spec.nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let restart = get_path(&p, "spec.restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always");
        let ann = |k: &str| {
            get_path(&p, "metadata.annotations")
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        match phase(&p) {
            "Pending" => {
                let bound = transition_time(&p, "PodScheduled").unwrap_or(now);
                let at = bound + delay;
                if now < at {
                    timers.at(at);
                    continue;
                }
                let ts = rfc3339(now);
                let mut new = (*p).clone();
                let ip_tail = crate::util::random_u64() % 250 + 2;
                new["status"] = json!({
                    "phase": "Running",
                    "conditions": [
                        condition_pod("PodReadyToStartContainers", true, None, None, now),
                        condition_pod("Initialized", true, None, None, now),
                        condition_pod("Ready", true, None, None, now),
                        condition_pod("ContainersReady", true, None, None, now),
                        get_path(&p, "status.conditions").and_then(Value::as_array).and_then(|c| c.first().cloned()).unwrap_or(condition_pod("PodScheduled", true, None, None, now)),
                    ],
                    "hostIP": format!("172.18.0.{}", node.len() % 200 + 2),
                    "podIP": format!("10.244.0.{ip_tail}"),
                    "podIPs": [{"ip": format!("10.244.0.{ip_tail}")}],
                    "startTime": ts,
                    "qosClass": "BestEffort",
                    "containerStatuses": container_statuses(&p, json!({"running": {"startedAt": ts}}), true),
                });
                write(store, PODS, new, now);
            }
            "Running" if restart != "Always" || ann(ANN_RUN_SECONDS).is_some() => {
                let run_ms = ann(ANN_RUN_SECONDS)
                    .and_then(|s| s.parse::<f64>().ok())
                    .map(|s| (s * 1000.0) as i64)
                    .unwrap_or(cfg.job_duration.as_millis() as i64);
                let started = get_path(&p, "status.startTime")
                    .and_then(Value::as_str)
                    .and_then(parse_rfc3339)
                    .unwrap_or(now);
                let at = started + run_ms;
                if now < at {
                    timers.at(at);
                    continue;
                }
                let fail = match ann(ANN_OUTCOME).as_deref() {
                    Some("fail") => true,
                    Some(_) => false,
                    None => cfg.job_pods_fail,
                };
                let (ph, code, reason) = if fail {
                    ("Failed", 1, "Error")
                } else {
                    ("Succeeded", 0, "Completed")
                };
                let mut new = (*p).clone();
                let ts = rfc3339(now);
                let mut status = p.get("status").cloned().unwrap_or(json!({}));
                status["phase"] = json!(ph);
                status["conditions"] = json!([
                    condition_pod("PodReadyToStartContainers", false, None, None, now),
                    condition_pod("Initialized", true, None, None, now),
                    condition_pod("Ready", false, Some("PodCompleted"), None, now),
                    condition_pod("ContainersReady", false, Some("PodCompleted"), None, now),
                    condition_pod("PodScheduled", true, None, None, now),
                ]);
                status["containerStatuses"] = container_statuses(
                    &p,
                    json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": get_path(&p, "status.startTime").cloned().unwrap_or(json!(ts)), "finishedAt": ts}}),
                    false,
                );
                new["status"] = status;
                write(store, PODS, new, now);
            }
            _ => {}
        }
    }
}

/// Label selector of a workload's `spec.selector`, for tests and describe.
pub fn workload_selector(obj: &Value) -> Option<LabelSelector> {
    LabelSelector::from_label_selector_json(get_path(obj, "spec.selector")?).ok()
}

//! Simulated cluster behaviour: scheduler and kubelet, ReplicaSet, Deployment,
//! StatefulSet and Job controllers, garbage collector, namespace deletion.
//!
//! Controllers run inside the process on the store directly; their writes go
//! through the same code path as API writes and produce the same watch events.
//! Each controller has its own file; this module runs them in turn and holds what
//! several of them use.

mod deployment;
mod events;
mod garbage_collector;
mod job;
mod kubelet;
mod namespace;
mod replicaset;
mod scheduler;
mod statefulset;
pub(crate) mod timers;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{ClusterShared, SimConfig};
use crate::resources::ResourceDef;
use crate::selector::LabelSelector;
use crate::store::{Obj, Propagation, Store, WriteScope, deleting, owner_uids};
use crate::util::{get_path, meta_mut, meta_str, rfc3339};

pub use kubelet::add_nodes;
pub(crate) use timers::Timers;

use deployment::deployments;
use events::expire_events;
use garbage_collector::garbage_collect;
use job::jobs;
use kubelet::kubelet;
use namespace::namespaces;
use replicaset::replicasets;
use scheduler::schedule;
use statefulset::statefulsets;

const PODS: &str = "/pods";
const NODES: &str = "/nodes";
const NAMESPACES: &str = "/namespaces";
const DEPLOYMENTS: &str = "apps/deployments";
const REPLICASETS: &str = "apps/replicasets";
const STATEFULSETS: &str = "apps/statefulsets";
const JOBS: &str = "batch/jobs";
/// Pods one controller creates for one workload per reconcile pass.
const MAX_CREATES_PER_PASS: usize = 500;

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
            crate::keda::reconcile(
                &mut store,
                &mut keda,
                &metrics,
                &c.scalers,
                now,
                &mut timers,
            );
            crate::services::reconcile(&mut store, &c.load_balancers, now);
            if !store.dirty {
                break;
            }
        }
        next_due = timers.0;
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

/// Label selector of a workload's `spec.selector`, for tests and describe.
pub fn workload_selector(obj: &Value) -> Option<LabelSelector> {
    LabelSelector::from_label_selector_json(get_path(obj, "spec.selector")?).ok()
}

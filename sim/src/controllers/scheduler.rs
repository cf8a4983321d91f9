//! The scheduler: binds pending pods to Ready nodes where their requests fit.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::events::record_event;
use super::{
    NODES, PODS, condition_pod, container_statuses, deleting, name_of, ns_name, snapshot, terminal,
    write,
};
use crate::quantity::parse_quantity;
use crate::selector::labels_of;
use crate::store::{Obj, Store};
use crate::util::get_path;

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
pub(super) fn schedule(store: &mut Store, now: i64) {
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

//! The kubelet: registers the nodes, starts bound pods, ends Job pods.

use serde_json::{Value, json};

use super::{
    NODES, PODS, Timers, condition_pod, container_statuses, deleting, phase, snapshot, terminal,
    write,
};
use crate::cluster::{ANN_OUTCOME, ANN_RUN_SECONDS, SimConfig};
use crate::store::Store;
use crate::util::{get_path, parse_rfc3339, rfc3339};

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

fn transition_time(p: &Value, t: &str) -> Option<i64> {
    get_path(p, "status.conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(t))?
        .get("lastTransitionTime")?
        .as_str()
        .and_then(parse_rfc3339)
}

/// The kubelet: starts bound pods after the start-up delay, ends Job pods. Pods whose images
/// run as processes are the process kubelet's ([`crate::processes`]).
pub(super) fn kubelet(store: &mut Store, cfg: &SimConfig, now: i64, timers: &mut Timers) {
    let delay = cfg.pod_start_delay.as_millis() as i64;
    for p in snapshot(store, PODS) {
        if deleting(&p) || terminal(&p) || crate::processes::programs(&p, &cfg.run_images).is_some()
        {
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
                let uid = get_path(&p, "metadata.uid").and_then(Value::as_str);
                let ip = uid.and_then(|uid| store.pod_ip(uid));
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
                    "startTime": ts,
                    "qosClass": "BestEffort",
                    "containerStatuses": container_statuses(&p, json!({"running": {"startedAt": ts}}), true),
                });
                // A loopback address unique in the process, so a test can serve on it.
                if let Some(ip) = ip {
                    new["status"]["podIP"] = json!(ip.to_string());
                    new["status"]["podIPs"] = json!([{"ip": ip.to_string()}]);
                }
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

//! What the agent observes by reading: the state of every workload the hub manages here, and
//! the cluster's free capacity (read once per report interval and capacity interval, so a
//! flapping workload cannot flood the member API server or the hub).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kedge_core::quantity::parse_quantity;
use kedge_protocol::{ClusterCapacity, WorkloadRef, WorkloadStatus};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, ResourceExt};
use serde::Deserialize;
use tracing::debug;

use crate::executor::{Executor, classify};
use crate::jobs::facts::Condition;
use crate::lite::{for_each_page, lite_resource};

fn int_at(value: &serde_json::Value, path: &[&str]) -> i32 {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(serde_json::Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
        .unwrap_or(0)
}

/// A `v1` Node, decoded with only what capacity needs (not its images, addresses, …).
#[derive(Debug, Clone, Deserialize)]
pub struct NodeLite {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The spec, if any.
    #[serde(default)]
    pub spec: Option<NodeLiteSpec>,
    /// The status, if any.
    #[serde(default)]
    pub status: Option<NodeLiteStatus>,
}

/// The part of a node's spec capacity needs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeLiteSpec {
    /// Cordoned.
    #[serde(default)]
    pub unschedulable: Option<bool>,
}

/// The part of a node's status capacity needs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeLiteStatus {
    /// What pods may request, by resource.
    #[serde(default)]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    /// `Ready`, ….
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
}

/// A `v1` Pod, decoded with only what capacity and a workload's pod counts need.
#[derive(Debug, Clone, Deserialize)]
pub struct PodUsage {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The spec, if any.
    #[serde(default)]
    pub spec: Option<PodUsageSpec>,
    /// The status, if any.
    #[serde(default)]
    pub status: Option<PodUsageStatus>,
}

/// Where a pod is bound and what its containers request.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodUsageSpec {
    /// The node it is bound to.
    #[serde(default)]
    pub node_name: Option<String>,
    /// Its containers.
    #[serde(default)]
    pub containers: Vec<ContainerUsage>,
}

/// A container, reduced to its requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerUsage {
    /// Its resources.
    #[serde(default)]
    pub resources: Option<ResourcesUsage>,
}

/// A container's resources, reduced to requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResourcesUsage {
    /// Requested quantities by resource.
    #[serde(default)]
    pub requests: Option<BTreeMap<String, Quantity>>,
}

/// The part of a pod's status capacity and pod counts need.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodUsageStatus {
    /// `Pending`, `Running`, ….
    #[serde(default)]
    pub phase: Option<String>,
    /// Pod conditions.
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
}

lite_resource!(NodeLite, "", "v1", "Node", "nodes", ClusterResourceScope);
lite_resource!(PodUsage, "", "v1", "Pod", "pods", NamespaceResourceScope);

/// Whether the scheduler reported the pod `Unschedulable`, and since when (Unix ms).
fn unschedulable_since(pod: &PodUsage) -> Option<i64> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map_or(0, |t| t.0.as_millisecond())
        })
}

/// Pod counts of one workload, added up a page of pods at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Pods in phase `Pending`.
    pub pending: i32,
    /// Pods the scheduler reported `Unschedulable`.
    pub unschedulable: i32,
    /// Since when the oldest of them is (Unix ms).
    pub oldest_unschedulable: Option<i64>,
}

impl PodCounts {
    /// Counts `pods`, leaving out those being deleted.
    pub fn add(&mut self, pods: &[PodUsage]) {
        let live = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none());
        for pod in live {
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending") {
                self.pending += 1;
            }
            if let Some(since) = unschedulable_since(pod) {
                self.unschedulable += 1;
                self.oldest_unschedulable =
                    Some(self.oldest_unschedulable.map_or(since, |o| o.min(since)));
            }
        }
    }
}

/// CPU (millicores) and memory (bytes) one pod of a workload requests, from its pod template
/// (`spec.template.spec.containers[].resources.requests`).
pub fn pod_requests(workload: &serde_json::Value) -> (u64, u64) {
    let containers = workload
        .pointer("/spec/template/spec/containers")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let request = |container: &serde_json::Value, resource: &str| {
        container
            .pointer(&format!("/resources/requests/{resource}"))
            .and_then(serde_json::Value::as_str)
            .and_then(|q| parse_quantity(q).ok())
            .unwrap_or(0)
            .max(0)
    };
    let cpu: i128 = containers.iter().map(|c| request(c, "cpu")).sum();
    let memory: i128 = containers.iter().map(|c| request(c, "memory")).sum();
    let clamp = |v: i128| u64::try_from(v).unwrap_or(u64::MAX);
    // Quantities are milli-units: CPU stays in millicores, memory is divided to bytes.
    (clamp(cpu), clamp(memory / 1000))
}

/// Who else scales workloads in one namespace: `(what, target kind, target name)` for every
/// HorizontalPodAutoscaler and KEDA ScaledObject there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Autoscalers(pub Vec<(String, String, String)>);

impl Autoscalers {
    /// The first autoscaler targeting `workload`, by name.
    pub fn targeting(&self, workload: &WorkloadRef) -> Option<String> {
        self.0
            .iter()
            .find(|(_, kind, name)| *kind == workload.kind && *name == workload.name)
            .map(|(what, ..)| what.clone())
    }
}

/// Lists the autoscalers of `namespace`. Kinds the member does not serve, or the agent may
/// not read, count as none: the agent cannot see them, and says so in its log.
pub async fn observe_autoscalers(executor: &Executor, namespace: &str) -> Autoscalers {
    let mut found = Vec::new();
    let so = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    let scaled_objects: Api<DynamicObject> =
        Api::namespaced_with(executor.client().clone(), namespace, &so);
    match scaled_objects.list(&ListParams::default()).await {
        Ok(list) => {
            for o in list.items {
                let target = o.data.pointer("/spec/scaleTargetRef");
                let text = |key: &str, default: &str| {
                    target
                        .and_then(|t| t.get(key))
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or(default)
                        .to_owned()
                };
                found.push((
                    format!("KEDA ScaledObject {namespace}/{}", o.name_any()),
                    text("kind", "Deployment"),
                    text("name", ""),
                ));
            }
        }
        Err(e) => debug!(error = %e, %namespace, "cannot list ScaledObjects"),
    }
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(executor.client().clone(), namespace);
    match hpas.list(&ListParams::default()).await {
        Ok(list) => {
            for h in list.items {
                let Some(spec) = h.spec.as_ref() else {
                    continue;
                };
                found.push((
                    format!("HorizontalPodAutoscaler {namespace}/{}", h.name_any()),
                    spec.scale_target_ref.kind.clone(),
                    spec.scale_target_ref.name.clone(),
                ));
            }
        }
        Err(e) => debug!(error = %e, %namespace, "cannot list HorizontalPodAutoscalers"),
    }
    Autoscalers(found)
}

/// Observes one workload; a missing workload is reported as such, never created.
pub async fn observe_workload(
    executor: &Executor,
    workload: &WorkloadRef,
    now_unix_ms: i64,
) -> Result<WorkloadStatus, kedge_protocol::Failure> {
    let mut status = WorkloadStatus::absent(workload.clone());
    let api = executor.workload_api(workload).await?;
    let what = format!(
        "reading {} {}/{}",
        workload.kind, workload.namespace, workload.name
    );
    let Some(object) = api
        .get_opt(&workload.name)
        .await
        .map_err(|e| classify(&e, &what))?
    else {
        return Ok(status);
    };
    status.exists = true;
    status.spec_replicas = int_at(&object.data, &["spec", "replicas"]);
    status.ready_replicas = int_at(&object.data, &["status", "readyReplicas"]);
    status.available_replicas = int_at(&object.data, &["status", "availableReplicas"]);
    (status.pod_cpu_millis, status.pod_memory_bytes) = pod_requests(&object.data);
    let scale = api
        .get_scale(&workload.name)
        .await
        .map_err(|e| classify(&e, &what))?;
    let selector = scale.status.and_then(|s| s.selector).unwrap_or_default();
    if !selector.is_empty() {
        let pods: Api<PodUsage> = Api::namespaced(executor.client().clone(), &workload.namespace);
        let mut counts = PodCounts::default();
        for_each_page(&pods, ListParams::default().labels(&selector), |page| {
            counts.add(&page)
        })
        .await
        .map_err(|e| classify(&e, &format!("listing pods of {}", workload.name)))?;
        status.pending_pods = counts.pending;
        status.unschedulable_pods = counts.unschedulable;
        status.unschedulable_for_ms = counts.oldest_unschedulable.map_or(0, |since| {
            u64::try_from(now_unix_ms.saturating_sub(since)).unwrap_or(0)
        });
    }
    Ok(status)
}

fn quantity(map: Option<&BTreeMap<String, Quantity>>, key: &str) -> i128 {
    map.and_then(|m| m.get(key))
        .and_then(|q| parse_quantity(&q.0).ok())
        .unwrap_or(0)
}

/// The cluster's capacity, added up a page of nodes, then a page of pods, at a time: the
/// allocatable capacity of Ready, schedulable nodes and the requests of the pods bound to
/// them that have not finished.
#[derive(Debug, Default)]
pub struct CapacitySum {
    nodes: u32,
    ready: HashSet<String>,
    cpu: i128,
    memory: i128,
    requested_cpu: i128,
    requested_memory: i128,
}

impl CapacitySum {
    /// Adds nodes; every node before the first pod.
    pub fn add_nodes(&mut self, nodes: &[NodeLite]) {
        for node in nodes {
            self.nodes += 1;
            let schedulable = !node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            let is_ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            // A node named twice (by pages of a list that changed meanwhile) counts once.
            if schedulable && is_ready && self.ready.insert(name.to_owned()) {
                let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
                self.cpu += quantity(allocatable, "cpu");
                self.memory += quantity(allocatable, "memory");
            }
        }
    }

    /// Adds the requests of the pods bound to a ready node that have not finished.
    pub fn add_pods(&mut self, pods: &[PodUsage]) {
        for pod in pods {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed"))
                || !node.is_some_and(|n| self.ready.contains(n))
            {
                continue;
            }
            for container in pod.spec.iter().flat_map(|s| &s.containers) {
                let requests = container
                    .resources
                    .as_ref()
                    .and_then(|r| r.requests.as_ref());
                self.requested_cpu += quantity(requests, "cpu");
                self.requested_memory += quantity(requests, "memory");
            }
        }
    }

    /// The capacity added up.
    pub fn total(&self) -> ClusterCapacity {
        // Quantities are milli-units: CPU stays in millicores, memory is divided to bytes.
        let clamp = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
        ClusterCapacity {
            nodes: self.nodes,
            ready_nodes: self.ready.len() as u32,
            allocatable_cpu_millis: clamp(self.cpu),
            allocatable_memory_bytes: clamp(self.memory / 1000),
            requested_cpu_millis: clamp(self.requested_cpu),
            requested_memory_bytes: clamp(self.requested_memory / 1000),
        }
    }
}

/// The capacity of `nodes` with `pods` on them (see [`CapacitySum`]).
pub fn capacity_of(nodes: &[NodeLite], pods: &[PodUsage]) -> ClusterCapacity {
    let mut sum = CapacitySum::default();
    sum.add_nodes(nodes);
    sum.add_pods(pods);
    sum.total()
}

/// Reads nodes and pods a page at a time and computes the cluster capacity.
pub async fn observe_capacity(
    executor: &Executor,
) -> Result<ClusterCapacity, kedge_protocol::Failure> {
    let mut sum = CapacitySum::default();
    let nodes: Api<NodeLite> = Api::all(executor.client().clone());
    for_each_page(&nodes, ListParams::default(), |page| sum.add_nodes(&page))
        .await
        .map_err(|e| classify(&e, "listing nodes"))?;
    let pods: Api<PodUsage> = Api::all(executor.client().clone());
    let running = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    for_each_page(&pods, running, |page| sum.add_pods(&page))
        .await
        .map_err(|e| classify(&e, "listing pods"))?;
    Ok(sum.total())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: bool, cpu: &str, mem: &str) -> NodeLite {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {
                "allocatable": {"cpu": cpu, "memory": mem},
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]
            }
        }))
        .unwrap()
    }

    fn pod(
        node: Option<&str>,
        phase: &str,
        cpu: &str,
        mem: &str,
        unschedulable_since: Option<&str>,
    ) -> PodUsage {
        let mut conditions = vec![];
        if let Some(t) = unschedulable_since {
            conditions.push(serde_json::json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": t}));
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]},
            "status": {"phase": phase, "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn capacity_counts_ready_nodes_and_live_bound_pods() {
        let nodes = [
            node("a", true, "4", "8Gi"),
            node("b", true, "2", "4Gi"),
            node("c", false, "16", "64Gi"),
        ];
        let pods = [
            pod(Some("a"), "Running", "500m", "1Gi", None),
            pod(Some("b"), "Running", "1", "512Mi", None),
            pod(Some("c"), "Running", "8", "1Gi", None), // on a NotReady node
            pod(Some("a"), "Succeeded", "2", "1Gi", None), // finished
            pod(None, "Pending", "1", "1Gi", Some("2026-01-01T00:00:00Z")), // unbound
        ];
        let cap = capacity_of(&nodes, &pods);
        // Page by page, the same.
        let mut sum = CapacitySum::default();
        sum.add_nodes(&nodes[..1]);
        sum.add_nodes(&nodes[1..]);
        for page in pods.chunks(2) {
            sum.add_pods(page);
        }
        assert_eq!(sum.total(), cap);
        assert_eq!((cap.nodes, cap.ready_nodes), (3, 2));
        assert_eq!(cap.allocatable_cpu_millis, 6000);
        assert_eq!(cap.allocatable_memory_bytes, 12 << 30);
        assert_eq!(cap.requested_cpu_millis, 1500);
        assert_eq!(cap.requested_memory_bytes, (1 << 30) + (512 << 20));
    }

    #[test]
    fn pending_and_unschedulable_pods_are_counted_with_the_oldest_time() {
        let pods = [
            pod(None, "Pending", "1", "1Gi", Some("2026-01-01T00:00:10Z")),
            pod(None, "Pending", "1", "1Gi", Some("2026-01-01T00:00:05Z")),
            pod(None, "Pending", "1", "1Gi", None),
            pod(Some("a"), "Running", "1", "1Gi", None),
        ];
        let mut counts = PodCounts::default();
        counts.add(&pods[..2]);
        counts.add(&pods[2..]);
        assert_eq!((counts.pending, counts.unschedulable), (3, 2));
        assert_eq!(counts.oldest_unschedulable, Some(1_767_225_605_000));
    }

    fn status(name: &str, ready: i32) -> WorkloadStatus {
        WorkloadStatus {
            exists: true,
            spec_replicas: 3,
            ready_replicas: ready,
            available_replicas: ready,
            ..WorkloadStatus::absent(WorkloadRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "ns".into(),
                name: name.into(),
            })
        }
    }

    #[test]
    fn autoscalers_match_by_kind_and_name() {
        let a = Autoscalers(vec![
            (
                "HorizontalPodAutoscaler ns/x".into(),
                "StatefulSet".into(),
                "a".into(),
            ),
            (
                "HorizontalPodAutoscaler ns/web".into(),
                "Deployment".into(),
                "a".into(),
            ),
        ]);
        let w = status("a", 1).workload;
        assert_eq!(
            a.targeting(&w).as_deref(),
            Some("HorizontalPodAutoscaler ns/web")
        );
        assert_eq!(a.targeting(&status("b", 1).workload), None);
    }

    #[test]
    fn pod_requests_add_up_over_containers() {
        let deployment = serde_json::json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1"}}},
            {"name": "c"},
            {"name": "d", "resources": {"requests": {"cpu": "not-a-quantity"}}}
        ]}}}});
        assert_eq!(pod_requests(&deployment), (1250, 128 << 20));
        assert_eq!(pod_requests(&serde_json::json!({})), (0, 0));
    }
}

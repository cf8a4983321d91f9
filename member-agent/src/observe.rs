//! What the agent observes by reading: the cluster's free capacity, read a page at a time
//! every capacity interval. Not watched: a watch would keep the facts of every node and every
//! pod in memory and take every pod change, where a read every 10 s (by default) holds one
//! page at a time, whatever the cluster's size. The workloads the hub manages here are
//! watched instead ([`crate::workloads`]).
//!
//! Nodes are read cluster-wide (`list nodes` is the agent's only cluster-wide grant); pods
//! only in the namespaces the agent serves (cluster-wide only with `--all-namespaces`). A pod
//! spec carries its containers' environment, often secrets, which the agent has no business
//! reading: the requests it reports are those of the pods it serves beside, and work in
//! other namespaces is not subtracted from the allocatable (see docs/security.md).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kedge_core::quantity::parse_quantity;
use kedge_protocol::ClusterCapacity;
use kube::Api;
use kube::api::ListParams;
use serde::Deserialize;

use crate::executor::{Executor, classify};
use crate::jobs::facts::Condition;
use crate::lite::{for_each_page, lite_resource};

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

/// A `v1` Pod, decoded with only what capacity needs.
#[derive(Debug, Clone, Deserialize)]
pub struct PodUsage {
    /// Standard metadata (without annotations and managed fields: [`crate::lite::slim_meta`]).
    #[serde(deserialize_with = "crate::lite::slim_meta")]
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

/// The part of a pod's status capacity needs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodUsageStatus {
    /// `Pending`, `Running`, ….
    #[serde(default)]
    pub phase: Option<String>,
}

lite_resource!(NodeLite, "", "v1", "Node", "nodes", ClusterResourceScope);
lite_resource!(PodUsage, "", "v1", "Pod", "pods", NamespaceResourceScope);

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

/// The pod lists capacity reads: one per served namespace, or one cluster-wide when every
/// namespace is served (`None`).
pub fn pod_scopes(namespaces: Option<&[String]>) -> Vec<Option<String>> {
    match namespaces {
        Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
        None => vec![None],
    }
}

/// Reads nodes, and the pods of the namespaces the agent serves, a page at a time and
/// computes the cluster capacity.
pub async fn observe_capacity(
    executor: &Executor,
) -> Result<ClusterCapacity, kedge_protocol::Failure> {
    let mut sum = CapacitySum::default();
    let nodes: Api<NodeLite> = Api::all(executor.client().clone());
    for_each_page(&nodes, ListParams::default(), |page| sum.add_nodes(&page))
        .await
        .map_err(|e| classify(&e, "listing nodes"))?;
    for scope in pod_scopes(executor.policy().namespaces.namespaces()) {
        let client = executor.client().clone();
        let pods: Api<PodUsage> = match &scope {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        };
        let running = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let what = format!(
            "listing pods in {}",
            scope.as_deref().unwrap_or("all namespaces")
        );
        for_each_page(&pods, running, |page| sum.add_pods(&page))
            .await
            .map_err(|e| classify(&e, &what))?;
    }
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
    fn pods_are_read_only_where_the_agent_serves() {
        let served = ["shop".to_owned(), "web".to_owned()];
        assert_eq!(
            pod_scopes(Some(&served)),
            [Some("shop".to_owned()), Some("web".to_owned())]
        );
        assert_eq!(pod_scopes(Some(&[])), Vec::<Option<String>>::new());
        assert_eq!(pod_scopes(None), [None]);
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
}

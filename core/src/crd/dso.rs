//! `DistributedScaledObject` (`dso`): replicas of one Deployment/StatefulSet spread over
//! member clusters.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::keda::ScaledObjectSpec;
use crate::duration;
use crate::limits::{
    MAX_MEMBERS, MAX_REPLICAS, MAX_TIER, MAX_WEIGHT, MEMBER_NAME_MAX_LENGTH, NAMESPACE_MAX_LENGTH,
    RFC1123_LABEL_PATTERN,
};

/// Default of `rebalancingPolicy.maxRebalancePercentage`.
pub const DEFAULT_MAX_REBALANCE_PERCENTAGE: i32 = 50;
/// Default of `rebalancingPolicy.gracePeriod` (the reference gives none for DSOs; we use
/// the DSJ failover default so both resources behave alike).
pub const DEFAULT_GRACE_PERIOD: &str = "1m";

/// Spec of a [`DistributedScaledObject`].
// kube's derive takes one `printcolumn(...)` per column; clippy sees repeated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kedge.dev",
    doc = "Replicas of one Deployment or StatefulSet spread over kedge member clusters; KEDA sets the fleet-wide total through /scale.",
    version = "v1alpha1",
    kind = "DistributedScaledObject",
    plural = "distributedscaledobjects",
    shortname = "dso",
    category = "kedge",
    namespaced,
    status = "DistributedScaledObjectStatus",
    derive = "PartialEq",
    derive = "Default",
    scale(
        spec_replicas_path = ".spec.totalTargetReplicas",
        status_replicas_path = ".status.totalCurrentReplicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".spec.totalTargetReplicas",
        description = "fleet-wide target set by KEDA or kubectl scale"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        json_path = ".status.totalCurrentReplicas",
        description = "replicas running in all member clusters"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".status.membersHealthyCount",
        description = "member clusters that are Ready"
    ),
    printcolumn(
        name = "Members",
        type_ = "integer",
        json_path = ".status.membersTotalCount",
        description = "member clusters used"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        description = "whether autoscaling.keda.sh/paused or paused-replicas holds the total"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "whether the spec is valid and replicas are placed"
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.scaledObjectSpec.scaleTargetRef.name",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DistributedScaledObjectSpec {
    /// Fleet-wide total replicas, written through `/scale` by KEDA's HPA or `kubectl scale`.
    /// Absent until the first such write: until then members keep what they run (a DSO
    /// applied over running workloads never scales them down before a metric is read).
    /// `/scale` reads an absent total as 0, as the API server does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub total_target_replicas: Option<i32>,
    /// Member clusters to use; empty means every registered member with equal weight.
    // A list map keyed by name: server-side apply merges entries, and the apiserver itself
    // refuses duplicate names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(length(max = MAX_MEMBERS))]
    pub member_clusters: Vec<DsoMemberCluster>,
    /// What happens when members become unreachable or come back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalancing_policy: Option<RebalancingPolicy>,
    /// How weights are chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The KEDA ScaledObject spec; `scaleTargetRef` names the workload in each member.
    pub scaled_object_spec: ScaledObjectSpec,
}

/// One entry of `spec.memberClusters` of a DSO.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DsoMemberCluster {
    /// Name of the `MemberCluster`: an RFC 1123 label of at most 63 characters.
    #[schemars(length(min = 1, max = MEMBER_NAME_MAX_LENGTH), regex(pattern = RFC1123_LABEL_PATTERN))]
    pub name: String,
    /// Share of replicas relative to the other members (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_WEIGHT))]
    pub weight: Option<i32>,
    /// Namespace of the workload in this member (default: the DSO's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = NAMESPACE_MAX_LENGTH), regex(pattern = RFC1123_LABEL_PATTERN))]
    pub target_namespace: Option<String>,
    /// Spill-over tier: tier 0 fills first, then tier 1, …; scale-in drains the highest
    /// tier first.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_TIER))]
    pub tier: i32,
    /// Floor for this member while the total allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub min_replicas: Option<i32>,
    /// Ceiling for this member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub max_replicas: Option<i32>,
}

/// `spec.rebalancingPolicy` of a DSO.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebalancingPolicy {
    /// How long a member may be unreachable before its share moves (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = duration::MAX_LENGTH), regex(pattern = duration::PATTERN))]
    pub grace_period: Option<String>,
    /// At most this percentage of the total moves between members in one rebalancing step.
    #[serde(default = "default_max_rebalance_percentage")]
    #[schemars(range(min = 0, max = 100))]
    pub max_rebalance_percentage: i32,
    /// Rescaling distributes the change instead of the total (KubeAdmiral), so no member
    /// shrinks on scale-out nor grows on scale-in.
    #[serde(default = "default_true")]
    pub avoid_disruption: bool,
    /// Replicas reported unschedulable for longer than this move to members with room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = duration::MAX_LENGTH), regex(pattern = duration::PATTERN))]
    pub migrate_unschedulable_after: Option<String>,
}

impl Default for RebalancingPolicy {
    fn default() -> Self {
        Self {
            grace_period: None,
            max_rebalance_percentage: DEFAULT_MAX_REBALANCE_PERCENTAGE,
            avoid_disruption: true,
            migrate_unschedulable_after: None,
        }
    }
}

fn default_max_rebalance_percentage() -> i32 {
    DEFAULT_MAX_REBALANCE_PERCENTAGE
}

fn default_true() -> bool {
    true
}

/// `spec.placement` of a DSO.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Use each member's reported capacity for this workload as its weight.
    #[serde(default)]
    pub dynamic_weights: bool,
}

/// Status of a [`DistributedScaledObject`], as in the reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributedScaledObjectStatus {
    /// Per member cluster, keyed by member name (at most [`super::MAX_LISTED_MEMBERS`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = super::MAX_LISTED_MEMBERS))]
    pub member_cluster_statuses: BTreeMap<String, DsoMemberClusterStatus>,
    /// Members that are Ready.
    #[serde(default)]
    pub members_healthy_count: i32,
    /// Members used by this DSO.
    #[serde(default)]
    pub members_total_count: i32,
    /// Label selector for `/scale`; never empty and matches no pod in the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Replicas running in all members.
    #[serde(default)]
    pub total_current_replicas: i32,
    /// Ready, Paused, Degraded… (see [`super::conditions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The fleet-wide values of the `kedge-pod-metrics` triggers, one entry per trigger.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_metrics: Vec<PodMetricsStatus>,
}

/// What the hub's external scaler answers KEDA for one `kedge-pod-metrics` trigger, and
/// where it comes from. Numbers are decimal strings, as Kubernetes quantities are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetricsStatus {
    /// The trigger's key: its `name`, or its type.
    pub trigger: String,
    /// The metric the agents scrape.
    pub metric_name: String,
    /// The target average per pod.
    pub threshold: String,
    /// The fleet-wide per-pod average, pods without a value counted by Kaito's rule; absent
    /// while no pod in the fleet has a value (KEDA then keeps the replicas or applies
    /// `fallback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average: Option<String>,
    /// The average over the pods that had a value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_average: Option<String>,
    /// Pods that had a value.
    #[serde(default)]
    pub pods_counted: i64,
    /// Pods without a value (unreachable, no such metric, or in a member without a fresh
    /// sample).
    #[serde(default)]
    pub pods_missing: i64,
    /// What each missing pod counted as: 0 above the threshold, 1.5 × threshold otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_counted_as: Option<String>,
    /// Each member's contribution, keyed by member name (at most
    /// [`super::MAX_LISTED_MEMBERS`], members with missing pods first).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = super::MAX_LISTED_MEMBERS))]
    pub members: BTreeMap<String, PodMetricsMemberStatus>,
}

/// One member's contribution to a [`PodMetricsStatus`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetricsMemberStatus {
    /// Sum of the metric over the member's pods that had it.
    pub sum: String,
    /// Pods that had a value.
    #[serde(default)]
    pub pods_counted: i64,
    /// Pods without one.
    #[serde(default)]
    pub pods_missing: i64,
    /// The member has no fresh sample: every pod it is known to run counts as missing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    /// Why pods are missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When its agent last scraped, by the agent's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrape_time: Option<Time>,
}

impl DistributedScaledObjectStatus {
    /// Whether `memberClusterStatuses` was cut to [`super::MAX_LISTED_MEMBERS`]: it names
    /// fewer members than the DSO uses (every one not Ready among them).
    pub fn is_cut(&self) -> bool {
        self.member_cluster_statuses.len() < usize::try_from(self.members_total_count).unwrap_or(0)
    }
}

/// Per-member entry of `status.memberClusterStatuses`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DsoMemberClusterStatus {
    /// Replicas the member reports.
    #[serde(default)]
    pub current_replicas: i32,
    /// Replicas kedge wants there.
    #[serde(default)]
    pub desired_replicas: i32,
    /// Human-readable health, e.g. `Cluster is healthy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Identity of the member agent session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When `state` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status_change_time: Option<Time>,
    /// `Ready`, `Pending`, `NotReported`, `Unreachable`, `WorkloadMissing`, `Refused` or
    /// `Conflict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Whether the member gets no share (lost longer than the grace period, never
    /// connected, or the workload is scaled by another DSO).
    #[serde(default)]
    pub excluded: bool,
    /// The last time the member's ready replicas moved towards `desiredReplicas` (or
    /// reached it): a member stuck far from it shows an old time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scaling_progress_time: Option<Time>,
}

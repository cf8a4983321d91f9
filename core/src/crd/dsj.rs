//! `DistributedScaledJob` (`dsj`): Jobs created across member clusters from KEDA metrics.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, EnvVar, ResourceClaim, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::keda::ScaledJobSpec;
use crate::duration;
use crate::limits::{
    MAX_JOBS, MAX_MEMBERS, MAX_PRIORITY, MAX_REPLICAS, MAX_WEIGHT, MEMBER_NAME_MAX_LENGTH,
    RFC1123_LABEL_PATTERN,
};

/// Default of `failoverPolicy.gracePeriod`.
pub const DEFAULT_FAILOVER_GRACE_PERIOD: &str = "1m";
/// Default of `failoverPolicy.hardTaintDuration`.
pub const DEFAULT_HARD_TAINT_DURATION: &str = "5m";
/// Default of `failoverPolicy.softTaintDuration`.
pub const DEFAULT_SOFT_TAINT_DURATION: &str = "3m";

/// Spec of a [`DistributedScaledJob`].
///
/// The `/scale` subresource exists only so that the hub's shadow KEDA ScaledObject can
/// target the DSJ: its HPA writes `.spec.totalTargetReplicas` (informational, the hub reads
/// the trigger values from the external metrics API instead), `.status.runningJobs` is the
/// status count and `.status.selector` the (hub-empty) selector.
// kube's derive takes one `printcolumn(...)` per column; clippy sees repeated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kedge.dev",
    doc = "Jobs created across kedge member clusters from KEDA trigger values.",
    version = "v1alpha1",
    kind = "DistributedScaledJob",
    plural = "distributedscaledjobs",
    shortname = "dsj",
    category = "kedge",
    namespaced,
    status = "DistributedScaledJobStatus",
    derive = "PartialEq",
    derive = "Default",
    scale(
        spec_replicas_path = ".spec.totalTargetReplicas",
        status_replicas_path = ".status.runningJobs",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Strategy",
        type_ = "string",
        json_path = ".status.clusterStrategy",
        description = "cluster scheduling strategy in effect (defaulted ones included)"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredJobs"),
    printcolumn(name = "Running", type_ = "integer", json_path = ".status.runningJobs"),
    printcolumn(name = "Pending", type_ = "integer", json_path = ".status.pendingJobs"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DistributedScaledJobSpec {
    /// Written by the shadow ScaledObject's HPA through `/scale`; not used for decisions.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub total_target_replicas: i32,
    /// Member clusters to use; empty means every registered member with equal weight.
    // A list map keyed by name: server-side apply merges entries, and the apiserver itself
    // refuses duplicate names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(length(max = MAX_MEMBERS))]
    pub member_clusters: Vec<DsjMemberCluster>,
    /// How Jobs are spread over members and how failures taint members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_scheduling: Option<ClusterScheduling>,
    /// The KEDA ScaledJob spec.
    pub scaled_job_spec: ScaledJobSpec,
}

/// One entry of `spec.memberClusters` of a DSJ.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DsjMemberCluster {
    /// Name of the `MemberCluster`: an RFC 1123 label of at most 63 characters.
    #[schemars(length(min = 1, max = MEMBER_NAME_MAX_LENGTH), regex(pattern = RFC1123_LABEL_PATTERN))]
    pub name: String,
    /// Share of Jobs under `weightedRoundRobin` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_WEIGHT))]
    pub weight: Option<i32>,
    /// Settings for `priorityFailover`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<MemberScheduling>,
    /// Changes applied to Jobs created in this member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_overrides: Option<PodOverrides>,
}

/// `memberClusters[].scheduling`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberScheduling {
    /// Higher is preferred; required for every member under `priorityFailover` (0–1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_PRIORITY))]
    pub priority: Option<i32>,
}

/// `memberClusters[].podOverrides`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Merged into the pod's nodeSelector; override values win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Merged, de-duplicated by (key, operator, effect, value); override wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Replaces the pod's affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Per container name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_overrides: Option<BTreeMap<String, ContainerOverride>>,
}

/// `podOverrides.containerOverrides.<name>`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerOverride {
    /// Replaces the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Merged by name; override wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// requests/limits merged by resource name; claims replaced when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesOverride>,
}

/// `containerOverrides.<name>.resources`: unlike `ResourceRequirements`, a present but empty
/// `claims` list means "clear the claims".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesOverride {
    /// Merged by resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Merged by resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Replaces the claims when present, even when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Vec<ResourceClaim>>,
}

/// `spec.clusterScheduling`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterScheduling {
    /// `weightedRoundRobin` (default) or `priorityFailover`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["weightedRoundRobin", "priorityFailover"]))]
    pub strategy: Option<String>,
    /// Class and size of this workload; required under `priorityFailover`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_affinity: Option<WorkloadAffinity>,
    /// Taint timing and duplicate handling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_policy: Option<FailoverPolicy>,
}

/// `clusterScheduling.workloadAffinity`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadAffinity {
    /// Workload class, e.g. `team-a`; taints apply per class.
    pub class: String,
    /// Workload size; a taint recorded at size N excludes sizes >= N.
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub size: i32,
}

/// `clusterScheduling.failoverPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverPolicy {
    /// How long a Job may stay pending before it is stuck (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = duration::MAX_LENGTH), regex(pattern = duration::PATTERN))]
    pub grace_period: Option<String>,
    /// How long a hard taint lasts (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = duration::MAX_LENGTH), regex(pattern = duration::PATTERN))]
    pub hard_taint_duration: Option<String>,
    /// Window in which a second failure escalates a soft taint (default `3m`; `0s` makes the
    /// first failure a hard taint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = duration::MAX_LENGTH), regex(pattern = duration::PATTERN))]
    pub soft_taint_duration: Option<String>,
    /// `keepAll` (default), `preferFailover`, `preferSource`, `immediateSourceCleanup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["keepAll", "preferFailover", "preferSource", "immediateSourceCleanup"]))]
    pub duplication_policy: Option<String>,
}

/// Status of a [`DistributedScaledJob`], as in the reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributedScaledJobStatus {
    /// Jobs wanted from the metrics.
    #[serde(default)]
    pub desired_jobs: i32,
    /// Non-terminal Jobs in all members (includes pending).
    #[serde(default)]
    pub running_jobs: i32,
    /// Jobs not yet running.
    #[serde(default)]
    pub pending_jobs: i32,
    /// Per member, keyed by member name (at most [`super::MAX_LISTED_MEMBERS`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = super::MAX_LISTED_MEMBERS))]
    pub member_cluster_statuses: BTreeMap<String, DsjMemberClusterStatus>,
    /// Label selector for `/scale`; never empty and matches no pod in the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Target average value per Job of each trigger, by trigger name (else type), as a
    /// quantity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scalers_target_average_value: BTreeMap<String, String>,
    /// Per trigger: whether it could be read and whether it asks for Jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub trigger_metrics_status: Vec<TriggerMetricStatus>,
    /// The cluster scheduling strategy in effect (`weightedRoundRobin` when the spec leaves
    /// it out), for the STRATEGY column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_strategy: Option<String>,
    /// What the hub keeps from one poll to the next (taints, round robin, stuck Jobs, the
    /// next Job's index), so that a hub restart loses no taint and creates no Job twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<DsjScheduling>,
    /// Ready, Paused… (see [`super::conditions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One entry of `status.triggerMetricsStatus`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TriggerMetricStatus {
    /// Trigger name (else its type).
    pub name: String,
    /// `Active` (asks for Jobs), `Inactive` or `Error` (could not be read: no Job is created).
    pub state: String,
    /// The value and target, or why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<String>,
    /// When `state` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change_time: Option<Time>,
}

/// `status.scheduling`: the hub's memory between polls.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DsjScheduling {
    /// Taints in force.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<TaintRecord>,
    /// Smooth weighted round-robin credit per member.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub round_robin: BTreeMap<String, i64>,
    /// Jobs found stuck (each tainted its member once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck_jobs: Vec<String>,
    /// Index of the next Job to create (Job names are derived from it).
    #[serde(default)]
    pub next_job_index: i64,
    /// Non-terminal Jobs per member after the poll, the Jobs it created included; written
    /// before those creates are sent. A restarted hub counts them for a member until that
    /// member reports its Jobs, so it creates none a second time elsewhere.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub member_jobs: BTreeMap<String, MemberJobCount>,
}

/// One entry of `status.scheduling.memberJobs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberJobCount {
    /// Non-terminal Jobs (includes pending).
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub running: i32,
    /// Of those, pending.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub pending: i32,
}

/// One taint in `status.scheduling.taints`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaintRecord {
    /// Tainted member.
    pub member: String,
    /// Workload class the taint is scoped to (`priorityFailover`); absent: the whole member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Workloads of this size or larger are affected (with `class`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Priority of the member when the taint was set (with `class`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// End of the soft-taint window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_until: Option<Time>,
    /// End of the hard taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_until: Option<Time>,
}

/// Per-member entry of a DSJ's `status.memberClusterStatuses`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DsjMemberClusterStatus {
    /// Human-readable health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Identity of the member agent session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Non-terminal Jobs.
    #[serde(default)]
    pub running_jobs: i32,
    /// Jobs not yet running.
    #[serde(default)]
    pub pending_jobs: i32,
    /// Jobs pending longer than the grace period.
    #[serde(default)]
    pub stuck_jobs: i32,
    /// Whether the member carries a soft taint.
    #[serde(default)]
    pub soft_tainted: bool,
    /// When `state` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status_change_time: Option<Time>,
    /// `Ready` or `Unreachable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Whether the member is hard-tainted (excluded from scheduling).
    #[serde(default)]
    pub excluded: bool,
    /// Whether the member carries a hard taint that applies to this DSJ.
    #[serde(default)]
    pub hard_tainted: bool,
    /// What its hard taints apply to: `cluster`, or `CLASS>=SIZE@PRIORITY` under
    /// `priorityFailover`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hard_taint_scopes: Vec<String>,
}

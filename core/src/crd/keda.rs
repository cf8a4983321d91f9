//! The KEDA `ScaledObject` and `ScaledJob` specs (keda.sh/v1alpha1) that a DSO and a DSJ
//! embed, with KEDA's field names and defaults.

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior;
use k8s_openapi::api::batch::v1::JobSpec;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_COOLDOWN_PERIOD, MAX_FAILURE_THRESHOLD, MAX_JOBS, MAX_POLLING_INTERVAL,
    MAX_QUEUE_LENGTH_DEDUCTION, MAX_REPLICAS, MAX_TRIGGERS, OBJECT_NAME_MAX_LENGTH,
    RFC1123_SUBDOMAIN_PATTERN,
};

/// KEDA's default `pollingInterval` in seconds.
pub const DEFAULT_POLLING_INTERVAL: i32 = 30;
/// KEDA's default `cooldownPeriod` in seconds.
pub const DEFAULT_COOLDOWN_PERIOD: i32 = 300;
/// KEDA's default `maxReplicaCount` (ScaledObject and ScaledJob).
pub const DEFAULT_MAX_REPLICA_COUNT: i32 = 100;
/// KEDA's default `successfulJobsHistoryLimit` and `failedJobsHistoryLimit`.
pub const DEFAULT_JOBS_HISTORY_LIMIT: i32 = 100;

/// A KEDA trigger (scaler) as written in `triggers[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTriggers {
    /// Scaler type, e.g. `rabbitmq`, `prometheus`, `kubernetes-resource`.
    #[serde(rename = "type")]
    #[schemars(length(min = 1))]
    pub type_: String,
    /// Optional trigger name; a DSJ simulation scenario refers to triggers by this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Scaler-specific settings.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Reference to a (Cluster)TriggerAuthentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication_ref: Option<AuthenticationRef>,
    /// `AverageValue` (default), `Value` or `Utilization`. A DSO refuses `Value`: the HPA
    /// would divide by the pods its selector finds in the hub, and there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["AverageValue", "Value", "Utilization"]))]
    pub metric_type: Option<String>,
    /// Whether KEDA may answer from its metrics cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_cached_metrics: Option<bool>,
}

/// Reference to a TriggerAuthentication or ClusterTriggerAuthentication.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationRef {
    /// Name of the authentication object.
    pub name: String,
    /// `TriggerAuthentication` (default) or `ClusterTriggerAuthentication`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["TriggerAuthentication", "ClusterTriggerAuthentication"]))]
    pub kind: Option<String>,
}

/// The workload a ScaledObject scales; in member clusters, for a DSO.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTargetRef {
    /// API version of the target, default `apps/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind of the target, default `Deployment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the target (an RFC 1123 subdomain, as object names are).
    #[schemars(length(min = 1, max = OBJECT_NAME_MAX_LENGTH), regex(pattern = RFC1123_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Container whose environment KEDA reads for trigger settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_source_container_name: Option<String>,
}

/// KEDA `fallback`: replicas to use when a scaler keeps failing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fallback {
    /// Consecutive failures before the fallback applies.
    #[schemars(range(min = 1, max = MAX_FAILURE_THRESHOLD))]
    pub failure_threshold: i32,
    /// Replicas during fallback.
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub replicas: i32,
    /// `static` (default), `currentReplicas`, `currentReplicasIfHigher`,
    /// `currentReplicasIfLower`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"]))]
    pub behavior: Option<String>,
}

/// KEDA `advanced` settings of a ScaledObject.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedConfig {
    /// Scale the target back to its original count when the ScaledObject is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_to_original_replica_count: Option<bool>,
    /// Settings passed to the HPA KEDA creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizontal_pod_autoscaler_config: Option<HorizontalPodAutoscalerConfig>,
    /// Composite metric from several triggers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_modifiers: Option<ScalingModifiers>,
}

/// `advanced.horizontalPodAutoscalerConfig`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HorizontalPodAutoscalerConfig {
    /// Name of the HPA (default `keda-hpa-<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// HPA scaling behaviour (autoscaling/v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
}

/// `advanced.scalingModifiers`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingModifiers {
    /// Expression over trigger names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formula: Option<String>,
    /// Target of the composite metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Activation target of the composite metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_target: Option<String>,
    /// Metric type of the composite metric; a DSO refuses `Value` here too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["AverageValue", "Value", "Utilization"]))]
    pub metric_type: Option<String>,
}

/// The KEDA ScaledObject spec embedded in a DSO as `scaledObjectSpec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaledObjectSpec {
    /// The Deployment/StatefulSet in each member cluster.
    pub scale_target_ref: ScaleTargetRef,
    /// Seconds between trigger checks (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_POLLING_INTERVAL))]
    pub polling_interval: Option<i32>,
    /// Seconds to wait after the last active trigger before scaling to zero (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_COOLDOWN_PERIOD))]
    pub cooldown_period: Option<i32>,
    /// Seconds after creation before the first cooldown applies (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_COOLDOWN_PERIOD))]
    pub initial_cooldown_period: Option<i32>,
    /// Replicas while no trigger is active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub idle_replica_count: Option<i32>,
    /// Lower bound of the fleet-wide total (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub min_replica_count: Option<i32>,
    /// Upper bound of the fleet-wide total (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub max_replica_count: Option<i32>,
    /// Replicas to use when scalers keep failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// HPA and scaling-modifier settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advanced: Option<AdvancedConfig>,
    /// The scalers.
    #[serde(default)]
    pub triggers: Vec<ScaleTriggers>,
}

impl ScaledObjectSpec {
    /// `minReplicaCount` with KEDA's default.
    pub fn min_replicas(&self) -> i32 {
        self.min_replica_count.unwrap_or(0)
    }
    /// `maxReplicaCount` with KEDA's default.
    pub fn max_replicas(&self) -> i32 {
        self.max_replica_count.unwrap_or(DEFAULT_MAX_REPLICA_COUNT)
    }
}

/// `rollout` of a ScaledJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// `default` (delete running Jobs on update) or `gradual`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["default", "gradual"]))]
    pub strategy: Option<String>,
    /// `background` (default) or `foreground`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["background", "foreground"]))]
    pub propagation_policy: Option<String>,
}

/// `scalingStrategy` of a ScaledJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingStrategy {
    /// `default`/`basic`, `pendingAware` (DSJ default), `custom`, `accurate`, `eager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["default", "basic", "pendingAware", "custom", "accurate", "eager"]))]
    pub strategy: Option<String>,
    /// `custom`: subtracted from the target metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -MAX_QUEUE_LENGTH_DEDUCTION, max = MAX_QUEUE_LENGTH_DEDUCTION))]
    pub custom_scaling_queue_length_deduction: Option<i32>,
    /// `custom`: share of running Jobs subtracted, as a decimal string (`"0.5"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_scaling_running_job_percentage: Option<String>,
    /// Pod conditions that count a Job as pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pod_conditions: Option<Vec<String>>,
    /// `max` (default), `min`, `avg` or `sum` over several triggers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["max", "min", "avg", "sum"]))]
    pub multiple_scalers_calculation: Option<String>,
}

/// The KEDA ScaledJob spec embedded in a DSJ as `scaledJobSpec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaledJobSpec {
    /// The batch/v1 JobSpec of every Job created.
    pub job_target_ref: JobSpec,
    /// Seconds between trigger checks (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_POLLING_INTERVAL))]
    pub polling_interval: Option<i32>,
    /// Successful Jobs to keep (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub successful_jobs_history_limit: Option<i32>,
    /// Failed Jobs to keep (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub failed_jobs_history_limit: Option<i32>,
    /// Container whose environment KEDA reads (default the first one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_source_container_name: Option<String>,
    /// Jobs kept around even without load (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub min_replica_count: Option<i32>,
    /// Upper bound of concurrent non-terminal Jobs (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_JOBS))]
    pub max_replica_count: Option<i32>,
    /// Deprecated form of `rollout.strategy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["default", "gradual"]))]
    pub rollout_strategy: Option<String>,
    /// What happens to running Jobs when the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// How many Jobs to create per poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_strategy: Option<ScalingStrategy>,
    /// The scalers.
    #[serde(default)]
    #[schemars(length(max = MAX_TRIGGERS))]
    pub triggers: Vec<ScaleTriggers>,
}

impl ScaledJobSpec {
    /// `minReplicaCount` with KEDA's default, lowered to `maxReplicaCount` as KEDA does.
    pub fn min_replicas(&self) -> i32 {
        self.min_replica_count.unwrap_or(0).min(self.max_replicas())
    }
    /// `maxReplicaCount` with KEDA's default.
    pub fn max_replicas(&self) -> i32 {
        self.max_replica_count.unwrap_or(DEFAULT_MAX_REPLICA_COUNT)
    }
}

/// The key a simulation or the hub uses for a trigger: its `name`, else its `type`.
pub fn trigger_key(trigger: &ScaleTriggers) -> &str {
    trigger.name.as_deref().unwrap_or(&trigger.type_)
}

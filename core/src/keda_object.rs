//! The one KEDA ScaledObject kedge writes into the hub cluster, built from typed parts:
//! a DSO's child (KEDA scales the DSO's own `/scale`, whose total the DSO splits over its
//! members) and a DSJ's shadow (KEDA's metrics server reads the DSJ's triggers; the DSJ
//! controller reads the values back). Both target kedge's own resource, carry kedge's label
//! and are owned by it, so they go when it goes.

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use serde::Serialize;

use crate::crd::conditions::{ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS, LABEL_DSJ, LABEL_DSO};
use crate::crd::keda::{AuthenticationRef, ScaleTargetRef, ScaledObjectSpec};
use crate::crd::{DistributedScaledJob, DistributedScaledObject, GROUP, VERSION};
use crate::podmetrics;

/// `apiVersion` of KEDA's ScaledObject.
pub const API_VERSION: &str = "keda.sh/v1alpha1";
/// `kind` of KEDA's ScaledObject.
pub const KIND: &str = "ScaledObject";
/// KEDA's default `pollingInterval`, in seconds.
const DEFAULT_POLLING_INTERVAL: i32 = 30;

/// The dead zone of a pod-metrics trigger (Kaito's defaults): scale up only above
/// threshold × (1 + 0.1), down only below threshold × (1 − 0.5). Tolerances are quantities.
pub const POD_METRICS_TOLERANCE: [(Direction, &str); 2] =
    [(Direction::Up, "0.1"), (Direction::Down, "0.5")];

/// A direction of the HPA's `behavior`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `scaleUp`.
    Up,
    /// `scaleDown`.
    Down,
}

/// Where KEDA reaches the hub's external scaler for `kedge-pod-metrics` triggers.
#[derive(Clone, Copy, Debug)]
pub struct ExternalScaler<'a> {
    /// `host:port` KEDA dials.
    pub address: &'a str,
    /// The ClusterTriggerAuthentication KEDA calls it with.
    pub authentication: &'a str,
}

/// A KEDA ScaledObject as kedge writes it (serialize it to apply it).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaledObject {
    /// Always [`API_VERSION`].
    pub api_version: &'static str,
    /// Always [`KIND`].
    pub kind: &'static str,
    /// Name and namespace of the owner, its label, its controlling owner reference.
    pub metadata: ObjectMeta,
    /// What KEDA reads.
    pub spec: ScaledObjectSpec,
}

fn object(
    kind: &str,
    label: &str,
    name: &str,
    namespace: &str,
    owner: OwnerReference,
    annotations: Option<BTreeMap<String, String>>,
    mut spec: ScaledObjectSpec,
) -> ScaledObject {
    spec.scale_target_ref = ScaleTargetRef {
        api_version: Some(format!("{GROUP}/{VERSION}")),
        kind: Some(kind.to_owned()),
        name: name.to_owned(),
        env_source_container_name: None,
    };
    ScaledObject {
        api_version: API_VERSION,
        kind: KIND,
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(label.to_owned(), name.to_owned())])),
            annotations,
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
    }
}

/// The child ScaledObject of a DSO named `name` in `namespace`: its `scaledObjectSpec`
/// targeting the DSO's `/scale`, with the DSO's pause annotations (KEDA pauses the HPA
/// too). With a `scaler`, each `kedge-pod-metrics` trigger becomes the `external` trigger
/// KEDA calls the hub with (see `external_triggers`); without one they stay as written.
pub fn child_of_dso(
    dso: &DistributedScaledObject,
    namespace: &str,
    name: &str,
    owner: OwnerReference,
    scaler: Option<ExternalScaler<'_>>,
) -> ScaledObject {
    let mut spec = dso.spec.scaled_object_spec.clone();
    if let Some(scaler) = scaler {
        external_triggers(&mut spec, scaler);
    }
    let annotations = dso
        .annotations()
        .iter()
        .filter(|(k, _)| *k == ANNOTATION_PAUSED || *k == ANNOTATION_PAUSED_REPLICAS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    object(
        "DistributedScaledObject",
        LABEL_DSO,
        name,
        namespace,
        owner,
        Some(annotations),
        spec,
    )
}

/// The shadow ScaledObject of a DSJ named `name` in `namespace`: the DSJ's triggers and
/// `pollingInterval`, between 0 and the DSJ's `maxReplicaCount` (at least 1, so that KEDA
/// keeps reading), targeting the DSJ's `/scale`.
pub fn shadow_of_dsj(
    dsj: &DistributedScaledJob,
    namespace: &str,
    name: &str,
    owner: OwnerReference,
) -> ScaledObject {
    let sj = &dsj.spec.scaled_job_spec;
    let spec = ScaledObjectSpec {
        polling_interval: Some(sj.polling_interval.unwrap_or(DEFAULT_POLLING_INTERVAL)),
        min_replica_count: Some(0),
        max_replica_count: Some(sj.max_replicas().max(1)),
        triggers: sj.triggers.clone(),
        ..ScaledObjectSpec::default()
    };
    object(
        "DistributedScaledJob",
        LABEL_DSJ,
        name,
        namespace,
        owner,
        None,
        spec,
    )
}

/// Turns each `kedge-pod-metrics` trigger into the `external` trigger KEDA calls the hub's
/// scaler with (its index in [`podmetrics::TRIGGER_INDEX_KEY`]), and gives the HPA the dead
/// zone of [`POD_METRICS_TOLERANCE`] in each direction the DSO does not set a tolerance for.
fn external_triggers(spec: &mut ScaledObjectSpec, scaler: ExternalScaler<'_>) {
    let mut converted = false;
    for (index, trigger) in spec.triggers.iter_mut().enumerate() {
        if trigger.type_ != podmetrics::TRIGGER_TYPE {
            continue;
        }
        converted = true;
        trigger.type_ = "external".to_owned();
        trigger
            .metadata
            .insert("scalerAddress".to_owned(), scaler.address.to_owned());
        trigger
            .metadata
            .insert(podmetrics::TRIGGER_INDEX_KEY.to_owned(), index.to_string());
        trigger.metric_type = Some("AverageValue".to_owned());
        trigger.authentication_ref = Some(AuthenticationRef {
            name: scaler.authentication.to_owned(),
            kind: Some("ClusterTriggerAuthentication".to_owned()),
        });
    }
    if !converted {
        return;
    }
    let behavior: &mut HorizontalPodAutoscalerBehavior = spec
        .advanced
        .get_or_insert_default()
        .horizontal_pod_autoscaler_config
        .get_or_insert_default()
        .behavior
        .get_or_insert_default();
    for (direction, tolerance) in POD_METRICS_TOLERANCE {
        let rules: &mut HPAScalingRules = match direction {
            Direction::Up => behavior.scale_up.get_or_insert_default(),
            Direction::Down => behavior.scale_down.get_or_insert_default(),
        };
        rules
            .tolerance
            .get_or_insert_with(|| Quantity(tolerance.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn owner(kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: kind.to_owned(),
            name: "work".to_owned(),
            uid: "u-1".to_owned(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn a_dsj_shadow_reads_its_triggers_and_targets_the_dsj() {
        let dsj: DistributedScaledJob = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledJob",
            "metadata": {"name": "work", "namespace": "default", "uid": "u-1"},
            "spec": {"memberClusters": [{"name": "m1"}], "scaledJobSpec": {
                "maxReplicaCount": 0,
                "jobTargetRef": {"template": {"spec": {"containers": []}}},
                "triggers": [{"type": "kubernetes-resource", "name": "queue",
                    "metadata": {"targetValue": "1"}}]
            }}
        }))
        .unwrap();
        let so = serde_json::to_value(shadow_of_dsj(
            &dsj,
            "default",
            "work",
            owner("DistributedScaledJob"),
        ))
        .unwrap();
        assert_eq!(
            so,
            json!({
                "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                "metadata": {"name": "work", "namespace": "default",
                    "labels": {LABEL_DSJ: "work"},
                    "ownerReferences": [{"apiVersion": "kedge.dev/v1alpha1",
                        "kind": "DistributedScaledJob", "name": "work", "uid": "u-1",
                        "controller": true}]},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "kedge.dev/v1alpha1",
                        "kind": "DistributedScaledJob", "name": "work"},
                    // KEDA's default interval; at least one replica so that KEDA reads on.
                    "pollingInterval": 30, "minReplicaCount": 0, "maxReplicaCount": 1,
                    "triggers": [{"type": "kubernetes-resource", "name": "queue",
                        "metadata": {"targetValue": "1"}}]
                }
            })
        );
    }

    #[test]
    fn pod_metrics_triggers_become_external_only_with_a_scaler() {
        let dso: DistributedScaledObject = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": "llm", "namespace": "ai", "uid": "u-1",
                "annotations": {ANNOTATION_PAUSED: "true", "other": "x"}},
            "spec": {"memberClusters": [{"name": "m1"}], "scaledObjectSpec": {
                "scaleTargetRef": {"name": "vllm"},
                "triggers": [{"type": "kedge-pod-metrics", "metadata": {"threshold": "4"}}]
            }}
        }))
        .unwrap();
        let owner = owner("DistributedScaledObject");
        let plain = child_of_dso(&dso, "ai", "llm", owner.clone(), None);
        assert_eq!(plain.spec.triggers[0].type_, podmetrics::TRIGGER_TYPE);
        assert_eq!(plain.spec.advanced, None);
        assert_eq!(
            plain.metadata.annotations,
            Some(BTreeMap::from([(
                ANNOTATION_PAUSED.to_owned(),
                "true".to_owned()
            )]))
        );
        let scaler = ExternalScaler {
            address: "hub:9090",
            authentication: "kedge-scaler",
        };
        let external = child_of_dso(&dso, "ai", "llm", owner, Some(scaler));
        let trigger = &external.spec.triggers[0];
        assert_eq!(trigger.type_, "external");
        assert_eq!(trigger.metadata["scalerAddress"], "hub:9090");
        assert_eq!(trigger.metadata[podmetrics::TRIGGER_INDEX_KEY], "0");
        let value = serde_json::to_value(&external).unwrap();
        let behavior = &value["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
        assert_eq!(behavior["scaleUp"]["tolerance"], "0.1");
        assert_eq!(behavior["scaleDown"]["tolerance"], "0.5");
        assert_eq!(value["spec"]["scaleTargetRef"]["name"], "llm");
    }
}

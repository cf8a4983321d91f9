//! The kinds watched for the workloads the agent scales, decoded with only the fields the
//! report needs and reduced to compact facts: a workload's counts, pod requests and selector;
//! a pending pod's labels and since when it is unschedulable; what an autoscaler targets.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kedge_core::quantity::parse_quantity;
use kube::api::ApiResource;
use kube::core::DynamicResourceScope;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::jobs::facts::Condition;
use crate::lite::lite_resource;
use crate::observe::ContainerUsage;

/// Decodes a field, or `None` when it has another shape: a custom resource may put anything
/// under a name, and one odd field must not fail the decoding (and so the watch) of the
/// whole object.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).ok())
}

/// A workload of any kind with a `/scale` subresource (Deployment, StatefulSet, a custom
/// resource), decoded with only what the report needs.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkloadLite {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The spec.
    #[serde(default)]
    pub spec: WorkloadLiteSpec,
    /// The status, if any.
    #[serde(default)]
    pub status: Option<WorkloadLiteStatus>,
}

/// The part of a workload's spec the report needs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WorkloadLiteSpec {
    /// `spec.replicas`.
    #[serde(default, deserialize_with = "lenient")]
    pub replicas: Option<i32>,
    /// `spec.selector`, a label selector (as in `apps/v1` and Argo Rollouts).
    #[serde(default, deserialize_with = "lenient")]
    pub selector: Option<LabelSelector>,
    /// `spec.template`, for the requests of one pod.
    #[serde(default, deserialize_with = "lenient")]
    pub template: Option<TemplateLite>,
}

/// A pod template, reduced to its containers' requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateLite {
    /// The pod spec.
    #[serde(default)]
    pub spec: Option<TemplateLiteSpec>,
}

/// A pod template's spec, reduced to its containers.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateLiteSpec {
    /// Its containers.
    #[serde(default)]
    pub containers: Vec<ContainerUsage>,
}

/// The part of a workload's status the report needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadLiteStatus {
    /// `status.readyReplicas`.
    #[serde(default, deserialize_with = "lenient")]
    pub ready_replicas: Option<i32>,
    /// `status.availableReplicas`.
    #[serde(default, deserialize_with = "lenient")]
    pub available_replicas: Option<i32>,
}

/// Any scalable kind, resolved at run time (its [`ApiResource`] from discovery).
impl kube::Resource for WorkloadLite {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.api_version)
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the report says of a workload, kept between watch events (a few dozen bytes and
/// its selector).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadFacts {
    /// `spec.replicas`.
    pub spec_replicas: i32,
    /// `status.readyReplicas`.
    pub ready_replicas: i32,
    /// `status.availableReplicas`.
    pub available_replicas: i32,
    /// CPU one pod requests, millicores.
    pub pod_cpu_millis: u64,
    /// Memory one pod requests, bytes.
    pub pod_memory_bytes: u64,
    /// Which pods are the workload's; `None` counts none.
    pub selector: Option<Selector>,
}

impl WorkloadFacts {
    /// The facts of a workload.
    pub fn of(workload: &WorkloadLite) -> Self {
        let status = workload.status.as_ref();
        let containers = workload
            .spec
            .template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .map(|s| s.containers.as_slice())
            .unwrap_or_default();
        let (pod_cpu_millis, pod_memory_bytes) = pod_requests(containers);
        Self {
            spec_replicas: workload.spec.replicas.unwrap_or(0),
            ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            available_replicas: status.and_then(|s| s.available_replicas).unwrap_or(0),
            pod_cpu_millis,
            pod_memory_bytes,
            selector: workload.spec.selector.as_ref().and_then(Selector::of),
        }
    }
}

/// CPU (millicores) and memory (bytes) one pod requests: the sum over its containers;
/// quantities that do not parse count as none.
pub fn pod_requests(containers: &[ContainerUsage]) -> (u64, u64) {
    let request = |requests: Option<&BTreeMap<String, Quantity>>, resource: &str| {
        requests
            .and_then(|r| r.get(resource))
            .and_then(|q| parse_quantity(&q.0).ok())
            .unwrap_or(0)
            .max(0)
    };
    let (mut cpu, mut memory) = (0i128, 0i128);
    for container in containers {
        let requests = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        cpu += request(requests, "cpu");
        memory += request(requests, "memory");
    }
    let clamp = |v: i128| u64::try_from(v).unwrap_or(u64::MAX);
    // Quantities are milli-units: CPU stays in millicores, memory is divided to bytes.
    (clamp(cpu), clamp(memory / 1000))
}

/// A label selector, reduced to requirements (`matchLabels` become `In` with one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// One requirement of a [`Selector`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Operator,
    values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Selector {
    /// The selector of `selector`; `None` when it is empty or has an operator Kubernetes
    /// does not know. An empty selector counts no pods: `/scale` reports it as `""`, which
    /// the agent always took for "no selector".
    pub fn of(selector: &LabelSelector) -> Option<Self> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement {
                key: key.clone(),
                op: Operator::In,
                values: vec![value.clone()],
            });
        }
        for expression in selector.match_expressions.iter().flatten() {
            let op = match expression.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                _ => return None,
            };
            requirements.push(Requirement {
                key: expression.key.clone(),
                op,
                values: expression.values.clone().unwrap_or_default(),
            });
        }
        (!requirements.is_empty()).then_some(Self(requirements))
    }

    /// Whether pods with `labels` (sorted by key) are selected.
    pub fn matches(&self, labels: &[(String, String)]) -> bool {
        self.0.iter().all(|r| {
            let value = labels
                .binary_search_by(|(k, _)| k.as_str().cmp(&r.key))
                .ok()
                .map(|i| labels[i].1.as_str());
            match r.op {
                Operator::In => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Operator::NotIn => value.is_none_or(|v| r.values.iter().all(|x| x != v)),
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
            }
        })
    }
}

/// A pod, decoded with only what a workload's pending and unschedulable counts need.
#[derive(Debug, Clone, Deserialize)]
pub struct PendingPodLite {
    /// Standard metadata (without annotations and managed fields: [`crate::lite::slim_meta`]).
    #[serde(deserialize_with = "crate::lite::slim_meta")]
    pub metadata: ObjectMeta,
    /// The status, if any.
    #[serde(default)]
    pub status: Option<PendingPodLiteStatus>,
}

/// The part of a pod's status the counts need.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PendingPodLiteStatus {
    /// `Pending`, `Running`, ….
    #[serde(default)]
    pub phase: Option<String>,
    /// Pod conditions.
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
}

lite_resource!(
    PendingPodLite,
    "",
    "v1",
    "Pod",
    "pods",
    NamespaceResourceScope
);

/// Since when (Unix ms) the scheduler has reported a pod `Unschedulable`, if it has.
pub fn unschedulable_since(conditions: &[Condition]) -> Option<i64> {
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

/// What is kept of a pending pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    /// Its labels, sorted by key (a vector: a map's smallest node holds eleven entries).
    pub labels: Vec<(String, String)>,
    /// Since when it is unschedulable (Unix ms), if it is.
    pub unschedulable_since: Option<i64>,
}

impl PendingPod {
    /// The facts of a pod; `None` unless it is pending and not being deleted.
    pub fn of(pod: &PendingPodLite) -> Option<Self> {
        let status = pod.status.as_ref()?;
        if status.phase.as_deref() != Some("Pending") || pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        Some(Self {
            // A BTreeMap iterates sorted by key.
            labels: pod
                .metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            unschedulable_since: status.conditions.as_deref().and_then(unschedulable_since),
        })
    }
}

/// What an autoscaler scales.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Target {
    /// Kind of the target.
    #[serde(default)]
    pub kind: String,
    /// Name of the target.
    #[serde(default)]
    pub name: String,
}

/// A `HorizontalPodAutoscaler`, decoded with only its target.
#[derive(Debug, Clone, Deserialize)]
pub struct HpaLite {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The spec, if any.
    #[serde(default, deserialize_with = "lenient")]
    pub spec: Option<HpaLiteSpec>,
}

/// An HPA's spec, reduced to its target.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HpaLiteSpec {
    /// What it scales.
    pub scale_target_ref: Target,
}

lite_resource!(
    HpaLite,
    "autoscaling",
    "v2",
    "HorizontalPodAutoscaler",
    "horizontalpodautoscalers",
    NamespaceResourceScope
);

/// A KEDA `ScaledObject`, decoded with only its target.
#[derive(Debug, Clone, Deserialize)]
pub struct ScaledObjectLite {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The spec, if any.
    #[serde(default, deserialize_with = "lenient")]
    pub spec: Option<ScaledObjectLiteSpec>,
}

/// A ScaledObject's spec, reduced to its target.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaledObjectLiteSpec {
    /// What it scales; the kind defaults to `Deployment`.
    #[serde(default)]
    pub scale_target_ref: Option<Target>,
}

lite_resource!(
    ScaledObjectLite,
    "keda.sh",
    "v1alpha1",
    "ScaledObject",
    "scaledobjects",
    NamespaceResourceScope
);

impl HpaLite {
    /// What it scales; `None` without a spec.
    pub fn target(&self) -> Option<Target> {
        self.spec.as_ref().map(|s| s.scale_target_ref.clone())
    }
}

impl ScaledObjectLite {
    /// What it scales (KEDA's default kind is `Deployment`).
    pub fn target(&self) -> Target {
        let mut target = self
            .spec
            .as_ref()
            .and_then(|s| s.scale_target_ref.clone())
            .unwrap_or_default();
        if target.kind.is_empty() {
            target.kind = "Deployment".into();
        }
        target
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode<T: DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_workload_is_reduced_to_what_the_report_says() {
        let deployment: WorkloadLite = decode(json!({
            "metadata": {"name": "web", "annotations": {"big": "x".repeat(1000)}},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                    {"name": "a", "image": "i", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "c"},
                    {"name": "d", "resources": {"requests": {"cpu": "not-a-quantity"}}}
                ]}}},
            "status": {"readyReplicas": 2, "availableReplicas": 1, "conditions": []}
        }));
        let facts = WorkloadFacts::of(&deployment);
        assert_eq!(
            (
                facts.spec_replicas,
                facts.ready_replicas,
                facts.available_replicas
            ),
            (3, 2, 1)
        );
        assert_eq!(
            (facts.pod_cpu_millis, facts.pod_memory_bytes),
            (1250, 128 << 20)
        );
        let app = |v: &str| vec![("app".to_owned(), v.to_owned())];
        let selector = facts.selector.unwrap();
        assert!(selector.matches(&app("web")) && !selector.matches(&app("api")));

        // A custom resource with odd fields still decodes; what is missing counts as 0.
        let odd: WorkloadLite = decode(json!({
            "metadata": {"name": "x"},
            "spec": {"replicas": "three", "selector": "app=x", "template": 7}
        }));
        assert_eq!(WorkloadFacts::of(&odd), WorkloadFacts::default());
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let selector: LabelSelector = decode(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["x"]},
                {"key": "team", "operator": "Exists"}
            ]
        }));
        let selector = Selector::of(&selector).unwrap();
        let labels = |pairs: &[(&str, &str)]| {
            let mut v: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            v.sort();
            v
        };
        let base = [("app", "web"), ("tier", "a"), ("team", "t")];
        assert!(selector.matches(&labels(&base)));
        assert!(selector.matches(&labels(&[("zone", "y"), base[0], base[1], base[2]])));
        for bad in [
            vec![("app", "api"), ("tier", "a"), ("team", "t")],
            vec![("app", "web"), ("tier", "c"), ("team", "t")],
            vec![("app", "web"), ("tier", "a")],
            vec![
                ("app", "web"),
                ("tier", "a"),
                ("team", "t"),
                ("canary", "1"),
            ],
            vec![("app", "web"), ("tier", "a"), ("team", "t"), ("zone", "x")],
        ] {
            assert!(!selector.matches(&labels(&bad)), "{bad:?}");
        }
        assert_eq!(Selector::of(&LabelSelector::default()), None);
        let unknown: LabelSelector =
            decode(json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}));
        assert_eq!(Selector::of(&unknown), None);
    }

    #[test]
    fn only_live_pending_pods_are_kept_with_their_unschedulable_time() {
        let pod = |phase: &str, deleting: bool, unschedulable: Option<&str>| -> PendingPodLite {
            let conditions: Vec<_> = unschedulable
                .map(|t| json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": t}))
                .into_iter()
                .collect();
            let mut metadata = json!({"name": "p", "labels": {"b": "2", "a": "1"}});
            if deleting {
                metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            decode(
                json!({"metadata": metadata, "status": {"phase": phase, "conditions": conditions}}),
            )
        };
        let kept = PendingPod::of(&pod("Pending", false, Some("2026-01-01T00:00:05Z"))).unwrap();
        assert_eq!(
            kept.labels,
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert_eq!(kept.unschedulable_since, Some(1_767_225_605_000));
        assert_eq!(
            PendingPod::of(&pod("Pending", false, None))
                .unwrap()
                .unschedulable_since,
            None
        );
        assert_eq!(PendingPod::of(&pod("Running", false, None)), None);
        assert_eq!(PendingPod::of(&pod("Pending", true, None)), None);
    }

    #[test]
    fn autoscaler_targets() {
        let hpa: HpaLite = decode(json!({"metadata": {"name": "h"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 3}}));
        assert_eq!(
            hpa.target(),
            Some(Target {
                kind: "Deployment".into(),
                name: "web".into()
            })
        );
        let so: ScaledObjectLite =
            decode(json!({"metadata": {"name": "s"}, "spec": {"scaleTargetRef": {"name": "api"}}}));
        assert_eq!(
            so.target(),
            Target {
                kind: "Deployment".into(),
                name: "api".into()
            }
        );
        let bare: ScaledObjectLite = decode(json!({"metadata": {"name": "s"}, "spec": 1}));
        assert_eq!(bare.target().name, "");
    }
}

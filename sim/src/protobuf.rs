//! Decoding of Kubernetes protobuf request bodies (`k8s\0` + `runtime.Unknown`), which
//! kubectl and other typed Go clients send for built-in kinds (`kubectl create …`, `run`,
//! `expose`, `autoscale`; Go controllers' Leases and Events). Every built-in kind but
//! CustomResourceDefinition has a schema; the field numbers are those of k8s.io/api's
//! `generated.proto`, and each schema lists the fields typed clients commonly set (others
//! are skipped). Kinds without a schema get `415 UnsupportedMediaType` naming the kind,
//! as kedge-sim accepts them as JSON.

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

const MAGIC: &[u8] = b"k8s\0";

#[derive(Debug, Clone, Copy)]
enum F {
    Str(&'static str),
    /// `bytes`, rendered base64 like the JSON form.
    Bytes(&'static str),
    Bool(&'static str),
    /// int32/int64 as varint.
    Int(&'static str),
    /// `map<string, Quantity>` (Quantity is a message with the string in field 1).
    MapQuantity(&'static str),
    /// One `Quantity`.
    Quantity(&'static str),
    /// `Time` (`1: seconds, 2: nanos`; empty when zero), rendered RFC 3339.
    Time(&'static str),
    /// `MicroTime`, rendered RFC 3339 with microseconds.
    MicroTime(&'static str),
    /// `IntOrString` (`1: type, 2: intVal, 3: strVal`), rendered as a number or a string.
    IntOrStr(&'static str),
    MapStr(&'static str),
    MapBytes(&'static str),
    RepStr(&'static str),
    Msg(&'static str, &'static [(u32, F)]),
    RepMsg(&'static str, &'static [(u32, F)]),
}

const OWNER_REF: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (3, F::Str("name")),
    (4, F::Str("uid")),
    (5, F::Str("apiVersion")),
    (6, F::Bool("controller")),
    (7, F::Bool("blockOwnerDeletion")),
];

const OBJECT_META: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("generateName")),
    (3, F::Str("namespace")),
    (5, F::Str("uid")),
    (6, F::Str("resourceVersion")),
    (11, F::MapStr("labels")),
    (12, F::MapStr("annotations")),
    (13, F::RepMsg("ownerReferences", OWNER_REF)),
    (14, F::RepStr("finalizers")),
];

const SECRET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapBytes("data")),
    (3, F::Str("type")),
    (4, F::MapStr("stringData")),
    (5, F::Bool("immutable")),
];

const CONFIG_MAP: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapStr("data")),
    (3, F::MapBytes("binaryData")),
    (4, F::Bool("immutable")),
];

const NAMESPACE_SPEC: &[(u32, F)] = &[(1, F::RepStr("finalizers"))];

const NAMESPACE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", NAMESPACE_SPEC)),
];

const SERVICE_ACCOUNT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (4, F::Bool("automountServiceAccountToken")),
];

const LABEL_SELECTOR_REQ: &[(u32, F)] = &[
    (1, F::Str("key")),
    (2, F::Str("operator")),
    (3, F::RepStr("values")),
];

const LABEL_SELECTOR: &[(u32, F)] = &[
    (1, F::MapStr("matchLabels")),
    (2, F::RepMsg("matchExpressions", LABEL_SELECTOR_REQ)),
];

const CONTAINER_PORT: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Int("hostPort")),
    (3, F::Int("containerPort")),
    (4, F::Str("protocol")),
];

const KEY_SELECTOR: &[(u32, F)] = &[
    (1, F::Msg("", LOCAL_OBJECT_REF)),
    (2, F::Str("key")),
    (3, F::Bool("optional")),
];

const LOCAL_OBJECT_REF: &[(u32, F)] = &[(1, F::Str("name"))];

const FIELD_SELECTOR: &[(u32, F)] = &[(1, F::Str("apiVersion")), (2, F::Str("fieldPath"))];

const ENV_VAR_SOURCE: &[(u32, F)] = &[
    (1, F::Msg("fieldRef", FIELD_SELECTOR)),
    (3, F::Msg("configMapKeyRef", KEY_SELECTOR)),
    (4, F::Msg("secretKeyRef", KEY_SELECTOR)),
];

const ENV_VAR: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("value")),
    (3, F::Msg("valueFrom", ENV_VAR_SOURCE)),
];

const ENV_FROM_REF: &[(u32, F)] = &[(1, F::Msg("", LOCAL_OBJECT_REF)), (2, F::Bool("optional"))];

const ENV_FROM: &[(u32, F)] = &[
    (1, F::Str("prefix")),
    (2, F::Msg("configMapRef", ENV_FROM_REF)),
    (3, F::Msg("secretRef", ENV_FROM_REF)),
];

const RESOURCES: &[(u32, F)] = &[
    (1, F::MapQuantity("limits")),
    (2, F::MapQuantity("requests")),
];

const CONTAINER: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("image")),
    (3, F::RepStr("command")),
    (4, F::RepStr("args")),
    (5, F::Str("workingDir")),
    (6, F::RepMsg("ports", CONTAINER_PORT)),
    (7, F::RepMsg("env", ENV_VAR)),
    (8, F::Msg("resources", RESOURCES)),
    (13, F::Str("terminationMessagePath")),
    (14, F::Str("imagePullPolicy")),
    (16, F::Bool("stdin")),
    (17, F::Bool("stdinOnce")),
    (18, F::Bool("tty")),
    (19, F::RepMsg("envFrom", ENV_FROM)),
    (20, F::Str("terminationMessagePolicy")),
];

const POD_SPEC: &[(u32, F)] = &[
    (2, F::RepMsg("containers", CONTAINER)),
    (3, F::Str("restartPolicy")),
    (4, F::Int("terminationGracePeriodSeconds")),
    (5, F::Int("activeDeadlineSeconds")),
    (6, F::Str("dnsPolicy")),
    (7, F::MapStr("nodeSelector")),
    (8, F::Str("serviceAccountName")),
    (10, F::Str("nodeName")),
    (15, F::RepMsg("imagePullSecrets", LOCAL_OBJECT_REF)),
    (16, F::Str("hostname")),
    (17, F::Str("subdomain")),
    (19, F::Str("schedulerName")),
    (20, F::RepMsg("initContainers", CONTAINER)),
    (21, F::Bool("automountServiceAccountToken")),
    (24, F::Str("priorityClassName")),
];

const POD: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", POD_SPEC)),
];

const POD_TEMPLATE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", POD_SPEC)),
];

const ROLLING_UPDATE: &[(u32, F)] = &[
    (1, F::IntOrStr("maxUnavailable")),
    (2, F::IntOrStr("maxSurge")),
];

const DEPLOYMENT_STRATEGY: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Msg("rollingUpdate", ROLLING_UPDATE)),
];

const DEPLOYMENT_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (4, F::Msg("strategy", DEPLOYMENT_STRATEGY)),
    (5, F::Int("minReadySeconds")),
    (6, F::Int("revisionHistoryLimit")),
    (7, F::Bool("paused")),
    (9, F::Int("progressDeadlineSeconds")),
];

const DEPLOYMENT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", DEPLOYMENT_SPEC)),
];

const JOB_SPEC: &[(u32, F)] = &[
    (1, F::Int("parallelism")),
    (2, F::Int("completions")),
    (3, F::Int("activeDeadlineSeconds")),
    (4, F::Msg("selector", LABEL_SELECTOR)),
    (5, F::Bool("manualSelector")),
    (6, F::Msg("template", POD_TEMPLATE)),
    (7, F::Int("backoffLimit")),
    (8, F::Int("ttlSecondsAfterFinished")),
    (9, F::Str("completionMode")),
    (10, F::Bool("suspend")),
];

const JOB: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", JOB_SPEC)),
];

const STATEFUL_SET_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (5, F::Str("serviceName")),
    (6, F::Str("podManagementPolicy")),
    (8, F::Int("revisionHistoryLimit")),
    (9, F::Int("minReadySeconds")),
];

const STATEFUL_SET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", STATEFUL_SET_SPEC)),
];

const REPLICA_SET_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (4, F::Int("minReadySeconds")),
];

const REPLICA_SET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", REPLICA_SET_SPEC)),
];

const JOB_TEMPLATE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", JOB_SPEC)),
];

const CRON_JOB_SPEC: &[(u32, F)] = &[
    (1, F::Str("schedule")),
    (2, F::Int("startingDeadlineSeconds")),
    (3, F::Str("concurrencyPolicy")),
    (4, F::Bool("suspend")),
    (5, F::Msg("jobTemplate", JOB_TEMPLATE)),
    (6, F::Int("successfulJobsHistoryLimit")),
    (7, F::Int("failedJobsHistoryLimit")),
    (8, F::Str("timeZone")),
];

const CRON_JOB: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", CRON_JOB_SPEC)),
];

const SERVICE_PORT: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("protocol")),
    (3, F::Int("port")),
    (4, F::IntOrStr("targetPort")),
    (5, F::Int("nodePort")),
    (6, F::Str("appProtocol")),
];

const SERVICE_SPEC: &[(u32, F)] = &[
    (1, F::RepMsg("ports", SERVICE_PORT)),
    (2, F::MapStr("selector")),
    (3, F::Str("clusterIP")),
    (4, F::Str("type")),
    (5, F::RepStr("externalIPs")),
    (7, F::Str("sessionAffinity")),
    (8, F::Str("loadBalancerIP")),
    (10, F::Str("externalName")),
    (11, F::Str("externalTrafficPolicy")),
    (17, F::Str("ipFamilyPolicy")),
    (18, F::RepStr("clusterIPs")),
    (19, F::RepStr("ipFamilies")),
    (22, F::Str("internalTrafficPolicy")),
];

const SERVICE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", SERVICE_SPEC)),
];

const POLICY_RULE: &[(u32, F)] = &[
    (1, F::RepStr("verbs")),
    (2, F::RepStr("apiGroups")),
    (3, F::RepStr("resources")),
    (4, F::RepStr("resourceNames")),
    (5, F::RepStr("nonResourceURLs")),
];

const AGGREGATION_RULE: &[(u32, F)] = &[(1, F::RepMsg("clusterRoleSelectors", LABEL_SELECTOR))];

const ROLE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::RepMsg("rules", POLICY_RULE)),
    (3, F::Msg("aggregationRule", AGGREGATION_RULE)),
];

const SUBJECT: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (2, F::Str("apiGroup")),
    (3, F::Str("name")),
    (4, F::Str("namespace")),
];

const ROLE_REF: &[(u32, F)] = &[
    (1, F::Str("apiGroup")),
    (2, F::Str("kind")),
    (3, F::Str("name")),
];

const ROLE_BINDING: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::RepMsg("subjects", SUBJECT)),
    (3, F::Msg("roleRef", ROLE_REF)),
];

const SCALE_TARGET: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (2, F::Str("name")),
    (3, F::Str("apiVersion")),
];

const HPA_V1_SPEC: &[(u32, F)] = &[
    (1, F::Msg("scaleTargetRef", SCALE_TARGET)),
    (2, F::Int("minReplicas")),
    (3, F::Int("maxReplicas")),
    (4, F::Int("targetCPUUtilizationPercentage")),
];

const HPA_V1: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", HPA_V1_SPEC)),
];

const METRIC_TARGET: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Quantity("value")),
    (3, F::Quantity("averageValue")),
    (4, F::Int("averageUtilization")),
];

const RESOURCE_METRIC: &[(u32, F)] = &[(1, F::Str("name")), (2, F::Msg("target", METRIC_TARGET))];

const CONTAINER_RESOURCE_METRIC: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Msg("target", METRIC_TARGET)),
    (3, F::Str("container")),
];

const METRIC_ID: &[(u32, F)] = &[(1, F::Str("name")), (2, F::Msg("selector", LABEL_SELECTOR))];

const PODS_METRIC: &[(u32, F)] = &[
    (1, F::Msg("metric", METRIC_ID)),
    (2, F::Msg("target", METRIC_TARGET)),
];

const OBJECT_METRIC: &[(u32, F)] = &[
    (1, F::Msg("describedObject", SCALE_TARGET)),
    (2, F::Msg("target", METRIC_TARGET)),
    (3, F::Msg("metric", METRIC_ID)),
];

const METRIC_SPEC: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Msg("object", OBJECT_METRIC)),
    (3, F::Msg("pods", PODS_METRIC)),
    (4, F::Msg("resource", RESOURCE_METRIC)),
    (5, F::Msg("external", PODS_METRIC)),
    (7, F::Msg("containerResource", CONTAINER_RESOURCE_METRIC)),
];

const SCALING_POLICY: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Int("value")),
    (3, F::Int("periodSeconds")),
];

const SCALING_RULES: &[(u32, F)] = &[
    (1, F::Str("selectPolicy")),
    (2, F::RepMsg("policies", SCALING_POLICY)),
    (3, F::Int("stabilizationWindowSeconds")),
    (4, F::Quantity("tolerance")),
];

const HPA_BEHAVIOR: &[(u32, F)] = &[
    (1, F::Msg("scaleUp", SCALING_RULES)),
    (2, F::Msg("scaleDown", SCALING_RULES)),
];

const HPA_V2_SPEC: &[(u32, F)] = &[
    (1, F::Msg("scaleTargetRef", SCALE_TARGET)),
    (2, F::Int("minReplicas")),
    (3, F::Int("maxReplicas")),
    (4, F::RepMsg("metrics", METRIC_SPEC)),
    (5, F::Msg("behavior", HPA_BEHAVIOR)),
];

const HPA_V2: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", HPA_V2_SPEC)),
];

const LEASE_SPEC: &[(u32, F)] = &[
    (1, F::Str("holderIdentity")),
    (2, F::Int("leaseDurationSeconds")),
    (3, F::MicroTime("acquireTime")),
    (4, F::MicroTime("renewTime")),
    (5, F::Int("leaseTransitions")),
    (6, F::Str("strategy")),
    (7, F::Str("preferredHolder")),
];

const LEASE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", LEASE_SPEC)),
];

const TAINT: &[(u32, F)] = &[
    (1, F::Str("key")),
    (2, F::Str("value")),
    (3, F::Str("effect")),
    (4, F::Time("timeAdded")),
];

const NODE_SPEC: &[(u32, F)] = &[
    (1, F::Str("podCIDR")),
    (3, F::Str("providerID")),
    (4, F::Bool("unschedulable")),
    (5, F::RepMsg("taints", TAINT)),
    (7, F::RepStr("podCIDRs")),
];

const NODE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", NODE_SPEC)),
];

const OBJECT_REF: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (2, F::Str("namespace")),
    (3, F::Str("name")),
    (4, F::Str("uid")),
    (5, F::Str("apiVersion")),
    (6, F::Str("resourceVersion")),
    (7, F::Str("fieldPath")),
];

const EVENT_SOURCE: &[(u32, F)] = &[(1, F::Str("component")), (2, F::Str("host"))];

const EVENT_SERIES: &[(u32, F)] = &[(1, F::Int("count")), (2, F::MicroTime("lastObservedTime"))];

const CORE_EVENT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("involvedObject", OBJECT_REF)),
    (3, F::Str("reason")),
    (4, F::Str("message")),
    (5, F::Msg("source", EVENT_SOURCE)),
    (6, F::Time("firstTimestamp")),
    (7, F::Time("lastTimestamp")),
    (8, F::Int("count")),
    (9, F::Str("type")),
    (10, F::MicroTime("eventTime")),
    (11, F::Msg("series", EVENT_SERIES)),
    (12, F::Str("action")),
    (13, F::Msg("related", OBJECT_REF)),
    (14, F::Str("reportingComponent")),
    (15, F::Str("reportingInstance")),
];

const EVENT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MicroTime("eventTime")),
    (3, F::Msg("series", EVENT_SERIES)),
    (4, F::Str("reportingController")),
    (5, F::Str("reportingInstance")),
    (6, F::Str("action")),
    (7, F::Str("reason")),
    (8, F::Msg("regarding", OBJECT_REF)),
    (9, F::Msg("related", OBJECT_REF)),
    (10, F::Str("note")),
    (11, F::Str("type")),
    (12, F::Msg("deprecatedSource", EVENT_SOURCE)),
    (13, F::Time("deprecatedFirstTimestamp")),
    (14, F::Time("deprecatedLastTimestamp")),
    (15, F::Int("deprecatedCount")),
];

/// Non-pointer numeric and bool fields whose zero value Go omits from JSON
/// (pointer fields are only encoded when set, so their zero is meaningful).
const OMIT_ZERO: &[&str] = &[
    "minReadySeconds",
    "hostPort",
    "paused",
    "stdin",
    "stdinOnce",
    "tty",
    "nodePort",
    "optional",
];

const PRECONDITIONS: &[(u32, F)] = &[(1, F::Str("uid")), (2, F::Str("resourceVersion"))];

/// The body of a DELETE from a typed client (Helm's release storage sends it as protobuf).
const DELETE_OPTIONS: &[(u32, F)] = &[
    (1, F::Int("gracePeriodSeconds")),
    (2, F::Msg("preconditions", PRECONDITIONS)),
    (3, F::Bool("orphanDependents")),
    (4, F::Str("propagationPolicy")),
    (5, F::RepStr("dryRun")),
];

/// A message's fields by field number.
type Schema = &'static [(u32, F)];

/// The kinds decoded from protobuf, by `apiVersion` and kind.
const KINDS: &[(&str, &str, Schema)] = &[
    ("v1", "Secret", SECRET),
    ("v1", "ConfigMap", CONFIG_MAP),
    ("v1", "Namespace", NAMESPACE),
    ("v1", "ServiceAccount", SERVICE_ACCOUNT),
    ("v1", "Pod", POD),
    ("v1", "Service", SERVICE),
    ("v1", "Node", NODE),
    ("v1", "Event", CORE_EVENT),
    ("events.k8s.io/v1", "Event", EVENT),
    ("coordination.k8s.io/v1", "Lease", LEASE),
    ("apps/v1", "Deployment", DEPLOYMENT),
    ("apps/v1", "StatefulSet", STATEFUL_SET),
    ("apps/v1", "ReplicaSet", REPLICA_SET),
    ("batch/v1", "Job", JOB),
    ("batch/v1", "CronJob", CRON_JOB),
    ("autoscaling/v1", "HorizontalPodAutoscaler", HPA_V1),
    ("autoscaling/v2", "HorizontalPodAutoscaler", HPA_V2),
    ("rbac.authorization.k8s.io/v1", "Role", ROLE),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", ROLE),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", ROLE_BINDING),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        ROLE_BINDING,
    ),
];

const TYPE_META: &[(u32, F)] = &[(1, F::Str("apiVersion")), (2, F::Str("kind"))];

const UNKNOWN: &[(u32, F)] = &[(1, F::Msg("typeMeta", TYPE_META)), (2, F::Bytes("raw"))];

/// Decodes a protobuf body (`k8s\0` + `runtime.Unknown`) into the JSON object.
pub fn decode(body: &[u8]) -> Result<Value> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| Error::BadRequest("protobuf body without the k8s magic prefix".into()))?;
    let mut raw = Vec::new();
    let envelope = message(rest, UNKNOWN, Some(&mut raw))?;
    let api_version = envelope
        .get("typeMeta")
        .and_then(|t| t.get("apiVersion"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = envelope
        .get("typeMeta")
        .and_then(|t| t.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let schema = if kind == "DeleteOptions" {
        DELETE_OPTIONS
    } else {
        KINDS
            .iter()
            .find(|(v, k, _)| *v == api_version && *k == kind)
            .map(|(_, _, schema)| *schema)
            .ok_or_else(|| unsupported(&api_version, &kind))?
    };
    let mut obj = message(&raw, schema, None)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

fn unsupported(api_version: &str, kind: &str) -> Error {
    let known: Vec<&str> = KINDS.iter().map(|(_, k, _)| *k).collect();
    Error::UnsupportedMediaType(format!(
        "kedge-sim cannot decode a protobuf {kind} ({api_version}); it accepts {kind} as JSON (Content-Type: application/json). Protobuf is decoded for {} and DeleteOptions",
        known.join(", ")
    ))
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

fn truncated() -> Error {
    Error::BadRequest("truncated protobuf body".into())
}

impl Reader<'_> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.pos).ok_or_else(truncated)?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::BadRequest("protobuf varint too long".into()))
    }

    fn bytes(&mut self) -> Result<&[u8]> {
        let len = usize::try_from(self.varint()?).map_err(|_| truncated())?;
        let end = self.pos.checked_add(len).ok_or_else(truncated)?;
        let s = self.b.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn skip(&mut self, wire: u64) -> Result<()> {
        match wire {
            0 => {
                self.varint()?;
            }
            1 => self.pos += 8,
            2 => {
                self.bytes()?;
            }
            5 => self.pos += 4,
            w => {
                return Err(Error::BadRequest(format!(
                    "unsupported protobuf wire type {w}"
                )));
            }
        }
        if self.pos > self.b.len() {
            return Err(truncated());
        }
        Ok(())
    }
}

fn utf8(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec())
        .map_err(|_| Error::BadRequest("invalid UTF-8 in protobuf string".into()))
}

/// Decodes one map entry (`1: key, 2: value`).
fn entry(b: &[u8]) -> Result<(String, Vec<u8>)> {
    let mut r = Reader { b, pos: 0 };
    let (mut k, mut v) = (String::new(), Vec::new());
    while r.pos < b.len() {
        let tag = r.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => k = utf8(r.bytes()?)?,
            (2, 2) => v = r.bytes()?.to_vec(),
            (_, w) => r.skip(w)?,
        }
    }
    Ok((k, v))
}

fn message(b: &[u8], schema: &[(u32, F)], mut raw_out: Option<&mut Vec<u8>>) -> Result<Value> {
    let mut out = Map::new();
    let mut r = Reader { b, pos: 0 };
    while r.pos < b.len() {
        let tag = r.varint()?;
        let (field, wire) = ((tag >> 3) as u32, tag & 7);
        let Some((_, f)) = schema.iter().find(|(n, _)| *n == field) else {
            r.skip(wire)?;
            continue;
        };
        let want_wire = match f {
            F::Bool(_) | F::Int(_) => 0,
            _ => 2,
        };
        if wire != want_wire {
            return Err(Error::BadRequest(format!(
                "protobuf field {field} has wire type {wire}"
            )));
        }
        match *f {
            // Go omits empty strings (`omitempty`); gogo still encodes them.
            F::Str(n) => {
                let v = utf8(r.bytes()?)?;
                if !v.is_empty() {
                    out.insert(n.into(), json!(v));
                }
            }
            F::Bytes(n) => {
                let v = r.bytes()?;
                if n == "raw"
                    && let Some(o) = raw_out.as_deref_mut()
                {
                    *o = v.to_vec();
                    continue;
                }
                out.insert(n.into(), json!(base64(v)));
            }
            F::Bool(n) => {
                let v = r.varint()? != 0;
                if v || !OMIT_ZERO.contains(&n) {
                    out.insert(n.into(), json!(v));
                }
            }
            // int32 negatives arrive sign-extended to 64 bits.
            F::Int(n) => {
                let v = r.varint()? as i64;
                if v != 0 || !OMIT_ZERO.contains(&n) {
                    out.insert(n.into(), json!(v));
                }
            }
            F::Quantity(n) => {
                let q = message(r.bytes()?, &[(1, F::Str("string"))], None)?;
                out.insert(n.into(), q.get("string").cloned().unwrap_or(json!("0")));
            }
            F::Time(n) | F::MicroTime(n) => {
                let t = message(
                    r.bytes()?,
                    &[(1, F::Int("seconds")), (2, F::Int("nanos"))],
                    None,
                )?;
                if let Some(secs) = t.get("seconds").and_then(Value::as_i64) {
                    let nanos = t.get("nanos").and_then(Value::as_i64).unwrap_or(0);
                    let micro = matches!(f, F::MicroTime(_));
                    out.insert(n.into(), json!(timestamp(secs, nanos, micro)));
                }
            }
            F::IntOrStr(n) => {
                let v = message(
                    r.bytes()?,
                    &[
                        (1, F::Int("type")),
                        (2, F::Int("intVal")),
                        (3, F::Str("strVal")),
                    ],
                    None,
                )?;
                let v = if v.get("type").and_then(Value::as_i64) == Some(1) {
                    v.get("strVal").cloned().unwrap_or(json!(""))
                } else {
                    v.get("intVal").cloned().unwrap_or(json!(0))
                };
                out.insert(n.into(), v);
            }
            // An embedded struct (`LocalObjectReference`): its fields sit inline in JSON.
            F::Msg("", sub) => {
                if let Value::Object(m) = message(r.bytes()?, sub, None)? {
                    out.extend(m);
                }
            }
            F::MapQuantity(n) => {
                let (k, v) = entry(r.bytes()?)?;
                let q = message(&v, &[(1, F::Str("string"))], None)?;
                let m = out.entry(n).or_insert_with(|| json!({}));
                m[k] = q.get("string").cloned().unwrap_or(json!("0"));
            }
            F::MapStr(n) | F::MapBytes(n) => {
                let (k, v) = entry(r.bytes()?)?;
                let v = if matches!(f, F::MapStr(_)) {
                    json!(utf8(&v)?)
                } else {
                    json!(base64(&v))
                };
                let m = out.entry(n).or_insert_with(|| json!({}));
                m[k] = v;
            }
            F::RepStr(n) => {
                let s = utf8(r.bytes()?)?;
                let a = out.entry(n).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(json!(s));
                }
            }
            F::Msg(n, sub) => {
                out.insert(n.into(), message(r.bytes()?, sub, None)?);
            }
            F::RepMsg(n, sub) => {
                let m = message(r.bytes()?, sub, None)?;
                let a = out.entry(n).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(m);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// RFC 3339 in UTC as Go renders `metav1.Time` (seconds) or `metav1.MicroTime`
/// (microseconds).
fn timestamp(secs: i64, nanos: i64, micro: bool) -> String {
    let s = crate::util::rfc3339(secs.saturating_mul(1000));
    match s.strip_suffix('Z') {
        Some(base) if micro => format!("{base}.{:06}Z", nanos / 1000),
        _ => s,
    }
}

/// Standard base64 with padding.
pub fn base64(b: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        s.push(T[(n >> 18) as usize & 63] as char);
        s.push(T[(n >> 12) as usize & 63] as char);
        s.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u32, wire: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((n << 3) as u8) | wire, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_secret() -> Result<()> {
        let meta = field(1, 2, b"creds");
        let entry = [field(1, 2, b"user"), field(2, 2, b"admin")].concat();
        let secret = [
            field(1, 2, &meta),
            field(2, 2, &entry),
            field(3, 2, b"Opaque"),
        ]
        .concat();
        let tm = [field(1, 2, b"v1"), field(2, 2, b"Secret")].concat();
        let body = [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, &secret)].concat();
        let v = decode(&body)?;
        assert_eq!(v["metadata"]["name"], "creds");
        assert_eq!(v["data"]["user"], "YWRtaW4=");
        assert_eq!(v["type"], "Opaque");
        assert_eq!(v["kind"], "Secret");
        Ok(())
    }

    #[test]
    fn decodes_delete_options() -> Result<()> {
        let pre = field(1, 2, b"uid-1");
        let opts = [field(2, 2, &pre), field(4, 2, b"Foreground")].concat();
        let tm = [
            field(1, 2, b"meta.k8s.io/v1"),
            field(2, 2, b"DeleteOptions"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, &opts)].concat();
        let v = decode(&body)?;
        assert_eq!(v["preconditions"]["uid"], "uid-1");
        assert_eq!(v["propagationPolicy"], "Foreground");
        Ok(())
    }

    /// A varint field (numbers below 16).
    fn varint(n: u32, mut v: u64) -> Vec<u8> {
        let mut out = vec![(n << 3) as u8];
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn envelope(api_version: &[u8], kind: &[u8], object: &[u8]) -> Vec<u8> {
        let tm = [field(1, 2, api_version), field(2, 2, kind)].concat();
        [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, object)].concat()
    }

    #[test]
    fn decodes_a_service_with_int_or_string_ports() -> Result<()> {
        let named = [varint(1, 1), field(3, 2, b"http")].concat();
        let port = [varint(3, 80), field(4, 2, &named)].concat();
        let spec = [field(1, 2, &port), field(4, 2, b"ClusterIP")].concat();
        let svc = [field(1, 2, &field(1, 2, b"web")), field(2, 2, &spec)].concat();
        let v = decode(&envelope(b"v1", b"Service", &svc))?;
        assert_eq!(v["spec"]["ports"][0]["port"], 80);
        assert_eq!(v["spec"]["ports"][0]["targetPort"], "http");
        assert_eq!(v["spec"]["type"], "ClusterIP");
        Ok(())
    }

    #[test]
    fn other_kinds_are_refused_naming_the_kind_and_json() {
        let body = envelope(
            b"apiextensions.k8s.io/v1",
            b"CustomResourceDefinition",
            &field(1, 2, b""),
        );
        let e = decode(&body).expect_err("no protobuf schema for CRDs");
        assert!(matches!(e, Error::UnsupportedMediaType(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("CustomResourceDefinition") && text.contains("as JSON"),
            "{text}"
        );
    }

    #[test]
    fn decodes_a_lease_with_micro_times() -> Result<()> {
        // 2026-01-02T03:04:05Z and 123456789 ns.
        let time = [varint(1, 1_767_323_045), varint(2, 123_456_789)].concat();
        let spec = [field(1, 2, b"hub-0"), field(4, 2, &time), field(3, 2, &[])].concat();
        let lease = [field(1, 2, &field(1, 2, b"kedge-hub")), field(2, 2, &spec)].concat();
        let v = decode(&envelope(b"coordination.k8s.io/v1", b"Lease", &lease))?;
        assert_eq!(v["spec"]["holderIdentity"], "hub-0");
        assert_eq!(v["spec"]["renewTime"], "2026-01-02T03:04:05.123456Z");
        assert!(
            v["spec"].get("acquireTime").is_none(),
            "a zero time is left out: {v}"
        );
        Ok(())
    }

    #[test]
    fn rejects_garbage() {
        assert!(decode(b"nope").is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
        assert!(decode(b"k8s\0\x0a\x02\x0a\x05").is_err());
    }

    #[test]
    fn base64_matches_reference() {
        assert_eq!(base64(b"admin"), "YWRtaW4=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
    }
}

//! The protobuf schemas: each message's fields by number, as k8s.io/api's
//! `generated.proto` numbers them, with their JSON names.

/// How one field is decoded and rendered in JSON.
#[derive(Debug, Clone, Copy)]
pub(super) enum F {
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

pub(super) const OWNER_REF: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (3, F::Str("name")),
    (4, F::Str("uid")),
    (5, F::Str("apiVersion")),
    (6, F::Bool("controller")),
    (7, F::Bool("blockOwnerDeletion")),
];

pub(super) const OBJECT_META: &[(u32, F)] = &[
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

pub(super) const SECRET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapBytes("data")),
    (3, F::Str("type")),
    (4, F::MapStr("stringData")),
    (5, F::Bool("immutable")),
];

pub(super) const CONFIG_MAP: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapStr("data")),
    (3, F::MapBytes("binaryData")),
    (4, F::Bool("immutable")),
];

pub(super) const NAMESPACE_SPEC: &[(u32, F)] = &[(1, F::RepStr("finalizers"))];

pub(super) const NAMESPACE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", NAMESPACE_SPEC)),
];

pub(super) const SERVICE_ACCOUNT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (4, F::Bool("automountServiceAccountToken")),
];

pub(super) const LABEL_SELECTOR_REQ: &[(u32, F)] = &[
    (1, F::Str("key")),
    (2, F::Str("operator")),
    (3, F::RepStr("values")),
];

pub(super) const LABEL_SELECTOR: &[(u32, F)] = &[
    (1, F::MapStr("matchLabels")),
    (2, F::RepMsg("matchExpressions", LABEL_SELECTOR_REQ)),
];

pub(super) const CONTAINER_PORT: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Int("hostPort")),
    (3, F::Int("containerPort")),
    (4, F::Str("protocol")),
];

pub(super) const KEY_SELECTOR: &[(u32, F)] = &[
    (1, F::Msg("", LOCAL_OBJECT_REF)),
    (2, F::Str("key")),
    (3, F::Bool("optional")),
];

pub(super) const LOCAL_OBJECT_REF: &[(u32, F)] = &[(1, F::Str("name"))];

pub(super) const FIELD_SELECTOR: &[(u32, F)] =
    &[(1, F::Str("apiVersion")), (2, F::Str("fieldPath"))];

pub(super) const ENV_VAR_SOURCE: &[(u32, F)] = &[
    (1, F::Msg("fieldRef", FIELD_SELECTOR)),
    (3, F::Msg("configMapKeyRef", KEY_SELECTOR)),
    (4, F::Msg("secretKeyRef", KEY_SELECTOR)),
];

pub(super) const ENV_VAR: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("value")),
    (3, F::Msg("valueFrom", ENV_VAR_SOURCE)),
];

pub(super) const ENV_FROM_REF: &[(u32, F)] =
    &[(1, F::Msg("", LOCAL_OBJECT_REF)), (2, F::Bool("optional"))];

pub(super) const ENV_FROM: &[(u32, F)] = &[
    (1, F::Str("prefix")),
    (2, F::Msg("configMapRef", ENV_FROM_REF)),
    (3, F::Msg("secretRef", ENV_FROM_REF)),
];

pub(super) const RESOURCES: &[(u32, F)] = &[
    (1, F::MapQuantity("limits")),
    (2, F::MapQuantity("requests")),
];

pub(super) const CONTAINER: &[(u32, F)] = &[
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

pub(super) const POD_SPEC: &[(u32, F)] = &[
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

pub(super) const POD: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", POD_SPEC)),
];

pub(super) const POD_TEMPLATE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", POD_SPEC)),
];

pub(super) const ROLLING_UPDATE: &[(u32, F)] = &[
    (1, F::IntOrStr("maxUnavailable")),
    (2, F::IntOrStr("maxSurge")),
];

pub(super) const DEPLOYMENT_STRATEGY: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Msg("rollingUpdate", ROLLING_UPDATE)),
];

pub(super) const DEPLOYMENT_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (4, F::Msg("strategy", DEPLOYMENT_STRATEGY)),
    (5, F::Int("minReadySeconds")),
    (6, F::Int("revisionHistoryLimit")),
    (7, F::Bool("paused")),
    (9, F::Int("progressDeadlineSeconds")),
];

pub(super) const DEPLOYMENT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", DEPLOYMENT_SPEC)),
];

pub(super) const JOB_SPEC: &[(u32, F)] = &[
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

pub(super) const JOB: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", JOB_SPEC)),
];

pub(super) const STATEFUL_SET_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (5, F::Str("serviceName")),
    (6, F::Str("podManagementPolicy")),
    (8, F::Int("revisionHistoryLimit")),
    (9, F::Int("minReadySeconds")),
];

pub(super) const STATEFUL_SET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", STATEFUL_SET_SPEC)),
];

pub(super) const REPLICA_SET_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (4, F::Int("minReadySeconds")),
];

pub(super) const REPLICA_SET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", REPLICA_SET_SPEC)),
];

pub(super) const JOB_TEMPLATE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", JOB_SPEC)),
];

pub(super) const CRON_JOB_SPEC: &[(u32, F)] = &[
    (1, F::Str("schedule")),
    (2, F::Int("startingDeadlineSeconds")),
    (3, F::Str("concurrencyPolicy")),
    (4, F::Bool("suspend")),
    (5, F::Msg("jobTemplate", JOB_TEMPLATE)),
    (6, F::Int("successfulJobsHistoryLimit")),
    (7, F::Int("failedJobsHistoryLimit")),
    (8, F::Str("timeZone")),
];

pub(super) const CRON_JOB: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", CRON_JOB_SPEC)),
];

pub(super) const SERVICE_PORT: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("protocol")),
    (3, F::Int("port")),
    (4, F::IntOrStr("targetPort")),
    (5, F::Int("nodePort")),
    (6, F::Str("appProtocol")),
];

pub(super) const SERVICE_SPEC: &[(u32, F)] = &[
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

pub(super) const SERVICE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", SERVICE_SPEC)),
];

pub(super) const POLICY_RULE: &[(u32, F)] = &[
    (1, F::RepStr("verbs")),
    (2, F::RepStr("apiGroups")),
    (3, F::RepStr("resources")),
    (4, F::RepStr("resourceNames")),
    (5, F::RepStr("nonResourceURLs")),
];

pub(super) const AGGREGATION_RULE: &[(u32, F)] =
    &[(1, F::RepMsg("clusterRoleSelectors", LABEL_SELECTOR))];

pub(super) const ROLE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::RepMsg("rules", POLICY_RULE)),
    (3, F::Msg("aggregationRule", AGGREGATION_RULE)),
];

pub(super) const SUBJECT: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (2, F::Str("apiGroup")),
    (3, F::Str("name")),
    (4, F::Str("namespace")),
];

pub(super) const ROLE_REF: &[(u32, F)] = &[
    (1, F::Str("apiGroup")),
    (2, F::Str("kind")),
    (3, F::Str("name")),
];

pub(super) const ROLE_BINDING: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::RepMsg("subjects", SUBJECT)),
    (3, F::Msg("roleRef", ROLE_REF)),
];

pub(super) const SCALE_TARGET: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (2, F::Str("name")),
    (3, F::Str("apiVersion")),
];

pub(super) const HPA_V1_SPEC: &[(u32, F)] = &[
    (1, F::Msg("scaleTargetRef", SCALE_TARGET)),
    (2, F::Int("minReplicas")),
    (3, F::Int("maxReplicas")),
    (4, F::Int("targetCPUUtilizationPercentage")),
];

pub(super) const HPA_V1: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", HPA_V1_SPEC)),
];

pub(super) const METRIC_TARGET: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Quantity("value")),
    (3, F::Quantity("averageValue")),
    (4, F::Int("averageUtilization")),
];

pub(super) const RESOURCE_METRIC: &[(u32, F)] =
    &[(1, F::Str("name")), (2, F::Msg("target", METRIC_TARGET))];

pub(super) const CONTAINER_RESOURCE_METRIC: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Msg("target", METRIC_TARGET)),
    (3, F::Str("container")),
];

pub(super) const METRIC_ID: &[(u32, F)] =
    &[(1, F::Str("name")), (2, F::Msg("selector", LABEL_SELECTOR))];

pub(super) const PODS_METRIC: &[(u32, F)] = &[
    (1, F::Msg("metric", METRIC_ID)),
    (2, F::Msg("target", METRIC_TARGET)),
];

pub(super) const OBJECT_METRIC: &[(u32, F)] = &[
    (1, F::Msg("describedObject", SCALE_TARGET)),
    (2, F::Msg("target", METRIC_TARGET)),
    (3, F::Msg("metric", METRIC_ID)),
];

pub(super) const METRIC_SPEC: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Msg("object", OBJECT_METRIC)),
    (3, F::Msg("pods", PODS_METRIC)),
    (4, F::Msg("resource", RESOURCE_METRIC)),
    (5, F::Msg("external", PODS_METRIC)),
    (7, F::Msg("containerResource", CONTAINER_RESOURCE_METRIC)),
];

pub(super) const SCALING_POLICY: &[(u32, F)] = &[
    (1, F::Str("type")),
    (2, F::Int("value")),
    (3, F::Int("periodSeconds")),
];

pub(super) const SCALING_RULES: &[(u32, F)] = &[
    (1, F::Str("selectPolicy")),
    (2, F::RepMsg("policies", SCALING_POLICY)),
    (3, F::Int("stabilizationWindowSeconds")),
    (4, F::Quantity("tolerance")),
];

pub(super) const HPA_BEHAVIOR: &[(u32, F)] = &[
    (1, F::Msg("scaleUp", SCALING_RULES)),
    (2, F::Msg("scaleDown", SCALING_RULES)),
];

pub(super) const HPA_V2_SPEC: &[(u32, F)] = &[
    (1, F::Msg("scaleTargetRef", SCALE_TARGET)),
    (2, F::Int("minReplicas")),
    (3, F::Int("maxReplicas")),
    (4, F::RepMsg("metrics", METRIC_SPEC)),
    (5, F::Msg("behavior", HPA_BEHAVIOR)),
];

pub(super) const HPA_V2: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", HPA_V2_SPEC)),
];

pub(super) const LEASE_SPEC: &[(u32, F)] = &[
    (1, F::Str("holderIdentity")),
    (2, F::Int("leaseDurationSeconds")),
    (3, F::MicroTime("acquireTime")),
    (4, F::MicroTime("renewTime")),
    (5, F::Int("leaseTransitions")),
    (6, F::Str("strategy")),
    (7, F::Str("preferredHolder")),
];

pub(super) const LEASE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", LEASE_SPEC)),
];

pub(super) const TAINT: &[(u32, F)] = &[
    (1, F::Str("key")),
    (2, F::Str("value")),
    (3, F::Str("effect")),
    (4, F::Time("timeAdded")),
];

pub(super) const NODE_SPEC: &[(u32, F)] = &[
    (1, F::Str("podCIDR")),
    (3, F::Str("providerID")),
    (4, F::Bool("unschedulable")),
    (5, F::RepMsg("taints", TAINT)),
    (7, F::RepStr("podCIDRs")),
];

pub(super) const NODE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", NODE_SPEC)),
];

pub(super) const OBJECT_REF: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (2, F::Str("namespace")),
    (3, F::Str("name")),
    (4, F::Str("uid")),
    (5, F::Str("apiVersion")),
    (6, F::Str("resourceVersion")),
    (7, F::Str("fieldPath")),
];

pub(super) const EVENT_SOURCE: &[(u32, F)] = &[(1, F::Str("component")), (2, F::Str("host"))];

pub(super) const EVENT_SERIES: &[(u32, F)] =
    &[(1, F::Int("count")), (2, F::MicroTime("lastObservedTime"))];

pub(super) const CORE_EVENT: &[(u32, F)] = &[
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

pub(super) const EVENT: &[(u32, F)] = &[
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
pub(super) const OMIT_ZERO: &[&str] = &[
    "minReadySeconds",
    "hostPort",
    "paused",
    "stdin",
    "stdinOnce",
    "tty",
    "nodePort",
    "optional",
];

pub(super) const PRECONDITIONS: &[(u32, F)] = &[(1, F::Str("uid")), (2, F::Str("resourceVersion"))];

/// The body of a DELETE from a typed client (Helm's release storage sends it as protobuf).
pub(super) const DELETE_OPTIONS: &[(u32, F)] = &[
    (1, F::Int("gracePeriodSeconds")),
    (2, F::Msg("preconditions", PRECONDITIONS)),
    (3, F::Bool("orphanDependents")),
    (4, F::Str("propagationPolicy")),
    (5, F::RepStr("dryRun")),
];

/// A message's fields by field number.
pub(super) type Schema = &'static [(u32, F)];

/// The kinds decoded from protobuf, by `apiVersion` and kind.
pub(super) const KINDS: &[(&str, &str, Schema)] = &[
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

pub(super) const TYPE_META: &[(u32, F)] = &[(1, F::Str("apiVersion")), (2, F::Str("kind"))];

pub(super) const UNKNOWN: &[(u32, F)] = &[(1, F::Msg("typeMeta", TYPE_META)), (2, F::Bytes("raw"))];

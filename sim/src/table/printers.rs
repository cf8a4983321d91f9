//! The built-in printers: for each resource, the columns `kubectl get` shows, as data
//! ([`PRINTERS`]: name, type, format, priority, description and where each cell comes
//! from), and the named formatters of the cells computed from several fields. Columns and
//! cells follow `pkg/printers/internalversion/printers.go` of Kubernetes 1.33.

use std::time::SystemTime;

use serde_json::{Map, Value, json};

use super::{
    Cells, age, age_cell, arr, format_rfc3339, human_duration, i, name, parse_rfc3339, s,
    seconds_between,
};

const NAME_DOC: &str = "Name must be unique within a namespace. More info: \
                        https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this \
                       object was created.";

fn none_if_empty(v: &str) -> Value {
    Value::String(if v.is_empty() {
        "<none>".into()
    } else {
        v.into()
    })
}

/// One column of a built-in resource's Table: its `columnDefinitions` entry and where its
/// cells come from.
#[derive(Debug)]
pub(super) struct Column {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    priority: i64,
    description: &'static str,
    cell: Cell,
}

/// How a built-in column's cell is read from an object. Paths are JSON pointers; an absent
/// field reads as Go's zero value, as it does for the Kubernetes printers.
#[derive(Debug, Clone, Copy)]
enum Cell {
    /// `metadata.name`.
    Name,
    /// The age of `metadata.creationTimestamp` (`translateTimestampSince`).
    Age,
    /// A string, `""` when absent.
    Str(&'static str),
    /// A string, or the given text when it is absent or empty.
    StrOr(&'static str, &'static str),
    /// An integer, or the given default when absent.
    Int(&'static str, i64),
    /// The number of entries of an array.
    Items(&'static str),
    /// The number of keys of maps, summed.
    Keys(&'static [&'static str]),
    /// A cell the printer computes from several fields.
    Fn(fn(&Value, SystemTime) -> Value),
}

impl Column {
    /// Its entry in the Table's `columnDefinitions`.
    pub(super) fn definition(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.ty,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

impl Cell {
    /// This cell of object `o`, ages counted up to `now`.
    fn read(self, o: &Value, now: SystemTime) -> Value {
        match self {
            Cell::Name => name(o),
            Cell::Age => age_cell(o, now),
            Cell::Str(p) => json!(s(o, p)),
            Cell::StrOr(p, empty) => match s(o, p) {
                "" => json!(empty),
                v => json!(v),
            },
            Cell::Int(p, absent) => json!(o.pointer(p).and_then(Value::as_i64).unwrap_or(absent)),
            Cell::Items(p) => json!(arr(o, p).len()),
            Cell::Keys(ps) => json!(ps.iter().map(|p| map_len(o, p)).sum::<usize>()),
            Cell::Fn(f) => f(o, now),
        }
    }
}

/// A column without a format.
const fn col(
    name: &'static str,
    ty: &'static str,
    priority: i64,
    description: &'static str,
    cell: Cell,
) -> Column {
    Column {
        name,
        ty,
        format: "",
        priority,
        description,
        cell,
    }
}

/// The `Name` column, first in every printer but `events`, which shows it last (wide).
pub(super) const NAME: Column = Column {
    name: "Name",
    ty: "string",
    format: "name",
    priority: 0,
    description: NAME_DOC,
    cell: Cell::Name,
};
/// The columns several printers share.
const AGE: Column = col("Age", "string", 0, AGE_DOC, Cell::Age);
/// `READY` of Deployments and StatefulSets: ready of desired replicas.
const READY_OF_DESIRED: Column = col(
    "Ready",
    "string",
    0,
    "Number of the pod with ready state",
    Cell::Fn(ready_of_desired),
);

const CONTAINERS: Column = col(
    "Containers",
    "string",
    1,
    "Names of each container in the template.",
    Cell::Fn(template_containers),
);
const IMAGES: Column = col(
    "Images",
    "string",
    1,
    "Images referenced by each container in the template.",
    Cell::Fn(template_images),
);
const SELECTOR: Column = col(
    "Selector",
    "string",
    1,
    "Label selector for pods.",
    Cell::Fn(selector_string),
);

/// `printPod`.
static PODS: &[Column] = &[
    NAME,
    col(
        "Ready",
        "string",
        0,
        "The aggregate readiness state of this pod for accepting traffic.",
        Cell::Fn(pod_ready_of_total),
    ),
    col(
        "Status",
        "string",
        0,
        "The aggregate status of the containers in this pod.",
        Cell::Fn(pod_status),
    ),
    col(
        "Restarts",
        "string",
        0,
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
        Cell::Fn(pod_restarts),
    ),
    AGE,
    col(
        "IP",
        "string",
        1,
        "podIP address allocated to the pod.",
        Cell::StrOr("/status/podIPs/0/ip", "<none>"),
    ),
    col(
        "Node",
        "string",
        1,
        "NodeName indicates in which node this pod is scheduled.",
        Cell::StrOr("/spec/nodeName", "<none>"),
    ),
    col(
        "Nominated Node",
        "string",
        1,
        "nominatedNodeName is set only when this pod preempts other pods on the node.",
        Cell::StrOr("/status/nominatedNodeName", "<none>"),
    ),
    col(
        "Readiness Gates",
        "string",
        1,
        "If specified, all readiness gates will be evaluated for pod readiness.",
        Cell::Fn(pod_readiness_gates),
    ),
];

/// `printDeployment`.
static DEPLOYMENTS: &[Column] = &[
    NAME,
    READY_OF_DESIRED,
    col(
        "Up-to-date",
        "string",
        0,
        "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
        Cell::Int("/status/updatedReplicas", 0),
    ),
    col(
        "Available",
        "string",
        0,
        "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
        Cell::Int("/status/availableReplicas", 0),
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    col(
        "Selector",
        "string",
        1,
        "Label selector for pods.",
        Cell::Fn(deployment_selector),
    ),
];

/// `printStatefulSet`.
static STATEFULSETS: &[Column] = &[NAME, READY_OF_DESIRED, AGE, CONTAINERS, IMAGES];

/// `printReplicaSet`.
static REPLICASETS: &[Column] = &[
    NAME,
    col(
        "Desired",
        "integer",
        0,
        "Number of desired pods.",
        Cell::Int("/spec/replicas", 1),
    ),
    col(
        "Current",
        "integer",
        0,
        "Number of actual pods.",
        Cell::Int("/status/replicas", 0),
    ),
    col(
        "Ready",
        "integer",
        0,
        "Number of ready pods.",
        Cell::Int("/status/readyReplicas", 0),
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

/// `printJob`.
static JOBS: &[Column] = &[
    NAME,
    col(
        "Status",
        "string",
        0,
        "Status of the job.",
        Cell::Fn(job_status),
    ),
    col(
        "Completions",
        "string",
        0,
        "The completion status of the job.",
        Cell::Fn(job_completions),
    ),
    col(
        "Duration",
        "string",
        0,
        "Time required to complete the job.",
        Cell::Fn(job_duration),
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

/// `printNode`.
static NODES: &[Column] = &[
    NAME,
    col(
        "Status",
        "string",
        0,
        "The status of the node",
        Cell::Fn(node_status),
    ),
    col(
        "Roles",
        "string",
        0,
        "The roles of the node",
        Cell::Fn(node_roles),
    ),
    AGE,
    col(
        "Version",
        "string",
        0,
        "Kubelet Version reported by the node.",
        Cell::Str("/status/nodeInfo/kubeletVersion"),
    ),
    col(
        "Internal-IP",
        "string",
        1,
        "List of internal IPs of the node.",
        Cell::Fn(node_internal_ip),
    ),
    col(
        "External-IP",
        "string",
        1,
        "List of external IPs of the node.",
        Cell::Fn(node_external_ip),
    ),
    col(
        "OS-Image",
        "string",
        1,
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
        Cell::StrOr("/status/nodeInfo/osImage", "<unknown>"),
    ),
    col(
        "Kernel-Version",
        "string",
        1,
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
        Cell::StrOr("/status/nodeInfo/kernelVersion", "<unknown>"),
    ),
    col(
        "Container-Runtime",
        "string",
        1,
        "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
        Cell::StrOr("/status/nodeInfo/containerRuntimeVersion", "<unknown>"),
    ),
];

/// `printNamespace`.
static NAMESPACES: &[Column] = &[
    NAME,
    col(
        "Status",
        "string",
        0,
        "The status of the namespace",
        Cell::Str("/status/phase"),
    ),
    AGE,
];

/// `printConfigMap`.
static CONFIGMAPS: &[Column] = &[
    NAME,
    col(
        "Data",
        "integer",
        0,
        "Data contains the configuration data.",
        Cell::Keys(&["/data", "/binaryData"]),
    ),
    AGE,
];

/// `printSecret`.
static SECRETS: &[Column] = &[
    NAME,
    col(
        "Type",
        "string",
        0,
        "The type of the secret",
        Cell::Str("/type"),
    ),
    col(
        "Data",
        "string",
        0,
        "The number of entries in the secret",
        Cell::Keys(&["/data"]),
    ),
    AGE,
];

/// `printService`.
static SERVICES: &[Column] = &[
    NAME,
    col(
        "Type",
        "string",
        0,
        "The type of the service.",
        Cell::Str("/spec/type"),
    ),
    col(
        "Cluster-IP",
        "string",
        0,
        "The IP address of the service.",
        Cell::Fn(service_cluster_ip),
    ),
    col(
        "External-IP",
        "string",
        0,
        "The external IP address of the service.",
        Cell::Fn(service_external_ip),
    ),
    col(
        "Port(s)",
        "string",
        0,
        "The ports that the service exposes.",
        Cell::Fn(service_ports),
    ),
    AGE,
    col(
        "Selector",
        "string",
        1,
        "Route service traffic to pods with label keys and values matching this selector.",
        Cell::Fn(service_selector),
    ),
];

/// `printServiceAccount`.
static SERVICEACCOUNTS: &[Column] = &[
    NAME,
    col(
        "Secrets",
        "string",
        0,
        "Secrets is the list of secrets allowed to be used by pods running using this ServiceAccount.",
        Cell::Items("/secrets"),
    ),
    AGE,
];

/// `printEvent`, for core/v1 Events and events.k8s.io/v1 Events alike.
static EVENTS: &[Column] = &[
    col(
        "Last Seen",
        "string",
        0,
        "Last time the event was observed.",
        Cell::Fn(event_last_seen),
    ),
    col(
        "Type",
        "string",
        0,
        "Type of this event (Normal, Warning), new types could be added in the future.",
        Cell::Str("/type"),
    ),
    col(
        "Reason",
        "string",
        0,
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
        Cell::Str("/reason"),
    ),
    col(
        "Object",
        "string",
        0,
        "The object that this event is about.",
        Cell::Fn(event_object),
    ),
    col(
        "Subobject",
        "string",
        1,
        "The subobject that this event is about.",
        Cell::Fn(event_subobject),
    ),
    col(
        "Source",
        "string",
        1,
        "The component reporting this event. Should be a short machine understandable string.",
        Cell::Fn(event_source),
    ),
    col(
        "Message",
        "string",
        0,
        "A human-readable description of the status of this operation.",
        Cell::Fn(event_message),
    ),
    col(
        "First Seen",
        "string",
        1,
        "The time at which the event was first recorded.",
        Cell::Fn(event_first_seen),
    ),
    col(
        "Count",
        "string",
        1,
        "The number of times this event has occurred.",
        Cell::Fn(event_count),
    ),
    Column {
        priority: 1,
        ..NAME
    },
];

/// `printLease`.
static LEASES: &[Column] = &[
    NAME,
    col(
        "Holder",
        "string",
        0,
        "The holder of the lease",
        Cell::Str("/spec/holderIdentity"),
    ),
    AGE,
];

/// `printRoleBinding` and `printClusterRoleBinding`.
static ROLEBINDINGS: &[Column] = &[
    NAME,
    col(
        "Role",
        "string",
        0,
        "RoleRef references the Role being granted.",
        Cell::Fn(role_ref),
    ),
    AGE,
    col(
        "Users",
        "string",
        1,
        "Users in the roleBinding",
        Cell::Fn(subject_users),
    ),
    col(
        "Groups",
        "string",
        1,
        "Groups in the roleBinding",
        Cell::Fn(subject_groups),
    ),
    col(
        "ServiceAccounts",
        "string",
        1,
        "ServiceAccounts in the roleBinding",
        Cell::Fn(subject_service_accounts),
    ),
];

/// The apiserver's `rest.DefaultTableConvertor`.
static CREATED_AT: &[Column] = &[
    NAME,
    col("Created At", "date", 0, AGE_DOC, Cell::Fn(created_at)),
];

/// Resources without a printer of their own.
static DEFAULT: &[Column] = &[NAME, col("Age", "date", 0, AGE_DOC, Cell::Age)];

/// The built-in printers by resource (plural); a resource not listed gets [`DEFAULT`].
static PRINTERS: &[(&str, &[Column])] = &[
    ("pods", PODS),
    ("deployments", DEPLOYMENTS),
    ("statefulsets", STATEFULSETS),
    ("replicasets", REPLICASETS),
    ("jobs", JOBS),
    ("nodes", NODES),
    ("namespaces", NAMESPACES),
    ("configmaps", CONFIGMAPS),
    ("secrets", SECRETS),
    ("serviceaccounts", SERVICEACCOUNTS),
    ("services", SERVICES),
    ("events", EVENTS),
    ("leases", LEASES),
    ("rolebindings", ROLEBINDINGS),
    ("clusterrolebindings", ROLEBINDINGS),
    ("customresourcedefinitions", CREATED_AT),
    ("roles", CREATED_AT),
    ("clusterroles", CREATED_AT),
];

/// The columns and cells of a built-in resource, from [`PRINTERS`].
pub(super) fn builtin(resource: &str, now: SystemTime) -> (Vec<Value>, Cells) {
    let columns = PRINTERS
        .iter()
        .find(|(r, _)| *r == resource)
        .map_or(DEFAULT, |(_, c)| *c);
    (
        columns.iter().map(Column::definition).collect(),
        Box::new(move |o| columns.iter().map(|c| c.cell.read(o, now)).collect()),
    )
}

/// The containers of the pod template, `field` of each joined by commas.
fn template_containers_field(o: &Value, field: &str) -> Value {
    let values: Vec<&str> = arr(o, "/spec/template/spec/containers")
        .iter()
        .map(|c| s(c, field))
        .collect();
    Value::String(values.join(","))
}

fn template_containers(o: &Value, _now: SystemTime) -> Value {
    template_containers_field(o, "/name")
}

fn template_images(o: &Value, _now: SystemTime) -> Value {
    template_containers_field(o, "/image")
}

/// `metav1.FormatLabelSelector` of `spec.selector`: `<none>` for a missing or empty selector.
fn selector_string(o: &Value, _now: SystemTime) -> Value {
    let Some(sel) = o.pointer("/spec/selector") else {
        return Value::String("<none>".into());
    };
    match crate::selector::LabelSelector::from_label_selector_json(sel) {
        Ok(ls) if ls.is_everything() => Value::String("<none>".into()),
        Ok(ls) => Value::String(ls.to_string()),
        Err(_) => Value::String("<error>".into()),
    }
}

/// What `printDeployment` shows of `spec.selector`: its string, empty if there is none.
fn deployment_selector(o: &Value, _now: SystemTime) -> Value {
    let sel = o.pointer("/spec/selector").unwrap_or(&Value::Null);
    match crate::selector::LabelSelector::from_label_selector_json(sel) {
        Ok(ls) => Value::String(ls.to_string()),
        Err(_) => Value::String("<invalid>".into()),
    }
}

/// READY of Deployments and StatefulSets: ready replicas of `spec.replicas` (default 1).
fn ready_of_desired(o: &Value, _now: SystemTime) -> Value {
    let desired = o
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    json!(format!("{}/{desired}", i(o, "/status/readyReplicas")))
}

/// The apiserver's default convertor's `Created At`.
fn created_at(o: &Value, _now: SystemTime) -> Value {
    let created = parse_rfc3339(s(o, "/metadata/creationTimestamp"))
        .map(format_rfc3339)
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".into());
    json!(created)
}

/// ROLE of a (Cluster)RoleBinding: `Kind/name` of its `roleRef`.
fn role_ref(o: &Value, _now: SystemTime) -> Value {
    json!(format!(
        "{}/{}",
        s(o, "/roleRef/kind"),
        s(o, "/roleRef/name")
    ))
}

/// The subjects of one kind of a (Cluster)RoleBinding, ServiceAccounts as `namespace/name`.
fn subjects(o: &Value, kind: &str) -> Value {
    let v: Vec<String> = arr(o, "/subjects")
        .iter()
        .filter(|sj| s(sj, "/kind") == kind)
        .map(|sj| match kind {
            "ServiceAccount" => {
                format!("{}/{}", s(sj, "/namespace"), s(sj, "/name"))
            }
            _ => s(sj, "/name").to_owned(),
        })
        .collect();
    json!(v.join(", "))
}

fn subject_users(o: &Value, _now: SystemTime) -> Value {
    subjects(o, "User")
}

fn subject_groups(o: &Value, _now: SystemTime) -> Value {
    subjects(o, "Group")
}

fn subject_service_accounts(o: &Value, _now: SystemTime) -> Value {
    subjects(o, "ServiceAccount")
}

fn map_len(o: &Value, pointer: &str) -> usize {
    o.pointer(pointer)
        .and_then(Value::as_object)
        .map_or(0, Map::len)
}

fn terminated_reason(c: &Value, prefix: &str) -> String {
    let t = "/state/terminated";
    if !s(c, &format!("{t}/reason")).is_empty() {
        format!("{prefix}{}", s(c, &format!("{t}/reason")))
    } else if i(c, &format!("{t}/signal")) != 0 {
        format!("{prefix}Signal:{}", i(c, &format!("{t}/signal")))
    } else {
        format!("{prefix}ExitCode:{}", i(c, &format!("{t}/exitCode")))
    }
}

/// What `printPod` derives from a pod's status: READY, STATUS and RESTARTS.
#[derive(Debug)]
struct PodSummary {
    ready: usize,
    total: usize,
    reason: String,
    restarts: i64,
    last_restart: Option<SystemTime>,
}

fn pod_summary(o: &Value) -> PodSummary {
    let init_specs = arr(o, "/spec/initContainers");
    let restartable = |name: &str| {
        init_specs
            .iter()
            .any(|c| s(c, "/name") == name && s(c, "/restartPolicy") == "Always")
    };
    let total = arr(o, "/spec/containers").len()
        + init_specs
            .iter()
            .filter(|c| s(c, "/restartPolicy") == "Always")
            .count();
    let phase = s(o, "/status/phase");
    let mut reason = match s(o, "/status/reason") {
        "" => phase.to_owned(),
        r => r.to_owned(),
    };
    let conditions = arr(o, "/status/conditions");
    if conditions
        .iter()
        .any(|c| s(c, "/type") == "PodScheduled" && s(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }
    let finished = |c: &Value| parse_rfc3339(s(c, "/lastState/terminated/finishedAt"));
    let later = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut restarts: i64 = 0;
    let mut sidecar_restarts: i64 = 0;
    let mut last_restart = None;
    let mut sidecar_last_restart = None;
    let mut ready = 0;
    let mut initializing = false;
    for (idx, c) in arr(o, "/status/initContainerStatuses").iter().enumerate() {
        restarts = restarts.saturating_add(i(c, "/restartCount"));
        last_restart = later(last_restart, finished(c));
        let sidecar = restartable(s(c, "/name"));
        if sidecar {
            sidecar_restarts = sidecar_restarts.saturating_add(i(c, "/restartCount"));
            sidecar_last_restart = later(sidecar_last_restart, finished(c));
        }
        let terminated = c.pointer("/state/terminated").is_some_and(|t| !t.is_null());
        if terminated && i(c, "/state/terminated/exitCode") == 0 {
            continue;
        }
        if sidecar && c.get("started") == Some(&Value::Bool(true)) {
            if c.get("ready") == Some(&Value::Bool(true)) {
                ready += 1;
            }
            continue;
        }
        initializing = true;
        let waiting = s(c, "/state/waiting/reason");
        reason = if terminated {
            terminated_reason(c, "Init:")
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{idx}/{}", init_specs.len())
        };
        break;
    }
    let initialized = conditions
        .iter()
        .any(|c| s(c, "/type") == "Initialized" && s(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut has_running = false;
        for c in arr(o, "/status/containerStatuses").iter().rev() {
            restarts = restarts.saturating_add(i(c, "/restartCount"));
            last_restart = later(last_restart, finished(c));
            let terminated = c.pointer("/state/terminated").is_some_and(|t| !t.is_null());
            if !s(c, "/state/waiting/reason").is_empty() {
                reason = s(c, "/state/waiting/reason").to_owned();
            } else if terminated {
                reason = terminated_reason(c, "");
            } else if c.get("ready") == Some(&Value::Bool(true))
                && c.pointer("/state/running").is_some_and(|r| !r.is_null())
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions
                .iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    if deleting && s(o, "/status/reason") == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }
    PodSummary {
        ready,
        total,
        reason,
        restarts,
        last_restart,
    }
}

fn pod_ready_of_total(o: &Value, _now: SystemTime) -> Value {
    let p = pod_summary(o);
    json!(format!("{}/{}", p.ready, p.total))
}

fn pod_status(o: &Value, _now: SystemTime) -> Value {
    json!(pod_summary(o).reason)
}

fn pod_restarts(o: &Value, now: SystemTime) -> Value {
    let PodSummary {
        restarts,
        last_restart,
        ..
    } = pod_summary(o);
    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => {
            format!(
                "{restarts} ({} ago)",
                human_duration(seconds_between(t, now))
            )
        }
        _ => restarts.to_string(),
    };
    json!(restarts_cell)
}

/// READINESS GATES: how many of the pod's readiness gates have a `True` condition.
fn pod_readiness_gates(o: &Value, _now: SystemTime) -> Value {
    let conditions = arr(o, "/status/conditions");
    let gates = arr(o, "/spec/readinessGates");
    let gates_cell = if gates.is_empty() {
        "<none>".to_owned()
    } else {
        let true_count = gates
            .iter()
            .filter(|g| {
                conditions
                    .iter()
                    .find(|c| s(c, "/type") == s(g, "/conditionType"))
                    .is_some_and(|c| s(c, "/status") == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };
    json!(gates_cell)
}

/// `printPod`'s row conditions: completed pods are marked so clients can hide them.
pub(super) fn pod_row_conditions(o: &Value) -> Option<Value> {
    match s(o, "/status/phase") {
        "Succeeded" => Some(json!([{"type": "Completed", "status": "True",
            "reason": "Succeeded", "message": "The pod has completed successfully."}])),
        "Failed" => Some(json!([{"type": "Completed", "status": "True",
            "reason": "Failed", "message": "The pod failed."}])),
        _ => None,
    }
}

/// `hasJobCondition`: the first condition of that type decides.
fn condition_true(o: &Value, ty: &str) -> bool {
    arr(o, "/status/conditions")
        .iter()
        .find(|c| s(c, "/type") == ty)
        .is_some_and(|c| s(c, "/status") == "True")
}

fn job_status(o: &Value, _now: SystemTime) -> Value {
    let status = if condition_true(o, "Complete") {
        "Complete"
    } else if condition_true(o, "Failed") {
        "Failed"
    } else if o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        "Terminating"
    } else if condition_true(o, "Suspended") {
        "Suspended"
    } else if condition_true(o, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    json!(status)
}

fn job_completions(o: &Value, _now: SystemTime) -> Value {
    let succeeded = i(o, "/status/succeeded");
    let completions = match o.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => {
            let parallelism = i(o, "/spec/parallelism");
            if parallelism > 1 {
                format!("{succeeded}/1 of {parallelism}")
            } else {
                format!("{succeeded}/1")
            }
        }
    };
    json!(completions)
}

fn job_duration(o: &Value, now: SystemTime) -> Value {
    let start = parse_rfc3339(s(o, "/status/startTime"));
    let done = parse_rfc3339(s(o, "/status/completionTime"));
    let duration = match (start, done) {
        (None, _) => String::new(),
        (Some(st), None) => human_duration(seconds_between(st, now)),
        (Some(st), Some(d)) => human_duration(seconds_between(st, d)),
    };
    json!(duration)
}

fn node_status(o: &Value, _now: SystemTime) -> Value {
    let mut status: Vec<&str> = vec![match arr(o, "/status/conditions")
        .iter()
        .find(|c| s(c, "/type") == "Ready")
    {
        Some(c) if s(c, "/status") == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if o.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push("SchedulingDisabled");
    }
    json!(status.join(","))
}

/// `findNodeRoles`: node-role.kubernetes.io/<role> keys and kubernetes.io/role values.
fn node_roles(o: &Value, _now: SystemTime) -> Value {
    let mut roles: Vec<String> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
                    Some(r) => Some(r.to_owned()),
                    None if k == "kubernetes.io/role" => v.as_str().map(str::to_owned),
                    None => None,
                })
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    roles.dedup();
    none_if_empty(&roles.join(","))
}

/// The node's first address of type `ty`, `<none>` if it has none.
fn node_address(o: &Value, ty: &str) -> Value {
    let first = arr(o, "/status/addresses")
        .iter()
        .find(|a| s(a, "/type") == ty)
        .map(|a| s(a, "/address"));
    json!(first.unwrap_or("<none>"))
}

fn node_internal_ip(o: &Value, _now: SystemTime) -> Value {
    node_address(o, "InternalIP")
}

fn node_external_ip(o: &Value, _now: SystemTime) -> Value {
    node_address(o, "ExternalIP")
}

/// Reads the first non-empty string among `pointers`.
fn first_str<'a>(o: &'a Value, pointers: &[&str]) -> &'a str {
    pointers
        .iter()
        .map(|p| s(o, p))
        .find(|v| !v.is_empty())
        .unwrap_or("")
}

/// Where an Event names its object: `involvedObject` (core/v1) or `regarding`.
fn event_involved(o: &Value) -> &'static str {
    if o.get("involvedObject").is_some() {
        "/involvedObject"
    } else {
        "/regarding"
    }
}

fn event_first_seen_age(o: &Value, now: SystemTime) -> String {
    match first_str(o, &["/firstTimestamp", "/deprecatedFirstTimestamp"]) {
        "" => age(s(o, "/eventTime"), now),
        t => age(t, now),
    }
}

fn event_first_seen(o: &Value, now: SystemTime) -> Value {
    json!(event_first_seen_age(o, now))
}

fn event_last_seen(o: &Value, now: SystemTime) -> Value {
    if o.get("series").is_some_and(Value::is_object) {
        return json!(age(s(o, "/series/lastObservedTime"), now));
    }
    json!(
        match first_str(o, &["/lastTimestamp", "/deprecatedLastTimestamp"]) {
            "" => event_first_seen_age(o, now),
            t => age(t, now),
        }
    )
}

fn event_count(o: &Value, _now: SystemTime) -> Value {
    if o.get("series").is_some_and(Value::is_object) {
        return json!(i(o, "/series/count"));
    }
    let count = o
        .get("count")
        .or_else(|| o.get("deprecatedCount"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    json!(if count == 0 { 1 } else { count })
}

fn event_object(o: &Value, _now: SystemTime) -> Value {
    let involved = event_involved(o);
    let kind = s(o, &format!("{involved}/kind")).to_lowercase();
    let target = match s(o, &format!("{involved}/name")) {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    json!(target)
}

fn event_subobject(o: &Value, _now: SystemTime) -> Value {
    json!(s(o, &format!("{}/fieldPath", event_involved(o))))
}

fn event_source(o: &Value, _now: SystemTime) -> Value {
    let component = first_str(
        o,
        &[
            "/source/component",
            "/deprecatedSource/component",
            "/reportingComponent",
            "/reportingController",
        ],
    );
    let instance = first_str(
        o,
        &[
            "/source/host",
            "/deprecatedSource/host",
            "/reportingInstance",
        ],
    );
    let source = if instance.is_empty() {
        component.to_owned()
    } else {
        format!("{component}, {instance}")
    };
    json!(source)
}

fn event_message(o: &Value, _now: SystemTime) -> Value {
    json!(first_str(o, &["/message", "/note"]).trim())
}

/// `CLUSTER-IP`: `spec.clusterIP`, `<none>` when empty or for an ExternalName Service.
fn service_cluster_ip(o: &Value, _now: SystemTime) -> Value {
    if s(o, "/spec/type") == "ExternalName" {
        return none_if_empty("");
    }
    none_if_empty(s(o, "/spec/clusterIP"))
}

/// `EXTERNAL-IP` as `getServiceExternalIP` shows it: a LoadBalancer's ingress addresses and
/// external IPs, `<pending>` before it has any; the external IPs of other types.
fn service_external_ip(o: &Value, _now: SystemTime) -> Value {
    let external: Vec<&str> = arr(o, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    match s(o, "/spec/type") {
        "ExternalName" => Value::String(s(o, "/spec/externalName").into()),
        "LoadBalancer" => {
            let mut all: Vec<&str> = arr(o, "/status/loadBalancer/ingress")
                .iter()
                .filter_map(|i| {
                    i.get("ip")
                        .or_else(|| i.get("hostname"))
                        .and_then(Value::as_str)
                })
                .collect();
            all.extend(external);
            if all.is_empty() {
                Value::String("<pending>".into())
            } else {
                Value::String(all.join(","))
            }
        }
        _ => none_if_empty(&external.join(",")),
    }
}

/// `PORT(S)`: `port[:nodePort]/protocol` of each port, `<none>` without any.
fn service_ports(o: &Value, _now: SystemTime) -> Value {
    let ports: Vec<String> = arr(o, "/spec/ports")
        .iter()
        .map(|p| {
            let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            match p.get("nodePort").and_then(Value::as_i64) {
                Some(node) if node != 0 => format!("{port}:{node}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    none_if_empty(&ports.join(","))
}

/// `SELECTOR`: `labels.FormatLabels` of the selector map, `<none>` when empty.
fn service_selector(o: &Value, _now: SystemTime) -> Value {
    let pairs: Vec<String> = o
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    none_if_empty(&pairs.join(","))
}

//! The resource registry: built-in kinds plus those defined by CRDs.

use std::sync::Arc;

use serde_json::{Value, json};

/// Where the `/scale` subresource reads and writes its fields.
#[derive(Debug, Clone)]
pub struct ScaleSpec {
    /// JSON path of the desired replicas, e.g. `.spec.replicas`.
    pub spec_replicas: String,
    /// JSON path of the observed replicas, e.g. `.status.replicas`.
    pub status_replicas: String,
    /// JSON path of the selector; a string for CRDs, a `LabelSelector` for built-ins.
    pub selector: Option<String>,
}

/// One served resource (all versions share one storage).
#[derive(Debug, Clone)]
pub struct ResourceDef {
    /// API group, "" for core.
    pub group: String,
    /// Served versions, the first is preferred.
    pub versions: Vec<String>,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Plural resource name, e.g. `deployments`.
    pub plural: String,
    /// Singular resource name.
    pub singular: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Has a `/status` subresource.
    pub status: bool,
    /// Has a `/scale` subresource.
    pub scale: Option<ScaleSpec>,
    /// CRD `additionalPrinterColumns` of the preferred version.
    pub printer_columns: Option<Value>,
    /// CRD `openAPIV3Schema` of the preferred version (for defaulting).
    pub schema: Option<Value>,
    /// Defined by a CRD.
    pub crd: bool,
    /// Storage key, `group/plural`.
    pub key: Arc<str>,
}

impl ResourceDef {
    fn builtin(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
        short: &[&str],
        status: bool,
    ) -> ResourceDef {
        ResourceDef {
            group: group.into(),
            versions: vec![version.into()],
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_ascii_lowercase(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            status,
            scale: None,
            printer_columns: None,
            schema: None,
            crd: false,
            key: format!("{group}/{plural}").into(),
        }
    }

    fn all(mut self) -> Self {
        self.categories = vec!["all".into()];
        self
    }

    fn served_in(mut self, version: &str) -> Self {
        self.versions.push(version.into());
        self
    }

    fn scalable(mut self) -> Self {
        self.scale = Some(ScaleSpec {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            selector: Some(".spec.selector".into()),
        });
        self
    }

    /// `apiVersion` string for a version.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Preferred version.
    pub fn version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    /// Does `metadata.generation` track spec changes for this kind?
    pub fn tracks_generation(&self) -> bool {
        self.crd
            || matches!(
                self.plural.as_str(),
                "deployments"
                    | "statefulsets"
                    | "replicasets"
                    | "jobs"
                    | "customresourcedefinitions"
            )
    }

    /// Discovery entries (`APIResource`) for this resource and its subresources.
    pub fn discovery(&self) -> Vec<Value> {
        let verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        let mut out = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
            "shortNames": self.short_names,
            "categories": self.categories,
            "storageVersionHash": "",
        })];
        if self.status {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.group.is_empty() && self.plural == "pods" {
            out.push(json!({
                "name": "pods/log",
                "singularName": "",
                "namespaced": true,
                "kind": "Pod",
                "verbs": ["get"],
            }));
        }
        if self.scale.is_some() {
            out.push(json!({
                "name": format!("{}/scale", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }

    /// Builds a definition from a CRD object; `None` if the CRD is malformed.
    pub fn from_crd(crd: &Value) -> Option<ResourceDef> {
        let spec = crd.get("spec")?;
        let group = spec.get("group")?.as_str()?.to_string();
        let names = spec.get("names")?;
        let plural = names.get("plural")?.as_str()?.to_string();
        let kind = names.get("kind")?.as_str()?.to_string();
        let singular = names
            .get("singular")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_ascii_lowercase());
        let strs = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let versions_json = spec.get("versions")?.as_array()?;
        let mut served: Vec<&Value> = versions_json
            .iter()
            .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
            .collect();
        // The storage version is preferred, like the real discovery ordering.
        served.sort_by_key(|v| !v.get("storage").and_then(Value::as_bool).unwrap_or(false));
        let first = *served.first()?;
        let versions = served
            .iter()
            .filter_map(|v| v.get("name")?.as_str().map(str::to_string))
            .collect();
        let sub = first.get("subresources");
        let scale = sub.and_then(|s| s.get("scale")).map(|s| ScaleSpec {
            spec_replicas: s
                .get("specReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".spec.replicas")
                .into(),
            status_replicas: s
                .get("statusReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".status.replicas")
                .into(),
            selector: s
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
        Some(ResourceDef {
            key: format!("{group}/{plural}").into(),
            group,
            versions,
            kind,
            plural,
            singular,
            namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
            short_names: strs(names.get("shortNames")),
            categories: strs(names.get("categories")),
            status: sub.and_then(|s| s.get("status")).is_some(),
            scale,
            printer_columns: first.get("additionalPrinterColumns").cloned(),
            schema: first.pointer("/schema/openAPIV3Schema").cloned(),
            crd: true,
        })
    }
}

/// The storage key of Events, which core/v1 and events.k8s.io/v1 share.
pub const EVENTS_KEY: &str = "/events";

/// The built-in resources every virtual cluster serves.
pub fn builtins() -> Vec<ResourceDef> {
    use ResourceDef as R;
    vec![
        R::builtin("", "v1", "Namespace", "namespaces", false, &["ns"], true),
        R::builtin("", "v1", "Pod", "pods", true, &["po"], true).all(),
        R::builtin("", "v1", "Node", "nodes", false, &["no"], true),
        R::builtin("", "v1", "ConfigMap", "configmaps", true, &["cm"], false),
        R::builtin("", "v1", "Secret", "secrets", true, &[], false),
        R::builtin("", "v1", "Event", "events", true, &["ev"], false),
        R::builtin(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["sa"],
            false,
        ),
        R::builtin("", "v1", "Service", "services", true, &["svc"], true).all(),
        R::builtin(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
            &["deploy"],
            true,
        )
        .all()
        .scalable(),
        R::builtin(
            "apps",
            "v1",
            "StatefulSet",
            "statefulsets",
            true,
            &["sts"],
            true,
        )
        .all()
        .scalable(),
        R::builtin(
            "apps",
            "v1",
            "ReplicaSet",
            "replicasets",
            true,
            &["rs"],
            true,
        )
        .all()
        .scalable(),
        R::builtin("batch", "v1", "Job", "jobs", true, &[], true).all(),
        // Stored only: kedge's agent looks for autoscalers that would fight it.
        R::builtin("batch", "v1", "CronJob", "cronjobs", true, &["cj"], true).all(),
        // Stored in v2, served in v1 too (`kubectl autoscale` writes v1); see `convert`.
        R::builtin(
            "autoscaling",
            "v2",
            "HorizontalPodAutoscaler",
            "horizontalpodautoscalers",
            true,
            &["hpa"],
            true,
        )
        .served_in("v1")
        .all(),
        R::builtin(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            true,
            &[],
            false,
        ),
        // One storage behind both Event APIs, converted on the way out (the `events` module).
        R {
            key: EVENTS_KEY.into(),
            ..R::builtin("events.k8s.io", "v1", "Event", "events", true, &[], false)
        },
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            true,
            &[],
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
            &[],
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
            &[],
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            &[],
            false,
        ),
        R::builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            &["crd", "crds"],
            true,
        ),
    ]
}

/// Groups in the order discovery lists them.
pub fn group_order(defs: &[Arc<ResourceDef>]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for d in defs {
        match out.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                for v in &d.versions {
                    if !vs.contains(v) {
                        vs.push(v.clone());
                    }
                }
            }
            None => out.push((d.group.clone(), d.versions.clone())),
        }
    }
    out
}

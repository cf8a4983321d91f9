//! Custom resource types of kedge (`kedge.dev/v1alpha1`) and their CRDs.

pub mod cluster_profile;
pub mod conditions;
pub mod dsj;
pub mod dso;
pub mod keda;
pub mod member;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use dsj::{DistributedScaledJob, DistributedScaledJobSpec, DistributedScaledJobStatus};
pub use dso::{
    DistributedScaledObject, DistributedScaledObjectSpec, DistributedScaledObjectStatus,
};
pub use member::{MemberCluster, MemberClusterSpec, MemberClusterStatus};

/// API group of every kedge resource.
pub const GROUP: &str = "kedge.dev";
/// API version of every kedge resource.
pub const VERSION: &str = "v1alpha1";

/// Most entries a DSO's or DSJ's `status.memberClusterStatuses` lists. A custom resource is
/// stored as JSON and etcd takes at most 1.5 MiB per object: one entry and the
/// `managedFields` that record who owns it come to about 400 bytes, so an entry per member of
/// a 10,000-member fleet (4 MB) could never be written. A thousand entries stay under
/// 0.4 MiB.
pub const MAX_LISTED_MEMBERS: usize = 1_000;

/// Keeps at most [`MAX_LISTED_MEMBERS`] entries of `statuses`: every member that is not
/// `ready` first, then the ready ones, each in name order. The counts of the status
/// (`membersTotalCount`, `membersHealthyCount`, `totalCurrentReplicas`) still cover every
/// member; a status listing fewer entries than `membersTotalCount` is known to be cut.
pub fn bound_member_statuses<T>(statuses: &mut BTreeMap<String, T>, ready: impl Fn(&T) -> bool) {
    let Some(keep) = listed_members(statuses.iter().map(|(name, s)| (name.as_str(), ready(s))))
    else {
        return;
    };
    let keep: BTreeSet<String> = keep.into_iter().map(str::to_owned).collect();
    statuses.retain(|name, _| keep.contains(name));
}

/// The members [`bound_member_statuses`] keeps of `members` (name, ready), or `None` when
/// all of them fit: for building only the entries that will be listed.
pub fn listed_members<'a>(
    members: impl Iterator<Item = (&'a str, bool)>,
) -> Option<BTreeSet<&'a str>> {
    let (mut not_ready, mut ready): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for (name, is_ready) in members {
        if is_ready {
            ready.push(name);
        } else {
            not_ready.push(name);
        }
    }
    if not_ready.len() + ready.len() <= MAX_LISTED_MEMBERS {
        return None;
    }
    not_ready.sort_unstable();
    ready.sort_unstable();
    Some(
        not_ready
            .into_iter()
            .chain(ready)
            .take(MAX_LISTED_MEMBERS)
            .collect(),
    )
}

/// The CRDs to install in the hub cluster, in a stable order.
///
/// The descriptions inside embedded Kubernetes types (the Job template, affinity,
/// tolerations, env, HPA behaviour) are dropped: they are Kubernetes' own documentation,
/// and with them the DSJ CRD exceeds the 256 KiB that client-side `kubectl apply` can
/// store in its last-applied annotation.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let dso = trim_descriptions(
        DistributedScaledObject::crd(),
        &[
            "/properties/spec/properties/scaledObjectSpec/properties/advanced/properties/horizontalPodAutoscalerConfig/properties/behavior",
        ],
    );
    let dsj = trim_descriptions(
        DistributedScaledJob::crd(),
        &[
            "/properties/spec/properties/scaledJobSpec/properties/jobTargetRef",
            "/properties/spec/properties/memberClusters/items/properties/podOverrides/properties/affinity",
            "/properties/spec/properties/memberClusters/items/properties/podOverrides/properties/tolerations",
            "/properties/spec/properties/memberClusters/items/properties/podOverrides/properties/containerOverrides/additionalProperties/properties/env",
            "/properties/spec/properties/memberClusters/items/properties/podOverrides/properties/containerOverrides/additionalProperties/properties/resources/properties/claims",
        ],
    );
    vec![bound(dso), bound(dsj), bound(MemberCluster::crd())]
}

/// The CRDs the hub chart ships: kedge's own ([`crds`]) and SIG-Multicluster's
/// `ClusterProfile` ([`cluster_profile_crd`]), in a stable order.
pub fn shipped_crds() -> Vec<CustomResourceDefinition> {
    let mut all = crds();
    all.push(cluster_profile_crd());
    all
}

/// The `clusterprofiles.multicluster.x-k8s.io` CRD, compatible with upstream's (the same
/// fields, list types, bounds and immutable `clusterManager`) so that either one serves the
/// profiles the hub publishes. Helm installs it only when absent; an upstream one already in
/// the cluster (from OCM, KubeFleet, …) stays.
pub fn cluster_profile_crd() -> CustomResourceDefinition {
    cluster_profile::ClusterProfile::crd()
}

/// The HPA behaviour as the API server validates an HPA (`ValidateHorizontalPodAutoscaler`):
/// KEDA copies it into the HPA it creates, so a value the HPA refuses must be refused here.
const HPA_BEHAVIOR: &str = "/properties/spec/properties/scaledObjectSpec/properties/advanced/properties/horizontalPodAutoscalerConfig/properties/behavior";
/// Largest HPA `stabilizationWindowSeconds` (one hour, as the HPA validation allows).
const MAX_STABILIZATION_WINDOW_SECONDS: i64 = 3_600;
/// Largest HPA policy `periodSeconds` (30 minutes, as the HPA validation allows).
const MAX_POLICY_PERIOD_SECONDS: i64 = 1_800;

/// Adds the bounds the types cannot say themselves: every `int32` field gets the `int32`
/// range unless it has a tighter one (a typed list decodes an out-of-range number as an
/// error, and one such object stops a controller's list), and the HPA behaviour gets the
/// HPA's own bounds and enums.
fn bound(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    edit_schema(crd, |json| {
        bound_int32(json);
        for rules in ["scaleUp", "scaleDown"] {
            let at = format!("{HPA_BEHAVIOR}/properties/{rules}/properties");
            let set = |json: &mut serde_json::Value, pointer: &str, key: &str, value| {
                if let Some(map) = json.pointer_mut(pointer).and_then(|n| n.as_object_mut()) {
                    map.insert(key.to_owned(), value);
                }
            };
            let policy = format!("{at}/policies/items/properties");
            set(
                json,
                &format!("{policy}/value"),
                "minimum",
                serde_json::json!(1),
            );
            set(
                json,
                &format!("{policy}/periodSeconds"),
                "minimum",
                serde_json::json!(1),
            );
            set(
                json,
                &format!("{policy}/periodSeconds"),
                "maximum",
                serde_json::json!(MAX_POLICY_PERIOD_SECONDS),
            );
            set(
                json,
                &format!("{policy}/type"),
                "enum",
                serde_json::json!(["Pods", "Percent"]),
            );
            set(
                json,
                &format!("{at}/selectPolicy"),
                "enum",
                serde_json::json!(["Max", "Min", "Disabled"]),
            );
            set(
                json,
                &format!("{at}/stabilizationWindowSeconds"),
                "minimum",
                serde_json::json!(0),
            );
            set(
                json,
                &format!("{at}/stabilizationWindowSeconds"),
                "maximum",
                serde_json::json!(MAX_STABILIZATION_WINDOW_SECONDS),
            );
        }
    })
}

/// Gives every `format: int32` integer node without a `minimum`/`maximum` the `int32` one.
fn bound_int32(node: &mut serde_json::Value) {
    walk_schema(node, &mut |map| {
        if map.get("type").and_then(serde_json::Value::as_str) == Some("integer")
            && map.get("format").and_then(serde_json::Value::as_str) == Some("int32")
        {
            map.entry("minimum").or_insert(serde_json::json!(i32::MIN));
            map.entry("maximum").or_insert(serde_json::json!(i32::MAX));
        }
    });
}

/// Runs `visit` on `node` and every schema node below it. Walks schema nodes only:
/// `properties` maps field names to schemas (a field may be called `description`), and
/// `default`/`enum` values are data, not schemas.
fn walk_schema(
    node: &mut serde_json::Value,
    visit: &mut impl FnMut(&mut serde_json::Map<String, serde_json::Value>),
) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    visit(map);
    for (key, child) in map.iter_mut() {
        match key.as_str() {
            "properties" => child
                .as_object_mut()
                .into_iter()
                .flat_map(|fields| fields.values_mut())
                .for_each(|field| walk_schema(field, visit)),
            "items" | "additionalProperties" | "not" => walk_schema(child, visit),
            "allOf" | "anyOf" | "oneOf" => child
                .as_array_mut()
                .into_iter()
                .flatten()
                .for_each(|branch| walk_schema(branch, visit)),
            _ => {}
        }
    }
}

/// Runs `edit` on the openAPIV3Schema of every version as JSON: the typed schema has too
/// many shapes to walk by hand. Both conversions are of a value that was just produced from
/// the same type; should one fail, the schema stays as it was.
fn edit_schema(
    mut crd: CustomResourceDefinition,
    edit: impl Fn(&mut serde_json::Value),
) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.take())
        else {
            continue;
        };
        let Ok(mut json) = serde_json::to_value(&schema) else {
            if let Some(s) = version.schema.as_mut() {
                s.open_api_v3_schema = Some(schema);
            }
            continue;
        };
        edit(&mut json);
        if let Some(s) = version.schema.as_mut() {
            s.open_api_v3_schema = Some(serde_json::from_value(json).unwrap_or(schema));
        }
    }
    crd
}

/// Removes `description` from every schema node below each of `pointers` (JSON pointers
/// into the openAPIV3Schema), keeping the description of the node itself.
fn trim_descriptions(crd: CustomResourceDefinition, pointers: &[&str]) -> CustomResourceDefinition {
    edit_schema(crd, |json| {
        for pointer in pointers {
            if let Some(node) = json.pointer_mut(pointer) {
                let own = node.get("description").cloned();
                walk_schema(node, &mut |map| {
                    map.remove("description");
                });
                if let (Some(own), Some(map)) = (own, node.as_object_mut()) {
                    map.insert("description".to_owned(), own);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Checks the rules of a structural schema
    /// (<https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema>)
    /// that the apiserver enforces, collecting every violation with its JSON path.
    fn structural_violations(schema: &Value, path: &str, out: &mut Vec<String>) {
        let Some(obj) = schema.as_object() else {
            out.push(format!("{path}: schema is not an object"));
            return;
        };
        for forbidden in ["$ref", "$schema", "definitions", "$defs", "const"] {
            if obj.contains_key(forbidden) {
                out.push(format!("{path}: has {forbidden}"));
            }
        }
        let preserves = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        if !obj.contains_key("type") && !preserves && !int_or_string {
            out.push(format!("{path}: no type"));
        }
        if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
            out.push(format!("{path}: both properties and additionalProperties"));
        }
        // Logical junctors may only restrict values, never declare types or defaults.
        for junctor in ["anyOf", "oneOf", "allOf"] {
            if let Some(branches) = obj.get(junctor).and_then(Value::as_array) {
                let typed = branches.iter().any(|b| {
                    b.get("type").is_some()
                        || b.get("default").is_some()
                        || b.get("nullable").is_some()
                        || b.get("description").is_some()
                });
                if typed && !int_or_string {
                    out.push(format!("{path}: {junctor} declares types"));
                }
            }
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                structural_violations(sub, &format!("{path}.{name}"), out);
            }
        }
        if let Some(items) = obj.get("items") {
            structural_violations(items, &format!("{path}[]"), out);
        }
        if let Some(additional) = obj.get("additionalProperties")
            && additional.is_object()
        {
            structural_violations(additional, &format!("{path}{{}}"), out);
        }
    }

    #[test]
    fn every_crd_has_a_structural_schema() {
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.versions.len(), 1, "{name}");
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            let schema = serde_json::to_value(
                version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .expect("generated CRDs always carry a schema"),
            )
            .expect("schema serializes");
            let mut violations = Vec::new();
            structural_violations(&schema, &name, &mut violations);
            assert!(violations.is_empty(), "{name}: {violations:#?}");
            assert!(
                !version
                    .additional_printer_columns
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty(),
                "{name} has printer columns"
            );
        }
    }

    /// The ClusterProfile CRD says what upstream's says where it matters to a reader or a
    /// writer: group, scope, status subresource, required fields, list types, the property
    /// bounds and the immutable cluster manager; and it is structural.
    #[test]
    fn the_cluster_profile_crd_matches_upstream() {
        let crd = cluster_profile_crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("clusterprofiles.multicluster.x-k8s.io")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some())
        );
        let schema = serde_json::to_value(&version.schema).expect("schema serializes");
        let schema = &schema["openAPIV3Schema"];
        let mut violations = Vec::new();
        structural_violations(schema, "clusterprofiles", &mut violations);
        assert!(violations.is_empty(), "{violations:#?}");
        let spec = &schema["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["clusterManager"]));
        assert_eq!(
            spec["properties"]["clusterManager"]["x-kubernetes-validations"][0]["rule"],
            "self == oldSelf"
        );
        let status = &schema["properties"]["status"]["properties"];
        for (list, key) in [
            ("conditions", "type"),
            ("properties", "name"),
            ("accessProviders", "name"),
            ("credentialProviders", "name"),
        ] {
            assert_eq!(status[list]["x-kubernetes-list-type"], "map", "{list}");
            assert_eq!(
                status[list]["x-kubernetes-list-map-keys"],
                serde_json::json!([key]),
                "{list}"
            );
        }
        let property = &status["properties"]["items"];
        assert_eq!(property["required"], serde_json::json!(["name", "value"]));
        assert_eq!(property["properties"]["value"]["maxLength"], 1024);
        assert_eq!(property["properties"]["value"]["minLength"], 1);
        assert_eq!(property["properties"]["name"]["maxLength"], 253);
        assert_eq!(
            status["accessProviders"]["items"]["properties"]["cluster"]["required"],
            serde_json::json!(["server"])
        );
        assert_eq!(
            status["version"]["properties"]["kubernetes"]["type"],
            "string"
        );
        assert_eq!(shipped_crds().len(), crds().len() + 1);
    }

    /// A printer column that shows a condition names a type kedge writes, so renaming a
    /// condition type cannot leave `kubectl get` showing an empty column.
    #[test]
    fn printer_columns_name_only_condition_types_kedge_writes() {
        let mut named = 0;
        for crd in crds() {
            for column in crd.spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
            {
                if let Some(rest) = column.json_path.split("@.type==\"").nth(1) {
                    let type_ = rest.split('"').next().unwrap_or_default();
                    assert!(
                        conditions::CONDITION_TYPES.contains(&type_),
                        "{}: column {} shows condition {type_:?}, which kedge never writes",
                        crd.spec.names.kind,
                        column.name
                    );
                    named += 1;
                }
            }
        }
        assert!(
            named >= 2,
            "the DSO columns Ready and Paused show conditions"
        );
    }

    #[test]
    fn crds_fit_in_client_side_apply() {
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let size = serde_json::to_vec(&crd)
                .map(|v| v.len())
                .unwrap_or(usize::MAX);
            assert!(size < 200 * 1024, "{name} is {size} bytes");
        }
        let dsj = serde_json::to_value(DistributedScaledJob::crd()).expect("serializes");
        let trimmed = serde_json::to_value(&crds()[1]).expect("serializes");
        let job = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/scaledJobSpec/properties/jobTargetRef";
        assert!(dsj.pointer(job).is_some() && trimmed.pointer(job).is_some());
        assert_eq!(
            trimmed.pointer(&format!("{job}/properties/template/properties/spec/properties/containers/items/properties/name/type")),
            Some(&serde_json::json!("string")),
            "only descriptions are removed"
        );
        assert!(
            trimmed
                .pointer(&format!("{job}/properties/template/description"))
                .is_none()
        );
        assert!(
            trimmed.pointer(&format!("{job}/description")).is_some(),
            "the field's own doc stays"
        );
    }

    #[test]
    fn scopes_short_names_and_subresources() {
        let expected = [
            (
                "distributedscaledobjects.kedge.dev",
                "Namespaced",
                "dso",
                true,
            ),
            ("distributedscaledjobs.kedge.dev", "Namespaced", "dsj", true),
            ("memberclusters.kedge.dev", "Cluster", "mc", false),
        ];
        for (crd, (name, scope, short, scale)) in crds().into_iter().zip(expected) {
            assert_eq!(crd.metadata.name.as_deref(), Some(name));
            assert_eq!(crd.spec.scope, scope);
            assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
            let sub = crd.spec.versions[0]
                .subresources
                .as_ref()
                .expect("all kedge resources have subresources");
            assert!(sub.status.is_some(), "{name} status");
            assert_eq!(sub.scale.is_some(), scale, "{name} scale");
        }
    }

    #[test]
    fn dso_scale_paths_and_an_unset_total() {
        let crd = DistributedScaledObject::crd();
        let version = &crd.spec.versions[0];
        let scale = version
            .subresources
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .expect("dso has /scale");
        assert_eq!(scale.spec_replicas_path, ".spec.totalTargetReplicas");
        assert_eq!(scale.status_replicas_path, ".status.totalCurrentReplicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let schema = serde_json::to_value(&version.schema).expect("schema serializes");
        let total =
            &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["totalTargetReplicas"];
        // No default: an absent total means "never written through /scale", and the hub then
        // holds what runs instead of scaling to 0.
        assert!(total.get("default").is_none(), "{total}");
        assert_eq!(total["type"], "integer");
        let policy = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["rebalancingPolicy"]
            ["properties"];
        assert_eq!(
            policy["maxRebalancePercentage"]["default"],
            serde_json::json!(50)
        );
        assert_eq!(
            policy["avoidDisruption"]["default"],
            serde_json::json!(true)
        );
        let members =
            &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["memberClusters"];
        assert_eq!(members["x-kubernetes-list-type"], serde_json::json!("map"));
        assert_eq!(
            members["x-kubernetes-list-map-keys"],
            serde_json::json!(["name"])
        );
        let dsj = DistributedScaledJob::crd();
        let dsj_scale = dsj.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .expect("dsj has /scale");
        assert_eq!(dsj_scale.spec_replicas_path, ".spec.totalTargetReplicas");
        assert_eq!(dsj_scale.status_replicas_path, ".status.runningJobs");
    }

    #[test]
    fn reference_dso_example_deserializes() {
        let yaml = r#"
apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata: {name: nginx, namespace: default}
spec:
  memberClusters:
  - {name: member-cluster-1, weight: 4}
  - {name: member-cluster-2, weight: 6}
  rebalancingPolicy: {gracePeriod: 1m}
  scaledObjectSpec:
    scaleTargetRef: {kind: Deployment, name: nginx}
    minReplicaCount: 1
    maxReplicaCount: 10
    triggers:
    - type: kubernetes-resource
      metadata: {resourceKind: ConfigMap, resourceName: mock-metric, key: metric-value, targetValue: "5"}
"#;
        let dso: DistributedScaledObject = serde_yaml::from_str(yaml).expect("reference example");
        assert_eq!(
            dso.spec.total_target_replicas, None,
            "unset until /scale is written"
        );
        let policy = dso.spec.rebalancing_policy.expect("policy given");
        assert_eq!(policy.max_rebalance_percentage, 50);
        assert!(policy.avoid_disruption);
        assert_eq!(dso.spec.member_clusters[1].weight, Some(6));
        assert_eq!(dso.spec.member_clusters[1].tier, 0);
    }

    #[test]
    fn a_status_lists_every_member_not_ready_first_then_the_ready_ones_up_to_the_bound() {
        let names = |m: &BTreeMap<String, bool>| m.keys().cloned().collect::<Vec<_>>();
        // Within the bound nothing is dropped.
        let mut few: BTreeMap<String, bool> =
            (0..5).map(|i| (format!("m{i}"), i % 2 == 0)).collect();
        let before = few.clone();
        bound_member_statuses(&mut few, |ready| *ready);
        assert_eq!(few, before);
        // Beyond it: the 3 members not ready (whatever their names), then ready ones by name.
        let mut many: BTreeMap<String, bool> = (0..MAX_LISTED_MEMBERS + 500)
            .map(|i| (format!("m{i:05}"), !matches!(i, 7 | 1_200 | 1_499)))
            .collect();
        bound_member_statuses(&mut many, |ready| *ready);
        assert_eq!(many.len(), MAX_LISTED_MEMBERS);
        for lost in ["m00007", "m01200", "m01499"] {
            assert_eq!(many.get(lost), Some(&false), "{lost}");
        }
        let listed = names(&many);
        assert_eq!(listed[0], "m00000");
        // 997 ready ones fill the rest: m00000..=m00997 without m00007.
        assert!(many.contains_key("m00997") && !many.contains_key("m00998"));
    }
}

//! Strategic merge patch (`application/strategic-merge-patch+json`) for the built-in kinds
//! kedge and kubectl touch.
//!
//! The Go implementation reads `patchStrategy`/`patchMergeKey` struct tags; here the tags
//! of the types we serve are written down as a small schema (`Ty`). Supported: merge
//! keys (containers by `name`, env by `name`, ports by `containerPort`, volumeMounts by
//! `mountPath`, conditions by `type`, ownerReferences by `uid`, ...), primitive sets
//! (`finalizers`), `$patch: replace|delete|merge`, `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` and `null` deletes.
//! Lists without a strategy tag (`tolerations`, `taints`, RBAC `rules`) are replaced.
//!
//! Limits: only the fields in the schema below merge by key, any other list is replaced
//! (fine for the kinds listed, wrong for fields of types we do not serve); `$patch: merge`
//! on a map is accepted as the default (Go rejects it); errors the Go code leaves as 500s
//! (e.g. a list element without its merge key) are 400 here.

use serde_json::{Map, Value};

use super::{PatchError, Result};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Built-in kinds whose Go types carry patch strategies; strategic merge on anything
/// else (custom resources) is refused with 415.
const STRATEGIC_KINDS: &[&str] = &[
    "Pod",
    "PodTemplate",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "ConfigMap",
    "Secret",
    "Namespace",
    "Node",
    "ServiceAccount",
    "Service",
    "Endpoints",
    "Event",
    "Lease",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "HorizontalPodAutoscaler",
    "PersistentVolumeClaim",
    "LimitRange",
    "ResourceQuota",
];

/// Whether the real server accepts a strategic merge patch for `kind` (built-in types
/// only; custom resources get 415 UnsupportedMediaType).
pub fn supports_strategic(kind: &str) -> bool {
    STRATEGIC_KINDS.contains(&kind)
}

/// The Go type a JSON position corresponds to, as far as patch strategies matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Root(&'static str),
    /// A custom resource: only its `metadata` has known strategies.
    CustomRoot,
    ObjectMeta,
    WorkloadSpec,
    CronJobSpec,
    JobTemplate,
    PodTemplateSpec,
    PodSpec,
    Container,
    Status,
    NodeSpec,
    ServiceSpec,
    Other,
}

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListStrategy {
    /// No strategy tag: the patch list replaces the live one.
    Atomic,
    /// `patchStrategy:"merge"` on a list of primitives: set union.
    Set,
    /// `patchStrategy:"merge" patchMergeKey:"<key>"`: elements merge by key.
    Keyed(&'static str, Ty),
}

pub(crate) fn root_ty(kind: &str) -> Ty {
    match STRATEGIC_KINDS.iter().find(|k| **k == kind) {
        Some(k) => Ty::Root(k),
        None => Ty::CustomRoot,
    }
}

pub(crate) fn child_ty(parent: Ty, field: &str) -> Ty {
    match (parent, field) {
        (Ty::Root(_) | Ty::CustomRoot, "metadata") => Ty::ObjectMeta,
        (Ty::Root(_), "status") => Ty::Status,
        (Ty::Root("Pod"), "spec") => Ty::PodSpec,
        (Ty::Root("PodTemplate"), "template") => Ty::PodTemplateSpec,
        (Ty::Root("Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job"), "spec") => {
            Ty::WorkloadSpec
        }
        (Ty::Root("CronJob"), "spec") => Ty::CronJobSpec,
        (Ty::Root("Node"), "spec") => Ty::NodeSpec,
        (Ty::Root("Service"), "spec") => Ty::ServiceSpec,
        (Ty::CronJobSpec, "jobTemplate") => Ty::JobTemplate,
        (Ty::JobTemplate, "metadata") => Ty::ObjectMeta,
        (Ty::JobTemplate, "spec") => Ty::WorkloadSpec,
        (Ty::WorkloadSpec, "template") => Ty::PodTemplateSpec,
        (Ty::PodTemplateSpec, "metadata") => Ty::ObjectMeta,
        (Ty::PodTemplateSpec, "spec") => Ty::PodSpec,
        _ => Ty::Other,
    }
}

pub(crate) fn list_strategy(parent: Ty, field: &str) -> ListStrategy {
    use ListStrategy::{Atomic, Keyed, Set};
    match (parent, field) {
        (Ty::ObjectMeta, "ownerReferences") => Keyed("uid", Ty::Other),
        (Ty::ObjectMeta, "finalizers") => Set,
        (Ty::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
            Keyed("name", Ty::Container)
        }
        (Ty::PodSpec, "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims") => {
            Keyed("name", Ty::Other)
        }
        (Ty::PodSpec, "hostAliases") => Keyed("ip", Ty::Other),
        (Ty::PodSpec, "topologySpreadConstraints") => Keyed("topologyKey", Ty::Other),
        (Ty::Container, "env") => Keyed("name", Ty::Other),
        (Ty::Container, "ports") => Keyed("containerPort", Ty::Other),
        (Ty::Container, "volumeMounts") => Keyed("mountPath", Ty::Other),
        (Ty::Container, "volumeDevices") => Keyed("devicePath", Ty::Other),
        (Ty::Status, "conditions") => Keyed("type", Ty::Other),
        (Ty::Status, "addresses") => Keyed("type", Ty::Other),
        (Ty::Status, "podIPs" | "hostIPs") => Keyed("ip", Ty::Other),
        (Ty::NodeSpec, "podCIDRs") => Set,
        (Ty::ServiceSpec, "ports") => Keyed("port", Ty::Other),
        (Ty::Root("ServiceAccount"), "secrets") => Keyed("name", Ty::Other),
        _ => Atomic,
    }
}

/// Applies a strategic merge patch to `target` (an object of `kind`) in place. On error
/// `target` is left unchanged.
pub fn strategic_merge(target: &mut Value, patch: &Value, kind: &str) -> Result<()> {
    if !supports_strategic(kind) {
        return Err(PatchError::UnsupportedMediaType(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, \
             application/apply-patch+yaml"
                .into(),
        ));
    }
    let Value::Object(patch) = patch else {
        return Err(PatchError::BadRequest(
            "invalid JSON document: a strategic merge patch must be a JSON object".into(),
        ));
    };
    let Value::Object(original) = target else {
        return Err(PatchError::BadRequest(
            "the object to patch is not a JSON object".into(),
        ));
    };
    let merged = merge_map(original.clone(), patch, root_ty(kind))?;
    *target = Value::Object(merged);
    Ok(())
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty,
) -> Result<Map<String, Value>> {
    match patch.get(DIRECTIVE) {
        None => {}
        Some(Value::String(d)) if d == "replace" => {
            let mut replaced = Map::new();
            for (k, v) in patch {
                if k != DIRECTIVE {
                    replaced.insert(k.clone(), v.clone());
                }
            }
            return Ok(replaced);
        }
        Some(Value::String(d)) if d == "delete" => return Ok(Map::new()),
        Some(Value::String(d)) if d == "merge" => {}
        Some(other) => {
            return Err(PatchError::BadRequest(format!(
                "Unknown patch type: {other} in map: {}",
                Value::Object(patch.clone())
            )));
        }
    }

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Some(keys) = retain.as_array().and_then(|a| {
            a.iter()
                .map(|k| k.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        }) else {
            return Err(PatchError::BadRequest(
                "invalid patch: $retainKeys must be a list of strings".into(),
            ));
        };
        for (k, v) in patch {
            if !k.starts_with('$') && !v.is_null() && !keys.contains(k) {
                return Err(PatchError::Invalid(
                    "content of the patch does not match the $retainKeys list".into(),
                ));
            }
        }
        original.retain(|k, _| keys.contains(k));
    }

    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE) {
            let Value::Array(remove) = v else {
                return Err(PatchError::BadRequest(format!(
                    "invalid patch: {k} must be a list"
                )));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|e| !remove.contains(e));
            }
        }
    }

    // The live order of lists that a `$setElementOrder` directive reorders.
    let server_orders: Vec<(&str, Vec<Value>)> = patch
        .keys()
        .filter_map(|k| k.strip_prefix(SET_ELEMENT_ORDER))
        .map(|field| match original.get(field) {
            Some(Value::Array(live)) => (field, live.clone()),
            _ => (field, Vec::new()),
        })
        .collect();

    for (k, v) in patch {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            original.remove(k);
            continue;
        }
        let current = original.remove(k);
        let merged = merge_value(current, v, ty, k)?;
        original.insert(k.clone(), merged);
    }

    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) {
            let Value::Array(order) = v else {
                return Err(PatchError::BadRequest(format!(
                    "invalid patch: {k} must be a list"
                )));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                let key = match list_strategy(ty, field) {
                    ListStrategy::Keyed(key, _) => Some(key),
                    _ => None,
                };
                let server_order = server_orders
                    .iter()
                    .find(|(f, _)| *f == field)
                    .map_or(&[][..], |(_, live)| live.as_slice());
                apply_element_order(list, order, server_order, key);
            }
        }
    }
    Ok(original)
}

/// Merges one field's patch value into its current value.
fn merge_value(current: Option<Value>, patch: &Value, parent: Ty, field: &str) -> Result<Value> {
    match (current, patch) {
        (Some(Value::Object(cur)), Value::Object(p)) => {
            Ok(Value::Object(merge_map(cur, p, child_ty(parent, field))?))
        }
        (None, Value::Object(p)) => Ok(Value::Object(merge_map(
            Map::new(),
            p,
            child_ty(parent, field),
        )?)),
        (Some(Value::Array(cur)), Value::Array(p)) => Ok(Value::Array(merge_list(
            cur,
            p,
            list_strategy(parent, field),
        )?)),
        (None, Value::Array(p)) => Ok(Value::Array(merge_list(
            Vec::new(),
            p,
            list_strategy(parent, field),
        )?)),
        (_, p) => Ok(p.clone()),
    }
}

fn merge_list(original: Vec<Value>, patch: &[Value], strategy: ListStrategy) -> Result<Vec<Value>> {
    match strategy {
        ListStrategy::Atomic => {
            if patch.iter().any(|e| e.is_array()) {
                return Err(PatchError::Invalid(
                    "lists of lists are not supported".into(),
                ));
            }
            Ok(patch.to_vec())
        }
        ListStrategy::Set => {
            let mut out = original;
            for e in patch {
                if e.is_object() || e.is_array() {
                    return Err(PatchError::BadRequest(
                        "invalid patch: a list of primitives may not contain maps or lists".into(),
                    ));
                }
                if !out.contains(e) {
                    out.push(e.clone());
                }
            }
            Ok(out)
        }
        ListStrategy::Keyed(key, elem_ty) => merge_keyed_list(original, patch, key, elem_ty),
    }
}

fn merge_keyed_list(
    mut original: Vec<Value>,
    patch: &[Value],
    key: &str,
    elem_ty: Ty,
) -> Result<Vec<Value>> {
    let mut replace = false;
    let mut plain = Vec::new();
    for e in patch {
        let Value::Object(m) = e else {
            return Err(PatchError::BadRequest(format!(
                "invalid patch: list element {e} must be a map with merge key \"{key}\""
            )));
        };
        match m.get(DIRECTIVE) {
            None => plain.push(m),
            Some(Value::String(d)) if d == "delete" => {
                let Some(kv) = m.get(key) else {
                    return Err(no_merge_key(e, key));
                };
                original.retain(|o| o.get(key) != Some(kv));
            }
            Some(Value::String(d)) if d == "replace" => replace = true,
            Some(Value::String(d)) if d == "merge" => {
                return Err(PatchError::BadRequest(
                    "merging lists cannot yet be specified in the patch".into(),
                ));
            }
            Some(other) => {
                return Err(PatchError::BadRequest(format!(
                    "Unknown patch type: {other} in map: {e}"
                )));
            }
        }
    }
    if replace {
        return Ok(plain
            .into_iter()
            .map(|m| Value::Object(m.clone()))
            .collect());
    }
    for m in plain {
        let Some(kv) = m.get(key) else {
            return Err(no_merge_key(&Value::Object(m.clone()), key));
        };
        match original.iter_mut().find(|o| o.get(key) == Some(kv)) {
            Some(Value::Object(existing)) => {
                let merged = merge_map(std::mem::take(existing), m, elem_ty)?;
                *existing = merged;
            }
            Some(other) => *other = Value::Object(merge_map(Map::new(), m, elem_ty)?),
            None => original.push(Value::Object(merge_map(Map::new(), m, elem_ty)?)),
        }
    }
    Ok(original)
}

fn no_merge_key(e: &Value, key: &str) -> PatchError {
    PatchError::BadRequest(format!(
        "map: {e} does not contain declared merge key: {key}"
    ))
}

/// Reorders a merged list per `$setElementOrder` like apimachinery's
/// `normalizeElementOrder`: the items named in `order` follow that order, the others
/// (server-only) keep their live order, and the two sequences are interleaved by their
/// positions in the live list (`server_order`).
fn apply_element_order(
    list: &mut Vec<Value>,
    order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) {
    let identity = |e: &Value| -> Value {
        match key {
            Some(k) => e.get(k).cloned().unwrap_or(Value::Null),
            None => e.clone(),
        }
    };
    let position = |within: &[Value], e: &Value| {
        let id = identity(e);
        within.iter().position(|o| identity(o) == id)
    };
    let (mut patch_items, mut server_only): (Vec<Value>, Vec<Value>) = std::mem::take(list)
        .into_iter()
        .partition(|e| position(order, e).is_some());
    patch_items.sort_by_key(|e| position(order, e).unwrap_or(usize::MAX));
    server_only.sort_by_key(|e| position(server_order, e).unwrap_or(usize::MAX));

    // mergeSortedSlice: take the server-only item first only when both are in the live
    // list and it came first there.
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (position(server_order, l), position(server_order, r)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        list.extend(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn smp(mut target: Value, patch: Value, kind: &str) -> Value {
        if let Err(e) = strategic_merge(&mut target, &patch, kind) {
            panic!("patch failed: {e}");
        }
        target
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["a"]},
            "spec": {"replicas": 1, "template": {"spec": {
                "containers": [
                    {"name": "app", "image": "app:1",
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                     "ports": [{"containerPort": 80, "name": "http"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                    {"name": "sidecar", "image": "side:1"}
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [{"key": "a", "operator": "Exists"}]
            }}}
        })
    }

    #[test]
    fn containers_merge_by_name() {
        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "3"},
                                                            {"name": "C", "value": "4"}]}
            ]}}}}),
            "Deployment",
        );
        let c = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(c[0]["image"], "app:2");
        assert_eq!(c[1]["name"], "sidecar", "sidecar kept");
        assert_eq!(
            c[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"},
                   {"name": "C", "value": "4"}])
        );
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 80, "name": "http"}])
        );
    }

    #[test]
    fn ports_mounts_volumes_and_atomic_tolerations() {
        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {
                "containers": [{"name": "app",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 9090}],
                    "volumeMounts": [{"mountPath": "/cache", "name": "cache"}]}],
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "tolerations": [{"key": "b", "operator": "Exists"}]
            }}}}),
            "Deployment",
        );
        let spec = &out["spec"]["template"]["spec"];
        assert_eq!(
            spec["containers"][0]["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"},
                   {"containerPort": 9090}])
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(spec["volumes"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "b", "operator": "Exists"}])
        );
    }

    #[test]
    fn pod_and_statefulset_and_job_paths() {
        let pod = json!({"kind": "Pod", "spec": {"containers": [{"name": "a", "image": "1"}]}});
        let out = smp(
            pod,
            json!({"spec": {"containers": [{"name": "b", "image": "2"}]}}),
            "Pod",
        );
        assert_eq!(out["spec"]["containers"].as_array().map(Vec::len), Some(2));

        for kind in ["StatefulSet", "Job", "ReplicaSet", "DaemonSet"] {
            let obj = json!({"spec": {"template": {"spec": {"initContainers": [{"name": "i"}]}}}});
            let out = smp(
                obj,
                json!({"spec": {"template": {"spec": {"initContainers": [{"name": "j"}]}}}}),
                kind,
            );
            assert_eq!(
                out["spec"]["template"]["spec"]["initContainers"],
                json!([{"name": "i"}, {"name": "j"}]),
                "{kind}"
            );
        }
        let pt = json!({"template": {"spec": {"containers": [{"name": "a"}]}}});
        let out = smp(
            pt,
            json!({"template": {"spec": {"containers": [{"name": "b"}]}}}),
            "PodTemplate",
        );
        assert_eq!(
            out["template"]["spec"]["containers"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn conditions_owner_refs_and_finalizers() {
        let obj = json!({
            "metadata": {"ownerReferences": [{"uid": "1", "name": "a"}], "finalizers": ["x"]},
            "status": {"conditions": [{"type": "Ready", "status": "False"},
                                      {"type": "Available", "status": "True"}]}
        });
        let out = smp(
            obj,
            json!({
                "metadata": {"ownerReferences": [{"uid": "2", "name": "b"}],
                             "finalizers": ["y", "x"]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }),
            "Deployment",
        );
        assert_eq!(
            out["metadata"]["ownerReferences"].as_array().map(Vec::len),
            Some(2)
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Available", "status": "True"}])
        );
    }

    #[test]
    fn null_deletes_and_maps_merge() {
        let cm = json!({"kind": "ConfigMap", "metadata": {"annotations": {"a": "1", "b": "2"}},
                        "data": {"x": "1", "y": "2"}});
        let out = smp(
            cm,
            json!({"metadata": {"annotations": {"a": null, "c": "3"}},
                   "data": {"y": null, "z": "3"}}),
            "ConfigMap",
        );
        assert_eq!(out["metadata"]["annotations"], json!({"b": "2", "c": "3"}));
        assert_eq!(out["data"], json!({"x": "1", "z": "3"}));
        // Nulls inside newly added maps are dropped, not stored.
        let out = smp(
            json!({}),
            json!({"data": {"a": null, "b": "1"}}),
            "ConfigMap",
        );
        assert_eq!(out, json!({"data": {"b": "1"}}));
    }

    #[test]
    fn patch_directives() {
        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "sidecar", "$patch": "delete"}
            ]}}}}),
            "Deployment",
        );
        let c = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(c.as_array().map(Vec::len), Some(1));
        assert_eq!(c[0]["name"], "app");

        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [
                {"$patch": "replace"}, {"name": "only", "image": "x"}
            ]}}}}),
            "Deployment",
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );

        let out = smp(
            deployment(),
            json!({"metadata": {"labels": {"$patch": "replace", "new": "1"}}}),
            "Deployment",
        );
        assert_eq!(out["metadata"]["labels"], json!({"new": "1"}));

        let out = smp(
            deployment(),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
            "Deployment",
        );
        assert_eq!(out["metadata"]["labels"], json!({}));

        let out = smp(
            deployment(),
            json!({"metadata": {"labels": {"$patch": "merge", "x": "y"}}}),
            "Deployment",
        );
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "x": "y"}));
    }

    #[test]
    fn retain_keys_clears_other_fields() {
        let obj = json!({"spec": {"strategy": {"type": "RollingUpdate",
                                               "rollingUpdate": {"maxSurge": 1}}}});
        let out = smp(
            obj.clone(),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            "Deployment",
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
        let mut t = obj;
        let err = strategic_merge(
            &mut t,
            &json!({"spec": {"strategy": {"$retainKeys": ["type"], "other": 1}}}),
            "Deployment",
        );
        assert_eq!(err.map_err(|e| e.status_code()), Err(422));
    }

    #[test]
    fn delete_from_primitive_list_and_element_order() {
        let obj = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        let out = smp(
            obj,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
            "Namespace",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));

        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}],
                "containers": [{"name": "app", "image": "app:3"}]
            }}}}),
            "Deployment",
        );
        let c = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(c[0]["name"], "sidecar");
        assert_eq!(c[1]["name"], "app");
        assert_eq!(c[1]["image"], "app:3");

        let out = smp(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"]}}),
            "Secret",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "a"]));
    }

    #[test]
    fn element_order_interleaves_server_only_items() {
        let pod = |names: &[&str]| {
            let cs: Vec<Value> = names.iter().map(|n| json!({"name": n})).collect();
            json!({"spec": {"containers": cs}})
        };
        let names = |v: &Value| -> Vec<String> {
            v["spec"]["containers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|c| c["name"].as_str().unwrap_or("").to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let out = smp(
            pod(&["a", "s1", "b", "s2"]),
            json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                            "containers": [{"name": "b", "image": "x"}]}}),
            "Pod",
        );
        assert_eq!(names(&out), ["s1", "b", "a", "s2"]);
        let out = smp(
            pod(&["a", "s"]),
            json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
                            "containers": [{"name": "c"}]}}),
            "Pod",
        );
        assert_eq!(names(&out), ["c", "a", "s"]);
    }

    #[test]
    fn other_kinds() {
        let node = json!({"kind": "Node", "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
                          "status": {"addresses": [{"type": "InternalIP", "address": "1"}]}});
        let out = smp(
            node,
            json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]},
                   "status": {"addresses": [{"type": "Hostname", "address": "n"}]}}),
            "Node",
        );
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
        assert_eq!(out["status"]["addresses"].as_array().map(Vec::len), Some(2));

        let sa = json!({"secrets": [{"name": "a"}], "imagePullSecrets": [{"name": "x"}]});
        let out = smp(
            sa,
            json!({"secrets": [{"name": "b"}], "imagePullSecrets": [{"name": "y"}]}),
            "ServiceAccount",
        );
        assert_eq!(out["secrets"], json!([{"name": "a"}, {"name": "b"}]));
        assert_eq!(out["imagePullSecrets"], json!([{"name": "y"}]));

        let role = json!({"rules": [{"verbs": ["get"]}]});
        let out = smp(role, json!({"rules": [{"verbs": ["list"]}]}), "Role");
        assert_eq!(out["rules"], json!([{"verbs": ["list"]}]));

        let cj = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "containers": [{"name": "a"}]}}}}}});
        let out = smp(
            cj,
            json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {
                "containers": [{"name": "b"}]}}}}}}),
            "CronJob",
        );
        assert_eq!(
            out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn errors() {
        let mut t = deployment();
        let before = t.clone();
        let cases = [
            (json!({"spec": {"$patch": "explode"}}), 400),
            (
                json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}),
                400,
            ),
            (
                json!({"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}}),
                400,
            ),
            (
                json!({"spec": {"template": {"spec": {"containers": ["x"]}}}}),
                400,
            ),
            (
                json!({"spec": {"template": {"spec": {"containers": [{"$patch": "merge"}]}}}}),
                400,
            ),
            (json!({"metadata": {"finalizers": [{"a": 1}]}}), 400),
            (json!({"metadata": {"$retainKeys": "x"}}), 400),
            (json!({"data": [[1]]}), 422),
            (json!([1]), 400),
        ];
        for (patch, code) in cases {
            let err = strategic_merge(&mut t, &patch, "Deployment");
            assert_eq!(err.map_err(|e| e.status_code()), Err(code), "{patch}");
            assert_eq!(t, before, "{patch} must leave the target unchanged");
        }
        let err = strategic_merge(&mut t, &json!({"spec": {}}), "Widget");
        assert_eq!(err.map_err(|e| e.status_code()), Err(415));
        assert!(!supports_strategic("DistributedScaledObject"));
        assert!(supports_strategic("Deployment"));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            prop_oneof![
                Just("$patch".to_string()),
                Just("delete".to_string()),
                Just("replace".to_string()),
                "[a-z]{0,4}".prop_map(String::from)
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("$patch".to_string()),
                        Just("$retainKeys".to_string()),
                        Just("$setElementOrder/containers".to_string()),
                        Just("$deleteFromPrimitiveList/finalizers".to_string()),
                        Just("containers".to_string()),
                        Just("name".to_string()),
                        Just("spec".to_string()),
                        Just("template".to_string()),
                        Just("metadata".to_string()),
                        Just("finalizers".to_string()),
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn never_panics(target in arb_json(), patch in arb_json()) {
            let mut t = target.clone();
            let _ = strategic_merge(&mut t, &patch, "Deployment");
            let mut t = target;
            let _ = strategic_merge(&mut t, &patch, "Pod");
        }

        /// Without lists, nulls or directives, strategic merge is JSON merge.
        #[test]
        fn maps_and_scalars_merge_like_json_merge(target in arb_map_tree(), patch in arb_map_tree()) {
            let mut smp = target.clone();
            prop_assert!(strategic_merge(&mut smp, &patch, "ConfigMap").is_ok());
            let mut merge = target;
            crate::patch::json_merge(&mut merge, &patch);
            prop_assert_eq!(smp, merge);
        }
    }

    fn arb_map_tree() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z]{0,3}".prop_map(Value::String),
        ];
        let tree = leaf.prop_recursive(4, 32, 4, |inner| {
            prop::collection::btree_map("[a-d]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect()))
        });
        prop::collection::btree_map("[a-d]", tree, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }
}

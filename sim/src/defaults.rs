//! Defaulting of built-in kinds on create, the subset kedge and kubectl rely on.

use serde_json::{Value, json};

use crate::resources::ResourceDef;
use crate::util::{meta_str, new_uid};

/// Fills defaults the real API server would fill: for custom resources, the `default`s of
/// the CRD's structural schema; for built-in kinds, the subset below.
pub fn apply(def: &ResourceDef, obj: &mut Value) {
    if !obj.is_object() {
        return;
    }
    if def.crd {
        if let Some(schema) = &def.schema {
            schema_defaults(schema, obj, true);
        }
        return;
    }
    match def.kind.as_str() {
        "Deployment" | "StatefulSet" | "ReplicaSet" => {
            let spec = ensure_obj(obj, "spec");
            spec.entry("replicas").or_insert(json!(1));
            if def.kind == "Deployment" {
                spec.entry("revisionHistoryLimit").or_insert(json!(10));
                spec.entry("progressDeadlineSeconds").or_insert(json!(600));
                spec.entry("strategy").or_insert(json!({
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}
                }));
            }
            if def.kind == "StatefulSet" {
                spec.entry("podManagementPolicy")
                    .or_insert(json!("OrderedReady"));
                spec.entry("updateStrategy")
                    .or_insert(json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}));
            }
        }
        "Job" => {
            let uid = new_uid();
            let name = meta_str(obj, "name").unwrap_or_default().to_string();
            let spec = ensure_obj(obj, "spec");
            spec.entry("parallelism").or_insert(json!(1));
            spec.entry("completions").or_insert(json!(1));
            spec.entry("backoffLimit").or_insert(json!(6));
            spec.entry("completionMode").or_insert(json!("NonIndexed"));
            spec.entry("suspend").or_insert(json!(false));
            // The real API server selects a Job's pods by a generated controller-uid label.
            if !spec.contains_key("selector") {
                spec.insert(
                    "selector".into(),
                    json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
                );
                let tmpl = spec.entry("template").or_insert(json!({}));
                if let Some(t) = tmpl.as_object_mut() {
                    let meta = t.entry("metadata").or_insert(json!({}));
                    if let Some(m) = meta.as_object_mut() {
                        let labels = m.entry("labels").or_insert(json!({}));
                        if let Some(l) = labels.as_object_mut() {
                            l.insert("batch.kubernetes.io/controller-uid".into(), json!(uid));
                            l.insert("controller-uid".into(), json!(uid));
                            if !name.is_empty() {
                                l.insert("batch.kubernetes.io/job-name".into(), json!(name));
                                l.insert("job-name".into(), json!(name));
                            }
                        }
                    }
                }
            }
        }
        "Pod" => {
            let spec = ensure_obj(obj, "spec");
            spec.entry("restartPolicy").or_insert(json!("Always"));
            spec.entry("schedulerName")
                .or_insert(json!("default-scheduler"));
            spec.entry("terminationGracePeriodSeconds")
                .or_insert(json!(30));
            spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
            if let Some(root) = obj.as_object_mut() {
                root.entry("status")
                    .or_insert(json!({"phase": "Pending", "qosClass": "BestEffort"}));
            }
        }
        "Namespace" => {
            let spec = ensure_obj(obj, "spec");
            spec.entry("finalizers").or_insert(json!(["kubernetes"]));
            if let Some(root) = obj.as_object_mut() {
                root.entry("status").or_insert(json!({"phase": "Active"}));
            }
            let name = meta_str(obj, "name").unwrap_or_default().to_string();
            let meta = crate::util::meta_mut(obj);
            let labels = meta.entry("labels").or_insert(json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        "Secret" => {
            if let Some(root) = obj.as_object_mut() {
                let ty = root.entry("type").or_insert(json!("Opaque"));
                if ty.as_str().is_none_or(str::is_empty) {
                    *ty = json!("Opaque");
                }
            }
        }
        _ => {}
    }
}

/// Structural-schema defaulting as the API server does it: a property absent from an object
/// gets its schema's `default`, then defaulting recurses into objects, array items and map
/// values. `metadata` is never defaulted from the schema.
fn schema_defaults(schema: &Value, value: &mut Value, top: bool) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    if top && name == "metadata" {
                        continue;
                    }
                    if !map.contains_key(name)
                        && let Some(default) = prop.get("default")
                    {
                        map.insert(name.clone(), default.clone());
                    }
                    if let Some(child) = map.get_mut(name) {
                        schema_defaults(prop, child, false);
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for child in map.values_mut() {
                    schema_defaults(values, child, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    schema_defaults(item_schema, item, false);
                }
            }
        }
        _ => {}
    }
}

fn ensure_obj<'a>(obj: &'a mut Value, field: &str) -> &'a mut serde_json::Map<String, Value> {
    let root = match obj {
        Value::Object(m) => m,
        other => {
            *other = json!({});
            match other {
                Value::Object(m) => m,
                _ => unreachable!("just made an object"),
            }
        }
    };
    let v = root.entry(field).or_insert(json!({}));
    if !v.is_object() {
        *v = json!({});
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_schema_defaults_fill_absent_fields_recursively() {
        let schema = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "default": "x"}}},
            "spec": {"type": "object", "properties": {
                "total": {"type": "integer", "default": 0},
                "policy": {"type": "object", "default": {}, "properties": {
                    "percent": {"type": "integer", "default": 50}}},
                "members": {"type": "array", "items": {"type": "object", "properties": {
                    "tier": {"type": "integer", "default": 0}}}},
                "set": {"type": "integer", "default": 7}
            }}
        }});
        let mut obj =
            json!({"metadata": {}, "spec": {"members": [{"name": "a"}, {"tier": 2}], "set": 3}});
        schema_defaults(&schema, &mut obj, true);
        assert_eq!(
            obj,
            json!({"metadata": {}, "spec": {
                "total": 0,
                "policy": {"percent": 50},
                "members": [{"name": "a", "tier": 0}, {"tier": 2}],
                "set": 3
            }})
        );
    }
}

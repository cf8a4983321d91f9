//! Defaulting of built-in kinds on create, the subset kedge and kubectl rely on.

use std::sync::atomic::{AtomicU32, Ordering};

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
        "Service" => service(obj),
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

/// A Secret's `stringData`, as the real API server stores it on every write: each key
/// base64-encoded into `data` (over a `data` key of the same name), and `stringData` itself
/// gone (it is write-only). Non-string values are left for validation to refuse.
pub fn fold_string_data(def: &ResourceDef, obj: &mut Value) {
    use base64::Engine as _;
    if def.crd || def.kind != "Secret" {
        return;
    }
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = root.get("stringData").cloned() else {
        return;
    };
    if strings.values().any(|v| !v.is_string()) {
        return;
    }
    root.remove("stringData");
    let data = root.entry("data").or_insert(json!({}));
    if data.is_null() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(key, json!(encoded));
        }
    }
}

/// Next cluster IP and node port handed out in this process (the API server's allocators).
static CLUSTER_IPS: AtomicU32 = AtomicU32::new(0);
static NODE_PORTS: AtomicU32 = AtomicU32::new(0);

/// A Service's defaults and allocations: type `ClusterIP`, a cluster IP from
/// `10.96.0.0/12` (an address only: nothing listens on it), single-stack IPv4, each port's
/// protocol `TCP` and `targetPort` its port, and a node port for each port of a NodePort or
/// LoadBalancer Service from `30000-32767`.
fn service(obj: &mut Value) {
    let spec = ensure_obj(obj, "spec");
    let ty = spec
        .entry("type")
        .or_insert(json!("ClusterIP"))
        .as_str()
        .unwrap_or_default()
        .to_owned();
    spec.entry("sessionAffinity").or_insert(json!("None"));
    if ty != "ExternalName" && !spec.contains_key("clusterIP") {
        let n = CLUSTER_IPS.fetch_add(1, Ordering::Relaxed) % ((1 << 20) - 2) + 1;
        let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) + n);
        spec.insert("clusterIP".into(), json!(ip.to_string()));
        spec.insert("clusterIPs".into(), json!([ip.to_string()]));
        spec.insert("ipFamilies".into(), json!(["IPv4"]));
        spec.insert("ipFamilyPolicy".into(), json!("SingleStack"));
    }
    let node_ports = matches!(ty.as_str(), "NodePort" | "LoadBalancer");
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert(json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                p.entry("targetPort").or_insert(port);
            }
            if node_ports && !p.contains_key("nodePort") {
                let n = 30000 + NODE_PORTS.fetch_add(1, Ordering::Relaxed) % 2768;
                p.insert("nodePort".into(), json!(n));
            }
        }
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
    fn string_data_is_folded_into_data_and_not_kept() {
        let defs = crate::resources::builtins();
        let secret = defs.iter().find(|d| d.kind == "Secret").unwrap();
        let mut obj = json!({"data": {"a": "b2xk", "keep": "eA=="},
            "stringData": {"a": "new", "b": "two"}});
        fold_string_data(secret, &mut obj);
        assert_eq!(
            obj,
            json!({"data": {"a": "bmV3", "keep": "eA==", "b": "dHdv"}})
        );
        // Without data; and a bad value is left for validation.
        let mut only = json!({"stringData": {"k": "v"}});
        fold_string_data(secret, &mut only);
        assert_eq!(only, json!({"data": {"k": "dg=="}}));
        let mut bad = json!({"stringData": {"k": 1}});
        fold_string_data(secret, &mut bad);
        assert_eq!(bad, json!({"stringData": {"k": 1}}));
        // Other kinds keep a field of that name.
        let map = defs.iter().find(|d| d.kind == "ConfigMap").unwrap();
        let mut cm = json!({"stringData": {"k": "v"}});
        fold_string_data(map, &mut cm);
        assert_eq!(cm, json!({"stringData": {"k": "v"}}));
    }

    #[test]
    fn services_get_a_cluster_ip_default_ports_and_node_ports_by_type() {
        let mut lb = json!({"spec": {"type": "LoadBalancer", "ports": [
            {"port": 7443, "protocol": "UDP", "targetPort": "quic"}, {"port": 80}]}});
        service(&mut lb);
        let ip = lb["spec"]["clusterIP"].as_str().expect("a cluster IP");
        assert!(ip.starts_with("10."), "{ip}");
        assert_eq!(lb["spec"]["clusterIPs"], json!([ip]));
        assert_eq!(lb["spec"]["ports"][0]["targetPort"], "quic", "kept");
        assert_eq!(lb["spec"]["ports"][1]["targetPort"], 80, "the port");
        assert_eq!(lb["spec"]["ports"][1]["protocol"], "TCP");
        for p in lb["spec"]["ports"].as_array().unwrap() {
            let n = p["nodePort"].as_i64().expect("a node port");
            assert!((30000..=32767).contains(&n), "{n}");
        }
        let mut plain = json!({"spec": {"ports": [{"port": 80}]}});
        service(&mut plain);
        assert_eq!(plain["spec"]["type"], "ClusterIP");
        assert!(plain["spec"]["ports"][0].get("nodePort").is_none());
        assert_ne!(
            plain["spec"]["clusterIP"], lb["spec"]["clusterIP"],
            "unique"
        );
        let mut headless = json!({"spec": {"clusterIP": "None"}});
        service(&mut headless);
        assert_eq!(headless["spec"]["clusterIP"], "None", "kept");
        let mut external = json!({"spec": {"type": "ExternalName", "externalName": "x.example"}});
        service(&mut external);
        assert!(external["spec"].get("clusterIP").is_none());
    }

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

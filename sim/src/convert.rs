//! Conversion between the served versions of a built-in kind. Like kube-apiserver, every
//! kind is stored in one version (the first of `ResourceDef::versions`) and each served
//! version is a view of that one stored object: writes are converted to the storage
//! version, reads to the version the client asked for. Kinds served in one version only
//! change their `apiVersion`.

use serde_json::{Map, Value, json};

use crate::resources::ResourceDef;

/// The v1 annotations that carry what `autoscaling/v1` has no field for, as in
/// `k8s.io/kubernetes/pkg/apis/autoscaling/v1/conversion.go`. kedge-sim writes the
/// `autoscaling/v2` JSON of the metrics into them (kube-apiserver writes the older
/// v1 `MetricSpec` shape); they round-trip either way.
const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";

/// The stored object as served in `version`.
pub fn to_served(def: &ResourceDef, version: &str, obj: &Value) -> Value {
    let want = def.api_version(version);
    if obj.get("apiVersion").and_then(Value::as_str) == Some(want.as_str()) {
        return obj.clone();
    }
    let mut o = match (def.group.as_str(), def.kind.as_str(), version) {
        ("autoscaling", "HorizontalPodAutoscaler", "v1") => hpa_v2_to_v1(obj),
        _ => obj.clone(),
    };
    o["apiVersion"] = json!(want);
    o
}

/// A written object (in the version its `apiVersion` names, else `version`) in the
/// storage version.
pub fn to_stored(def: &ResourceDef, version: &str, obj: &Value) -> Value {
    let storage = def.api_version(def.version());
    let from = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| def.api_version(version));
    if from == storage || !obj.is_object() {
        return obj.clone();
    }
    let mut o = match (def.kind.as_str(), from.as_str()) {
        ("HorizontalPodAutoscaler", "autoscaling/v1") => hpa_v1_to_v2(obj),
        _ => obj.clone(),
    };
    o["apiVersion"] = json!(storage);
    o
}

fn is_cpu_utilization(m: &Value, target: &str) -> Option<i64> {
    let r = m.get("resource")?;
    (m.get("type")? == "Resource" && r.get("name")? == "cpu").then_some(())?;
    let t = r.get(target)?;
    if target == "target" && t.get("type")? != "Utilization" {
        return None;
    }
    t.get("averageUtilization")?.as_i64()
}

/// The CPU utilization among the metrics in `list`; the other metrics go into a JSON
/// annotation.
fn split_metrics(
    list: Option<&Value>,
    target: &str,
    annotation: &str,
    notes: &mut Map<String, Value>,
) -> Option<i64> {
    let mut cpu = None;
    let mut other = Vec::new();
    for m in list.and_then(Value::as_array).into_iter().flatten() {
        match is_cpu_utilization(m, target) {
            Some(p) if cpu.is_none() => cpu = Some(p),
            _ => other.push(m.clone()),
        }
    }
    if !other.is_empty() {
        notes.insert(annotation.into(), json!(Value::Array(other).to_string()));
    }
    cpu
}

fn hpa_v2_to_v1(obj: &Value) -> Value {
    let mut o = obj.clone();
    let mut notes = Map::new();
    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
        let cpu = split_metrics(
            spec.remove("metrics").as_ref(),
            "target",
            METRICS,
            &mut notes,
        );
        if let Some(p) = cpu {
            spec.insert("targetCPUUtilizationPercentage".into(), json!(p));
        }
        if let Some(b) = spec.remove("behavior") {
            notes.insert(BEHAVIOR.into(), json!(b.to_string()));
        }
    }
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
        let current = status.remove("currentMetrics");
        let cpu = split_metrics(current.as_ref(), "current", CURRENT_METRICS, &mut notes);
        if let Some(p) = cpu {
            status.insert("currentCPUUtilizationPercentage".into(), json!(p));
        }
        if let Some(c) = status.remove("conditions") {
            notes.insert(CONDITIONS.into(), json!(c.to_string()));
        }
    }
    if !notes.is_empty() {
        let meta = o
            .as_object_mut()
            .map(|m| m.entry("metadata").or_insert_with(|| json!({})));
        if let Some(Value::Object(meta)) = meta {
            let ann = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(ann) = ann.as_object_mut() {
                ann.extend(notes);
            }
        }
    }
    o
}

/// Takes a JSON annotation back out of the object's annotations.
fn take_note(o: &mut Value, key: &str) -> Option<Value> {
    let ann = o.pointer_mut("/metadata/annotations")?.as_object_mut()?;
    let raw = ann.remove(key)?;
    let v = raw.as_str().and_then(|s| serde_json::from_str(s).ok());
    if ann.is_empty()
        && let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.remove("annotations");
    }
    v
}

fn hpa_v1_to_v2(obj: &Value) -> Value {
    let mut o = obj.clone();
    let other = take_note(&mut o, METRICS);
    let behavior = take_note(&mut o, BEHAVIOR);
    let current_other = take_note(&mut o, CURRENT_METRICS);
    let conditions = take_note(&mut o, CONDITIONS);
    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
        let mut metrics = Vec::new();
        if let Some(p) = spec.remove("targetCPUUtilizationPercentage") {
            metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": p}}}));
        }
        metrics.extend(
            other
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default(),
        );
        if !metrics.is_empty() {
            spec.insert("metrics".into(), Value::Array(metrics));
        }
        if let Some(b) = behavior {
            spec.insert("behavior".into(), b);
        }
    }
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
        let mut current = Vec::new();
        if let Some(p) = status.remove("currentCPUUtilizationPercentage") {
            current.push(json!({"type": "Resource", "resource": {"name": "cpu",
                "current": {"averageUtilization": p}}}));
        }
        current.extend(
            current_other
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default(),
        );
        if !current.is_empty() {
            status.insert("currentMetrics".into(), Value::Array(current));
        }
        if let Some(c) = conditions {
            status.insert("conditions".into(), c);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa() -> ResourceDef {
        crate::resources::builtins()
            .into_iter()
            .find(|d| d.kind == "HorizontalPodAutoscaler")
            .expect("HPA is built in")
    }

    fn v2() -> Value {
        json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1, "maxReplicas": 3,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": 50}}}],
            },
            "status": {"currentReplicas": 2, "desiredReplicas": 2,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": 40}}}]},
        })
    }

    #[test]
    fn hpa_v2_is_stored_and_served_as_v1() {
        let v1 = to_served(&hpa(), "v1", &v2());
        assert_eq!(v1["apiVersion"], "autoscaling/v1");
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
        assert_eq!(v1["spec"]["maxReplicas"], 3);
        assert!(v1["spec"].get("metrics").is_none());
        assert_eq!(v1["status"]["currentCPUUtilizationPercentage"], 40);
        assert!(v1["metadata"].get("annotations").is_none(), "{v1}");
        assert_eq!(to_stored(&hpa(), "v1", &v1), v2());
    }

    #[test]
    fn hpa_v1_is_stored_as_v2() {
        let v1 = json!({
            "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                "maxReplicas": 3, "targetCPUUtilizationPercentage": 50},
        });
        let stored = to_stored(&hpa(), "v1", &v1);
        assert_eq!(stored["apiVersion"], "autoscaling/v2");
        assert_eq!(
            stored["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            50
        );
        assert!(
            stored["spec"]
                .get("targetCPUUtilizationPercentage")
                .is_none()
        );
        assert_eq!(to_served(&hpa(), "v1", &stored), v1);
    }

    #[test]
    fn what_v1_cannot_say_survives_in_annotations() {
        let mut obj = v2();
        obj["spec"]["metrics"]
            .as_array_mut()
            .expect("metrics")
            .push(json!({"type": "Pods", "pods": {"metric": {"name": "qps"},
                "target": {"type": "AverageValue", "averageValue": "10"}}}));
        obj["spec"]["behavior"] = json!({"scaleDown": {"stabilizationWindowSeconds": 60}});
        obj["status"]["conditions"] = json!([{"type": "AbleToScale", "status": "True"}]);
        let v1 = to_served(&hpa(), "v1", &obj);
        let ann = &v1["metadata"]["annotations"];
        assert!(
            ann[METRICS].as_str().is_some_and(|s| s.contains("qps")),
            "{v1}"
        );
        assert!(
            ann[BEHAVIOR].is_string() && ann[CONDITIONS].is_string(),
            "{v1}"
        );
        assert_eq!(to_stored(&hpa(), "v1", &v1), obj);
    }

    #[test]
    fn single_version_kinds_only_change_api_version() {
        let def = crate::resources::builtins()
            .into_iter()
            .find(|d| d.kind == "Deployment")
            .expect("Deployment is built in");
        let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}});
        assert_eq!(to_stored(&def, "v1", &obj), obj);
        assert_eq!(to_served(&def, "v1", &obj), obj);
    }
}

//! KEDA emulation: an HPA-like loop per `keda.sh/v1alpha1` ScaledObject that
//! writes the target's `/scale`, and the external metrics API serving the
//! trigger values like KEDA's metrics server.
//!
//! `external` triggers call a gRPC scaler ([`external`], `grpc`); the loop here only reads
//! their last answers, so it never waits on the network under the store lock.

mod auth;
pub mod external;
pub(crate) mod grpc;

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::cluster::{Cluster, ClusterShared};
use crate::controllers::timers::Timers;
use crate::error::{Error, Result};
use crate::selector::LabelSelector;
use crate::store::{Store, WriteScope, deleting};
use crate::util::{get_path, meta_mut, meta_str, rfc3339, set_path};

pub use auth::KEDA_NAMESPACE;
pub use external::Scalers;
pub use grpc::CALL_TIMEOUT;

/// API group of the external metrics API.
pub const METRICS_GROUP: &str = "external.metrics.k8s.io";
const SCALED_OBJECTS: &str = "keda.sh/scaledobjects";
/// Label KEDA's metrics server selects ScaledObjects by.
pub const SO_LABEL: &str = "scaledobject.keda.sh/name";
/// The trigger type that calls a scaler over gRPC.
const EXTERNAL: &str = "external";

/// KEDA's CRDs as YAML: ScaledObject, TriggerAuthentication, ClusterTriggerAuthentication.
pub const CRDS: [&str; 3] = [
    include_str!("../assets/scaledobject-crd.yaml"),
    include_str!("../assets/triggerauthentication-crd.yaml"),
    include_str!("../assets/clustertriggerauthentication-crd.yaml"),
];

/// Installs KEDA in a cluster as far as the simulator emulates it: its [`CRDS`] and its
/// namespace [`KEDA_NAMESPACE`], written straight to the store (existing ones are replaced).
pub fn install(cluster: &Cluster) -> Result<()> {
    for crd in CRDS {
        let crd: Value = serde_yaml::from_str(crd)
            .map_err(|e| Error::Internal(format!("KEDA CRD YAML: {e}")))?;
        cluster.put_object(crd)?;
    }
    if cluster
        .object("v1", "Namespace", "", KEDA_NAMESPACE)
        .is_none()
    {
        cluster.put_object(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": KEDA_NAMESPACE}}))?;
    }
    Ok(())
}

/// Test-set trigger values: (namespace, ScaledObject, trigger key) → value.
pub type MetricOverrides = HashMap<(String, String, String), f64>;

/// Per-cluster KEDA loop state.
#[derive(Debug, Default)]
pub struct KedaState {
    last_poll: HashMap<String, i64>,
    last_overrides: MetricOverrides,
    /// The external scalers' answers each ScaledObject was last polled with ([`Scalers::seq`]).
    answers: HashMap<String, u64>,
    /// A ScaledObject waits for its external scalers' first answers.
    waiting: bool,
}

impl KedaState {
    /// Whether any ScaledObject is being polled (keeps the loop ticking).
    pub fn has_work(&self) -> bool {
        !self.last_poll.is_empty() || self.waiting
    }
}

/// One trigger's current reading.
#[derive(Debug, Clone)]
pub struct TriggerValue {
    /// Metric name, `s{index}-{type}[-{resourceName}]`; an external trigger's is
    /// `s{index}-{metric name from GetMetricSpec}` once its scaler has answered.
    pub metric: String,
    /// Current value, if it could be read.
    pub value: Option<f64>,
    /// Target (average) value per replica.
    pub target: Option<f64>,
    /// Activation threshold.
    pub activation: f64,
    /// Activity as the scaler reports it (`IsActive`); `None`: value above `activation`.
    pub active: Option<bool>,
    /// Why the value could not be read, when known.
    pub error: Option<String>,
    /// An external trigger whose scaler has not answered yet.
    pub pending: bool,
}

/// The ScaledObject's `pollingInterval` in milliseconds (KEDA's default 30 s).
fn polling_interval_ms(so: &Value) -> i64 {
    get_path(so, "spec.pollingInterval")
        .and_then(Value::as_i64)
        .unwrap_or(30)
        .clamp(1, 86_400)
        * 1000
}

fn triggers(so: &Value) -> &[Value] {
    get_path(so, "spec.triggers")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The scaler targets of every external trigger the store's ScaledObjects have (those that
/// cannot be built are reported by [`trigger_values`] instead).
fn external_targets(store: &Store, sos: &[crate::store::Obj]) -> external::Targets {
    let mut targets = external::Targets::new();
    for so in sos.iter().filter(|so| !deleting(so)) {
        let ns = meta_str(so, "namespace").unwrap_or_default();
        let name = meta_str(so, "name").unwrap_or_default();
        for (i, t) in triggers(so).iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some(EXTERNAL) {
                continue;
            }
            if let Ok(target) = external::ScalerTarget::of(store, so, t, polling_interval_ms(so)) {
                targets.insert((ns.to_string(), name.to_string(), i), target);
            }
        }
    }
    targets
}

/// Reads every trigger of a ScaledObject.
pub fn trigger_values(
    store: &Store,
    so: &Value,
    overrides: &MetricOverrides,
    scalers: &Scalers,
) -> Vec<TriggerValue> {
    triggers(so)
        .iter()
        .enumerate()
        .map(|(i, t)| trigger_value(store, so, i, t, overrides, scalers))
        .collect()
}

fn trigger_value(
    store: &Store,
    so: &Value,
    i: usize,
    t: &Value,
    overrides: &MetricOverrides,
    scalers: &Scalers,
) -> TriggerValue {
    let ns = meta_str(so, "namespace").unwrap_or_default();
    let name = meta_str(so, "name").unwrap_or_default();
    let ty = t.get("type").and_then(Value::as_str).unwrap_or("unknown");
    let md = t.get("metadata").cloned().unwrap_or(json!({}));
    let mdv = |k: &str| {
        md.get(k).and_then(|v| {
            v.as_str()
                .map(str::to_string)
                .or_else(|| v.as_f64().map(|f| f.to_string()))
        })
    };
    let num = |k: &str| mdv(k).and_then(|s| s.trim().parse::<f64>().ok());
    let mut value = TriggerValue {
        metric: match (ty, mdv("resourceName")) {
            ("kubernetes-resource", Some(r)) => format!("s{i}-{ty}-{r}"),
            _ => format!("s{i}-{ty}"),
        },
        value: None,
        target: num("targetValue")
            .or_else(|| num("value"))
            .or_else(|| num("threshold"))
            .filter(|t| *t > 0.0),
        activation: num("activationTargetValue")
            .or_else(|| num("activationValue"))
            .or_else(|| num("activationThreshold"))
            .unwrap_or(0.0),
        active: None,
        error: None,
        pending: false,
    };
    // An external trigger's metric and target are its scaler's (GetMetricSpec).
    let reading = (ty == EXTERNAL).then(|| scalers.reading(&(ns.into(), name.into(), i)));
    if let Some(Some(Ok(sample))) = &reading {
        value.metric = format!("s{i}-{}", sample.metric);
        value.target = Some(sample.target);
    }
    let key = |k: &str| (ns.to_string(), name.to_string(), k.to_string());
    let overridden = t
        .get("name")
        .and_then(Value::as_str)
        .and_then(|n| overrides.get(&key(n)))
        .or_else(|| overrides.get(&key(&i.to_string())))
        .or_else(|| overrides.get(&key(&value.metric)))
        .copied();
    if overridden.is_some() {
        value.value = overridden;
        return value;
    }
    match (ty, reading) {
        ("kubernetes-resource", _) => {
            let kind = mdv("resourceKind").unwrap_or_else(|| "ConfigMap".into());
            let key = if kind == "Secret" {
                "/secrets"
            } else {
                "/configmaps"
            };
            value.value = (|| {
                let obj = store.get(key, ns, &mdv("resourceName")?)?;
                let raw = obj.get("data")?.get(mdv("key")?)?.as_str()?;
                raw.trim().parse::<f64>().ok()
            })();
        }
        (_, Some(reading)) => {
            // The same derivation as the published target's: a trigger KEDA cannot build a
            // scaler for reports why.
            match external::ScalerTarget::of(store, so, t, polling_interval_ms(so)) {
                Err(e) => value.error = Some(e),
                Ok(_) => match reading {
                    None => value.pending = true,
                    Some(Ok(sample)) => {
                        value.value = Some(sample.value);
                        value.active = Some(sample.active);
                    }
                    Some(Err(e)) => value.error = Some(e),
                },
            }
        }
        _ => {}
    }
    value
}

/// Polls ScaledObjects whose polling interval has passed and writes `/scale` of their targets.
pub(crate) fn reconcile(
    store: &mut Store,
    st: &mut KedaState,
    overrides: &MetricOverrides,
    scalers: &Scalers,
    now: i64,
    timers: &mut Timers,
) {
    st.waiting = false;
    if store.def(SCALED_OBJECTS).is_none() {
        st.last_poll.clear();
        st.answers.clear();
        scalers.set_targets(external::Targets::new());
        return;
    }
    let sos: Vec<_> = store.list(SCALED_OBJECTS, None).cloned().collect();
    scalers.set_targets(external_targets(store, &sos));
    // A value set by a test applies on the next loop, not after a full interval.
    let overrides_changed = st.last_overrides != *overrides;
    if overrides_changed {
        st.last_overrides = overrides.clone();
    }
    let live = |uid: &String| sos.iter().any(|s| meta_str(s, "uid") == Some(uid.as_str()));
    st.last_poll.retain(|uid, _| live(uid));
    st.answers.retain(|uid, _| live(uid));
    for so in sos {
        if deleting(&so) {
            continue;
        }
        let uid = meta_str(&so, "uid").unwrap_or_default().to_string();
        let interval = polling_interval_ms(&so);
        let generation = get_path(&so, "metadata.generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let observed = get_path(&so, "status.observedGeneration").and_then(Value::as_i64);
        let answers = scalers.seq(
            meta_str(&so, "namespace").unwrap_or_default(),
            meta_str(&so, "name").unwrap_or_default(),
        );
        let due = st
            .last_poll
            .get(&uid)
            .is_none_or(|t| now >= t.saturating_add(interval))
            || observed != Some(generation)
            || overrides_changed
            // A scaler's new answer applies at once, as KEDA's own poll would have seen it.
            || st.answers.get(&uid) != Some(&answers);
        if !due {
            if let Some(t) = st.last_poll.get(&uid) {
                timers.at(t.saturating_add(interval));
            }
            continue;
        }
        let values = trigger_values(store, &so, overrides, scalers);
        if values.iter().any(|v| v.pending) {
            // KEDA calls its scalers before it decides; their first answers wake this loop.
            st.waiting = true;
            continue;
        }
        st.answers.insert(uid.clone(), answers);
        st.last_poll.insert(uid, now);
        timers.at(now.saturating_add(interval));
        poll(store, &so, &values, now);
    }
}

fn poll(store: &mut Store, so: &Value, values: &[TriggerValue], now: i64) {
    let ns = meta_str(so, "namespace").unwrap_or_default().to_string();
    let min = get_path(so, "spec.minReplicaCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let max = get_path(so, "spec.maxReplicaCount")
        .and_then(Value::as_i64)
        .unwrap_or(100);
    let readable: Vec<&TriggerValue> = values
        .iter()
        .filter(|v| v.value.is_some() && v.target.is_some())
        .collect();
    let active = readable.iter().any(|v| {
        v.active
            .unwrap_or_else(|| v.value.unwrap_or(0.0) > v.activation)
    });
    let current = current_replicas(store, so, &ns);
    let tolerance = Tolerance::of(so);
    let desired = if active {
        let want = readable
            .iter()
            .map(|v| tolerance.proposal(v.value.unwrap_or(0.0), v.target.unwrap_or(1.0), current))
            .max()
            .unwrap_or(0);
        want.clamp(min.max(1), max.max(min.max(1)))
    } else {
        get_path(so, "spec.idleReplicaCount")
            .and_then(Value::as_i64)
            .unwrap_or(min)
    };
    let (api_version, kind, target_name) = scale_target(so);
    let mut ready = (
        true,
        "ScaledObjectReady",
        "ScaledObject is defined correctly and is ready for scaling".to_string(),
    );
    let mut original = None;
    match store.def_for_kind(api_version, kind) {
        Some(def) if def.scale.is_some() => match store.get(&def.key, &ns, target_name).cloned() {
            Some(target) => {
                let path = def
                    .scale
                    .as_ref()
                    .map(|s| s.spec_replicas.clone())
                    .unwrap_or_default();
                let current = get_path(&target, &path).and_then(Value::as_i64);
                original = current;
                let readable_any = !readable.is_empty() || values.is_empty();
                if readable_any && current != Some(desired) {
                    let mut new = (*target).clone();
                    set_path(&mut new, &path, json!(desired));
                    // The HPA writes through /scale as kube-controller-manager.
                    let mut new = crate::patch::apply::record_update(
                        &target,
                        &new,
                        "kube-controller-manager",
                        "Update",
                        Some("scale"),
                        &rfc3339(now),
                    );
                    meta_mut(&mut new).remove("resourceVersion");
                    let _ = store.update(&def, &ns, target_name, new, WriteScope::Main, now);
                }
                if !readable_any {
                    ready = (false, "KEDAScalerFailed", scaler_errors(values));
                }
            }
            None => {
                ready = (
                    false,
                    "ScaledObjectCheckFailed",
                    format!(
                        "ScaledObject doesn't have correct scaleTargetRef specification: {kind} {target_name} not found"
                    ),
                )
            }
        },
        _ => {
            ready = (
                false,
                "ScaledObjectCheckFailed",
                format!(
                    "ScaledObject doesn't have correct scaleTargetRef specification: {api_version} {kind} has no /scale subresource"
                ),
            )
        }
    }
    let old = so.get("status").cloned().unwrap_or(json!({}));
    let cond = |t: &str, ok: bool, reason: &str, msg: &str| {
        let status = if ok { "True" } else { "False" };
        json!({"type": t, "status": status, "reason": reason, "message": msg})
    };
    let mut status = old.clone();
    if !status.is_object() {
        status = json!({});
    }
    status["conditions"] = json!([
        cond("Ready", ready.0, ready.1, &ready.2),
        cond(
            "Active",
            active,
            if active {
                "ScalerActive"
            } else {
                "ScalerNotActive"
            },
            if active {
                "Scaling is performed because triggers are active"
            } else {
                "Scaling is not performed because triggers are not active"
            }
        ),
        cond(
            "Fallback",
            false,
            "NoFallbackFound",
            "No fallbacks are active on this scaled object"
        ),
        cond(
            "Paused",
            false,
            "ScaledObjectUnpaused",
            "ScaledObject is not paused"
        ),
    ]);
    status["externalMetricNames"] =
        json!(values.iter().map(|v| v.metric.clone()).collect::<Vec<_>>());
    status["scaleTargetKind"] = json!(format!("{api_version}.{kind}"));
    status["hpaName"] = json!(format!(
        "keda-hpa-{}",
        meta_str(so, "name").unwrap_or_default()
    ));
    status["observedGeneration"] = get_path(so, "metadata.generation")
        .cloned()
        .unwrap_or(json!(1));
    if old.get("originalReplicaCount").is_none()
        && let Some(o) = original
    {
        status["originalReplicaCount"] = json!(o);
    }
    if active {
        status["lastActiveTime"] = json!(rfc3339(now));
    }
    if status == old {
        return;
    }
    if let Some(def) = store.def(SCALED_OBJECTS) {
        let mut new = so.clone();
        new["status"] = status;
        meta_mut(&mut new).remove("resourceVersion");
        let name = meta_str(so, "name").unwrap_or_default().to_string();
        let _ = store.update(&def, &ns, &name, new, WriteScope::Internal, now);
    }
}

/// The Ready condition's message when no trigger could be read: each trigger's error.
fn scaler_errors(values: &[TriggerValue]) -> String {
    let errors: Vec<String> = values
        .iter()
        .filter_map(|v| Some(format!("{}: {}", v.metric, v.error.as_ref()?)))
        .collect();
    if errors.is_empty() {
        "no trigger value could be read".into()
    } else {
        errors.join("; ")
    }
}

/// `spec.scaleTargetRef`'s API version, kind and name, with KEDA's defaults (an `apps/v1`
/// Deployment).
fn scale_target(so: &Value) -> (&str, &str, &str) {
    let field = |key: &str, default: &'static str| {
        get_path(so, &format!("spec.scaleTargetRef.{key}"))
            .and_then(Value::as_str)
            .unwrap_or(default)
    };
    (
        field("apiVersion", "apps/v1"),
        field("kind", "Deployment"),
        field("name", ""),
    )
}

/// The replicas the target's `/scale` holds now (`None`: no target, or not read).
fn current_replicas(store: &Store, so: &Value, ns: &str) -> Option<i64> {
    let (api_version, kind, name) = scale_target(so);
    let def = store.def_for_kind(api_version, kind)?;
    let path = &def.scale.as_ref()?.spec_replicas;
    let target = store.get(&def.key, ns, name)?;
    get_path(target, path).and_then(Value::as_i64)
}

/// The HPA's tolerance around a target, per direction as Kubernetes 1.33 reads it
/// (`behavior.scaleUp.tolerance`, `behavior.scaleDown.tolerance`; each defaults to the
/// controller-wide 10%): while the usage ratio stays within `[1 - down, 1 + up]` the
/// replicas do not change.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tolerance {
    down: f64,
    up: f64,
}

impl Tolerance {
    const DEFAULT: f64 = 0.1;

    fn of(so: &Value) -> Tolerance {
        let read = |direction: &str| {
            let path = format!(
                "spec.advanced.horizontalPodAutoscalerConfig.behavior.{direction}.tolerance"
            );
            let value = get_path(so, &path)?;
            let millis = match value {
                Value::String(s) => kedge_core::quantity::parse_quantity(s).ok()?,
                other => (other.as_f64()? * 1000.0).round() as i128,
            };
            (millis >= 0).then(|| millis as f64 / 1000.0)
        };
        Tolerance {
            down: read("scaleDown").unwrap_or(Self::DEFAULT),
            up: read("scaleUp").unwrap_or(Self::DEFAULT),
        }
    }

    /// The replicas an `AverageValue` target proposes: the current count while the usage
    /// ratio is within the tolerance, else `ceil(value / target)`.
    fn proposal(self, value: f64, target: f64, current: Option<i64>) -> i64 {
        let wanted = (value / target).ceil() as i64;
        match current {
            Some(current) if current > 0 => {
                let ratio = value / (target * current as f64);
                if ratio >= 1.0 - self.down && ratio <= 1.0 + self.up {
                    current
                } else {
                    wanted
                }
            }
            _ => wanted,
        }
    }
}

/// Discovery document of `external.metrics.k8s.io/v1beta1`.
pub fn metrics_discovery() -> Value {
    json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{METRICS_GROUP}/v1beta1"),
        "resources": [{"name": "externalmetrics", "singularName": "", "namespaced": true, "kind": "ExternalMetricValueList", "verbs": ["get"]}],
    })
}

/// `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/METRIC?labelSelector=scaledobject.keda.sh/name=X`.
pub fn external_metric(c: &ClusterShared, ns: &str, metric: &str, selector: &str) -> Result<Value> {
    let sel = LabelSelector::parse(selector)?;
    let overrides = c.metrics.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let store = c.store();
    let sos: Vec<_> = store
        .list(SCALED_OBJECTS, Some(ns))
        .filter(|so| {
            let name = meta_str(so, "name").unwrap_or_default();
            let labels = [(SO_LABEL.to_string(), name.to_string())]
                .into_iter()
                .collect();
            sel.matches(&labels)
        })
        .cloned()
        .collect();
    if sos.is_empty() {
        return Err(Error::NotFound(format!(
            "unable to get external metric {ns}/{metric}/&LabelSelector{{{selector}}}: no ScaledObject matches"
        )));
    }
    let mut items = Vec::new();
    for so in &sos {
        for v in trigger_values(&store, so, &overrides, &c.scalers) {
            if v.metric == metric {
                let value = v
                    .value
                    .ok_or_else(|| Error::Internal(format!("unable to read metric {metric}")))?;
                items.push(json!({
                    "metricName": metric, "metricLabels": null,
                    "timestamp": rfc3339(c.now()),
                    "value": quantity(value),
                }));
            }
        }
    }
    if items.is_empty() {
        return Err(Error::NotFound(format!(
            "no metric {metric} for the selected ScaledObject"
        )));
    }
    Ok(
        json!({"kind": "ExternalMetricValueList", "apiVersion": format!("{METRICS_GROUP}/v1beta1"), "metadata": {}, "items": items}),
    )
}

/// Formats a value like a Kubernetes quantity (`5`, `5500m`).
fn quantity(v: f64) -> String {
    let milli = (v * 1000.0).round() as i64;
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Tolerance;

    #[test]
    fn the_tolerance_reads_per_direction_with_the_controller_default() {
        let so = json!({"spec": {"advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"tolerance": "100m"}, "scaleDown": {"tolerance": 0.5}}}}}});
        assert_eq!(Tolerance::of(&so), Tolerance { down: 0.5, up: 0.1 });
        let so = json!({"spec": {"advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"tolerance": "0.25"}}}}}});
        assert_eq!(
            Tolerance::of(&so),
            Tolerance {
                down: 0.1,
                up: 0.25
            }
        );
        assert_eq!(Tolerance::of(&json!({})), Tolerance { down: 0.1, up: 0.1 });
    }

    #[test]
    fn inside_the_dead_zone_nothing_changes_and_outside_it_the_hpa_rule_applies() {
        // Kaito's example: up above threshold x 1.1, down below threshold x 0.5.
        let t = Tolerance { down: 0.5, up: 0.1 };
        // 4 pods at threshold 10: a total of 20..=44 (an average of 5..=11) changes nothing.
        assert_eq!(t.proposal(43.6, 10.0, Some(4)), 4);
        assert_eq!(t.proposal(20.0, 10.0, Some(4)), 4);
        assert_eq!(t.proposal(44.4, 10.0, Some(4)), 5);
        assert_eq!(t.proposal(19.6, 10.0, Some(4)), 2);
        // Without a current count the plain rule applies.
        assert_eq!(t.proposal(44.0, 10.0, Some(0)), 5);
        assert_eq!(t.proposal(44.0, 10.0, None), 5);
    }
}

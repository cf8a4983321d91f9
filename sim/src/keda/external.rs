//! KEDA's `external` trigger (`pkg/scalers/external_scaler.go`): what the KEDA loop calls an
//! external scaler with, and each trigger's last answer.
//!
//! The KEDA loop runs under the store lock, so it never calls a scaler: it derives every
//! external trigger's [`ScalerTarget`] from the store and publishes them (`Scalers::set_targets`);
//! `super::grpc` calls each target every polling interval, off the lock, and records the
//! answer here; the loop reads the answers ([`Scalers::reading`]) and is woken when one changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{Notify, watch};

use super::auth::auth_params;
use crate::store::Store;
use crate::util::meta_str;

/// An external trigger: (namespace, ScaledObject, trigger index).
pub type TriggerKey = (String, String, usize);

/// Every external trigger the KEDA loop wants called.
pub type Targets = BTreeMap<TriggerKey, ScalerTarget>;

/// How one external trigger is called: everything that, when it changes, makes the next call
/// a new one (at once, on a channel for the new address and TLS material).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScalerTarget {
    /// `metadata.scalerAddress`, `host:port`.
    pub address: String,
    /// The ScaledObject's name, sent in `ScaledObjectRef`.
    pub name: String,
    /// The ScaledObject's namespace, sent in `ScaledObjectRef`.
    pub namespace: String,
    /// The trigger's whole `metadata`, sent as `scalerMetadata`.
    pub metadata: BTreeMap<String, String>,
    /// `None`: plaintext HTTP/2 (h2c).
    pub tls: Option<TlsMaterial>,
    /// The ScaledObject's `pollingInterval`, in simulated milliseconds.
    pub interval_ms: i64,
}

/// What a TLS connection to a scaler is made with (KEDA's `util.NewTLSConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsMaterial {
    /// The host of `scalerAddress`: the name the server's certificate must carry.
    pub server_name: String,
    /// `caCert` (PEM): the roots the server is verified against. The simulator has no
    /// system roots, so without it only `unsafeSsl` connects.
    pub ca: Option<String>,
    /// `tlsClientCert` and `tlsClientKey` (PEM): mutual TLS.
    pub identity: Option<(String, String)>,
    /// `metadata.unsafeSsl`: the server's certificate is not verified.
    pub skip_verify: bool,
}

impl ScalerTarget {
    /// The target of the ScaledObject's trigger, or the message KEDA's condition would carry
    /// for a trigger it cannot build a scaler for.
    pub(crate) fn of(
        store: &Store,
        so: &Value,
        trigger: &Value,
        interval_ms: i64,
    ) -> Result<ScalerTarget, String> {
        let namespace = meta_str(so, "namespace").unwrap_or_default().to_string();
        let name = meta_str(so, "name").unwrap_or_default().to_string();
        let metadata = string_map(trigger.get("metadata"))?;
        let address = metadata
            .get("scalerAddress")
            .filter(|a| !a.is_empty())
            .ok_or("error parsing external scaler metadata: missing required parameter \"scalerAddress\" in [triggerMetadata]")?
            .clone();
        let host = host_of(&address).ok_or_else(|| {
            format!(
                "error parsing external scaler metadata: scalerAddress {address:?} is not host:port"
            )
        })?;
        let params = auth_params(store, &namespace, trigger)?;
        let param = |k: &str| params.get(k).filter(|v| !v.is_empty()).cloned();
        let identity = match (param("tlsClientCert"), param("tlsClientKey")) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("tlsClientCert and tlsClientKey must be given together".into()),
        };
        let ca = param("caCert");
        let enable_tls = flag(&metadata, "enableTLS")?;
        let skip_verify = flag(&metadata, "unsafeSsl")?;
        let tls = (enable_tls || ca.is_some() || identity.is_some()).then(|| TlsMaterial {
            server_name: host.to_string(),
            ca,
            identity,
            skip_verify,
        });
        Ok(ScalerTarget {
            address,
            name,
            namespace,
            metadata,
            tls,
            interval_ms,
        })
    }
}

/// A trigger's `metadata`: KEDA's is a `map[string]string`; numbers and booleans written
/// unquoted in YAML are taken as their text.
fn string_map(v: Option<&Value>) -> Result<BTreeMap<String, String>, String> {
    let Some(map) = v.filter(|v| !v.is_null()) else {
        return Ok(BTreeMap::new());
    };
    let map = map.as_object().ok_or("trigger metadata is not a map")?;
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => continue,
            _ => return Err(format!("trigger metadata {k:?} is not a string")),
        };
        out.insert(k.clone(), text);
    }
    Ok(out)
}

/// A boolean setting as Go's `strconv.ParseBool` reads it; absent is false.
fn flag(metadata: &BTreeMap<String, String>, key: &str) -> Result<bool, String> {
    match metadata.get(key).map(String::as_str) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(format!(
            "error parsing external scaler metadata: {key}: invalid boolean {other:?}"
        )),
    }
}

/// The host of `host:port` (`[v6]:port` gives `v6`); `None` without a port.
fn host_of(address: &str) -> Option<&str> {
    let (host, port) = address.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then_some(host)
}

/// One poll's answer: `GetMetricSpec`'s first metric, its `GetMetrics` value and `IsActive`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric's name as the scaler gives it (KEDA prefixes `s{index}-`).
    pub metric: String,
    /// `metricValueFloat`, else `metricValue` (summed over the values returned, as the HPA
    /// sums an external metric's items).
    pub value: f64,
    /// `targetSizeFloat`, else `targetSize`: the value per replica.
    pub target: f64,
    /// `IsActive`.
    pub active: bool,
}

/// A trigger's last answer, or the error of its last poll.
pub type Reading = Result<Sample, String>;

#[derive(Debug, Default)]
struct Readings {
    /// Bumped on every change, so the KEDA loop sees that a ScaledObject's answers changed.
    seq: u64,
    by_so: HashMap<(String, String), SoReadings>,
}

#[derive(Debug, Default)]
struct SoReadings {
    seq: u64,
    triggers: BTreeMap<usize, Reading>,
}

/// One cluster's external scalers: the targets the KEDA loop publishes, their last answers
/// and call counts (the gRPC channels belong to `super::grpc`'s task).
#[derive(Debug)]
pub struct Scalers {
    targets: watch::Sender<Arc<Targets>>,
    readings: Mutex<Readings>,
    calls: Mutex<HashMap<(String, String), u64>>,
    clock_moved: Notify,
}

impl Default for Scalers {
    fn default() -> Self {
        Scalers {
            targets: watch::Sender::new(Arc::new(Targets::new())),
            readings: Mutex::default(),
            calls: Mutex::default(),
            clock_moved: Notify::new(),
        }
    }
}

/// The maps stay consistent through a panic elsewhere (each operation is a lookup, an insert
/// or a remove), so a poisoned lock is recovered.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Scalers {
    /// Publishes the external triggers to call (a no-op when they did not change).
    pub(crate) fn set_targets(&self, targets: Targets) {
        self.targets.send_if_modified(|current| {
            if **current == targets {
                return false;
            }
            *current = Arc::new(targets);
            true
        });
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Arc<Targets>> {
        self.targets.subscribe()
    }

    /// The trigger's last answer (`None`: not called yet).
    pub fn reading(&self, key: &TriggerKey) -> Option<Reading> {
        let readings = lock(&self.readings);
        let so = readings.by_so.get(&(key.0.clone(), key.1.clone()))?;
        so.triggers.get(&key.2).cloned()
    }

    /// Changes whenever one of the ScaledObject's answers changes.
    pub(crate) fn seq(&self, namespace: &str, name: &str) -> u64 {
        let readings = lock(&self.readings);
        readings
            .by_so
            .get(&(namespace.to_string(), name.to_string()))
            .map_or(0, |so| so.seq)
    }

    /// Records an answer for `target`; `true` when it changed the trigger's reading. An answer
    /// for a target that has been replaced meanwhile is dropped.
    pub(super) fn record(&self, key: &TriggerKey, target: &ScalerTarget, reading: Reading) -> bool {
        if self.targets.borrow().get(key) != Some(target) {
            return false;
        }
        let mut readings = lock(&self.readings);
        let readings = &mut *readings;
        let so = readings
            .by_so
            .entry((key.0.clone(), key.1.clone()))
            .or_default();
        if so.triggers.get(&key.2) == Some(&reading) {
            return false;
        }
        so.triggers.insert(key.2, reading);
        readings.seq += 1;
        so.seq = readings.seq;
        true
    }

    /// Forgets the answers of triggers no longer called.
    pub(super) fn retain(&self, targets: &Targets) {
        let mut readings = lock(&self.readings);
        readings.by_so.retain(|(ns, name), so| {
            so.triggers
                .retain(|i, _| targets.contains_key(&(ns.clone(), name.clone(), *i)));
            !so.triggers.is_empty()
        });
    }

    pub(super) fn count(&self, method: &str, outcome: &str) {
        *lock(&self.calls)
            .entry((method.to_string(), outcome.to_string()))
            .or_default() += 1;
    }

    /// Calls made to external scalers by gRPC method and outcome (see
    /// [`crate::Cluster::scaler_calls`]).
    pub fn calls(&self, method: &str, outcome: &str) -> u64 {
        lock(&self.calls)
            .get(&(method.to_string(), outcome.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Simulated time jumped or changed speed: pollers waiting for their next poll look again.
    pub fn clock_moved(&self) {
        self.clock_moved.notify_waiters();
    }

    pub(super) fn clock_notify(&self) -> &Notify {
        &self.clock_moved
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Sample, ScalerTarget, Scalers, Targets, TlsMaterial, host_of};
    use crate::store::Store;

    fn target(store: &Store, trigger: serde_json::Value) -> Result<ScalerTarget, String> {
        let so = json!({"metadata": {"name": "web", "namespace": "default"}});
        ScalerTarget::of(store, &so, &trigger, 30_000)
    }

    #[test]
    fn the_metadata_is_sent_whole_and_plaintext_needs_no_authentication() {
        let s = Store::new(10, 10, 0);
        let t = target(
            &s,
            json!({"type": "external", "metadata": {"scalerAddress": "127.0.0.1:9000", "pods": 3, "x": "y"}}),
        )
        .expect("target");
        assert_eq!(t.address, "127.0.0.1:9000");
        assert_eq!(t.tls, None);
        assert_eq!(
            t.metadata.get("pods").map(String::as_str),
            Some("3"),
            "numbers as text"
        );
        assert_eq!(t.metadata.len(), 3);
        assert_eq!((t.name.as_str(), t.namespace.as_str()), ("web", "default"));
        let t = target(
            &s,
            json!({"metadata": {"scalerAddress": "[::1]:9000", "enableTLS": "true", "unsafeSsl": "True"}}),
        )
        .expect("target");
        assert_eq!(
            t.tls,
            Some(TlsMaterial {
                server_name: "::1".into(),
                ca: None,
                identity: None,
                skip_verify: true
            })
        );
    }

    #[test]
    fn a_malformed_trigger_is_a_message() {
        let s = Store::new(10, 10, 0);
        for (metadata, want) in [
            (json!({}), "missing required parameter \"scalerAddress\""),
            (json!({"scalerAddress": "scaler"}), "is not host:port"),
            (
                json!({"scalerAddress": "h:1", "enableTLS": "yes"}),
                "invalid boolean \"yes\"",
            ),
            (
                json!({"scalerAddress": "h:1", "list": [1]}),
                "\"list\" is not a string",
            ),
            (json!("text"), "trigger metadata is not a map"),
        ] {
            let err = target(&s, json!({"metadata": metadata})).expect_err("malformed");
            assert!(err.contains(want), "{err} should contain {want}");
        }
        assert_eq!(host_of("a:b:1"), Some("a:b"));
        assert_eq!(host_of(":1"), None);
        assert_eq!(host_of("host:port"), None);
    }

    #[test]
    fn answers_count_only_for_the_current_target_and_bump_the_scaled_objects_seq() {
        let s = Store::new(10, 10, 0);
        let scalers = Scalers::default();
        let t = target(&s, json!({"metadata": {"scalerAddress": "h:1"}})).expect("target");
        let key = ("default".to_string(), "web".to_string(), 0);
        let sample = Ok(Sample {
            metric: "m".into(),
            value: 1.0,
            target: 2.0,
            active: true,
        });
        assert!(
            !scalers.record(&key, &t, sample.clone()),
            "not a published target"
        );
        scalers.set_targets(Targets::from([(key.clone(), t.clone())]));
        assert!(scalers.record(&key, &t, sample.clone()));
        let seq = scalers.seq("default", "web");
        assert!(seq > 0);
        assert!(!scalers.record(&key, &t, sample.clone()), "unchanged");
        assert_eq!(scalers.seq("default", "web"), seq);
        assert!(scalers.record(&key, &t, Err("down".into())));
        assert!(scalers.seq("default", "web") > seq);
        assert_eq!(scalers.reading(&key), Some(Err("down".into())));
        scalers.set_targets(Targets::new());
        scalers.retain(&Targets::new());
        assert_eq!(scalers.reading(&key), None);
    }
}

//! Watches that one bad object cannot stop.
//!
//! kube's typed watcher decodes a whole list at once: one DistributedScaledObject the API
//! server accepted but the hub cannot decode (a number past `i32`, a required field missing,
//! stored before the CRD's schema said so) fails the list, and after a restart the
//! controller reconciles nothing at all. Here the hub watches the resource untyped and
//! decodes object by object: an object that decodes goes to the controller as before; one
//! that does not is left out of the controller's cache (so it holds no claim on a shared
//! workload), its desired state is released (its replicas stay as they are), and it is
//! reported on its own status (`Ready=False`, reason `ValidationFailed`, naming the field
//! path) and by a Warning Event `InvalidSpec`. Every other object keeps being reconciled.
//!
//! Each watch also reports whether it lists and watches at all ([`WatchHealth`]): `/readyz`
//! turns unready when one has failed for longer than `WatchHealth::tolerance`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kedge_core::crd::conditions::{EVENT_INVALID_SPEC, REASON_VALIDATION_FAILED};
use kedge_core::dso::outcome::refused_conditions;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{Shared, bounded, lock};

/// Decodes one object of the API into `K`; the error names the field path and what is
/// wrong with it, e.g. `spec.scaledJobSpec.maxReplicaCount: invalid value: integer
/// `5000000000`, expected i32`.
pub fn decode<K: DeserializeOwned>(obj: &DynamicObject) -> Result<K, String> {
    let mut value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
    // Nothing in the hub reads who manages which field, and the caches keep every object:
    // a MemberCluster written by its enroller and by the hub carries two entries, as large
    // as its spec (10,000 members: docs/scale.md, "What the hub keeps").
    if let Some(meta) = value
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        meta.remove("managedFields");
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." || path.is_empty() {
            e.into_inner().to_string()
        } else {
            format!("{path}: {}", e.into_inner())
        }
    })
}

/// How long a watch may fail before the hub says it is not ready.
pub const DEFAULT_WATCH_TOLERANCE: Duration = Duration::from_secs(30);

/// Whether each of the controllers' watches lists and watches, and since when one fails.
///
/// A watch that starts again after failing delivers nothing until something changes, so
/// recovery is also taken from silence: a failing watch retries at least every
/// [`WatchHealth::retry_max`] (its [`WatchBackoff`]), so one without an error for twice that
/// is no longer failing.
#[derive(Debug)]
pub struct WatchHealth {
    tolerance: Duration,
    /// Watch → (failing since, last error at, last error).
    failing: Mutex<BTreeMap<&'static str, (tokio::time::Instant, tokio::time::Instant, String)>>,
}

impl WatchHealth {
    /// Health that turns bad when a watch has failed for longer than `tolerance`.
    pub fn new(tolerance: Duration) -> Self {
        Self {
            tolerance,
            failing: Mutex::new(BTreeMap::new()),
        }
    }

    /// The longest wait between two attempts of a failing watch: half the tolerance, within
    /// 1 to 30 s (client-go's cap).
    pub fn retry_max(&self) -> Duration {
        (self.tolerance / 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// The backoff of every watch this health follows.
    pub fn backoff(&self) -> WatchBackoff {
        WatchBackoff::new(self.retry_max())
    }

    /// How long without an error ends a failure.
    fn quiet(&self) -> Duration {
        self.retry_max() * 2 + Duration::from_secs(1)
    }

    /// Records that watch `what` just delivered (`None`) or failed (`Some(error)`).
    pub fn record(&self, what: &'static str, error: Option<String>) {
        let mut failing = lock(&self.failing);
        let now = tokio::time::Instant::now();
        match error {
            None => {
                if failing.remove(what).is_some() {
                    info!(watch = what, "watch recovered");
                }
            }
            Some(error) => {
                let since = match failing.get(what) {
                    Some((since, last, _)) if now.duration_since(*last) <= self.quiet() => *since,
                    _ => {
                        warn!(watch = what, %error, "watch failing; retrying with backoff");
                        now
                    }
                };
                failing.insert(what, (since, now, error));
            }
        }
    }

    /// The first watch failing for longer than the tolerance, and why; `None`: all healthy.
    pub fn problem(&self) -> Option<String> {
        let failing = lock(&self.failing);
        let now = tokio::time::Instant::now();
        failing
            .iter()
            .find(|(_, (since, last, _))| {
                now.duration_since(*last) <= self.quiet()
                    && now.duration_since(*since) > self.tolerance
            })
            .map(|(what, (since, _, error))| {
                format!(
                    "watching {what} has failed for {}s: {error}",
                    now.duration_since(*since).as_secs()
                )
            })
    }
}

impl Default for WatchHealth {
    fn default() -> Self {
        Self::new(DEFAULT_WATCH_TOLERANCE)
    }
}

/// Exponential backoff of a failing watch: 800 ms doubling up to a cap, as client-go's
/// reflector does (whose cap is 30 s); a delivered event resets it.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    max: Duration,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(800);

    /// A backoff capped at `max`.
    pub fn new(max: Duration) -> Self {
        Self {
            next: Self::FIRST.min(max),
            max,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST.min(self.max);
    }
}

/// Passes a watch's events on unchanged, recording in `health` whether it delivers.
pub fn tracked<S, T>(
    stream: S,
    what: &'static str,
    health: Arc<WatchHealth>,
) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send,
{
    stream.inspect(move |event| {
        health.record(what, event.as_ref().err().map(ToString::to_string));
    })
}

/// An object the hub could not decode, to report.
#[derive(Debug)]
pub struct Undecodable {
    /// The object as the API served it.
    pub object: DynamicObject,
    /// What is wrong with it (field path first).
    pub error: String,
}

/// The objects of a kind that could not be decoded, by `namespace/name`: the generation
/// reported, so each bad generation is reported once.
#[derive(Debug, Default)]
pub struct Reported(Mutex<HashMap<String, Option<i64>>>);

/// The events of a watch of `K`, decoded object by object. Objects that do not decode are
/// sent to `bad` (when given) and left out: while the cache (`cache`) still holds an earlier
/// version of one, that version is deleted from it, so the controller acts on no stale spec.
pub fn watch<K>(
    client: Client,
    what: &'static str,
    health: Arc<WatchHealth>,
    cache: Option<Store<K>>,
    bad: Option<mpsc::UnboundedSender<Undecodable>>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let resource = ApiResource::erase::<K>(&());
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let raw = tracked(
        watcher::watcher(api, watcher::Config::default()),
        what,
        health,
    );
    raw.filter_map(move |event| {
        let decoded = event.map(|event| decode_event(event, cache.as_ref(), bad.as_ref()));
        futures::future::ready(decoded.transpose())
    })
}

fn decode_event<K>(
    event: watcher::Event<DynamicObject>,
    cache: Option<&Store<K>>,
    bad: Option<&mpsc::UnboundedSender<Undecodable>>,
) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone,
{
    use watcher::Event as E;
    let one = |object: DynamicObject| match decode::<K>(&object) {
        Ok(k) => Ok(k),
        Err(error) => {
            let stale = cache.and_then(|c| {
                let mut key = ObjectRef::<K>::new(&object.name_any());
                key.namespace = object.namespace();
                c.get(&key)
            });
            if let Some(bad) = bad {
                let _ = bad.send(Undecodable {
                    object,
                    error: error.clone(),
                });
            }
            Err(stale)
        }
    };
    match event {
        E::Init => Some(E::Init),
        E::InitDone => Some(E::InitDone),
        E::InitApply(o) => one(o).ok().map(E::InitApply),
        E::Apply(o) => match one(o) {
            Ok(k) => Some(E::Apply(k)),
            // Was good, is not any more: out of the cache.
            Err(Some(stale)) => Some(E::Delete((*stale).clone())),
            Err(None) => None,
        },
        // A deleted object needs only its name to leave the cache; one that never decoded
        // was never in it.
        E::Delete(o) => match decode::<K>(&o) {
            Ok(k) => Some(E::Delete(k)),
            Err(_) => {
                let mut key = ObjectRef::<K>::new(&o.name_any());
                key.namespace = o.namespace();
                cache
                    .and_then(|c| c.get(&key))
                    .map(|k| E::Delete((*k).clone()))
            }
        },
    }
}

/// What the hub does for an undecodable object of one kind, whose controller's context is `C`.
pub struct KindHooks<C> {
    /// The controller's finalizer: removed from an undecodable object being deleted.
    pub finalizer: &'static str,
    /// Releases what the hub holds for the object `namespace/name` (desired state, caches).
    pub release: fn(&C, &str, &str),
}

impl<C> std::fmt::Debug for KindHooks<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindHooks")
            .field("finalizer", &self.finalizer)
            .finish_non_exhaustive()
    }
}

/// Reports each undecodable object of one kind (status, Event, log) and releases what the
/// hub holds for it, until `bad` closes.
pub async fn report<C: AsRef<Shared>>(
    ctx: Arc<C>,
    hooks: KindHooks<C>,
    reported: Arc<Reported>,
    mut bad: mpsc::UnboundedReceiver<Undecodable>,
) {
    let shared: &Shared = (*ctx).as_ref();
    while let Some(Undecodable { object, error }) = bad.recv().await {
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let owner = format!("{namespace}/{name}");
        let deleting = object.metadata.deletion_timestamp.is_some();
        (hooks.release)(&ctx, &namespace, &name);
        if deleting {
            if let Err(e) = remove_finalizer(shared, &object, hooks.finalizer).await {
                warn!(object = %owner, error = %e, "cannot remove the finalizer of an undecodable object");
            }
            continue;
        }
        let generation = object.metadata.generation;
        if lock(&reported.0).get(&owner) == Some(&generation) {
            continue;
        }
        let message = format!(
            "the hub cannot read this object: {error}; fix the field (kubectl edit) and the \
             hub picks it up at once"
        );
        warn!(object = %owner, kind = object.types.as_ref().map_or("", |t| t.kind.as_str()),
            %error, "cannot decode an object; it is left alone and its status says why");
        match write_invalid(shared, &object, &message).await {
            Ok(()) => {
                lock(&reported.0).insert(owner.clone(), generation);
            }
            Err(e) => {
                warn!(object = %owner, error = %e, "cannot write the status of an undecodable object")
            }
        }
        if let Some(reference) = reference(&object)
            && let Err(e) = shared
                .recorder
                .publish(
                    reference,
                    EventType::Warning,
                    EVENT_INVALID_SPEC,
                    "Validate",
                    message,
                )
                .await
        {
            warn!(object = %owner, error = %e, "cannot publish an Event");
        }
    }
}

fn reference(object: &DynamicObject) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
    let types = object.types.as_ref()?;
    Some(k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(types.api_version.clone()),
        kind: Some(types.kind.clone()),
        name: object.metadata.name.clone(),
        namespace: object.metadata.namespace.clone(),
        uid: object.metadata.uid.clone(),
        resource_version: object.metadata.resource_version.clone(),
        ..Default::default()
    })
}

/// The conditions of an undecodable object: `Ready=False` and `Degraded=True` with reason
/// `ValidationFailed` (the others kept, as far as they decode).
fn invalid_conditions(object: &DynamicObject, message: &str, now: SystemTime) -> Vec<Condition> {
    let existing: Vec<Condition> = object
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| serde_json::from_value(c.clone()).ok())
        .collect();
    refused_conditions(
        &existing,
        REASON_VALIDATION_FAILED,
        message,
        object.metadata.generation,
        now,
    )
}

async fn write_invalid(
    shared: &Shared,
    object: &DynamicObject,
    message: &str,
) -> crate::Result<()> {
    let Some(api) = api_of(shared, object) else {
        return Ok(());
    };
    let conditions = invalid_conditions(object, message, SystemTime::now());
    let patch = json!({"status": {"conditions": conditions}});
    bounded(
        "write the status of an undecodable object",
        api.patch_status(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ),
    )
    .await?;
    Ok(())
}

async fn remove_finalizer(
    shared: &Shared,
    object: &DynamicObject,
    finalizer: &str,
) -> crate::Result<()> {
    let finalizers: Vec<String> = object.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let Some(api) = api_of(shared, object) else {
        return Ok(());
    };
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    // Guarded by the resourceVersion: a concurrent change makes this fail and come again.
    let patch = json!({"metadata": {
        "finalizers": kept,
        "resourceVersion": object.metadata.resource_version,
    }});
    bounded(
        "remove the finalizer of an undecodable object",
        api.patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ),
    )
    .await?;
    info!(object = %format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any()),
        "removed the finalizer of an undecodable object being deleted");
    Ok(())
}

fn api_of(shared: &Shared, object: &DynamicObject) -> Option<Api<DynamicObject>> {
    let types = object.types.as_ref()?;
    let (group, version) = match types.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", types.api_version.as_str()),
    };
    let resource = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        group,
        version,
        &types.kind,
    ));
    Some(Api::namespaced_with(
        shared.client.clone(),
        &object.namespace().unwrap_or_default(),
        &resource,
    ))
}

#[cfg(test)]
mod tests {
    use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject};

    use super::*;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn dso(spec: Value) -> DynamicObject {
        object(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": "web", "namespace": "team", "generation": 2},
            "spec": spec,
        }))
    }

    #[test]
    fn a_number_past_i32_names_its_field_path() {
        let bad = dso(json!({"scaledObjectSpec": {
            "scaleTargetRef": {"name": "web"}, "triggers": [],
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleUp": {
                "policies": [{"type": "Pods", "value": 3_000_000_000_u64, "periodSeconds": 15}]}}}}
        }}));
        let error = decode::<DistributedScaledObject>(&bad).unwrap_err();
        assert!(
            error.starts_with(
                "spec.scaledObjectSpec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.policies[0].value: "
            ),
            "{error}"
        );
        assert!(error.contains("3000000000"), "{error}");
    }

    #[test]
    fn cached_objects_keep_no_managed_fields() {
        let written = object(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": "edge-1", "labels": {"tier": "a"}, "managedFields": [
                {"manager": "kubectl-kedge", "operation": "Apply", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:tier": {}}}},
                {"manager": "kedge-hub", "operation": "Apply", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]},
            "spec": {}
        }));
        let member: kedge_core::crd::MemberCluster = decode(&written).unwrap();
        assert_eq!(member.metadata.managed_fields, None);
        // Everything else of the metadata is kept.
        assert_eq!(member.metadata.name.as_deref(), Some("edge-1"));
        assert_eq!(member.metadata.labels.unwrap()["tier"], "a");
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let error =
            decode::<DistributedScaledObject>(&dso(json!({"scaledObjectSpec": {"triggers": []}})))
                .unwrap_err();
        assert!(error.contains("scaleTargetRef"), "{error}");
        let good =
            dso(json!({"scaledObjectSpec": {"scaleTargetRef": {"name": "web"}, "triggers": []}}));
        assert!(decode::<DistributedScaledObject>(&good).is_ok());
        let job = object(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledJob",
            "metadata": {"name": "q", "namespace": "team"},
            "spec": {"scaledJobSpec": {"jobTargetRef": {"template": {}}, "triggers": [],
                "maxReplicaCount": 5_000_000_000_u64}}
        }));
        let error = decode::<DistributedScaledJob>(&job).unwrap_err();
        assert!(
            error.starts_with("spec.scaledJobSpec.maxReplicaCount: "),
            "{error}"
        );
    }

    #[test]
    fn ready_and_degraded_say_the_same_and_the_transition_time_is_kept_while_false() {
        let mut obj = dso(json!({}));
        obj.data["status"] = json!({"conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Degraded", "status": "False", "reason": "NoFailures", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Paused", "status": "False", "reason": "NotPaused", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]});
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let conditions = invalid_conditions(&obj, "bad", now);
        let of = |t: &str| conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(
            (of("Ready").status.as_str(), of("Ready").reason.as_str()),
            ("False", REASON_VALIDATION_FAILED)
        );
        assert_eq!(
            (
                of("Degraded").status.as_str(),
                of("Degraded").reason.as_str()
            ),
            ("True", REASON_VALIDATION_FAILED)
        );
        assert_eq!(of("Ready").observed_generation, Some(2));
        assert_eq!(of("Paused").reason, "NotPaused");
        obj.data["status"]["conditions"] = serde_json::to_value(&conditions).unwrap();
        let again = invalid_conditions(&obj, "bad", now + Duration::from_secs(60));
        assert_eq!(again, conditions);
    }

    #[tokio::test(start_paused = true)]
    async fn health_names_a_watch_failing_past_the_tolerance_and_forgets_it_on_recovery() {
        let health = WatchHealth::new(Duration::from_secs(4));
        assert_eq!(health.retry_max(), Duration::from_secs(2));
        assert_eq!(health.problem(), None);
        // Failing, retried at the backoff's pace: a problem once past the tolerance.
        for delay in health.backoff().take(3) {
            health.record("DistributedScaledJobs", Some("list failed".into()));
            assert_eq!(health.problem(), None);
            tokio::time::advance(delay).await;
        }
        health.record("DistributedScaledJobs", Some("list failed".into()));
        tokio::time::advance(Duration::from_secs(1)).await;
        let problem = health.problem().unwrap();
        assert!(problem.contains("DistributedScaledJobs") && problem.contains("list failed"));
        // An event clears it at once.
        health.record("DistributedScaledJobs", None);
        assert_eq!(health.problem(), None);
        // So does silence: a failing watch would have retried (and failed) by then.
        health.record("x", Some("e".into()));
        tokio::time::advance(Duration::from_secs(5)).await;
        health.record("x", Some("e".into()));
        assert!(health.problem().is_some());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(health.problem(), None);
        // A failure long after the last starts a new count.
        health.record("x", Some("e".into()));
        assert_eq!(health.problem(), None);
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::new(Duration::from_secs(5));
        let first: Vec<_> = b.by_ref().take(5).map(|d| d.as_millis()).collect();
        assert_eq!(first, [800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(800)));
    }
}

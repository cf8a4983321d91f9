//! Controllers of the hub cluster: DistributedScaledObjects and MemberCluster status. They read
//! the [`Fleet`] (sessions and agent reports) and write desired state into it; the QUIC
//! sessions do the rest.

pub mod decode;
pub mod dsj;
pub mod dso;
pub mod external_metrics;
pub mod member;
pub mod observe;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kedge_core::crd::dso::DistributedScaledObjectStatus;
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject, MemberCluster};
use kedge_core::dso::member::MemberPhase;
use kube::api::PostParams;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::PredicateConfig;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::fleet::Fleet;
use crate::metrics::HubMetrics;
use crate::{Error, Result};

/// The one field manager of every server-side apply the hub sends.
pub const FIELD_MANAGER: &str = "kedge-hub";

/// Longest wait for one call to the hub cluster's API.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest time between two status writes of one DSO.
pub const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// Runs one API call under [`API_TIMEOUT`].
pub async fn bounded<T>(
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::Timeout { what }),
    }
}

/// Coalescing window of fleet changes before every DSO is reconciled again.
const FLEET_THROTTLE: Duration = Duration::from_millis(100);

/// Publishes `events.k8s.io/v1` Events. Unlike kube's `Recorder`, which folds every event
/// with the same reason into one series carrying the first note, each call creates an Event:
/// the notes say what changed (a new split, which member was lost), and callers only publish
/// on a change.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
}

impl Recorder {
    /// A recorder reporting as `controller` / `instance`.
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance: instance.unwrap_or_else(|| controller.to_owned()),
        }
    }

    /// Creates one Event about `regarding`.
    pub async fn publish(
        &self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) -> Result<()> {
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let event = K8sEvent {
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            note: Some(note.chars().take(1024).collect()),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Default::default()
        };
        bounded(
            "create Event",
            Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
                .create(&PostParams::default(), &event),
        )
        .await?;
        Ok(())
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("controller", &self.controller)
            .finish_non_exhaustive()
    }
}

/// Owner `ns/name` → member → (phase, since when).
type MemberPhases = HashMap<String, BTreeMap<String, (MemberPhase, SystemTime)>>;

/// What the controllers share.
pub struct Context {
    /// Client of the hub cluster.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Sessions, reports and desired state.
    pub fleet: Arc<Fleet>,
    /// Metrics.
    pub metrics: HubMetrics,
    /// `keda.sh/v1alpha1` ScaledObject.
    pub scaled_objects: ApiResource,
    /// Every DSO, as the controller's reflector sees them (for claims on shared workloads).
    dsos: Option<Store<DistributedScaledObject>>,
    /// Every DSJ, as the DSJ controller's reflector sees them (for taints shared by the DSJs
    /// of a namespace).
    dsjs: Option<Store<DistributedScaledJob>>,
    /// ScaledObjects of the hub cluster as the DSO controller's watch sees them.
    child_scaled_objects: Option<Store<DynamicObject>>,
    /// Every MemberCluster, from a reflector (none in unit tests: read from the API then).
    member_clusters: Option<Store<MemberCluster>>,
    /// Since when each (DSO, member) has been in its phase.
    phases: Mutex<MemberPhases>,
    /// The DSO status this process decided last, by owner (written, or due to be).
    written: Mutex<HashMap<String, DistributedScaledObjectStatus>>,
    /// When each DSO's status was last written.
    status_writes: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Failures of the last reconciliation by owner, for its next `Degraded` condition.
    errors: Mutex<HashMap<String, Vec<String>>>,
    /// When the controllers started.
    started: tokio::time::Instant,
    /// How long after the start MemberClusters of absent agents keep their state.
    startup_grace: Duration,
    /// When each DSJ Job create was first sent.
    pub dsj_sent: dsj::Sent,
    /// What KEDA dials to reach the hub's external scaler; `None`: the hub serves none.
    pub scaler_address: Option<String>,
    /// The pod-metrics readings each DSO published last (metrics to take back).
    pod_readings: Mutex<HashMap<String, Vec<crate::podmetrics::Reading>>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

/// Every map here is replaced entry by entry; a poisoned lock holds no torn entry.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The KEDA `ScaledObject` resource.
fn scaled_object_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    )
}

impl Context {
    /// A context over `client` and `fleet`; `dsos` is the DSO controller's reflector store.
    pub fn new(
        client: Client,
        fleet: Arc<Fleet>,
        metrics: HubMetrics,
        dsos: Option<Store<DistributedScaledObject>>,
    ) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok();
        // Agents notice a lost hub only after their own heartbeat deadline and then back off
        // before dialing again: give them two deadlines.
        let startup_grace = fleet.registry().liveness().deadline().saturating_mul(2);
        Self {
            recorder: Recorder::new(client.clone(), FIELD_MANAGER, instance),
            client,
            fleet,
            metrics,
            scaled_objects: scaled_object_resource(),
            dsos,
            dsjs: None,
            member_clusters: None,
            child_scaled_objects: None,
            phases: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            status_writes: Mutex::new(HashMap::new()),
            errors: Mutex::new(HashMap::new()),
            started: tokio::time::Instant::now(),
            dsj_sent: dsj::Sent::default(),
            startup_grace,
            scaler_address: None,
            pod_readings: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes the pod-metrics readings of DSO `namespace/name` in the hub's metrics,
    /// taking back what it published before that is gone (all of it for an empty list).
    pub fn publish_readings(
        &self,
        namespace: &str,
        name: &str,
        readings: Vec<crate::podmetrics::Reading>,
    ) {
        let owner = format!("{namespace}/{name}");
        let mut published = lock(&self.pod_readings);
        let previous = published.remove(&owner).unwrap_or_default();
        self.metrics
            .pod_metric_readings(namespace, name, &readings, &previous);
        if !readings.is_empty() {
            published.insert(owner, readings);
        }
    }

    /// Whether the hub started so recently that agents may not have reconnected yet.
    pub fn starting(&self) -> bool {
        self.started.elapsed() < self.startup_grace
    }

    /// Every DSO the controller knows.
    pub fn dsos(&self) -> Vec<Arc<DistributedScaledObject>> {
        self.dsos.as_ref().map(Store::state).unwrap_or_default()
    }

    /// Every DSJ the DSJ controller knows.
    pub fn dsjs(&self) -> Vec<Arc<DistributedScaledJob>> {
        self.dsjs.as_ref().map(Store::state).unwrap_or_default()
    }

    /// Every MemberCluster, from the reflector cache once it has listed them (the API is
    /// read only before that, or without a cache).
    pub async fn member_clusters(&self) -> Result<Vec<Arc<MemberCluster>>> {
        if let Some(store) = &self.member_clusters
            && tokio::time::timeout(API_TIMEOUT, store.wait_until_ready())
                .await
                .is_ok_and(|ready| ready.is_ok())
        {
            return Ok(store.state());
        }
        let list = bounded(
            "list MemberClusters",
            Api::<MemberCluster>::all(self.client.clone()).list(&kube::api::ListParams::default()),
        )
        .await?;
        Ok(list.items.into_iter().map(Arc::new).collect())
    }

    /// Whether a MemberCluster named `name` exists, from the reflector cache once it has
    /// listed them (one lookup, not a copy of the list); `None` when that cannot be known now.
    pub async fn member_cluster(&self, name: &str) -> Option<bool> {
        let store = self.member_clusters.as_ref()?;
        tokio::time::timeout(API_TIMEOUT, store.wait_until_ready())
            .await
            .ok()?
            .ok()?;
        Some(store.get(&ObjectRef::new(name)).is_some())
    }

    /// Every MemberCluster in the reflector cache now (none before its first list).
    pub fn member_clusters_cached(&self) -> Vec<Arc<MemberCluster>> {
        self.member_clusters
            .as_ref()
            .map(Store::state)
            .unwrap_or_default()
    }

    /// The ScaledObject `namespace/name` as last seen by the DSO controller's watch.
    pub fn cached_scaled_object(&self, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        let key = ObjectRef::new_with(name, scaled_object_resource()).within(namespace);
        self.child_scaled_objects.as_ref()?.get(&key)
    }

    /// The phase `member` was last seen in for `owner`, and since when.
    pub fn tracked(&self, owner: &str, member: &str) -> Option<(MemberPhase, SystemTime)> {
        lock(&self.phases).get(owner)?.get(member).copied()
    }

    /// Records the phases of `owner`'s members (those of members not listed are forgotten).
    pub fn track(&self, owner: &str, phases: BTreeMap<String, (MemberPhase, SystemTime)>) {
        lock(&self.phases).insert(owner.to_owned(), phases);
    }

    /// Keeps a failure of `owner`'s reconciliation for its next status.
    pub fn record_error(&self, owner: &str, message: String) {
        let mut errors = lock(&self.errors);
        let list = errors.entry(owner.to_owned()).or_default();
        if !list.contains(&message) {
            list.push(message);
        }
    }

    /// The failures recorded for `owner` since its last reconciliation.
    pub fn take_errors(&self, owner: &str) -> Vec<String> {
        lock(&self.errors).remove(owner).unwrap_or_default()
    }

    /// Forgets everything tracked for `owner`.
    pub fn forget(&self, owner: &str) {
        lock(&self.phases).remove(owner);
        lock(&self.written).remove(owner);
        lock(&self.status_writes).remove(owner);
        lock(&self.errors).remove(owner);
    }

    /// How long `owner`'s status must wait before it is written again (`None`: now). One
    /// write per [`STATUS_WRITE_INTERVAL`] at most: while a thousand members report a change
    /// one after the other, their DSO's status is written once or twice, not a thousand
    /// times over.
    pub fn status_wait(&self, owner: &str) -> Option<Duration> {
        let last = *lock(&self.status_writes).get(owner)?;
        STATUS_WRITE_INTERVAL
            .checked_sub(last.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Records that `owner`'s status was just written.
    pub fn status_written(&self, owner: &str) {
        lock(&self.status_writes).insert(owner.to_owned(), tokio::time::Instant::now());
    }

    /// The status last decided for `owner` by this process.
    pub fn written(&self, owner: &str) -> Option<DistributedScaledObjectStatus> {
        lock(&self.written).get(owner).cloned()
    }

    /// Records the status decided for `owner` (written, in place, or due to be written).
    pub fn remember(&self, owner: &str, status: DistributedScaledObjectStatus) {
        lock(&self.written).insert(owner.to_owned(), status);
    }

    /// Publishes an Event kedge-core decided about a DSO or DSJ.
    pub async fn publish_event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        event: kedge_core::events::Event,
    ) {
        let kind = match event.kind {
            kedge_core::events::EventKind::Normal => EventType::Normal,
            kedge_core::events::EventKind::Warning => EventType::Warning,
        };
        self.publish(obj, kind, event.reason, event.action, event.note)
            .await;
    }

    /// Publishes an Event about a DSO or DSJ; a failure is logged, never fatal.
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        dso: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if let Err(error) = self
            .recorder
            .publish(dso.object_ref(&()), type_, reason, action, note)
            .await
        {
            warn!(%error, reason, "cannot publish event");
        }
    }
}

/// Writes `status` of the `K` named `namespace/name` with server-side apply (this hub's field
/// manager, forced), and counts the write for `controller`.
pub async fn write_status<K>(
    ctx: &Context,
    controller: &str,
    namespace: &str,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    bounded(
        "apply status",
        api.patch_status(
            name,
            &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
            &kube::api::Patch::Apply(&patch),
        ),
    )
    .await?;
    ctx.metrics.status_written(controller);
    Ok(())
}

/// Whether a member's agent has ever enrolled or connected (its MemberCluster's status
/// says so): a member created by `setup-member` whose agent never came is not selected by
/// an empty `memberClusters`.
pub fn joined(member: &MemberCluster) -> bool {
    member
        .status
        .as_ref()
        .is_some_and(|s| s.last_heartbeat_time.is_some() || s.certificate_expiry.is_some())
}

/// Namespace and name of a namespaced hub object of `kind`.
pub fn ns_name<K: Resource>(obj: &K, kind: &'static str) -> Result<(String, String)> {
    let namespace = obj.meta().namespace.clone().ok_or(Error::MissingField {
        kind,
        field: "metadata.namespace",
    })?;
    Ok((namespace, obj.meta().name.clone().unwrap_or_default()))
}

/// Where the hub cluster is.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Kubeconfig of the hub cluster; `None`: in-cluster, then `$KUBECONFIG`, then
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Run the DistributedScaledObject controller.
    pub dso: bool,
    /// Run the DistributedScaledJob controller.
    pub dsj: bool,
    /// The `host:port` of the hub's external scaler as KEDA dials it; `None` when the hub
    /// serves none (`kedge-pod-metrics` triggers are then refused).
    pub scaler_address: Option<String>,
    /// How long a watch may fail before `/readyz` says so.
    pub watch_failure_tolerance: Duration,
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client> {
    kedge_net::kube_client::client(kubeconfig.map(PathBuf::as_path))
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))
}

/// What a DSO is planned from, of the object itself: its spec (through the generation,
/// which `/scale` moves too), annotations (pause), finalizers and deletion. Not its status.
fn planned_from(dso: &DistributedScaledObject) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = &dso.metadata;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// The other DSOs whose workload has the same kind and name as `changed`'s (a superset of
/// those that target the same workload in some member).
fn sharing_a_target(
    store: &Store<DistributedScaledObject>,
    changed: &DistributedScaledObject,
) -> Vec<ObjectRef<DistributedScaledObject>> {
    let target = &changed.spec.scaled_object_spec.scale_target_ref;
    let me = ObjectRef::from_obj(changed);
    store
        .state()
        .iter()
        .filter(|o| {
            let t = &o.spec.scaled_object_spec.scale_target_ref;
            t.name == target.name && t.kind == target.kind
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .filter(|r| *r != me)
        .collect()
}

/// A stream of the DSOs to re-plan after fleet changes: once per burst, the DSOs that
/// involve a changed member (listed in `memberClusters`, every member for an empty list, or
/// holding desired state there). A report from one member re-plans only its DSOs.
fn fleet_changes(
    fleet: Arc<Fleet>,
    store: Store<DistributedScaledObject>,
) -> impl futures::Stream<Item = ObjectRef<DistributedScaledObject>> + Send + 'static {
    let rx = fleet.subscribe();
    futures::stream::unfold((rx, fleet, store), |(mut rx, fleet, store)| async move {
        loop {
            let counts_due = fleet
                .counts_since()
                .map(|since| since + STATUS_WRITE_INTERVAL);
            tokio::select! {
                changed = rx.changed() => changed.ok()?,
                () = fleet.counts_reported(), if counts_due.is_none() => continue,
                () = tokio::time::sleep_until(counts_due.unwrap_or_else(tokio::time::Instant::now)),
                    if counts_due.is_some() => {}
            }
            tokio::time::sleep(FLEET_THROTTLE).await;
            rx.borrow_and_update();
            let mut changed = fleet.take_changed();
            // Members with new counts only wait for the status write they show up in, unless
            // their DSOs are planned now anyway.
            let due = counts_due.is_some_and(|due| due <= tokio::time::Instant::now());
            if due || !changed.is_empty() {
                changed.extend(fleet.take_counts());
            }
            if changed.is_empty() {
                continue;
            }
            let involved = involving(&store.state(), &changed, &fleet.owners_on(&changed));
            return Some((futures::stream::iter(involved), (rx, fleet, store)));
        }
    })
    .flatten()
}

/// The DSOs of `all` that involve one of `changed` members; `holding`: owners with desired
/// state on one of them.
fn involving(
    all: &[Arc<DistributedScaledObject>],
    changed: &BTreeSet<String>,
    holding: &BTreeSet<String>,
) -> Vec<ObjectRef<DistributedScaledObject>> {
    if changed.is_empty() {
        return Vec::new();
    }
    all.iter()
        .filter(|d| {
            let listed = &d.spec.member_clusters;
            listed.is_empty()
                || listed.iter().any(|m| changed.contains(&m.name))
                || holding.contains(&dso::owner_key(
                    d.metadata.namespace.as_deref().unwrap_or_default(),
                    d.metadata.name.as_deref().unwrap_or_default(),
                ))
        })
        .map(|d| ObjectRef::from_obj(d.as_ref()))
        .collect()
}

/// A client of the hub cluster. Without a reachable configuration it retries with backoff
/// (the QUIC server runs meanwhile); `None` when `shutdown` comes first.
pub async fn connect(config: &ControllerConfig, shutdown: &CancellationToken) -> Option<Client> {
    let mut delay = Duration::from_secs(1);
    loop {
        match client(config.kubeconfig.as_ref()).await {
            Ok(c) => return Some(c),
            Err(error) => {
                warn!(%error, retry_in = ?delay, "no hub cluster client; controllers wait");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Runs the controllers until `shutdown`. Only the active hub (the lease holder, or the
/// only hub when there is no lease) calls this. DSOs, DSJs and MemberClusters are watched
/// object by object ([`decode`]): one that cannot be decoded is reported on its own and
/// stops nothing else; `health` records whether each watch delivers.
pub async fn run(
    config: ControllerConfig,
    client: Client,
    fleet: Arc<Fleet>,
    metrics: HubMetrics,
    health: Arc<decode::WatchHealth>,
    shutdown: CancellationToken,
) {
    const DSOS: &str = "DistributedScaledObjects";
    const DSJS: &str = "DistributedScaledJobs";
    // A DSO's own status writes change nothing it plans from: they do not trigger it again.
    let (dso_store, dso_writer) = reflector::store();
    let (bad_dsos, bad_dso_rx) = tokio::sync::mpsc::unbounded_channel();
    let dso_changes = decode::watch::<DistributedScaledObject>(
        client.clone(),
        DSOS,
        health.clone(),
        Some(dso_store.clone()),
        Some(bad_dsos),
    )
    .backoff(health.backoff())
    .reflect(dso_writer)
    .applied_objects()
    .predicate_filter(planned_from, PredicateConfig::default());
    // The child ScaledObjects through a cache too: one that is already as planned is not
    // applied again, and one changed or deleted by someone else triggers its DSO. (Not in
    // `health`: without KEDA's CRD this watch fails for good, and the hub still works.)
    let so_writer = reflector::store::Writer::new(scaled_object_resource());
    let scaled_objects = so_writer.as_reader();
    let so_changes = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &scaled_object_resource()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(so_writer)
    .touched_objects();
    let dso_controller = Controller::for_stream(dso_changes, dso_store)
        .owns_stream_with(so_changes, scaled_object_resource());
    let store = config.dso.then(|| dso_controller.store());
    let (bad_dsjs, bad_dsj_rx) = tokio::sync::mpsc::unbounded_channel();
    let dsj_controller = config.dsj.then(|| {
        let (dsj_store, dsj_writer) = reflector::store();
        let dsj_changes = decode::watch::<DistributedScaledJob>(
            client.clone(),
            DSJS,
            health.clone(),
            Some(dsj_store.clone()),
            Some(bad_dsjs),
        )
        .backoff(health.backoff())
        .reflect(dsj_writer)
        .applied_objects();
        Controller::for_stream(dsj_changes, dsj_store).owns_with(
            Api::<DynamicObject>::all_with(client.clone(), &scaled_object_resource()),
            scaled_object_resource(),
            watcher::Config::default(),
        )
    });
    let mut ctx = Context::new(client.clone(), fleet.clone(), metrics, store.clone());
    ctx.scaler_address = config.scaler_address.clone();
    ctx.dsjs = dsj_controller.as_ref().map(Controller::store);
    ctx.child_scaled_objects = Some(scaled_objects);
    // One cache of MemberClusters for every controller: nothing lists them per reconcile.
    let (member_clusters, writer) = reflector::store();
    ctx.member_clusters = Some(member_clusters.clone());
    let cache = reflector::reflector(
        writer,
        decode::watch::<MemberCluster>(
            client.clone(),
            "MemberClusters",
            health.clone(),
            Some(member_clusters),
            None,
        ),
    )
    .backoff(health.backoff())
    .for_each(|event| {
        if let Err(error) = event {
            warn!(%error, "watching MemberClusters failed; the cache keeps the last list");
        }
        futures::future::ready(())
    });
    let cache_stop = shutdown.clone();
    let cache = tokio::spawn(async move {
        tokio::select! {
            _ = cache_stop.cancelled() => {}
            _ = cache => {}
        }
    });
    let ctx = Arc::new(ctx);
    // Undecodable objects are reported (and released) apart from the controllers; these
    // tasks end with the watches that feed them.
    let reporters = [
        config.dso.then(|| {
            tokio::spawn(decode::report(
                ctx.clone(),
                decode::KindHooks {
                    finalizer: dso::FINALIZER,
                    release: dso::release,
                },
                Arc::default(),
                bad_dso_rx,
            ))
        }),
        config.dsj.then(|| {
            tokio::spawn(decode::report(
                ctx.clone(),
                decode::KindHooks {
                    finalizer: dsj::FINALIZER,
                    release: dsj::release,
                },
                Arc::default(),
                bad_dsj_rx,
            ))
        }),
    ];
    let members = tokio::spawn(member::run(ctx.clone(), shutdown.clone()));
    let dso_run = async {
        let Some(store) = store else { return };
        // A DSO that appears, changes or goes may change who wins a workload it shares
        // with others: reconcile those too, so both sides show the conflict (and its end).
        let contenders = store.clone();
        let others = decode::watch::<DistributedScaledObject>(
            client.clone(),
            "DistributedScaledObjects (shared workloads)",
            health.clone(),
            None,
            None,
        )
        .backoff(health.backoff())
        .touched_objects();
        let controller = dso_controller.watches_stream(others, move |changed| {
            sharing_a_target(&contenders, &changed)
        });
        info!("DistributedScaledObject controller started");
        let stop = shutdown.clone();
        controller
            .reconcile_on(fleet_changes(fleet.clone(), store))
            .graceful_shutdown_on(async move { stop.cancelled().await })
            .run(dso::reconcile, dso::error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()))
            .await;
    };
    let dsj_run = async {
        let Some(controller) = dsj_controller else {
            return;
        };
        info!("DistributedScaledJob controller started");
        let stop = shutdown.clone();
        controller
            .graceful_shutdown_on(async move { stop.cancelled().await })
            .run(dsj::reconcile, dsj::error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()))
            .await;
    };
    if config.dso || config.dsj {
        // Returns only on shutdown; if a controller stream ends before, so does this task,
        // and its supervisor stops the hub.
        tokio::join!(dso_run, dsj_run);
    } else {
        shutdown.cancelled().await;
    }
    if shutdown.is_cancelled() {
        let _ = members.await;
    }
    for task in reporters.into_iter().flatten() {
        task.abort();
    }
    cache.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dso(name: &str, members: &[&str]) -> Arc<DistributedScaledObject> {
        let members: Vec<_> = members
            .iter()
            .map(|m| serde_json::json!({"name": m}))
            .collect();
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
                "metadata": {"name": name, "namespace": "team"},
                "spec": {"memberClusters": members, "scaledObjectSpec": {
                    "scaleTargetRef": {"name": name}, "triggers": []}}
            }))
            .unwrap(),
        )
    }

    fn names(refs: Vec<ObjectRef<DistributedScaledObject>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn a_status_write_does_not_re_plan_a_dso_but_spec_and_pause_do() {
        let before = dso("a", &["m1"]);
        let mut status_only = (*before).clone();
        status_only.status = Some(Default::default());
        status_only.metadata.resource_version = Some("2".into());
        assert_eq!(planned_from(&before), planned_from(&status_only));
        let mut scaled = (*before).clone();
        scaled.metadata.generation = Some(2);
        assert_ne!(planned_from(&before), planned_from(&scaled));
        let mut paused = (*before).clone();
        paused.metadata.annotations = Some(BTreeMap::from([(
            "autoscaling.keda.sh/paused".to_owned(),
            "true".to_owned(),
        )]));
        assert_ne!(planned_from(&before), planned_from(&paused));
        let mut deleted = (*before).clone();
        deleted.metadata.deletion_timestamp = Some(kedge_core::time::to_time(SystemTime::now()));
        assert_ne!(planned_from(&before), planned_from(&deleted));
    }

    #[test]
    fn a_member_change_re_plans_only_the_dsos_involving_it() {
        let all = [
            dso("a", &["m1", "m2"]),
            dso("b", &["m3"]),
            dso("everywhere", &[]),
            dso("moved-away", &["m4"]),
        ];
        let changed = |m: &[&str]| m.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
        let nobody = BTreeSet::new();
        assert_eq!(
            names(involving(&all, &changed(&["m2"]), &nobody)),
            ["a", "everywhere"]
        );
        assert_eq!(
            names(involving(&all, &changed(&["m3", "m9"]), &nobody)),
            ["b", "everywhere"]
        );
        // A member no longer listed that still holds a DSO's commands re-plans that DSO.
        let holding = BTreeSet::from(["team/moved-away".to_owned()]);
        assert_eq!(
            names(involving(&all, &changed(&["m1"]), &holding)),
            ["a", "everywhere", "moved-away"]
        );
        assert!(involving(&all, &BTreeSet::new(), &holding).is_empty());
    }
}

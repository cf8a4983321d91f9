//! Controllers of the hub cluster: DistributedScaledObjects and MemberCluster status. They read
//! the [`Fleet`] (sessions and agent reports) and write desired state into it; the QUIC
//! sessions do the rest.

pub mod cluster_profile;
pub mod decode;
pub mod dsj;
pub mod dso;
pub mod external_metrics;
pub mod member;
pub mod member_clusters;
pub mod observe;
pub mod pace;
pub mod runner;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kedge_core::crd::conditions::LABEL_DSO;
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject, MemberCluster};
use kube::api::PostParams;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::PredicateConfig;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::fleet::Fleet;
use crate::metrics::HubMetrics;
use crate::{Error, Result};
pub use member_clusters::MemberClusterCache;

/// The one field manager of every server-side apply the hub sends.
pub const FIELD_MANAGER: &str = "kedge-hub";

/// Longest wait for one call to the hub cluster's API.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest time between two status writes of one DSO.
pub const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// Runs one API call under `API_TIMEOUT`.
pub async fn bounded<T>(
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::Timeout { what }),
    }
}

/// kube-runtime's [`finalizer`](kube::runtime::finalizer()) for reconciliations run by
/// [`runner`]: kube's `Action` does not tell its requeue, so the action `reconcile` decides is
/// kept beside it. When the finalizer was only added or removed, that write triggers the next
/// reconciliation.
pub async fn with_finalizer<K, Fut>(
    api: &Api<K>,
    name: &str,
    obj: Arc<K>,
    reconcile: impl FnOnce(kube::runtime::finalizer::Event<K>) -> Fut,
) -> Result<runner::Action>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    Fut: std::future::Future<Output = Result<runner::Action>>,
{
    let decided = Mutex::new(None);
    let decided_ref = &decided;
    kube::runtime::finalizer(api, name, obj, |event| async move {
        let action = reconcile(event).await?;
        *decided_ref.lock().unwrap_or_else(|p| p.into_inner()) = Some(action);
        Ok(kube::runtime::controller::Action::await_change())
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))?;
    Ok(decided
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or(runner::Action::await_change()))
}

/// The watches of the DSO and DSJ controllers, as `health` names them.
const DSOS: &str = "DistributedScaledObjects";
const DSJS: &str = "DistributedScaledJobs";

/// Coalescing window of fleet changes before every DSO is reconciled again (at least: see
/// [`pace`]).
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

/// What every controller shares: the hub cluster's client, Events, the fleet, metrics and the
/// one cache of MemberClusters. What only one controller keeps is in its own context
/// ([`dso::DsoContext`], [`dsj::DsjContext`], [`member::MemberContext`]), which holds this
/// part: a controller reaches no other controller's state.
pub struct Shared {
    /// Client of the hub cluster.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Sessions, reports and desired state.
    pub fleet: Arc<Fleet>,
    /// Metrics.
    pub metrics: HubMetrics,
    /// Every MemberCluster, from a reflector (none in unit tests: read from the API then).
    member_clusters: Option<MemberClusterCache>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
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

impl Shared {
    /// The shared part over `client` and `fleet`; `member_clusters` is the reflector cache of
    /// MemberClusters.
    pub fn new(
        client: Client,
        fleet: Arc<Fleet>,
        metrics: HubMetrics,
        member_clusters: Option<MemberClusterCache>,
    ) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok();
        Self {
            recorder: Recorder::new(client.clone(), FIELD_MANAGER, instance),
            client,
            fleet,
            metrics,
            member_clusters,
        }
    }

    /// Every MemberCluster, from the reflector cache once it has listed them (the API is
    /// read only before that, or without a cache).
    pub async fn member_clusters(&self) -> Result<Vec<Arc<MemberCluster>>> {
        if let Some(cache) = &self.member_clusters
            && let Some(store) = cache.listed(API_TIMEOUT).await
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
        let store = self.member_clusters.as_ref()?.listed(API_TIMEOUT).await?;
        Some(store.get(&ObjectRef::new(name)).is_some())
    }

    /// Every MemberCluster in the reflector cache now (none before its first list).
    pub fn member_clusters_cached(&self) -> Vec<Arc<MemberCluster>> {
        self.member_clusters
            .as_ref()
            .map(|cache| cache.store().state())
            .unwrap_or_default()
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

#[cfg(test)]
impl Shared {
    /// A shared part whose client points at nothing (no call is made until one is used).
    pub(crate) fn for_tests() -> Arc<Self> {
        let liveness = crate::registry::Liveness {
            interval: Duration::from_secs(1),
            tolerance: 3,
        };
        let registry = crate::registry::SessionRegistry::new(liveness, HubMetrics::default());
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = Client::try_from(config).expect("a client");
        Arc::new(Self::new(
            client,
            Arc::new(Fleet::new(Arc::new(registry))),
            HubMetrics::default(),
            None,
        ))
    }
}

/// Writes `status` of the `K` named `namespace/name` with server-side apply (this hub's field
/// manager, forced), and counts the write for `controller`.
pub async fn write_status<K>(
    shared: &Shared,
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
    let api: Api<K> = Api::namespaced(shared.client.clone(), namespace);
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
    shared.metrics.status_written(controller);
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
    /// The namespace ClusterProfiles are published into; `None`: none are.
    pub cluster_profiles: Option<String>,
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
/// holding desired state there). A report from one member re-plans only its DSOs. A burst
/// waits for the reconciliations running and for their pause (see [`pace`]).
fn fleet_changes(
    fleet: Arc<Fleet>,
    store: Store<DistributedScaledObject>,
    pace: Arc<pace::Pace>,
) -> impl futures::Stream<Item = ObjectRef<DistributedScaledObject>> + Send + 'static {
    let rx = fleet.subscribe();
    let state = (rx, fleet, store, pace);
    futures::stream::unfold(state, |(mut rx, fleet, store, pace)| async move {
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
            pace.settled_or(pace::quiet(&mut rx, pace::QUIET)).await;
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
            return Some((futures::stream::iter(involved), (rx, fleet, store, pace)));
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
    let (member_clusters, cache) = member_cluster_cache(&client, &health, &shutdown);
    let shared = Arc::new(Shared::new(
        client,
        fleet,
        metrics,
        Some(MemberClusterCache::new(member_clusters)),
    ));
    let members = tokio::spawn(member::run(
        Arc::new(member::MemberContext::new(shared.clone())),
        shutdown.clone(),
    ));
    let profiles = spawn_cluster_profiles(&config, &shared, &health, &shutdown);
    let dsos = async {
        if config.dso {
            run_dsos(
                shared.clone(),
                config.scaler_address.clone(),
                &health,
                &shutdown,
            )
            .await;
        }
    };
    let dsjs = async {
        if config.dsj {
            run_dsjs(shared.clone(), &health, &shutdown).await;
        }
    };
    if config.dso || config.dsj {
        // Returns only on shutdown; if a controller stream ends before, so does this task,
        // and its supervisor stops the hub.
        tokio::join!(dsos, dsjs);
    } else {
        shutdown.cancelled().await;
    }
    if shutdown.is_cancelled() {
        let _ = members.await;
    }
    if let Some(task) = profiles
        && shutdown.is_cancelled()
    {
        let _ = task.await;
    }
    cache.abort();
}

/// With `config.cluster_profiles`, the ClusterProfile publisher (and with the DSJ controller
/// its cache of DSJs, for their taints), running until `shutdown`.
fn spawn_cluster_profiles(
    config: &ControllerConfig,
    shared: &Arc<Shared>,
    health: &Arc<decode::WatchHealth>,
    shutdown: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let namespace = config.cluster_profiles.clone()?;
    let dsjs = config
        .dsj
        .then(|| dsj_cache(&shared.client, health, shutdown));
    let ctx = cluster_profile::ProfileContext {
        shared: shared.clone(),
        namespace,
        dsjs: dsjs.as_ref().map(|(store, _)| store.clone()),
    };
    let stop = shutdown.clone();
    Some(tokio::spawn(async move {
        cluster_profile::run(Arc::new(ctx), stop).await;
        if let Some((_, cache)) = dsjs {
            cache.abort();
        }
    }))
}

/// A cache of DistributedScaledJobs for the ClusterProfile publisher (their taints), and the
/// task that fills it until `shutdown`.
fn dsj_cache(
    client: &Client,
    health: &Arc<decode::WatchHealth>,
    shutdown: &CancellationToken,
) -> (Store<DistributedScaledJob>, tokio::task::JoinHandle<()>) {
    let (store, writer) = reflector::store();
    let cache = reflector::reflector(
        writer,
        decode::watch::<DistributedScaledJob>(
            client.clone(),
            "DistributedScaledJobs (taints)",
            health.clone(),
            Some(store.clone()),
            None,
        ),
    )
    .backoff(health.backoff())
    .for_each(|_| futures::future::ready(()));
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = cache => {}
        }
    });
    (store, task)
}

/// One cache of MemberClusters for every controller (nothing lists them per reconcile), and
/// the task that fills it until `shutdown`.
fn member_cluster_cache(
    client: &Client,
    health: &Arc<decode::WatchHealth>,
    shutdown: &CancellationToken,
) -> (Store<MemberCluster>, tokio::task::JoinHandle<()>) {
    let (member_clusters, writer) = reflector::store();
    let cache = reflector::reflector(
        writer,
        decode::watch::<MemberCluster>(
            client.clone(),
            "MemberClusters",
            health.clone(),
            Some(member_clusters.clone()),
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
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = cache => {}
        }
    });
    (member_clusters, task)
}

/// Undecodable objects of one kind are reported (and released) apart from its controller;
/// the task ends with the watch that feeds `bad`, or when aborted.
fn spawn_reporter<C: AsRef<Shared> + Send + Sync + 'static>(
    ctx: Arc<C>,
    hooks: decode::KindHooks<C>,
    bad: tokio::sync::mpsc::UnboundedReceiver<decode::Undecodable>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(decode::report(ctx, hooks, Arc::default(), bad))
}

/// Runs the DistributedScaledObject controller until `shutdown`.
async fn run_dsos(
    shared: Arc<Shared>,
    scaler_address: Option<String>,
    health: &Arc<decode::WatchHealth>,
    shutdown: &CancellationToken,
) {
    let client = shared.client.clone();
    // A DSO's own status writes change nothing it plans from: they do not trigger it again.
    let (store, dso_writer) = reflector::store();
    let (bad_dsos, bad_dso_rx) = tokio::sync::mpsc::unbounded_channel();
    let dso_changes = decode::watch::<DistributedScaledObject>(
        client.clone(),
        DSOS,
        health.clone(),
        Some(store.clone()),
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
    // Only the children kedge made, which carry its label: the hub cluster's other
    // ScaledObjects are KEDA users' own, and would size the cache and wake it with every
    // status KEDA writes. One whose label someone removes leaves the cache as if deleted,
    // and its DSO puts it back. Nothing reads who manages which field.
    let so_changes = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &scaled_object_resource()),
        watcher::Config::default().labels(LABEL_DSO),
    )
    .default_backoff()
    .modify(|so| so.managed_fields_mut().clear())
    .reflect(so_writer)
    .touched_objects();
    // A DSO that appears, changes or goes may change who wins a workload it shares with
    // others: reconcile those too, so both sides show the conflict (and its end).
    let others = decode::watch::<DistributedScaledObject>(
        client,
        "DistributedScaledObjects (shared workloads)",
        health.clone(),
        None,
        None,
    )
    .backoff(health.backoff())
    .touched_objects();
    let shared_target = sharing_a_target_of(store.clone(), others);
    let fleet = shared.fleet.clone();
    let ctx = Arc::new(dso::DsoContext::new(
        shared,
        store.clone(),
        scaled_objects,
        scaler_address,
    ));
    let reporter = spawn_reporter(ctx.clone(), dso::HOOKS, bad_dso_rx);
    info!("DistributedScaledObject controller started");
    let triggers = futures::stream::select_all([
        themselves(dso_changes).boxed(),
        owners_of(so_changes).boxed(),
        shared_target.boxed(),
        fleet_changes(fleet, store.clone(), ctx.pace.clone()).boxed(),
    ]);
    runner::run(
        store,
        triggers,
        dso::reconcile,
        dso::error_policy,
        ctx,
        shutdown.clone(),
    )
    .await;
    reporter.abort();
}

/// The objects of a watch (its errors are the watch's health's to report).
fn themselves<K: Resource + 'static>(
    changes: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K::DynamicType: Default,
{
    changes.filter_map(|o| futures::future::ready(o.ok().map(|o| ObjectRef::from_obj(&o))))
}

/// The owners of kind `K` of the children a watch reports.
fn owners_of<K: Resource + 'static>(
    children: impl futures::Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K::DynamicType: Default,
{
    children
        .filter_map(|child| futures::future::ready(child.ok()))
        .flat_map(|child| {
            let namespace = child.metadata.namespace.as_deref();
            let owners: Vec<_> = child
                .metadata
                .owner_references
                .iter()
                .flatten()
                .filter_map(|o| ObjectRef::from_owner_ref(namespace, o, K::DynamicType::default()))
                .collect();
            futures::stream::iter(owners)
        })
}

/// The other DSOs that share a workload with each DSO `changes` reports.
fn sharing_a_target_of(
    store: Store<DistributedScaledObject>,
    changes: impl futures::Stream<Item = Result<DistributedScaledObject, watcher::Error>>
    + Send
    + 'static,
) -> impl futures::Stream<Item = ObjectRef<DistributedScaledObject>> + Send + 'static {
    changes
        .filter_map(|o| futures::future::ready(o.ok()))
        .flat_map(move |changed| futures::stream::iter(sharing_a_target(&store, &changed)))
}

/// Runs the DistributedScaledJob controller until `shutdown`.
async fn run_dsjs(
    shared: Arc<Shared>,
    health: &Arc<decode::WatchHealth>,
    shutdown: &CancellationToken,
) {
    let client = shared.client.clone();
    let (store, dsj_writer) = reflector::store();
    let (bad_dsjs, bad_dsj_rx) = tokio::sync::mpsc::unbounded_channel();
    let dsj_changes = decode::watch::<DistributedScaledJob>(
        client.clone(),
        DSJS,
        health.clone(),
        Some(store.clone()),
        Some(bad_dsjs),
    )
    .backoff(health.backoff())
    .reflect(dsj_writer)
    .applied_objects();
    let owned = watcher::watcher(
        Api::<DynamicObject>::all_with(client, &scaled_object_resource()),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects();
    let ctx = Arc::new(dsj::DsjContext::new(shared, store.clone()));
    let reporter = spawn_reporter(ctx.clone(), dsj::HOOKS, bad_dsj_rx);
    info!("DistributedScaledJob controller started");
    let triggers = futures::stream::select(themselves(dsj_changes), owners_of(owned));
    runner::run(
        store,
        triggers,
        dsj::reconcile,
        dsj::error_policy,
        ctx,
        shutdown.clone(),
    )
    .await;
    reporter.abort();
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::SystemTime;

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

//! Controllers of the hub cluster: DistributedScaledObjects and MemberCluster status. They read
//! the [`Fleet`] (sessions and agent reports) and write desired state into it; the QUIC
//! sessions do the rest.

pub mod dso;
pub mod member;
pub mod observe;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kedge_core::crd::DistributedScaledObject;
use kedge_core::crd::dso::{DistributedScaledObjectStatus, DsoMemberClusterStatus};
use kube::api::PostParams;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::EventType;
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::fleet::Fleet;
use crate::metrics::HubMetrics;
use crate::{Error, Result};

/// The one field manager of every server-side apply the hub sends.
pub const FIELD_MANAGER: &str = "kedge-hub";

/// Longest wait for one call to the hub cluster's API.
const API_TIMEOUT: Duration = Duration::from_secs(10);

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

/// (owner `ns/name`, member) → (state, since when).
type MemberStates = HashMap<(String, String), (&'static str, SystemTime)>;

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
    /// Since when each (DSO, member) has been in its state.
    states: Mutex<MemberStates>,
    /// The DSO status this process wrote last, by owner.
    written: Mutex<HashMap<String, DistributedScaledObjectStatus>>,
    /// When the controllers started.
    started: tokio::time::Instant,
    /// How long after the start absent members keep their previous state.
    startup_grace: Duration,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// A context over `client` and `fleet`.
    pub fn new(client: Client, fleet: Arc<Fleet>, metrics: HubMetrics) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok();
        // Agents notice a lost hub only after their own heartbeat deadline and then back off
        // before dialing again: give them two deadlines.
        let fleet_deadline = fleet.registry().liveness().deadline().saturating_mul(2);
        Self {
            recorder: Recorder::new(client.clone(), FIELD_MANAGER, instance),
            client,
            fleet,
            metrics,
            scaled_objects: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
                "scaledobjects",
            ),
            states: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            started: tokio::time::Instant::now(),
            startup_grace: fleet_deadline,
        }
    }

    /// Whether the hub started so recently that agents may not have reconnected yet.
    pub fn starting(&self) -> bool {
        self.started.elapsed() < self.startup_grace
    }

    fn states(&self) -> std::sync::MutexGuard<'_, MemberStates> {
        // Entries are replaced whole; a poisoned lock holds no torn entry.
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `member` is in `state` for `owner`; returns since when.
    pub fn track(
        &self,
        owner: &str,
        member: &str,
        state: &'static str,
        previous: Option<&DsoMemberClusterStatus>,
        now: SystemTime,
    ) -> SystemTime {
        let mut states = self.states();
        let key = (owner.to_owned(), member.to_owned());
        let since = observe::since(
            state,
            states.get(&key).map(|(s, t)| (*s, *t)),
            previous,
            now,
        );
        states.insert(key, (state, since));
        since
    }

    /// Forgets everything tracked for `owner`.
    pub fn forget(&self, owner: &str) {
        self.states().retain(|(o, _), _| o != owner);
        self.written_map().remove(owner);
    }

    fn written_map(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, DistributedScaledObjectStatus>> {
        // Entries are replaced whole; a poisoned lock holds no torn entry.
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The status last written for `owner` by this process.
    pub fn written(&self, owner: &str) -> Option<DistributedScaledObjectStatus> {
        self.written_map().get(owner).cloned()
    }

    /// Records the status just written (or found already in place) for `owner`.
    pub fn remember(&self, owner: &str, status: DistributedScaledObjectStatus) {
        self.written_map().insert(owner.to_owned(), status);
    }

    /// Publishes an Event about a DSO; a failure is logged, never fatal.
    pub async fn publish(
        &self,
        dso: &DistributedScaledObject,
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

/// A status time: whole seconds, as the API server stores it.
pub fn time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Where the hub cluster is.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Kubeconfig of the hub cluster; `None`: in-cluster, then `$KUBECONFIG`, then
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Run the DistributedScaledObject controller.
    pub dso: bool,
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::KubeConfig(e.to_string()))?,
    };
    Ok(Client::try_from(config)?)
}

/// A stream that yields once per burst of fleet changes.
fn fleet_changes(rx: watch::Receiver<u64>) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        tokio::time::sleep(FLEET_THROTTLE).await;
        rx.borrow_and_update();
        Some(((), rx))
    })
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

/// Runs the controllers until `shutdown`. Only the hub that holds the lease calls this.
pub async fn run(
    config: ControllerConfig,
    client: Client,
    fleet: Arc<Fleet>,
    metrics: HubMetrics,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Context::new(client.clone(), fleet.clone(), metrics));
    let members = tokio::spawn(member::run(ctx.clone(), shutdown.clone()));
    if config.dso {
        info!("DistributedScaledObject controller started");
        let dsos = Api::<DistributedScaledObject>::all(client.clone());
        let children = Api::<DynamicObject>::all_with(client.clone(), &ctx.scaled_objects);
        let stop = shutdown.clone();
        Controller::new(dsos, watcher::Config::default())
            .owns_with(
                children,
                ctx.scaled_objects.clone(),
                watcher::Config::default(),
            )
            .reconcile_all_on(fleet_changes(fleet.subscribe()))
            .graceful_shutdown_on(async move { stop.cancelled().await })
            .run(dso::reconcile, dso::error_policy, ctx)
            .for_each(|_| futures::future::ready(()))
            .await;
    } else {
        shutdown.cancelled().await;
    }
    let _ = members.await;
}

//! The watches of the workloads the agent scales, started and stopped as the hub adds and
//! removes workloads: one per kind and namespace on the workloads themselves (only the named
//! ones are kept), and per namespace one on its pending pods (`status.phase=Pending`, for the
//! pending and unschedulable counts), one on its KEDA ScaledObjects and one on its
//! HorizontalPodAutoscalers (for conflicts). Only namespaces of workloads the policy allows
//! are watched. Every change wakes the report loop.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use kedge_protocol::{Failure, FailureCode, Retry, WorkloadRef, WorkloadStatus};
use kube::api::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

use super::facts::{
    HpaLite, PendingPod, PendingPodLite, ScaledObjectLite, Target, WorkloadFacts, WorkloadLite,
};
use super::listing::{Listing, Seen, status_of};
use crate::executor::{Executor, classify};
use crate::lite::LIST_PAGE;

/// A listing shared by its watch task and the report loop.
type Shared<F> = Arc<Mutex<Listing<F>>>;

/// Locks a listing. Every method finishes its update before returning, so a listing whose
/// lock was poisoned by a panic is consistent and safe to use.
fn lock<F>(listing: &Shared<F>) -> MutexGuard<'_, Listing<F>> {
    listing.lock().unwrap_or_else(|e| e.into_inner())
}

/// A kind the agent watches for its workloads, and what it keeps of each object.
trait Watched: Resource + Clone + DeserializeOwned + Debug + Send + 'static {
    type Facts: PartialEq + Send + 'static;
    /// What is kept of the object; `None` forgets it.
    fn facts(&self) -> Option<Self::Facts>;
}

impl Watched for WorkloadLite {
    type Facts = WorkloadFacts;
    fn facts(&self) -> Option<WorkloadFacts> {
        Some(WorkloadFacts::of(self))
    }
}

impl Watched for PendingPodLite {
    type Facts = PendingPod;
    fn facts(&self) -> Option<PendingPod> {
        PendingPod::of(self)
    }
}

impl Watched for HpaLite {
    type Facts = Target;
    fn facts(&self) -> Option<Target> {
        self.target()
    }
}

impl Watched for ScaledObjectLite {
    type Facts = Target;
    fn facts(&self) -> Option<Target> {
        Some(self.target())
    }
}

/// What a watch error means for the report: a failure when retrying will not soon help
/// (RBAC, a kind not served, a bad request); `None` when the watch only has to resume.
fn lasting_failure(error: &watcher::Error, what: &str) -> Option<Failure> {
    let failure = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => classify(e, what),
        watcher::Error::WatchError(status) => classify(&kube::Error::Api(status.clone()), what),
        watcher::Error::NoResourceVersion => return None,
    };
    if failure.retry != Retry::Permanent {
        return None;
    }
    Some(match failure.code {
        // Most likely an agent image newer than its chart's RBAC: say what it needs.
        FailureCode::Forbidden => Failure {
            message: format!(
                "{}; the agent lists and watches what it scales (the kedge-agent chart 0.2.0 and later grants list and watch)",
                failure.message
            ),
            ..failure
        },
        _ => failure,
    })
}

/// Follows what `api` and `config` select into `listing`, keeping only the objects named in
/// `only` when given; wakes `report_now` on every change. Never ends. A watch that cannot go
/// on (a lasting failure: RBAC, a kind not served) is reported, then started over with a
/// list after kube-runtime's backoff (up to 30 s), so that the listing says when it works
/// again; other errors only resume the watch, with the same backoff.
async fn follow<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
    only: Option<BTreeSet<String>>,
    listing: Shared<K::Facts>,
    report_now: Arc<Notify>,
    what: String,
) {
    let kept = |object: &K| {
        let name = object.meta().name.as_ref()?;
        if only.as_ref().is_some_and(|only| !only.contains(name)) {
            return None;
        }
        Some((name.clone(), object.facts()))
    };
    let config = config.page_size(LIST_PAGE);
    let mut restart = watcher::DefaultBackoff::default();
    loop {
        let mut events = watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed();
        // Objects of a (re)list, applied together when it completes, as a reflector does.
        let mut listed: Vec<(String, K::Facts)> = Vec::new();
        while let Some(event) = events.next().await {
            let changed = match event {
                Ok(watcher::Event::Apply(object)) => {
                    kept(&object).is_some_and(|(name, facts)| lock(&listing).put(name, facts))
                }
                Ok(watcher::Event::Delete(object)) => {
                    kept(&object).is_some_and(|(name, _)| lock(&listing).put(name, None))
                }
                Ok(watcher::Event::Init) => {
                    listed.clear();
                    false
                }
                Ok(watcher::Event::InitApply(object)) => {
                    if let Some((name, Some(facts))) = kept(&object) {
                        listed.push((name, facts));
                    }
                    false
                }
                Ok(watcher::Event::InitDone) => {
                    debug!(what = %what, count = listed.len(), "listed");
                    lock(&listing).replace(std::mem::take(&mut listed))
                }
                Err(e) => {
                    let failure = lasting_failure(&e, &what);
                    match &failure {
                        // A kind the member does not serve (KEDA not installed): expected.
                        Some(f) if f.code == FailureCode::NotFound => {
                            debug!(error = %e, "cannot {what}; retrying")
                        }
                        _ => warn!(error = %e, "cannot {what}; retrying"),
                    }
                    if let Some(failure) = failure {
                        if lock(&listing).fail(failure) {
                            report_now.notify_one();
                        }
                        break;
                    }
                    false
                }
            };
            if changed {
                report_now.notify_one();
            }
        }
        let delay = restart.next().unwrap_or(Duration::from_secs(30));
        tokio::time::sleep(delay).await;
    }
}

/// A running watch: its listing and its task, stopped when dropped.
#[derive(Debug)]
struct Running<F> {
    listing: Shared<F>,
    task: AbortOnDropHandle<()>,
}

impl<F: PartialEq + Send + 'static> Running<F> {
    fn start<K: Watched<Facts = F>>(
        api: Api<K>,
        config: watcher::Config,
        only: Option<BTreeSet<String>>,
        report_now: &Arc<Notify>,
        what: String,
    ) -> Self {
        let listing: Shared<F> = Arc::default();
        let task = tokio::spawn(follow(
            api,
            config,
            only,
            listing.clone(),
            report_now.clone(),
            what,
        ));
        Self {
            listing,
            task: AbortOnDropHandle::new(task),
        }
    }
}

/// Where the workloads of one kind live: `(apiVersion, kind, namespace)`.
type KindScope = (String, String, String);

fn scope_of(w: &WorkloadRef) -> KindScope {
    (w.api_version.clone(), w.kind.clone(), w.namespace.clone())
}

/// The watch of one kind in one namespace, keeping the workloads named.
#[derive(Debug)]
struct KindWatch {
    names: BTreeSet<String>,
    running: Running<WorkloadFacts>,
}

/// The watches of one namespace that has workloads.
#[derive(Debug)]
struct NamespaceWatches {
    pods: Running<PendingPod>,
    scaled_objects: Running<Target>,
    hpas: Running<Target>,
}

impl NamespaceWatches {
    fn start(
        client: &Client,
        namespace: &str,
        config: &watcher::Config,
        report_now: &Arc<Notify>,
    ) -> Self {
        let pending = config.clone().fields("status.phase=Pending");
        Self {
            pods: Running::start(
                Api::<PendingPodLite>::namespaced(client.clone(), namespace),
                pending,
                None,
                report_now,
                format!("watch pending pods in {namespace}"),
            ),
            scaled_objects: Running::start(
                Api::<ScaledObjectLite>::namespaced(client.clone(), namespace),
                config.clone(),
                None,
                report_now,
                format!("watch KEDA ScaledObjects in {namespace}"),
            ),
            hpas: Running::start(
                Api::<HpaLite>::namespaced(client.clone(), namespace),
                config.clone(),
                None,
                report_now,
                format!("watch HorizontalPodAutoscalers in {namespace}"),
            ),
        }
    }

    fn finished(&self) -> bool {
        self.pods.task.is_finished()
            || self.scaled_objects.task.is_finished()
            || self.hpas.task.is_finished()
    }
}

/// The watches of the workloads the agent scales.
pub struct Watches {
    client: Client,
    report_now: Arc<Notify>,
    /// Every watch is renewed after this (`--watch-timeout`).
    config: watcher::Config,
    kinds: HashMap<KindScope, KindWatch>,
    namespaces: HashMap<String, NamespaceWatches>,
    /// Workloads no watch can follow, and why: outside the policy, or a kind not served.
    unwatchable: HashMap<WorkloadRef, Failure>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("kinds", &self.kinds.keys().collect::<Vec<_>>())
            .field("namespaces", &self.namespaces.keys().collect::<Vec<_>>())
            .field("unwatchable", &self.unwatchable.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Watches {
    /// No watch yet; changes will wake `report_now`; every watch is renewed after
    /// `timeout` (whole seconds), which is when the API server checks its permission again.
    pub fn new(client: Client, report_now: Arc<Notify>, timeout: Duration) -> Self {
        let seconds = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1);
        Self {
            client,
            report_now,
            config: watcher::Config::default().timeout(seconds),
            kinds: HashMap::new(),
            namespaces: HashMap::new(),
            unwatchable: HashMap::new(),
        }
    }

    /// Watches exactly `workloads`: starts what is missing (a kind watch whose names changed
    /// starts over, listing again), stops what is no longer needed. Resolving a kind may ask
    /// discovery (once per kind); a workload that could not be watched is tried again only
    /// when `retry` (the report tick), so a kind the member does not serve costs one
    /// discovery per tick, not one per watch event.
    pub async fn sync<'a>(
        &mut self,
        executor: &Executor,
        workloads: impl IntoIterator<Item = &'a WorkloadRef>,
        retry: bool,
    ) {
        let mut wanted: HashMap<KindScope, (ApiResource, BTreeSet<String>)> = HashMap::new();
        let mut unwatchable = HashMap::new();
        for w in workloads {
            if let Some(failure) = self.unwatchable.get(w).filter(|_| !retry) {
                unwatchable.insert(w.clone(), failure.clone());
                continue;
            }
            // The policy is checked for every workload; its kind is resolved once.
            match executor.workload_resource(w).await {
                Ok(resource) => {
                    let (_, names) = wanted
                        .entry(scope_of(w))
                        .or_insert_with(|| (resource, BTreeSet::new()));
                    names.insert(w.name.clone());
                }
                Err(failure) => {
                    debug!(message = %failure.message, "cannot watch workload");
                    unwatchable.insert(w.clone(), failure);
                }
            }
        }
        self.unwatchable = unwatchable;
        // A watch whose task ended (it never does unless it panicked) starts over too.
        self.kinds.retain(|scope, watch| {
            wanted
                .get(scope)
                .is_some_and(|(_, names)| *names == watch.names)
                && !watch.running.task.is_finished()
        });
        let namespaces: BTreeSet<String> = wanted.keys().map(|(_, _, ns)| ns.clone()).collect();
        self.namespaces
            .retain(|ns, watches| namespaces.contains(ns) && !watches.finished());
        for ns in namespaces {
            if !self.namespaces.contains_key(&ns) {
                let watches =
                    NamespaceWatches::start(&self.client, &ns, &self.config, &self.report_now);
                self.namespaces.insert(ns, watches);
            }
        }
        for (scope, (resource, names)) in wanted {
            if self.kinds.contains_key(&scope) {
                continue;
            }
            let (_, kind, ns) = &scope;
            let api = Api::<WorkloadLite>::namespaced_with(self.client.clone(), ns, &resource);
            // One workload of its kind here (the usual case): the server sends only its events.
            let config = match names.first() {
                Some(only) if names.len() == 1 => {
                    self.config.clone().fields(&format!("metadata.name={only}"))
                }
                _ => self.config.clone(),
            };
            let what = format!("watch {kind}s in {ns}");
            let running = Running::start(api, config, Some(names.clone()), &self.report_now, what);
            self.kinds.insert(scope, KindWatch { names, running });
        }
    }

    /// The status of `workload` from its watches at `now_unix_ms`; `None` until they have
    /// listed, or when it is not watched.
    pub fn status(&self, workload: &WorkloadRef, now_unix_ms: i64) -> Option<WorkloadStatus> {
        if let Some(failure) = self.unwatchable.get(workload) {
            return Some(WorkloadStatus {
                failure: Some(failure.clone()),
                ..WorkloadStatus::absent(workload.clone())
            });
        }
        let kind = self.kinds.get(&scope_of(workload))?;
        let ns = self.namespaces.get(&workload.namespace)?;
        let (workloads, pods) = (lock(&kind.running.listing), lock(&ns.pods.listing));
        let (scaled_objects, hpas) = (lock(&ns.scaled_objects.listing), lock(&ns.hpas.listing));
        let seen = Seen {
            workloads: &workloads,
            pods: &pods,
            scaled_objects: &scaled_objects,
            hpas: &hpas,
        };
        status_of(workload, seen, now_unix_ms)
    }
}

//! Watches the Jobs the agent manages and their pods (by kedge's ownership label, in each
//! allowed namespace or in all) and feeds the index; every change wakes the report loop.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use kedge_core::crd::conditions::LABEL_DSJ;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::facts::{JobFacts, JobLite, PodFacts, PodLite};
use super::index::JobIndex;
use crate::lite::LIST_PAGE;
use crate::policy::NamespacePolicy;

/// The index shared by the watch tasks and the report loop.
pub type SharedIndex = Arc<Mutex<JobIndex>>;

/// Locks the index. A panic while it is held leaves it consistent per event (every method
/// finishes its update before returning), so a poisoned lock is safe to use.
pub fn lock(index: &SharedIndex) -> MutexGuard<'_, JobIndex> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

/// A kind the agent watches, and how its objects update the index.
trait Tracked: Resource + Clone + DeserializeOwned + Debug + Send + 'static {
    type Entry: Send;
    const WHAT: &'static str;
    fn entry(&self) -> Option<Self::Entry>;
    fn apply(index: &mut JobIndex, entry: Self::Entry) -> bool;
    fn delete(index: &mut JobIndex, entry: Self::Entry) -> bool;
    fn replace(index: &mut JobIndex, namespace: Option<&str>, listed: Vec<Self::Entry>) -> bool;
}

impl Tracked for JobLite {
    type Entry = (kedge_protocol::JobRef, JobFacts);
    const WHAT: &'static str = "Jobs";
    fn entry(&self) -> Option<Self::Entry> {
        JobFacts::of(self)
    }
    fn apply(index: &mut JobIndex, (key, facts): Self::Entry) -> bool {
        index.apply_job(key, facts)
    }
    fn delete(index: &mut JobIndex, (key, _): Self::Entry) -> bool {
        index.delete_job(&key)
    }
    fn replace(index: &mut JobIndex, namespace: Option<&str>, listed: Vec<Self::Entry>) -> bool {
        index.replace_jobs(namespace, listed)
    }
}

impl Tracked for PodLite {
    type Entry = (kedge_protocol::JobRef, String, PodFacts);
    const WHAT: &'static str = "pods";
    fn entry(&self) -> Option<Self::Entry> {
        PodFacts::of(self)
    }
    fn apply(index: &mut JobIndex, (job, pod, facts): Self::Entry) -> bool {
        index.apply_pod(job, pod, facts)
    }
    fn delete(index: &mut JobIndex, (job, pod, _): Self::Entry) -> bool {
        index.delete_pod(&job, &pod)
    }
    fn replace(index: &mut JobIndex, namespace: Option<&str>, listed: Vec<Self::Entry>) -> bool {
        index.replace_pods(namespace, listed)
    }
}

/// The namespaces to watch: each allowed one, or every namespace (`None`) when all are.
pub fn scopes(policy: &NamespacePolicy) -> Vec<Option<String>> {
    match policy.namespaces() {
        Some(allowed) => allowed.iter().cloned().map(Some).collect(),
        None => vec![None],
    }
}

/// An index for watches of Jobs and pods in `scopes`.
pub fn index_for(scopes: &[Option<String>]) -> SharedIndex {
    Arc::new(Mutex::new(JobIndex::new(2 * scopes.len())))
}

/// Watches Jobs in `namespace` (all when `None`) until the stream ends, which it never does.
pub async fn follow_jobs(
    client: Client,
    namespace: Option<String>,
    index: SharedIndex,
    report_now: Arc<Notify>,
) {
    follow::<JobLite>(client, namespace, index, report_now).await;
}

/// Watches the managed pods in `namespace` (all when `None`), which never ends.
pub async fn follow_pods(
    client: Client,
    namespace: Option<String>,
    index: SharedIndex,
    report_now: Arc<Notify>,
) {
    follow::<PodLite>(client, namespace, index, report_now).await;
}

async fn follow<K>(
    client: Client,
    namespace: Option<String>,
    index: SharedIndex,
    report_now: Arc<Notify>,
) where
    K: Tracked<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    let api: Api<K> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let config = watcher::Config::default()
        .labels(LABEL_DSJ)
        .page_size(LIST_PAGE);
    let mut events = watcher(api, config).default_backoff().boxed();
    let scope = namespace.as_deref().unwrap_or("*");
    // Objects of a (re)list, applied together when it completes, as a reflector does.
    let mut listing: Vec<K::Entry> = Vec::new();
    let mut listed_once = false;
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(watcher::Event::Apply(object)) => object
                .entry()
                .is_some_and(|entry| K::apply(&mut lock(&index), entry)),
            Ok(watcher::Event::Delete(object)) => object
                .entry()
                .is_some_and(|entry| K::delete(&mut lock(&index), entry)),
            Ok(watcher::Event::Init) => {
                listing.clear();
                false
            }
            Ok(watcher::Event::InitApply(object)) => {
                listing.extend(object.entry());
                false
            }
            Ok(watcher::Event::InitDone) => {
                let listed = std::mem::take(&mut listing);
                let count = listed.len();
                let mut index = lock(&index);
                let changed = K::replace(&mut index, namespace.as_deref(), listed);
                let first = !listed_once;
                if first {
                    listed_once = true;
                    index.listed();
                    info!(namespace = scope, count, "listed managed {}", K::WHAT);
                } else {
                    debug!(namespace = scope, count, "relisted managed {}", K::WHAT);
                }
                // The first list completes the index even when it found nothing.
                changed || first
            }
            Err(e) => {
                warn!(namespace = scope, error = %e, "watching managed {} failed; retrying", K::WHAT);
                false
            }
        };
        if changed {
            report_now.notify_one();
        }
    }
}

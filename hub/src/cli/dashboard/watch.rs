//! The dashboard's watches: one per kind, with the user's own credentials, feeding the
//! [`Model`]. No polling: list once, then watch; a failed watch (forbidden, a CRD missing,
//! the API unreachable) is shown on the page and retried with backoff.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject, MemberCluster};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;

use super::model::{Kind, Model};

/// The model and the signal that it has something to push.
#[derive(Debug, Default)]
pub struct Shared {
    /// The state.
    pub model: Mutex<Model>,
    /// Woken after each change.
    pub changed: Notify,
}

impl Shared {
    /// Runs `f` on the model and wakes the pusher. A poisoned lock (a panic elsewhere) is
    /// taken over: the model holds no invariant a half-done change could break for long,
    /// since the next relist replaces every object.
    pub fn update<T>(&self, f: impl FnOnce(&mut Model) -> T) -> T {
        let mut model = self
            .model
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = f(&mut model);
        drop(model);
        self.changed.notify_one();
        out
    }

    /// Runs `f` on the model without waking anyone.
    pub fn update_quietly<T>(&self, f: impl FnOnce(&mut Model) -> T) -> T {
        let mut model = self
            .model
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut model)
    }

    /// Reads the model.
    pub fn read<T>(&self, f: impl FnOnce(&Model) -> T) -> T {
        self.update_quietly(|m| f(m))
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::Member => ApiResource::erase::<MemberCluster>(&()),
        Kind::Dso => ApiResource::erase::<DistributedScaledObject>(&()),
        Kind::Dsj => ApiResource::erase::<DistributedScaledJob>(&()),
        Kind::Event => ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&()),
    }
}

/// Starts one watch per kind; they run until the runtime stops.
pub fn spawn_all(client: &kube::Client, namespace: Option<&str>, shared: &Arc<Shared>) {
    for kind in Kind::ALL {
        let resource = resource(kind);
        let api: Api<DynamicObject> = match (kind, namespace) {
            (Kind::Member, _) | (_, None) => Api::all_with(client.clone(), &resource),
            (_, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        };
        tokio::spawn(watch(kind, api, Arc::clone(shared)));
    }
    tokio::spawn(prune(Arc::clone(shared)));
}

async fn watch(kind: Kind, api: Api<DynamicObject>, shared: Arc<Shared>) {
    let stream = kube::runtime::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listing: Vec<serde_json::Value> = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(object)) => {
                listing.extend(to_value(&object).and_then(|o| super::model::view(kind, &o)));
            }
            Ok(Event::InitDone) => {
                let objects = std::mem::take(&mut listing);
                shared.update(|m| m.relisted(kind, objects, now_ms()));
            }
            Ok(Event::Apply(object)) => {
                if let Some(v) = to_value(&object) {
                    shared.update(|m| m.apply(kind, &v, now_ms()));
                }
            }
            Ok(Event::Delete(object)) => {
                if let Some(v) = to_value(&object) {
                    shared.update(|m| m.delete(kind, &v));
                }
            }
            Err(error) => {
                let message = describe(kind, &error);
                tracing::warn!(resource = kind.resource(), %message, "watch failed; retrying");
                shared.update(|m| m.failed(kind, message));
            }
        }
    }
}

fn to_value(object: &DynamicObject) -> Option<serde_json::Value> {
    serde_json::to_value(object).ok()
}

/// The page's words for a failed watch: what cannot be read and what to do.
pub fn describe(kind: Kind, error: &watcher::Error) -> String {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => Some(s),
        _ => None,
    };
    match status {
        Some(s) if s.code == 403 => format!(
            "cannot read {}: {} (the dashboard reads with your kubeconfig; ask for get, list and watch on it{})",
            kind.resource(),
            s.message,
            if kind == Kind::Member {
                " (cluster-scoped); the workload pages work without it"
            } else {
                ", or limit the dashboard to a namespace you may read with --namespace"
            }
        ),
        Some(s) if s.code == 404 => format!(
            "cannot read {}: the API does not serve it (are kedge's CRDs installed? `kubectl kedge crds | kubectl apply -f -`)",
            kind.resource()
        ),
        _ => format!("cannot read {}: {error}", kind.resource()),
    }
}

async fn prune(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        tick.tick().await;
        shared.update(|m| m.prune(now_ms()));
    }
}

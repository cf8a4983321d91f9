//! What the DSO controller keeps between reconciliations, over the [`Shared`] part: the
//! caches it reads (every DSO, the child ScaledObjects) and, by owner, what it decided and
//! wrote last. Nothing else reaches it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kedge_core::crd::DistributedScaledObject;
use kedge_core::crd::dso::DistributedScaledObjectStatus;
use kedge_core::dso::member::MemberPhase;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller::pace::Pace;
use crate::controller::{STATUS_WRITE_INTERVAL, Shared, lock, scaled_object_resource};
use crate::podmetrics::Reading;

/// Owner `ns/name` → member → (phase, since when).
type MemberPhases = HashMap<String, BTreeMap<String, (MemberPhase, SystemTime)>>;

/// The DSO controller's context.
pub struct DsoContext {
    /// What every controller shares.
    pub shared: Arc<Shared>,
    /// Every DSO, as the controller's reflector sees them (for claims on shared workloads).
    dsos: Store<DistributedScaledObject>,
    /// ScaledObjects of the hub cluster as the DSO controller's watch sees them.
    child_scaled_objects: Store<DynamicObject>,
    /// What KEDA dials to reach the hub's external scaler; `None`: the hub serves none.
    scaler_address: Option<String>,
    /// Since when each (DSO, member) has been in its phase.
    phases: Mutex<MemberPhases>,
    /// The DSO status this process decided last, by owner (written, or due to be).
    written: Mutex<HashMap<String, DistributedScaledObjectStatus>>,
    /// When each DSO's status was last written.
    status_writes: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Failures of the last reconciliation by owner, for its next `Degraded` condition.
    errors: Mutex<HashMap<String, Vec<String>>>,
    /// The pod-metrics readings each DSO published last (metrics to take back).
    pod_readings: Mutex<HashMap<String, Vec<Reading>>>,
    /// What the reconciliations cost lately: fleet-triggered re-planning waits for it.
    pub pace: Arc<Pace>,
}

impl std::fmt::Debug for DsoContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DsoContext")
            .field("scaler_address", &self.scaler_address)
            .finish_non_exhaustive()
    }
}

impl AsRef<Shared> for DsoContext {
    fn as_ref(&self) -> &Shared {
        &self.shared
    }
}

impl DsoContext {
    /// The DSO controller's context: `dsos` is its reflector store, `child_scaled_objects`
    /// that of the ScaledObjects it owns.
    pub fn new(
        shared: Arc<Shared>,
        dsos: Store<DistributedScaledObject>,
        child_scaled_objects: Store<DynamicObject>,
        scaler_address: Option<String>,
    ) -> Self {
        Self {
            shared,
            dsos,
            child_scaled_objects,
            scaler_address,
            phases: Mutex::default(),
            written: Mutex::default(),
            status_writes: Mutex::default(),
            errors: Mutex::default(),
            pod_readings: Mutex::default(),
            pace: Arc::default(),
        }
    }

    /// What KEDA dials to reach the hub's external scaler; `None`: the hub serves none.
    pub(super) fn scaler_address(&self) -> Option<&str> {
        self.scaler_address.as_deref()
    }

    /// Every DSO the controller knows.
    pub(super) fn dsos(&self) -> Vec<Arc<DistributedScaledObject>> {
        self.dsos.state()
    }

    /// The ScaledObject `namespace/name` as last seen by the DSO controller's watch.
    pub(super) fn cached_scaled_object(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<DynamicObject>> {
        let key = ObjectRef::new_with(name, scaled_object_resource()).within(namespace);
        self.child_scaled_objects.get(&key)
    }

    /// Publishes the pod-metrics readings of DSO `namespace/name` in the hub's metrics,
    /// taking back what it published before that is gone (all of it for an empty list).
    pub(super) fn publish_readings(&self, namespace: &str, name: &str, readings: Vec<Reading>) {
        let owner = format!("{namespace}/{name}");
        let mut published = lock(&self.pod_readings);
        let previous = published.remove(&owner).unwrap_or_default();
        self.shared
            .metrics
            .pod_metric_readings(namespace, name, &readings, &previous);
        if !readings.is_empty() {
            published.insert(owner, readings);
        }
    }

    /// The phase `member` was last seen in for `owner`, and since when.
    pub(super) fn tracked(&self, owner: &str, member: &str) -> Option<(MemberPhase, SystemTime)> {
        lock(&self.phases).get(owner)?.get(member).copied()
    }

    /// Records the phases of `owner`'s members (those of members not listed are forgotten).
    pub(super) fn track(&self, owner: &str, phases: BTreeMap<String, (MemberPhase, SystemTime)>) {
        lock(&self.phases).insert(owner.to_owned(), phases);
    }

    /// Keeps a failure of `owner`'s reconciliation for its next status.
    pub(super) fn record_error(&self, owner: &str, message: String) {
        let mut errors = lock(&self.errors);
        let list = errors.entry(owner.to_owned()).or_default();
        if !list.contains(&message) {
            list.push(message);
        }
    }

    /// The failures recorded for `owner` since its last reconciliation.
    pub(super) fn take_errors(&self, owner: &str) -> Vec<String> {
        lock(&self.errors).remove(owner).unwrap_or_default()
    }

    /// Forgets everything tracked for `owner`.
    pub(super) fn forget(&self, owner: &str) {
        lock(&self.phases).remove(owner);
        lock(&self.written).remove(owner);
        lock(&self.status_writes).remove(owner);
        lock(&self.errors).remove(owner);
    }

    /// How long `owner`'s status must wait before it is written again (`None`: now). One
    /// write per [`STATUS_WRITE_INTERVAL`] at most: while a thousand members report a change
    /// one after the other, their DSO's status is written once or twice, not a thousand
    /// times over.
    pub(super) fn status_wait(&self, owner: &str) -> Option<Duration> {
        let last = *lock(&self.status_writes).get(owner)?;
        STATUS_WRITE_INTERVAL
            .checked_sub(last.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Records that `owner`'s status was just written.
    pub(super) fn status_written(&self, owner: &str) {
        lock(&self.status_writes).insert(owner.to_owned(), tokio::time::Instant::now());
    }

    /// The status last decided for `owner` by this process.
    pub(super) fn written(&self, owner: &str) -> Option<DistributedScaledObjectStatus> {
        lock(&self.written).get(owner).cloned()
    }

    /// Records the status decided for `owner` (written, in place, or due to be written).
    pub(super) fn remember(&self, owner: &str, status: DistributedScaledObjectStatus) {
        lock(&self.written).insert(owner.to_owned(), status);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;

    use super::*;

    fn context() -> DsoContext {
        let (dsos, _) = reflector::store();
        let children = reflector::store::Writer::new(scaled_object_resource()).as_reader();
        DsoContext::new(Shared::for_tests(), dsos, children, None)
    }

    #[tokio::test]
    async fn a_failure_is_kept_once_until_the_next_reconciliation_takes_it() {
        let ctx = context();
        ctx.record_error("team/web", "listing MemberClusters: timeout".into());
        ctx.record_error("team/web", "listing MemberClusters: timeout".into());
        ctx.record_error("team/web", "writing status: conflict".into());
        assert_eq!(
            ctx.take_errors("team/web"),
            [
                "listing MemberClusters: timeout",
                "writing status: conflict"
            ]
        );
        assert!(ctx.take_errors("team/web").is_empty());
        assert!(ctx.take_errors("team/other").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_waits_for_the_rest_of_the_interval_after_a_write() {
        let ctx = context();
        assert_eq!(ctx.status_wait("team/web"), None);
        ctx.status_written("team/web");
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(
            ctx.status_wait("team/web"),
            Some(STATUS_WRITE_INTERVAL - Duration::from_millis(400))
        );
        assert_eq!(ctx.status_wait("team/other"), None);
        tokio::time::advance(STATUS_WRITE_INTERVAL).await;
        assert_eq!(ctx.status_wait("team/web"), None);
    }

    #[tokio::test]
    async fn forgetting_a_dso_drops_what_was_tracked_for_it_alone() {
        let ctx = context();
        let now = SystemTime::now();
        for owner in ["team/web", "team/api"] {
            ctx.track(
                owner,
                BTreeMap::from([("m1".to_owned(), (MemberPhase::Ready, now))]),
            );
            ctx.remember(owner, DistributedScaledObjectStatus::default());
            ctx.status_written(owner);
            ctx.record_error(owner, "boom".into());
        }
        ctx.forget("team/web");
        assert_eq!(ctx.tracked("team/web", "m1"), None);
        assert_eq!(ctx.written("team/web"), None);
        assert_eq!(ctx.status_wait("team/web"), None);
        assert!(ctx.take_errors("team/web").is_empty());
        assert_eq!(
            ctx.tracked("team/api", "m1"),
            Some((MemberPhase::Ready, now))
        );
        assert!(ctx.written("team/api").is_some());
        assert_eq!(ctx.take_errors("team/api"), ["boom"]);
    }

    #[tokio::test]
    async fn no_child_scaled_object_is_cached_before_the_watch_lists_them() {
        let ctx = context();
        assert!(ctx.cached_scaled_object("team", "web").is_none());
        assert!(ctx.dsos().is_empty());
    }
}

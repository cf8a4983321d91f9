//! What the DSJ controller keeps between polls, over the [`Shared`] part. Nothing else
//! reaches it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kedge_core::crd::{DistributedScaledJob, DistributedScaledJobStatus};
use kedge_core::dsj::metrics::Reading;
use kube::runtime::reflector::Store;

use crate::controller::{Shared, lock};

/// The DSJ controller's context: its DSJ cache and what it remembers in this process. When
/// each Job create was first sent (a Job no member has reported yet counts as pending since
/// then, so it can become stuck like any other), when each DSJ was last polled with which spec and annotations (a status
/// write or a shadow ScaledObject update does not make an extra poll), and the readings of
/// its last poll (what a tick between polls plans with).
pub struct DsjContext {
    /// What every controller shares.
    pub shared: Arc<Shared>,
    /// Every DSJ, as the controller's reflector sees them (for taints shared by the DSJs of
    /// a namespace).
    dsjs: Store<DistributedScaledJob>,
    /// When each Job create was first sent, by owner, by Job name.
    sent: Mutex<HashMap<String, HashMap<String, SystemTime>>>,
    /// When each owner was last polled, with which spec and annotations.
    polls: Mutex<HashMap<String, (SystemTime, u64)>>,
    /// The status this process wrote last, by owner: the next poll starts from it rather
    /// than from a watch cache that may not have seen the write yet (which would reuse Job
    /// indexes and forget taints).
    written: Mutex<HashMap<String, DistributedScaledJobStatus>>,
    /// The trigger readings of each owner's last poll.
    readings: Mutex<HashMap<String, BTreeMap<String, Reading>>>,
}

impl std::fmt::Debug for DsjContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DsjContext").finish_non_exhaustive()
    }
}

impl AsRef<Shared> for DsjContext {
    fn as_ref(&self) -> &Shared {
        &self.shared
    }
}

impl DsjContext {
    /// The DSJ controller's context: `dsjs` is its reflector store.
    pub fn new(shared: Arc<Shared>, dsjs: Store<DistributedScaledJob>) -> Self {
        Self {
            shared,
            dsjs,
            sent: Mutex::default(),
            polls: Mutex::default(),
            written: Mutex::default(),
            readings: Mutex::default(),
        }
    }

    /// Every DSJ the controller knows.
    pub(super) fn dsjs(&self) -> Vec<Arc<DistributedScaledJob>> {
        self.dsjs.state()
    }

    pub(super) fn written(&self, owner: &str) -> Option<DistributedScaledJobStatus> {
        lock(&self.written).get(owner).cloned()
    }

    pub(super) fn remember(&self, owner: &str, status: &DistributedScaledJobStatus) {
        lock(&self.written).insert(owner.to_owned(), status.clone());
    }

    pub(super) fn readings(&self, owner: &str) -> Option<BTreeMap<String, Reading>> {
        lock(&self.readings).get(owner).cloned()
    }

    pub(super) fn keep_readings(&self, owner: &str, readings: BTreeMap<String, Reading>) {
        lock(&self.readings).insert(owner.to_owned(), readings);
    }

    pub(super) fn since(&self, owner: &str, name: &str, now: SystemTime) -> SystemTime {
        *lock(&self.sent)
            .entry(owner.to_owned())
            .or_default()
            .entry(name.to_owned())
            .or_insert(now)
    }

    /// Forgets when the creates of `owner` not in `keep` were sent.
    pub(super) fn forget_except(&self, owner: &str, keep: &BTreeSet<String>) {
        let mut sent = lock(&self.sent);
        if let Some(mine) = sent.get_mut(owner) {
            mine.retain(|name, _| keep.contains(name));
            if mine.is_empty() {
                sent.remove(owner);
            }
        }
    }

    /// Forgets everything about `owner` (a deleted DSJ).
    pub(super) fn forget(&self, owner: &str) {
        lock(&self.sent).remove(owner);
        lock(&self.polls).remove(owner);
        lock(&self.written).remove(owner);
        lock(&self.readings).remove(owner);
    }

    /// `None` when `owner` is due for a poll (recorded as polled now), else how long until
    /// it is. A changed `version` (generation and annotations) is always due.
    pub(super) fn due(
        &self,
        owner: &str,
        version: u64,
        interval: Duration,
        now: SystemTime,
    ) -> Option<Duration> {
        let mut polls = lock(&self.polls);
        if let Some((at, seen)) = polls.get(owner)
            && *seen == version
        {
            let next = kedge_core::time::saturating_add(*at, interval);
            if let Ok(wait) = next.duration_since(now)
                && !wait.is_zero()
            {
                return Some(wait);
            }
        }
        polls.insert(owner.to_owned(), (now, version));
        None
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;

    use super::*;

    fn context() -> DsjContext {
        DsjContext::new(Shared::for_tests(), reflector::store().0)
    }

    #[tokio::test]
    async fn a_dsj_is_polled_once_per_interval_unless_its_spec_changes() {
        let ctx = context();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let interval = Duration::from_secs(30);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(ctx.due("team/batch", 1, interval, t0), None);
        assert_eq!(
            ctx.due("team/batch", 1, interval, at(10)),
            Some(Duration::from_secs(20))
        );
        // Another DSJ has its own interval.
        assert_eq!(ctx.due("team/other", 1, interval, at(10)), None);
        // A new generation or annotation is polled at once, and starts the interval again.
        assert_eq!(ctx.due("team/batch", 2, interval, at(11)), None);
        assert_eq!(
            ctx.due("team/batch", 2, interval, at(40)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(ctx.due("team/batch", 2, interval, at(41)), None);
    }

    #[tokio::test]
    async fn a_create_is_pending_since_it_was_first_sent_until_forgotten() {
        let ctx = context();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let later = t0 + Duration::from_secs(5);
        assert_eq!(ctx.since("team/batch", "job-1", t0), t0);
        assert_eq!(ctx.since("team/batch", "job-2", later), later);
        assert_eq!(ctx.since("team/batch", "job-1", later), t0);
        ctx.forget_except("team/batch", &BTreeSet::from(["job-2".to_owned()]));
        assert_eq!(ctx.since("team/batch", "job-1", later), later);
        assert_eq!(ctx.since("team/batch", "job-2", t0), later);
        ctx.forget("team/batch");
        assert_eq!(ctx.since("team/batch", "job-2", t0), t0);
    }

    #[tokio::test]
    async fn forgetting_a_dsj_drops_its_status_and_readings() {
        let ctx = context();
        ctx.remember("team/batch", &DistributedScaledJobStatus::default());
        ctx.keep_readings("team/batch", BTreeMap::new());
        ctx.due(
            "team/batch",
            1,
            Duration::from_secs(30),
            SystemTime::UNIX_EPOCH,
        );
        ctx.forget("team/batch");
        assert!(ctx.written("team/batch").is_none());
        assert!(ctx.readings("team/batch").is_none());
        assert_eq!(
            ctx.due(
                "team/batch",
                1,
                Duration::from_secs(30),
                SystemTime::UNIX_EPOCH
            ),
            None
        );
    }
}

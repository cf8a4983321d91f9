//! The cache of MemberClusters every controller reads, and when it has listed them.

use std::time::Duration;

use kedge_core::crd::MemberCluster;
use kube::runtime::reflector::Store;
use tokio::sync::watch;

/// The reflector cache of MemberClusters, and whether it has listed them yet.
///
/// kube-runtime's `Store::wait_until_ready` wakes only one of the tasks waiting on it at a
/// time (its `DelayedInit` keeps a single waker). Right after a hub starts, the first
/// sessions make the member controller and a DSO reconciliation wait together, and all but
/// one of them slept until their 10 s timeout: every agent was back within a second and
/// re-synced ten seconds later. Here one task waits on the store and tells every other
/// through a watch channel, which wakes them all.
#[derive(Clone)]
pub struct MemberClusterCache {
    store: Store<MemberCluster>,
    listed: watch::Receiver<bool>,
}

impl std::fmt::Debug for MemberClusterCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberClusterCache")
            .field("listed", &*self.listed.borrow())
            .finish_non_exhaustive()
    }
}

impl MemberClusterCache {
    /// Follows `store` (a reflector drives its writer): spawns the one task that waits for
    /// its first list.
    pub fn new(store: Store<MemberCluster>) -> Self {
        let (tx, listed) = watch::channel(false);
        let first_list = store.clone();
        tokio::spawn(async move {
            if first_list.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
            }
        });
        Self { store, listed }
    }

    /// The store once it has listed the MemberClusters; `None` when that takes longer than
    /// `patience`, or its writer is gone before.
    pub async fn listed(&self, patience: Duration) -> Option<&Store<MemberCluster>> {
        let mut listed = self.listed.clone();
        tokio::time::timeout(patience, listed.wait_for(|listed| *listed))
            .await
            .ok()?
            .ok()?;
        Some(&self.store)
    }

    /// The store as it is now (empty before its first list).
    pub fn store(&self) -> &Store<MemberCluster> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    #[tokio::test(start_paused = true)]
    async fn every_task_waiting_for_the_first_list_wakes_with_it() {
        let (store, mut writer) = reflector::store::<MemberCluster>();
        let cache = MemberClusterCache::new(store);
        let patience = Duration::from_secs(10);
        let start = tokio::time::Instant::now();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move {
                    cache
                        .listed(patience)
                        .await
                        .is_some()
                        .then(tokio::time::Instant::now)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        for waiter in waiters {
            let woke = waiter.await.expect("the waiter ran").expect("listed");
            assert!(
                woke - start < Duration::from_secs(1),
                "woke after {:?}",
                woke - start
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cache_that_never_lists_gives_up_after_its_patience() {
        let (store, writer) = reflector::store::<MemberCluster>();
        let cache = MemberClusterCache::new(store);
        assert!(cache.listed(Duration::from_secs(10)).await.is_none());
        drop(writer);
        assert!(cache.listed(Duration::from_secs(10)).await.is_none());
    }
}

//! Change notification: which members changed since the controllers last looked, and which
//! reported new replica counts only (those wait for the DSO controller's next status write).

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{Fleet, guard};

/// Who changed, for the controllers to take.
#[derive(Debug)]
pub(super) struct Changes {
    /// Changes whenever a member does.
    tick: watch::Sender<u64>,
    /// Members changed since the DSO controller last took them ([`Fleet::take_changed`]).
    changed: Mutex<BTreeSet<String>>,
    /// Members whose reports moved only replica counts since the DSO controller last took
    /// them, and when the first of them did ([`Fleet::take_counts`]).
    counts: Mutex<(BTreeSet<String>, Option<Instant>)>,
    /// Wakes the DSO controller's trigger when `counts` gets its first member.
    counts_wake: Notify,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            tick: watch::channel(0).0,
            changed: Mutex::new(BTreeSet::new()),
            counts: Mutex::new((BTreeSet::new(), None)),
            counts_wake: Notify::new(),
        }
    }
}

/// Adds `member` to `set` without copying its name when it is there already.
fn insert(set: &mut BTreeSet<String>, member: &str) {
    if !set.contains(member) {
        set.insert(member.to_owned());
    }
}

impl Fleet {
    /// Tells controllers that something they read of `member` changed (reports, acks,
    /// session state).
    pub fn notify(&self, member: &str) {
        insert(&mut guard(&self.changes.changed), member);
        self.changes.tick.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The members changed since the last call (a set: at most one entry per member).
    pub fn take_changed(&self) -> BTreeSet<String> {
        std::mem::take(&mut *guard(&self.changes.changed))
    }

    /// A receiver that changes whenever [`Fleet::notify`] is called.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.tick.subscribe()
    }

    /// Tells the DSO controller that `member` reported new replica counts and nothing else:
    /// that can wait for the next status write (see [`Fleet::counts_since`]). When a
    /// `/scale` change reaches 10,000 members, their reports of the new counts come back
    /// while the hub is still sending it; re-planning each batch at once took the CPU the
    /// rest of the fan-out needed.
    pub fn notify_counts(&self, member: &str) {
        let first = {
            let mut counts = guard(&self.changes.counts);
            insert(&mut counts.0, member);
            counts.1.get_or_insert_with(Instant::now);
            counts.0.len() == 1
        };
        if first {
            self.changes.counts_wake.notify_one();
        }
    }

    /// When the first member of those with new counts only ([`Fleet::notify_counts`])
    /// reported, if any has since the last [`Fleet::take_counts`].
    pub fn counts_since(&self) -> Option<Instant> {
        guard(&self.changes.counts).1
    }

    /// Waits until a member reports new counts only while none is pending.
    pub async fn counts_reported(&self) {
        self.changes.counts_wake.notified().await;
    }

    /// The members with new counts only since the last call.
    pub fn take_counts(&self) -> BTreeSet<String> {
        let mut counts = guard(&self.changes.counts);
        counts.1 = None;
        std::mem::take(&mut counts.0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::fleet;
    use super::*;

    #[test]
    fn changed_members_are_taken_once_each() {
        let f = fleet();
        let mut changes = f.subscribe();
        f.notify("m2");
        f.notify("m1");
        f.notify("m2");
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(
            f.take_changed(),
            BTreeSet::from(["m1".to_owned(), "m2".to_owned()])
        );
        assert!(f.take_changed().is_empty());
        assert!(!changes.has_changed().unwrap(), "taking is no change");
    }

    #[tokio::test(start_paused = true)]
    async fn new_counts_wake_the_controller_once_and_keep_the_first_instant() {
        let f = fleet();
        assert!(f.counts_since().is_none());
        f.notify_counts("m1");
        // The wake of the first member is kept for a waiter that comes later.
        tokio::time::timeout(std::time::Duration::from_secs(1), f.counts_reported())
            .await
            .expect("woken");
        let first = f.counts_since().expect("pending");
        tokio::time::advance(std::time::Duration::from_secs(3)).await;
        f.notify_counts("m2");
        f.notify_counts("m1");
        assert_eq!(f.counts_since(), Some(first), "the first report's instant");
        // Only the first member of a batch wakes.
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(1), f.counts_reported())
                .await
                .is_err()
        );
        assert_eq!(
            f.take_counts(),
            BTreeSet::from(["m1".to_owned(), "m2".to_owned()])
        );
        assert!(f.counts_since().is_none());
        assert!(f.take_changed().is_empty(), "counts only are no change");
    }
}

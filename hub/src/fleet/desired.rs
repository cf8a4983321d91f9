//! Desired state: what each member should run, per owning hub object (`namespace/name`), its
//! revisions, and its release to the member's session, level-triggered on a watch channel
//! and published only when it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kedge_protocol::{DesiredState, WorkloadRef, WorkloadReplicas};
use tokio::sync::watch;

use super::{Fleet, JobCommands};

/// What one member should run.
#[derive(Debug)]
pub(super) struct Desired {
    /// Desired workloads by owner (`namespace/name` of the hub object).
    pub(super) workloads: BTreeMap<String, Vec<WorkloadReplicas>>,
    /// Job commands by owner.
    pub(super) jobs: BTreeMap<String, JobCommands>,
    /// Revision of the latest desired state.
    pub(super) revision: u64,
    /// The desired state for the current session; `None` until a controller planned for
    /// the member after its first full report of the session, so that a (re)connecting
    /// agent is never sent a state planned from nothing.
    released: watch::Sender<Option<Arc<DesiredState>>>,
}

impl Desired {
    pub(super) fn new(revision: u64) -> Self {
        Self {
            workloads: BTreeMap::new(),
            jobs: BTreeMap::new(),
            revision,
            released: watch::channel(None).0,
        }
    }

    /// The state to publish. Every member's session holds it while the member is
    /// connected, so its lists are allocated to their length: collected from the owners'
    /// lists, whose length the iterator does not know, each would start at room for four
    /// (at 1,000 members with one DSO, 1 KiB a member where 0.25 KiB were used).
    fn state(&self) -> DesiredState {
        DesiredState {
            revision: self.revision,
            workloads: exact(self.workloads.values().map(Vec::as_slice)),
            create_jobs: exact(self.jobs.values().map(|c| c.creates.as_slice())),
            delete_jobs: exact(self.jobs.values().map(|c| c.deletes.as_slice())),
        }
    }

    /// Publishes the current state to the session.
    fn release(&mut self) {
        let state = self.state();
        self.released.send_replace(Some(Arc::new(state)));
    }

    /// The state released to the session, if one was.
    pub(super) fn released(&self) -> Option<Arc<DesiredState>> {
        self.released.borrow().clone()
    }

    /// Whether the current session was given a state (a controller planned for it).
    pub(super) fn is_released(&self) -> bool {
        self.released.borrow().is_some()
    }

    /// A new session: nothing for it until a controller plans for it.
    pub(super) fn withhold(&mut self) {
        self.released.send_replace(None);
    }

    /// A receiver of the state released to the session.
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<Arc<DesiredState>>> {
        self.released.subscribe()
    }

    /// A controller planned for the session: releases the state, under a new revision when
    /// `changed`; nothing is published when nothing changed and it was released already.
    pub(super) fn planned(&mut self, changed: bool) {
        if !changed && self.is_released() {
            return;
        }
        if changed {
            self.revision += 1;
        }
        self.release();
    }

    /// The state changed without a plan for the session (a command removed or carried
    /// out): a new revision, published only if the session was given a state already.
    pub(super) fn revise(&mut self) {
        self.revision += 1;
        if self.is_released() {
            self.release();
        }
    }

    /// Whether the hub asked the member about `workload` (to scale or to hold it).
    pub(super) fn asked(&self, workload: &WorkloadRef) -> bool {
        self.workloads
            .values()
            .flatten()
            .any(|w| &w.workload == workload)
    }
}

/// The items of `lists`, one after the other, in a list allocated to their number.
fn exact<'a, T: Clone + 'a>(lists: impl Iterator<Item = &'a [T]> + Clone) -> Vec<T> {
    let mut all = Vec::with_capacity(lists.clone().map(<[T]>::len).sum());
    for list in lists {
        all.extend_from_slice(list);
    }
    all
}

/// Puts `value` as what `owner` wants in `by_owner`, removing the owner when `value` is
/// `empty`; whether that changed anything.
pub(super) fn put<T: PartialEq>(
    by_owner: &mut BTreeMap<String, T>,
    owner: &str,
    value: T,
    empty: bool,
) -> bool {
    let unchanged = match by_owner.get(owner) {
        Some(current) => *current == value,
        None => empty,
    };
    if unchanged {
        return false;
    }
    if empty {
        by_owner.remove(owner);
    } else {
        by_owner.insert(owner.to_owned(), value);
    }
    true
}

impl Fleet {
    /// The desired state of `member` for its session to stream: `None` until planned.
    pub fn desired_state(&self, member: &str) -> watch::Receiver<Option<Arc<DesiredState>>> {
        let mut members = self.lock();
        self.entry(&mut members, member).desired.subscribe()
    }

    /// Sets the workloads `owner` wants on `member` (empty removes them), planned from the
    /// first full report of session `session`; this also releases the desired state to that
    /// session. Nothing happens when the member is in another session by now, or that
    /// session has not reported yet. A new revision is published only when something changed.
    pub fn set_workloads(
        &self,
        member: &str,
        session: &str,
        owner: &str,
        mut workloads: Vec<WorkloadReplicas>,
    ) {
        workloads.sort_by(|a, b| a.workload.cmp(&b.workload));
        let mut members = self.lock();
        let Some(entry) = members.get_mut(member) else {
            return;
        };
        if !entry.in_session(session) || !entry.session_reported {
            return;
        }
        let empty = workloads.is_empty();
        let changed = put(&mut entry.desired.workloads, owner, workloads, empty);
        entry.desired.planned(changed);
    }

    /// Removes what `owner` wanted from `member` without releasing a desired state to a
    /// session that has not been planned for (the member is no longer used, or another
    /// owner claims the workload).
    pub fn clear_workloads(&self, member: &str, owner: &str) {
        let mut members = self.lock();
        let Some(entry) = members.get_mut(member) else {
            return;
        };
        if entry.desired.workloads.remove(owner).is_none() {
            return;
        }
        entry.desired.revise();
    }

    /// Members holding commands of `owner`.
    pub fn holders(&self, owner: &str) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.desired.workloads.contains_key(owner))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Removes everything `owner` wanted on every member.
    pub fn clear_owner(&self, owner: &str) {
        for member in self.holders(owner) {
            self.clear_workloads(&member, owner);
        }
    }

    /// Owners that hold desired workloads on any of `members`.
    pub fn owners_on(&self, members: &BTreeSet<String>) -> BTreeSet<String> {
        let entries = self.lock();
        members
            .iter()
            .filter_map(|m| entries.get(m))
            .flat_map(|e| e.desired.workloads.keys().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn nothing_is_released_to_a_session_before_its_first_full_report() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        let mut rx = f.desired_state("m1");
        assert!(rx.borrow_and_update().is_none());
        // A controller planning before the report changes nothing.
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        assert!(rx.borrow_and_update().is_none(), "planned from nothing");
        f.record_report("m1", "s1", full(vec![]));
        // A plan for another session is ignored too.
        f.set_workloads("m1", "s0", "ns/a", vec![replicas("a", 2, "ns/a")]);
        assert!(rx.borrow_and_update().is_none());
        // Planned after the report: released, even when it is empty.
        f.set_workloads("m1", "s1", "ns/a", vec![]);
        let state = rx.borrow_and_update().clone().expect("released");
        assert!(state.workloads.is_empty());
        // A new session starts closed again.
        f.session_started("m1", "s2", 0, None);
        assert!(rx.borrow_and_update().is_none());
    }

    #[test]
    fn desired_state_merges_owners_and_bumps_revisions_only_on_change() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        f.record_report("m1", "s1", full(vec![]));
        let mut rx = f.desired_state("m1");
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        let r0 = rx.borrow_and_update().clone().unwrap().revision;
        f.set_workloads("m1", "s1", "ns/b", vec![replicas("b", 3, "ns/b")]);
        let state = rx.borrow_and_update().clone().unwrap();
        assert_eq!(state.revision, r0 + 1);
        assert_eq!(state.workloads.len(), 2);
        // What every connected member's session holds has no room to spare.
        assert_eq!(state.workloads.capacity(), 2);
        assert_eq!(state.create_jobs.capacity(), 0);
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        assert!(
            !rx.has_changed().unwrap(),
            "an unchanged set publishes nothing"
        );
        assert_eq!(f.holders("ns/a"), vec!["m1".to_owned()]);
        f.clear_owner("ns/a");
        let state = rx.borrow_and_update().clone().unwrap();
        assert_eq!(state.workloads, vec![replicas("b", 3, "ns/b")]);
        assert_eq!(state.revision, r0 + 2);
        assert!(f.holders("ns/a").is_empty());
    }

    #[test]
    fn an_owner_is_put_removed_or_left_alone() {
        let mut by_owner: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        // Nothing to remove: unchanged.
        assert!(!put(&mut by_owner, "ns/a", vec![], true));
        assert!(put(&mut by_owner, "ns/a", vec![1], false));
        assert!(!put(&mut by_owner, "ns/a", vec![1], false));
        assert!(put(&mut by_owner, "ns/a", vec![2], false));
        assert_eq!(by_owner["ns/a"], vec![2]);
        assert!(put(&mut by_owner, "ns/a", vec![], true));
        assert!(by_owner.is_empty());
    }

    #[test]
    fn a_revision_is_published_only_once_the_session_was_planned_for() {
        let mut desired = Desired::new(10);
        let mut rx = desired.subscribe();
        // A command removed before any plan: a new revision, nothing released.
        desired.revise();
        assert_eq!(desired.revision, 11);
        assert!(rx.borrow_and_update().is_none());
        // The first plan releases even an unchanged state, under the same revision.
        desired.planned(false);
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().revision, 11);
        // Once released, an unchanged plan publishes nothing; a change does.
        desired.planned(false);
        assert!(!rx.has_changed().unwrap());
        desired.revise();
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().revision, 12);
        desired.withhold();
        assert!(rx.borrow_and_update().is_none());
        assert!(!desired.is_released());
    }
}

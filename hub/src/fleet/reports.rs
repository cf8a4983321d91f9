//! Reports and acknowledgements: what each agent reports of its workloads, Jobs and
//! capacity, bounded to what the hub asked about, and the command failures it acknowledges.

use std::sync::Arc;
use std::time::SystemTime;

use kedge_protocol::{Ack, CommandTarget, StatusReport, WorkloadRef, WorkloadStatus};

use super::{Fleet, MemberEntry};

/// Workload entries a member may report before the hub has asked it for anything in this
/// session (after a hub restart the agent reports what it managed for the previous hub).
pub const MAX_UNSOLICITED_WORKLOADS: usize = 256;

/// The last reported status of each workload of one member, sorted by workload. Shared
/// between the member's entry and its snapshots: taking a snapshot copies nothing, and a
/// report copies the list only while a snapshot of it is still held. A sorted vector holds
/// one workload in a few hundred bytes where a `BTreeMap` leaf took ~3.5 KiB (room for 11).
#[derive(Debug, Clone, Default)]
pub struct Reported(Arc<Vec<WorkloadStatus>>);

impl Reported {
    fn position(&self, workload: &WorkloadRef) -> Result<usize, usize> {
        self.0.binary_search_by(|s| s.workload.cmp(workload))
    }

    /// The last reported status of `workload`.
    pub fn get(&self, workload: &WorkloadRef) -> Option<&WorkloadStatus> {
        self.position(workload).ok().map(|i| &self.0[i])
    }

    /// Whether `workload` was reported.
    pub fn contains_key(&self, workload: &WorkloadRef) -> bool {
        self.position(workload).is_ok()
    }

    /// How many workloads were reported.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every reported status, by workload.
    pub fn iter(&self) -> impl Iterator<Item = &WorkloadStatus> {
        self.0.iter()
    }

    fn insert(&mut self, status: WorkloadStatus) {
        let position = self.position(&status.workload);
        let list = Arc::make_mut(&mut self.0);
        match position {
            Ok(i) => list[i] = status,
            Err(i) => list.insert(i, status),
        }
    }

    fn clear(&mut self) {
        if !self.0.is_empty() {
            self.0 = Arc::default();
        }
    }
}

/// For tests that build a member's snapshot by hand.
#[cfg(test)]
impl FromIterator<WorkloadStatus> for Reported {
    fn from_iter<I: IntoIterator<Item = WorkloadStatus>>(statuses: I) -> Self {
        let mut reported = Reported::default();
        for status in statuses {
            reported.insert(status);
        }
        reported
    }
}

/// What [`Fleet::record_report`] did with a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Workload entries kept.
    pub kept: usize,
    /// Entries for workloads the hub did not ask about.
    pub unsolicited: usize,
    /// Entries beyond [`MAX_UNSOLICITED_WORKLOADS`].
    pub over_limit: usize,
    /// Job entries beyond [`MAX_REPORTED_JOBS`](super::MAX_REPORTED_JOBS).
    pub jobs_over_limit: usize,
}

/// Whether `new` reports what `old` did but for the replica counts of the workload.
fn same_but_counts(old: &WorkloadStatus, new: &WorkloadStatus) -> bool {
    let counts = |w: &WorkloadStatus| WorkloadStatus {
        spec_replicas: 0,
        ready_replicas: 0,
        available_replicas: 0,
        pending_pods: 0,
        ..w.clone()
    };
    counts(old) == counts(new)
}

impl MemberEntry {
    /// Whether `report` moves only replica counts: the report of a command carried out, say.
    fn moves_counts_only(&self, report: &StatusReport) -> bool {
        !report.full
            && report.jobs.is_empty()
            && report.removed_jobs.is_empty()
            && report.capacity.is_none_or(|c| Some(c) == self.capacity)
            && report.workloads.iter().all(|w| {
                self.reported
                    .get(&w.workload)
                    .is_some_and(|old| same_but_counts(old, w))
            })
    }

    /// Records the workloads of a report (a full one replaces the set), counting what it
    /// keeps and drops in `recorded`.
    fn record_workloads(
        &mut self,
        full: bool,
        workloads: Vec<WorkloadStatus>,
        recorded: &mut Recorded,
    ) {
        let planned = self.desired.is_released();
        if full {
            self.reported.clear();
        }
        for status in workloads {
            let asked = self.desired.asked(&status.workload);
            if planned && !asked {
                recorded.unsolicited += 1;
                continue;
            }
            if !asked
                && !self.reported.contains_key(&status.workload)
                && self.reported.len() >= MAX_UNSOLICITED_WORKLOADS
            {
                recorded.over_limit += 1;
                continue;
            }
            // A report that shows the workload healthy supersedes an older failure.
            if status.exists && status.failure.is_none() {
                self.failures.retain(|(target, _)| {
                    !matches!(target, CommandTarget::Workload(w) if *w == status.workload)
                });
            }
            self.reported.insert(status);
            recorded.kept += 1;
        }
    }

    /// Records a report of the current session; whether it moved replica counts only.
    fn record(&mut self, report: StatusReport, recorded: &mut Recorded) -> bool {
        let failures = self.failures.len();
        let counts_only = self.moves_counts_only(&report);
        if report.full {
            self.session_reported = true;
        }
        self.record_workloads(report.full, report.workloads, recorded);
        recorded.jobs_over_limit =
            self.reported_jobs
                .record(report.full, report.jobs, &report.removed_jobs, report.more);
        // Commands done: creates the member reports, deletes of Jobs it no longer has.
        if self.reported_jobs.is_complete() && self.reported_jobs.drop_done(&mut self.desired.jobs)
        {
            self.desired.revise();
        }
        if report.capacity.is_some() {
            self.capacity = report.capacity;
        }
        self.last_report = Some(SystemTime::now());
        // A healthy report cleared a failure: planning reads that.
        counts_only && self.failures.len() == failures
    }
}

impl Fleet {
    /// Records an agent report of session `session_id`. Entries for workloads the hub did
    /// not ask the member about are dropped once it has asked for something; before that
    /// (the first report after a hub restart) at most [`MAX_UNSOLICITED_WORKLOADS`] are
    /// kept. A report of an older session is ignored.
    pub fn record_report(&self, member: &str, session_id: &str, report: StatusReport) -> Recorded {
        let mut recorded = Recorded::default();
        let counts_only = {
            let mut members = self.lock();
            let entry = self.entry(&mut members, member);
            if !entry.in_session(session_id) {
                return recorded;
            }
            entry.record(report, &mut recorded)
        };
        if counts_only {
            self.notify_counts(member);
        } else {
            self.notify(member);
        }
        recorded
    }

    /// Records an agent acknowledgement: its failures replace the earlier ones.
    pub fn record_ack(&self, member: &str, ack: Ack) {
        let failures_changed = {
            let mut members = self.lock();
            let entry = self.entry(&mut members, member);
            entry.acked_revision = entry.acked_revision.max(ack.revision);
            let failures: Vec<_> = ack
                .results
                .into_iter()
                .filter_map(|r| r.failure.map(|f| (r.target, f)))
                .collect();
            let changed = failures != entry.failures;
            entry.failures = failures;
            changed
        };
        // Planning reads the failures of an acknowledgement, not its revision.
        if failures_changed {
            self.notify(member);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::testing::*;
    use super::*;
    use kedge_protocol::{ClusterCapacity, Failure};

    #[test]
    fn reports_are_kept_sorted_and_snapshots_keep_what_they_saw() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        let ready = |name: &str, n: i32| WorkloadStatus {
            ready_replicas: n,
            ..healthy(name)
        };
        f.record_report("m1", "s1", full(vec![ready("b", 1), ready("a", 1)]));
        let before = f.member("m1").unwrap();
        f.record_report(
            "m1",
            "s1",
            StatusReport {
                workloads: vec![ready("b", 2), ready("c", 1)],
                ..StatusReport::default()
            },
        );
        let after = f.member("m1").unwrap();
        let names =
            |r: &Reported| -> Vec<String> { r.iter().map(|s| s.workload.name.clone()).collect() };
        assert_eq!(names(&after.workloads), ["a", "b", "c"]);
        assert_eq!(
            after.workloads.get(&workload("b")).unwrap().ready_replicas,
            2
        );
        // The snapshot taken before the report is unchanged.
        assert_eq!(names(&before.workloads), ["a", "b"]);
        assert_eq!(
            before.workloads.get(&workload("b")).unwrap().ready_replicas,
            1
        );
        // A full report replaces the set.
        f.record_report("m1", "s1", full(vec![ready("c", 3)]));
        let last = f.member("m1").unwrap();
        assert_eq!(names(&last.workloads), ["c"]);
        assert!(!last.workloads.contains_key(&workload("a")));
    }

    #[test]
    fn reports_are_bounded_to_what_was_asked() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        // Before anything was asked (a hub restart): kept, up to the limit.
        let many: Vec<WorkloadStatus> = (0..MAX_UNSOLICITED_WORKLOADS + 10)
            .map(|i| healthy(&format!("w{i}")))
            .collect();
        let r = f.record_report("m1", "s1", full(many));
        assert_eq!(r.kept, MAX_UNSOLICITED_WORKLOADS);
        assert_eq!(r.over_limit, 10);
        // Once the hub asked for `a`, only `a` is kept.
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 1, "ns/a")]);
        let r = f.record_report(
            "m1",
            "s1",
            StatusReport {
                workloads: vec![healthy("a"), healthy("intruder")],
                ..full(vec![])
            },
        );
        assert_eq!((r.kept, r.unsolicited), (1, 1));
        let m = f.member("m1").unwrap();
        assert!(m.workloads.contains_key(&workload("a")));
        assert!(!m.workloads.contains_key(&workload("intruder")));
        // A report of an old session is ignored.
        let r = f.record_report("m1", "s0", full(vec![healthy("a")]));
        assert_eq!(r, Recorded::default());
    }

    /// A report that moves replica counts only (a command carried out) waits for the next
    /// status write; anything else a plan reads re-plans at once.
    #[test]
    fn reports_of_new_counts_only_wait_and_the_rest_does_not() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        f.record_report("m1", "s1", full(vec![healthy("a")]));
        assert_eq!(f.take_changed(), BTreeSet::from(["m1".to_owned()]));
        let counts = |n: i32| StatusReport {
            workloads: vec![WorkloadStatus {
                spec_replicas: n,
                ready_replicas: n,
                available_replicas: n,
                ..healthy("a")
            }],
            ..StatusReport::default()
        };
        f.record_report("m1", "s1", counts(3));
        assert!(f.take_changed().is_empty());
        assert!(f.counts_since().is_some());
        assert_eq!(f.take_counts(), BTreeSet::from(["m1".to_owned()]));
        assert!(f.counts_since().is_none());
        // A workload gone, a conflict, new capacity, a full report: at once.
        let gone = StatusReport {
            workloads: vec![WorkloadStatus::absent(workload("a"))],
            ..StatusReport::default()
        };
        let conflict = StatusReport {
            workloads: vec![WorkloadStatus {
                conflict: Some("hpa/a".into()),
                ..healthy("a")
            }],
            ..StatusReport::default()
        };
        let capacity = StatusReport {
            capacity: Some(ClusterCapacity::default()),
            ..counts(3)
        };
        for report in [gone, conflict, capacity, full(vec![healthy("a")])] {
            f.record_report("m1", "s1", report.clone());
            assert_eq!(f.take_changed().len(), 1, "{report:?}");
            assert!(f.take_counts().is_empty(), "{report:?}");
        }
        // An acknowledgement re-plans only when its failures changed.
        f.record_ack(
            "m1",
            Ack {
                revision: 1,
                results: Vec::new(),
            },
        );
        assert!(f.take_changed().is_empty());
    }

    #[test]
    fn a_later_healthy_report_clears_a_failure() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        f.record_report("m1", "s1", full(vec![]));
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 1, "ns/a")]);
        let mut changes = f.subscribe();
        let failure = Failure {
            retry: kedge_protocol::Retry::Permanent,
            code: kedge_protocol::FailureCode::Forbidden,
            message: "no".into(),
        };
        f.record_ack(
            "m1",
            Ack {
                revision: 7,
                results: vec![kedge_protocol::CommandResult {
                    target: CommandTarget::Workload(workload("a")),
                    failure: Some(failure.clone()),
                }],
            },
        );
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let m = f.member("m1").unwrap();
        assert_eq!(m.acked_revision, 7);
        assert_eq!(
            m.failures,
            vec![(CommandTarget::Workload(workload("a")), failure.clone())]
        );
        // A report that still cannot read it keeps the failure…
        let unreadable = WorkloadStatus {
            failure: Some(failure),
            ..WorkloadStatus::absent(workload("a"))
        };
        f.record_report(
            "m1",
            "s1",
            StatusReport {
                full: false,
                ..full(vec![unreadable])
            },
        );
        assert_eq!(f.member("m1").unwrap().failures.len(), 1);
        // …a healthy one clears it.
        f.record_report(
            "m1",
            "s1",
            StatusReport {
                full: false,
                ..full(vec![healthy("a")])
            },
        );
        assert!(changes.has_changed().unwrap());
        assert!(f.member("m1").unwrap().failures.is_empty());
        assert!(f.member("nobody").is_none());
    }
}

//! What goes into each report. Reports are incremental: only the workloads, capacity and
//! Jobs that changed since the last report, and the Jobs that are gone. After every
//! (re)connect a full report replaces what the hub knew; it stays open (`more`) until the
//! Job watches have listed once, so that it names every managed Job exactly once.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use kedge_protocol::{
    ClusterCapacity, JobRef, JobStatus, StatusReport, WorkloadRef, WorkloadStatus,
};

use crate::jobs::JobIndex;

/// Remembers what was last reported, to send only changes.
#[derive(Debug, Default)]
pub struct ReportState {
    workloads: BTreeMap<WorkloadRef, WorkloadStatus>,
    capacity: Option<ClusterCapacity>,
    /// A fingerprint of each Job's last reported status: a thousand Jobs' statuses are
    /// several times larger, and only whether one changed matters here.
    jobs: HashMap<JobRef, u64>,
    /// A full report started and its Jobs are not sent yet.
    jobs_open: bool,
}

impl ReportState {
    /// Builds the next report from fresh workload observations (none when only Jobs
    /// changed), the capacity if read, and the Jobs whose status changed in `jobs`:
    /// everything when `full`, else only what changed. `None` when there is nothing to say.
    pub fn next(
        &mut self,
        observed: Vec<WorkloadStatus>,
        capacity: Option<ClusterCapacity>,
        full: bool,
        jobs: &mut JobIndex,
    ) -> Option<StatusReport> {
        if full {
            self.workloads.clear();
            self.capacity = None;
            self.jobs.clear();
            self.jobs_open = true;
        }
        let mut changed = Vec::new();
        for status in observed {
            if self.workloads.get(&status.workload) != Some(&status) {
                self.workloads
                    .insert(status.workload.clone(), status.clone());
                changed.push(status);
            }
        }
        let capacity = capacity.filter(|c| self.capacity.as_ref() != Some(c));
        if let Some(c) = capacity {
            self.capacity = Some(c);
        }
        let (job_statuses, removed_jobs, closing) = self.jobs_part(jobs);
        if changed.is_empty()
            && capacity.is_none()
            && job_statuses.is_empty()
            && removed_jobs.is_empty()
            && !full
            && !closing
        {
            return None;
        }
        Some(StatusReport {
            full,
            more: self.jobs_open,
            workloads: changed,
            jobs: job_statuses,
            removed_jobs,
            capacity: if full { self.capacity } else { capacity },
        })
    }

    /// The Jobs to report: all of them once the index is complete if a full report is open
    /// (then `closing`), else the ones whose status changed and the ones gone.
    fn jobs_part(&mut self, index: &mut JobIndex) -> (Vec<JobStatus>, Vec<JobRef>, bool) {
        if self.jobs_open {
            if !index.complete() {
                return (Vec::new(), Vec::new(), false);
            }
            index.take_dirty();
            let all = index.statuses();
            self.jobs = all.iter().map(|s| (job_ref(s), fingerprint(s))).collect();
            self.jobs_open = false;
            return (all, Vec::new(), true);
        }
        let mut changed = Vec::new();
        let mut removed = Vec::new();
        for key in index.take_dirty() {
            match index.status(&key) {
                Some(status) => {
                    let print = fingerprint(&status);
                    if self.jobs.insert(key, print) != Some(print) {
                        changed.push(status);
                    }
                }
                None => {
                    if self.jobs.remove(&key).is_some() {
                        removed.push(key);
                    }
                }
            }
        }
        (changed, removed, false)
    }
}

/// A hash of everything a Job's status says on the wire (its encoding, so that a field added
/// to `JobStatus` counts without touching this). Two different statuses share one with
/// odds of 2^-64; the next change or full report would then carry the missed one.
fn fingerprint(status: &JobStatus) -> u64 {
    let mut hasher = DefaultHasher::new();
    match kedge_protocol::encode(status) {
        Ok(bytes) => bytes.hash(&mut hasher),
        // Only a frame over the size limit fails, which a status with bounded texts is not.
        Err(_) => format!("{status:?}").hash(&mut hasher),
    }
    hasher.finish()
}

fn job_ref(status: &JobStatus) -> JobRef {
    JobRef {
        namespace: status.namespace.clone(),
        name: status.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::facts::{JobFacts, Outcome, PodFacts, PodPhase};
    use kedge_protocol::JobPhase;

    fn status(name: &str, ready: i32) -> WorkloadStatus {
        WorkloadStatus {
            exists: true,
            spec_replicas: 3,
            ready_replicas: ready,
            available_replicas: ready,
            ..WorkloadStatus::absent(WorkloadRef::deployment("ns", name))
        }
    }

    fn key(name: &str) -> JobRef {
        JobRef {
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    fn facts(name: &str) -> JobFacts {
        JobFacts {
            uid: format!("uid-{name}"),
            owner: "apps/work".into(),
            created_unix_ms: 1,
            finished: None,
            replaces: None,
            template: None,
        }
    }

    fn names(jobs: &[JobStatus]) -> Vec<(&str, JobPhase)> {
        jobs.iter().map(|j| (j.name.as_str(), j.phase)).collect()
    }

    #[test]
    fn reports_carry_only_changes_except_after_a_reconnect() {
        let mut state = ReportState::default();
        let mut jobs = JobIndex::new(0);
        let cap = ClusterCapacity {
            nodes: 1,
            ..Default::default()
        };
        let first = state
            .next(
                vec![status("a", 1), status("b", 2)],
                Some(cap),
                true,
                &mut jobs,
            )
            .unwrap();
        assert!(first.full && !first.more);
        assert_eq!(first.workloads.len(), 2);
        assert_eq!(first.capacity, Some(cap));
        assert!(
            state
                .next(
                    vec![status("a", 1), status("b", 2)],
                    Some(cap),
                    false,
                    &mut jobs
                )
                .is_none()
        );
        let delta = state
            .next(
                vec![status("a", 3), status("b", 2)],
                Some(cap),
                false,
                &mut jobs,
            )
            .unwrap();
        assert_eq!(delta.workloads, vec![status("a", 3)]);
        assert_eq!(delta.capacity, None);
        let again = state
            .next(vec![status("a", 3), status("b", 2)], None, true, &mut jobs)
            .unwrap();
        assert_eq!(again.workloads.len(), 2, "a full report repeats everything");
    }

    #[test]
    fn a_full_report_stays_open_until_the_jobs_are_listed_then_jobs_change_incrementally() {
        let mut state = ReportState::default();
        let mut jobs = JobIndex::new(2);
        jobs.apply_job(key("a"), facts("a"));
        let opened = state
            .next(vec![status("w", 1)], None, true, &mut jobs)
            .unwrap();
        assert!(opened.full && opened.more, "{opened:?}");
        assert!(opened.jobs.is_empty(), "no Job before the watches listed");
        // One watch listed: still open, nothing to say.
        jobs.listed();
        assert!(state.next(vec![], None, false, &mut jobs).is_none());
        jobs.apply_job(key("b"), facts("b"));
        jobs.listed();
        let closed = state.next(vec![], None, false, &mut jobs).unwrap();
        assert!(!closed.full && !closed.more, "{closed:?}");
        assert_eq!(
            names(&closed.jobs),
            [("a", JobPhase::Pending), ("b", JobPhase::Pending)]
        );
        assert!(state.next(vec![], None, false, &mut jobs).is_none());

        // A pod starts for a, b finishes, c is created: three changes.
        jobs.apply_pod(
            key("a"),
            "a-1".into(),
            PodFacts {
                job_uid: "uid-a".into(),
                phase: PodPhase::Running,
                true_conditions: vec![],
                waiting_reason: None,
            },
        );
        jobs.apply_job(
            key("b"),
            JobFacts {
                finished: Some((Outcome::Succeeded, Some(9))),
                ..facts("b")
            },
        );
        jobs.apply_job(key("c"), facts("c"));
        let delta = state.next(vec![], None, false, &mut jobs).unwrap();
        assert!(!delta.full && !delta.more);
        assert_eq!(
            names(&delta.jobs),
            [
                ("a", JobPhase::Running),
                ("b", JobPhase::Succeeded),
                ("c", JobPhase::Pending)
            ]
        );
        // A pod left by an older Job named c dirties c but does not change its status.
        jobs.apply_pod(
            key("c"),
            "c-old".into(),
            PodFacts {
                job_uid: "uid-old".into(),
                phase: PodPhase::Running,
                true_conditions: vec![],
                waiting_reason: None,
            },
        );
        assert!(state.next(vec![], None, false, &mut jobs).is_none());

        // b is deleted: reported gone once.
        jobs.delete_job(&key("b"));
        let gone = state.next(vec![], None, false, &mut jobs).unwrap();
        assert!(gone.jobs.is_empty());
        assert_eq!(gone.removed_jobs, vec![key("b")]);
        assert!(state.next(vec![], None, false, &mut jobs).is_none());

        // Reconnect: every Job again, none reported gone, closed at once.
        let full = state.next(vec![], None, true, &mut jobs).unwrap();
        assert!(full.full && !full.more);
        assert_eq!(
            names(&full.jobs),
            [("a", JobPhase::Running), ("c", JobPhase::Pending)]
        );
        assert!(full.removed_jobs.is_empty());
    }
}

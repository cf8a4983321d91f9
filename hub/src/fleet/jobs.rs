//! Jobs: the commands the DSJ controller holds for each member (creates and deletes, kept
//! until the member's reports show them carried out) and the Jobs each member reports.

use std::collections::BTreeMap;

use kedge_protocol::{CommandTarget, Failure, JobCreate, JobDelete, JobRef, JobStatus};

use super::Fleet;
use super::desired::put;

/// Jobs the hub keeps per member from reports; beyond, reported Jobs are dropped and counted
/// (ten DSJs at their maximum of concurrent Jobs).
pub const MAX_REPORTED_JOBS: usize = 100_000;

/// The Job commands of one owner for one member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobCommands {
    /// Jobs to create (kept until the member reports them).
    pub creates: Vec<JobCreate>,
    /// Jobs to delete (kept until the member reports them gone).
    pub deletes: Vec<JobDelete>,
}

impl JobCommands {
    /// Whether the command about `target` (`namespace/name`) is one of these.
    fn is_about(&self, target: &str) -> bool {
        self.creates
            .iter()
            .any(|c| format!("{}/{}", c.namespace, c.name) == target)
            || self
                .deletes
                .iter()
                .any(|d| format!("{}/{}", d.namespace, d.name) == target)
    }
}

/// The Jobs of one owner in one member, as reported.
#[derive(Debug, Clone, Default)]
pub struct MemberJobs {
    /// Reported Jobs of the owner.
    pub jobs: Vec<JobStatus>,
    /// Whether the member's set of Jobs is complete (its first full report of the session,
    /// with every part, has arrived): only then is a Job missing from it gone.
    pub complete: bool,
    /// Whether this hub has had a complete report of the member's Jobs at all since it
    /// started (in this session or an earlier one): until then the hub cannot see what the
    /// member runs, and counts what the DSJ's status last recorded there.
    pub known: bool,
    /// The commands the hub holds for the owner there.
    pub commands: JobCommands,
    /// Job commands that failed in the latest acknowledged revision, by `namespace/name`.
    pub failures: Vec<(String, Failure)>,
}

/// The Jobs one member reported, and whether the set is complete (see
/// [`MemberJobs::complete`]).
#[derive(Debug, Default)]
pub(super) struct ReportedJobs {
    jobs: BTreeMap<JobRef, JobStatus>,
    complete: bool,
    /// A complete report has arrived in some session since the hub started.
    known: bool,
    /// A full report is arriving in parts.
    filling: bool,
}

impl ReportedJobs {
    /// A new session: its set is complete once its first full report is.
    pub(super) fn session_started(&mut self) {
        self.complete = false;
        self.filling = false;
    }

    /// Whether the set is complete.
    pub(super) fn is_complete(&self) -> bool {
        self.complete
    }

    /// Records the Jobs of one report: a full report (possibly in parts, `more` until the
    /// last) replaces the set, others update it. Returns how many Jobs were dropped beyond
    /// [`MAX_REPORTED_JOBS`].
    pub(super) fn record(
        &mut self,
        full: bool,
        jobs: Vec<JobStatus>,
        removed: &[JobRef],
        more: bool,
    ) -> usize {
        let mut over_limit = 0;
        if full {
            self.jobs.clear();
            self.filling = true;
        }
        for job in jobs {
            let key = JobRef {
                namespace: job.namespace.clone(),
                name: job.name.clone(),
            };
            if !self.jobs.contains_key(&key) && self.jobs.len() >= MAX_REPORTED_JOBS {
                over_limit += 1;
                continue;
            }
            self.jobs.insert(key, job);
        }
        for gone in removed {
            self.jobs.remove(gone);
        }
        if self.filling && !more {
            self.filling = false;
            self.complete = true;
            self.known = true;
        }
        over_limit
    }

    fn has(&self, namespace: &str, name: &str) -> bool {
        self.jobs.contains_key(&JobRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Drops the commands the set shows carried out: creates of Jobs the member reports,
    /// deletes of Jobs it no longer has, and owners left with none. Whether any went.
    pub(super) fn drop_done(&self, commands: &mut BTreeMap<String, JobCommands>) -> bool {
        let mut changed = false;
        for commands in commands.values_mut() {
            let before = (commands.creates.len(), commands.deletes.len());
            commands
                .creates
                .retain(|c| !self.has(&c.namespace, &c.name));
            commands.deletes.retain(|d| self.has(&d.namespace, &d.name));
            changed |= before != (commands.creates.len(), commands.deletes.len());
        }
        commands.retain(|_, c| *c != JobCommands::default());
        changed
    }
}

impl Fleet {
    /// Sets the Job commands of `owner` for `member`, decided from the member's complete
    /// set of Jobs in session `session` (this also releases the desired state to it).
    /// Nothing happens when the member is in another session by now or its set of Jobs is
    /// not complete yet.
    pub fn set_jobs(&self, member: &str, session: &str, owner: &str, commands: JobCommands) {
        let mut members = self.lock();
        let Some(entry) = members.get_mut(member) else {
            return;
        };
        if !entry.in_session(session) || !entry.reported_jobs.is_complete() {
            return;
        }
        let empty = commands == JobCommands::default();
        let changed = put(&mut entry.desired.jobs, owner, commands, empty);
        entry.desired.planned(changed);
    }

    /// The Jobs of `owner` in `member`, the commands the hub holds for them there and the
    /// failures of those commands.
    pub fn jobs_of(&self, member: &str, owner: &str) -> MemberJobs {
        let members = self.lock();
        let Some(entry) = members.get(member) else {
            return MemberJobs::default();
        };
        let commands = entry.desired.jobs.get(owner).cloned().unwrap_or_default();
        let reported = &entry.reported_jobs;
        MemberJobs {
            jobs: reported
                .jobs
                .values()
                .filter(|j| j.owner == owner)
                .cloned()
                .collect(),
            complete: reported.complete,
            known: reported.known,
            failures: entry
                .failures
                .iter()
                .filter_map(|(t, f)| match t {
                    CommandTarget::Job(name) if commands.is_about(name) => {
                        Some((name.clone(), f.clone()))
                    }
                    _ => None,
                })
                .collect(),
            commands,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use kedge_protocol::{
        Ack, CommandResult, FailureCode, JobPhase, Propagation, Retry, StatusReport,
    };

    fn job(name: &str, owner: &str) -> JobStatus {
        JobStatus {
            namespace: "ns".into(),
            name: name.into(),
            owner: owner.into(),
            phase: JobPhase::Running,
            created_unix_ms: 0,
            any_pod_running_or_completed: true,
            true_pod_conditions: vec![],
            pending_reason: None,
            failure_reason: None,
            finished_unix_ms: None,
            replaces: None,
            template: None,
        }
    }

    fn create(name: &str) -> JobCreate {
        JobCreate {
            namespace: "ns".into(),
            name: name.into(),
            owner: "ns/d".into(),
            manifest_json: b"{}".to_vec(),
        }
    }

    fn delete(name: &str) -> JobDelete {
        JobDelete {
            namespace: "ns".into(),
            name: name.into(),
            owner: "ns/d".into(),
            propagation: Propagation::Background,
        }
    }

    fn gone(name: &str) -> JobRef {
        JobRef {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_full_report_in_parts_completes_the_set_with_its_last_part() {
        let mut reported = ReportedJobs::default();
        reported.record(false, vec![job("stale", "ns/d")], &[], false);
        assert!(
            !reported.is_complete(),
            "a partial report completes nothing"
        );
        reported.record(true, vec![job("a", "ns/d")], &[], true);
        assert!(!reported.is_complete());
        assert!(
            !reported.has("ns", "stale"),
            "a full report replaces the set"
        );
        reported.record(false, vec![job("b", "ns/d")], &[gone("a")], false);
        assert!(reported.is_complete() && reported.known);
        assert!(reported.has("ns", "b") && !reported.has("ns", "a"));
        // A new session is incomplete again, though the hub has known the member's Jobs.
        reported.session_started();
        assert!(!reported.is_complete() && reported.known);
    }

    #[test]
    fn commands_go_once_the_set_shows_them_carried_out() {
        let mut reported = ReportedJobs::default();
        reported.record(
            true,
            vec![job("made", "ns/d"), job("kept", "ns/d")],
            &[],
            false,
        );
        let mut commands = BTreeMap::from([
            (
                "ns/d".to_owned(),
                JobCommands {
                    creates: vec![create("made"), create("pending")],
                    deletes: vec![delete("kept"), delete("deleted")],
                },
            ),
            (
                "ns/e".to_owned(),
                JobCommands {
                    creates: vec![],
                    deletes: vec![delete("deleted")],
                },
            ),
        ]);
        assert!(reported.drop_done(&mut commands));
        assert_eq!(
            commands,
            BTreeMap::from([(
                "ns/d".to_owned(),
                JobCommands {
                    creates: vec![create("pending")],
                    deletes: vec![delete("kept")],
                },
            )])
        );
        assert!(!reported.drop_done(&mut commands), "nothing more is done");
    }

    #[test]
    fn job_commands_wait_for_a_complete_set_and_end_when_carried_out() {
        let f = fleet();
        f.session_started("m1", "s1", 0, None);
        let mut rx = f.desired_state("m1");
        let commands = JobCommands {
            creates: vec![create("j1")],
            deletes: vec![],
        };
        f.set_jobs("m1", "s1", "ns/d", commands.clone());
        assert!(rx.borrow_and_update().is_none(), "planned from nothing");
        f.record_report("m1", "s1", full(vec![]));
        f.set_jobs("m1", "s0", "ns/d", commands.clone());
        assert!(rx.borrow_and_update().is_none(), "another session");
        f.set_jobs("m1", "s1", "ns/d", commands.clone());
        let state = rx.borrow_and_update().clone().unwrap();
        assert_eq!(state.create_jobs, vec![create("j1")]);
        let failure = Failure {
            retry: Retry::Transient,
            code: FailureCode::ApiUnavailable,
            message: "member API server unavailable".into(),
        };
        f.record_ack(
            "m1",
            Ack {
                revision: state.revision,
                results: vec![
                    CommandResult {
                        target: CommandTarget::Job("ns/j1".into()),
                        failure: Some(failure.clone()),
                    },
                    CommandResult {
                        target: CommandTarget::Job("ns/other".into()),
                        failure: Some(failure.clone()),
                    },
                ],
            },
        );
        let jobs = f.jobs_of("m1", "ns/d");
        assert!(jobs.complete && jobs.known && jobs.jobs.is_empty());
        assert_eq!(jobs.commands, commands);
        assert_eq!(jobs.failures, vec![("ns/j1".to_owned(), failure)]);
        // The member reports the Job: the command is done, in a new revision.
        f.record_report(
            "m1",
            "s1",
            StatusReport {
                jobs: vec![job("j1", "ns/d"), job("x", "ns/other")],
                ..StatusReport::default()
            },
        );
        let state = rx.borrow_and_update().clone().unwrap();
        assert!(state.create_jobs.is_empty());
        let jobs = f.jobs_of("m1", "ns/d");
        assert_eq!(jobs.jobs, vec![job("j1", "ns/d")]);
        assert_eq!(jobs.commands, JobCommands::default());
        assert!(jobs.failures.is_empty());
        assert!(f.jobs_of("nobody", "ns/d").jobs.is_empty());
    }

    /// A member deleted and enrolled again (same name, a new `MemberCluster` uid) is a new
    /// member: the Job creates held for the one before are neither sent to it nor counted
    /// as its pending Jobs, and nothing it reported is taken as known. A forgotten member
    /// leaves nothing, and what it is given later comes under higher revisions.
    #[test]
    fn a_member_enrolled_anew_starts_over_and_a_forgotten_one_leaves_nothing() {
        let f = fleet();
        let held = JobCommands {
            creates: vec![create("j1")],
            deletes: vec![],
        };
        f.session_started("m1", "s1", 0, Some("uid-1"));
        f.record_report("m1", "s1", full(vec![healthy("a")]));
        f.set_jobs("m1", "s1", "ns/d", held.clone());
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        let first = f.member("m1").unwrap().revision;
        // Another session of the same enrollment keeps what is held.
        f.session_started("m1", "s2", 0, Some("uid-1"));
        assert_eq!(f.jobs_of("m1", "ns/d").commands, held);
        assert!(f.jobs_of("m1", "ns/d").known);
        // Enrolled anew: nothing from before.
        f.session_started("m1", "s3", first, Some("uid-2"));
        let jobs = f.jobs_of("m1", "ns/d");
        assert_eq!(jobs.commands, JobCommands::default());
        assert!(!jobs.known && jobs.jobs.is_empty());
        let member = f.member("m1").unwrap();
        assert!(member.workloads.is_empty() && member.acked_revision == 0);
        assert!(member.revision > first, "{} > {first}", member.revision);
        let mut rx = f.desired_state("m1");
        f.record_report("m1", "s3", full(vec![]));
        f.set_jobs("m1", "s3", "ns/d", JobCommands::default());
        let state = rx.borrow_and_update().clone().unwrap();
        assert!(state.create_jobs.is_empty() && state.workloads.is_empty());
        let renewed = state.revision;

        // Not forgotten for a session that a later one replaced…
        f.forget("m1", "s2");
        assert!(f.member("m1").is_some());
        // …forgotten for its last: nothing is left, and commands for it are not taken.
        f.forget("m1", "s3");
        assert!(f.member("m1").is_none());
        f.set_jobs("m1", "s3", "ns/d", held.clone());
        f.set_workloads("m1", "s3", "ns/a", vec![replicas("a", 2, "ns/a")]);
        assert!(f.member("m1").is_none(), "an ended session's commands");
        f.session_started("m1", "s4", renewed, Some("uid-3"));
        let again = f.member("m1").unwrap();
        assert!(again.revision > renewed, "{} > {renewed}", again.revision);
        assert_eq!(f.jobs_of("m1", "ns/d").commands, JobCommands::default());
    }
}

//! The hub's live picture of its members, shared by the QUIC sessions and the controllers:
//! what each member should run (desired state, per owning hub object) and what it reports
//! (workloads, capacity, command failures). Sessions publish reports and acks here and
//! stream desired state from here; controllers read snapshots and write desired replicas.
//!
//! One lock over every member's entry, one file per job: this one keeps the sessions and the
//! snapshots, `desired` what members should run, `jobs` the Job commands and the reported
//! Jobs, `reports` what agents report and acknowledge, `changes` who is told of it.

mod changes;
mod desired;
mod jobs;
mod reports;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kedge_protocol::{ClusterCapacity, CommandTarget, DesiredState, Failure};

use crate::registry::{MemberSession, SessionRegistry};

use self::changes::Changes;
use self::desired::Desired;
use self::jobs::ReportedJobs;
pub use self::jobs::{JobCommands, MAX_REPORTED_JOBS, MemberJobs};
pub use self::reports::{MAX_UNSOLICITED_WORKLOADS, Recorded, Reported};

/// Everything the hub knows about one member, at one instant.
#[derive(Debug, Clone)]
pub struct MemberSnapshot {
    /// Member name.
    pub name: String,
    /// Session state; `None` if the member never connected since the hub started. Shared
    /// with the session registry.
    pub session: Option<Arc<MemberSession>>,
    /// Whether the current session's first full report has arrived.
    pub session_reported: bool,
    /// Last reported state of each managed workload.
    pub workloads: Reported,
    /// Last reported capacity.
    pub capacity: Option<ClusterCapacity>,
    /// Commands that failed in the latest acknowledged revision, by target, unless a later
    /// report showed the workload healthy.
    pub failures: Vec<(CommandTarget, Failure)>,
    /// Revision of the latest desired state.
    pub revision: u64,
    /// Latest revision the agent acknowledged.
    pub acked_revision: u64,
    /// The desired state released to the member's current or last session (what it was
    /// sent), if one was.
    pub released: Option<Arc<DesiredState>>,
    /// When the last report arrived.
    pub last_report: Option<SystemTime>,
}

#[derive(Debug)]
struct MemberEntry {
    /// What the member should run, and whether its session may have it yet.
    desired: Desired,
    /// The Jobs the member reported.
    reported_jobs: ReportedJobs,
    /// The enrollment (`MemberCluster` uid) of the member's certificate in its latest
    /// session, when the certificate names one.
    enrollment: Option<String>,
    /// The current session and whether its first full report arrived.
    session: Option<String>,
    session_reported: bool,
    reported: Reported,
    capacity: Option<ClusterCapacity>,
    failures: Vec<(CommandTarget, Failure)>,
    acked_revision: u64,
    last_report: Option<SystemTime>,
}

impl MemberEntry {
    fn new(revision: u64) -> Self {
        Self {
            desired: Desired::new(revision),
            reported_jobs: ReportedJobs::default(),
            enrollment: None,
            session: None,
            session_reported: false,
            reported: Reported::default(),
            capacity: None,
            failures: Vec::new(),
            acked_revision: 0,
            last_report: None,
        }
    }

    /// Whether `session` is the member's current session.
    fn in_session(&self, session: &str) -> bool {
        self.session.as_deref() == Some(session)
    }
}

/// Every update under these locks is a set of plain field stores; a poisoned lock holds no
/// torn state.
fn guard<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The fleet state.
#[derive(Debug)]
pub struct Fleet {
    registry: Arc<SessionRegistry>,
    /// Pod-metrics scrape targets and samples.
    pod_metrics: Arc<crate::podmetrics::PodMetrics>,
    members: Mutex<BTreeMap<String, MemberEntry>>,
    /// Who is told of what changed (see `changes`).
    changes: Changes,
    /// First revision of the current leadership term ([`term_base`]): revisions keep
    /// increasing across hub restarts, and no two terms give out the same number.
    base_revision: AtomicU64,
}

/// Revisions a term may give out to one member before it could reach the next term's (a
/// term that starts a millisecond later): about a million.
const TERM_SHIFT: u32 = 20;

/// The first revision of a term starting at `now`: wall-clock milliseconds × 2^20. A revision
/// therefore names one desired state of one hub's term, so an agent's "last applied revision"
/// equal to a member's current one means it holds exactly that state (see
/// [`Fleet::session_started`]), whatever other hubs or terms told it in between.
fn term_base(now: SystemTime) -> u64 {
    u64::try_from(kedge_protocol::unix_ms(now))
        .unwrap_or(1)
        .max(1)
        << TERM_SHIFT
}

impl Fleet {
    /// An empty fleet over the session registry.
    pub fn new(registry: Arc<SessionRegistry>) -> Self {
        Self {
            registry,
            pod_metrics: Arc::default(),
            members: Mutex::new(BTreeMap::new()),
            changes: Changes::default(),
            base_revision: AtomicU64::new(term_base(SystemTime::now())),
        }
    }

    /// This hub starts leading (again): every member's revision moves to a new term's base,
    /// above any this process gave out, so that nothing a standby or another hub told an
    /// agent meanwhile can pass for this hub's current state.
    pub fn new_term(&self) {
        let mut members = self.lock();
        let highest = members
            .values()
            .map(|e| e.desired.revision)
            .max()
            .unwrap_or(0);
        let base = term_base(SystemTime::now())
            .max(highest.saturating_add(1))
            .max(self.base_revision.load(Ordering::Acquire).saturating_add(1));
        self.base_revision.store(base, Ordering::Release);
        for entry in members.values_mut() {
            entry.desired.revision = base;
        }
    }

    /// Pod-metrics scrape targets and samples.
    pub fn pod_metrics(&self) -> &Arc<crate::podmetrics::PodMetrics> {
        &self.pod_metrics
    }

    /// The session registry.
    pub fn registry(&self) -> &Arc<SessionRegistry> {
        &self.registry
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, MemberEntry>> {
        guard(&self.members)
    }

    fn entry<'a>(
        &self,
        members: &'a mut BTreeMap<String, MemberEntry>,
        member: &str,
    ) -> &'a mut MemberEntry {
        members
            .entry(member.to_owned())
            .or_insert_with(|| MemberEntry::new(self.base_revision.load(Ordering::Acquire)))
    }

    /// A new session of `member` started: nothing is sent to it until its first full report
    /// has arrived and a controller planned from it. True when the agent already holds the
    /// member's current desired state: `agent_holds` (its `Hello`'s last applied revision) is
    /// the current revision and the agent acknowledged it without a failed command, in an
    /// earlier session with this hub in this term. The session then sends nothing until the
    /// state changes.
    ///
    /// `enrollment` is the enrollment its certificate is bound to. A member enrolled anew
    /// (its `MemberCluster` deleted and created again) is a new member: nothing the hub held
    /// for the one before (Job commands, reported Jobs and workloads, acknowledgements) is
    /// sent, counted or taken as held.
    pub fn session_started(
        &self,
        member: &str,
        session_id: &str,
        agent_holds: u64,
        enrollment: Option<&str>,
    ) -> bool {
        let mut members = self.lock();
        let entry = self.entry(&mut members, member);
        if entry.enrollment.is_some() && entry.enrollment.as_deref() != enrollment {
            *entry = MemberEntry::new(entry.desired.revision.saturating_add(1));
        }
        entry.enrollment = enrollment.map(str::to_owned);
        entry.session = Some(session_id.to_owned());
        entry.session_reported = false;
        entry.reported_jobs.session_started();
        entry.desired.withhold();
        let revision = entry.desired.revision;
        // A command that failed is sent again, so the agent retries it.
        agent_holds == revision && entry.acked_revision == revision && entry.failures.is_empty()
    }

    /// Forgets `member`, whose `MemberCluster` is gone (or was created anew) and whose
    /// session `session` ended (see `SessionRegistry::forget_departed`): its desired state,
    /// reports, Job bookkeeping and pod-metrics targets. Nothing goes when a later session
    /// has started meanwhile. Revisions given to it later stay above those it had.
    pub fn forget(&self, member: &str, session: &str) {
        let removed = {
            let mut members = self.lock();
            let later = members
                .get(member)
                .and_then(|e| e.session.as_deref())
                .is_some_and(|s| s != session);
            if later {
                return;
            }
            members.remove(member)
        };
        if let Some(entry) = removed {
            self.base_revision
                .fetch_max(entry.desired.revision.saturating_add(1), Ordering::AcqRel);
        }
        self.pod_metrics.forget_member(member);
    }

    /// One member, if it ever connected or was given desired state.
    pub fn member(&self, member: &str) -> Option<MemberSnapshot> {
        let session = self.registry.shared(member);
        let members = self.lock();
        let entry = members.get(member);
        if entry.is_none() && session.is_none() {
            return None;
        }
        Some(snapshot(member, session, entry))
    }

    /// The members of `names` known to the sessions or the desired state, by name (for a
    /// controller that needs a few members out of many: nothing else is copied).
    pub fn members_named<'a>(
        &self,
        names: impl IntoIterator<Item = &'a String>,
    ) -> BTreeMap<String, MemberSnapshot> {
        let sessions: Vec<(&String, Option<Arc<MemberSession>>)> = names
            .into_iter()
            .map(|name| (name, self.registry.shared(name)))
            .collect();
        let members = self.lock();
        sessions
            .into_iter()
            .filter(|(name, session)| session.is_some() || members.contains_key(*name))
            .map(|(name, session)| (name.clone(), snapshot(name, session, members.get(name))))
            .collect()
    }

    /// Every member known to the sessions or the desired state, by name.
    pub fn members(&self) -> Vec<MemberSnapshot> {
        let sessions: BTreeMap<String, Arc<MemberSession>> = self
            .registry
            .shared_all()
            .into_iter()
            .map(|s| (s.member.clone(), s))
            .collect();
        let members = self.lock();
        let mut names: Vec<&String> = sessions.keys().chain(members.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|name| snapshot(name, sessions.get(name).cloned(), members.get(name)))
            .collect()
    }
}

fn snapshot(
    name: &str,
    session: Option<Arc<MemberSession>>,
    entry: Option<&MemberEntry>,
) -> MemberSnapshot {
    let session_reported = entry.is_some_and(|e| {
        e.session_reported
            && session
                .as_ref()
                .is_some_and(|s| e.in_session(&s.session_id))
    });
    MemberSnapshot {
        name: name.to_owned(),
        session,
        session_reported,
        workloads: entry.map(|e| e.reported.clone()).unwrap_or_default(),
        capacity: entry.and_then(|e| e.capacity),
        failures: entry.map(|e| e.failures.clone()).unwrap_or_default(),
        revision: entry.map_or(0, |e| e.desired.revision),
        acked_revision: entry.map_or(0, |e| e.acked_revision),
        released: entry.and_then(|e| e.desired.released()),
        last_report: entry.and_then(|e| e.last_report),
    }
}

/// What the tests of every part of the fleet (and of what reads it) build on.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    use kedge_protocol::{StatusReport, WorkloadRef, WorkloadReplicas, WorkloadStatus};

    use super::*;
    use crate::metrics::HubMetrics;
    use crate::registry::Liveness;

    pub(super) fn fleet() -> Fleet {
        let liveness = Liveness {
            interval: Duration::from_secs(1),
            tolerance: 3,
        };
        Fleet::new(Arc::new(SessionRegistry::new(
            liveness,
            HubMetrics::default(),
        )))
    }

    pub(crate) fn workload(name: &str) -> WorkloadRef {
        WorkloadRef::deployment("ns", name)
    }

    pub(super) fn replicas(name: &str, n: i32, owner: &str) -> WorkloadReplicas {
        WorkloadReplicas {
            workload: workload(name),
            replicas: Some(n),
            owner: owner.into(),
        }
    }

    pub(super) fn full(workloads: Vec<WorkloadStatus>) -> StatusReport {
        StatusReport {
            full: true,
            workloads,
            ..StatusReport::default()
        }
    }

    pub(super) fn healthy(name: &str) -> WorkloadStatus {
        WorkloadStatus {
            exists: true,
            ..WorkloadStatus::absent(workload(name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use kedge_protocol::{Ack, CommandResult, FailureCode, Retry};

    #[test]
    fn an_agent_holding_the_acknowledged_current_revision_is_in_sync_until_a_new_term() {
        let f = fleet();
        assert!(!f.session_started("m1", "s1", 0, None));
        f.record_report("m1", "s1", full(vec![]));
        let mut rx = f.desired_state("m1");
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        let r = rx.borrow_and_update().clone().unwrap().revision;
        // Applied but not acknowledged (the ack was lost with the session): sent again.
        assert!(!f.session_started("m1", "s2", r, None));
        f.record_report("m1", "s2", full(vec![]));
        f.set_workloads("m1", "s2", "ns/a", vec![replicas("a", 2, "ns/a")]);
        f.record_ack(
            "m1",
            Ack {
                revision: r,
                results: vec![],
            },
        );
        // Acknowledged with a failed command: sent again, so that the agent retries it.
        f.record_ack(
            "m1",
            Ack {
                revision: r,
                results: vec![CommandResult {
                    target: CommandTarget::Workload(workload("a")),
                    failure: Some(Failure {
                        retry: Retry::Transient,
                        code: FailureCode::ApiUnavailable,
                        message: "member API server unavailable".into(),
                    }),
                }],
            },
        );
        assert!(!f.session_started("m1", "s3", r, None));
        // Acknowledged: a new session of the same agent needs nothing…
        f.record_ack(
            "m1",
            Ack {
                revision: r,
                results: vec![],
            },
        );
        assert!(f.session_started("m1", "s3", r, None));
        // …unless it says it holds another revision…
        assert!(!f.session_started("m1", "s4", r - 1, None));
        assert!(!f.session_started("m1", "s5", r + 1, None));
        // …or the state changed since…
        f.record_report("m1", "s5", full(vec![]));
        f.set_workloads("m1", "s5", "ns/a", vec![replicas("a", 3, "ns/a")]);
        assert!(!f.session_started("m1", "s6", r, None));
        // …or this hub leads again after a standby time: nothing from before counts.
        let now = f.member("m1").unwrap().revision;
        f.record_ack(
            "m1",
            Ack {
                revision: now,
                results: vec![],
            },
        );
        assert!(f.session_started("m1", "s7", now, None));
        f.new_term();
        let next = f.member("m1").unwrap().revision;
        assert!(next > now, "{next} > {now}");
        assert!(!f.session_started("m1", "s8", now, None));
        // Terms a millisecond apart cannot give out the same revision to ~a million changes.
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_800_000_000_000);
        let later = t + std::time::Duration::from_millis(1);
        assert_eq!(term_base(later) - term_base(t), 1 << TERM_SHIFT);
    }
}

//! The hub's live picture of its members, shared by the QUIC sessions and the controllers:
//! what each member should run (desired state, per owning hub object) and what it reports
//! (workloads, capacity, command failures). Sessions publish reports and acks here and
//! stream desired state from here; controllers read snapshots and write desired replicas.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use kedge_protocol::{
    Ack, ClusterCapacity, CommandTarget, DesiredState, Failure, StatusReport, WorkloadRef,
    WorkloadReplicas, WorkloadStatus,
};
use tokio::sync::watch;

use crate::registry::{MemberSession, SessionRegistry};

/// Everything the hub knows about one member, at one instant.
#[derive(Debug, Clone)]
pub struct MemberSnapshot {
    /// Member name.
    pub name: String,
    /// Session state; `None` if the member never connected since the hub started.
    pub session: Option<MemberSession>,
    /// Last reported state of each managed workload.
    pub workloads: BTreeMap<WorkloadRef, WorkloadStatus>,
    /// Last reported capacity.
    pub capacity: Option<ClusterCapacity>,
    /// Commands that failed in the latest acknowledged revision, by target.
    pub failures: Vec<(CommandTarget, Failure)>,
    /// Revision of the latest desired state and the latest the agent acknowledged.
    pub revision: u64,
    /// Latest revision the agent acknowledged.
    pub acked_revision: u64,
    /// When the last report arrived.
    pub last_report: Option<SystemTime>,
}

#[derive(Debug)]
struct MemberEntry {
    /// Desired workloads by owner (`namespace/name` of the hub object).
    workloads: BTreeMap<String, Vec<WorkloadReplicas>>,
    desired: watch::Sender<Arc<DesiredState>>,
    reported: BTreeMap<WorkloadRef, WorkloadStatus>,
    capacity: Option<ClusterCapacity>,
    failures: Vec<(CommandTarget, Failure)>,
    acked_revision: u64,
    last_report: Option<SystemTime>,
}

/// The fleet state.
#[derive(Debug)]
pub struct Fleet {
    registry: Arc<SessionRegistry>,
    members: Mutex<BTreeMap<String, MemberEntry>>,
    changes: watch::Sender<u64>,
    /// First revision of this hub process: wall-clock milliseconds at start, so revisions keep
    /// increasing across hub restarts.
    base_revision: u64,
}

impl Fleet {
    /// An empty fleet over the session registry.
    pub fn new(registry: Arc<SessionRegistry>) -> Self {
        let base_revision = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        Self {
            registry,
            members: Mutex::new(BTreeMap::new()),
            changes: watch::channel(0).0,
            base_revision,
        }
    }

    /// The session registry.
    pub fn registry(&self) -> &Arc<SessionRegistry> {
        &self.registry
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, MemberEntry>> {
        // Every update is a set of plain field stores; a poisoned lock holds no torn state.
        self.members
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entry<'a>(
        &self,
        members: &'a mut BTreeMap<String, MemberEntry>,
        member: &str,
    ) -> &'a mut MemberEntry {
        members
            .entry(member.to_owned())
            .or_insert_with(|| MemberEntry {
                workloads: BTreeMap::new(),
                desired: watch::channel(Arc::new(DesiredState {
                    revision: self.base_revision,
                    ..Default::default()
                }))
                .0,
                reported: BTreeMap::new(),
                capacity: None,
                failures: Vec::new(),
                acked_revision: 0,
                last_report: None,
            })
    }

    /// Tells controllers that something they read changed (reports, acks, session state).
    pub fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that changes whenever [`Fleet::notify`] is called.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The desired state of `member`, for its session to stream.
    pub fn desired_state(&self, member: &str) -> watch::Receiver<Arc<DesiredState>> {
        let mut members = self.lock();
        self.entry(&mut members, member).desired.subscribe()
    }

    /// Sets the workloads `owner` wants on `member` (empty removes them). A new revision is
    /// published only when something changed.
    pub fn set_workloads(&self, member: &str, owner: &str, mut workloads: Vec<WorkloadReplicas>) {
        workloads.sort_by(|a, b| a.workload.cmp(&b.workload));
        let mut members = self.lock();
        let entry = self.entry(&mut members, member);
        let unchanged = match entry.workloads.get(owner) {
            Some(current) => *current == workloads,
            None => workloads.is_empty(),
        };
        if unchanged {
            return;
        }
        if workloads.is_empty() {
            entry.workloads.remove(owner);
        } else {
            entry.workloads.insert(owner.to_owned(), workloads);
        }
        let revision = entry.desired.borrow().revision + 1;
        let state = DesiredState {
            revision,
            workloads: entry.workloads.values().flatten().cloned().collect(),
            ..Default::default()
        };
        entry.desired.send_replace(Arc::new(state));
    }

    /// Removes everything `owner` wanted on every member.
    pub fn clear_owner(&self, owner: &str) {
        let names: Vec<String> = self.lock().keys().cloned().collect();
        for member in names {
            self.set_workloads(&member, owner, Vec::new());
        }
    }

    /// Records an agent report.
    pub fn record_report(&self, member: &str, report: StatusReport) {
        {
            let mut members = self.lock();
            let entry = self.entry(&mut members, member);
            if report.full {
                entry.reported.clear();
            }
            for status in report.workloads {
                entry.reported.insert(status.workload.clone(), status);
            }
            if report.capacity.is_some() {
                entry.capacity = report.capacity;
            }
            entry.last_report = Some(SystemTime::now());
        }
        self.notify();
    }

    /// Records an agent acknowledgement.
    pub fn record_ack(&self, member: &str, ack: Ack) {
        {
            let mut members = self.lock();
            let entry = self.entry(&mut members, member);
            entry.acked_revision = entry.acked_revision.max(ack.revision);
            entry.failures = ack
                .results
                .into_iter()
                .filter_map(|r| r.failure.map(|f| (r.target, f)))
                .collect();
        }
        self.notify();
    }

    /// One member, if it ever connected or was given desired state.
    pub fn member(&self, member: &str) -> Option<MemberSnapshot> {
        let session = self.registry.get(member);
        let members = self.lock();
        let entry = members.get(member);
        if entry.is_none() && session.is_none() {
            return None;
        }
        Some(snapshot(member, session, entry))
    }

    /// Every member known to the sessions or the desired state, by name.
    pub fn members(&self) -> Vec<MemberSnapshot> {
        let sessions: BTreeMap<String, MemberSession> = self
            .registry
            .snapshot()
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
    session: Option<MemberSession>,
    entry: Option<&MemberEntry>,
) -> MemberSnapshot {
    MemberSnapshot {
        name: name.to_owned(),
        session,
        workloads: entry.map(|e| e.reported.clone()).unwrap_or_default(),
        capacity: entry.and_then(|e| e.capacity),
        failures: entry.map(|e| e.failures.clone()).unwrap_or_default(),
        revision: entry.map_or(0, |e| e.desired.borrow().revision),
        acked_revision: entry.map_or(0, |e| e.acked_revision),
        last_report: entry.and_then(|e| e.last_report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::HubMetrics;
    use crate::registry::Liveness;
    use std::time::Duration;

    fn fleet() -> Fleet {
        let liveness = Liveness {
            interval: Duration::from_secs(1),
            tolerance: 3,
        };
        Fleet::new(Arc::new(SessionRegistry::new(
            liveness,
            HubMetrics::default(),
        )))
    }

    fn replicas(name: &str, n: i32, owner: &str) -> WorkloadReplicas {
        WorkloadReplicas {
            workload: WorkloadRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "ns".into(),
                name: name.into(),
            },
            replicas: n,
            owner: owner.into(),
        }
    }

    #[test]
    fn desired_state_merges_owners_and_bumps_revisions_only_on_change() {
        let f = fleet();
        let mut rx = f.desired_state("m1");
        let r0 = rx.borrow_and_update().revision;
        f.set_workloads("m1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        f.set_workloads("m1", "ns/b", vec![replicas("b", 3, "ns/b")]);
        let state = rx.borrow_and_update().clone();
        assert_eq!(state.revision, r0 + 2);
        assert_eq!(state.workloads.len(), 2);
        f.set_workloads("m1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        assert!(
            !rx.has_changed().unwrap(),
            "an unchanged set publishes nothing"
        );
        f.clear_owner("ns/a");
        let state = rx.borrow_and_update().clone();
        assert_eq!(state.workloads, vec![replicas("b", 3, "ns/b")]);
        assert_eq!(state.revision, r0 + 3);
    }

    #[test]
    fn reports_and_acks_show_in_snapshots_and_notify() {
        let f = fleet();
        let mut changes = f.subscribe();
        let status = WorkloadStatus::absent(replicas("a", 0, "").workload);
        f.record_report(
            "m1",
            StatusReport {
                full: true,
                workloads: vec![status.clone()],
                jobs: vec![],
                capacity: None,
            },
        );
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let failure = Failure {
            retry: kedge_protocol::Retry::Permanent,
            code: kedge_protocol::FailureCode::NamespaceNotAllowed,
            message: "no".into(),
        };
        f.record_ack(
            "m1",
            Ack {
                revision: 7,
                results: vec![kedge_protocol::CommandResult {
                    target: CommandTarget::Workload(status.workload.clone()),
                    failure: Some(failure.clone()),
                }],
            },
        );
        assert!(changes.has_changed().unwrap());
        let m = f.member("m1").unwrap();
        assert_eq!(m.workloads.get(&status.workload), Some(&status));
        assert_eq!(m.acked_revision, 7);
        assert_eq!(
            m.failures,
            vec![(CommandTarget::Workload(status.workload), failure)]
        );
        assert!(f.member("nobody").is_none());
    }
}

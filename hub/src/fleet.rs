//! The hub's live picture of its members, shared by the QUIC sessions and the controllers:
//! what each member should run (desired state, per owning hub object) and what it reports
//! (workloads, capacity, command failures). Sessions publish reports and acks here and
//! stream desired state from here; controllers read snapshots and write desired replicas.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kedge_protocol::{
    Ack, ClusterCapacity, CommandTarget, DesiredState, Failure, JobCreate, JobDelete, JobRef,
    JobStatus, StatusReport, WorkloadRef, WorkloadReplicas, WorkloadStatus,
};
use tokio::sync::watch;

use crate::registry::{MemberSession, SessionRegistry};

/// Workload entries a member may report before the hub has asked it for anything in this
/// session (after a hub restart the agent reports what it managed for the previous hub).
pub const MAX_UNSOLICITED_WORKLOADS: usize = 256;
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
    /// When the last report arrived.
    pub last_report: Option<SystemTime>,
}

#[derive(Debug)]
struct MemberEntry {
    /// Desired workloads by owner (`namespace/name` of the hub object).
    workloads: BTreeMap<String, Vec<WorkloadReplicas>>,
    /// Job commands by owner.
    jobs: BTreeMap<String, JobCommands>,
    /// Reported Jobs, and whether the set is complete (see [`MemberJobs::complete`]).
    reported_jobs: BTreeMap<JobRef, JobStatus>,
    jobs_complete: bool,
    /// A complete report has arrived in some session since the hub started.
    jobs_known: bool,
    /// A full report is arriving in parts.
    jobs_filling: bool,
    /// Revision of the latest desired state.
    revision: u64,
    /// The desired state for the current session; `None` until a controller planned for
    /// the member after its first full report of the session, so that a (re)connecting
    /// agent is never sent a state planned from nothing.
    desired: watch::Sender<Option<Arc<DesiredState>>>,
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
    fn state(&self) -> DesiredState {
        DesiredState {
            revision: self.revision,
            workloads: self.workloads.values().flatten().cloned().collect(),
            create_jobs: self.jobs.values().flat_map(|c| c.creates.clone()).collect(),
            delete_jobs: self.jobs.values().flat_map(|c| c.deletes.clone()).collect(),
        }
    }

    fn release(&mut self) {
        let state = self.state();
        self.desired.send_replace(Some(Arc::new(state)));
    }

    /// Whether the hub asked the member about `workload` (to scale or to hold it).
    fn asked(&self, workload: &WorkloadRef) -> bool {
        self.workloads
            .values()
            .flatten()
            .any(|w| &w.workload == workload)
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
    /// Job entries beyond [`MAX_REPORTED_JOBS`].
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
    changes: watch::Sender<u64>,
    /// Members changed since the DSO controller last took them ([`Fleet::take_changed`]).
    changed: Mutex<BTreeSet<String>>,
    /// Members whose reports moved only replica counts since the DSO controller last took
    /// them, and when the first of them did ([`Fleet::take_counts`]).
    counts: Mutex<(BTreeSet<String>, Option<tokio::time::Instant>)>,
    /// Wakes the DSO controller's trigger when `counts` gets its first member.
    counts_wake: tokio::sync::Notify,
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
            changes: watch::channel(0).0,
            changed: Mutex::new(BTreeSet::new()),
            counts: Mutex::new((BTreeSet::new(), None)),
            counts_wake: tokio::sync::Notify::new(),
            base_revision: AtomicU64::new(term_base(SystemTime::now())),
        }
    }

    /// This hub starts leading (again): every member's revision moves to a new term's base,
    /// above any this process gave out, so that nothing a standby or another hub told an
    /// agent meanwhile can pass for this hub's current state.
    pub fn new_term(&self) {
        let mut members = self.lock();
        let highest = members.values().map(|e| e.revision).max().unwrap_or(0);
        let base = term_base(SystemTime::now())
            .max(highest.saturating_add(1))
            .max(self.base_revision.load(Ordering::Acquire).saturating_add(1));
        self.base_revision.store(base, Ordering::Release);
        for entry in members.values_mut() {
            entry.revision = base;
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
            .or_insert_with(|| MemberEntry {
                workloads: BTreeMap::new(),
                jobs: BTreeMap::new(),
                reported_jobs: BTreeMap::new(),
                jobs_complete: false,
                jobs_known: false,
                jobs_filling: false,
                revision: self.base_revision.load(Ordering::Acquire),
                desired: watch::channel(None).0,
                session: None,
                session_reported: false,
                reported: Reported::default(),
                capacity: None,
                failures: Vec::new(),
                acked_revision: 0,
                last_report: None,
            })
    }

    /// Tells controllers that something they read of `member` changed (reports, acks,
    /// session state).
    pub fn notify(&self, member: &str) {
        {
            let mut changed = guard(&self.changed);
            if !changed.contains(member) {
                changed.insert(member.to_owned());
            }
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The members changed since the last call (a set: at most one entry per member).
    pub fn take_changed(&self) -> BTreeSet<String> {
        std::mem::take(&mut *guard(&self.changed))
    }

    /// Tells the DSO controller that `member` reported new replica counts and nothing else:
    /// that can wait for the next status write (see [`Fleet::counts_since`]). When a
    /// `/scale` change reaches 10,000 members, their reports of the new counts come back
    /// while the hub is still sending it; re-planning each batch at once took the CPU the
    /// rest of the fan-out needed.
    pub fn notify_counts(&self, member: &str) {
        let first = {
            let mut counts = guard(&self.counts);
            if !counts.0.contains(member) {
                counts.0.insert(member.to_owned());
            }
            counts.1.get_or_insert_with(tokio::time::Instant::now);
            counts.0.len() == 1
        };
        if first {
            self.counts_wake.notify_one();
        }
    }

    /// When the first member of those with new counts only ([`Fleet::notify_counts`])
    /// reported, if any has since the last [`Fleet::take_counts`].
    pub fn counts_since(&self) -> Option<tokio::time::Instant> {
        guard(&self.counts).1
    }

    /// Waits until a member reports new counts only while none is pending.
    pub async fn counts_reported(&self) {
        self.counts_wake.notified().await;
    }

    /// The members with new counts only since the last call.
    pub fn take_counts(&self) -> BTreeSet<String> {
        let mut counts = guard(&self.counts);
        counts.1 = None;
        std::mem::take(&mut counts.0)
    }

    /// Owners that hold desired workloads on any of `members`.
    pub fn owners_on(&self, members: &BTreeSet<String>) -> BTreeSet<String> {
        let entries = self.lock();
        members
            .iter()
            .filter_map(|m| entries.get(m))
            .flat_map(|e| e.workloads.keys().cloned())
            .collect()
    }

    /// A receiver that changes whenever [`Fleet::notify`] is called.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// A new session of `member` started: nothing is sent to it until its first full report
    /// has arrived and a controller planned from it. True when the agent already holds the
    /// member's current desired state: `agent_holds` (its `Hello`'s last applied revision) is
    /// the current revision and the agent acknowledged it without a failed command, in an
    /// earlier session with this hub in this term. The session then sends nothing until the
    /// state changes.
    pub fn session_started(&self, member: &str, session_id: &str, agent_holds: u64) -> bool {
        let mut members = self.lock();
        let entry = self.entry(&mut members, member);
        entry.session = Some(session_id.to_owned());
        entry.session_reported = false;
        entry.jobs_complete = false;
        entry.jobs_filling = false;
        entry.desired.send_replace(None);
        // A command that failed is sent again, so the agent retries it.
        agent_holds == entry.revision
            && entry.acked_revision == entry.revision
            && entry.failures.is_empty()
    }

    /// Sets the Job commands of `owner` for `member`, decided from the member's complete
    /// set of Jobs in session `session` (this also releases the desired state to it).
    /// Nothing happens when the member is in another session by now or its set of Jobs is
    /// not complete yet.
    pub fn set_jobs(&self, member: &str, session: &str, owner: &str, commands: JobCommands) {
        let mut members = self.lock();
        let entry = self.entry(&mut members, member);
        if entry.session.as_deref() != Some(session) || !entry.jobs_complete {
            return;
        }
        let unchanged = match entry.jobs.get(owner) {
            Some(current) => *current == commands,
            None => commands == JobCommands::default(),
        };
        if unchanged && entry.desired.borrow().is_some() {
            return;
        }
        if !unchanged {
            if commands == JobCommands::default() {
                entry.jobs.remove(owner);
            } else {
                entry.jobs.insert(owner.to_owned(), commands);
            }
            entry.revision += 1;
        }
        entry.release();
    }

    /// The Jobs of `owner` in `member`, the commands the hub holds for them there and the
    /// failures of those commands.
    pub fn jobs_of(&self, member: &str, owner: &str) -> MemberJobs {
        let members = self.lock();
        let Some(entry) = members.get(member) else {
            return MemberJobs::default();
        };
        let commands = entry.jobs.get(owner).cloned().unwrap_or_default();
        let mine = |target: &str| {
            commands
                .creates
                .iter()
                .any(|c| format!("{}/{}", c.namespace, c.name) == target)
                || commands
                    .deletes
                    .iter()
                    .any(|d| format!("{}/{}", d.namespace, d.name) == target)
        };
        MemberJobs {
            jobs: entry
                .reported_jobs
                .values()
                .filter(|j| j.owner == owner)
                .cloned()
                .collect(),
            complete: entry.jobs_complete,
            known: entry.jobs_known,
            failures: entry
                .failures
                .iter()
                .filter_map(|(t, f)| match t {
                    CommandTarget::Job(name) if mine(name) => Some((name.clone(), f.clone())),
                    _ => None,
                })
                .collect(),
            commands,
        }
    }

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
        let entry = self.entry(&mut members, member);
        if entry.session.as_deref() != Some(session) || !entry.session_reported {
            return;
        }
        let unchanged = match entry.workloads.get(owner) {
            Some(current) => *current == workloads,
            None => workloads.is_empty(),
        };
        let released = entry.desired.borrow().is_some();
        if unchanged && released {
            return;
        }
        if !unchanged {
            if workloads.is_empty() {
                entry.workloads.remove(owner);
            } else {
                entry.workloads.insert(owner.to_owned(), workloads);
            }
            entry.revision += 1;
        }
        entry.release();
    }

    /// Removes what `owner` wanted from `member` without releasing a desired state to a
    /// session that has not been planned for (the member is no longer used, or another
    /// owner claims the workload).
    pub fn clear_workloads(&self, member: &str, owner: &str) {
        let mut members = self.lock();
        let Some(entry) = members.get_mut(member) else {
            return;
        };
        if entry.workloads.remove(owner).is_none() {
            return;
        }
        entry.revision += 1;
        let state = entry.state();
        if entry.desired.borrow().is_some() {
            entry.desired.send_replace(Some(Arc::new(state)));
        }
    }

    /// Members holding commands of `owner`.
    pub fn holders(&self, owner: &str) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.workloads.contains_key(owner))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Removes everything `owner` wanted on every member.
    pub fn clear_owner(&self, owner: &str) {
        for member in self.holders(owner) {
            self.clear_workloads(&member, owner);
        }
    }

    /// Records an agent report of session `session_id`. Entries for workloads the hub did
    /// not ask the member about are dropped once it has asked for something; before that
    /// (the first report after a hub restart) at most [`MAX_UNSOLICITED_WORKLOADS`] are
    /// kept. A report of an older session is ignored.
    pub fn record_report(&self, member: &str, session_id: &str, report: StatusReport) -> Recorded {
        let mut recorded = Recorded::default();
        let mut counts_only;
        {
            let mut members = self.lock();
            let entry = self.entry(&mut members, member);
            if entry.session.as_deref() != Some(session_id) {
                return recorded;
            }
            let planned = entry.desired.borrow().is_some();
            let failures = entry.failures.len();
            // Only replica counts moved: the report of a command carried out, say.
            counts_only = !report.full
                && report.jobs.is_empty()
                && report.removed_jobs.is_empty()
                && report.capacity.is_none_or(|c| Some(c) == entry.capacity)
                && report.workloads.iter().all(|w| {
                    entry
                        .reported
                        .get(&w.workload)
                        .is_some_and(|old| same_but_counts(old, w))
                });
            if report.full {
                entry.reported.clear();
                entry.session_reported = true;
            }
            for status in report.workloads {
                let asked = entry.asked(&status.workload);
                if planned && !asked {
                    recorded.unsolicited += 1;
                    continue;
                }
                if !asked
                    && !entry.reported.contains_key(&status.workload)
                    && entry.reported.len() >= MAX_UNSOLICITED_WORKLOADS
                {
                    recorded.over_limit += 1;
                    continue;
                }
                // A report that shows the workload healthy supersedes an older failure.
                if status.exists && status.failure.is_none() {
                    entry.failures.retain(|(target, _)| {
                        !matches!(target, CommandTarget::Workload(w) if *w == status.workload)
                    });
                }
                entry.reported.insert(status);
                recorded.kept += 1;
            }
            // Jobs: a full report (possibly in parts) replaces the set; others update it.
            if report.full {
                entry.reported_jobs.clear();
                entry.jobs_filling = true;
            }
            for job in report.jobs {
                let key = JobRef {
                    namespace: job.namespace.clone(),
                    name: job.name.clone(),
                };
                if !entry.reported_jobs.contains_key(&key)
                    && entry.reported_jobs.len() >= MAX_REPORTED_JOBS
                {
                    recorded.jobs_over_limit += 1;
                    continue;
                }
                entry.reported_jobs.insert(key, job);
            }
            for gone in &report.removed_jobs {
                entry.reported_jobs.remove(gone);
            }
            if entry.jobs_filling && !report.more {
                entry.jobs_filling = false;
                entry.jobs_complete = true;
                entry.jobs_known = true;
            }
            // Commands done: creates the member reports, deletes of Jobs it no longer has.
            if entry.jobs_complete {
                let reported = &entry.reported_jobs;
                let mut changed = false;
                for commands in entry.jobs.values_mut() {
                    let before = (commands.creates.len(), commands.deletes.len());
                    commands.creates.retain(|c| {
                        !reported.contains_key(&JobRef {
                            namespace: c.namespace.clone(),
                            name: c.name.clone(),
                        })
                    });
                    commands.deletes.retain(|d| {
                        reported.contains_key(&JobRef {
                            namespace: d.namespace.clone(),
                            name: d.name.clone(),
                        })
                    });
                    changed |= before != (commands.creates.len(), commands.deletes.len());
                }
                entry.jobs.retain(|_, c| *c != JobCommands::default());
                if changed {
                    entry.revision += 1;
                    if entry.desired.borrow().is_some() {
                        entry.release();
                    }
                }
            }
            if report.capacity.is_some() {
                entry.capacity = report.capacity;
            }
            entry.last_report = Some(SystemTime::now());
            // A healthy report cleared a failure: planning reads that.
            counts_only &= entry.failures.len() == failures;
        }
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
                .is_some_and(|s| e.session.as_deref() == Some(s.session_id.as_str()))
    });
    MemberSnapshot {
        name: name.to_owned(),
        session,
        session_reported,
        workloads: entry.map(|e| e.reported.clone()).unwrap_or_default(),
        capacity: entry.and_then(|e| e.capacity),
        failures: entry.map(|e| e.failures.clone()).unwrap_or_default(),
        revision: entry.map_or(0, |e| e.revision),
        acked_revision: entry.map_or(0, |e| e.acked_revision),
        last_report: entry.and_then(|e| e.last_report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::HubMetrics;
    use crate::registry::Liveness;
    use kedge_protocol::{CommandResult, FailureCode, Retry};
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

    fn workload(name: &str) -> WorkloadRef {
        WorkloadRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn replicas(name: &str, n: i32, owner: &str) -> WorkloadReplicas {
        WorkloadReplicas {
            workload: workload(name),
            replicas: Some(n),
            owner: owner.into(),
        }
    }

    fn full(workloads: Vec<WorkloadStatus>) -> StatusReport {
        StatusReport {
            full: true,
            workloads,
            ..StatusReport::default()
        }
    }

    fn healthy(name: &str) -> WorkloadStatus {
        WorkloadStatus {
            exists: true,
            ..WorkloadStatus::absent(workload(name))
        }
    }

    #[test]
    fn nothing_is_released_to_a_session_before_its_first_full_report() {
        let f = fleet();
        f.session_started("m1", "s1", 0);
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
        f.session_started("m1", "s2", 0);
        assert!(rx.borrow_and_update().is_none());
    }

    #[test]
    fn an_agent_holding_the_acknowledged_current_revision_is_in_sync_until_a_new_term() {
        let f = fleet();
        assert!(!f.session_started("m1", "s1", 0));
        f.record_report("m1", "s1", full(vec![]));
        let mut rx = f.desired_state("m1");
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        let r = rx.borrow_and_update().clone().unwrap().revision;
        // Applied but not acknowledged (the ack was lost with the session): sent again.
        assert!(!f.session_started("m1", "s2", r));
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
        assert!(!f.session_started("m1", "s3", r));
        // Acknowledged: a new session of the same agent needs nothing…
        f.record_ack(
            "m1",
            Ack {
                revision: r,
                results: vec![],
            },
        );
        assert!(f.session_started("m1", "s3", r));
        // …unless it says it holds another revision…
        assert!(!f.session_started("m1", "s4", r - 1));
        assert!(!f.session_started("m1", "s5", r + 1));
        // …or the state changed since…
        f.record_report("m1", "s5", full(vec![]));
        f.set_workloads("m1", "s5", "ns/a", vec![replicas("a", 3, "ns/a")]);
        assert!(!f.session_started("m1", "s6", r));
        // …or this hub leads again after a standby time: nothing from before counts.
        let now = f.member("m1").unwrap().revision;
        f.record_ack(
            "m1",
            Ack {
                revision: now,
                results: vec![],
            },
        );
        assert!(f.session_started("m1", "s7", now));
        f.new_term();
        let next = f.member("m1").unwrap().revision;
        assert!(next > now, "{next} > {now}");
        assert!(!f.session_started("m1", "s8", now));
        // Terms a millisecond apart cannot give out the same revision to ~a million changes.
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_800_000_000_000);
        let later = t + std::time::Duration::from_millis(1);
        assert_eq!(term_base(later) - term_base(t), 1 << TERM_SHIFT);
    }

    #[test]
    fn reports_are_kept_sorted_and_snapshots_keep_what_they_saw() {
        let f = fleet();
        f.session_started("m1", "s1", 0);
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
    fn desired_state_merges_owners_and_bumps_revisions_only_on_change() {
        let f = fleet();
        f.session_started("m1", "s1", 0);
        f.record_report("m1", "s1", full(vec![]));
        let mut rx = f.desired_state("m1");
        f.set_workloads("m1", "s1", "ns/a", vec![replicas("a", 2, "ns/a")]);
        let r0 = rx.borrow_and_update().clone().unwrap().revision;
        f.set_workloads("m1", "s1", "ns/b", vec![replicas("b", 3, "ns/b")]);
        let state = rx.borrow_and_update().clone().unwrap();
        assert_eq!(state.revision, r0 + 1);
        assert_eq!(state.workloads.len(), 2);
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
    fn reports_are_bounded_to_what_was_asked() {
        let f = fleet();
        f.session_started("m1", "s1", 0);
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
        f.session_started("m1", "s1", 0);
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
        f.session_started("m1", "s1", 0);
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

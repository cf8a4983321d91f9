//! What outlives a session: the latest desired state, the apply loop that converges the
//! cluster to it, the watches of managed Jobs and workloads, the report loop that
//! restores and reports what they see, and the scrape loop that reads the pods' metrics.
//! Sessions come and go; these keep running (fail-static), and each new session
//! gets a full report and the full desired state (and scrape targets) again.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use kedge_net::supervise::Supervisor;
use kedge_protocol::{
    AgentMessage, DesiredState, MAX_FRAME_BYTES, PODMETRICS_PROTOCOL_VERSION, ScrapeTargets,
    WorkloadRef, WorkloadStatus, unix_ms,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::executor::Executor;
use crate::jobs::watch::{self as job_watch, SharedIndex};
use crate::metrics::AgentMetrics;
use crate::observe::observe_capacity;
use crate::report::ReportState;
use crate::scrape::{self, target::Scraper};
use crate::workloads::watch::Watches;

/// Messages waiting for the next session; bounded, because reports and acks are
/// level-triggered: when a report is dropped, the next one is full.
const OUTBOX: usize = 256;

/// How long the report loop gathers watch events after the first one wakes it, so that a
/// burst of Job and pod changes goes out in a few reports instead of one per event.
const COALESCE: Duration = Duration::from_millis(200);

/// The session's side of the link.
#[derive(Debug)]
pub(crate) struct SessionLink {
    /// Acks and reports to send to the hub.
    pub(crate) outbox: mpsc::Receiver<AgentMessage>,
    /// Where received desired state goes (shared: a thousand Jobs' manifests are worth not
    /// copying).
    pub(crate) desired: watch::Sender<Option<Arc<DesiredState>>>,
    /// The scrape targets; kept across sessions until the hub sends a new set.
    scrapes: watch::Sender<Arc<ScrapeTargets>>,
    full_report: Arc<AtomicBool>,
    report_now: Arc<Notify>,
    online: Arc<AtomicBool>,
}

impl SessionLink {
    /// Called when a session of `protocol_version` starts: drops what was queued for the
    /// previous one and asks for a full report right away. A hub older than pod metrics
    /// never sends scrape targets: those of an earlier, newer hub stop here.
    pub(crate) fn session_started(&mut self, protocol_version: u16) {
        while self.outbox.try_recv().is_ok() {}
        if protocol_version < PODMETRICS_PROTOCOL_VERSION {
            self.scrapes.send_if_modified(|targets| {
                let had = !targets.targets.is_empty();
                *targets = Arc::default();
                had
            });
        }
        self.online.store(true, Ordering::Release);
        self.full_report.store(true, Ordering::Release);
        self.report_now.notify_one();
    }

    /// Called when a session ends: no report is built until the next one starts, which
    /// gets a full report anyway (reports queued for nobody would only hold memory).
    pub(crate) fn session_ended(&mut self) {
        self.online.store(false, Ordering::Release);
    }

    /// Replaces the scrape targets (an empty set stops every scrape).
    pub(crate) fn scrape(&self, targets: ScrapeTargets) {
        self.scrapes.send_replace(Arc::new(targets));
    }
}

/// Queues a message for the session; `false` when the outbox is full and it was dropped.
fn post(outbox: &mpsc::Sender<AgentMessage>, message: AgentMessage) -> bool {
    match outbox.try_send(message) {
        Err(mpsc::error::TrySendError::Full(_)) => {
            debug!("outbox full; dropping a message superseded by the next full report");
            false
        }
        _ => true,
    }
}

/// Starts the apply loop, the watches of managed Jobs and pods, the report loop and the
/// scrape loop; returns the session's side of the link.
pub(crate) fn start(
    executor: Arc<Executor>,
    (report_interval, capacity_interval): (Duration, Duration),
    watch_timeout: Duration,
    metrics: AgentMetrics,
    supervisor: &Supervisor,
) -> SessionLink {
    let shutdown = supervisor.stop().clone();
    let (desired_tx, desired_rx) = watch::channel::<Option<Arc<DesiredState>>>(None);
    let (outbox_tx, outbox_rx) = mpsc::channel(OUTBOX);
    let full_report = Arc::new(AtomicBool::new(true));
    let report_now = Arc::new(Notify::new());
    let online = Arc::new(AtomicBool::new(false));
    let (scrapes_tx, scrapes_rx) = watch::channel(Arc::<ScrapeTargets>::default());
    supervisor.spawn(
        "the scrape loop",
        scrape::scrape_loop(
            Arc::new(Scraper::new(executor.clone(), metrics)),
            scrapes_rx,
            outbox_tx.clone(),
            online.clone(),
            shutdown.clone(),
        ),
    );
    let scopes = job_watch::scopes(&executor.policy().namespaces);
    let jobs = job_watch::index_for(&scopes);
    for scope in scopes {
        supervisor.spawn(
            "the Job watch",
            job_watch::follow_jobs(
                executor.client().clone(),
                scope.clone(),
                jobs.clone(),
                report_now.clone(),
            ),
        );
        supervisor.spawn(
            "the Job pod watch",
            job_watch::follow_pods(
                executor.client().clone(),
                scope,
                jobs.clone(),
                report_now.clone(),
            ),
        );
    }
    supervisor.spawn(
        "the apply loop",
        apply_loop(
            executor.clone(),
            desired_rx,
            outbox_tx.clone(),
            report_now.clone(),
            shutdown.clone(),
        ),
    );
    supervisor.spawn(
        "the report loop",
        report_loop(
            executor,
            jobs,
            outbox_tx,
            Reporting {
                full: full_report.clone(),
                now: report_now.clone(),
                online: online.clone(),
            },
            (report_interval, capacity_interval, watch_timeout),
            shutdown,
        ),
    );
    SessionLink {
        outbox: outbox_rx,
        desired: desired_tx,
        scrapes: scrapes_tx,
        full_report,
        report_now,
        online,
    }
}

/// Applies every new desired state and acknowledges it. When the hub adds or removes
/// workloads, wakes the report loop, which starts and stops their watches.
async fn apply_loop(
    executor: Arc<Executor>,
    mut desired: watch::Receiver<Option<Arc<DesiredState>>>,
    outbox: mpsc::Sender<AgentMessage>,
    report_now: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut managed = BTreeSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
        }
        let state = desired.borrow_and_update().clone();
        if let Some(state) = state {
            let ack = executor.apply(&state).await;
            let workloads: BTreeSet<WorkloadRef> =
                state.workloads.iter().map(|w| w.workload.clone()).collect();
            if workloads != managed {
                managed = workloads;
                report_now.notify_one();
            }
            // A dropped ack is not resent: the hub re-sends desired state to a new session.
            let _ = post(&outbox, AgentMessage::Ack(ack));
        }
    }
}

/// Replica changes outside kedge within this window…
const EDIT_WINDOW: Duration = Duration::from_secs(60);
/// …this many times mean something else scales the workload: the agent stops restoring it
/// and reports the conflict, instead of fighting.
const EDITS_BEFORE_CONFLICT: usize = 3;

/// Tells a one-off hand edit (restored) from something that keeps changing a workload's
/// replicas (a local autoscaler, a script): counts changes to values kedge did not ask for.
#[derive(Debug, Default)]
struct Drift {
    edits: VecDeque<Instant>,
    last_seen: Option<i32>,
    restored: bool,
}

impl Drift {
    /// Records that the workload has `spec` replicas while kedge wants `desired`; returns a
    /// description of the conflict when it keeps being changed. An edit is a count kedge did
    /// not ask for that is new since the last look, or that came back after a restore; a new
    /// count from the hub not applied yet and a restore that keeps failing are not.
    fn observe(&mut self, spec: i32, desired: i32, now: Instant) -> Option<String> {
        let changed = self.restored || self.last_seen.is_some_and(|seen| seen != spec);
        if spec != desired && changed {
            self.edits.push_back(now);
        }
        self.seen(spec, now)
    }

    /// Records a look at a held workload (not kedge's to restore, so nothing is an edit);
    /// edits counted before stay a conflict until they leave the window, so that holding a
    /// conflicting workload does not by itself end the conflict.
    fn hold(&mut self, spec: i32, now: Instant) -> Option<String> {
        self.seen(spec, now)
    }

    fn seen(&mut self, spec: i32, now: Instant) -> Option<String> {
        self.last_seen = Some(spec);
        self.restored = false;
        while self
            .edits
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > EDIT_WINDOW)
        {
            self.edits.pop_front();
        }
        (self.edits.len() >= EDITS_BEFORE_CONFLICT).then(|| {
            format!(
                "something in the member changed the replicas {} times within {}s (now {spec})",
                self.edits.len(),
                EDIT_WINDOW.as_secs()
            )
        })
    }
}

/// What the session side tells the report loop.
#[derive(Debug)]
struct Reporting {
    /// The next report must be full.
    full: Arc<AtomicBool>,
    /// Report now (a watch saw a change, or a session started).
    now: Arc<Notify>,
    /// A session is up to send reports to.
    online: Arc<AtomicBool>,
}

/// Looks at the managed workloads as their watches see them (restoring replica counts
/// changed outside kedge) whenever a watch saw a change and every report interval, reads the
/// cluster's capacity every capacity interval, reports managed Jobs as their watches change
/// them, and sends what changed. Without a session it only restores replica counts.
async fn report_loop(
    executor: Arc<Executor>,
    jobs: SharedIndex,
    outbox: mpsc::Sender<AgentMessage>,
    reporting: Reporting,
    (report_interval, capacity_interval, watch_timeout): (Duration, Duration, Duration),
    shutdown: CancellationToken,
) {
    let Reporting {
        full: full_report,
        now: report_now,
        online,
    } = reporting;
    let mut tick = tokio::time::interval(report_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = ReportState::default();
    let mut capacity_due = Instant::now();
    let mut drift: HashMap<WorkloadRef, Drift> = HashMap::new();
    let mut watches = Watches::new(executor.client().clone(), report_now.clone(), watch_timeout);
    // The time statuses are computed at, moved on every tick: an unschedulable pod's age
    // then changes a workload's status once per report interval, as it did when workloads
    // were read on the tick, not at every watch event.
    let mut as_of = unix_ms(SystemTime::now());
    loop {
        let ticked = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => true,
            _ = report_now.notified() => false,
        };
        if !ticked {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(COALESCE) => {}
            }
        }
        let full = online.load(Ordering::Acquire) && full_report.swap(false, Ordering::AcqRel);
        if ticked || full {
            as_of = unix_ms(SystemTime::now());
        }
        let observed = look_at_workloads(&executor, &mut watches, &mut drift, as_of, ticked).await;
        if !online.load(Ordering::Acquire) {
            continue;
        }
        let capacity = if full || (ticked && Instant::now() >= capacity_due) {
            capacity_due = Instant::now() + capacity_interval;
            match observe_capacity(&executor).await {
                Ok(capacity) => Some(capacity),
                Err(failure) => {
                    warn!(message = %failure.message, "cannot observe cluster capacity");
                    None
                }
            }
        } else {
            None
        };
        let report = state.next(observed, capacity, full, &mut job_watch::lock(&jobs));
        let Some(report) = report else { continue };
        for part in report.split(MAX_FRAME_BYTES) {
            if !post(&outbox, AgentMessage::Report(part)) {
                // The hub missed a change: tell it everything again.
                full_report.store(true, Ordering::Release);
                break;
            }
        }
    }
}

/// Looks at every workload the agent has applied a replica command for, as its watches see
/// it (starting and stopping watches to match the commands; `retry` tries again the
/// workloads that could not be watched), restoring replica counts changed outside kedge
/// unless something else keeps changing them. Each workload is looked at and restored as the
/// one writer of replica counts ([`Executor::applied_replicas`]), against the command last
/// applied: never against a newer desired state not applied yet (the agent's own apply would
/// look like an edit) nor with an older one (a restore would undo the apply). A count the
/// watch shows different from the command is read again from `/scale` before it counts: the
/// watch may not have caught up with the agent's own apply. A workload whose watches have not
/// listed yet is left out until they have.
async fn look_at_workloads(
    executor: &Executor,
    watches: &mut Watches,
    drift: &mut HashMap<WorkloadRef, Drift>,
    at_unix_ms: i64,
    retry: bool,
) -> Vec<WorkloadStatus> {
    let applied = executor.applied_replicas().await;
    watches.sync(executor, applied.keys(), retry).await;
    let mut observed = Vec::with_capacity(applied.len());
    for (w, command) in applied.iter() {
        let Some(mut status) = watches.status(w, at_unix_ms) else {
            continue;
        };
        if status.exists {
            let drift = drift.entry(w.clone()).or_default();
            let Some(want) = command.replicas else {
                let edits = drift.hold(status.spec_replicas, Instant::now());
                status.conflict = status.conflict.or(edits);
                observed.push(status);
                continue;
            };
            if status.spec_replicas != want && status.conflict.is_none() {
                match executor.current_replicas(&applied, w).await {
                    Ok(Some(replicas)) => status.spec_replicas = replicas,
                    // Deleted meanwhile: its watch says so next.
                    Ok(None) => continue,
                    Err(failure) => {
                        debug!(message = %failure.message, "cannot read the replicas of a workload");
                        observed.push(status);
                        continue;
                    }
                }
            }
            let edits = drift.observe(status.spec_replicas, want, Instant::now());
            status.conflict = status.conflict.or(edits);
            if let Some(other) = &status.conflict {
                debug!(workload = %w.name, %other, "not restoring replicas: something else scales it");
            } else if status.spec_replicas != want {
                info!(workload = %w.name, namespace = %w.namespace,
                    found = status.spec_replicas, desired = want,
                    "replicas were changed outside kedge; restoring");
                match executor.scale(&applied, command).await {
                    Ok(_) => drift.restored = true,
                    Err(failure) => {
                        warn!(message = %failure.message, "cannot restore replicas")
                    }
                }
            }
        }
        observed.push(status);
    }
    drift.retain(|w, _| applied.contains_key(w));
    observed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_edit_is_restored_repeated_edits_are_a_conflict() {
        let t0 = Instant::now();
        let mut d = Drift::default();
        assert_eq!(d.observe(3, 3, t0), None);
        // The hub raises the count: not an edit, the agent is about to apply it.
        assert_eq!(d.observe(3, 5, t0), None);
        assert_eq!(d.observe(5, 5, t0), None);
        // Someone edits: restored twice, the third time is a conflict.
        let s = Duration::from_secs(1);
        assert_eq!(d.observe(7, 5, t0 + s), None);
        d.restored = true;
        assert_eq!(d.observe(5, 5, t0 + 2 * s), None);
        assert_eq!(d.observe(8, 5, t0 + 3 * s), None);
        d.restored = true;
        assert_eq!(d.observe(5, 5, t0 + 4 * s), None);
        let conflict = d.observe(9, 5, t0 + 5 * s).expect("a conflict");
        assert!(conflict.contains("3 times"), "{conflict}");
        // Left alone, it stays a conflict within the window…
        assert!(d.observe(9, 5, t0 + 30 * s).is_some());
        // …and is gone once the edits are older than the window.
        assert_eq!(d.observe(9, 5, t0 + 70 * s), None);
    }

    #[test]
    fn edits_between_two_looks_count_and_failing_restores_do_not() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        // Restored each time, edited again before the agent saw its own restore.
        let mut d = Drift::default();
        assert_eq!(d.observe(3, 3, t0), None);
        for (i, edit) in [6, 6, 7].into_iter().enumerate() {
            let seen = d.observe(edit, 3, t0 + (i as u32 + 1) * s);
            d.restored = true;
            if i < 2 {
                assert_eq!(seen, None, "edit {i}");
            } else {
                assert!(seen.is_some(), "three edits are a conflict");
            }
        }
        // A restore that keeps failing (RBAC) leaves the same count in place: one edit.
        let mut d = Drift::default();
        assert_eq!(d.observe(3, 3, t0), None);
        for i in 1..10 {
            assert_eq!(d.observe(6, 3, t0 + i * s), None, "look {i}");
        }
        assert_eq!(d.edits.len(), 1);
    }

    #[test]
    fn a_hold_is_no_edit_and_keeps_the_conflict() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut d = Drift::default();
        assert_eq!(d.observe(3, 3, t0), None);
        // Held: changed by hand, not an edit.
        assert_eq!(d.hold(5, t0 + s), None);
        assert_eq!(d.hold(6, t0 + 2 * s), None);
        // Counted again at 3: seen at 6 before the agent applies 3, not an edit…
        assert_eq!(d.observe(6, 3, t0 + 3 * s), None);
        assert!(d.edits.is_empty());
        // …a new count after that is.
        assert_eq!(d.observe(7, 3, t0 + 4 * s), None);
        assert_eq!(d.edits.len(), 1);
        // A conflict stays one while held, until its edits leave the window.
        d.restored = true;
        assert_eq!(d.observe(8, 3, t0 + 5 * s), None);
        d.restored = true;
        assert!(d.observe(9, 3, t0 + 6 * s).is_some());
        assert!(d.hold(9, t0 + 30 * s).is_some());
        assert_eq!(d.hold(9, t0 + 70 * s), None);
    }
}

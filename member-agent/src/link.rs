//! What outlives a session: the latest desired state, the apply loop that converges the
//! cluster to it, and the report loop that observes and reports. Sessions come and go; these
//! keep running (fail-static), and each new session gets a full report and the full desired
//! state again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kedge_protocol::{AgentMessage, DesiredState};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::executor::Executor;
use crate::observe::{ReportState, observe_capacity, observe_workload};

/// Messages waiting for the next session; bounded, because reports and acks are
/// level-triggered: what is dropped is superseded by the next full report.
const OUTBOX: usize = 256;

/// The session's side of the link.
#[derive(Debug)]
pub(crate) struct SessionLink {
    /// Acks and reports to send to the hub.
    pub(crate) outbox: mpsc::Receiver<AgentMessage>,
    /// Where received desired state goes.
    pub(crate) desired: watch::Sender<Option<DesiredState>>,
    full_report: Arc<AtomicBool>,
    report_now: Arc<Notify>,
}

impl SessionLink {
    /// Called when a session starts: drops what was queued for the previous one and asks
    /// for a full report right away.
    pub(crate) fn session_started(&mut self) {
        while self.outbox.try_recv().is_ok() {}
        self.full_report.store(true, Ordering::Release);
        self.report_now.notify_one();
    }
}

fn post(outbox: &mpsc::Sender<AgentMessage>, message: AgentMessage) {
    if let Err(mpsc::error::TrySendError::Full(_)) = outbox.try_send(message) {
        debug!("outbox full; dropping a message superseded by the next full report");
    }
}

/// Starts the apply and report loops; returns the session's side of the link.
pub(crate) fn start(
    executor: Arc<Executor>,
    report_interval: Duration,
    capacity_interval: Duration,
    shutdown: CancellationToken,
) -> SessionLink {
    let (desired_tx, desired_rx) = watch::channel::<Option<DesiredState>>(None);
    let (outbox_tx, outbox_rx) = mpsc::channel(OUTBOX);
    let full_report = Arc::new(AtomicBool::new(true));
    let report_now = Arc::new(Notify::new());
    tokio::spawn(apply_loop(
        executor.clone(),
        desired_rx.clone(),
        outbox_tx.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(report_loop(
        executor,
        desired_rx,
        outbox_tx,
        full_report.clone(),
        report_now.clone(),
        (report_interval, capacity_interval),
        shutdown,
    ));
    SessionLink {
        outbox: outbox_rx,
        desired: desired_tx,
        full_report,
        report_now,
    }
}

/// Applies every new desired state and acknowledges it.
async fn apply_loop(
    executor: Arc<Executor>,
    mut desired: watch::Receiver<Option<DesiredState>>,
    outbox: mpsc::Sender<AgentMessage>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
        }
        let state = desired.borrow_and_update().clone();
        if let Some(state) = state {
            let ack = executor.apply(&state).await;
            post(&outbox, AgentMessage::Ack(ack));
        }
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Observes managed workloads (restoring replica counts changed outside kedge) and the
/// cluster's capacity, and reports what changed.
async fn report_loop(
    executor: Arc<Executor>,
    desired: watch::Receiver<Option<DesiredState>>,
    outbox: mpsc::Sender<AgentMessage>,
    full_report: Arc<AtomicBool>,
    report_now: Arc<Notify>,
    (report_interval, capacity_interval): (Duration, Duration),
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(report_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = ReportState::default();
    let mut capacity_due = Instant::now();
    let mut last_capacity = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = report_now.notified() => {}
        }
        let full = full_report.swap(false, Ordering::AcqRel);
        // Capacity first: each workload's room is computed from it.
        let capacity = if full || Instant::now() >= capacity_due {
            capacity_due = Instant::now() + capacity_interval;
            match observe_capacity(&executor).await {
                Ok(capacity) => {
                    last_capacity = Some(capacity);
                    Some(capacity)
                }
                Err(failure) => {
                    warn!(message = %failure.message, "cannot observe cluster capacity");
                    None
                }
            }
        } else {
            None
        };
        let commands = desired
            .borrow()
            .as_ref()
            .map(|d| d.workloads.clone())
            .unwrap_or_default();
        let mut observed = Vec::with_capacity(commands.len());
        for command in &commands {
            match observe_workload(
                &executor,
                &command.workload,
                last_capacity.as_ref(),
                unix_ms(),
            )
            .await
            {
                Ok(status) => {
                    if status.exists && status.spec_replicas != command.replicas {
                        info!(workload = %command.workload.name, namespace = %command.workload.namespace,
                            found = status.spec_replicas, desired = command.replicas,
                            "replicas were changed outside kedge; restoring");
                        if let Err(failure) = executor.scale(command).await {
                            warn!(message = %failure.message, "cannot restore replicas");
                        }
                    }
                    observed.push(status);
                }
                // Refused namespaces and the like are reported through acks.
                Err(failure) => debug!(message = %failure.message, "cannot observe workload"),
            }
        }
        if let Some(report) = state.next(observed, capacity, full) {
            post(&outbox, AgentMessage::Report(report));
        }
    }
}

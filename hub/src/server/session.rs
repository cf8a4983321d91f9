//! An established session: registered after its handshake, then one loop that streams the
//! member's desired state and scrape targets to the agent and records what it sends, until
//! the session is replaced, revoked, shut down, or its certificate expires.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kedge_net::identity::PeerIdentity;
use kedge_net::telemetry::AUDIT;
use kedge_protocol::{
    Ack, AgentMessage, DesiredState, EnrollRefusal, EnrollRefusalCode, EnrollResponse, Hello,
    HubMessage, PodMetricsReport, RenewRequest, ScrapeTargets, StatusReport, Welcome, close_code,
};
use quinn::{RecvStream, SendStream};
use tokio::sync::watch;
use tokio::sync::watch::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::peer::Peer;
use super::rate::RateLimit;
use super::streams::{send_within, stalled, stream_failed};
use super::{Control, ServerContext};
use crate::budget::HandshakePermit;
use crate::registry::NewSession;

/// One member's connection, from its verified certificate on.
pub(super) struct Session<'a> {
    pub(super) ctx: &'a ServerContext,
    pub(super) peer: Peer,
    pub(super) identity: PeerIdentity,
    pub(super) remote: SocketAddr,
    pub(super) shutdown: CancellationToken,
    /// Held until the `Hello` is in.
    pub(super) handshake: Option<HandshakePermit>,
}

/// What the loop of an established session keeps between events.
struct Live<'s> {
    control: &'s mut Control,
    session_id: &'s str,
    /// The revision the agent already holds, if it is the member's current one.
    holds: Option<u64>,
    /// No desired state was seen yet in this session.
    first_state: bool,
    desired: watch::Receiver<Option<Arc<DesiredState>>>,
    /// Pod-metrics scrape targets, followed only on sessions that speak them.
    scrapes: watch::Receiver<Arc<ScrapeTargets>>,
    pod_metrics: bool,
    reports: RateLimit,
    renewals: RateLimit,
    /// When the client certificate expires, unless renewed.
    cert_expiry: Instant,
    heartbeats: Option<JoinHandle<()>>,
}

/// What one event of the session loop decided: go on, or end the session for the reason
/// given.
type Step = Result<(), String>;

/// The instant a certificate valid until `not_after_unix_ms` (wall clock) expires, on the
/// monotonic clock where `now` is `wall`.
fn cert_deadline(not_after_unix_ms: i64, wall: SystemTime, now: Instant) -> Instant {
    let left = not_after_unix_ms.saturating_sub(kedge_protocol::unix_ms(wall));
    // Far enough to never fire, near enough not to overflow the timer.
    let left = u64::try_from(left)
        .unwrap_or(0)
        .min(10 * 365 * 24 * 3600 * 1000);
    now + Duration::from_millis(left)
}

impl Session<'_> {
    pub(super) fn close(&self, code: u32, reason: &str) {
        self.peer.close(code, reason);
    }

    pub(super) fn stream_failed(&self, error: &kedge_protocol::Error, stream: &str) -> String {
        stream_failed(&self.peer, &self.ctx.metrics, error, stream)
    }

    /// Sends `message` on `stream`; `Err` with why the session ends when the stream failed
    /// or the agent did not take it within the send timeout.
    async fn send(
        &self,
        stream: &mut Control,
        message: &HubMessage,
        name: &str,
    ) -> Result<(), String> {
        let limit = self.ctx.limits.send_timeout;
        send_within(stream, message, limit)
            .await
            .map_err(|e| match e {
                Some(e) => self.stream_failed(&e, name),
                None => stalled(&self.peer, &self.ctx.metrics, limit, name),
            })
    }

    /// Runs the session to its end. An `async` block rather than an `async fn`, whose future
    /// would keep `self` twice for the session's life.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    pub(super) fn run(mut self) -> impl Future<Output = ()> {
        async move {
            let Some((mut control, hello)) = self.handshake().await else {
                return;
            };
            // The handshake is over: its permit goes back before the session takes one.
            self.handshake.take();
            if !self.may_start(&mut control).await {
                return;
            }
            // Last, so that a member refused above never takes (or frees) a session's place.
            let Some(_session) = self.admit_session(&mut control).await else {
                return;
            };
            let session_id = self.ctx.next_session_id();
            let ended = self.register(&session_id, &hello);
            let member = &self.identity.member;
            let in_sync = self.ctx.fleet.session_started(
                member,
                &session_id,
                hello.last_applied_revision,
                self.identity.enrollment_uid.as_deref(),
            );
            self.ctx.fleet.notify(member);
            let welcome = self.welcome(&session_id, &hello);
            let reason = match self.send(&mut control, &welcome, "control").await {
                Err(reason) => reason,
                Ok(()) => {
                    info!(%session_id, agent_version = %hello.agent_version,
                    kubernetes_version = %hello.kubernetes_version,
                    last_applied_revision = hello.last_applied_revision, "session established");
                    let holds = in_sync.then_some(hello.last_applied_revision);
                    self.serve(
                        &mut control,
                        &ended,
                        &session_id,
                        holds,
                        hello.protocol_version,
                    )
                    .await
                }
            };
            let last = self.peer.sample();
            (self.ctx.registry).link_observed(member, &session_id, &last, SystemTime::now());
            self.ctx.registry.disconnected(member, &session_id, &reason);
            self.ctx.budget.remember(self.remote.ip(), Instant::now());
            self.ctx.fleet.notify(member);
            info!(%session_id, %reason, "session ended");
        }
    }

    /// Registers the session; returns the token cancelled when it is replaced or revoked.
    fn register(&self, session_id: &str, hello: &Hello) -> CancellationToken {
        let ended = self.ctx.registry.register(
            NewSession {
                member: self.identity.member.clone(),
                session_id: session_id.to_owned(),
                remote_addr: self.remote,
                agent_version: hello.agent_version.clone(),
                kubernetes_version: hello.kubernetes_version.clone(),
                protocol_version: hello.protocol_version,
                cert_not_after_unix: self.identity.not_after_unix,
                enrollment_uid: self.identity.enrollment_uid.clone(),
                link: self.peer.sample(),
            },
            Instant::now(),
            SystemTime::now(),
        );
        // Its address may now use the handshake reserve (see crate::budget).
        self.ctx.budget.remember(self.remote.ip(), Instant::now());
        ended
    }

    fn welcome(&self, session_id: &str, hello: &Hello) -> HubMessage {
        let interval = self.ctx.registry.liveness().interval;
        HubMessage::Welcome(Welcome {
            protocol_version: hello.protocol_version,
            hub_version: env!("CARGO_PKG_VERSION").to_owned(),
            session_id: session_id.to_owned(),
            member: self.identity.member.clone(),
            heartbeat_interval_ms: interval.as_millis() as u64,
        })
    }

    /// Serves an established session. `holds`: the revision the agent already holds (see
    /// [`Fleet::session_started`](crate::fleet::Fleet::session_started)); the session's first
    /// desired state is not sent when it is that revision.
    async fn serve(
        &self,
        control: &mut Control,
        ended: &CancellationToken,
        session_id: &str,
        holds: Option<u64>,
        protocol_version: u16,
    ) -> String {
        let mut live = self.live(control, session_id, holds, protocol_version);
        let reason = loop {
            let step = tokio::select! {
                _ = tokio::time::sleep_until(live.cert_expiry) => Err(self.on_cert_expired()),
                changed = live.desired.changed() => self.on_desired_state(changed, &mut live).await,
                changed = live.scrapes.changed(), if live.pod_metrics => {
                    self.on_scrape_targets(changed, &mut live).await
                }
                _ = ended.cancelled() => Err(self.on_ended(session_id)),
                _ = self.shutdown.cancelled() => Err(self.on_shutdown()),
                streams = self.peer.accept_bi(), if live.heartbeats.is_none() => {
                    self.on_heartbeat_stream(streams, &mut live)
                }
                message = live.control.recv() => {
                    self.on_message(message.map(|m| m.map(AgentMessage::sanitized)), &mut live).await
                }
            };
            if let Err(reason) = step {
                break reason;
            }
        };
        if let Some(task) = live.heartbeats {
            task.abort();
        }
        reason
    }

    /// The state of the session loop at its start.
    fn live<'s>(
        &self,
        control: &'s mut Control,
        session_id: &'s str,
        holds: Option<u64>,
        protocol_version: u16,
    ) -> Live<'s> {
        let member = &self.identity.member;
        // Level-triggered: the full desired state once the controllers planned from this
        // session's first full report (never a state planned from nothing), then every new
        // revision. Until then the agent keeps what it was told before.
        let mut desired = self.ctx.fleet.desired_state(member);
        desired.mark_changed();
        // Pod-metrics scrapes, on sessions that speak them: the current set at once (an
        // empty one clears what an earlier hub asked for), then every change.
        let pod_metrics = protocol_version >= kedge_protocol::PODMETRICS_PROTOCOL_VERSION;
        let mut scrapes = self.ctx.fleet.pod_metrics().targets(member);
        scrapes.mark_changed();
        Live {
            control,
            session_id,
            holds,
            first_state: true,
            desired,
            scrapes,
            pod_metrics,
            reports: RateLimit::reports(),
            renewals: RateLimit::renewals(),
            cert_expiry: cert_deadline(
                self.identity.not_after_unix.saturating_mul(1000),
                SystemTime::now(),
                Instant::now(),
            ),
            heartbeats: None,
        }
    }

    /// The certificate expired without renewal: the session ends.
    fn on_cert_expired(&self) -> String {
        warn!(target: "kedge::audit", member = %self.identity.member, reason = "cert_expired",
            "closing session: its client certificate expired without renewal");
        self.ctx.metrics.session_refused("cert_expired");
        self.close(
            close_code::CERT_EXPIRED,
            "client certificate expired without renewal",
        );
        "client certificate expired".to_owned()
    }

    /// A new desired state: sent, unless it is the first of the session and the agent holds
    /// it already.
    async fn on_desired_state(&self, changed: Result<(), RecvError>, live: &mut Live<'_>) -> Step {
        if changed.is_err() {
            return Err("desired state channel closed".to_owned());
        }
        let Some(state) = live.desired.borrow_and_update().clone() else {
            return Ok(());
        };
        if std::mem::take(&mut live.first_state) {
            let in_sync = live.holds == Some(state.revision);
            self.ctx.metrics.resync(in_sync);
            if in_sync {
                debug!(
                    revision = state.revision,
                    "the agent holds this desired state already; not sent again"
                );
                return Ok(());
            }
        }
        debug!(
            revision = state.revision,
            workloads = state.workloads.len(),
            "sending desired state"
        );
        let message = HubMessage::DesiredState((*state).clone());
        self.send(live.control, &message, "control").await
    }

    /// New pod-metrics scrape targets: sent.
    async fn on_scrape_targets(&self, changed: Result<(), RecvError>, live: &mut Live<'_>) -> Step {
        if changed.is_err() {
            return Err("scrape target channel closed".to_owned());
        }
        let targets = live.scrapes.borrow_and_update().clone();
        debug!(
            targets = targets.targets.len(),
            "sending pod-metrics scrape targets"
        );
        let message = HubMessage::Scrape((*targets).clone());
        self.send(live.control, &message, "control").await
    }

    /// The registry ended the session: revoked, or replaced by a newer one of the member.
    fn on_ended(&self, session_id: &str) -> String {
        if let Some(why) = self.ctx.registry.ending(&self.identity.member, session_id) {
            self.close(close_code::REVOKED, &why);
            return format!("revoked: {why}");
        }
        self.close(
            close_code::REPLACED,
            "replaced by a newer session of the same member",
        );
        "replaced by a newer session".to_owned()
    }

    fn on_shutdown(&self) -> String {
        self.close(close_code::SHUTDOWN, "hub shutting down");
        "hub shutting down".to_owned()
    }

    /// The agent opened its heartbeat stream, or the connection ended.
    fn on_heartbeat_stream(
        &self,
        streams: Result<(SendStream, RecvStream), String>,
        live: &mut Live<'_>,
    ) -> Step {
        match streams {
            Ok((send, recv)) => {
                live.heartbeats = Some(self.spawn_heartbeats(send, recv, live.session_id));
                Ok(())
            }
            Err(reason) => Err(reason),
        }
    }

    /// One message (already sanitized) or the end of the control stream.
    async fn on_message(
        &self,
        message: Result<Option<AgentMessage>, kedge_protocol::Error>,
        live: &mut Live<'_>,
    ) -> Step {
        match message {
            Ok(Some(AgentMessage::Ack(ack))) => {
                self.on_ack(ack);
                Ok(())
            }
            Ok(Some(AgentMessage::Report(report))) => {
                self.on_report(report, live).await;
                Ok(())
            }
            Ok(Some(AgentMessage::PodMetrics(report))) => {
                self.on_pod_metrics(report, live).await;
                Ok(())
            }
            Ok(Some(AgentMessage::Renew(request))) => self.on_renew(request, live).await,
            Ok(Some(other)) => Err(self.on_unexpected(&other)),
            Ok(None) => {
                self.close(close_code::SHUTDOWN, "control stream finished");
                Err("agent finished the control stream".to_owned())
            }
            Err(e) => Err(self.stream_failed(&e, "control")),
        }
    }

    fn on_ack(&self, ack: Ack) {
        self.ctx.metrics.message_received("ack");
        debug!(revision = ack.revision, results = ack.results.len(), "ack");
        self.ctx.fleet.record_ack(&self.identity.member, ack);
    }

    async fn on_report(&self, report: StatusReport, live: &mut Live<'_>) {
        self.ctx.metrics.message_received("report");
        debug!(
            full = report.full,
            workloads = report.workloads.len(),
            jobs = report.jobs.len(),
            "status report"
        );
        // A flooding agent is slowed down, not dropped: while this session
        // waits, QUIC flow control holds the agent's further reports back.
        if let Some(wait) = live.reports.take(Instant::now()) {
            self.ctx.metrics.report_throttled();
            debug!(?wait, "report rate exceeded; reading the next one later");
            tokio::time::sleep(wait).await;
        }
        let recorded = self
            .ctx
            .fleet
            .record_report(&self.identity.member, live.session_id, report);
        if recorded.unsolicited > 0 || recorded.over_limit > 0 {
            warn!(
                unsolicited = recorded.unsolicited,
                over_limit = recorded.over_limit,
                "dropped report entries the hub did not ask for"
            );
            let metrics = &self.ctx.metrics;
            metrics.report_entries_dropped("unsolicited", recorded.unsolicited as u64);
            metrics.report_entries_dropped("over_limit", recorded.over_limit as u64);
        }
    }

    async fn on_pod_metrics(&self, report: PodMetricsReport, live: &mut Live<'_>) {
        self.ctx.metrics.message_received("pod_metrics");
        // Samples come at most once per target and polling interval; one
        // flooding agent is slowed down like its reports.
        if let Some(wait) = live.reports.take(Instant::now()) {
            self.ctx.metrics.report_throttled();
            tokio::time::sleep(wait).await;
        }
        let recorded =
            self.ctx
                .fleet
                .pod_metrics()
                .record(&self.identity.member, report, Instant::now());
        self.ctx
            .metrics
            .pod_metric_samples("accepted", recorded.accepted);
        self.ctx
            .metrics
            .pod_metric_samples("unsolicited", recorded.unsolicited);
        if recorded.unsolicited > 0 {
            debug!(
                unsolicited = recorded.unsolicited,
                "dropped pod-metrics samples for triggers this member was not given"
            );
        }
    }

    /// A renewal: answered on the control stream; an issued certificate moves the deadline.
    async fn on_renew(&self, request: RenewRequest, live: &mut Live<'_>) -> Step {
        self.ctx.metrics.message_received("renew");
        if let Some(wait) = live.renewals.take(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        // Boxed: a renewal reads the member's enrollment from the API server, a future of
        // several KiB that every session's task would otherwise hold for its whole life.
        let answer = Box::pin(self.renew(&request.csr_der)).await;
        if let EnrollResponse::Issued(issued) = &answer {
            live.cert_expiry =
                cert_deadline(issued.not_after_unix_ms, SystemTime::now(), Instant::now());
            self.ctx.registry.certificate_renewed(
                &self.identity.member,
                live.session_id,
                issued.not_after_unix_ms / 1000,
            );
        }
        match live.control.send(&HubMessage::Renewed(answer)).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.stream_failed(&e, "control")),
        }
    }

    /// A message that has no place on the control stream: the session ends.
    fn on_unexpected(&self, message: &AgentMessage) -> String {
        let kind = match message {
            AgentMessage::Hello(_) => "Hello",
            _ => "Heartbeat",
        };
        let reason = format!("unexpected {kind} on the control stream");
        warn!(target: AUDIT, reason = "unexpected_message", detail = %reason, "closing session");
        self.ctx.metrics.frame_rejected("unexpected_message");
        self.close(close_code::PROTOCOL_ERROR, &reason);
        reason
    }

    /// A new certificate for this session's member, from a CSR sent over the session.
    async fn renew(&self, csr_der: &[u8]) -> EnrollResponse {
        match &self.ctx.enroller {
            Some(enroller) => {
                let member = &self.identity.member;
                // The enrollment uid the handshake read from this session's certificate.
                let uid = &self.identity.enrollment_uid;
                enroller.renew(member, uid.as_deref(), csr_der).await
            }
            None => {
                warn!(target: "kedge::audit", member = %self.identity.member, reason = "no_ca",
                    "renewal refused: this hub has certificates from files");
                EnrollResponse::Refused(EnrollRefusal {
                    code: EnrollRefusalCode::Unavailable,
                    message: "this hub issues no certificates (it runs with --tls-cert/--tls-key/--tls-ca); renew the certificate files".to_owned(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn the_certificate_deadline_follows_the_wall_clock() {
        let wall = UNIX_EPOCH + Duration::from_secs(1_000);
        let now = Instant::now();
        assert_eq!(
            cert_deadline(1_020_000, wall, now),
            now + Duration::from_secs(20)
        );
        // Already expired: now.
        assert_eq!(cert_deadline(999_000, wall, now), now);
        // Far future: bounded, no overflow.
        assert!(cert_deadline(i64::MAX, wall, now) > now + Duration::from_secs(365 * 24 * 3600));
    }
}

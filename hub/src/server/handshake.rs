//! From the agent's `Hello` to a session's place: the control stream and the `Hello` under
//! one deadline, the checks that may refuse the member, and the session budget.

use std::time::Duration;

use kedge_net::telemetry::AUDIT;
use kedge_protocol::{
    AgentMessage, Hello, HubMessage, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, Refusal, RefusalCode,
    close_code, is_supported_version,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, timeout};
use tracing::{debug, warn};

use super::Control;
use super::session::Session;
use super::streams::send_within;
use crate::admission::Verdict;

/// How long a reconnecting member waits for its previous session to release its place when
/// the session budget is full.
const REPLACE_WAIT: Duration = Duration::from_secs(2);
/// How long a session that arrives before the hub has listed its MemberClusters waits for
/// the list before it is refused with `Unavailable` (well within the agent's 10 s wait for
/// `Welcome`).
const ADMISSION_WAIT: Duration = Duration::from_secs(5);

impl Session<'_> {
    /// Refuses the session with `code`, counted and audited by its name.
    async fn refuse(&self, control: &mut Control, code: RefusalCode, message: String) {
        let reason = match code {
            RefusalCode::UnsupportedVersion => "unsupported_version",
            RefusalCode::Revoked => "revoked",
            RefusalCode::UnexpectedMessage => "unexpected_message",
            RefusalCode::Unavailable => "unavailable",
        };
        self.refuse_as(control, code, reason, message).await;
    }

    /// Refuses the session with `code`, counted and audited as `reason`.
    async fn refuse_as(
        &self,
        control: &mut Control,
        code: RefusalCode,
        reason: &'static str,
        message: String,
    ) {
        warn!(target: AUDIT, reason, ?code, %message, "session refused");
        self.ctx.metrics.session_refused(reason);
        let refusal = HubMessage::Refused(Refusal {
            code,
            message: message.clone(),
            min_protocol_version: MIN_PROTOCOL_VERSION,
            max_protocol_version: PROTOCOL_VERSION,
        });
        let sent = send_within(control, &refusal, self.ctx.limits.send_timeout).await;
        if sent.is_ok()
            && timeout(REPLACE_WAIT, control.finish())
                .await
                .is_ok_and(|r| r.is_ok())
        {
            // Let the agent read the refusal and close first, so the frame is not discarded.
            let _ = timeout(Duration::from_secs(2), self.peer.closed()).await;
        }
        self.close(close_code::REFUSED, &message);
    }

    pub(super) async fn handshake(&self) -> Option<(Control, Hello)> {
        let limit = self.ctx.limits.hello_timeout;
        // One deadline for the stream and the Hello: a peer trickling both gets no more.
        let deadline = Instant::now() + limit;
        let (send, recv) = match tokio::time::timeout_at(deadline, self.peer.accept_bi()).await {
            Ok(Ok(streams)) => streams,
            Ok(Err(reason)) => {
                debug!(%reason, "connection ended before the control stream opened");
                return None;
            }
            Err(_) => {
                warn!(target: AUDIT, reason = "hello_timeout", "closing session: no control stream within {limit:?}");
                self.ctx.metrics.session_refused("hello_timeout");
                self.close(close_code::PROTOCOL_ERROR, "no control stream in time");
                return None;
            }
        };
        let mut control = Control::new(recv, send);
        let first = match tokio::time::timeout_at(deadline, control.recv()).await {
            Err(_) => {
                warn!(target: AUDIT, reason = "hello_timeout", "closing session: no Hello within {limit:?}");
                self.ctx.metrics.session_refused("hello_timeout");
                self.close(close_code::PROTOCOL_ERROR, "no Hello in time");
                return None;
            }
            Ok(Err(e)) => {
                self.stream_failed(&e, "control");
                return None;
            }
            Ok(Ok(None)) => return None,
            Ok(Ok(Some(first))) => first.sanitized(),
        };
        let AgentMessage::Hello(hello) = first else {
            let message = "the first message on the control stream must be Hello".to_owned();
            self.refuse(&mut control, RefusalCode::UnexpectedMessage, message)
                .await;
            return None;
        };
        if !is_supported_version(hello.protocol_version) {
            let message = format!(
                "agent {} speaks protocol version {}, this hub accepts {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}; \
                 install an agent release that matches the hub",
                hello.agent_version, hello.protocol_version
            );
            self.refuse(&mut control, RefusalCode::UnsupportedVersion, message)
                .await;
            return None;
        }
        Some((control, hello))
    }

    /// A session permit, unless `--max-connections` sessions are established. A member whose
    /// previous session still holds a place (the hub has not noticed it end) takes that
    /// place: the newer session of a member replaces the older anyway.
    pub(super) async fn admit_session(
        &self,
        control: &mut Control,
    ) -> Option<OwnedSemaphorePermit> {
        let refused = match self.ctx.budget.session() {
            Ok(permit) => return Some(permit),
            Err(refused) => refused,
        };
        if self.ctx.registry.end_session(&self.identity.member)
            && let Ok(permit) = self.ctx.budget.session_within(REPLACE_WAIT).await
        {
            return Some(permit);
        }
        self.refuse_as(
            control,
            RefusalCode::Unavailable,
            refused.label(),
            refused.to_string(),
        )
        .await;
        None
    }

    /// Whether the member may start a session now: this hub leads, admits the member, and
    /// holds no other live session for its identity from elsewhere. Refused otherwise,
    /// after the `Hello`, so the agent reads a reason and moves on to its next hub address.
    pub(super) async fn may_start(&self, control: &mut Control) -> bool {
        let refusal = self.ctx.role.borrow().refusal();
        if let Some(message) = refusal {
            self.refuse(control, RefusalCode::Unavailable, message)
                .await;
            return false;
        }
        let member = &self.identity.member;
        let cert_uid = self.identity.enrollment_uid.as_deref();
        let mut verdict = self.ctx.admission.confirmed_verdict(member, cert_uid).await;
        // A hub that has just started has not listed its MemberClusters yet, and the agents
        // it replaced are all dialling it: the session waits for the list rather than being
        // refused after a full handshake and dialling again (a quarter of a 10,000-member
        // restart's handshakes were such refusals).
        if matches!(verdict, Verdict::NotYet(_))
            && self.ctx.admission.read_within(ADMISSION_WAIT).await
        {
            verdict = self.ctx.admission.confirmed_verdict(member, cert_uid).await;
        }
        match verdict {
            Verdict::Admit => {}
            Verdict::NotYet(message) => {
                self.refuse(control, RefusalCode::Unavailable, message)
                    .await;
                return false;
            }
            Verdict::Refuse { label, message } => {
                self.refuse_as(control, RefusalCode::Revoked, label, message)
                    .await;
                return false;
            }
        }
        let duplicate = self
            .ctx
            .registry
            .duplicate(member, self.remote, Instant::now());
        if let Some(message) = duplicate {
            self.ctx.fleet.notify(member);
            self.refuse_as(control, RefusalCode::Revoked, "duplicate_identity", message)
                .await;
            return false;
        }
        true
    }
}

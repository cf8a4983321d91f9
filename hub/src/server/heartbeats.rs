//! The heartbeat stream of a session: the agent's second bidirectional stream, served in a
//! task of its own beside the control stream.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kedge_net::telemetry::AUDIT;
use kedge_protocol::{AgentMessage, FramedStream, HeartbeatAck, HubMessage, close_code};
use quinn::{RecvStream, SendStream};
use tokio::time::Instant;
use tracing::{Instrument, warn};

use super::Control;
use super::peer::Peer;
use super::session::Session;
use super::streams::{send_within, stalled, stream_failed};
use crate::metrics::HubMetrics;
use crate::registry::SessionRegistry;

/// What a session's heartbeat task holds: its stream and what it records each beat in.
pub(super) struct Heartbeats {
    stream: Control,
    peer: Peer,
    registry: Arc<SessionRegistry>,
    metrics: HubMetrics,
    member: String,
    session_id: String,
    send_timeout: Duration,
}

impl Session<'_> {
    /// Serves the session's heartbeat stream in a task of its own: each heartbeat is marked
    /// in the registry and acknowledged; anything else on it closes the session.
    pub(super) fn spawn_heartbeats(
        &self,
        send: SendStream,
        recv: RecvStream,
        session_id: &str,
    ) -> tokio::task::JoinHandle<()> {
        let heartbeats = Heartbeats {
            stream: FramedStream::new(recv, send),
            peer: self.peer.clone(),
            registry: self.ctx.registry.clone(),
            metrics: self.ctx.metrics.clone(),
            member: self.identity.member.clone(),
            session_id: session_id.to_owned(),
            send_timeout: self.ctx.limits.send_timeout,
        };
        tokio::spawn(heartbeats.serve().in_current_span())
    }
}

impl Heartbeats {
    /// Until the stream ends, fails, stalls or carries anything but a heartbeat. An `async`
    /// block rather than an `async fn`: the future of an `async fn` keeps its arguments twice
    /// (as passed, and moved into its body), ~400 bytes more for each member's task.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    pub(super) fn serve(mut self) -> impl Future<Output = ()> {
        async move {
            loop {
                match self.stream.recv().await {
                    Ok(Some(AgentMessage::Heartbeat(beat))) => {
                        self.metrics.heartbeat();
                        let wall = SystemTime::now();
                        let (member, session_id) = (&self.member, &self.session_id);
                        (self.registry).heartbeat(member, session_id, Instant::now(), wall);
                        let link = self.peer.sample();
                        (self.registry).link_observed(member, session_id, &link, wall);
                        let ack = HubMessage::HeartbeatAck(HeartbeatAck { seq: beat.seq });
                        match send_within(&mut self.stream, &ack, self.send_timeout).await {
                            Ok(()) => {}
                            Err(Some(_)) => return,
                            Err(None) => {
                                let limit = self.send_timeout;
                                stalled(&self.peer, &self.metrics, limit, "heartbeat");
                                return;
                            }
                        }
                    }
                    Ok(Some(_)) => {
                        warn!(target: AUDIT, reason = "unexpected_message", "closing session: non-heartbeat message on the heartbeat stream");
                        self.metrics.frame_rejected("unexpected_message");
                        self.peer.close(
                            close_code::PROTOCOL_ERROR,
                            "only heartbeats belong on the heartbeat stream",
                        );
                        return;
                    }
                    Ok(None) => return,
                    Err(e) => {
                        stream_failed(&self.peer, &self.metrics, &e, "heartbeat");
                        return;
                    }
                }
            }
        }
    }
}

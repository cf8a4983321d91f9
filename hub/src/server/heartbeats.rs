//! The heartbeat stream of a session: the agent's second bidirectional stream, served in a
//! task of its own beside the control stream.

use std::time::SystemTime;

use kedge_net::telemetry::AUDIT;
use kedge_protocol::{AgentMessage, FramedStream, HeartbeatAck, HubMessage, close_code};
use quinn::{RecvStream, SendStream};
use tokio::time::Instant;
use tracing::{Instrument, warn};

use super::Control;
use super::session::Session;
use super::streams::{send_within, stalled, stream_failed};

impl Session<'_> {
    /// Serves the session's heartbeat stream in a task of its own: each heartbeat is marked
    /// in the registry and acknowledged; anything else on it closes the session.
    pub(super) fn spawn_heartbeats(
        &self,
        send: SendStream,
        recv: RecvStream,
        session_id: &str,
    ) -> tokio::task::JoinHandle<()> {
        let mut stream: Control = FramedStream::new(recv, send);
        let peer = self.peer.clone();
        let registry = self.ctx.registry.clone();
        let metrics = self.ctx.metrics.clone();
        let member = self.identity.member.clone();
        let session_id = session_id.to_owned();
        let send_timeout = self.ctx.limits.send_timeout;
        tokio::spawn(
            async move {
                loop {
                    match stream.recv().await {
                        Ok(Some(AgentMessage::Heartbeat(beat))) => {
                            metrics.heartbeat();
                            let wall = SystemTime::now();
                            registry.heartbeat(&member, &session_id, Instant::now(), wall);
                            let link = peer.sample();
                            registry.link_observed(&member, &session_id, &link, wall);
                            let ack = HubMessage::HeartbeatAck(HeartbeatAck { seq: beat.seq });
                            match send_within(&mut stream, &ack, send_timeout).await {
                                Ok(()) => {}
                                Err(Some(_)) => return,
                                Err(None) => {
                                    stalled(&peer, &metrics, send_timeout, "heartbeat");
                                    return;
                                }
                            }
                        }
                        Ok(Some(_)) => {
                            warn!(target: AUDIT, reason = "unexpected_message", "closing session: non-heartbeat message on the heartbeat stream");
                            metrics.frame_rejected("unexpected_message");
                            peer.close(
                                close_code::PROTOCOL_ERROR,
                                "only heartbeats belong on the heartbeat stream",
                            );
                            return;
                        }
                        Ok(None) => return,
                        Err(e) => {
                            stream_failed(&peer, &metrics, &e, "heartbeat");
                            return;
                        }
                    }
                }
            }
            .in_current_span(),
        )
    }
}

//! How a stream or a connection ended, in words safe to log: the peer's close, a bad frame
//! (closed with `PROTOCOL_ERROR` and counted by kind), or an agent that stopped reading.

use std::time::Duration;

use kedge_net::telemetry::AUDIT;
use kedge_protocol::{AgentMessage, FramedStream, HubMessage, close_code};
use tokio::time::timeout;
use tracing::warn;

use super::peer::Peer;
use crate::metrics::HubMetrics;

fn frame_error_label(error: &kedge_protocol::Error) -> &'static str {
    match error {
        kedge_protocol::Error::FrameTooLarge { .. } => "oversized",
        kedge_protocol::Error::Decode(_) => "undecodable",
        kedge_protocol::Error::TrailingBytes(_) => "trailing_bytes",
        kedge_protocol::Error::Truncated => "truncated",
        kedge_protocol::Error::Encode(_) | kedge_protocol::Error::Io(_) => "io",
    }
}

/// Sends one message, unless the peer does not take it within `limit`. `Err(None)` when the
/// time ran out (the peer stopped reading), `Err(Some(_))` when the stream failed.
pub(super) async fn send_within<R, W>(
    stream: &mut FramedStream<R, W, AgentMessage, HubMessage>,
    message: &HubMessage,
    limit: Duration,
) -> Result<(), Option<kedge_protocol::Error>>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    match timeout(limit, stream.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}

/// Closes a session whose agent stopped reading; returns why it ended.
pub(super) fn stalled(peer: &Peer, metrics: &HubMetrics, limit: Duration, stream: &str) -> String {
    if let Some(reason) = peer.close_reason() {
        return reason;
    }
    let reason = format!("the agent took no data on its {stream} stream for {limit:?}");
    warn!(target: AUDIT, reason = "stalled", %reason, "closing session: agent stopped reading");
    metrics.session_refused("stalled");
    peer.close(close_code::PROTOCOL_ERROR, &reason);
    reason
}

/// Handles a stream error: a closed connection ends quietly; bad bytes close it loudly.
/// Returns why the session ends.
pub(super) fn stream_failed(
    peer: &Peer,
    metrics: &HubMetrics,
    error: &kedge_protocol::Error,
    stream: &str,
) -> String {
    if let Some(reason) = peer.close_reason() {
        return reason;
    }
    let label = frame_error_label(error);
    warn!(target: AUDIT, stream, reason = label, error = %error, "closing session: bad frame from agent");
    metrics.frame_rejected(label);
    let reason = format!("bad frame on {stream} stream: {error}");
    peer.close(close_code::PROTOCOL_ERROR, &reason);
    reason
}

#[cfg(test)]
mod tests {
    use super::*;
    use kedge_protocol::HeartbeatAck;

    #[tokio::test]
    async fn a_send_to_a_peer_that_stops_reading_times_out() {
        let (hub_end, agent_end) = tokio::io::duplex(1024);
        let (hub_read, hub_write) = tokio::io::split(hub_end);
        let mut hub: FramedStream<_, _, AgentMessage, HubMessage> =
            FramedStream::new(hub_read, hub_write);
        let ack = HubMessage::HeartbeatAck(HeartbeatAck { seq: 1 });
        let limit = Duration::from_millis(100);
        // The agent end is never read: the pipe fills and the next send gives up in time.
        let mut sent = 0;
        let outcome = loop {
            match send_within(&mut hub, &ack, limit).await {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 10_000, "the pipe never filled");
        };
        assert!(outcome.is_none(), "timed out, not failed: {outcome:?}");
        assert!(sent > 0);
        // A peer that is gone fails at once instead.
        drop(agent_end);
        assert!(matches!(
            send_within(&mut hub, &ack, limit).await,
            Err(Some(_))
        ));
    }
}

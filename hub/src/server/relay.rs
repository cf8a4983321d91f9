//! Sharded hub replicas (`--sharding`): every replica holds the QUIC connections of the agents
//! that dial it, and the active replica (the Lease holder) decides for every object. A
//! replica that is not active relays each of its agents' sessions to the active one, so the
//! TLS, QUIC and heartbeat work of a fleet spreads over the replicas while every decision
//! stays in one place and users see one API.
//!
//! A relay is one QUIC connection from a replica to the active one, authenticated by a client
//! certificate the replica issues itself from the hub CA with the Common Name
//! [`RELAY_COMMON_NAME`] (not a member name, so no member certificate can pass for one). Per
//! agent connection it carries:
//! - a control stream, opened with [`Frame::Open`] (the member's verified identity and
//!   address), then the replica's [`Frame::Sample`] readings of the agent's connection and its
//!   [`Frame::Ended`], and from the active replica a [`Frame::Close`] the replica passes on to
//!   the agent;
//! - one stream per stream the agent opens, each headed by [`Frame::Stream`] and then the
//!   agent's bytes both ways, untouched.
//!
//! The active replica runs the same session as for an agent of its own
//! ([`Peer::Relayed`](super::peer::Peer)). When the relay fails, the replica closes its agents'
//! connections as a stopping hub does; they reconnect (to it or to another replica) and are
//! re-synced like after a hub restart.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kedge_net::identity::PeerIdentity;
use kedge_net::pki::{CertificateAuthority, Validity};
use kedge_net::tls::TlsMaterial;
use kedge_protocol::{AgentMessage, FramedStream, HeartbeatAck, HubMessage, close_code};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span};

use super::ServerContext;
use super::peer::{Peer, Relayed};
use super::session::Session;
use crate::lease::Role;
use crate::link::LinkSample;

/// Common Name of a relay's client certificate. It has dots, so it is no member name (an RFC
/// 1123 label), and the hub's enrollment never signs it.
pub const RELAY_COMMON_NAME: &str = "relay.hub.kedge";
/// Version of the relay frames; replicas of another version refuse each other's relay.
const RELAY_VERSION: u16 = 1;
/// Largest relay frame (an `Open` carries a member's identity and a reason or two).
const MAX_FRAME: usize = 16 * 1024;
/// Time allowed for the first frame of a relay stream.
const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a replica sends a reading of each relayed agent's connection.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How long the active replica waits for the control stream of an agent stream's connection.
const OPEN_WAIT: Duration = Duration::from_secs(5);
/// Streams per relayed agent connection: its control stream, and the agent's two.
const STREAMS_PER_AGENT: u64 = 3;
/// How long the sessions of a relay that ended have to record their end.
const RELAY_SESSIONS_END: Duration = Duration::from_secs(5);
/// Lifetime of a relay certificate; a replica issues a new one for every relay it dials.
const RELAY_CERT_LIFETIME: time::Duration = time::Duration::days(1);

/// The relayed agent connections whose sessions take further streams, by the replica's
/// number for them.
type Waiting = Mutex<HashMap<u64, mpsc::Sender<(SendStream, RecvStream)>>>;

/// One frame on a relay stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Frame {
    /// Replica → active: a relayed agent connection, first on its control stream.
    Open {
        version: u16,
        /// The replica that holds the agent's connection.
        replica: String,
        /// The replica's number for the agent connection, unique within its relay.
        agent: u64,
        member: String,
        not_after_unix: i64,
        serial: String,
        enrollment_uid: Option<String>,
        sample: LinkSample,
    },
    /// Replica → active: the first frame of one of the agent's streams.
    Stream { agent: u64 },
    /// Replica → active: a reading of the agent's connection.
    Sample(LinkSample),
    /// Replica → active: the agent's connection ended.
    Ended { reason: String },
    /// Active → replica: close the agent's connection.
    Close { code: u32, reason: String },
}

/// Writes one frame: its length (u32, big-endian), then postcard.
async fn write_frame<W: AsyncWrite + Unpin>(send: &mut W, frame: &Frame) -> Result<(), String> {
    let bytes =
        postcard::to_stdvec(frame).map_err(|e| format!("cannot encode a relay frame: {e}"))?;
    let length = u32::try_from(bytes.len()).map_err(|_| "relay frame too large".to_owned())?;
    send.write_all(&length.to_be_bytes())
        .await
        .map_err(|e| e.to_string())?;
    send.write_all(&bytes).await.map_err(|e| e.to_string())
}

/// Reads one frame; `Ok(None)` at the end of the stream before a frame starts.
async fn read_frame<R: AsyncRead + Unpin>(recv: &mut R) -> Result<Option<Frame>, String> {
    let mut length = [0u8; 4];
    let first = recv
        .read(&mut length[..1])
        .await
        .map_err(|e| e.to_string())?;
    if first == 0 {
        return Ok(None);
    }
    recv.read_exact(&mut length[1..])
        .await
        .map_err(|e| format!("truncated relay frame: {e}"))?;
    let length = u32::from_be_bytes(length) as usize;
    if length > MAX_FRAME {
        return Err(format!("relay frame of {length} bytes, over {MAX_FRAME}"));
    }
    let mut bytes = vec![0u8; length];
    recv.read_exact(&mut bytes)
        .await
        .map_err(|e| format!("truncated relay frame: {e}"))?;
    postcard::from_bytes(&bytes)
        .map(Some)
        .map_err(|e| format!("undecodable relay frame: {e}"))
}

/// Whether a verified client certificate chain is a relay's.
pub(super) fn is_relay(connection: &Connection) -> bool {
    kedge_net::identity::connection_common_name(connection).as_deref() == Some(RELAY_COMMON_NAME)
}

/// The relay side of a replica that is not active: dials the active replica and relays its
/// agents' sessions there.
#[derive(Debug)]
pub struct RelayClient {
    endpoint: quinn::Endpoint,
    ca: Arc<CertificateAuthority>,
    /// The name the active replica's server certificate carries.
    server_name: String,
    /// This replica's identity, for the active replica's logs.
    replica: String,
    current: tokio::sync::Mutex<Option<(SocketAddr, Connection)>>,
    next_agent: AtomicU64,
}

impl RelayClient {
    /// A relay client dialling from `endpoint` with a certificate from `ca`; `server_name` is
    /// verified in the active replica's certificate.
    pub fn new(
        endpoint: quinn::Endpoint,
        ca: Arc<CertificateAuthority>,
        server_name: String,
        replica: String,
    ) -> Self {
        Self {
            endpoint,
            ca,
            server_name,
            replica,
            current: tokio::sync::Mutex::new(None),
            next_agent: AtomicU64::new(0),
        }
    }

    /// The relay connection to `active`: the current one, or a new one.
    async fn connection(&self, active: SocketAddr) -> Result<Connection, String> {
        let mut current = self.current.lock().await;
        if let Some((address, connection)) = current.as_ref()
            && *address == active
            && connection.close_reason().is_none()
        {
            return Ok(connection.clone());
        }
        if let Some((_, old)) = current.take() {
            old.close(
                VarInt::from_u32(close_code::SHUTDOWN),
                b"the active hub changed",
            );
        }
        let config = self.client_config()?;
        let connecting = self
            .endpoint
            .connect_with(config, active, &self.server_name)
            .map_err(|e| format!("cannot dial the active hub replica at {active}: {e}"))?;
        let connection = timeout(FRAME_TIMEOUT, connecting)
            .await
            .map_err(|_| {
                format!("no relay to the active hub replica at {active} within {FRAME_TIMEOUT:?}")
            })?
            .map_err(|e| format!("relay to the active hub replica at {active} failed: {e}"))?;
        info!(%active, "relaying sessions to the active hub replica");
        *current = Some((active, connection.clone()));
        Ok(connection)
    }

    fn client_config(&self) -> Result<quinn::ClientConfig, String> {
        let now = time::OffsetDateTime::now_utc();
        let issued = self
            .ca
            .issue_client(
                RELAY_COMMON_NAME,
                Validity::issued(now, RELAY_CERT_LIFETIME),
            )
            .map_err(|e| format!("cannot issue a relay certificate: {e}"))?;
        let material = TlsMaterial::from_pem(&issued.cert_pem, &issued.key_pem, self.ca.cert_pem())
            .map_err(|e| format!("relay certificate: {e}"))?;
        let mut config = kedge_net::tls::client_config(
            material,
            kedge_net::tls::TransportTuning::agent(),
            kedge_protocol::ALPN,
        )
        .map_err(|e| format!("relay TLS configuration: {e}"))?;
        config.transport_config(Arc::new(relay_transport()));
        Ok(config)
    }

    /// Relays one agent connection to the active replica at `active` until either ends.
    /// `Err` when the relay cannot be opened: the agent was not told anything yet.
    pub(super) async fn forward(
        &self,
        agent: Connection,
        identity: &PeerIdentity,
        mut role: watch::Receiver<Role>,
        shutdown: &CancellationToken,
    ) -> Result<(), String> {
        let Some(active) = role.borrow_and_update().relay() else {
            return Err("no active hub replica is known".to_owned());
        };
        let relay = self.connection(active).await?;
        let (mut control_send, mut control_recv) = relay
            .open_bi()
            .await
            .map_err(|e| format!("relay to {active}: {e}"))?;
        let id = self.next_agent.fetch_add(1, Ordering::Relaxed);
        let open = Frame::Open {
            version: RELAY_VERSION,
            replica: self.replica.clone(),
            agent: id,
            member: identity.member.clone(),
            not_after_unix: identity.not_after_unix,
            serial: identity.serial.clone(),
            enrollment_uid: identity.enrollment_uid.clone(),
            sample: LinkSample::of(&agent),
        };
        write_frame(&mut control_send, &open).await?;
        let mut pipes = JoinSet::new();
        let mut opened = 0u32;
        let mut samples = tokio::time::interval(SAMPLE_EVERY);
        samples.tick().await;
        let (code, reason) = loop {
            tokio::select! {
                streams = agent.accept_bi() => match streams {
                    Ok(streams) => {
                        let relay = relay.clone();
                        // The agent's second stream is its heartbeat stream (protocol.md).
                        let heartbeats = (opened == 1).then(|| agent.clone());
                        opened = opened.saturating_add(1);
                        pipes.spawn(async move { pipe(streams, &relay, id, heartbeats).await });
                    }
                    Err(e) => {
                        let reason = format!("agent connection ended: {e}");
                        let _ = write_frame(&mut control_send, &Frame::Ended { reason }).await;
                        let _ = control_send.finish();
                        return Ok(());
                    }
                },
                frame = read_frame(&mut control_recv) => match frame {
                    Ok(Some(Frame::Close { code, reason })) => break (code, reason),
                    Ok(_) | Err(_) => break (
                        close_code::RECONNECT,
                        "the active hub replica went away; reconnect".to_owned(),
                    ),
                },
                _ = samples.tick() => {
                    let sample = Frame::Sample(LinkSample::of(&agent));
                    if write_frame(&mut control_send, &sample).await.is_err() {
                        break (close_code::RECONNECT, "the active hub replica went away; reconnect".to_owned());
                    }
                }
                closed = relay.closed() => {
                    debug!(error = %closed, "the relay to the active hub replica ended");
                    break (close_code::RECONNECT, "the relay to the active hub replica ended; reconnect".to_owned());
                }
                changed = role.changed() => {
                    // Another replica leads now, or this one: the session starts over there
                    // (the agent dials this replica again, which relays or serves it).
                    if changed.is_err() || role.borrow_and_update().relay() != Some(active) {
                        break (close_code::RECONNECT, "the active hub replica changed; reconnect".to_owned());
                    }
                }
                _ = shutdown.cancelled() => break (close_code::SHUTDOWN, "hub shutting down".to_owned()),
            }
        };
        agent.close(VarInt::from_u32(code), reason.as_bytes());
        pipes.abort_all();
        Ok(())
    }
}

/// Copies one agent stream to a new stream of the relay and back, until both directions end.
/// The heartbeat stream (`heartbeats`: the agent's connection) is answered here instead.
async fn pipe(
    agent: (SendStream, RecvStream),
    relay: &Connection,
    id: u64,
    heartbeats: Option<Connection>,
) {
    let Ok((mut relay_send, relay_recv)) = relay.open_bi().await else {
        return;
    };
    if write_frame(&mut relay_send, &Frame::Stream { agent: id })
        .await
        .is_err()
    {
        return;
    }
    let (mut agent_send, agent_recv) = agent;
    if let Some(connection) = heartbeats {
        return answer_heartbeats(
            FramedStream::new(agent_recv, agent_send),
            FramedStream::new(relay_recv, relay_send),
            &connection,
        )
        .await;
    }
    let up = copy(agent_recv, &mut relay_send, true);
    let down = copy(relay_recv, &mut agent_send, false);
    let _ = tokio::join!(up, down);
}

/// The agent's side of its heartbeat stream.
type AgentSide = FramedStream<RecvStream, SendStream, AgentMessage, HubMessage>;
/// The active replica's side of a relayed heartbeat stream.
type ActiveSide = FramedStream<RecvStream, SendStream, HubMessage, AgentMessage>;

/// Serves a relayed agent's heartbeat stream: this replica acknowledges each heartbeat
/// itself (the agent's link is to this replica; an active replica that dies does not make
/// every agent of the shard give up its connection before a successor takes the Lease) and
/// passes it on, so the active replica keeps the member's liveness; its acks are dropped.
/// Anything but a heartbeat is passed on as is, for the active replica to refuse.
async fn answer_heartbeats(mut agent: AgentSide, mut active: ActiveSide, connection: &Connection) {
    // The active replica's end of the stream: once it ends, the Close on the control stream
    // follows; heartbeats are still answered until then.
    let mut active_open = true;
    loop {
        tokio::select! {
            message = agent.recv() => match message {
                Ok(Some(AgentMessage::Heartbeat(beat))) => {
                    let ack = HubMessage::HeartbeatAck(HeartbeatAck { seq: beat.seq });
                    if agent.send(&ack).await.is_err() {
                        return;
                    }
                    // Within the stream's flow-control window: a stalled active replica
                    // does not stall the acks.
                    if active_open && active.send(&AgentMessage::Heartbeat(beat)).await.is_err() {
                        active_open = false;
                    }
                }
                Ok(Some(other)) => {
                    if active_open && active.send(&other).await.is_err() {
                        active_open = false;
                    }
                }
                Ok(None) => {
                    let _ = active.finish().await;
                    return;
                }
                Err(e) => {
                    let reason = format!("bad frame on heartbeat stream: {e}");
                    connection.close(VarInt::from_u32(close_code::PROTOCOL_ERROR), reason.as_bytes());
                    return;
                }
            },
            message = active.recv(), if active_open => match message {
                Ok(Some(HubMessage::HeartbeatAck(_))) => {}
                Ok(Some(other)) => {
                    if agent.send(&other).await.is_err() {
                        return;
                    }
                }
                Ok(None) | Err(_) => active_open = false,
            },
        }
    }
}

/// Copies `from` into `to` chunk by chunk, as quinn received them (no buffer of its own).
/// Towards the active replica (`upstream`) the end of `from` is passed on; towards the agent
/// it is not: the active replica's `Close` on the control stream ends the agent's connection
/// with its code and reason, which a stream finished first would hide.
async fn copy(mut from: RecvStream, to: &mut SendStream, upstream: bool) {
    loop {
        match from.read_chunk(usize::MAX, true).await {
            Ok(Some(chunk)) => {
                if to.write_chunk(chunk.bytes).await.is_err() {
                    let _ = from.stop(VarInt::from_u32(0));
                    return;
                }
            }
            Ok(None) if upstream => {
                let _ = to.finish();
                return;
            }
            Err(_) if upstream => {
                let _ = to.reset(VarInt::from_u32(0));
                return;
            }
            Ok(None) | Err(_) => {
                // Held open until the Close comes (or the relay is gone).
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Connection-level flow-control window of a relay, each way: a whole shard's reports and
/// desired states share it (each stream keeps the agent's own stream window).
const RELAY_WINDOW: u32 = 64 << 20;

/// The relaying replica's transport of a relay: windows for a whole shard's traffic; the
/// active replica opens no stream on it.
fn relay_transport() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(0))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .receive_window(VarInt::from_u32(RELAY_WINDOW))
        .send_window(u64::from(RELAY_WINDOW))
        .keep_alive_interval(Some(Duration::from_secs(2)))
        // The Lease, not silence, says when the active replica is gone; a relay gives a busy
        // shard time (the active replica's own idle timeout, 30 s by default, applies too).
        .max_idle_timeout(Some(VarInt::from_u32(60_000).into()));
    transport
}

/// Concurrent streams a relay allows: [`STREAMS_PER_AGENT`] for each session the active
/// replica admits (`--max-connections`, direct and relayed together), so that one relay
/// may carry all of them: after a replica dies, its agents reach the others, whose relays
/// then carry two shards. (A bound of 16,384 agents per relay left 3,600 of a killed
/// replica's 10,000 agents without a session for minutes in the sharded bench.)
fn relay_streams(max_connections: usize) -> VarInt {
    let streams = STREAMS_PER_AGENT.saturating_mul(max_connections.max(1) as u64);
    VarInt::from_u64(streams).unwrap_or(VarInt::MAX)
}

/// The active replica's end of one relay: runs a session for every relayed agent connection.
pub(super) async fn serve_relay(
    relay: Connection,
    ctx: Arc<ServerContext>,
    shutdown: CancellationToken,
) {
    // The hub's transport is sized for one agent's session; a relay carries a shard's.
    relay.set_max_concurrent_bi_streams(relay_streams(ctx.limits.max_connections));
    relay.set_receive_window(VarInt::from_u32(RELAY_WINDOW));
    relay.set_send_window(u64::from(RELAY_WINDOW));
    let remote = relay.remote_address();
    info!(%remote, "a hub replica relays its sessions here");
    // The agent connections of this relay whose sessions wait for further streams.
    let waiting: Arc<Waiting> = Arc::default();
    let mut sessions = JoinSet::new();
    let reason = loop {
        let streams = tokio::select! {
            _ = shutdown.cancelled() => break "hub shutting down".to_owned(),
            streams = relay.accept_bi() => streams,
        };
        let (send, mut recv) = match streams {
            Ok(streams) => streams,
            Err(e) => break e.to_string(),
        };
        let first = match timeout(FRAME_TIMEOUT, read_frame(&mut recv)).await {
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => break format!("bad relay frame: {e}"),
            Err(_) => break "no relay frame in time".to_owned(),
        };
        match first {
            Frame::Open { version, .. } if version != RELAY_VERSION => {
                break format!("relay version {version}, this hub speaks {RELAY_VERSION}");
            }
            Frame::Open {
                replica,
                agent,
                member,
                not_after_unix,
                serial,
                enrollment_uid,
                sample,
                ..
            } => {
                let (streams_tx, streams_rx) = mpsc::channel(2);
                lock(&waiting).insert(agent, streams_tx);
                let relayed = Arc::new(Relayed {
                    replica,
                    closed: CancellationToken::new(),
                    reason: Mutex::new(None),
                    close: Mutex::new(None),
                    close_requested: CancellationToken::new(),
                    streams: tokio::sync::Mutex::new(streams_rx),
                    sample: Mutex::new(sample),
                });
                let identity = PeerIdentity {
                    member,
                    not_after_unix,
                    serial,
                    enrollment_uid,
                };
                let agent_remote = sample.remote.unwrap_or(remote);
                let span = info_span!("session", member = %identity.member, remote = %agent_remote,
                    replica = %relayed.replica);
                let session = relayed_session(
                    relayed,
                    (send, recv),
                    identity,
                    agent_remote,
                    ctx.clone(),
                    shutdown.clone(),
                );
                let waiting = waiting.clone();
                sessions.spawn(
                    async move {
                        session.await;
                        lock(&waiting).remove(&agent);
                    }
                    .instrument(span),
                );
            }
            Frame::Stream { agent } => {
                let waiting = waiting.clone();
                sessions.spawn(async move { hand_over(&waiting, agent, (send, recv)).await });
            }
            other => {
                break format!("unexpected relay frame first on a stream: {other:?}");
            }
        }
        // Reap what ended, so the set holds live sessions only.
        while sessions.try_join_next().is_some() {}
    };
    relay.close(VarInt::from_u32(close_code::SHUTDOWN), reason.as_bytes());
    info!(%remote, %reason, "relay from a hub replica ended");
    // Every stream of the relay failed with it: each session records its end (the member
    // Unreachable, its share held for the grace period) before anything is aborted.
    let ended = async { while sessions.join_next().await.is_some() {} };
    if timeout(RELAY_SESSIONS_END, ended).await.is_err() {
        sessions.shutdown().await;
    }
}

/// Runs the session of one relayed agent connection beside its relay control stream, which
/// brings the replica's readings and the agent's end, and takes this hub's close back.
async fn relayed_session(
    relayed: Arc<Relayed>,
    control: (SendStream, RecvStream),
    identity: PeerIdentity,
    remote: SocketAddr,
    ctx: Arc<ServerContext>,
    shutdown: CancellationToken,
) {
    let peer = Peer::Relayed(relayed.clone());
    ctx.metrics.relayed_session("served", 1);
    let session = async {
        Session {
            ctx: &ctx,
            peer: peer.clone(),
            identity,
            remote,
            shutdown,
            handshake: None,
        }
        .run()
        .await;
        // However it ended, the replica closes the agent's connection.
        peer.close(close_code::SHUTDOWN, "session ended");
    };
    tokio::join!(session, relay_control(&relayed, control));
    ctx.metrics.relayed_session("served", -1);
}

/// The active replica's end of a relayed connection's control stream.
async fn relay_control(relayed: &Relayed, (mut send, mut recv): (SendStream, RecvStream)) {
    loop {
        tokio::select! {
            frame = read_frame(&mut recv) => match frame {
                Ok(Some(Frame::Sample(sample))) => *lock(&relayed.sample) = sample,
                Ok(Some(Frame::Ended { reason })) => {
                    relayed.ended(kedge_protocol::clean_text(&reason, kedge_protocol::MAX_MESSAGE_BYTES));
                    return;
                }
                Ok(Some(other)) => {
                    relayed.ended(format!("unexpected relay frame {other:?}"));
                    return;
                }
                Ok(None) | Err(_) => {
                    relayed.ended(format!("relay from hub replica {} ended", relayed.replica));
                    return;
                }
            },
            _ = relayed.close_requested.cancelled() => {
                let (code, reason) = lock(&relayed.close)
                    .clone()
                    .unwrap_or((close_code::SHUTDOWN, String::new()));
                let _ = write_frame(&mut send, &Frame::Close { code, reason }).await;
                let _ = send.finish();
                return;
            }
        }
    }
}

/// Gives one of an agent's further streams to its session, once the session exists.
async fn hand_over(waiting: &Waiting, agent: u64, streams: (SendStream, RecvStream)) {
    let deadline = tokio::time::Instant::now() + OPEN_WAIT;
    loop {
        let sender = lock(waiting).get(&agent).cloned();
        if let Some(sender) = sender {
            let _ = sender.send(streams).await;
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            debug!(
                agent,
                "a relayed stream for an agent connection that is gone"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_samples_keep_their_readings() {
        let sample = LinkSample {
            remote: Some("10.1.2.3:4567".parse().unwrap()),
            bytes_sent: 1,
            bytes_received: 2,
            packets_sent: 3,
            packets_received: 4,
            lost_packets: 5,
            rtt: Duration::from_micros(1234),
        };
        let frames = [
            Frame::Open {
                version: RELAY_VERSION,
                replica: "hub-1".into(),
                agent: 7,
                member: "edge-1".into(),
                not_after_unix: 1_900_000_000,
                serial: "0a1b".into(),
                enrollment_uid: Some("uid".into()),
                sample,
            },
            Frame::Stream { agent: 7 },
            Frame::Sample(sample),
            Frame::Ended {
                reason: "gone".into(),
            },
            Frame::Close {
                code: close_code::REVOKED,
                reason: "deleted".into(),
            },
        ];
        for frame in frames {
            let bytes = postcard::to_stdvec(&frame).unwrap();
            assert!(bytes.len() < MAX_FRAME, "{frame:?}");
            assert_eq!(postcard::from_bytes::<Frame>(&bytes).unwrap(), frame);
        }
    }

    #[tokio::test]
    async fn bad_frames_are_errors_and_the_end_is_none() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let frame = Frame::Stream { agent: 1 };
        write_frame(&mut a, &frame).await.unwrap();
        assert_eq!(read_frame(&mut b).await.unwrap(), Some(frame));
        // Oversized: refused before anything is allocated for it.
        a.write_all(&(MAX_FRAME as u32 + 1).to_be_bytes())
            .await
            .unwrap();
        assert!(read_frame(&mut b).await.unwrap_err().contains("over"));
        // Undecodable.
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&[0, 0, 0, 2, 0xff, 0xff]).await.unwrap();
        assert!(
            read_frame(&mut b)
                .await
                .unwrap_err()
                .contains("undecodable")
        );
        // Truncated, then the end.
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&[0, 0, 0, 9, 1]).await.unwrap();
        drop(a);
        assert!(read_frame(&mut b).await.unwrap_err().contains("truncated"));
        let (a, mut b) = tokio::io::duplex(1024);
        drop(a);
        assert_eq!(read_frame(&mut b).await.unwrap(), None);
    }

    #[test]
    fn the_relay_name_is_no_member_name() {
        assert!(!kedge_net::identity::is_valid_member_name(
            RELAY_COMMON_NAME
        ));
    }

    #[test]
    fn a_relay_has_room_for_every_session_the_active_replica_admits() {
        // 30,000 members over three replicas: one relay carries 20,000 agents after a
        // replica dies.
        for sessions in [1_024, 20_000, 30_064, 1_000_000] {
            assert_eq!(
                relay_streams(sessions).into_inner(),
                STREAMS_PER_AGENT * sessions as u64
            );
        }
        assert_eq!(relay_streams(usize::MAX), VarInt::MAX);
    }
}

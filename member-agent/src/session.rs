//! One session with the hub: connect, `Hello` → `Welcome`, heartbeats on their own stream,
//! desired state on the control stream, until the connection is lost or the agent stops.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use kedge_net::ops::Readiness;
use kedge_protocol::{
    AgentMessage, EnrollResponse, FramedStream, Heartbeat, Hello, HubMessage,
    PODMETRICS_PROTOCOL_VERSION, PROTOCOL_VERSION, RenewRequest, Welcome, close_code, unix_ms,
};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::executor::Executor;
use crate::identity::{ManagedIdentity, renewal_retry};
use crate::link::SessionLink;
use crate::metrics::AgentMetrics;
use crate::{Error, Result};

type Stream = FramedStream<RecvStream, SendStream, HubMessage, AgentMessage>;

/// How long the hub may take to complete the handshake or answer `Hello`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the TLS handshake with one of several hubs, or the first dial after a success,
/// may take. A dead or restarting hub's UDP port never answers (QUIC does not see ICMP
/// errors), and QUIC backs off its retransmissions of a lost first packet (1 s, 2 s, 4 s,
/// ...), so a short first timeout and a new attempt are what bring an agent back quickly
/// after a hub restart; a live hub completes the handshake in a round trip, and 3 s still
/// covers two retransmissions of a lost first packet.
const DIAL_TIMEOUT_WITH_ALTERNATIVES: Duration = Duration::from_secs(3);
/// With a single hub, the timeout after one failed dial (slow links get more time from then
/// on, up to [`HANDSHAKE_TIMEOUT`]).
const DIAL_TIMEOUT_SECOND: Duration = Duration::from_secs(6);

/// The shortest heartbeat interval the agent honours, whatever the hub asks.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);
/// The longest: the hub's own `--heartbeat-interval` maximum. A larger value from a peer
/// would overflow the heartbeat timer.
const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(600);

/// The heartbeat interval the hub asks for, within what the agent honours.
fn heartbeat_interval(asked_ms: u64) -> Duration {
    Duration::from_millis(asked_ms).clamp(MIN_HEARTBEAT_INTERVAL, MAX_HEARTBEAT_INTERVAL)
}

/// What every session needs.
#[derive(Debug, Clone)]
pub(crate) struct SessionParams {
    pub(crate) namespaces: Vec<String>,
    pub(crate) heartbeat_tolerance: u32,
    pub(crate) metrics: AgentMetrics,
    pub(crate) readiness: Readiness,
    pub(crate) executor: std::sync::Arc<Executor>,
    /// The enrolled identity to renew over the session; `None` with certificate files.
    pub(crate) identity: Option<std::sync::Arc<ManagedIdentity>>,
}

/// How a session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// The agent is shutting down.
    Shutdown,
    /// The connection was lost; `established` when a `Welcome` had been received,
    /// `going_away` when the hub closed it because it is shutting down, `again` when the hub
    /// asked for a new session at once ([`close_code::RECONNECT`]).
    Lost {
        reason: String,
        established: bool,
        going_away: bool,
        again: bool,
    },
}

pub(crate) async fn resolve(hub: &str) -> Result<SocketAddr> {
    let mut addrs = tokio::net::lookup_host(hub)
        .await
        .map_err(|e| Error::Resolve {
            hub: hub.to_owned(),
            reason: e.to_string(),
        })?;
    addrs.next().ok_or_else(|| Error::Resolve {
        hub: hub.to_owned(),
        reason: "no address".into(),
    })
}

fn endpoint_for(
    addr: SocketAddr,
    config: &quinn::ClientConfig,
    cached: &mut Option<quinn::Endpoint>,
) -> Result<quinn::Endpoint> {
    let same_family = |ep: &quinn::Endpoint| {
        ep.local_addr()
            .map(|local| local.is_ipv4() == addr.is_ipv4())
            .unwrap_or(false)
    };
    if let Some(ep) = cached.as_ref().filter(|ep| same_family(ep)) {
        return Ok(ep.clone());
    }
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .map_err(|_| Error::Endpoint(std::io::Error::other("unparseable bind address")))?;
    let mut endpoint = quinn::Endpoint::client(bind).map_err(Error::Endpoint)?;
    endpoint.set_default_client_config(config.clone());
    *cached = Some(endpoint.clone());
    Ok(endpoint)
}

/// One hub address to dial.
#[derive(Debug, Clone)]
pub(crate) struct Dial {
    /// HOST:PORT.
    pub(crate) hub: String,
    /// Name to verify in its certificate.
    pub(crate) server_name: String,
    /// Whether other addresses could be tried instead (a shorter handshake timeout).
    pub(crate) alternatives: bool,
    /// Dials that failed in a row before this one.
    pub(crate) failed_before: u32,
}

impl Dial {
    /// 3 s with alternatives; with a single hub 3 s, then 6 s, then 10 s after as many
    /// failed dials in a row.
    fn handshake_timeout(&self) -> Duration {
        match (self.alternatives, self.failed_before) {
            (true, _) | (false, 0) => DIAL_TIMEOUT_WITH_ALTERNATIVES,
            (false, 1) => DIAL_TIMEOUT_SECOND,
            (false, _) => HANDSHAKE_TIMEOUT,
        }
    }
}

/// Connects once and serves the session until it ends.
pub(crate) async fn connect_and_serve(
    dial: &Dial,
    config: &quinn::ClientConfig,
    params: &SessionParams,
    link: &mut SessionLink,
    endpoint: &mut Option<quinn::Endpoint>,
    shutdown: &CancellationToken,
) -> Result<SessionEnd> {
    let addr = resolve(&dial.hub).await?;
    let connecting = endpoint_for(addr, config, endpoint)?.connect_with(
        config.clone(),
        addr,
        &dial.server_name,
    )?;
    let connection = tokio::select! {
        _ = shutdown.cancelled() => return Ok(SessionEnd::Shutdown),
        connected = timeout(dial.handshake_timeout(), connecting) => match connected {
            Err(_) => {
                params.metrics.connect_result("timeout");
                return Err(Error::Timeout("the TLS handshake"));
            }
            Ok(Err(e)) => {
                params.metrics.connect_result("handshake_failed");
                return Err(e.into());
            }
            Ok(Ok(connection)) => connection,
        },
    };
    let span = info_span!("session", hub = %addr);
    let outcome = serve(connection, params, link, shutdown)
        .instrument(span)
        .await;
    params.metrics.connect_result(match &outcome {
        Ok(_) => "established",
        Err(Error::Refused { .. }) => "refused",
        Err(_) => "failed",
    });
    outcome
}

fn lost_reason(connection: &Connection, fallback: impl std::fmt::Display) -> String {
    match connection.close_reason() {
        Some(quinn::ConnectionError::ApplicationClosed(c)) => format!(
            "hub closed the connection ({}: {})",
            close_code::name(c.error_code.into_inner()),
            String::from_utf8_lossy(&c.reason)
        ),
        Some(other) => other.to_string(),
        None => fallback.to_string(),
    }
}

/// Whether the hub closed the connection because it is shutting down (a rollout or a
/// restart: its successor comes soon), rather than for something the agent did.
fn going_away(closed: Option<&quinn::ConnectionError>) -> bool {
    closed_with(closed, close_code::SHUTDOWN)
}

/// Whether the hub closed the connection with `code`.
fn closed_with(closed: Option<&quinn::ConnectionError>, code: u32) -> bool {
    matches!(closed, Some(quinn::ConnectionError::ApplicationClosed(c))
        if c.error_code.into_inner() == u64::from(code))
}

/// The member's Kubernetes version, or empty when its API server does not answer quickly.
async fn kubernetes_version(executor: &Executor) -> String {
    match timeout(
        Duration::from_secs(2),
        executor.client().apiserver_version(),
    )
    .await
    {
        Ok(Ok(info)) => info.git_version,
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the member's Kubernetes version");
            String::new()
        }
        Err(_) => String::new(),
    }
}

async fn handshake(connection: &Connection, params: &SessionParams) -> Result<(Stream, Welcome)> {
    let kubernetes_version = kubernetes_version(&params.executor).await;
    let (send, recv) = connection.open_bi().await?;
    let mut control = Stream::new(recv, send);
    control
        .send(&AgentMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            kubernetes_version,
            last_applied_revision: params.executor.last_applied_revision(),
            namespaces: params.namespaces.clone(),
        }))
        .await?;
    match timeout(HANDSHAKE_TIMEOUT, control.recv()).await {
        Err(_) => Err(Error::Timeout("Welcome")),
        Ok(Err(e)) => Err(e.into()),
        Ok(Ok(None)) => Err(Error::Stream(lost_reason(
            connection,
            "hub closed the control stream before Welcome",
        ))),
        Ok(Ok(Some(HubMessage::Welcome(welcome)))) => Ok((control, welcome)),
        Ok(Ok(Some(HubMessage::Refused(refusal)))) => {
            connection.close(VarInt::from_u32(close_code::REFUSED), b"refusal received");
            Err(Error::Refused {
                code: refusal.code,
                message: refusal.message,
            })
        }
        Ok(Ok(Some(_))) => Err(Error::Unexpected("expected Welcome or Refused")),
    }
}

async fn serve(
    connection: Connection,
    params: &SessionParams,
    link: &mut SessionLink,
    shutdown: &CancellationToken,
) -> Result<SessionEnd> {
    let (mut control, welcome) = handshake(&connection, params).await?;
    link.session_started(welcome.protocol_version);
    let interval = heartbeat_interval(welcome.heartbeat_interval_ms);
    info!(session_id = %welcome.session_id, member = %welcome.member, hub_version = %welcome.hub_version,
        heartbeat = ?interval, "session established");
    params.readiness.set(true);
    params.metrics.connected.set(1);

    let (send, recv) = connection.open_bi().await?;
    let mut heartbeats = tokio::spawn(
        heartbeat_loop(
            Stream::new(recv, send),
            interval,
            params.heartbeat_tolerance,
            connection.clone(),
            params.metrics.clone(),
        )
        .in_current_span(),
    );
    // The hub ends a session by closing the connection with a code, which may arrive a
    // packet after one of its streams ended: waited for briefly, so that a hub going away
    // (SHUTDOWN) is known as such and not taken for a lost link, which backs off.
    let lost = |reason: String| {
        let connection = &connection;
        async move {
            let closed =
                kedge_net::tls::close_reason_within(connection, kedge_net::tls::CLOSE_GRACE).await;
            Ok(SessionEnd::Lost {
                reason,
                established: true,
                going_away: going_away(closed.as_ref()),
                again: closed_with(closed.as_ref(), close_code::RECONNECT),
            })
        }
    };
    let mut renewal = Renewal::new(params, welcome.protocol_version);
    loop {
        tokio::select! {
            // Heartbeats before control: when both end, the heartbeat reason is the real one.
            biased;
            _ = shutdown.cancelled() => {
                connection.close(VarInt::from_u32(close_code::SHUTDOWN), b"agent shutting down");
                heartbeats.abort();
                return Ok(SessionEnd::Shutdown);
            }
            reason = &mut heartbeats => {
                return lost(reason.unwrap_or_else(|e| format!("heartbeat task failed: {e}"))).await;
            }
            _ = tokio::time::sleep_until(renewal.due), if renewal.identity.is_some() => {
                if let Some(request) = renewal.request()
                    && let Err(e) = control.send(&request).await
                {
                    heartbeats.abort();
                    return lost(lost_reason(&connection, e)).await;
                }
            }

            Some(outgoing) = link.outbox.recv() => {
                if !sendable(&outgoing, welcome.protocol_version) {
                    continue;
                }
                if let Err(e) = control.send(&outgoing).await {
                    heartbeats.abort();
                    return lost(lost_reason(&connection, e)).await;
                }
            }
            message = control.recv() => match message {
                Ok(Some(HubMessage::DesiredState(state))) => {
                    debug!(revision = state.revision, workloads = state.workloads.len(),
                        create_jobs = state.create_jobs.len(), delete_jobs = state.delete_jobs.len(),
                        "desired state received");
                    params.metrics.desired_state(state.revision);
                    link.desired.send_replace(Some(std::sync::Arc::new(state)));
                }
                Ok(Some(HubMessage::Renewed(answer))) => renewal.answered(answer).await,
                Ok(Some(HubMessage::Scrape(targets)))
                    if welcome.protocol_version >= PODMETRICS_PROTOCOL_VERSION =>
                {
                    debug!(targets = targets.targets.len(), "scrape targets received");
                    link.scrape(targets);
                }
                Ok(Some(HubMessage::Scrape(_))) => {
                    let reason = "hub sent scrape targets on a session older than pod metrics";
                    connection.close(VarInt::from_u32(close_code::PROTOCOL_ERROR), reason.as_bytes());
                    heartbeats.abort();
                    return lost(reason.to_owned()).await;
                }
                Ok(Some(_)) => {
                    let reason = "hub sent a handshake message mid-session";
                    connection.close(VarInt::from_u32(close_code::PROTOCOL_ERROR), reason.as_bytes());
                    heartbeats.abort();
                    return lost(reason.to_owned()).await;
                }
                Ok(None) => {
                    heartbeats.abort();
                    return lost(lost_reason(&connection, "hub finished the control stream")).await;
                }
                // The heartbeat task closed the connection: its reason is the real one.
                Err(_) if heartbeats.is_finished() => {
                    return lost((&mut heartbeats).await.unwrap_or_else(|e| format!("heartbeat task failed: {e}"))).await;
                }
                Err(e) => {
                    heartbeats.abort();
                    if connection.close_reason().is_none() {
                        warn!(error = %e, "bad frame from hub; closing");
                        connection.close(VarInt::from_u32(close_code::PROTOCOL_ERROR), e.to_string().as_bytes());
                    }
                    return lost(lost_reason(&connection, e)).await;
                }
            },
        }
    }
}

/// Whether `message` may go on a session of `protocol_version`: pod metrics only from
/// [`PODMETRICS_PROTOCOL_VERSION`] on (an older hub would close the session on them). The
/// scrape loop may still hold samples of an earlier session's targets; they stop here.
fn sendable(message: &AgentMessage, protocol_version: u16) -> bool {
    !matches!(message, AgentMessage::PodMetrics(_))
        || protocol_version >= PODMETRICS_PROTOCOL_VERSION
}

/// Certificate renewal over the session: a request at two thirds of the certificate's
/// lifetime with a new key pair, retried while the hub refuses or does not answer.
struct Renewal {
    identity: Option<std::sync::Arc<ManagedIdentity>>,
    due: Instant,
    /// The key of the request in flight.
    pending_key: Option<String>,
}

/// How long to wait for the hub's answer to a renewal request before asking again.
const RENEWAL_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

impl Renewal {
    fn new(params: &SessionParams, protocol_version: u16) -> Self {
        // A hub older than renewal would close the session on an unknown message.
        let identity = params
            .identity
            .clone()
            .filter(|_| protocol_version >= kedge_protocol::RENEWAL_PROTOCOL_VERSION);
        let due = identity
            .as_ref()
            .map_or_else(Instant::now, |identity| due_for(identity));
        Self {
            identity,
            due,
            pending_key: None,
        }
    }

    /// A renewal request with a fresh key pair (remembered for the answer).
    fn request(&mut self) -> Option<AgentMessage> {
        let identity = self.identity.as_ref()?;
        self.due = Instant::now() + RENEWAL_ANSWER_TIMEOUT;
        match identity.renewal_csr() {
            Ok((key, csr_der)) => {
                info!("renewing the client certificate");
                self.pending_key = Some(key);
                Some(AgentMessage::Renew(RenewRequest { csr_der }))
            }
            Err(error) => {
                warn!(%error, "cannot create a certificate signing request");
                None
            }
        }
    }

    async fn answered(&mut self, answer: EnrollResponse) {
        let Some(identity) = self.identity.clone() else {
            return;
        };
        let retry = |identity: &ManagedIdentity| {
            Instant::now()
                + renewal_retry(identity.current().validity, time::OffsetDateTime::now_utc())
        };
        match (answer, self.pending_key.take()) {
            (EnrollResponse::Issued(issued), Some(key)) => {
                match identity.renewed(issued, key).await {
                    Ok(renewed) => {
                        info!(not_after = %renewed.validity.not_after, "client certificate renewed and stored");
                        self.due = due_for(&identity);
                    }
                    Err(error) => {
                        warn!(%error, "cannot keep the renewed certificate; retrying");
                        self.due = retry(&identity);
                    }
                }
            }
            (EnrollResponse::Issued(_), None) => {
                warn!("the hub sent a certificate nobody asked for; ignoring it");
            }
            (EnrollResponse::Refused(refusal), _) => {
                warn!(reason = refusal.code.as_str(), message = %refusal.message,
                    "the hub refused to renew the client certificate; retrying");
                self.due = retry(&identity);
            }
        }
    }
}

/// When the current certificate of `identity` is due for renewal, on the monotonic clock.
fn due_for(identity: &ManagedIdentity) -> Instant {
    let validity = identity.current().validity;
    let delay = kedge_net::pki::renewal_delay(
        validity.not_before,
        validity.not_after,
        time::OffsetDateTime::now_utc(),
    );
    // The stored certificate is input: a far-future expiry must not overflow the timer.
    Instant::now() + delay.min(MAX_RENEWAL_DELAY)
}

/// The longest the agent waits before renewing, whatever the certificate says.
const MAX_RENEWAL_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long the hub may leave heartbeats unanswered on a connection with round-trip time
/// `rtt`: `tolerance` intervals, plus QUIC's recovery of a packet lost three times in a row
/// once each way (the heartbeat, then its answer), so that a slow, lossy link is not taken for
/// a lost hub.
fn answer_deadline(interval: Duration, tolerance: u32, rtt: Duration) -> Duration {
    interval
        .saturating_mul(tolerance)
        .saturating_add(kedge_net::tls::loss_recovery(rtt).saturating_mul(2))
}

/// Sends a heartbeat every `interval` and closes the connection when the hub answers none
/// within [`answer_deadline`]. Returns why it stopped.
async fn heartbeat_loop(
    mut stream: Stream,
    interval: Duration,
    tolerance: u32,
    connection: Connection,
    metrics: AgentMetrics,
) -> String {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_answer = Instant::now();
    let mut in_flight: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let deadline = answer_deadline(interval, tolerance, connection.rtt());
                if last_answer.elapsed() > deadline {
                    let reason = format!("hub answered no heartbeat for {deadline:?}");
                    connection.close(VarInt::from_u32(close_code::HEARTBEAT_TIMEOUT), reason.as_bytes());
                    return reason;
                }
                seq += 1;
                let beat = AgentMessage::Heartbeat(Heartbeat { seq, sent_unix_ms: unix_ms(SystemTime::now()) });
                if let Err(e) = stream.send(&beat).await {
                    return lost_reason(&connection, e);
                }
                in_flight.push_back((seq, Instant::now()));
                // Answers older than the tolerance no longer matter for RTT.
                while in_flight.len() > tolerance as usize + 1 {
                    in_flight.pop_front();
                }
            }
            answer = stream.recv() => match answer {
                Ok(Some(HubMessage::HeartbeatAck(ack))) => {
                    last_answer = Instant::now();
                    if let Some(&(_, sent)) = in_flight.iter().find(|(s, _)| *s == ack.seq) {
                        metrics.heartbeat_rtt_ms.set(sent.elapsed().as_millis() as i64);
                    }
                    in_flight.retain(|(s, _)| *s > ack.seq);
                }
                Ok(Some(_)) => {
                    let reason = "hub sent a non-heartbeat message on the heartbeat stream";
                    connection.close(VarInt::from_u32(close_code::PROTOCOL_ERROR), reason.as_bytes());
                    return reason.to_owned();
                }
                Ok(None) => return lost_reason(&connection, "hub finished the heartbeat stream"),
                Err(e) => return lost_reason(&connection, e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_single_hub_gets_a_short_first_dial_and_more_time_after_failures() {
        let dial = |alternatives, failed_before| {
            super::Dial {
                hub: "hub:7443".into(),
                server_name: "hub".into(),
                alternatives,
                failed_before,
            }
            .handshake_timeout()
            .as_secs()
        };
        assert_eq!(
            [
                dial(false, 0),
                dial(false, 1),
                dial(false, 2),
                dial(false, 9)
            ],
            [3, 6, 10, 10]
        );
        assert_eq!([dial(true, 0), dial(true, 5)], [3, 3]);
    }

    use super::*;

    #[test]
    fn a_heartbeat_interval_from_the_hub_is_clamped() {
        assert_eq!(heartbeat_interval(0), MIN_HEARTBEAT_INTERVAL);
        assert_eq!(heartbeat_interval(5_000), Duration::from_secs(5));
        assert_eq!(heartbeat_interval(u64::MAX), MAX_HEARTBEAT_INTERVAL);
        // The timer and the deadline stay computable with the largest value.
        let start = tokio::time::Instant::now();
        assert!(
            start
                .checked_add(heartbeat_interval(u64::MAX) * 100)
                .is_some()
        );
    }

    #[test]
    fn a_slow_link_gives_the_hub_time_to_recover_lost_heartbeats_both_ways() {
        let s = Duration::from_secs;
        // Loopback: the tolerance and 2 x 175 ms of acknowledgement delay.
        assert_eq!(
            answer_deadline(s(1), 3, Duration::ZERO),
            Duration::from_millis(3_350)
        );
        // 600 ms round trip: 2 x 7 probe timeouts of 1.225 s.
        assert_eq!(
            answer_deadline(s(1), 3, Duration::from_millis(600)),
            Duration::from_millis(20_150)
        );
        // Absurd values saturate instead of overflowing.
        assert_eq!(answer_deadline(Duration::MAX, 100, s(1)), Duration::MAX);
    }

    #[test]
    fn only_a_hub_shutting_down_is_going_away() {
        let closed = |code: u32| {
            quinn::ConnectionError::ApplicationClosed(quinn::ApplicationClose {
                error_code: VarInt::from_u32(code),
                reason: Default::default(),
            })
        };
        assert!(going_away(Some(&closed(close_code::SHUTDOWN))));
        assert!(closed_with(
            Some(&closed(close_code::RECONNECT)),
            close_code::RECONNECT
        ));
        assert!(!going_away(Some(&closed(close_code::RECONNECT))));
        for other in [
            close_code::REPLACED,
            close_code::REVOKED,
            close_code::HEARTBEAT_TIMEOUT,
        ] {
            assert!(!going_away(Some(&closed(other))), "{other}");
        }
        assert!(!going_away(Some(&quinn::ConnectionError::TimedOut)));
        assert!(!going_away(Some(&quinn::ConnectionError::Reset)));
        assert!(!going_away(None));
    }

    #[test]
    fn pod_metrics_go_only_on_sessions_that_speak_them() {
        let metrics = AgentMessage::PodMetrics(kedge_protocol::PodMetricsReport::default());
        let heartbeat = AgentMessage::Heartbeat(Heartbeat {
            seq: 1,
            sent_unix_ms: 0,
        });
        assert!(sendable(&metrics, PODMETRICS_PROTOCOL_VERSION));
        assert!(!sendable(&metrics, PODMETRICS_PROTOCOL_VERSION - 1));
        assert!(sendable(&heartbeat, PODMETRICS_PROTOCOL_VERSION - 1));
    }
}

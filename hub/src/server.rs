//! The QUIC server: accepts agent connections, authenticates them by certificate, runs the
//! `Hello`/`Welcome` handshake and keeps each session's heartbeat state in the registry.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kedge_net::identity::{PeerIdentity, connection_identity};
use kedge_net::telemetry::AUDIT;
use kedge_net::tls::{handshake_failure_reason, negotiated_alpn};
use kedge_protocol::{
    AgentMessage, EnrollRefusal, EnrollRefusalCode, EnrollResponse, FramedStream, HeartbeatAck,
    Hello, HubMessage, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, Refusal, RefusalCode, Welcome,
    close_code, is_supported_version,
};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::admission::{Admission, Enrolled, Verdict};
use crate::budget::{Admitted, Budget, HandshakeLimits, HandshakePermit, LogThrottle};
use crate::enroll::{EnrollDeadlines, Enroller, serve_enrollment};
use crate::fleet::Fleet;
use crate::lease::Role;
use crate::metrics::HubMetrics;
use crate::registry::{NewSession, SessionRegistry};

type Control = FramedStream<RecvStream, SendStream, AgentMessage, HubMessage>;

/// Timeouts and limits of the QUIC server.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Established sessions beyond which new ones are refused (`--max-connections`).
    pub max_connections: usize,
    /// Handshakes (TLS and `Hello`) in progress beyond which new connections are refused
    /// (`--max-handshakes`); they never count against `max_connections`.
    pub max_handshakes: usize,
    /// Handshakes in progress from one source address (`--max-handshakes-per-source`).
    pub max_handshakes_per_source: usize,
    /// Of `max_handshakes`, the permits only sources that held a session lately may take
    /// (`--handshake-reserve`).
    pub handshake_reserve: usize,
    /// Time allowed for what a peer does before it proves an identity: the TLS handshake
    /// and, on an enrollment connection, its request (`--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// Time allowed between a verified TLS handshake and the agent's `Hello` (and its
    /// heartbeat stream); also for a whole enrollment exchange.
    pub hello_timeout: Duration,
    /// Time allowed for one message to an agent to be taken by its stream: an agent that
    /// stops reading is closed after this, instead of holding its session's task.
    pub send_timeout: Duration,
}

/// Default `--max-handshakes`: a fleet of `--max-connections` agents reconnecting at once
/// (jittered) gets through in a few rounds, while unfinished handshakes hold at most this
/// many for at most the handshake and `Hello` timeouts.
pub const DEFAULT_MAX_HANDSHAKES: u32 = 256;
/// Default `--max-handshakes-per-source`: room for several agents behind one NAT address,
/// while one address alone takes at most this share of `--max-handshakes`.
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: u32 = 16;
/// Default `--handshake-timeout`: a TLS handshake takes a few round trips after address
/// validation; this leaves room for several lost packets on a slow link, while a peer that
/// stalls holds its permit at most this long (and less when newer attempts need it).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_handshakes: DEFAULT_MAX_HANDSHAKES as usize,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE as usize,
            handshake_reserve: crate::budget::default_reserve(DEFAULT_MAX_HANDSHAKES as usize),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            hello_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(30),
        }
    }
}

/// How long a reconnecting member waits for its previous session to release its place when
/// the session budget is full.
const REPLACE_WAIT: Duration = Duration::from_secs(2);

/// Reports a session may send in a burst before it is slowed down.
const REPORT_BURST: u32 = 20;
/// Reports per second a session may send on average (agents send at most one per report
/// interval, plus one per desired-state change).
const REPORT_RATE: u32 = 10;

/// Renewals a session may ask for in a burst, and per second after it (an agent renews once
/// per two thirds of a certificate lifetime; retries after a refusal are spaced out).
const RENEW_BURST: u32 = 3;
/// See [`RENEW_BURST`].
const RENEW_RATE: u32 = 1;

/// A token bucket: `take` returns how long to wait when the bucket is empty.
#[derive(Debug)]
struct RateLimit {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: Instant,
}

impl RateLimit {
    fn new(burst: u32, per_second: u32) -> Self {
        Self {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_second: f64::from(per_second.max(1)),
            last: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> Option<Duration> {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.per_second))
    }
}

/// Everything a connection handler needs.
#[derive(Debug)]
pub struct ServerContext {
    /// The session registry.
    pub registry: Arc<SessionRegistry>,
    /// Desired state to stream, reports and acks to record.
    pub fleet: Arc<Fleet>,
    /// Metrics.
    pub metrics: HubMetrics,
    /// Limits.
    pub limits: ServerLimits,
    /// Handshake and session budgets.
    pub budget: Budget,
    /// Thins out audit lines of attempts refused before any handshake work.
    floods: LogThrottle,
    /// Distinguishes session ids of this hub process.
    pub boot_id: u64,
    session_counter: AtomicU64,
    /// Whether this hub holds the lease; a standby refuses sessions.
    role: watch::Receiver<Role>,
    /// Which members may hold a session.
    pub admission: Arc<Admission>,
    /// Issues member certificates (CA-Secret mode); `None` with certificates from files.
    enroller: Option<Arc<Enroller>>,
}

impl ServerContext {
    /// A context for one hub process.
    pub fn new(fleet: Arc<Fleet>, metrics: HubMetrics, limits: ServerLimits) -> Self {
        let registry = fleet.registry().clone();
        let boot_id = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        Self {
            registry,
            fleet,
            metrics,
            limits,
            budget: Budget::new(
                HandshakeLimits {
                    max: limits.max_handshakes,
                    per_source: limits.max_handshakes_per_source,
                    // The flags are validated (HubArgs::limits); a struct built in code with a
                    // smaller budget than the default reserve still leaves strangers one.
                    reserved: limits
                        .handshake_reserve
                        .min(limits.max_handshakes.saturating_sub(1)),
                    evict_after: crate::budget::EVICT_AFTER,
                },
                limits.max_connections,
            ),
            floods: LogThrottle::new(Duration::from_secs(1)),
            boot_id,
            session_counter: AtomicU64::new(0),
            role: watch::channel(Role::ALONE).1,
            admission: Arc::new(Admission::new(Enrolled::Anyone)),
            enroller: None,
        }
    }

    /// Admits only the members `admission` admits (default: every certificate the CA
    /// signed, for a hub without a hub cluster).
    pub fn with_admission(mut self, admission: Arc<Admission>) -> Self {
        self.admission = admission;
        self
    }

    /// Serves enrollment (ALPN `kedge-enroll/1`) and renewal with `enroller`.
    pub fn with_enroller(mut self, enroller: Arc<Enroller>) -> Self {
        self.enroller = Some(enroller);
        self
    }

    /// Accepts sessions only while `role` is [`Role::Leader`] and not overdue (default: always).
    pub fn with_role(mut self, role: watch::Receiver<Role>) -> Self {
        self.role = role;
        self
    }

    fn next_session_id(&self) -> String {
        let n = self.session_counter.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{:012x}-{n}", self.boot_id & 0xffff_ffff_ffff)
    }
}

/// Accepts connections until `shutdown` is cancelled, then closes the endpoint.
pub async fn serve(
    endpoint: quinn::Endpoint,
    ctx: Arc<ServerContext>,
    shutdown: CancellationToken,
) {
    loop {
        let incoming = tokio::select! {
            _ = shutdown.cancelled() => break,
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => break,
            },
        };
        let Some(permit) = admit(&incoming, &ctx) else {
            turn_away(incoming, &ctx);
            continue;
        };
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            handle_incoming(incoming, permit, &ctx, shutdown).await;
        });
    }
    endpoint.close(VarInt::from_u32(close_code::SHUTDOWN), b"hub shutting down");
    // Give agents a moment to learn of the close instead of timing out.
    let _ = timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
}

/// Decides on a connection attempt before the hub does any handshake work for it. A source
/// that has not proven it receives at its address gets a QUIC Retry (stateless: a spoofed
/// source never answers it, so it costs the hub one packet); a validated one needs a
/// handshake permit (see [`crate::budget`]), which may evict a stale unproven handshake.
/// `None` when the attempt was answered here.
fn admit(incoming: &quinn::Incoming, ctx: &ServerContext) -> Option<HandshakePermit> {
    let remote = incoming.remote_address();
    if !incoming.remote_address_validated() {
        return None;
    }
    match ctx.budget.handshake(remote.ip(), Instant::now()) {
        Ok(admitted) => {
            log_evictions(ctx, remote, &admitted);
            Some(admitted.permit)
        }
        Err(refused) => {
            let reason = refused.label();
            ctx.metrics.handshake_failed(reason);
            if let Some(suppressed) = ctx.floods.admit(reason, Instant::now()) {
                warn!(target: AUDIT, %remote, reason, limit = %refused, suppressed,
                    "TLS handshake refused");
            }
            None
        }
    }
}

/// One audit line a second for stale handshakes closed to admit a newer one.
fn log_evictions(ctx: &ServerContext, remote: SocketAddr, admitted: &Admitted) {
    if let Some(victim) = admitted.evicted.first() {
        let evicted = admitted.evicted.len();
        if let Some(suppressed) = ctx.floods.admit("evicting", Instant::now()) {
            warn!(target: AUDIT, %remote, %victim, evicted, suppressed,
                "closing stale unauthenticated connections to admit a newer one");
        }
    }
}

/// Answers an attempt [`admit`] did not let through: a Retry to an unvalidated source, a
/// refusal otherwise.
fn turn_away(incoming: quinn::Incoming, ctx: &ServerContext) {
    let remote = incoming.remote_address();
    if incoming.remote_address_validated() {
        incoming.refuse();
        return;
    }
    match incoming.retry() {
        Ok(()) => {
            ctx.metrics.retry_sent();
            debug!(%remote, "address not validated yet; sent a Retry");
        }
        Err(e) => {
            ctx.metrics.handshake_failed("retry_failed");
            if let Some(suppressed) = ctx.floods.admit("retry_failed", Instant::now()) {
                warn!(target: AUDIT, %remote, reason = "retry_failed", error = %e, suppressed,
                    "TLS handshake refused");
            }
            e.into_incoming().ignore();
        }
    }
}

async fn handle_incoming(
    incoming: quinn::Incoming,
    handshake: HandshakePermit,
    ctx: &ServerContext,
    shutdown: CancellationToken,
) {
    let remote = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        // The first flight already failed (e.g. no common ALPN).
        Err(e) => {
            let reason = handshake_failure_reason(&e);
            warn!(target: AUDIT, %remote, reason, error = %clean_error(&e), "TLS handshake refused");
            ctx.metrics.handshake_failed(reason);
            return;
        }
    };
    // One deadline for everything before the peer proves an identity: TLS, and the
    // enrollment request on an enrollment connection.
    let unproven_until = Instant::now() + ctx.limits.handshake_timeout;
    let evicted = handshake.evicted();
    let connection = tokio::select! {
        _ = evicted.cancelled() => Err(Unproven::Evicted),
        finished = tokio::time::timeout_at(unproven_until, connecting) => match finished {
            Err(_) => Err(Unproven::TimedOut),
            Ok(result) => Ok(result),
        },
    };
    let connection = match connection {
        Err(why) => {
            // Dropping the handshake closes it. A flood of these is one line a second.
            let reason = why.label();
            ctx.metrics.handshake_failed(reason);
            if let Some(suppressed) = ctx.floods.admit(reason, Instant::now()) {
                warn!(target: AUDIT, %remote, reason, suppressed, "TLS handshake refused: {why}");
            }
            return;
        }
        Ok(Err(e)) => {
            let reason = handshake_failure_reason(&e);
            warn!(target: AUDIT, %remote, reason, error = %clean_error(&e), "TLS handshake refused");
            ctx.metrics.handshake_failed(reason);
            return;
        }
        Ok(Ok(connection)) => connection,
    };
    if let Some(enroller) = &ctx.enroller
        && negotiated_alpn(&connection).as_deref() == Some(kedge_protocol::ENROLL_ALPN)
    {
        // The TLS work is done: the connection leaves the handshake budget for the
        // enrollment budget (see crate::budget), still unauthenticated, evictable, and with
        // its request due by the same deadline.
        let enrollment = match ctx.budget.enrollment(remote.ip(), Instant::now()) {
            Ok(admitted) => {
                log_evictions(ctx, remote, &admitted);
                admitted.permit
            }
            Err(refused) => {
                let reason = refused.label();
                ctx.metrics.handshake_failed(reason);
                if let Some(suppressed) = ctx.floods.admit(reason, Instant::now()) {
                    warn!(target: AUDIT, %remote, reason, limit = %refused, suppressed,
                        "enrollment refused");
                }
                connection.close(
                    VarInt::from_u32(close_code::REFUSED),
                    refused.to_string().as_bytes(),
                );
                return;
            }
        };
        drop(handshake);
        let deadlines = EnrollDeadlines {
            request: unproven_until,
            exchange: ctx.limits.hello_timeout,
        };
        let evicted = enrollment.evicted();
        let served = serve_enrollment(connection, enroller, remote, deadlines, evicted).await;
        drop(enrollment);
        if let Err(why) = served {
            let reason = why.label();
            ctx.metrics.handshake_failed(reason);
            if let Some(suppressed) = ctx.floods.admit(reason, Instant::now()) {
                warn!(target: AUDIT, %remote, reason, suppressed, "enrollment refused: {why}");
            }
        }
        return;
    }
    if !require_client_certificate(&connection, ctx, remote) {
        return;
    }
    // A verified certificate: a member, no longer a stranger to make room for.
    handshake.proven();
    let identity = match connection_identity(&connection) {
        Ok(identity) => identity,
        Err(e) => {
            warn!(target: AUDIT, %remote, reason = "bad_identity", error = %e,
                "session refused: no valid member identity");
            ctx.metrics.session_refused("bad_identity");
            connection.close(
                VarInt::from_u32(close_code::BAD_IDENTITY),
                e.to_string().as_bytes(),
            );
            return;
        }
    };
    let span = info_span!("session", member = %identity.member, %remote);
    Session {
        ctx,
        connection,
        identity,
        remote,
        shutdown,
        handshake: Some(handshake),
    }
    .run()
    .instrument(span)
    .await;
}

/// Why a handshake ended before the peer proved an identity.
#[derive(Debug, Clone, Copy, thiserror::Error)]
enum Unproven {
    /// Past `--handshake-timeout`.
    #[error("timed out")]
    TimedOut,
    /// Closed to admit a newer attempt.
    #[error("evicted for a newer attempt")]
    Evicted,
}

impl Unproven {
    fn label(self) -> &'static str {
        match self {
            Self::TimedOut => "timed_out",
            Self::Evicted => "evicted",
        }
    }
}

/// A session (ALPN `kedge/1`) needs a verified client certificate. The TLS layer may admit a
/// connection without one, for enrollment on the same port; it is refused here.
fn require_client_certificate(
    connection: &Connection,
    ctx: &ServerContext,
    remote: SocketAddr,
) -> bool {
    if connection.peer_identity().is_some() {
        return true;
    }
    warn!(%remote, reason = "no_client_certificate", "session refused: no client certificate");
    ctx.metrics.session_refused("no_client_certificate");
    connection.close(
        VarInt::from_u32(close_code::BAD_IDENTITY),
        b"a client certificate is required for kedge/1; enroll with a bootstrap token first",
    );
    false
}

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

struct Session<'a> {
    ctx: &'a ServerContext,
    connection: Connection,
    identity: PeerIdentity,
    remote: SocketAddr,
    shutdown: CancellationToken,
    /// Held until the `Hello` is in.
    handshake: Option<HandshakePermit>,
}

/// A connection error as text safe to log: a peer's close reason is its own bytes.
fn clean_error(error: &quinn::ConnectionError) -> String {
    kedge_protocol::clean_text(&error.to_string(), kedge_protocol::MAX_MESSAGE_BYTES)
}

fn frame_error_label(error: &kedge_protocol::Error) -> &'static str {
    match error {
        kedge_protocol::Error::FrameTooLarge { .. } => "oversized",
        kedge_protocol::Error::Decode(_) => "undecodable",
        kedge_protocol::Error::TrailingBytes(_) => "trailing_bytes",
        kedge_protocol::Error::Truncated => "truncated",
        kedge_protocol::Error::Encode(_) | kedge_protocol::Error::Io(_) => "io",
    }
}

/// The reason the connection already closed, if it did; the agent's own words cleaned.
fn closed_reason(connection: &Connection) -> Option<String> {
    connection.close_reason().map(|e| match e {
        quinn::ConnectionError::ApplicationClosed(c) => format!(
            "agent closed the connection ({}: {})",
            close_code::name(c.error_code.into_inner()),
            kedge_protocol::clean_text(
                &String::from_utf8_lossy(&c.reason),
                kedge_protocol::MAX_MESSAGE_BYTES
            )
        ),
        other => clean_error(&other),
    })
}

/// Sends one message, unless the peer does not take it within `limit`. `Err(None)` when the
/// time ran out (the peer stopped reading), `Err(Some(_))` when the stream failed.
async fn send_within<R, W>(
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
fn stalled(connection: &Connection, metrics: &HubMetrics, limit: Duration, stream: &str) -> String {
    if let Some(reason) = closed_reason(connection) {
        return reason;
    }
    let reason = format!("the agent took no data on its {stream} stream for {limit:?}");
    warn!(target: AUDIT, reason = "stalled", %reason, "closing session: agent stopped reading");
    metrics.session_refused("stalled");
    connection.close(
        VarInt::from_u32(close_code::PROTOCOL_ERROR),
        reason.as_bytes(),
    );
    reason
}

/// Handles a stream error: a closed connection ends quietly; bad bytes close it loudly.
/// Returns why the session ends.
fn stream_failed(
    connection: &Connection,
    metrics: &HubMetrics,
    error: &kedge_protocol::Error,
    stream: &str,
) -> String {
    if let Some(reason) = closed_reason(connection) {
        return reason;
    }
    let label = frame_error_label(error);
    warn!(target: AUDIT, stream, reason = label, error = %error, "closing session: bad frame from agent");
    metrics.frame_rejected(label);
    let reason = format!("bad frame on {stream} stream: {error}");
    connection.close(
        VarInt::from_u32(close_code::PROTOCOL_ERROR),
        reason.as_bytes(),
    );
    reason
}

impl Session<'_> {
    fn close(&self, code: u32, reason: &str) {
        self.connection
            .close(VarInt::from_u32(code), reason.as_bytes());
    }

    fn stream_failed(&self, error: &kedge_protocol::Error, stream: &str) -> String {
        stream_failed(&self.connection, &self.ctx.metrics, error, stream)
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
                None => stalled(&self.connection, &self.ctx.metrics, limit, name),
            })
    }

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
            let _ = timeout(Duration::from_secs(2), self.connection.closed()).await;
        }
        self.close(close_code::REFUSED, &message);
    }

    async fn handshake(&self) -> Option<(Control, Hello)> {
        let limit = self.ctx.limits.hello_timeout;
        // One deadline for the stream and the Hello: a peer trickling both gets no more.
        let deadline = Instant::now() + limit;
        let (send, recv) = match tokio::time::timeout_at(deadline, self.connection.accept_bi())
            .await
        {
            Ok(Ok(streams)) => streams,
            Ok(Err(e)) => {
                debug!(error = %clean_error(&e), "connection ended before the control stream opened");
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
    async fn admit_session(&self, control: &mut Control) -> Option<OwnedSemaphorePermit> {
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

    async fn run(mut self) {
        let Some((mut control, hello)) = self.handshake().await else {
            return;
        };
        // The handshake is over: its permit goes back before the session takes one.
        self.handshake.take();
        // After the Hello, so the agent reads a reason and moves on to its next hub address.
        let refusal = self.ctx.role.borrow().refusal();
        if let Some(message) = refusal {
            self.refuse(&mut control, RefusalCode::Unavailable, message)
                .await;
            return;
        }
        let member = self.identity.member.clone();
        let cert_uid = self.identity.enrollment_uid.as_deref();
        match self.ctx.admission.verdict(&member, cert_uid) {
            Verdict::Admit => {}
            Verdict::NotYet(message) => {
                self.refuse(&mut control, RefusalCode::Unavailable, message)
                    .await;
                return;
            }
            Verdict::Refuse { label, message } => {
                self.refuse_as(&mut control, RefusalCode::Revoked, label, message)
                    .await;
                return;
            }
        }
        let duplicate = self
            .ctx
            .registry
            .duplicate(&member, self.remote, Instant::now());
        if let Some(message) = duplicate {
            self.ctx.fleet.notify(&member);
            self.refuse_as(
                &mut control,
                RefusalCode::Revoked,
                "duplicate_identity",
                message,
            )
            .await;
            return;
        }
        // Last, so that a member refused above never takes (or frees) a session's place.
        let Some(_session) = self.admit_session(&mut control).await else {
            return;
        };
        let session_id = self.ctx.next_session_id();
        let registry = &self.ctx.registry;
        let ended = registry.register(
            NewSession {
                member: member.clone(),
                session_id: session_id.clone(),
                remote_addr: self.remote,
                agent_version: hello.agent_version.clone(),
                kubernetes_version: hello.kubernetes_version.clone(),
                protocol_version: hello.protocol_version,
                cert_not_after_unix: self.identity.not_after_unix,
                enrollment_uid: self.identity.enrollment_uid.clone(),
            },
            Instant::now(),
            SystemTime::now(),
        );
        // Its address may now use the handshake reserve (see crate::budget).
        self.ctx.budget.remember(self.remote.ip(), Instant::now());
        let in_sync =
            self.ctx
                .fleet
                .session_started(&member, &session_id, hello.last_applied_revision);
        self.ctx.fleet.notify(&member);
        let interval = registry.liveness().interval;
        let welcome = HubMessage::Welcome(Welcome {
            protocol_version: hello.protocol_version,
            hub_version: env!("CARGO_PKG_VERSION").to_owned(),
            session_id: session_id.clone(),
            member: member.clone(),
            heartbeat_interval_ms: interval.as_millis() as u64,
        });
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
        registry.disconnected(&member, &session_id, &reason);
        self.ctx.budget.remember(self.remote.ip(), Instant::now());
        self.ctx.fleet.notify(&member);
        info!(%session_id, %reason, "session ended");
    }

    /// Serves an established session. `holds`: the revision the agent already holds (see
    /// [`Fleet::session_started`]); the session's first desired state is not sent when it is
    /// that revision.
    async fn serve(
        &self,
        control: &mut Control,
        ended: &CancellationToken,
        session_id: &str,
        holds: Option<u64>,
        protocol_version: u16,
    ) -> String {
        let mut first_state = true;
        let mut heartbeats: Option<tokio::task::JoinHandle<()>> = None;
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
        let mut reports = RateLimit::new(REPORT_BURST, REPORT_RATE);
        let mut renewals = RateLimit::new(RENEW_BURST, RENEW_RATE);
        let mut cert_expiry = cert_deadline(
            self.identity.not_after_unix.saturating_mul(1000),
            SystemTime::now(),
            Instant::now(),
        );
        let reason = loop {
            tokio::select! {
                _ = tokio::time::sleep_until(cert_expiry) => {
                    warn!(target: "kedge::audit", %member, reason = "cert_expired",
                        "closing session: its client certificate expired without renewal");
                    self.ctx.metrics.session_refused("cert_expired");
                    self.close(close_code::CERT_EXPIRED, "client certificate expired without renewal");
                    break "client certificate expired".to_owned();
                }

                changed = desired.changed() => {
                    if changed.is_err() {
                        break "desired state channel closed".to_owned();
                    }
                    let Some(state) = desired.borrow_and_update().clone() else {
                        continue;
                    };
                    if std::mem::take(&mut first_state) {
                        let in_sync = holds == Some(state.revision);
                        self.ctx.metrics.resync(in_sync);
                        if in_sync {
                            debug!(revision = state.revision, "the agent holds this desired state already; not sent again");
                            continue;
                        }
                    }
                    debug!(revision = state.revision, workloads = state.workloads.len(), "sending desired state");
                    let message = HubMessage::DesiredState((*state).clone());
                    if let Err(reason) = self.send(control, &message, "control").await {
                        break reason;
                    }
                }
                changed = scrapes.changed(), if pod_metrics => {
                    if changed.is_err() {
                        break "scrape target channel closed".to_owned();
                    }
                    let targets = scrapes.borrow_and_update().clone();
                    debug!(targets = targets.targets.len(), "sending pod-metrics scrape targets");
                    if let Err(reason) = self.send(control, &HubMessage::Scrape((*targets).clone()), "control").await {
                        break reason;
                    }
                }
                _ = ended.cancelled() => {
                    if let Some(why) = self.ctx.registry.ending(member, session_id) {
                        self.close(close_code::REVOKED, &why);
                        break format!("revoked: {why}");
                    }
                    self.close(close_code::REPLACED, "replaced by a newer session of the same member");
                    break "replaced by a newer session".to_owned();
                }
                _ = self.shutdown.cancelled() => {
                    self.close(close_code::SHUTDOWN, "hub shutting down");
                    break "hub shutting down".to_owned();
                }
                streams = self.connection.accept_bi(), if heartbeats.is_none() => match streams {
                    Ok((send, recv)) => heartbeats = Some(self.spawn_heartbeats(send, recv, session_id)),
                    Err(e) => break closed_reason(&self.connection).unwrap_or_else(|| clean_error(&e)),
                },
                message = control.recv() => match message.map(|m| m.map(AgentMessage::sanitized)) {
                    Ok(Some(AgentMessage::Ack(ack))) => {
                        self.ctx.metrics.message_received("ack");
                        debug!(revision = ack.revision, results = ack.results.len(), "ack");
                        self.ctx.fleet.record_ack(member, ack);
                    }
                    Ok(Some(AgentMessage::Report(report))) => {
                        self.ctx.metrics.message_received("report");
                        debug!(full = report.full, workloads = report.workloads.len(),
                            jobs = report.jobs.len(), "status report");
                        // A flooding agent is slowed down, not dropped: while this session
                        // waits, QUIC flow control holds the agent's further reports back.
                        if let Some(wait) = reports.take(Instant::now()) {
                            self.ctx.metrics.report_throttled();
                            debug!(?wait, "report rate exceeded; reading the next one later");
                            tokio::time::sleep(wait).await;
                        }
                        let recorded = self.ctx.fleet.record_report(member, session_id, report);
                        if recorded.unsolicited > 0 || recorded.over_limit > 0 {
                            warn!(unsolicited = recorded.unsolicited, over_limit = recorded.over_limit,
                                "dropped report entries the hub did not ask for");
                            self.ctx.metrics.report_entries_dropped("unsolicited", recorded.unsolicited as u64);
                            self.ctx.metrics.report_entries_dropped("over_limit", recorded.over_limit as u64);
                        }
                    }
                    Ok(Some(AgentMessage::PodMetrics(report))) => {
                        self.ctx.metrics.message_received("pod_metrics");
                        // Samples come at most once per target and polling interval; one
                        // flooding agent is slowed down like its reports.
                        if let Some(wait) = reports.take(Instant::now()) {
                            self.ctx.metrics.report_throttled();
                            tokio::time::sleep(wait).await;
                        }
                        let recorded = self.ctx.fleet.pod_metrics().record(member, report, Instant::now());
                        self.ctx.metrics.pod_metric_samples("accepted", recorded.accepted);
                        self.ctx.metrics.pod_metric_samples("unsolicited", recorded.unsolicited);
                        if recorded.unsolicited > 0 {
                            debug!(unsolicited = recorded.unsolicited, "dropped pod-metrics samples for triggers this member was not given");
                        }
                    }
                    Ok(Some(AgentMessage::Renew(request))) => {
                        self.ctx.metrics.message_received("renew");
                        if let Some(wait) = renewals.take(Instant::now()) {
                            tokio::time::sleep(wait).await;
                        }
                        let answer = self.renew(&request.csr_der).await;
                        if let EnrollResponse::Issued(issued) = &answer {
                            cert_expiry = cert_deadline(issued.not_after_unix_ms, SystemTime::now(), Instant::now());
                            self.ctx.registry.certificate_renewed(member, session_id, issued.not_after_unix_ms / 1000);
                        }
                        if let Err(e) = control.send(&HubMessage::Renewed(answer)).await {
                            break self.stream_failed(&e, "control");
                        }
                    }
                    Ok(Some(other)) => {
                        let kind = match other {
                            AgentMessage::Hello(_) => "Hello",
                            _ => "Heartbeat",
                        };
                        let reason = format!("unexpected {kind} on the control stream");
                        warn!(target: AUDIT, reason = "unexpected_message", detail = %reason, "closing session");
                        self.ctx.metrics.frame_rejected("unexpected_message");
                        self.close(close_code::PROTOCOL_ERROR, &reason);
                        break reason;
                    }
                    Ok(None) => {
                        self.close(close_code::SHUTDOWN, "control stream finished");
                        break "agent finished the control stream".to_owned();
                    }
                    Err(e) => break self.stream_failed(&e, "control"),
                },
            }
        };
        if let Some(task) = heartbeats {
            task.abort();
        }
        reason
    }

    /// A new certificate for this session's member, from a CSR sent over the session.
    async fn renew(&self, csr_der: &[u8]) -> EnrollResponse {
        match &self.ctx.enroller {
            Some(enroller) => {
                let member = &self.identity.member;
                let uid = self
                    .connection
                    .peer_identity()
                    .and_then(|any| {
                        any.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
                            .ok()
                    })
                    .and_then(|chain| {
                        chain
                            .first()
                            .and_then(|leaf| crate::enroll::enrollment_uid(leaf.as_ref(), member))
                    });
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

    fn spawn_heartbeats(
        &self,
        send: SendStream,
        recv: RecvStream,
        session_id: &str,
    ) -> tokio::task::JoinHandle<()> {
        let mut stream: Control = FramedStream::new(recv, send);
        let connection = self.connection.clone();
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
                            registry.heartbeat(
                                &member,
                                &session_id,
                                Instant::now(),
                                SystemTime::now(),
                            );
                            let ack = HubMessage::HeartbeatAck(HeartbeatAck { seq: beat.seq });
                            match send_within(&mut stream, &ack, send_timeout).await {
                                Ok(()) => {}
                                Err(Some(_)) => return,
                                Err(None) => {
                                    stalled(&connection, &metrics, send_timeout, "heartbeat");
                                    return;
                                }
                            }
                        }
                        Ok(Some(_)) => {
                            warn!(target: AUDIT, reason = "unexpected_message", "closing session: non-heartbeat message on the heartbeat stream");
                            metrics.frame_rejected("unexpected_message");
                            connection.close(
                                VarInt::from_u32(close_code::PROTOCOL_ERROR),
                                b"only heartbeats belong on the heartbeat stream",
                            );
                            return;
                        }
                        Ok(None) => return,
                        Err(e) => {
                            stream_failed(&connection, &metrics, &e, "heartbeat");
                            return;
                        }
                    }
                }
            }
            .in_current_span(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_report_rate_limit_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut limit = RateLimit::new(3, 10);
        for _ in 0..3 {
            assert_eq!(limit.take(start), None);
        }
        let wait = limit.take(start).expect("over the burst");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // After waiting, the next one is due again at the rate.
        let later = start + Duration::from_millis(200);
        assert_eq!(limit.take(later), None);
    }
}

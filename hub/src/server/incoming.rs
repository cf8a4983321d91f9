//! A connection from its first packet to a member identity: admission before any handshake
//! work (Retry, handshake permits), the TLS handshake under its deadline, enrollment
//! connections, and the client certificate a session needs.

use std::net::SocketAddr;
use std::sync::Arc;

use kedge_net::identity::{PeerIdentity, connection_identity};
use kedge_net::telemetry::AUDIT;
use kedge_net::tls::{handshake_failure_reason, negotiated_alpn};
use kedge_protocol::close_code;
use quinn::{Connection, VarInt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use super::peer::{Peer, clean_error};
use super::session::Session;
use super::{ServerContext, relay};
use crate::budget::{Admitted, HandshakePermit};
use crate::enroll::{EnrollDeadlines, Enroller, serve_enrollment};

/// Decides on a connection attempt before the hub does any handshake work for it. A source
/// that has not proven it receives at its address gets a QUIC Retry (stateless: a spoofed
/// source never answers it, so it costs the hub one packet); a validated one needs a
/// handshake permit (see [`crate::budget`]), which may evict a stale unproven handshake.
/// `None` when the attempt was answered here.
pub(super) fn admit(incoming: &quinn::Incoming, ctx: &ServerContext) -> Option<HandshakePermit> {
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
pub(super) fn turn_away(incoming: quinn::Incoming, ctx: &ServerContext) {
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

/// Takes a connection the accept loop let through from its first packet to a member
/// identity, then runs its session (or serves its enrollment, or another replica's relay,
/// or relays the session). An `async` block rather than an `async fn`, whose future would
/// keep its arguments twice for the session's life.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
pub(super) fn handle_incoming(
    incoming: quinn::Incoming,
    handshake: HandshakePermit,
    ctx: &Arc<ServerContext>,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> {
    async move {
        let remote = incoming.remote_address();
        let Some((connection, unproven_until)) = finish_tls(incoming, &handshake, ctx).await else {
            return;
        };
        if let Some(enroller) = &ctx.enroller
            && negotiated_alpn(&connection).as_deref() == Some(kedge_protocol::ENROLL_ALPN)
        {
            // Boxed: enrollment calls the API server; its future would otherwise size every
            // session's task, enrolling or not.
            Box::pin(enroll(
                connection,
                handshake,
                enroller,
                ctx,
                remote,
                unproven_until,
            ))
            .await;
            return;
        }
        if !require_client_certificate(&connection, ctx, remote) {
            return;
        }
        // A verified certificate: a member, no longer a stranger to make room for.
        handshake.proven();
        if relay::is_relay(&connection) {
            drop(handshake);
            // Boxed, as the relays below: a session's task need not carry them.
            Box::pin(serve_relay(connection, ctx, shutdown)).await;
            return;
        }
        let Some(identity) = member_identity(&connection, ctx, remote) else {
            return;
        };
        let span = info_span!("session", member = %identity.member, %remote);
        if ctx.relay.is_some() && ctx.role.borrow().relay().is_some() {
            // The handshake is over here; the active replica reads the Hello. A permit held
            // for the relayed session's life would refuse every handshake beyond
            // --max-handshakes-per-source.
            drop(handshake);
            Box::pin(relayed(&connection, &identity, ctx, &shutdown))
                .instrument(span)
                .await;
            return;
        }
        Session {
            ctx,
            peer: Peer::Direct(connection),
            identity,
            remote,
            shutdown,
            handshake: Some(handshake),
        }
        .run()
        .instrument(span)
        .await;
    }
}

/// Another replica's relay (`--sharding`): served while this replica is active, closed
/// otherwise (the replica learns the active one from the Lease and dials it instead).
async fn serve_relay(
    connection: Connection,
    ctx: &Arc<ServerContext>,
    shutdown: CancellationToken,
) {
    if ctx.relay.is_none() || !ctx.role.borrow().is_leader() {
        warn!(remote = %connection.remote_address(), "refusing a relay: this hub replica is not the active one");
        connection.close(
            VarInt::from_u32(close_code::REFUSED),
            b"this hub replica is not active; relay to the Lease holder",
        );
        return;
    }
    relay::serve_relay(connection, ctx.clone(), shutdown).await;
}

/// Relays the session of `identity` to the active replica (`--sharding`, this replica not
/// active). Without a relay to it or room here, the agent's connection is closed with the
/// retryable `SHUTDOWN`, and it tries its next hub address.
async fn relayed(
    connection: &Connection,
    identity: &PeerIdentity,
    ctx: &ServerContext,
    shutdown: &CancellationToken,
) {
    let refuse = |why: &str| {
        warn!(
            reason = why,
            "cannot relay the session to the active hub replica; closing it"
        );
        connection.close(VarInt::from_u32(close_code::SHUTDOWN), why.as_bytes());
    };
    let Some(client) = &ctx.relay else {
        return refuse("this hub replica does not relay");
    };
    let Ok(_place) = ctx.budget.session() else {
        return refuse("this hub replica holds --max-connections sessions; try another");
    };
    // Its address may now use the handshake reserve, as a session's here (see crate::budget).
    let remote = connection.remote_address().ip();
    ctx.budget.remember(remote, Instant::now());
    ctx.metrics.relayed_session("relaying", 1);
    let forwarded = client
        .forward(connection.clone(), identity, ctx.role.clone(), shutdown)
        .await;
    ctx.metrics.relayed_session("relaying", -1);
    ctx.budget.remember(remote, Instant::now());
    if let Err(error) = forwarded {
        refuse(&format!("no relay to the active hub replica: {error}"));
    }
}

/// The TLS handshake, unless it fails, times out or is evicted for a newer attempt: the
/// connection and the deadline of everything before the peer proves an identity.
async fn finish_tls(
    incoming: quinn::Incoming,
    handshake: &HandshakePermit,
    ctx: &ServerContext,
) -> Option<(Connection, Instant)> {
    let remote = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        // The first flight already failed (e.g. no common ALPN).
        Err(e) => {
            let reason = handshake_failure_reason(&e);
            warn!(target: AUDIT, %remote, reason, error = %clean_error(&e), "TLS handshake refused");
            ctx.metrics.handshake_failed(reason);
            return None;
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
    match connection {
        Err(why) => {
            // Dropping the handshake closes it. A flood of these is one line a second.
            let reason = why.label();
            ctx.metrics.handshake_failed(reason);
            if let Some(suppressed) = ctx.floods.admit(reason, Instant::now()) {
                warn!(target: AUDIT, %remote, reason, suppressed, "TLS handshake refused: {why}");
            }
            None
        }
        Ok(Err(e)) => {
            let reason = handshake_failure_reason(&e);
            warn!(target: AUDIT, %remote, reason, error = %clean_error(&e), "TLS handshake refused");
            ctx.metrics.handshake_failed(reason);
            None
        }
        Ok(Ok(connection)) => Some((connection, unproven_until)),
    }
}

/// Serves an enrollment connection (ALPN `kedge-enroll/1`). The TLS work is done: the
/// connection leaves the handshake budget for the enrollment budget (see crate::budget),
/// still unauthenticated, evictable, and with its request due by `unproven_until`.
async fn enroll(
    connection: Connection,
    handshake: HandshakePermit,
    enroller: &Arc<Enroller>,
    ctx: &ServerContext,
    remote: SocketAddr,
    unproven_until: Instant,
) {
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
}

/// The member identity in a verified certificate, or the connection closed with
/// `BAD_IDENTITY`.
fn member_identity(
    connection: &Connection,
    ctx: &ServerContext,
    remote: SocketAddr,
) -> Option<PeerIdentity> {
    match connection_identity(connection) {
        Ok(identity) => Some(identity),
        Err(e) => {
            warn!(target: AUDIT, %remote, reason = "bad_identity", error = %e,
                "session refused: no valid member identity");
            ctx.metrics.session_refused("bad_identity");
            connection.close(
                VarInt::from_u32(close_code::BAD_IDENTITY),
                e.to_string().as_bytes(),
            );
            None
        }
    }
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

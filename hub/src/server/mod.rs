//! The QUIC server: accepts agent connections, authenticates them by certificate, runs the
//! `Hello`/`Welcome` handshake and keeps each session's heartbeat state in the registry.
//!
//! This file holds the limits, the context and the accept loop; `incoming` takes a
//! connection from its first packet to a member identity (or an enrollment), `handshake`
//! from the `Hello` to a session's place, `session` runs an established session and
//! `heartbeats` its heartbeat stream; `streams` says why a stream or connection ended.

mod handshake;
mod heartbeats;
mod incoming;
mod peer;
mod rate;
mod relay;
mod session;
mod streams;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kedge_protocol::{AgentMessage, FramedStream, HubMessage, close_code};
use quinn::{RecvStream, SendStream, VarInt};
use tokio::sync::watch;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, Enrolled};
use crate::budget::{Budget, HandshakeLimits, LogThrottle};
use crate::enroll::Enroller;
use crate::fleet::Fleet;
use crate::lease::Role;
use crate::metrics::HubMetrics;
use crate::registry::SessionRegistry;

use self::incoming::{admit, handle_incoming, turn_away};
pub use self::relay::{RELAY_COMMON_NAME, RelayClient};

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
    /// With `--sharding`: relays the sessions of this replica's agents while another one is
    /// active.
    relay: Option<Arc<RelayClient>>,
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
            relay: None,
        }
    }

    /// Shards sessions (`--sharding`): while another replica is active, relays every session
    /// to it with `relay`; while active, serves the relays of the other replicas.
    pub fn with_relay(mut self, relay: Arc<RelayClient>) -> Self {
        self.relay = Some(relay);
        self
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

#[cfg(test)]
mod tests {
    use super::heartbeats::Heartbeats;
    use super::incoming::handle_incoming;
    use super::session::Session;
    use crate::budget::HandshakePermit;

    /// Bytes of the future `f` returns, without calling it.
    fn output_size<A, Fut>(_: impl FnOnce(A) -> Fut) -> usize {
        size_of::<Fut>()
    }

    fn output_size4<A, B, C, D, Fut>(_: impl FnOnce(A, B, C, D) -> Fut) -> usize {
        size_of::<Fut>()
    }

    /// Every connected member holds one session task (the future of `handle_incoming`) and
    /// one heartbeat task for its whole life; a rare, large future inlined in them (an API
    /// call for a renewal or an enrollment) would cost each member its size. The bounds are
    /// for debug builds, whose futures are larger than release builds' (docs/scale.md).
    #[test]
    fn the_tasks_every_member_holds_stay_small() {
        let session = output_size4::<
            quinn::Incoming,
            HandshakePermit,
            &'static std::sync::Arc<super::ServerContext>,
            tokio_util::sync::CancellationToken,
            _,
        >(handle_incoming);
        let run = output_size::<Session<'static>, _>(Session::run);
        let heartbeats = output_size::<Heartbeats, _>(Heartbeats::serve);
        eprintln!(
            "futures: session task {session} B, Session::run {run} B, heartbeats {heartbeats} B"
        );
        assert!(session < 3072, "session task future: {session} B");
        assert!(run < 2048, "session future: {run} B");
        assert!(heartbeats < 1536, "heartbeat task future: {heartbeats} B");
    }
}

//! The kedge wire protocol between the hub and its member agents.
//!
//! The agent dials the hub over QUIC (ALPN [`ALPN`]) with mutual TLS. Each QUIC stream carries
//! length-prefixed frames; each frame is one postcard-encoded message: [`AgentMessage`] from
//! agent to hub, [`HubMessage`] from hub to agent. Kubernetes objects travel as JSON bytes
//! inside a frame because postcard is not self-describing.
//!
//! Streams (all opened by the agent, so that nothing depends on the hub reaching the member):
//! - the **control** stream: `Hello` → `Welcome`/`Refused`, then desired state (hub → agent),
//!   acknowledgements and status reports (agent → hub);
//! - the **heartbeat** stream: `Heartbeat` → `HeartbeatAck`, so that liveness never waits
//!   behind bulk desired-state or report traffic (QUIC streams have independent flow control).
//!
//! This crate does no I/O of its own: [`FramedStream`] runs over any `AsyncRead`/`AsyncWrite`
//! pair, such as a quinn stream.

mod codec;
mod enroll;
mod error;
mod message;
mod podmetrics;
mod report;
mod sanitize;

pub use codec::{FramedStream, decode, encode};
pub use enroll::*;
pub use error::{Error, Result};
pub use message::*;
pub use podmetrics::*;
pub use report::bounded_text;
pub use sanitize::{MAX_MESSAGE_BYTES, MAX_REF_BYTES, clean_text, is_dns1123_label};

/// The protocol version this build speaks. Bumped on any incompatible message change.
pub const PROTOCOL_VERSION: u16 = 5;

/// The first protocol version with certificate renewal on the control stream
/// ([`AgentMessage::Renew`]).
pub const RENEWAL_PROTOCOL_VERSION: u16 = 4;

/// The first protocol version with pod metrics ([`HubMessage::Scrape`],
/// [`AgentMessage::PodMetrics`]). Neither side sends them on an older session.
pub const PODMETRICS_PROTOCOL_VERSION: u16 = 5;

/// The oldest protocol version this build still accepts from a peer.
pub const MIN_PROTOCOL_VERSION: u16 = 3;

/// QUIC/TLS application protocol name.
pub const ALPN: &[u8] = b"kedge/1";

/// ALPN of enrollment connections: server-authenticated only, one [`EnrollRequest`] →
/// [`EnrollResponse`] exchange on one stream, then closed.
pub const ENROLL_ALPN: &[u8] = b"kedge-enroll/1";

/// Default UDP port the hub listens on.
pub const DEFAULT_PORT: u16 = 7443;

/// Largest frame (postcard payload, excluding the length prefix) either side accepts or sends.
///
/// Large enough for a full desired state of several thousand workloads and Job manifests;
/// small enough that a hostile peer cannot make the other side buffer much.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Bidirectional streams an agent opens per session: the control stream and the heartbeat
/// stream. The hub grants exactly this many (a further stream gets no credit) and opens none.
pub const SESSION_STREAMS: u32 = 2;

/// Longest string read from a member cluster (a name, reason or condition type) that goes
/// on the wire; longer ones are cut ([`bounded_text`]). Valid Kubernetes names fit.
pub const MAX_TEXT_BYTES: usize = 256;

/// Most distinct sets of `True` pod conditions reported per Job
/// ([`JobStatus::true_pod_conditions`]); a Job's pods pass through a few states each.
pub const MAX_POD_CONDITION_SETS: usize = 16;

/// Most condition types in one [`PodConditionSet`]; Kubernetes defines six pod condition
/// types, readiness gates add the rest.
pub const MAX_POD_CONDITION_TYPES: usize = 16;

/// Unix milliseconds of `t` as they travel on the wire (0 before the epoch, saturating).
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether a peer speaking `version` can be served by this build.
pub fn is_supported_version(version: u16) -> bool {
    (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version)
}

/// QUIC application close codes, so that each side can log why the other closed.
pub mod close_code {
    /// Normal shutdown (process stopping).
    pub const SHUTDOWN: u32 = 0;
    /// The peer sent an oversized, undecodable or out-of-order frame.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// The session was refused (see the `Refused` message sent before closing).
    pub const REFUSED: u32 = 2;
    /// A newer session of the same member replaced this one.
    pub const REPLACED: u32 = 3;
    /// The member was deleted or its certificate revoked.
    pub const REVOKED: u32 = 4;
    /// The peer certificate does not carry a valid member identity.
    pub const BAD_IDENTITY: u32 = 5;
    /// The peer stopped answering heartbeats.
    pub const HEARTBEAT_TIMEOUT: u32 = 6;
    /// The session's client certificate expired without renewal.
    pub const CERT_EXPIRED: u32 = 7;
    /// This hub replica is alive but the session must start over (the active replica of a
    /// sharded hub changed): dial the same address again at once.
    pub const RECONNECT: u32 = 8;

    /// A short name for a close code, for logs.
    pub fn name(code: u64) -> &'static str {
        match code {
            0 => "shutdown",
            1 => "protocol_error",
            2 => "refused",
            3 => "replaced",
            4 => "revoked",
            5 => "bad_identity",
            6 => "heartbeat_timeout",
            7 => "cert_expired",
            8 => "reconnect",
            _ => "unknown",
        }
    }
}

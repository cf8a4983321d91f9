//! QUIC endpoint configuration: TLS 1.3 only, ALPN `kedge/1`, client certificates required
//! and chained to the hub CA, the ring crypto provider passed explicitly.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Error, Result};

/// PEM material of one endpoint: its certificate chain, key, and the CA bundle it trusts.
#[derive(Debug)]
pub struct TlsMaterial {
    /// Own certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Own private key.
    pub key: PrivateKeyDer<'static>,
    /// CA certificates the peer must chain to.
    pub trusted: Vec<CertificateDer<'static>>,
}

impl TlsMaterial {
    /// Loads certificate, key and CA bundle from PEM files.
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<Self> {
        Ok(Self {
            chain: load_certs(cert)?,
            key: load_key(key)?,
            trusted: load_certs(ca)?,
        })
    }

    /// Builds material from in-memory PEM strings (certificates from a Secret, tests).
    pub fn from_pem(cert: &str, key: &str, ca: &str) -> Result<Self> {
        let certs = |pem: &str, what: &str| -> Result<Vec<CertificateDer<'static>>> {
            let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem_error(what, e.to_string()))?;
            if certs.is_empty() {
                return Err(pem_error(what, "no CERTIFICATE block".into()));
            }
            Ok(certs)
        };
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|e| pem_error("private key", e.to_string()))?;
        Ok(Self {
            chain: certs(cert, "certificate")?,
            key,
            trusted: certs(ca, "CA bundle")?,
        })
    }

    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        for cert in &self.trusted {
            roots.add(cert.clone())?;
        }
        Ok(roots)
    }
}

fn pem_error(what: &str, reason: String) -> Error {
    Error::Pem {
        path: what.into(),
        reason,
    }
}

/// Reads every certificate of a PEM file; an empty file is an error.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.into(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            path: path.into(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            path: path.into(),
            reason: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.into(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| Error::Pem {
        path: path.into(),
        reason: format!("no private key: {e}"),
    })
}

/// ring's provider, preferring `TLS_AES_128_GCM_SHA256` (rustls' own order puts
/// `TLS_AES_256_GCM_SHA384` first). Every session's key exchange (X25519) and certificates
/// (ECDSA P-256) give 128-bit security, so AES-256 adds none; AES-128 and SHA-256 are the
/// cheaper cipher and key schedule, and 10,000 agents reconnecting to a restarted hub do
/// 10,000 key schedules on each side at once (SHA-384's blocks were 3.4% of the new hub's
/// CPU; docs/scale.md, fifth round). A client's order decides (rustls' servers follow it),
/// so an agent built before this keeps AES-256 and still connects.
fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// A server certificate verifier for peers whose certificates carry no identity worth
/// checking: pods' metrics endpoints, which serve self-signed certificates (the agent
/// reaches a pod at the address its own API server gave it), and KEDA's `unsafeSsl` in
/// kedge-sim. Any certificate is accepted; the handshake signatures are still verified with
/// the provider's algorithms, so the peer holds the key of the certificate it presents and
/// the session is encrypted to it.
#[derive(Debug)]
pub struct AnyServerCertificate {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl AnyServerCertificate {
    /// The verifier, checking signatures with `provider`'s algorithms.
    pub fn new(provider: &CryptoProvider) -> Self {
        Self {
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl rustls::client::danger::ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Liveness settings of the QUIC transport.
#[derive(Debug, Clone, Copy)]
pub struct TransportTuning {
    /// QUIC keep-alive PING interval: a PING goes out when nothing was sent or received for
    /// this long (keeps NAT bindings open). `None`: never.
    pub keep_alive: Option<Duration>,
    /// Connection is dropped after this long without any packet (QUIC takes the smaller of
    /// both ends' values). `None`: this end sets no limit.
    pub idle_timeout: Option<Duration>,
}

impl Default for TransportTuning {
    /// Short-lived connections (enrollment, tests): a PING every 5 s, idle for 30 s at most.
    fn default() -> Self {
        Self {
            keep_alive: Some(Duration::from_secs(5)),
            idle_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// How long an agent's connection may stay silent before it keeps its NAT binding open with a
/// PING: shorter than the UDP binding timeouts of common NATs and CGNATs (30 s and more,
/// RFC 4787 asks for 2 min). Heartbeats at least this frequent reset it, so it costs nothing
/// at the usual intervals.
pub const AGENT_KEEP_ALIVE: Duration = Duration::from_secs(25);

/// The shortest idle timeout a hub sets, whatever its heartbeats.
pub const HUB_IDLE_TIMEOUT_MIN: Duration = Duration::from_secs(30);

impl TransportTuning {
    /// An agent's session: the heartbeats drive the connection (the hub says how often, after
    /// the handshake), a PING only when they are sparser than [`AGENT_KEEP_ALIVE`]; the idle
    /// limit is the hub's.
    pub fn agent() -> Self {
        Self {
            keep_alive: Some(AGENT_KEEP_ALIVE),
            idle_timeout: None,
        }
    }

    /// The hub's sessions, whose agents must heartbeat within `liveness_deadline`: no PINGs of
    /// its own (each would cost a packet and an acknowledgement per member), and an idle
    /// timeout of twice that deadline (at least [`HUB_IDLE_TIMEOUT_MIN`]), so that QUIC never
    /// drops a connection the heartbeat rule still counts as live.
    pub fn hub(liveness_deadline: Duration) -> Self {
        Self {
            keep_alive: None,
            idle_timeout: Some(
                liveness_deadline
                    .saturating_mul(2)
                    .max(HUB_IDLE_TIMEOUT_MIN),
            ),
        }
    }
}

/// The ACK delay quinn advertises and waits at most before acknowledging (its default,
/// RFC 9000's 25 ms).
const MAX_ACK_DELAY: Duration = Duration::from_millis(25);

/// Losses in a row of one packet that [`loss_recovery`] allows for.
pub const LOSSES_IN_A_ROW: u32 = 3;

/// How long QUIC may take to deliver a packet lost [`LOSSES_IN_A_ROW`] times in a row on a
/// path whose smoothed round-trip time is `rtt`: the sender resends after a probe timeout
/// (RFC 9002: srtt + 4·rttvar + max_ack_delay), doubled after each loss, so three losses
/// take 1 + 2 + 4 = 7 probe timeouts. quinn does not expose rttvar; it is taken as srtt/4,
/// the variation of a link whose round trip swings by about half of itself. Liveness
/// deadlines add this to the heartbeat tolerance, so that a lossy, slow link is not taken
/// for a dead one: 0.2 s on loopback, 8.6 s at 600 ms.
pub fn loss_recovery(rtt: Duration) -> Duration {
    let probe_timeout = rtt.saturating_mul(2).saturating_add(MAX_ACK_DELAY);
    probe_timeout.saturating_mul((1 << LOSSES_IN_A_ROW) - 1)
}

/// Bytes one stream may receive ahead of the reader: a quarter of a maximal frame. The frame
/// codec buffers the frame it is reading itself, so this only bounds what waits inside quinn;
/// a maximal (4 MiB) frame still crosses in four window updates, well under a second at
/// 10 MiB/s per 100 ms of round trip.
pub const STREAM_RECEIVE_WINDOW: u32 = (kedge_protocol::MAX_FRAME_BYTES / 4) as u32;

/// Bytes a whole connection may receive ahead of the reader: a full window on each of the
/// session's streams, so a control stream the hub is not draining (a throttled report) never
/// blocks the heartbeat stream.
pub const RECEIVE_WINDOW: u32 = STREAM_RECEIVE_WINDOW * kedge_protocol::SESSION_STREAMS;

/// Unacknowledged bytes buffered for sending per connection: what the peer's receive window
/// can take; buffering more only holds memory for a peer that reads slowly.
pub const SEND_WINDOW: u64 = RECEIVE_WINDOW as u64;

/// Which end a transport configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The hub: accepts the agent's streams.
    Server,
    /// The agent: opens every stream, accepts none.
    Client,
}

fn transport(tuning: TransportTuning, side: Side) -> Arc<quinn::TransportConfig> {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(tuning.keep_alive);
    // Durations beyond the QUIC varint range are clamped rather than rejected.
    let idle = tuning.idle_timeout.map(|idle| {
        quinn::IdleTimeout::try_from(idle)
            .unwrap_or_else(|_| quinn::IdleTimeout::from(quinn::VarInt::MAX))
    });
    transport.max_idle_timeout(idle);
    // No path MTU discovery: every packet stays within QUIC's 1,200 bytes, which crosses any
    // path. Its probes (full-size packets both ways after each handshake, and again every
    // ten minutes on a path narrower than 1,452 bytes) cost a metered link more than larger
    // packets would save on messages that are mostly a few dozen bytes.
    transport.mtu_discovery_config(None);
    // Only the streams the protocol uses: the agent opens the control and heartbeat streams,
    // a third gets no credit; the hub opens none, so the agent grants it none. Nothing uses
    // unidirectional streams or datagrams, so a peer can open neither.
    let accepted = match side {
        Side::Server => kedge_protocol::SESSION_STREAMS,
        Side::Client => 0,
    };
    transport.max_concurrent_bidi_streams(accepted.into());
    transport.max_concurrent_uni_streams(0u32.into());
    transport.datagram_receive_buffer_size(None);
    // Bounded flow control (quinn's default connection window is unlimited): what a peer can
    // make this side buffer is at most RECEIVE_WINDOW in quinn plus one frame per stream in
    // the codec, whatever it sends.
    transport.stream_receive_window(STREAM_RECEIVE_WINDOW.into());
    transport.receive_window(RECEIVE_WINDOW.into());
    transport.send_window(SEND_WINDOW);
    // The hub sends one datagram per system call. With segmentation offload quinn reserves
    // room for ten datagrams (12 KiB) in a connection's transmit buffer the first time it
    // sends two at once, and keeps it for the connection's life: on a hub, thousands of
    // buffers for what is mostly one small datagram per message (docs/scale.md).
    if side == Side::Server {
        transport.enable_segmentation_offload(false);
    }
    Arc::new(transport)
}

/// Most connection attempts quinn holds before the hub decides on them (quinn's default is
/// 65,536). The hub decides on each at once (Retry, refuse or accept), so this is only a
/// backstop against a burst arriving faster than the accept loop runs.
pub const MAX_INCOMING: usize = 4096;

/// Bytes quinn buffers per undecided connection attempt beyond its first packet (quinn's
/// default is 10 MiB, meant for 0-RTT data, which the hub does not accept): a client's second
/// Initial flight fits.
pub const INCOMING_BUFFER_BYTES: u64 = 64 * 1024;

/// Bytes quinn buffers for all undecided connection attempts together (quinn's default is
/// 100 MiB).
pub const INCOMING_BUFFER_TOTAL_BYTES: u64 = 8 * 1024 * 1024;

/// Bounds what connection attempts can make the hub's endpoint hold before it decides on
/// them.
fn limit_incoming(config: &mut quinn::ServerConfig) {
    config
        .max_incoming(MAX_INCOMING)
        .incoming_buffer_size(INCOMING_BUFFER_BYTES)
        .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL_BYTES);
}

/// Server configuration for the hub: requires a client certificate chained to `material.trusted`.
/// Its address tokens are derived from `material`'s key (see [`AddressTokens`]).
pub fn server_config(
    material: TlsMaterial,
    tuning: TransportTuning,
) -> Result<quinn::ServerConfig> {
    let tokens = AddressTokens::of(&material);
    hub_server_config(material, tuning, false, &tokens)
}

/// [`server_config`] with `tokens` (derived from `material`'s key or another secret the hub
/// keeps), whose session tickets the caller counts.
pub fn server_config_with(
    material: TlsMaterial,
    tuning: TransportTuning,
    tokens: &AddressTokens,
) -> Result<quinn::ServerConfig> {
    hub_server_config(material, tuning, false, tokens)
}

/// Client configuration for the agent: verifies the hub against `material.trusted` and presents
/// `material.chain`. `alpn` is overridable only so that tests can offer a wrong one.
pub fn client_config(
    material: TlsMaterial,
    tuning: TransportTuning,
    alpn: &[u8],
) -> Result<quinn::ClientConfig> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(material.roots()?)
        .with_client_auth_cert(material.chain, material.key)?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    let quic = QuicClientConfig::try_from(tls).map_err(|e| Error::NoQuicSuite(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport(tuning, Side::Client));
    // The hub's address tokens, for the next dials (see `AddressTokens`): as many as it sends.
    config.token_store(Arc::new(quinn::TokenMemoryCache::new(
        TOKEN_SERVER_NAMES,
        ADDRESS_TOKENS_SENT as usize,
    )));
    Ok(config)
}

/// A client configuration that presents no certificate (tests of the hub's refusal).
pub fn anonymous_client_config(trusted: &[CertificateDer<'static>]) -> Result<quinn::ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in trusted {
        roots.add(cert.clone())?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![kedge_protocol::ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(tls).map_err(|e| Error::NoQuicSuite(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// Server configuration for a hub that enrolls members (CA-Secret mode): offers ALPN
/// `kedge/1` and `kedge-enroll/1` on the same port. A client certificate, when presented,
/// must chain to `material.trusted`; one may be absent so that an agent without an identity
/// can enroll. The hub then refuses any `kedge/1` connection without a verified certificate
/// (see [`negotiated_alpn`]). Its server certificate is issued anew at every start and
/// renewal, so its address tokens come from `tokens` (the hub CA's).
pub fn enrolling_server_config(
    material: TlsMaterial,
    tuning: TransportTuning,
    tokens: &AddressTokens,
) -> Result<quinn::ServerConfig> {
    hub_server_config(material, tuning, true, tokens)
}

/// The hub's server configuration: TLS 1.3, no early data, client certificates chained to
/// `material.trusted` (optional only with `enrolls`, which also offers `kedge-enroll/1`), the
/// hub's transport and incoming limits, and address tokens sealed with `tokens`.
fn hub_server_config(
    material: TlsMaterial,
    tuning: TransportTuning,
    enrolls: bool,
    tokens: &AddressTokens,
) -> Result<quinn::ServerConfig> {
    let provider = provider();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(material.roots()?), provider.clone());
    let verifier = if enrolls {
        verifier.allow_unauthenticated().build()?
    } else {
        verifier.build()?
    };
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(material.chain, material.key)?;
    tls.alpn_protocols = vec![kedge_protocol::ALPN.to_vec()];
    if enrolls {
        tls.alpn_protocols
            .push(kedge_protocol::ENROLL_ALPN.to_vec());
    }
    tls.max_early_data_size = 0;
    // Reconnects resume the last TLS session, also after a hub restart and on another
    // replica: no certificate is signed or verified again. The tickets are sealed with a key
    // derived from the hub's secret (`crate::tickets`), so the hub keeps nothing per session;
    // each carries the agent's certificate (about 600 bytes), which still fits the client's
    // first Initial packet. One ticket a session, as an agent dials one connection at a time.
    tls.ticketer = tokens.tickets.clone();
    tls.session_storage = Arc::new(NoServerSessionStorage {});
    tls.send_tls13_tickets = 1;
    let quic = QuicServerConfig::try_from(tls).map_err(|e| Error::NoQuicSuite(e.to_string()))?;
    let mut config = quinn::ServerConfig::new(Arc::new(quic), tokens.key.clone());
    let mut validation = quinn::ValidationTokenConfig::default();
    validation
        .lifetime(ADDRESS_TOKEN_LIFETIME)
        .sent(ADDRESS_TOKENS_SENT)
        .log(tokens.used.clone());
    config.validation_token_config(validation);
    config.transport_config(transport(tuning, Side::Server));
    limit_incoming(&mut config);
    Ok(config)
}

/// The key that seals the hub's address-validation tokens (RFC 9000 §8.1): the Retry tokens
/// it sends a new address, and the tokens it gives each agent after a handshake (`NEW_TOKEN`)
/// for its next connection, which then needs no Retry. Derived from a secret the hub keeps
/// (its server key, or the hub CA's key in CA-Secret mode), so that it is the same after a
/// certificate renewal, after a restart and on every replica: a token an agent holds from
/// the hub before still proves its address to the hub after. quinn's own key is drawn anew
/// for every server configuration, which made a Retry sent just before a renewal useless (the
/// agent's answer got a second Retry, which QUIC clients discard) and sent every agent
/// through a Retry after a restart. The tokens prove only that a peer received packets at
/// its address; forging one takes the secret it is derived from.
///
/// It also holds the log of the tokens used, so that every configuration built with it (a
/// renewal's too) takes each token once.
///
/// The same secret keys the hub's TLS session tickets ([`crate::tickets`]), for the same
/// reason: a session an agent had with one hub process resumes with the next.
#[derive(Clone)]
pub struct AddressTokens {
    key: Arc<ring::hkdf::Prk>,
    used: Arc<crate::token_log::UsedTokens>,
    tickets: Arc<crate::tickets::SessionTickets>,
}

impl AddressTokens {
    /// The key derived from `secret` (HKDF-SHA256 with a label of its own), an empty log, and
    /// the session tickets of `secret`.
    pub fn derive(secret: &[u8]) -> Self {
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"kedge-hub address tokens v1");
        Self {
            key: Arc::new(salt.extract(secret)),
            used: Arc::default(),
            tickets: Arc::new(crate::tickets::SessionTickets::derive(secret)),
        }
    }

    /// The session tickets sealed with the same secret.
    pub fn tickets(&self) -> &crate::tickets::SessionTickets {
        &self.tickets
    }

    /// The key derived from `material`'s private key.
    pub fn of(material: &TlsMaterial) -> Self {
        Self::derive(material.key.secret_der())
    }
}

impl std::fmt::Debug for AddressTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddressTokens(..)")
    }
}

/// How long a token the hub gave an agent proves its address: an agent away longer proves it
/// with a Retry again.
pub const ADDRESS_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Tokens the hub gives an agent per connection, and the agent keeps per hub name. Every dial
/// spends one, answered or not: an agent whose hub goes away dials it a few times while it
/// stops (each dial refused) before its successor answers, and the fleet bench saw agents
/// that had spent two before they reached the new hub (9,199 of 10,000 went through a Retry
/// with two). Each token is about 60 bytes, sent once per connection.
pub const ADDRESS_TOKENS_SENT: u32 = 8;

/// Hub names an agent keeps address tokens for (it knows one to a few hub addresses).
const TOKEN_SERVER_NAMES: u32 = 8;

/// Client configuration of an enrollment connection: verifies the hub against `trusted`,
/// presents no certificate, offers ALPN `kedge-enroll/1`.
pub fn enroll_client_config(
    trusted: &[CertificateDer<'static>],
    tuning: TransportTuning,
) -> Result<quinn::ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in trusted {
        roots.add(cert.clone())?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![kedge_protocol::ENROLL_ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(tls).map_err(|e| Error::NoQuicSuite(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport(tuning, Side::Client));
    Ok(config)
}

/// The ALPN protocol a connection negotiated, if any.
pub fn negotiated_alpn(connection: &quinn::Connection) -> Option<Vec<u8>> {
    connection
        .handshake_data()
        .and_then(|any| any.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol)
}

/// How long a peer whose stream ended waits for its connection's close: a hub ends a
/// session by closing the connection with a code (`SHUTDOWN` when it goes away), and that
/// close can arrive a packet after the end of a stream the hub's tasks let go first.
pub const CLOSE_GRACE: Duration = Duration::from_millis(250);

/// Why `connection` closed, waiting up to `grace` for a close that has not arrived yet;
/// `None` when it is still open after that (the stream ended, the connection did not).
pub async fn close_reason_within(
    connection: &quinn::Connection,
    grace: Duration,
) -> Option<quinn::ConnectionError> {
    if let Some(reason) = connection.close_reason() {
        return Some(reason);
    }
    tokio::time::timeout(grace, connection.closed()).await.ok()
}

/// Why a TLS handshake failed, as a short stable label for metrics and logs.
///
/// QUIC carries TLS alerts as transport error codes `0x100 + alert`.
pub fn handshake_failure_reason(error: &quinn::ConnectionError) -> &'static str {
    let code = match error {
        quinn::ConnectionError::TransportError(e) => u64::from(e.code),
        quinn::ConnectionError::ConnectionClosed(c) => u64::from(c.error_code),
        quinn::ConnectionError::TimedOut => return "timed_out",
        quinn::ConnectionError::VersionMismatch => return "quic_version",
        _ => return "other",
    };
    match code.checked_sub(0x100) {
        Some(42) => "bad_certificate",
        Some(43) => "unsupported_certificate",
        Some(44) => "certificate_revoked",
        Some(45) => "certificate_expired",
        Some(46) => "certificate_unknown",
        Some(48) => "unknown_ca",
        Some(116) => "certificate_required",
        Some(120) => "no_application_protocol",
        Some(_) => "tls_alert",
        None => "transport",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_recovery_is_seven_probe_timeouts_and_saturates() {
        assert_eq!(loss_recovery(Duration::ZERO), Duration::from_millis(175));
        assert_eq!(
            loss_recovery(Duration::from_millis(600)),
            Duration::from_millis(8_575)
        );
        assert_eq!(loss_recovery(Duration::MAX), Duration::MAX);
    }

    /// Every setting of the hub's QUIC transport, as quinn prints it: a change to any of them
    /// (a window, a stream limit, segmentation offload) changes what each connected member
    /// costs the hub (docs/scale.md), so it must be made here on purpose.
    #[test]
    fn the_hub_transport_is_pinned() {
        let hub = transport(TransportTuning::hub(Duration::from_secs(15)), Side::Server);
        let printed = format!("{hub:?}");
        for setting in [
            "max_concurrent_bidi_streams: 2,",
            "max_concurrent_uni_streams: 0,",
            "max_idle_timeout: Some(30000),",
            "stream_receive_window: 1048576,",
            "receive_window: 2097152,",
            "send_window: 2097152,",
            "mtu_discovery_config: None,",
            "ack_frequency_config: None,",
            "keep_alive_interval: None,",
            "crypto_buffer_size: 16384,",
            "datagram_receive_buffer_size: None,",
            "enable_segmentation_offload: false,",
        ] {
            assert!(printed.contains(setting), "{setting} not in {printed}");
        }
        // The agent keeps segmentation offload: it holds one connection.
        let agent = format!("{:?}", transport(TransportTuning::agent(), Side::Client));
        assert!(
            agent.contains("enable_segmentation_offload: true,"),
            "{agent}"
        );
        assert!(agent.contains("max_concurrent_bidi_streams: 0,"), "{agent}");
    }

    /// A CA named `name` and a hub certificate for `localhost` from it, both valid for an
    /// hour from now (the validity, for more certificates).
    fn hub_pki(
        name: &str,
    ) -> (
        crate::pki::CertificateAuthority,
        crate::pki::IssuedCert,
        crate::pki::Validity,
    ) {
        let now = time::OffsetDateTime::now_utc();
        let validity = crate::pki::Validity::issued(now, time::Duration::hours(1));
        let ca = crate::pki::CertificateAuthority::generate(name, validity).unwrap();
        let hub = ca
            .issue_server(&["localhost".to_owned()], validity)
            .unwrap();
        (ca, hub, validity)
    }

    #[test]
    fn sessions_negotiate_aes_128_gcm_with_sha_256() {
        use rustls::pki_types::ServerName;
        let (ca, hub, _) = hub_pki("suite test CA");
        let material = TlsMaterial::from_pem(&hub.cert_pem, &hub.key_pem, ca.cert_pem()).unwrap();
        let negotiated = |client: CryptoProvider| {
            let server = rustls::ServerConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(material.chain.clone(), material.key.clone_key())
                .unwrap();
            let client = rustls::ClientConfig::builder_with_provider(Arc::new(client))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_root_certificates(material.roots().unwrap())
                .with_no_client_auth();
            let name = ServerName::try_from("localhost").unwrap();
            let mut client = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
            let mut server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
            let mut wire = Vec::new();
            while client.is_handshaking() || server.is_handshaking() {
                wire.clear();
                client.write_tls(&mut wire).unwrap();
                server.read_tls(&mut wire.as_slice()).unwrap();
                server.process_new_packets().unwrap();
                wire.clear();
                server.write_tls(&mut wire).unwrap();
                client.read_tls(&mut wire.as_slice()).unwrap();
                client.process_new_packets().unwrap();
            }
            client.negotiated_cipher_suite().unwrap().suite()
        };
        let ours = Arc::try_unwrap(provider()).unwrap();
        assert_eq!(
            negotiated(ours),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        // A client with rustls' own order (an agent built before) still connects.
        assert_eq!(
            negotiated(rustls::crypto::ring::default_provider()),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
        );
    }

    /// A hub and an agent connected over loopback with real certificates.
    async fn connected() -> (quinn::Endpoint, quinn::Connection, quinn::Connection) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (ca, hub, validity) = hub_pki("close test CA");
        let agent = ca.issue_member("edge-1", validity).unwrap();
        let material = |c: &crate::pki::IssuedCert| {
            TlsMaterial::from_pem(&c.cert_pem, &c.key_pem, ca.cert_pem()).unwrap()
        };
        let server = server_config(
            material(&hub),
            TransportTuning::hub(Duration::from_secs(15)),
        )
        .unwrap();
        let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
        let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        client.set_default_client_config(
            client_config(
                material(&agent),
                TransportTuning::agent(),
                kedge_protocol::ALPN,
            )
            .unwrap(),
        );
        let dialing = client
            .connect(endpoint.local_addr().unwrap(), "localhost")
            .unwrap();
        let accepting = async { endpoint.accept().await.unwrap().await.unwrap() };
        let (agent, hub) = tokio::join!(async { dialing.await.unwrap() }, accepting);
        (endpoint, hub, agent)
    }

    /// A CA, a server certificate of its and an agent's client configuration.
    fn pki() -> (
        crate::pki::CertificateAuthority,
        crate::pki::Validity,
        quinn::ClientConfig,
    ) {
        use crate::pki::{CertificateAuthority, Validity};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let validity = Validity::issued(time::OffsetDateTime::now_utc(), time::Duration::hours(1));
        let ca = CertificateAuthority::generate("token test CA", validity).unwrap();
        let agent = ca.issue_member("edge-1", validity).unwrap();
        let material = TlsMaterial::from_pem(&agent.cert_pem, &agent.key_pem, ca.cert_pem());
        let client = client_config(
            material.unwrap(),
            TransportTuning::agent(),
            kedge_protocol::ALPN,
        );
        (ca, validity, client.unwrap())
    }

    fn hub_material(ca: &crate::pki::CertificateAuthority, v: crate::pki::Validity) -> TlsMaterial {
        let cert = ca.issue_server(&["localhost".to_owned()], v).unwrap();
        TlsMaterial::from_pem(&cert.cert_pem, &cert.key_pem, ca.cert_pem()).unwrap()
    }

    /// The same certificate and key again, as a restarted hub reads them.
    fn same_material(material: &TlsMaterial) -> TlsMaterial {
        TlsMaterial {
            chain: material.chain.clone(),
            key: material.key.clone_key(),
            trusted: material.trusted.clone(),
        }
    }

    fn hub_endpoint(server: quinn::ServerConfig) -> quinn::Endpoint {
        quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap()
    }

    /// Dials `hub` and serves the attempt: a Retry first unless it is validated. Whether the
    /// first attempt was validated, and the connection.
    async fn dial(
        client: &quinn::Endpoint,
        hub: &quinn::Endpoint,
        config: &quinn::ClientConfig,
    ) -> (bool, quinn::Connection) {
        let dialing = client
            .connect_with(config.clone(), hub.local_addr().unwrap(), "localhost")
            .unwrap();
        let serving = async {
            let first = hub.accept().await.unwrap();
            let validated = first.remote_address_validated();
            let incoming = if validated {
                first
            } else {
                first.retry().unwrap();
                hub.accept().await.unwrap()
            };
            assert!(incoming.remote_address_validated());
            (validated, incoming.await.unwrap())
        };
        let dialed = async {
            tokio::time::timeout(Duration::from_secs(5), dialing)
                .await
                .expect("the agent's handshake stalled")
                .unwrap()
        };
        let ((validated, server), agent) = tokio::join!(serving, dialed);
        // A round trip after the handshake: the hub's tokens have reached the agent.
        let (mut send, mut recv) = agent.open_bi().await.unwrap();
        send.write_all(b"ping").await.unwrap();
        send.finish().unwrap();
        let (mut hub_send, mut hub_recv) = server.accept_bi().await.unwrap();
        let got = hub_recv.read_to_end(16).await.unwrap();
        hub_send.write_all(&got).await.unwrap();
        hub_send.finish().unwrap();
        assert_eq!(recv.read_to_end(16).await.unwrap(), b"ping");
        (validated, agent)
    }

    /// A token used before a renewal is not good again after it: every configuration built
    /// with the same `AddressTokens` shares its log.
    #[test]
    fn a_renewal_keeps_the_log_of_the_tokens_used() {
        use quinn::TokenLog;
        let tokens = AddressTokens::derive(b"the hub CA's key");
        let renewal = tokens.clone();
        let now = std::time::SystemTime::now();
        assert!(
            tokens
                .used
                .check_and_insert(7, now, ADDRESS_TOKEN_LIFETIME)
                .is_ok()
        );
        assert!(
            renewal
                .used
                .check_and_insert(7, now, ADDRESS_TOKEN_LIFETIME)
                .is_err()
        );
    }

    /// A Retry sent before the hub renews its server certificate (CA-Secret mode) still
    /// admits the agent's answer after it: the token key is the CA's, not the configuration's.
    #[tokio::test]
    async fn a_retry_token_outlives_a_renewed_server_certificate() {
        let (ca, validity, config) = pki();
        let tokens = AddressTokens::derive(ca.key_pem().as_bytes());
        let tuning = TransportTuning::hub(Duration::from_secs(15));
        let hub = |ca: &crate::pki::CertificateAuthority| {
            enrolling_server_config(hub_material(ca, validity), tuning, &tokens).unwrap()
        };
        let endpoint = hub_endpoint(hub(&ca));
        let client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let dialing = client
            .connect_with(config, endpoint.local_addr().unwrap(), "localhost")
            .unwrap();
        let serving = async {
            let first = endpoint.accept().await.unwrap();
            assert!(!first.remote_address_validated());
            first.retry().unwrap();
            // Renewed between the Retry and the agent's answer to it.
            endpoint.set_server_config(Some(hub(&ca)));
            let second = endpoint.accept().await.unwrap();
            assert!(
                second.remote_address_validated(),
                "the renewed configuration could not open the Retry token"
            );
            second.await.unwrap()
        };
        let dialed = async {
            tokio::time::timeout(Duration::from_secs(5), dialing)
                .await
                .expect("the agent's handshake stalled")
                .unwrap()
        };
        let (_hub, _agent) = tokio::join!(serving, dialed);
    }

    /// An agent that held a session proves its address to the restarted hub with the token
    /// the hub gave it, without a Retry; a hub with another key does not take the token.
    #[tokio::test]
    async fn a_restarted_hub_takes_the_address_tokens_of_the_one_before() {
        let (ca, validity, config) = pki();
        let material = hub_material(&ca, validity);
        let again = || same_material(&material);
        let tuning = TransportTuning::hub(Duration::from_secs(15));
        let client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();

        // A second agent, whose tokens are issued after the first one's.
        let other = ca.issue_member("edge-2", validity).unwrap();
        let other = client_config(
            TlsMaterial::from_pem(&other.cert_pem, &other.key_pem, ca.cert_pem()).unwrap(),
            TransportTuning::agent(),
            kedge_protocol::ALPN,
        )
        .unwrap();

        let before = hub_endpoint(server_config(again(), tuning).unwrap());
        let (validated, session) = dial(&client, &before, &config).await;
        assert!(
            !validated,
            "a first connection proves its address with a Retry"
        );
        session.close(0u32.into(), b"restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (_, session) = dial(&client, &before, &other).await;
        session.close(0u32.into(), b"restart");
        before.close(0u32.into(), b"restart");

        // Dials the stopping hub refuses spend tokens too; the agent has some left after them.
        let stopping = hub_endpoint(server_config(again(), tuning).unwrap());
        for _ in 0..3 {
            let refused = client
                .connect_with(config.clone(), stopping.local_addr().unwrap(), "localhost")
                .unwrap();
            stopping.accept().await.unwrap().refuse();
            assert!(refused.await.is_err());
        }
        let after = hub_endpoint(server_config(again(), tuning).unwrap());
        // The newer token first, then the older one: agents come back in any order.
        let (validated, _newer) = dial(&client, &after, &other).await;
        assert!(
            validated,
            "the restarted hub sent a Retry for its predecessor's token"
        );
        let (validated, session) = dial(&client, &after, &config).await;
        assert!(
            validated,
            "the restarted hub sent a Retry for an older token"
        );
        session.close(0u32.into(), b"done");

        let other_key = hub_endpoint(server_config(hub_material(&ca, validity), tuning).unwrap());
        let (validated, _session) = dial(&client, &other_key, &config).await;
        assert!(!validated, "a hub with another key took the token");
    }

    /// An agent's TLS session with a hub resumes with the hub's next process (the same
    /// secret): no certificate signed or verified again. With another secret the ticket does
    /// not open and the agent still connects with a full handshake.
    #[tokio::test]
    async fn a_restarted_hub_resumes_the_sessions_of_the_one_before() {
        let (ca, validity, config) = pki();
        let material = hub_material(&ca, validity);
        let again = || same_material(&material);
        let tuning = TransportTuning::hub(Duration::from_secs(15));
        let hub = |material: TlsMaterial| {
            let tokens = AddressTokens::of(&material);
            let config = hub_server_config(material, tuning, false, &tokens).unwrap();
            (hub_endpoint(config), tokens)
        };
        let client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();

        let (before, tokens) = hub(again());
        let (_, session) = dial(&client, &before, &config).await;
        assert_eq!(
            tokens.tickets().opened(),
            0,
            "a first session is a full handshake"
        );
        session.close(0u32.into(), b"restart");
        before.close(0u32.into(), b"restart");

        let (after, tokens) = hub(again());
        let (_, session) = dial(&client, &after, &config).await;
        assert_eq!(
            tokens.tickets().opened(),
            1,
            "the restarted hub did not resume"
        );
        session.close(0u32.into(), b"restart");

        let (other_key, tokens) = hub(hub_material(&ca, validity));
        let (_, session) = dial(&client, &other_key, &config).await;
        assert_eq!(
            tokens.tickets().opened(),
            0,
            "a hub with another secret opened a ticket"
        );
        session.close(0u32.into(), b"done");
    }

    #[tokio::test]
    async fn a_close_that_follows_the_end_of_a_stream_is_still_read() {
        let (_endpoint, hub, agent) = connected().await;
        let (mut send, mut recv) = agent.open_bi().await.unwrap();
        send.write_all(b"hello").await.unwrap();
        let (mut hub_send, mut hub_recv) = hub.accept_bi().await.unwrap();
        let mut hello = [0u8; 5];
        hub_recv.read_exact(&mut hello).await.unwrap();
        // The hub's stream ends first; its close with a code comes 50 ms later.
        hub_send.finish().unwrap();
        let closer = hub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            closer.close(7u32.into(), b"going away");
        });
        assert!(recv.read_to_end(64).await.unwrap().is_empty());
        // Read at once, the close is not there yet; within the grace, it is.
        assert!(agent.close_reason().is_none());
        let closed = close_reason_within(&agent, CLOSE_GRACE).await;
        assert!(
            matches!(&closed, Some(quinn::ConnectionError::ApplicationClosed(c))
                if c.error_code == 7u32.into()),
            "{closed:?}"
        );
    }

    #[tokio::test]
    async fn a_connection_that_stays_open_is_waited_for_only_the_grace() {
        let (_endpoint, _hub, agent) = connected().await;
        let started = tokio::time::Instant::now();
        assert!(
            close_reason_within(&agent, Duration::from_millis(100))
                .await
                .is_none()
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
        agent.close(1u32.into(), b"done");
        // Already closed: no wait.
        assert!(close_reason_within(&agent, Duration::ZERO).await.is_some());
    }

    #[test]
    fn the_hub_idles_out_only_after_twice_its_heartbeat_deadline() {
        let hub = TransportTuning::hub(Duration::from_secs(3));
        assert_eq!(hub.keep_alive, None);
        assert_eq!(hub.idle_timeout, Some(HUB_IDLE_TIMEOUT_MIN));
        let sparse = TransportTuning::hub(Duration::from_secs(60));
        assert_eq!(sparse.idle_timeout, Some(Duration::from_secs(120)));
        let agent = TransportTuning::agent();
        assert_eq!(
            (agent.keep_alive, agent.idle_timeout),
            (Some(AGENT_KEEP_ALIVE), None)
        );
    }
}

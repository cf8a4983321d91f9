//! QUIC endpoint configuration: TLS 1.3 only, ALPN `kedge/1`, client certificates required
//! and chained to the hub CA, the ring crypto provider passed explicitly.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
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

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Liveness settings of the QUIC transport.
#[derive(Debug, Clone, Copy)]
pub struct TransportTuning {
    /// QUIC keep-alive PING interval (keeps NAT bindings open).
    pub keep_alive: Duration,
    /// Connection is dropped after this long without any packet.
    pub idle_timeout: Duration,
}

impl Default for TransportTuning {
    fn default() -> Self {
        Self {
            keep_alive: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

fn transport(tuning: TransportTuning) -> Arc<quinn::TransportConfig> {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(tuning.keep_alive));
    // Durations beyond the QUIC varint range are clamped rather than rejected.
    let idle = quinn::IdleTimeout::try_from(tuning.idle_timeout)
        .unwrap_or_else(|_| quinn::IdleTimeout::from(quinn::VarInt::MAX));
    transport.max_idle_timeout(Some(idle));
    // Control + heartbeat streams, with headroom for a reconnecting agent's leftovers.
    transport.max_concurrent_bidi_streams(8u32.into());
    transport.max_concurrent_uni_streams(0u32.into());
    Arc::new(transport)
}

/// Server configuration for the hub: requires a client certificate chained to `material.trusted`.
pub fn server_config(
    material: TlsMaterial,
    tuning: TransportTuning,
) -> Result<quinn::ServerConfig> {
    let provider = provider();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(material.roots()?), provider.clone())
            .build()?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(material.chain, material.key)?;
    tls.alpn_protocols = vec![kedge_protocol::ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let quic = QuicServerConfig::try_from(tls).map_err(|e| Error::NoQuicSuite(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport(tuning));
    Ok(config)
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
    config.transport_config(transport(tuning));
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
/// (see [`negotiated_alpn`]).
pub fn enrolling_server_config(
    material: TlsMaterial,
    tuning: TransportTuning,
) -> Result<quinn::ServerConfig> {
    let provider = provider();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(material.roots()?), provider.clone())
            .allow_unauthenticated()
            .build()?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(material.chain, material.key)?;
    tls.alpn_protocols = vec![
        kedge_protocol::ALPN.to_vec(),
        kedge_protocol::ENROLL_ALPN.to_vec(),
    ];
    tls.max_early_data_size = 0;
    let quic = QuicServerConfig::try_from(tls).map_err(|e| Error::NoQuicSuite(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport(tuning));
    Ok(config)
}

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
    config.transport_config(transport(tuning));
    Ok(config)
}

/// The ALPN protocol a connection negotiated, if any.
pub fn negotiated_alpn(connection: &quinn::Connection) -> Option<Vec<u8>> {
    connection
        .handshake_data()
        .and_then(|any| any.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol)
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

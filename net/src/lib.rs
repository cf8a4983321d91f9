//! What both kedge binaries share on the network: the PKI that issues hub and member
//! certificates and reads certificate signing requests ([`pki`]), QUIC endpoint
//! configuration with mutual TLS ([`tls`]), the member identity carried in a client
//! certificate and its enrollment URI ([`identity`]), the bootstrap token and the enrollment
//! exchange ([`enroll`]), the ops HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`
//! ([`ops`]), logging set-up ([`telemetry`]), the Kubernetes client builder
//! ([`kube_client`]), bounded command-line values ([`flags`]), the agent's flag names and
//! namespace scope as hub and agent both use them ([`agent_cli`]) and the supervision of
//! essential tasks ([`supervise`]).
//!
//! This crate was split out of the two binaries because both need exactly the same TLS and
//! ops code; keeping it once means the hub and the agent cannot drift apart on security
//! settings.

pub mod agent_cli;
pub mod enroll;
pub mod flags;
pub mod identity;
pub mod kube_client;
pub mod ops;
pub mod pki;
pub mod signals;
pub mod supervise;
pub mod telemetry;
pub mod tickets;
pub mod tls;
pub mod token_log;
pub mod udp;

use std::path::PathBuf;

/// Errors of the shared network layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PEM file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A PEM file held no usable certificate or key.
    #[error("{path}: {reason}")]
    Pem {
        /// The file (or a description of the in-memory source).
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Certificate generation or signing failed.
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The TLS configuration was rejected by rustls.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The client verifier could not be built from the CA bundle.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// rustls offered no QUIC-capable cipher suite.
    #[error("QUIC needs TLS 1.3 with an AES-GCM or ChaCha20 suite: {0}")]
    NoQuicSuite(String),
    /// The peer certificate does not name a valid member.
    #[error("peer certificate: {0}")]
    Identity(String),
    /// No Kubernetes client could be built from the kubeconfig or the environment.
    #[error("kubeconfig: {0}")]
    KubeConfig(String),
    /// A socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Result with the network [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
